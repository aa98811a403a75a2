"""Deployment files for operations (issue 19): high availability on a Lease (RBAC, PDB, replicas), the
alerting rules, and the systemd watchdog against the config. Separate from tests/test_deploy.py, which
checks the manifests' ports, volumes and configs."""

from __future__ import annotations

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
    roles = [d for d in _docs() if d["kind"] in ("Role", "ClusterRole")]
    assert [r["metadata"]["name"] for r in roles] == ["governor-leader-election"]
    (rule,) = roles[0]["rules"]
    assert rule == {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": [lease],
                    "verbs": ["get", "update"]}
    assert roles[0]["metadata"]["namespace"] == le.namespace
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

    from controller.obs.metrics import DaemonMetrics

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
