"""Deployment files for operations (issue 19): high availability on a Lease (RBAC, PDB, replicas), the
alerting rules, and the systemd watchdog against the config. Separate from tests/test_deploy.py, which
checks the manifests' ports, volumes and configs."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from controller.config import parse_settings

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "deploy" / "kubernetes"


def _docs() -> list[dict]:
    return [d for p in sorted(K8S.glob("*.yaml")) for d in yaml.safe_load_all(p.read_text()) if d]


def _one(kind: str, name: str) -> dict:
    found = [d for d in _docs() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


def _config():
    cm = _one("ConfigMap", "governor-config")
    return parse_settings(cm["data"]["governor.yaml"], "ConfigMap/governor-config")


def test_rbac_reaches_only_the_lease_the_config_contends_for():
    s = _config()
    le = s.leader_election
    assert le.enabled
    lease, pools = le.lease_and_pools(s.pool_names())
    assert pools == s.pool_names()
    role = _one("Role", "governor-leader-election")
    rule, state = role["rules"]
    assert rule == {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": [lease],
                    "verbs": ["get", "update"]}
    # the shared state (overrides, mode, audit, refit verdict) is the GovernorState named after the Lease
    assert le.shared_state and state == {"apiGroups": ["governor.llm-d.ai"], "resources": ["governorstates"],
                                         "resourceNames": [lease], "verbs": ["get", "update"]}
    assert _one("GovernorState", lease)["metadata"]["namespace"] == le.namespace
    assert role["metadata"]["namespace"] == le.namespace
    # no other role reaches Leases at all
    for r in (d for d in _docs() if d["kind"] in ("Role", "ClusterRole")
              and d["metadata"]["name"] != "governor-leader-election"):
        assert not [x for x in r.get("rules", []) if "leases" in x.get("resources", [])], r["metadata"]["name"]
    # create cannot be limited by name: the Lease ships with the manifests
    assert _one("Lease", lease)["metadata"]["namespace"] == le.namespace
    binding = _one("RoleBinding", "governor-leader-election")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": "governor-leader-election"}
    dep = _one("Deployment", "governor")
    pod = dep["spec"]["template"]["spec"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": pod["serviceAccountName"],
                                    "namespace": le.namespace}]


def test_two_replicas_a_disruption_budget_and_the_pod_identity():
    s = _config()
    dep = _one("Deployment", "governor")
    assert dep["spec"]["replicas"] == 2
    assert dep["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    pdb = _one("PodDisruptionBudget", "governor")
    assert pdb["spec"]["minAvailable"] == 1 and pdb["spec"]["minAvailable"] < dep["spec"]["replicas"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    (c,) = [c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == "governor"]
    env = {e["name"]: e for e in c["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"  # the identity
    assert s.leader_election.identity is None
    assert env["GOVERNOR_LEADER_ELECTION__ADDRESS"]["value"] == "$(POD_IP):50051"
    # a follower's takeover (lease duration) is shorter than the grace a stopping leader gets
    grace = dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert s.leader_election.lease_duration_s < grace


# --------------------------------------------------------------------------- alerts

ALERTS = ROOT / "deploy" / "prometheus" / "governor-alerts.yml"
ALERT_TESTS = ROOT / "tests" / "deploy" / "governor-alerts-test.yml"


def _promtool() -> str:
    import shutil

    import pytest

    tool = shutil.which("promtool")
    if tool is None:
        pytest.fail("promtool is not installed (Debian's prometheus package provides it; `make test` installs it)")
    return tool


def test_alerting_rules_pass_promtools_unit_tests():
    import subprocess

    check = subprocess.run([_promtool(), "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    res = subprocess.run([_promtool(), "test", "rules", ALERT_TESTS.name], cwd=ALERT_TESTS.parent,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "SUCCESS" in res.stdout, res.stdout + res.stderr


def _alerts() -> list[dict]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [r for g in groups for r in g["rules"] if "alert" in r]


def test_every_alert_is_unit_tested_and_has_a_runbook_section():
    import re

    tested = {t["alertname"] for case in yaml.safe_load(ALERT_TESTS.read_text())["tests"]
              for t in case.get("alert_rule_test", [])}
    fired = {t["alertname"] for case in yaml.safe_load(ALERT_TESTS.read_text())["tests"]
             for t in case.get("alert_rule_test", []) if t.get("exp_alerts")}
    names = {a["alert"] for a in _alerts()}
    untested = names - fired - {"GovernorSLOBurnTicket"}  # 3 days of series: the same rule shape as Slow
    assert not untested, f"alerts no promtool case sees firing: {sorted(untested)}"
    assert {"GovernorSLOBurnFast", "GovernorSLOBurnSlow", "GovernorTwoLeaders"} <= tested
    operating = (ROOT / "docs" / "OPERATING.md").read_text()
    headings = set(re.findall(r"^### (12\.\d+) (\w+)", operating, flags=re.M))
    for a in _alerts():
        runbook = a["annotations"]["runbook"]
        m = re.fullmatch(r"docs/OPERATING\.md §(12\.\d+) (\w+)", runbook)
        assert m and (m.group(1), m.group(2)) in headings, f"{a['alert']}: no section {runbook!r} in OPERATING.md"
        assert a["labels"]["severity"] in ("page", "warning", "ticket")


def test_alerts_read_only_series_the_daemon_exports():
    import re

    from controller.obs.daemon_metrics import DaemonMetrics

    exported = set()
    for family in DaemonMetrics().registry.collect():
        exported |= {family.name, family.name + "_total"} if family.type == "counter" else {family.name}
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    recorded = {r["record"] for g in groups for r in g["rules"] if "record" in r}
    for g in groups:
        for r in g["rules"]:
            used = set(re.findall(r"\b(governor_[a-z_]+)\b", r["expr"]))
            assert used <= exported, f"{r.get('alert') or r.get('record')}: unknown series {used - exported}"
            assert set(re.findall(r"\b(governor:[a-z_:0-9]+)", r["expr"])) <= recorded


def test_prometheusrule_has_the_same_alert_groups():
    (doc,) = [d for d in yaml.safe_load_all((K8S / "prometheusrule-alerts.yaml").read_text()) if d]
    assert doc["kind"] == "PrometheusRule" and doc["metadata"]["namespace"] == "inference"
    assert doc["spec"]["groups"] == yaml.safe_load(ALERTS.read_text())["groups"]


# --------------------------------------------------------------------------- kustomize + kubernetes-validate

KUSTOMIZE_DIRS = {"base": K8S, "example": ROOT / "deploy" / "kustomize" / "example"}
# Custom resources: no schema in kubernetes-validate (the operators' CRDs define them); their contents
# are checked by tests/test_deploy.py (ScaledObjects, PodMonitors) and promtool (the rules).
CRD_KINDS = {"ScaledObject", "TriggerAuthentication", "PodMonitor", "PrometheusRule"}


def _kubectl() -> str:
    import shutil

    import pytest

    tool = shutil.which("kubectl")
    if tool is None:
        pytest.fail("kubectl is not installed (Debian's kubernetes-client provides it; `make test` installs it)")
    return tool


def _render(path: Path) -> list[dict]:
    import subprocess

    res = subprocess.run([_kubectl(), "kustomize", str(path)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return [d for d in yaml.safe_load_all(res.stdout) if d]


def _validate(docs: list[dict], where: str) -> set[str]:
    """Every built-in object against the Kubernetes API schemas (strict: unknown fields fail); returns
    the kinds that have no schema."""
    import jsonschema
    import kubernetes_validate

    version = kubernetes_validate.latest_version()
    unknown = set()
    # kinds defined by a CRD among the documents (GovernorState): validated against that CRD's own schema
    own = {c["spec"]["names"]["kind"]: {f"{c['spec']['group']}/{v['name']}": v["schema"]["openAPIV3Schema"]
                                        for v in c["spec"]["versions"]}
           for c in docs if c["kind"] == "CustomResourceDefinition"}
    for d in docs:
        name = f"{where}: {d['kind']}/{d['metadata']['name']}"
        if d["kind"] in own:
            schema = own[d["kind"]].get(d["apiVersion"])
            if schema is None:
                raise AssertionError(f"{name}: {d['apiVersion']} is not a version its CRD serves")
            try:
                jsonschema.validate(d, schema)
            except jsonschema.ValidationError as exc:
                raise AssertionError(f"{name}: {exc.message}") from None
            continue
        try:
            kubernetes_validate.validate(d, version, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            unknown.add(d["kind"])
        except kubernetes_validate.ValidationError as exc:
            raise AssertionError(f"{name} at {'.'.join(map(str, exc.path))}: {exc.message}") from None
    return unknown


def test_every_rendered_manifest_validates_against_the_kubernetes_schemas():
    import pytest

    for where, path in KUSTOMIZE_DIRS.items():
        docs = _render(path)
        assert len(docs) >= 10, where
        assert _validate(docs, where) <= CRD_KINDS
    # the other layout, applied as a plain file
    sidecar = [d for d in yaml.safe_load_all((K8S / "sidecar.yaml").read_text()) if d]
    assert _validate(sidecar, "sidecar.yaml") == set()
    with pytest.raises(AssertionError, match="replicas"):  # the check does fail on a bad field
        bad = {**_one("Deployment", "governor")}
        bad["spec"] = {**bad["spec"], "replicas": "two"}
        _validate([bad], "probe")


def test_the_base_renders_exactly_the_plain_manifests():
    rendered = {(d["kind"], d["metadata"]["name"]): d for d in _render(K8S)}
    other_layouts = ("sidecar.yaml", "kubernetes-adapter.yaml")  # alternatives to parts of the base, not in it
    plain = {(d["kind"], d["metadata"]["name"]): d for p in sorted(K8S.glob("*.yaml")) if p.name not in other_layouts
             for d in yaml.safe_load_all(p.read_text()) if d}
    assert rendered.keys() == plain.keys()
    assert all(yaml.safe_dump(rendered[k]) == yaml.safe_dump(plain[k]) for k in plain)


def test_the_example_overlay_sets_its_values_and_keeps_a_valid_config(monkeypatch):
    docs = _render(KUSTOMIZE_DIRS["example"])
    (dep,) = [d for d in docs if d["kind"] == "Deployment"]
    assert dep["spec"]["replicas"] == 3
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert c["image"] == "registry.example.com/ml/llm-governor:0.1.0"
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert {"POD_NAME", "POD_IP", "GOVERNOR_LEADER_ELECTION__ADDRESS"} <= set(env)  # merged, not replaced
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap"]
    for name in list(os.environ):
        if name.upper().startswith("GOVERNOR_"):
            monkeypatch.delenv(name)
    for name, value in env.items():
        if name.startswith("GOVERNOR_") and value is not None:
            monkeypatch.setenv(name, value.replace("$(POD_IP)", "10.0.0.7"))
    s = parse_settings(cm["data"]["governor.yaml"], "overlay ConfigMap + Deployment env")
    assert s.telemetry.prometheus.url == "http://prometheus-k8s.monitoring.svc:9090"
    assert (s.leader_election.lease_duration_s, s.leader_election.renew_deadline_s) == (20, 14)
    assert s.leader_election.address == "10.0.0.7:50051"
