"""Model-aware routing and holding requests for a route group with no ready replica (issue 34, parts 3 and 4):
the pure parts (controller/dataplane/model_routing.py, picker.py's cold start) and InferencePool membership through the
official client against the in-process API server (tests/fakes/kube_api.py)."""

from __future__ import annotations

import pytest

from controller.actuation.kube import api_client
from controller.dataplane.model_routing import (
    InferencePoolMembership,
    ModelNotServedError,
    ModelRoutes,
    PoolRef,
    pool_groups_serving_different_models,
    served_names,
)
from controller.dataplane.picker import ColdStart, Picker
from controller.dataplane.policy_store import PoolSettings, Settings
from tests.fakes.kube_api import FakeKubeApi

GROUPS = {"llama": ["llama-h100", "llama-a100"], "qwen": ["qwen-h100"]}
SETTINGS = Settings({p: PoolSettings() for ps in GROUPS.values() for p in ps})


def test_a_model_routes_to_the_group_that_serves_it_and_an_unknown_one_is_refused():
    routes = ModelRoutes(GROUPS, declared={"llama-h100": {"meta-llama/Llama-3.1-8B-Instruct"},
                                           "llama-a100": {"meta-llama/Llama-3.1-8B-Instruct"}})
    assert routes.group_for(None, None) is None and routes.group_for(None, "qwen") == "qwen"  # no model: header
    assert routes.group_for("meta-llama/Llama-3.1-8B-Instruct", None) == "llama"
    # the qwen pool's replicas report their base model and a LoRA adapter (GET /v1/models)
    routes.report("qwen-h100", served_names(
        b'{"object":"list","data":[{"id":"Qwen/Qwen2.5-7B-Instruct","parent":null},'
        b'{"id":"sql-lora","parent":"Qwen/Qwen2.5-7B-Instruct"}]}'))
    assert routes.group_for("sql-lora", "llama") == "qwen"  # the model decides, not a header naming another group
    routes.report("qwen-h100", [])  # scaled to zero: nothing reported, the last names are kept
    assert routes.group_for("Qwen/Qwen2.5-7B-Instruct", None) == "qwen"
    with pytest.raises(ModelNotServedError, match="The model `gpt-4` does not exist or is not served here"):
        routes.group_for("gpt-4", None)
    assert ModelRoutes(GROUPS).group_for("gpt-4", "qwen") == "qwen"  # knows no model: routes by header as before
    assert served_names(b"not json") == set() and served_names(b'{"data": 3}') == set()


def test_a_route_group_whose_pools_serve_different_models_is_named():
    problems = pool_groups_serving_different_models({"default": ["a", "b"], "c": ["c"]},
                                                    {"a": {"llama"}, "b": {"qwen"}, "c": {"x"}})
    assert problems == ["route group 'default' mixes models: a serves ['llama']; b serves ['qwen']"]


def _cold_picker(**cold) -> Picker:
    p = Picker(GROUPS, block_chars=16, affinity_blocks=1, cold=ColdStart(**cold))
    p.set_endpoints("llama-h100", ["10.0.0.1:8000"])
    return p


def test_a_group_at_zero_holds_its_requests_critical_first_until_a_replica_is_ready():
    p = _cold_picker(queue_size=4, wait_s={"critical": 60.0, "standard": 30.0, "sheddable": 0.0})
    assert p.route("standard", "x", SETTINGS, 0.0, "llama").endpoint is not None  # a ready pool: no hold
    held = [p.route(c, "x", SETTINGS, 1.0, "qwen").held for c in ("standard", "critical", "standard")]
    assert all(h is not None and h.pool == "" and h.group == "qwen" for h in held)
    assert [h.wait_s for h in held if h] == [30.0, 60.0, 30.0]
    shed = p.route("sheddable", "x", SETTINGS, 1.0, "qwen")  # the class that does not wait
    assert (shed.status, shed.reason) == (503, "no_endpoint")
    assert p.held_count("standard") == 2 and p.held_count("critical") == 1 and p.cold_count() == 3
    assert p.dispatch_held(SETTINGS) == []  # still no replica
    p.set_endpoints("qwen-h100", ["10.0.2.1:8000"])
    out = p.dispatch_held(SETTINGS)
    assert [h.cls for h in out] == ["critical", "standard", "standard"]  # critical first, FCFS within a class
    assert all(h.endpoint is not None and h.endpoint.pool == "qwen-h100" for h in out)
    assert p.cold_count() == 0 and p.held_count("standard") == 0


def test_past_the_bound_a_full_queue_is_429_and_a_wait_timeout_503_with_retry_after():
    p = _cold_picker(queue_size=2)
    a = p.route("critical", "x", SETTINGS, 0.0, "qwen").held
    b = p.route("standard", "x", SETTINGS, 0.0, "qwen").held
    full = p.route("critical", "x", SETTINGS, 0.0, "qwen")
    assert (full.status, full.reason) == (429, "cold_queue_full") and full.retry_after_s >= 1
    assert a is not None and b is not None and p.abandon(b)  # its class's wait ran out at the edge
    assert p.counters.rejected[("standard", "cold_start_timeout")] == 1 and p.cold_count() == 1
    assert p.route("standard", "x", SETTINGS, 0.0, "qwen").held is not None  # room again
    # a replica at its in-flight cap: a released request waits for room in the pool, still counted as held
    capped = Settings({**SETTINGS.pools, "qwen-h100": PoolSettings(inflight_cap=1)})
    p.set_endpoints("qwen-h100", ["10.0.2.1:8000"])
    p.endpoints["qwen-h100"][0].inflight = 1
    out = p.dispatch_held(capped)
    assert [h.cls for h in out] == ["critical"]  # critical passes the cap; standard waits in the pool's queue
    assert p.cold_count() == 0 and p.held_count("standard") == 1


def test_inferencepool_membership_is_its_ready_endpointslice_endpoints():
    fake = FakeKubeApi()
    try:
        fake.put_object("inference.networking.k8s.io", "inferencepools", {
            "apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
            "metadata": {"name": "qwen-h100", "annotations": {"governor.llm-d.ai/models": "Qwen/Qwen2.5-7B-Instruct"}},
            "spec": {"selector": {"matchLabels": {"governor-pool": "qwen-h100"}}, "targetPorts": [{"number": 8000}],
                     "endpointPickerRef": {"name": "governor-picker", "port": {"number": 9002}}}})
        members = InferencePoolMembership({"qwen-h100": PoolRef("inference", "qwen-h100")}, api_client(host=fake.url))
        assert members.read("qwen-h100") == ([], {"Qwen/Qwen2.5-7B-Instruct"})  # scaled to zero
        fake.put_object("discovery.k8s.io", "endpointslices", {
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
            "metadata": {"name": "qwen-h100-x1", "labels": {"kubernetes.io/service-name": "qwen-h100"}},
            "ports": [{"name": "http", "port": 8000}],
            "endpoints": [{"addresses": ["10.0.2.1"], "conditions": {"ready": True}},
                          {"addresses": ["10.0.2.2"], "conditions": {"ready": False}},  # still loading
                          {"addresses": ["10.0.2.3"], "conditions": {"ready": True, "terminating": False}}]})
        fake.put_object("discovery.k8s.io", "endpointslices", {  # another Service's slice: not this pool
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
            "metadata": {"name": "other-x1", "labels": {"kubernetes.io/service-name": "other"}},
            "endpoints": [{"addresses": ["10.9.9.9"], "conditions": {"ready": True}}]})
        addrs, _ = members.read("qwen-h100")
        assert addrs == ["10.0.2.1:8000", "10.0.2.3:8000"]
    finally:
        fake.close()


def test_config_validate_refuses_a_route_group_whose_pools_serve_different_models(tmp_path, capsys):
    from controller.cli import main

    path = tmp_path / "g.yaml"
    pools = ("pools:\n"
             "  - {name: llama-h100, model: llama-3.1-8b, sku: h100, usd_per_gpu_hour: 3, max_replicas: 4}\n"
             "  - {name: qwen-h100, model: qwen-2.5-7b, sku: h100, usd_per_gpu_hour: 3, max_replicas: 4}\n")
    path.write_text(f"state_dir: {tmp_path}/state\n" + pools)
    assert main(["config", "validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert ("pools[1].group: route group 'default' mixes models: llama-h100 serves 'llama-3.1-8b', qwen-h100 "
            "serves 'qwen-2.5-7b'; give each model its own group") in err, err
    path.write_text(f"state_dir: {tmp_path}/state\n" + pools.replace("max_replicas: 4}\n", "max_replicas: 4, "
                                                                     "group: qwen}\n").replace(
        "group: qwen}\n", "group: llama}\n", 1))
    assert main(["config", "validate", str(path)]) == 0, capsys.readouterr().err
