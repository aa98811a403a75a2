"""GrpcActuator against a fake fleet on real loopback gRPC: mapping, generations, retries, deadlines, acks."""

from __future__ import annotations

import pytest

from controller.actuation.grpc_actuator import GrpcActuator
from controller.actuation.outcome import combine_status
from controller.clock import VirtualClock
from controller.gen.governor.v1 import control_pb2
from controller.types import ClassAdmission, Decision, PoolDecision
from tests.fakes.act_fleet import FakeFleetServer
from tests.fixtures.prometheus import free_port

T0 = 1_700_000_000.0


def decision(generation: int, *, decision_id: str | None = None, replicas: int = 3, pools=("a", "b"),
             valid_for_s: float = 120.0, admission=None) -> Decision:
    return Decision(
        decision_id=decision_id or f"d-{generation:08d}",
        generation=generation,
        at_s=T0,
        valid_until_s=T0 + valid_for_s,
        pools={p: PoolDecision(replicas=replicas + i, warm_standby=1, inflight_cap=8 + i, traffic_weight=0.5,
                               prefix_weight=4.0, queue_weight=1.5, kv_weight=0.5, max_num_seqs=128)
               for i, p in enumerate(pools)},
        admission=admission or {},
    )


@pytest.fixture
def fleet():
    with FakeFleetServer(pools={"a", "b"}) as f:
        yield f


def make(fleet_address: str | None, clock: VirtualClock | None = None, *, autoscaler: str | None = "same",
         **kw) -> GrpcActuator:
    return GrpcActuator(fleet_address, fleet_address if autoscaler == "same" else autoscaler,
                        clock=clock or VirtualClock(T0), issuer="governor/test", **kw)


def test_decision_is_mapped_field_by_field(fleet):
    act = make(fleet.address)
    d = decision(1, admission={"sheddable": ClassAdmission(rate_limit_rps=5.0, queue_budget=10, shed_frac=0.25)})
    out = act.apply(d)
    act.close()

    assert out.status == "applied" and out.ok
    assert (out.decision_id, out.generation, out.attempts) == ("d-00000001", 1, 2)
    [rp] = fleet.router.calls
    [sp] = fleet.autoscaler.calls
    for meta in (rp.meta, sp.meta):
        assert meta.decision_id == "d-00000001"
        assert meta.generation == 1
        # the validity deadline travels with the command
        assert meta.valid_until_unix_s == d.valid_until_s == T0 + 120.0
        assert meta.issuer == "governor/test"
    assert [(p.pool, p.traffic_weight, p.inflight_cap, p.weights.prefix, p.weights.queue, p.weights.kv_usage)
            for p in rp.pools] == [("a", 0.5, 8, 4.0, 1.5, 0.5), ("b", 0.5, 9, 4.0, 1.5, 0.5)]
    # every class is sent, the ones without a decision at their defaults (unlimited, no shedding)
    assert [(a.priority_class, a.rate_limit_rps, a.queue_budget, a.shed_fraction) for a in rp.admission] == [
        ("critical", 0.0, -1, 0.0), ("standard", 0.0, -1, 0.0), ("sheddable", 5.0, 10, 0.25)]
    assert [(p.pool, p.replicas, p.warm_standby, p.max_num_seqs, p.max_num_batched_tokens) for p in sp.pools] == [
        ("a", 3, 1, 128, 0), ("b", 4, 1, 128, 0)]


# label, decision sent after generations 1 and 2 were applied, expected status
ORDERING = [
    ("newer generation", decision(3), "applied"),
    ("exact replay", decision(2), "replay"),
    ("older generation", decision(1), "stale"),
    ("same generation, other decision", decision(2, decision_id="d-other"), "stale"),
]


@pytest.mark.parametrize("label,sent,expected", ORDERING, ids=[r[0] for r in ORDERING])
def test_generation_ordering_and_idempotent_replay(fleet, label, sent, expected):
    act = make(fleet.address)
    assert act.apply(decision(1)).status == "applied"
    assert act.apply(decision(2)).status == "applied"
    out = act.apply(sent)
    act.close()
    assert out.status == expected, out.detail
    assert [t.attempts for t in out.targets.values()] == [1, 1]  # acks are final: never retried
    assert fleet.router.gate.applied_generation == max(2, sent.generation if expected == "applied" else 2)
    assert fleet.autoscaler.gate.applied_generation == fleet.router.gate.applied_generation


@pytest.mark.parametrize("retries", [0, 1, 3])
def test_peer_down_retries_with_backoff_then_one_failed_outcome(retries):
    clock = VirtualClock(T0)
    act = make(f"127.0.0.1:{free_port()}", clock, retries=retries, backoff_s=0.2, call_timeout_s=1.0)
    out = act.apply(decision(1))
    ok, detail = act.health()
    act.close()

    assert out.status == "failed" and not out.ok
    assert [t.attempts for t in out.targets.values()] == [retries + 1, retries + 1]
    assert out.attempts == 2 * (retries + 1)
    assert {t.code for t in out.targets.values()} == {"UNAVAILABLE"}
    # backoff 0.2 * 2**k waited through the virtual clock: 0, 0.2, 0.6, 1.4 s; the two targets are sent side
    # by side, so the apply takes one target's waits, not the sum
    waited = sum(0.2 * 2 ** k for k in range(retries))
    assert clock.now_s() - T0 == pytest.approx(waited)
    assert out.duration_s == pytest.approx(waited)
    assert not ok and "UNAVAILABLE" in detail


def test_unavailable_twice_then_applied(fleet):
    fleet.router.gate.faults.extend(["unavailable", "unavailable"])
    clock = VirtualClock(T0)
    out = make(fleet.address, clock, retries=3, backoff_s=0.5).apply(decision(1))
    assert out.status == "applied"
    assert [t.attempts for t in out.targets.values()] == [3, 1]
    assert len(fleet.router.calls) == 3
    assert clock.now_s() - T0 == pytest.approx(0.5 + 1.0)


def test_call_deadline_hit_is_retried_and_the_replay_counts_as_applied(fleet):
    fleet.router.gate.faults.append("hang")  # applies, then withholds the answer past the call deadline
    out = make(fleet.address, retries=2, call_timeout_s=0.5).apply(decision(1))
    fleet.router.gate.release.set()
    router = out.target("router")
    assert router is not None
    assert router.attempts == 2
    assert router.status == "applied"
    assert "earlier attempt" in router.detail
    assert len(fleet.router.calls) == 2
    assert out.status == "applied"


def test_invalid_ack_is_not_retried(fleet):
    out = make(fleet.address, retries=3).apply(decision(1, pools=("a", "unknown-pool")))
    assert out.status == "invalid"
    assert [(t.status, t.attempts) for t in out.targets.values()] == [("invalid", 1), ("invalid", 1)]
    assert "unknown pool" in out.detail
    assert fleet.total_calls == 2
    assert fleet.router.gate.applied_generation == 0


def test_retries_stop_at_the_validity_deadline():
    clock = VirtualClock(T0)
    # valid 0.5 s: attempt at +0, wait 0.2, attempt at +0.2, wait 0.4 → +0.6 is past the deadline
    out = make(f"127.0.0.1:{free_port()}", clock, retries=5, backoff_s=0.2).apply(decision(1, valid_for_s=0.5))
    router, autoscaler = out.targets.values()
    assert (router.status, router.attempts, router.code) == ("failed", 2, "UNAVAILABLE")
    assert "validity deadline" in router.detail
    # sent side by side with the router (the same dead address): the same two attempts, not what is left after it
    assert (autoscaler.status, autoscaler.attempts, autoscaler.code) == ("failed", 2, "UNAVAILABLE")
    assert out.status == "failed"


def test_fleet_state_and_health(fleet):
    act = make(fleet.address)
    assert act.health()[0] is True  # nothing sent yet: healthy
    act.apply(decision(4, replicas=2))
    state = act.fleet_state()
    ok, detail = act.health()
    act.close()
    assert state is not None
    assert (state.applied_generation, state.applied_decision_id, state.fallback_active) == (4, "d-00000004", False)
    assert {p: (s.target_replicas, s.standby) for p, s in state.pools.items()} == {"a": (2, 1), "b": (3, 1)}
    assert ok and "applied generation 4" in detail


def test_missing_targets_are_skipped_and_fleet_state_unknown(fleet):
    only_router = make(fleet.address, autoscaler=None)
    out = only_router.apply(decision(1))
    assert (out.status, [t.status for t in out.targets.values()]) == ("applied", ["applied", "skipped"])
    assert list(out.targets) == ["router", "autoscaler"]
    assert {name: str(r) for name, r in out.targets.items()} == {"router": "applied", "autoscaler": "skipped"}
    assert only_router.fleet_state() is None
    nothing = GrpcActuator(None, None, clock=VirtualClock(T0))
    assert nothing.apply(decision(2)).status == "skipped"
    assert nothing.health()[0] is False
    assert len(fleet.autoscaler.calls) == 0


def test_fleet_state_is_none_when_the_autoscaler_is_down():
    act = make(f"127.0.0.1:{free_port()}", call_timeout_s=0.5)
    assert act.fleet_state() is None


def test_replica_count_outside_int32_is_invalid_without_a_call(fleet):
    out = make(fleet.address).apply(decision(1, replicas=2**31))
    autoscaler = out.target("autoscaler")
    assert autoscaler is not None
    assert autoscaler.status == "invalid"
    assert autoscaler.attempts == 0
    assert len(fleet.autoscaler.calls) == 0


@pytest.mark.parametrize("statuses,expected", [
    (("applied", "replay"), "applied"),
    (("replay", "replay"), "replay"),
    (("applied", "failed"), "failed"),
    (("stale", "invalid"), "invalid"),
    (("skipped", "replay"), "replay"),
    (("skipped", "skipped"), "skipped"),
])
def test_combine_status_takes_the_worst(statuses, expected):
    assert combine_status(statuses) == expected


def test_unknown_ack_status_is_a_failure():
    ack = control_pb2.Ack(status=control_pb2.ACK_STATUS_UNSPECIFIED, message="?")
    r = GrpcActuator._from_ack("router", ack, 1, retried=False)
    assert (r.status, r.code) == ("failed", "UNKNOWN_ACK")
