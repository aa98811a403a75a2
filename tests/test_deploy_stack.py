"""deploy/kustomize/stack, the whole stack in one overlay (issue 34, part 6), rendered with `kubectl kustomize` and
checked offline: every object against the Kubernetes schemas (GovernorState against its own CRD), no placeholder
image, and the parts wired to each other — Governor's config (the real parser) to the picker and the workloads, the
picker's flags (its real parser) to the InferencePools, each InferencePool to its headless Service, the model names
to the catalogue, Envoy's bootstrap to deploy/envoy/kubernetes.yaml and the picker's waits to its timeout."""

from __future__ import annotations

import argparse
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from controller.config import parse_settings
from controller.dataplane.cli import add_arguments, config_from_args
from controller.dataplane.envoy import envoy_binary
from tests.test_deploy_ops import _render, _validate

ROOT = Path(__file__).resolve().parents[1]
STACK = ROOT / "deploy" / "kustomize" / "stack"


@pytest.fixture(scope="module")
def docs() -> list[dict]:
    return _render(STACK)


def _of(docs: list[dict], kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def _containers(docs: list[dict]) -> dict[str, dict]:
    return {f"{name}/{c['name']}": c for name, d in _of(docs, "Deployment").items()
            for c in d["spec"]["template"]["spec"]["containers"]}


def test_it_renders_and_validates_offline(docs):
    assert _validate(docs, "stack") <= {"PodMonitor", "PrometheusRule", "InferencePool"}
    kinds = {d["kind"] for d in docs}
    assert {"CustomResourceDefinition", "GovernorState", "InferencePool", "Lease", "Role", "PrometheusRule"} <= kinds
    assert "ScaledObject" not in kinds and "TriggerAuthentication" not in kinds  # the Kubernetes adapter scales


def test_no_placeholder_image_and_envoy_is_the_release_the_tests_run(docs):
    images = {c["image"] for c in _containers(docs).values()}
    assert images == {"llm-governor:0.1.0", "envoyproxy/envoy:v1.40.0", "vllm/vllm-openai:v0.11.0"}, images
    for image in images:
        assert re.fullmatch(r"[a-z0-9./-]+:v?\d+\.\d+\.\d+", image), image
        assert not re.search(r"your|example|placeholder|replace|latest", image, re.I), image
    version = subprocess.run([envoy_binary(), "--version"], capture_output=True, text=True, timeout=30).stdout
    assert "/1.40.0/" in version, version


def test_governor_is_wired_to_the_picker_and_the_workloads(docs):
    cm = _of(docs, "ConfigMap")["governor-config"]
    s = parse_settings(cm["data"]["governor.yaml"], "stack ConfigMap/governor-config")
    assert s.mode.value == "shadow" and s.leader_election.enabled and s.leader_election.shared_state
    assert not s.actuators.keda.enabled and s.actuators.kubernetes.enabled
    services = _of(docs, "Service")
    assert s.actuators.router.address is not None
    host, port = s.actuators.router.address.rsplit(":", 1)
    name, ns = host.split(".")[:2]
    picker_ports = {p["name"]: p["port"] for p in services[name]["spec"]["ports"]}
    assert ns == "inference" and int(port) == picker_ports["control"]
    deployments = _of(docs, "Deployment")
    for w in s.actuators.kubernetes.pools:
        assert w.name in deployments and deployments[w.name]["spec"]["template"]["metadata"]["labels"][
            "governor-pool"] == w.pool
    assert {w.pool for w in s.actuators.kubernetes.pools} == set(s.pool_names())
    # the router TLS files are the mounted client certificate
    governor = _containers(docs)["governor/governor"]
    mounts = {m["mountPath"]: m["name"] for m in governor["volumeMounts"]}
    volumes = {v["name"]: v for v in deployments["governor"]["spec"]["template"]["spec"]["volumes"]}
    for path in (s.actuators.router.tls.ca, s.actuators.router.tls.cert, s.actuators.router.tls.key):
        assert path is not None
        vol = volumes[mounts[str(Path(path).parent)]]
        assert vol["secret"]["secretName"] == "governor-picker-client"
    assert "keda-tls" not in volumes  # no KEDA Secret the pods would wait for


def test_the_picker_reads_the_inferencepools_and_each_lists_its_pods_through_a_headless_service(docs):
    picker = _containers(docs)["governor-picker/picker"]
    assert picker["args"][0] == "picker"
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    cfg = config_from_args(parser.parse_args(picker["args"][1:]))
    s = parse_settings(_of(docs, "ConfigMap")["governor-config"]["data"]["governor.yaml"], "stack")
    # the picker's route groups are Governor's, pool for pool
    groups: dict[str, list[str]] = {}
    for p in s.pools:
        groups.setdefault(p.group, []).append(p.name)
    assert {g: sorted(ps) for g, ps in cfg.groups.items()} == {g: sorted(ps) for g, ps in groups.items()}
    pools, services = _of(docs, "InferencePool"), _of(docs, "Service")
    engines = s.engines()
    for pool, (ns, name) in cfg.inferencepools.items():
        ip = pools[name]
        assert ns == ip["metadata"]["namespace"] == "inference"
        svc = services[name]
        assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["selector"] == ip["spec"]["selector"]["matchLabels"]
        assert ip["spec"]["targetPorts"][0]["number"] == svc["spec"]["ports"][0]["targetPort"]
        assert ip["spec"]["endpointPickerRef"]["name"] == "governor-picker"
        # the model the pool declares is what its engine serves (the catalogue's served name, vLLM's --model)
        served = ip["metadata"]["annotations"]["governor.llm-d.ai/models"]
        assert served == engines[pool].arch.served_name
        vllm = _containers(docs)[f"vllm-{pool}/vllm"]
        assert vllm["args"][vllm["args"].index("--model") + 1] == served
    role = _of(docs, "Role")["governor-picker"]
    assert {(r["apiGroups"][0], r["resources"][0], r["verbs"][0]) for r in role["rules"]} == {
        ("inference.networking.k8s.io", "inferencepools", "get"), ("discovery.k8s.io", "endpointslices", "list")}
    # a held request's wait fits Envoy's ext_proc message timeout
    bootstrap = yaml.safe_load(_of(docs, "ConfigMap")["envoy-bootstrap"]["data"]["envoy.yaml"])
    text = yaml.safe_dump(bootstrap)
    timeout = float(re.search(r"message_timeout: (\d+)s", text).group(1))  # type: ignore[union-attr]
    assert cfg.cold is not None and max(cfg.cold.wait_s.values()) < timeout and cfg.hold_timeout_s < timeout


def test_envoys_bootstrap_is_the_shipped_one_and_the_scaler_role_the_adapters(docs):
    bootstrap = _of(docs, "ConfigMap")["envoy-bootstrap"]["data"]["envoy.yaml"]
    assert bootstrap == (ROOT / "deploy" / "envoy" / "kubernetes.yaml").read_text()
    adapter = [d for d in yaml.safe_load_all((ROOT / "deploy" / "kubernetes" / "kubernetes-adapter.yaml").read_text())
               if d and d["kind"] == "Role"]
    assert _of(docs, "Role")["governor-scaler"]["rules"] == adapter[0]["rules"]


def test_no_manifest_in_deploy_names_a_placeholder_image(tmp_path):
    found = {}
    for path in sorted((ROOT / "deploy").rglob("*.yaml")):
        for m in re.finditer(r"^\s*image:\s*(\S+)", path.read_text(), re.M):
            found[f"{path.relative_to(ROOT)}:{m.group(1)}"] = m.group(1)
    assert found
    bad = [k for k, image in found.items() if re.search(r"your|placeholder|replace|latest", image, re.I)
           or not re.search(r":v?\d+\.\d+\.\d+$", image)]
    assert not bad, bad
    # the sidecar's router is the picker, with flags its own parser takes
    sidecar = [d for d in yaml.safe_load_all((ROOT / "deploy" / "kubernetes" / "sidecar.yaml").read_text()) if d]
    (dep,) = [d for d in sidecar if d["kind"] == "Deployment"]
    (router,) = [c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == "router"]
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    token = tmp_path / "token"
    token.write_text("a-token-of-the-api-secret\n")
    args = [f"--control-token-file={token}" if a.startswith("--control-token-file=") else a for a in router["args"]]
    cfg = config_from_args(parser.parse_args(args[1:]))
    assert args[0] == "picker" and cfg.control_token == "a-token-of-the-api-secret" and cfg.host == "0.0.0.0"
    mounted = {m["mountPath"] for m in router["volumeMounts"]}
    assert any(a.startswith("--control-token-file=") and str(Path(a.split("=", 1)[1]).parent) in mounted
               for a in router["args"])
