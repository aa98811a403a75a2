"""The daemon's actuator selection by config: Kubernetes adapter (+ routers), gRPC, or none; clear errors.

The Kubernetes client is pointed at tests/fakes/kube_api.py through a real kubeconfig file, the way an
operator outside the cluster would run it.
"""

from __future__ import annotations

import logging

import pytest
import yaml

from controller.actuation.grpc_actuator import GrpcActuator
from controller.actuation.kube_actuator import FleetActuator
from controller.clock import VirtualClock, WallClock
from controller.config import parse_settings
from controller.runtime.actuators import build_actuator
from controller.runtime.main import build_services
from controller.types import Decision, PoolDecision
from tests.fakes.kube_api import FakeKubeApi
from tests.fixtures.prometheus import free_port

T0 = 1_700_000_000.0
POOLS = """\
pools:
  - {name: chat-h100, model: llama-3-8b, sku: h100-80gb, usd_per_gpu_hour: 3.0, min_replicas: 2, max_replicas: 8}
  - {name: chat-a100, model: llama-3-8b, sku: a100-80gb, engine: sglang, usd_per_gpu_hour: 1.5, max_replicas: 4}
"""


@pytest.fixture
def api():
    fake = FakeKubeApi()
    fake.add_workload("Deployment", "vllm-h100", replicas=1)
    fake.add_workload("StatefulSet", "sgl-a100", replicas=1, container="sglang", args=["--model-path", "m"])
    yield fake
    fake.close()


def kubeconfig(tmp_path, url: str) -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": url}}],
        "users": [{"name": "governor", "user": {"token": "test-token"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "governor", "namespace": "inference"}}],
    }))
    return str(path)


def kube_yaml(config: str, extra: str = "") -> str:
    return POOLS + f"""\
actuators:
  kubernetes:
    enabled: true
    kubeconfig: {config}
    pools:
      - {{pool: chat-h100, name: vllm-h100}}
      - {{pool: chat-a100, kind: StatefulSet, name: sgl-a100, container: sglang, port: 30000}}
{extra}"""


def test_kubernetes_config_builds_the_fleet_actuator_that_scales_the_workloads(api, tmp_path):
    settings = parse_settings(kube_yaml(kubeconfig(tmp_path, api.url)))
    clock = VirtualClock(T0)
    actuator, closers = build_actuator(settings, clock)
    try:
        assert isinstance(actuator, FleetActuator) and actuator.routers == []
        d = Decision("d-1", 1, T0, T0 + 60, {"chat-h100": PoolDecision(replicas=3),
                                             "chat-a100": PoolDecision(replicas=2, max_num_seqs=32)})
        out = actuator.apply(d)
        assert out.status == "applied", out.detail
        assert api.workload("deployments", "vllm-h100")["spec"]["replicas"] == 3
        sts = api.workload("statefulsets", "sgl-a100")
        assert sts["spec"]["replicas"] == 2
        # the pool's engine is sglang: its own flag carries max_num_seqs
        assert sts["spec"]["template"]["spec"]["containers"][0]["args"] == ["--model-path", "m",
                                                                            "--max-running-requests=32"]
        state = actuator.fleet_state()
        assert state is not None and state.pools["chat-a100"].max_num_seqs == 32
        # the bearer token of the kubeconfig reached the API
        assert api.requests
    finally:
        for c in reversed(closers):
            c()


def test_routers_come_with_a_membership_loop_that_stops(api, tmp_path):
    extra = "    routers:\n      - {kind: vllm-router, url: 'http://127.0.0.1:9', pools: [chat-h100]}\n"
    settings = parse_settings(kube_yaml(kubeconfig(tmp_path, api.url), extra))
    actuator, closers = build_actuator(settings, VirtualClock(T0))
    assert isinstance(actuator, FleetActuator) and [r.kind for r in actuator.routers] == ["vllm-router"]
    assert len(closers) == 2  # the actuator and its membership loop
    # nothing listens on port 9: the membership part of the outcome says so by name instead of raising
    out = actuator.apply(Decision("d-1", 1, T0, T0 + 60, {"chat-h100": PoolDecision(replicas=1),
                                                        "chat-a100": PoolDecision(replicas=1)}))
    assert out.targets["autoscaler"].status == "applied" and out.targets["routers"].status == "failed"
    assert "vllm-router list_workers http://127.0.0.1:9/list_workers: unreachable" in out.targets["routers"].detail
    assert actuator.sync_membership()  # while the plan is valid the loop's syncs report it too
    for c in reversed(closers):
        c()


def test_grpc_and_no_actuator_are_still_selected_as_before():
    s = parse_settings(POOLS + "actuators:\n  router: {address: '127.0.0.1:7001'}\n")
    actuator, closers = build_actuator(s, VirtualClock(T0))
    assert isinstance(actuator, GrpcActuator)
    for c in closers:
        c()
    assert build_actuator(parse_settings(POOLS), VirtualClock(T0)) == (None, [])


def test_an_unloadable_kubeconfig_is_a_clear_error(tmp_path):
    settings = parse_settings(kube_yaml(str(tmp_path / "missing")))
    with pytest.raises(ValueError, match=r"actuators.kubernetes: cannot load kubeconfig '.*missing'"):
        build_actuator(settings, VirtualClock(T0))
    incluster = parse_settings(kube_yaml("null"))
    with pytest.raises(ValueError, match="cannot load the in-cluster service account"):
        build_actuator(incluster, VirtualClock(T0))


def test_the_daemon_runs_a_tick_against_the_kubernetes_adapter(api, tmp_path):
    text = kube_yaml(kubeconfig(tmp_path, api.url)) + f"""\
mode: active
state_dir: {tmp_path / "state"}
telemetry:
  source: scrape
  window_s: 60
  scrape:
    targets: [{{url: 'http://127.0.0.1:{free_port()}/metrics', pool: chat-h100}}]
api: {{listen: '127.0.0.1:0'}}
metrics: {{listen: null}}
"""
    services = build_services(parse_settings(text), clock=WallClock(), logger=logging.getLogger("test"))
    try:
        report = services.daemon.tick()
        assert report is not None
        ok, detail = services.daemon.actuator.health()
        assert ok, detail
        # no telemetry: the pools are held at or above their floors, written through /scale
        assert api.workload("deployments", "vllm-h100")["spec"]["replicas"] >= 2
    finally:
        services.close()
