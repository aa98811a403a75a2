"""The live fleet: control semantics on real loopback gRPC, then the real Fleet served on loopback.

The first half drives `ControlPlane` with a fake fleet and a VirtualClock, so
deadline expiry is moved by hand. The second half runs a tiny scenario at 20x
and checks endpoints appear and disappear as replicas come and go.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from controller.clock import VirtualClock
from controller.gen.governor.v1 import control_pb2 as pb
from controller.gen.governor.v1 import control_pb2_grpc as pb_grpc
from controller.sim.control_plane import ControlPlane, serve_control
from controller.sim.live import LiveFleet
from tests.fakes.live_fleet import FakeFleet
from tests.fakes.live_scenario import write_scenario
from tests.fixtures.prometheus import wait_until

T0 = 1_800_000_000.0  # virtual Unix time at the start of each test


class Rig:
    def __init__(self) -> None:
        self.clock = VirtualClock(T0)
        self.fleet = FakeFleet()
        self.plane = ControlPlane(self.fleet, threading.RLock(), self.clock, sim_to_unix=lambda t: T0 + t / 2)
        self.router_ep, self.autoscaler_ep = serve_control(self.plane, "127.0.0.1")
        self.channels = [grpc.insecure_channel(self.router_ep.address),
                         grpc.insecure_channel(self.autoscaler_ep.address)]
        self.router = pb_grpc.RouterControlStub(self.channels[0])
        self.autoscaler = pb_grpc.AutoscalerControlStub(self.channels[1])

    def close(self) -> None:
        for c in self.channels:
            c.close()
        self.router_ep.stop(0)
        self.autoscaler_ep.stop(0)


@pytest.fixture
def rig():
    r = Rig()
    yield r
    r.close()


def meta(gen: int, did: str | None = None, ttl_s: float = 60.0) -> pb.CommandMeta:
    return pb.CommandMeta(decision_id=did or f"d-{gen}", generation=gen, valid_until_unix_s=T0 + ttl_s, issuer="test")


def plan(gen: int, did: str | None = None, ttl_s: float = 60.0, **replicas: int) -> pb.ScalingPlan:
    return pb.ScalingPlan(meta=meta(gen, did, ttl_s),
                          pools=[pb.PoolScaling(pool=p, replicas=n) for p, n in replicas.items()])


def routing(gen: int, did: str | None = None, ttl_s: float = 60.0, shed: float = 0.0) -> pb.RoutingPolicy:
    return pb.RoutingPolicy(
        meta=meta(gen, did, ttl_s),
        pools=[pb.PoolRouting(pool="small", traffic_weight=2.0, inflight_cap=8,
                              weights=pb.ScorerWeights(prefix=5.0, queue=1.0, kv_usage=0.5))],
        admission=[pb.ClassAdmission(priority_class="sheddable", rate_limit_rps=3.0, queue_budget=7,
                                     shed_fraction=shed)],
    )


def test_generation_ordering_replay_and_stale(rig):
    ack = rig.autoscaler.ApplyScalingPlan(plan(3, big=4))
    assert (ack.status, ack.applied_generation) == (pb.ACK_STATUS_APPLIED, 3)
    assert rig.fleet.targets["big"] == 4
    n_calls = len(rig.fleet.calls)

    ack = rig.autoscaler.ApplyScalingPlan(plan(3, big=4))  # same generation, same id
    assert (ack.status, ack.applied_generation) == (pb.ACK_STATUS_REPLAY, 3)
    assert len(rig.fleet.calls) == n_calls  # nothing re-applied

    ack = rig.autoscaler.ApplyScalingPlan(plan(3, did="other", big=6))  # same generation, other id
    assert ack.status == pb.ACK_STATUS_STALE_GENERATION
    ack = rig.autoscaler.ApplyScalingPlan(plan(2, big=6))  # lower generation
    assert (ack.status, ack.applied_generation) == (pb.ACK_STATUS_STALE_GENERATION, 3)
    assert len(rig.fleet.calls) == n_calls and rig.fleet.targets["big"] == 4

    ack = rig.autoscaler.ApplyScalingPlan(plan(4, big=6, small=1))
    assert (ack.status, ack.applied_generation) == (pb.ACK_STATUS_APPLIED, 4)
    assert rig.fleet.targets == {"big": 6, "small": 1}
    state = rig.autoscaler.GetFleetState(pb.GetFleetStateRequest())
    assert (state.applied_generation, state.applied_decision_id, state.fallback_active) == (4, "d-4", False)
    assert {p.pool: p.target_replicas for p in state.pools} == {"big": 6, "small": 1}
    assert [(r.id, r.phase, r.phase_since_unix_s) for r in state.replicas] == [
        ("big-r0", "ready", T0), ("small-r3", "starting", T0 + 6.25)]


def test_router_and_autoscaler_keep_separate_generations(rig):
    assert rig.router.ApplyRoutingPolicy(routing(10)).status == pb.ACK_STATUS_APPLIED
    assert rig.autoscaler.ApplyScalingPlan(plan(1, big=2)).status == pb.ACK_STATUS_APPLIED
    assert rig.router.ApplyRoutingPolicy(routing(9)).status == pb.ACK_STATUS_STALE_GENERATION
    got = rig.router.GetRoutingPolicy(pb.GetRoutingPolicyRequest())
    assert got.meta.generation == 10 and got.meta.decision_id == "d-10"
    small = next(p for p in got.pools if p.pool == "small")
    assert (small.traffic_weight, small.inflight_cap, small.weights.prefix) == (2.0, 8, 5.0)
    big = next(p for p in got.pools if p.pool == "big")  # not in the command: scenario defaults
    assert (big.traffic_weight, big.inflight_cap, big.weights.prefix) == (1.0, 0, 3.0)
    shed = next(a for a in got.admission if a.priority_class == "sheddable")
    assert (shed.rate_limit_rps, shed.queue_budget) == (3.0, 7)
    assert ("routing", "small", {"traffic_weight": 2.0, "inflight_cap": 8, "prefix_weight": 5.0,
                                 "queue_weight": 1.0, "kv_weight": 0.5}) in rig.fleet.calls


def _scaling(**fields):
    pools = fields.pop("pools", [pb.PoolScaling(pool="big", replicas=2)])
    return pb.ScalingPlan(meta=fields.pop("meta", meta(5)), pools=pools)


def _routing(pools=(), admission=(), m=None):
    return pb.RoutingPolicy(meta=m or meta(5), pools=list(pools), admission=list(admission))


INVALID_CASES = [
    # label, service, command, text the message must contain
    ("unknown pool", "autoscaler", _scaling(pools=[pb.PoolScaling(pool="nope", replicas=1)]), "pools[0].pool"),
    ("negative replicas", "autoscaler",
     _scaling(pools=[pb.PoolScaling(pool="small", replicas=2), pb.PoolScaling(pool="big", replicas=-1)]),
     "pools[1].replicas: -1"),
    ("above max", "autoscaler", _scaling(pools=[pb.PoolScaling(pool="big", replicas=9)]), "[1, 8]"),
    ("duplicate pool", "autoscaler",
     _scaling(pools=[pb.PoolScaling(pool="big", replicas=2), pb.PoolScaling(pool="big", replicas=3)]),
     "more than once"),
    ("negative standby", "autoscaler", _scaling(pools=[pb.PoolScaling(pool="big", replicas=2, warm_standby=-1)]),
     "pools[0].warm_standby: -1"),
    ("max_num_seqs too big", "autoscaler",
     _scaling(pools=[pb.PoolScaling(pool="big", replicas=2, max_num_seqs=5000)]), "pools[0].max_num_seqs: 5000"),
    ("standby above max", "autoscaler", _scaling(pools=[pb.PoolScaling(pool="big", replicas=2, warm_standby=9)]),
     "pools[0].warm_standby: 9"),
    ("tokens below seqs", "autoscaler",
     _scaling(pools=[pb.PoolScaling(pool="big", replicas=2, max_num_seqs=512, max_num_batched_tokens=256)]),
     "pools[0].max_num_batched_tokens: 256 must be >= max_num_seqs (512)"),
    ("batched tokens too small", "autoscaler",
     _scaling(pools=[pb.PoolScaling(pool="big", replicas=2, max_num_batched_tokens=8)]),
     "pools[0].max_num_batched_tokens"),
    ("missing meta", "autoscaler", pb.ScalingPlan(pools=[pb.PoolScaling(pool="big", replicas=2)]), "meta: missing"),
    ("empty decision id", "autoscaler", _scaling(meta=pb.CommandMeta(generation=5, valid_until_unix_s=T0 + 9)),
     "meta.decision_id"),
    ("generation zero", "autoscaler", _scaling(meta=meta(0)), "meta.generation"),
    ("already expired", "autoscaler", _scaling(meta=meta(5, ttl_s=-1)), "meta.valid_until_unix_s"),
    ("no deadline", "autoscaler", _scaling(meta=meta(5, ttl_s=-T0)), "meta.valid_until_unix_s"),
    ("shed above 1", "router", _routing(admission=[
        pb.ClassAdmission(priority_class="standard"),
        pb.ClassAdmission(priority_class="sheddable", shed_fraction=1.5)]), "admission[1].shed_fraction: 1.5"),
    ("shed below 0", "router", _routing(admission=[pb.ClassAdmission(priority_class="standard", shed_fraction=-0.1)]),
     "admission[0].shed_fraction"),
    ("unknown class", "router", _routing(admission=[pb.ClassAdmission(priority_class="gold")]),
     "admission[0].priority_class"),
    ("queue budget", "router", _routing(admission=[pb.ClassAdmission(priority_class="critical", queue_budget=-2)]),
     "admission[0].queue_budget"),
    ("nan rate", "router", _routing(admission=[pb.ClassAdmission(priority_class="critical",
                                                                 rate_limit_rps=float("nan"))]),
     "admission[0].rate_limit_rps"),
    ("negative weight", "router", _routing(pools=[pb.PoolRouting(pool="big", traffic_weight=-1)]),
     "pools[0].traffic_weight"),
    ("inf weight", "router", _routing(pools=[pb.PoolRouting(pool="big", traffic_weight=float("inf"))]),
     "pools[0].traffic_weight"),
    ("negative cap", "router", _routing(pools=[pb.PoolRouting(pool="big", inflight_cap=-3)]), "pools[0].inflight_cap"),
    ("negative scorer", "router", _routing(pools=[
        pb.PoolRouting(pool="small", traffic_weight=1),
        pb.PoolRouting(pool="big", weights=pb.ScorerWeights(prefix=1, queue=-2))]), "pools[1].weights.queue"),
    ("unknown routed pool", "router", _routing(pools=[pb.PoolRouting(pool="huge")]), "pools[0].pool: unknown"),
]


@pytest.mark.parametrize("label,service,command,needle", INVALID_CASES, ids=[c[0] for c in INVALID_CASES])
def test_invalid_command_is_rejected_whole(rig, label, service, command, needle):
    # a valid generation-1 command first, so we can see the applied generation is kept
    if service == "autoscaler":
        assert rig.autoscaler.ApplyScalingPlan(plan(1, big=3)).status == pb.ACK_STATUS_APPLIED
        apply = rig.autoscaler.ApplyScalingPlan
    else:
        assert rig.router.ApplyRoutingPolicy(routing(1)).status == pb.ACK_STATUS_APPLIED
        apply = rig.router.ApplyRoutingPolicy
    before = list(rig.fleet.calls)
    ack = apply(command)
    assert ack.status == pb.ACK_STATUS_INVALID, label
    assert needle in ack.message, ack.message
    assert ack.applied_generation == 1
    assert rig.fleet.calls == before  # nothing applied, not even the valid part


def test_fleet_rejection_midway_rolls_back(rig):
    assert rig.autoscaler.ApplyScalingPlan(plan(1, big=3, small=4)).status == pb.ACK_STATUS_APPLIED
    rig.fleet.reject_pool = "small"
    ack = rig.autoscaler.ApplyScalingPlan(plan(2, big=5, small=6))
    assert ack.status == pb.ACK_STATUS_INVALID and "rejected by the fleet" in ack.message
    assert ack.applied_generation == 1
    assert rig.fleet.targets == {"big": 3, "small": 4}  # big's change was undone
    assert rig.autoscaler.GetFleetState(pb.GetFleetStateRequest()).applied_generation == 1


def test_deadline_fallback_resets_to_defaults(rig):
    assert rig.autoscaler.ApplyScalingPlan(plan(1, ttl_s=30, big=6)).status == pb.ACK_STATUS_APPLIED
    rig.clock.advance(29)
    state = rig.autoscaler.GetFleetState(pb.GetFleetStateRequest())
    assert not state.fallback_active and rig.fleet.resets == 0
    rig.clock.advance(2)  # past valid_until
    state = rig.autoscaler.GetFleetState(pb.GetFleetStateRequest())
    assert state.fallback_active and rig.fleet.resets == 1
    assert {p.pool: p.target_replicas for p in state.pools} == {"big": 2, "small": 3}  # scenario defaults
    assert state.applied_generation == 1
    # a replay of the expired command changes nothing; a newer one ends the fallback
    assert rig.autoscaler.ApplyScalingPlan(plan(1, ttl_s=30, big=6)).status == pb.ACK_STATUS_REPLAY
    assert rig.fleet.resets == 1
    assert rig.autoscaler.ApplyScalingPlan(plan(2, ttl_s=100, big=5)).status == pb.ACK_STATUS_APPLIED
    state = rig.autoscaler.GetFleetState(pb.GetFleetStateRequest())
    assert not state.fallback_active and state.applied_generation == 2
    assert {p.pool: p.target_replicas for p in state.pools}["big"] == 5


def test_router_expiry_keeps_a_live_scaling_plan(rig):
    assert rig.autoscaler.ApplyScalingPlan(plan(1, ttl_s=100, big=6)).status == pb.ACK_STATUS_APPLIED
    assert rig.router.ApplyRoutingPolicy(routing(1, ttl_s=10, shed=0.4)).status == pb.ACK_STATUS_APPLIED
    rig.clock.advance(11)
    n_before = len(rig.fleet.calls)
    assert rig.plane.check_deadlines() == ["router"]
    assert rig.fleet.resets == 0  # the scaling plan is still valid: only the router settings go back
    assert rig.fleet.targets["big"] == 6
    reapplied = rig.fleet.calls[n_before:]
    assert ("admission", "sheddable", {"rate_limit_rps": 10.0, "queue_budget": 50, "shed_frac": 0.0}) in reapplied
    assert ("routing", "small", {"traffic_weight": 0.5, "inflight_cap": 0, "prefix_weight": 3.0,
                                 "queue_weight": 2.0, "kv_weight": 2.0}) in reapplied
    assert not any(c[0] == "target" for c in reapplied)
    got = rig.router.GetRoutingPolicy(pb.GetRoutingPolicyRequest())
    shed = next(a for a in got.admission if a.priority_class == "sheddable")
    assert (shed.rate_limit_rps, shed.queue_budget, shed.shed_fraction) == (10.0, 50, 0.0)  # scenario's
    assert got.meta.valid_until_unix_s < rig.clock.now_s()  # the last command, now expired
    assert rig.autoscaler.GetFleetState(pb.GetFleetStateRequest()).fallback_active
    assert rig.plane.check_deadlines() == []  # an expired command falls back once


def test_health_service_serving(rig):
    for ep, svc in ((rig.router_ep, "governor.v1.RouterControl"), (rig.autoscaler_ep, "governor.v1.AutoscalerControl")):
        with grpc.insecure_channel(ep.address) as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            for name in ("", svc):
                # the stubs declare no RPCs on HealthStub
                resp = stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)  # type: ignore[attr-defined]
                assert resp.status == health_pb2.HealthCheckResponse.SERVING


# --------------------------------------------------------------------------- with the real Fleet

STARTUP_S = 10.0  # simulated; 0.5 s of wall time at 20×


def http_get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read().decode()


def sd_targets(live_info: dict, kind: str) -> dict[str, str]:
    """replica/node id → address, from the live /sd document."""
    key = {"vllm": "replica", "dcgm": "node"}[kind]
    return {g["labels"][key]: g["targets"][0] for g in json.loads(http_get(live_info["discovery"]))
            if g["labels"]["kind"] == kind}


@pytest.fixture
def live(tmp_path):
    fleet = LiveFleet(write_scenario(tmp_path, n=400, rps=5.0, startup_s=STARTUP_S), speed=20.0, seed=1)
    info = fleet.start()
    yield fleet, info
    fleet.stop()


def test_live_fleet_serves_metrics_and_discovery(live):
    fleet, info = live
    assert [r["pool"] for r in info["replicas"]] == ["small"]
    assert info["nodes"] and info["router_control"].startswith("127.0.0.1:")
    sd = json.loads(http_get(info["discovery"]))
    kinds = sorted(g["labels"]["kind"] for g in sd)
    assert kinds == sorted(["vllm", "router"] + ["dcgm"] * len(info["nodes"]))
    vllm = next(g for g in sd if g["labels"]["kind"] == "vllm")
    assert vllm["labels"]["pool"] == "small" and vllm["labels"]["replica"] == info["replicas"][0]["id"]
    assert info["replicas"][0]["metrics"] == f"http://{vllm['targets'][0]}/metrics"
    assert all(g["labels"]["pool"] == "small" for g in sd if g["labels"]["kind"] == "dcgm")

    def served_tokens() -> float:
        fams = {f.name: f for f in text_string_to_metric_families(http_get(info["replicas"][0]["metrics"]))}
        return fams["vllm:prompt_tokens"].samples[0].value

    assert wait_until(lambda: served_tokens() > 0, 15, what="prompt tokens on the replica's /metrics")
    node_fams = {f.name for f in text_string_to_metric_families(http_get(info["nodes"][0]["metrics"]))}
    assert {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"} <= node_fams
    router_fams = {f.name for f in text_string_to_metric_families(http_get(info["router_metrics"]))}
    assert "llm_d_epp_request" in router_fams
    assert fleet.error is None


def test_scale_up_through_grpc_adds_an_endpoint_after_startup(live):
    fleet, info = live
    first = set(sd_targets(info, "vllm"))
    assert len(first) == 1
    with grpc.insecure_channel(info["autoscaler_control"]) as ch:
        stub = pb_grpc.AutoscalerControlStub(ch)
        t_before = fleet.now_s()
        ack = stub.ApplyScalingPlan(pb.ScalingPlan(
            meta=pb.CommandMeta(decision_id="d-up", generation=1, valid_until_unix_s=time.time() + 300),
            pools=[pb.PoolScaling(pool="small", replicas=2)]), timeout=5)
        assert ack.status == pb.ACK_STATUS_APPLIED
        state = stub.GetFleetState(pb.GetFleetStateRequest(), timeout=5)
        assert state.pools[0].target_replicas == 2

        targets = wait_until(lambda: len(t := sd_targets(info, "vllm")) == 2 and t, 20,
                             what="a second vllm target in /sd")
        assert fleet.now_s() >= t_before + STARTUP_S  # not before its start-up delay
        (new_id,) = set(targets) - first
        text = http_get(f"http://{targets[new_id]}/metrics")
        assert "vllm:num_requests_running" in text
        assert any(r["id"] == new_id for r in fleet.listening()["replicas"])
        phases = {r.id: r.phase for r in stub.GetFleetState(pb.GetFleetStateRequest(), timeout=5).replicas}
        assert phases[new_id] == "ready"

        # scale back down: one endpoint goes away once its replica has drained
        ack = stub.ApplyScalingPlan(pb.ScalingPlan(
            meta=pb.CommandMeta(decision_id="d-down", generation=2, valid_until_unix_s=time.time() + 300),
            pools=[pb.PoolScaling(pool="small", replicas=1)]), timeout=5)
        assert ack.status == pb.ACK_STATUS_APPLIED
        remaining = wait_until(lambda: len(t := sd_targets(info, "vllm")) == 1 and t, 30,
                               what="one vllm target left after scale-down")
        (gone,) = set(targets) - set(remaining)
        with pytest.raises(OSError):
            http_get(f"http://{targets[gone]}/metrics")
    assert fleet.error is None


def test_live_deadline_fallback(live):
    fleet, info = live
    with grpc.insecure_channel(info["autoscaler_control"]) as ch:
        stub = pb_grpc.AutoscalerControlStub(ch)
        ack = stub.ApplyScalingPlan(pb.ScalingPlan(
            meta=pb.CommandMeta(decision_id="d-short", generation=1, valid_until_unix_s=time.time() + 0.5),
            pools=[pb.PoolScaling(pool="small", replicas=3)]), timeout=5)
        assert ack.status == pb.ACK_STATUS_APPLIED
        state = wait_until(lambda: (s := stub.GetFleetState(pb.GetFleetStateRequest(), timeout=5)).fallback_active
                           and s, 10, what="fallback after the deadline")
        assert state.pools[0].target_replicas == 1  # the scenario's replicas
        assert state.applied_generation == 1


def test_step_awareness_over_router_control_and_back_to_the_scenarios_at_expiry(rig):
    msg = routing(1, ttl_s=10)
    msg.step_aware = True
    msg.tenants.add(tenant="acme", max_inflight=2, weight=1.0)  # validated; the simulated router has no tenants
    assert rig.router.ApplyRoutingPolicy(msg).status == pb.ACK_STATUS_APPLIED
    assert rig.fleet.step_aware is True and rig.router.GetRoutingPolicy(pb.GetRoutingPolicyRequest()).step_aware
    bad = routing(2)
    bad.tenants.add(tenant="acme", weight=0.0)
    ack = rig.router.ApplyRoutingPolicy(bad)
    assert ack.status == pb.ACK_STATUS_INVALID and "tenants[0].weight" in ack.message
    rig.clock.advance(11)
    assert rig.plane.check_deadlines() == ["router"]
    assert rig.fleet.step_aware is None  # the scenario's own again
    assert rig.router.GetRoutingPolicy(pb.GetRoutingPolicyRequest()).step_aware is False
