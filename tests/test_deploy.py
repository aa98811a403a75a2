"""Deployment files: the manifests parse, agree with each other and with the config defaults, and the
embedded Governor configs pass the real config parser; the systemd unit has what the daemon needs.

Cross-checks (a mismatch is a broken deployment, so each is a test): ports in the config, the
container, the Service and the probes; the KEDA ScaledObjects against the config's pools and KEDA
listen port; the token and state paths against the volumes; the PodMonitor's pool label against
telemetry.prometheus.pool_label.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from controller.api.server import SERVICE_NAME as POLICY_SERVICE
from controller.config import Settings, load_settings, parse_settings
from controller.config.sections import ApiSettings, KedaSettings, MetricsSettings

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "kubernetes"
UNIT = DEPLOY / "governor.service"
CONFIG_KEY = "governor.yaml"


def _port(listen: str | None) -> int:
    assert listen is not None
    return int(listen.rpartition(":")[2])


DEFAULT_PORTS = {"api": _port(ApiSettings().listen), "keda": _port(KedaSettings().listen),
                 "metrics": _port(MetricsSettings().listen)}


@pytest.fixture(autouse=True)
def _no_governor_env(monkeypatch):
    """parse_settings lays GOVERNOR_* variables over the file; the files must stand on their own."""
    for name in list(os.environ):
        if name.upper().startswith("GOVERNOR_"):
            monkeypatch.delenv(name)


def _docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def _all_docs() -> list[tuple[str, dict]]:
    return [(p.name, d) for p in sorted(K8S.glob("*.yaml")) for d in _docs(p)]


def _one(kind: str, name: str) -> dict:
    found = [d for _, d in _all_docs() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


def _settings(configmap: str) -> Settings:
    cm = _one("ConfigMap", configmap)
    return parse_settings(cm["data"][CONFIG_KEY], f"ConfigMap/{configmap}")


def _container(deployment: dict, name: str) -> dict:
    (c,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == name]
    return c


def _mount_of(deployment: dict, container: dict, volume_kind: str, source_name: str | None = None) -> dict:
    """The container's mount of the pod volume of `volume_kind` (configMap, secret, ...) named `source_name`."""
    for vol in deployment["spec"]["template"]["spec"]["volumes"]:
        src = vol.get(volume_kind)
        if src is None:
            continue
        ref = src.get("name") or src.get("secretName") or src.get("claimName")
        if source_name is None or ref == source_name:
            (m,) = [m for m in container["volumeMounts"] if m["name"] == vol["name"]]
            return m
    raise AssertionError(f"no {volume_kind} volume {source_name or ''} in {deployment['metadata']['name']}")


# --------------------------------------------------------------------------- Kubernetes


def test_every_manifest_parses_and_is_namespaced():
    files = sorted(K8S.glob("*.yaml"))
    assert {p.name for p in files} >= {"governor.yaml", "sidecar.yaml", "keda-scaledobjects.yaml", "podmonitors.yaml"}
    for name, d in _all_docs():
        assert {"apiVersion", "kind", "metadata"} <= set(d), name
        if d["kind"] == "CustomResourceDefinition":  # cluster-scoped by nature; the one CRD is Governor's own
            assert name == "governorstate-crd.yaml" and d["spec"]["scope"] == "Namespaced"
            continue
        assert d["metadata"].get("name") and d["metadata"].get("namespace") == "inference", (name, d["metadata"])
    # RBAC is namespaced only: the Kubernetes adapter's Role (kubernetes-adapter.yaml) and leader
    # election's, limited to its Lease (governor.yaml; tests/test_deploy_ops.py checks it)
    assert not [d for _, d in _all_docs() if d["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    rbac_files = {name for name, d in _all_docs() if d["kind"] in ("Role", "RoleBinding")}
    assert rbac_files <= {"kubernetes-adapter.yaml", "governor.yaml"}, rbac_files


@pytest.mark.parametrize("configmap", ["governor-config", "governor-sidecar-config", "governor-kubernetes-config"])
def test_embedded_configs_pass_the_config_parser(configmap):
    settings = _settings(configmap)
    assert settings.pools


def test_main_config_listens_on_the_default_ports_and_has_keda_on():
    s = _settings("governor-config")
    assert {"api": _port(s.api.listen), "keda": _port(s.actuators.keda.listen), "metrics": _port(s.metrics.listen)} \
        == DEFAULT_PORTS == {"api": 50051, "keda": 50052, "metrics": 9464}
    assert s.actuators.keda.enabled and s.telemetry.source == "prometheus"


def test_deployment_agrees_with_its_config():
    s = _settings("governor-config")
    dep = _one("Deployment", "governor")
    spec = dep["spec"]
    assert spec["replicas"] == 2 and s.leader_election.enabled  # one writer: the Lease holder
    pod = spec["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] > s.tick_interval_s
    c = _container(dep, "governor")
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == DEFAULT_PORTS
    probe = c["readinessProbe"]["grpc"]
    assert probe == {"port": DEFAULT_PORTS["api"], "service": POLICY_SERVICE}
    assert c["livenessProbe"]["grpc"]["port"] == DEFAULT_PORTS["api"]
    # the config file it is started with is the ConfigMap's key, where the ConfigMap is mounted
    assert c["args"][:2] == ["run", "--config"]
    cfg_mount = _mount_of(dep, c, "configMap", "governor-config")
    assert c["args"][2] == f"{cfg_mount['mountPath']}/{CONFIG_KEY}"
    # the token file is a key of the Secret, where the Secret is mounted
    secret = _one("Secret", "governor-api-token")
    tok_mount = _mount_of(dep, c, "secret", "governor-api-token")
    assert s.api.token_file is not None
    token_path = Path(s.api.token_file)
    assert str(token_path.parent) == tok_mount["mountPath"] and token_path.name in secret["stringData"]
    # the state directory is on the pod's own volume (per replica; generations are fenced by the Lease)
    state_mount = _mount_of(dep, c, "emptyDir")
    assert s.state_dir == state_mount["mountPath"]
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"] and sc["capabilities"]["drop"] == ["ALL"]
    assert pod["securityContext"]["runAsNonRoot"] and pod["automountServiceAccountToken"] is True  # Lease calls


def test_service_exposes_api_metrics_and_keda():
    svc = _one("Service", "governor")
    dep = _one("Deployment", "governor")
    assert svc["spec"]["selector"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    ports = {p["name"]: (p["port"], p["targetPort"]) for p in svc["spec"]["ports"]}
    assert ports == {name: (port, name) for name, port in DEFAULT_PORTS.items()}


def test_scaled_objects_follow_keda_and_the_config():
    s = _settings("governor-config")
    svc = _one("Service", "governor")
    scaled = [d for _, d in _all_docs() if d["kind"] == "ScaledObject"]
    assert scaled and all(d["apiVersion"] == "keda.sh/v1alpha1" for d in scaled)
    by_pool = {}
    for so in scaled:
        spec = so["spec"]
        assert spec["scaleTargetRef"]["name"], so["metadata"]["name"]
        trig = spec["triggers"][0]
        assert trig["type"] == "external" and trig.get("metricType", "AverageValue") == "AverageValue"
        meta = trig["metadata"]
        host, _, port = meta["scalerAddress"].rpartition(":")
        assert host in (f"{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc",
                        f"{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc.cluster.local")
        assert int(port) == _port(s.actuators.keda.listen)
        assert all(isinstance(v, str) for v in meta.values())  # KEDA metadata is a map of strings
        by_pool[meta["pool"]] = spec
    pools = {p.name: p for p in s.pools}
    assert set(by_pool) == set(pools), "one ScaledObject per configured pool"
    for name, spec in by_pool.items():
        assert spec["minReplicaCount"] == pools[name].min_replicas
        assert spec["maxReplicaCount"] == pools[name].max_replicas


def test_sidecar_scrapes_the_router_next_door():
    s = _settings("governor-sidecar-config")
    assert s.telemetry.source == "scrape"
    routers = [t for t in s.telemetry.scrape.targets if t.kind == "router"]
    assert routers and routers[0].url.startswith("http://127.0.0.1:")
    dep = _one("Deployment", "llm-d-router")
    router, gov = _container(dep, "router"), _container(dep, "governor")
    router_metrics = {p["containerPort"] for p in router["ports"]}
    assert int(routers[0].url.split(":")[2].split("/")[0]) in router_metrics
    assert gov["readinessProbe"]["grpc"] == {"port": _port(s.api.listen), "service": POLICY_SERVICE}
    assert {p["containerPort"] for p in gov["ports"]} == {_port(s.api.listen), _port(s.metrics.listen)}
    cfg_mount = _mount_of(dep, gov, "configMap", "governor-sidecar-config")
    assert gov["args"] == ["run", "--config", f"{cfg_mount['mountPath']}/{CONFIG_KEY}"]
    assert s.api.token_file is not None
    assert Path(s.api.token_file).parent == Path(_mount_of(dep, gov, "secret")["mountPath"])


def test_podmonitors_add_the_pool_label():
    pool_label = _settings("governor-config").telemetry.prometheus.pool_label
    monitors = {d["metadata"]["name"]: d for _, d in _all_docs() if d["kind"] == "PodMonitor"}
    assert {"vllm-engines", "dcgm-exporter", "llm-d-router", "governor"} <= set(monitors)
    for name in ("vllm-engines", "dcgm-exporter"):
        targets = [r["targetLabel"] for e in monitors[name]["spec"]["podMetricsEndpoints"]
                   for r in e.get("relabelings", [])]
        assert pool_label in targets, name
    assert monitors["dcgm-exporter"]["spec"]["attachMetadata"] == {"node": True}
    gov_ports = {e["port"] for e in monitors["governor"]["spec"]["podMetricsEndpoints"]}
    dep = _one("Deployment", "governor")
    assert gov_ports <= {p["name"] for p in _container(dep, "governor")["ports"]}


# --------------------------------------------------------------------------- plain Prometheus


def test_prometheus_config_adds_the_pool_label(tmp_path):
    cfg = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
    for name in ("vllm", "dcgm"):
        assert "pool" in [r.get("target_label") for r in jobs[name]["relabel_configs"]], name
    for name in ("vllm-static", "dcgm-static"):
        assert all("pool" in g["labels"] for g in jobs[name]["static_configs"]), name


def test_prometheus_config_passes_promtool(tmp_path):
    """promtool checks the file; Debian's build has no Kubernetes service discovery, so with it the
    Kubernetes jobs are left out of the check (their relabelling is checked above)."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not installed (Debian's prometheus package provides it; `make test` installs it)")
    cfg = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    probe = tmp_path / "probe.yml"
    k8s_job = {"job_name": "k", "kubernetes_sd_configs": [{"role": "pod"}]}
    probe.write_text(yaml.safe_dump({"scrape_configs": [k8s_job]}))
    k8s_sd = subprocess.run([promtool, "check", "config", str(probe)], capture_output=True, text=True, timeout=60)
    if k8s_sd.returncode != 0:
        cfg["scrape_configs"] = [j for j in cfg["scrape_configs"] if "kubernetes_sd_configs" not in j]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(cfg))
    res = subprocess.run([promtool, "check", "config", str(path)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert cfg["scrape_configs"], "nothing left to check"


# --------------------------------------------------------------------------- systemd


def unit_entries(text: str) -> dict[str, dict[str, list[str]]]:
    """section → key → values (systemd allows a key more than once), comments and blanks skipped."""
    out: dict[str, dict[str, list[str]]] = {}
    section = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = out.setdefault(line[1:-1], {})
            continue
        assert section is not None and "=" in line, f"stray line {raw!r}"
        key, _, value = line.partition("=")
        section.setdefault(key.strip(), []).append(value.strip())
    return out


def _seconds(value: str) -> float:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(ms|s|min|)", value)
    assert m, f"unsupported time span {value!r}"
    return float(m.group(1)) * {"ms": 1e-3, "s": 1.0, "min": 60.0, "": 1.0}[m.group(2)]


def test_systemd_unit_has_what_the_daemon_needs():
    u = unit_entries(UNIT.read_text())
    svc = {k: v[-1] for k, v in u["Service"].items()}
    assert svc["Type"] == "notify" and svc["NotifyAccess"] == "main"  # sd_notify: runtime/systemd.py
    assert _seconds(svc["WatchdogSec"]) >= 2 * load_settings(DEPLOY / "governor.example.yaml").tick_interval_s
    exe, *args = svc["ExecStart"].split()
    assert exe.startswith("/") and exe.endswith("/governor")
    assert args == ["run", "--config", "/etc/governor/governor.yaml"]
    assert svc["Restart"] == "on-failure"
    assert svc["KillSignal"] == "SIGTERM"
    assert re.search(r"kill -(HUP|s HUP|SIGHUP) \$MAINPID", svc["ExecReload"])
    example = load_settings(DEPLOY / "governor.example.yaml")
    assert _seconds(svc["TimeoutStopSec"]) > example.tick_interval_s
    assert svc["User"] not in ("root", "0") and svc.get("DynamicUser", "no") == "no"
    assert svc["StateDirectory"] == "governor"
    for key, value in {"NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes",
                       "PrivateTmp": "yes", "PrivateDevices": "yes", "CapabilityBoundingSet": "",
                       "RestrictSUIDSGID": "yes", "LockPersonality": "yes"}.items():
        assert svc.get(key) == value, key
    assert "AF_INET" in svc["RestrictAddressFamilies"].split()
    assert u["Install"]["WantedBy"] == ["multi-user.target"]


def test_sysusers_creates_the_units_user():
    user = unit_entries(UNIT.read_text())["Service"]["User"][-1]
    lines = [ln.split() for ln in (DEPLOY / "governor.sysusers").read_text().splitlines()
             if ln.strip() and not ln.startswith("#")]
    assert any(parts[0] == "u" and parts[1] == user for parts in lines)


def test_systemd_analyze_verify(tmp_path):
    """systemd's own check of the unit (unknown keys, bad values). The binary is swapped for /bin/true,
    since verify also requires ExecStart's program to exist."""
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed")
    text = UNIT.read_text()
    exe = unit_entries(text)["Service"]["ExecStart"][-1].split()[0]
    copy = tmp_path / "governor.service"
    copy.write_text(text.replace(exe, "/bin/true"))
    res = subprocess.run([tool, "verify", str(copy)], capture_output=True, text=True, timeout=60)
    complaints = [ln for ln in (res.stdout + res.stderr).splitlines() if ln.strip()]
    assert res.returncode == 0 and not complaints, "\n".join(complaints)


# --------------------------------------------------------------------------- schemas and RBAC

K8S_VERSION = "1.37.0"  # the newest schema set kubernetes-validate bundles (offline)
# Custom resources (and kustomize's file): no schema is bundled for them, so each kind must be one of
# these, at one of these apiVersions; anything else is a typo or a kind to add here on purpose.
CRDS = {"ScaledObject": {"keda.sh/v1alpha1"}, "TriggerAuthentication": {"keda.sh/v1alpha1"},
        "PodMonitor": {"monitoring.coreos.com/v1"},
        "ServiceMonitor": {"monitoring.coreos.com/v1"}, "PrometheusRule": {"monitoring.coreos.com/v1"},
        "LeaderWorkerSet": {"leaderworkerset.x-k8s.io/v1"},
        "InferencePool": {"inference.networking.k8s.io/v1", "inference.networking.x-k8s.io/v1alpha2"},
        "InferenceObjective": {"inference.networking.x-k8s.io/v1alpha2"},
        "InferenceModel": {"inference.networking.x-k8s.io/v1alpha2"},
        "Gateway": {"gateway.networking.k8s.io/v1"}, "HTTPRoute": {"gateway.networking.k8s.io/v1"},
        "GovernorState": {"governor.llm-d.ai/v1alpha1"},
        "Kustomization": {"kustomize.config.k8s.io/v1beta1"}}


# Envoy's loopback bootstrap has ${...} placeholders that controller/dataplane/envoy.py fills in (free
# ports): not YAML until rendered, and no Kubernetes object; tests/dataplane start Envoy with it rendered.
NOT_YAML_TEMPLATES = {"envoy/loopback.yaml"}


def _manifests() -> list[tuple[str, dict]]:
    """Every Kubernetes object under deploy/ (any YAML document with apiVersion and kind)."""
    out = []
    for path in sorted(DEPLOY.rglob("*.y*ml")):
        if "templates" in path.parts:  # Helm templates are validated rendered, not raw
            continue
        if str(path.relative_to(DEPLOY)) in NOT_YAML_TEMPLATES:
            continue
        if path.relative_to(DEPLOY).parts[0] == "kustomize":
            continue  # overlays and their patches are partial objects: tests/test_deploy_ops.py validates them rendered
        for d in yaml.safe_load_all(path.read_text()):
            if isinstance(d, dict) and "apiVersion" in d and "kind" in d:
                out.append((str(path.relative_to(DEPLOY)), d))
    return out


def test_every_manifest_passes_kubernetes_validate():
    import kubernetes_validate as kv

    docs = _manifests()
    assert len(docs) >= 20
    problems = []
    for where, d in docs:
        name = f"{where}: {d['kind']}/{d.get('metadata', {}).get('name')}"
        try:
            kv.validate(d, K8S_VERSION, strict=True)  # strict: an unknown (misspelt) field is an error
        except kv.SchemaNotFoundError:
            if d["apiVersion"] not in CRDS.get(d["kind"], set()):
                problems.append(f"{name}: no schema for {d['apiVersion']} {d['kind']} (not a known CRD either)")
        except kv.ValidationError as exc:
            problems.append(f"{name}: {exc}")
    assert not problems, "\n".join(problems)


def test_kubernetes_validate_catches_a_bad_manifest():
    import kubernetes_validate as kv

    bad = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"},
           "spec": {"replicas": "three", "selector": {}, "template": {}}}
    with pytest.raises(kv.ValidationError):
        kv.validate(bad, K8S_VERSION, strict=True)
    typo = _one("Role", "governor-scaler") | {"rulez": []}
    with pytest.raises(kv.ValidationError):
        kv.validate(typo, K8S_VERSION, strict=True)


def _permission(method: str, path: str) -> tuple[str, str, str]:
    """(API group, resource[/subresource], verb) of one request the adapter made."""
    parts = path.strip("/").split("/")
    group = "" if parts[0] == "api" else parts[1]
    rest = parts[parts.index("namespaces") + 2:]  # resource [name [subresource]]
    resource = rest[0] + (f"/{rest[2]}" if len(rest) == 3 else "")
    verb = {"GET": "get" if len(rest) > 1 else "list", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}[method]
    return group, resource, verb


def test_the_role_grants_exactly_the_calls_the_adapter_makes():
    from controller.actuation.kube import KubernetesAutoscaler, KubeTarget, api_client
    from tests.fakes.kube_api import FakeKubeApi

    api = FakeKubeApi()
    try:
        api.add_workload("Deployment", "d", replicas=2)
        api.add_workload("Deployment", "d-standby", replicas=0, labels={"app": "d-standby"})
        api.add_workload("StatefulSet", "s", replicas=2)
        api.add_workload("LeaderWorkerSet", "l", replicas=2)
        api.add_scaledobject("unrelated", "other")  # KEDA installed: its list is called too
        for i, p in enumerate(api.pods()):
            api.set_ready(p["metadata"]["name"], f"10.0.0.{i + 1}")
        kube = KubernetesAutoscaler({
            "d": KubeTarget("d", "Deployment", "d", "inference", "vllm", 8000, standby="d-standby"),
            "s": KubeTarget("s", "StatefulSet", "s", "inference", "vllm", 8000),
            "l": KubeTarget("l", "LeaderWorkerSet", "l", "inference", "vllm", 8000)}, api_client(host=api.url))
        slow = next(p["metadata"]["name"] for p in api.pods() if re.fullmatch(r"d-\d+", p["metadata"]["name"]))
        kube.execute(kube.plan_pool("d", 2, 1, 0, 0, replace=(slow,)))  # a slow replica replaced: its pod deleted
        for pool in ("d", "s", "l"):  # every lever on every kind: down with a drain, standby, caps, state
            kube.execute(kube.plan_pool(pool, 1, 1 if pool == "d" else 0, 64, 4096))
            kube.pool_state(pool)
        used = {_permission(m, p) for m, p, _ in api.requests}
    finally:
        api.close()
    granted = {(g, r, v) for rule in _one("Role", "governor-scaler")["rules"]
               for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    assert used == granted, f"used but not granted: {sorted(used - granted)}; granted, never used: " \
                            f"{sorted(granted - used)}"
    binding = _one("RoleBinding", "governor-scaler")
    assert binding["roleRef"]["name"] == "governor-scaler"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "governor", "namespace": "inference"}]
    _one("ServiceAccount", "governor")


def test_standby_pods_are_selected_by_nothing_that_serves():
    s = _settings("governor-kubernetes-config")
    (w,) = s.actuators.kubernetes.pools
    serving = _one("Deployment", w.name)
    assert w.standby is not None
    standby = _one("Deployment", w.standby)
    sb_labels = standby["spec"]["template"]["metadata"]["labels"]
    selectors = [_one("Service", w.name)["spec"]["selector"], serving["spec"]["selector"]["matchLabels"]]
    selectors += [pm["spec"]["selector"]["matchLabels"] for _, pm in _all_docs() if pm["kind"] == "PodMonitor"]
    for sel in selectors:
        assert not all(sb_labels.get(k) == v for k, v in sel.items()), f"{sel} selects the standby pods"
    assert "governor-pool" not in sb_labels  # its metrics must not count as the pool's serving capacity
    c = _container(serving, w.container)
    assert "--max-num-seqs=256" in c["args"] and c["ports"][0]["containerPort"] == w.port


# --------------------------------------------------------------------------- docs


def test_readme_explains_every_file():
    readme = (DEPLOY / "README.md").read_text()
    for path in sorted(DEPLOY.rglob("*")):
        if path.is_file() and path.name != "README.md":
            rel = str(path.relative_to(DEPLOY))
            assert rel in readme, f"deploy/README.md does not mention {rel}"
