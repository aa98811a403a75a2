"""llm-d stack: scorer weights, WVA saturation scaling, GAIE flow control, on constructed telemetry."""

from __future__ import annotations

import pytest

from controller.policies import SCORER_DEFAULT, build_policy
from controller.policies.llm_d_stack import LlmdStackPolicy
from tests.policies.builders import codes, decide, drive, fleet, inp, spec

FL = fleet(spec("p"))
TWO = fleet(spec("cheap", usd_per_replica_hour=5.0), spec("dear", sku="h100-80gb", usd_per_replica_hour=12.0))


def row(ready=4, kv=0.3, waiting=0, running=20, starting=0, **kw):
    return dict(ready=ready, kv=kv, waiting=waiting, running=running, starting=starting, **kw)


def test_routing_is_llm_d_default_profile_and_single_pool_keeps_weight_one():
    pol = LlmdStackPolicy()
    _, out = decide(pol, pol.initial_state(), inp(0.0, {"p": row()}, fl=FL, current={"p": 4}))
    d = out.pools["p"]
    assert (d.prefix_weight, d.queue_weight, d.kv_weight) == (3.0, 2.0, 2.0) == tuple(SCORER_DEFAULT.as_dict().values())
    assert d.traffic_weight == 1.0 and d.inflight_cap == 0 and out.admission == {}


def test_low_spare_kv_scales_up_by_one():
    # KV 0.75 → spare 0.05 < trigger 0.1 (queue fine): WVA adds one replica to the ready count
    pol = LlmdStackPolicy()
    _, out = decide(pol, pol.initial_state(), inp(0.0, {"p": row(kv=0.75)}, fl=FL, current={"p": 4}))
    assert out.pools["p"].replicas == 5
    assert "scale_up" in codes(out)


def test_low_spare_queue_scales_up_and_saturated_counts_as_no_spare():
    pol = LlmdStackPolicy()
    # 2.5 waiting per replica → spare 2.5 < 3
    _, out = decide(pol, pol.initial_state(), inp(0.0, {"p": row(waiting=10)}, fl=FL, current={"p": 4}))
    assert out.pools["p"].replicas == 5
    # every replica saturated (KV 0.9 ≥ 0.8): no non-saturated replica, still +1, not more
    _, out = decide(pol, pol.initial_state(), inp(0.0, {"p": row(kv=0.9)}, fl=FL, current={"p": 4}))
    assert out.pools["p"].replicas == 5


def test_uses_the_peak_of_the_last_minute_and_evaluates_once_a_minute():
    pol = LlmdStackPolicy()
    steps = [(0.0, {"p": row(kv=0.5)}), (15.0, {"p": row(kv=0.75)}), (30.0, {"p": row(kv=0.3)}),
             (45.0, {"p": row(kv=0.3)}), (60.0, {"p": row(kv=0.3)})]
    outs = drive(pol, FL, steps, start={"p": 4})
    # t=0: spare 0.3 → at 4, and KV 0.5 spread over 3 → 0.67, spare 0.13 ≥ 0.1: the scale-down is safe
    assert outs[0].pools["p"].replicas == 3
    # 15-45 s: not due; at 60 s the minute's peak (0.75 at 15 s) is what counts → +1 on the 4 ready
    assert [o.pools["p"].replicas for o in outs[1:4]] == [3, 3, 3]
    assert outs[4].pools["p"].replicas == 5


def test_scale_down_only_when_one_fewer_keeps_spare():
    pol = LlmdStackPolicy()
    # 4 ready at KV 0.5: without one, 2.0 / 3 = 0.667 → spare 0.133 ≥ 0.1, queue 0 → safe: −1
    _, out = decide(pol, pol.initial_state(), inp(0.0, {"p": row(kv=0.5)}, fl=FL, current={"p": 4}))
    assert out.pools["p"].replicas == 3
    # at KV 0.6: 2.4 / 3 = 0.8 → spare 0 < 0.1: hold
    _, out = decide(pol, pol.initial_state(), inp(0.0, {"p": row(kv=0.6)}, fl=FL, current={"p": 4}))
    assert out.pools["p"].replicas == 4
    # one ready replica: fewer than 2 non-saturated → never scale down
    _, out = decide(pol, pol.initial_state(), inp(0.0, {"p": row(ready=1, kv=0.0)}, fl=FL, current={"p": 1}))
    assert out.pools["p"].replicas == 1


def test_cheapest_variant_grows_most_expensive_shrinks():
    pol = LlmdStackPolicy()
    busy = {"cheap": row(ready=2, kv=0.78), "dear": row(ready=2, kv=0.78)}
    _, out = decide(pol, pol.initial_state(), inp(0.0, busy, fl=TWO, current={"cheap": 2, "dear": 2}))
    assert (out.pools["cheap"].replicas, out.pools["dear"].replicas) == (3, 2)
    idle = {"cheap": row(ready=2, kv=0.1), "dear": row(ready=2, kv=0.1)}
    _, out = decide(pol, pol.initial_state(), inp(0.0, idle, fl=TWO, current={"cheap": 2, "dear": 2}))
    assert (out.pools["cheap"].replicas, out.pools["dear"].replicas) == (2, 1)
    # pod-level picking: traffic follows the ready replicas (2 and 2 → equal shares), times the profiled
    # per-replica throughput when the bench gives one
    assert out.pools["cheap"].traffic_weight == out.pools["dear"].traffic_weight == 0.5
    pol = LlmdStackPolicy(capacity={"cheap": {"rps": 2.0}, "dear": {"rps": 6.0}})
    _, out = decide(pol, pol.initial_state(), inp(0.0, idle, fl=TWO, current={"cheap": 2, "dear": 2}))
    assert out.pools["dear"].traffic_weight == pytest.approx(0.75)


def test_no_further_scale_up_while_replicas_start():
    pol = LlmdStackPolicy()
    _, out = decide(pol, pol.initial_state(), inp(0.0, {"p": row(kv=0.9, starting=1)}, fl=FL, current={"p": 5}))
    assert out.pools["p"].replicas == 5
    assert "scale_up_pending_startup" in codes(out, None)


def test_missing_reading_holds_and_blocks_scale_down():
    pol = LlmdStackPolicy()
    _, out = decide(pol, pol.initial_state(), inp(0.0, {"p": dict(ready=4, waiting=0)}, fl=FL, current={"p": 4}))
    assert out.pools["p"].replicas == 4 and "missing_data_hold" in codes(out)


def test_sheddable_shed_and_router_queueing_only_under_saturation():
    pol = LlmdStackPolicy()
    # not saturated: KV 0.7 and 1 waiting per replica → every class admitted, no cap
    s, out = decide(pol, pol.initial_state(), inp(0.0, {"p": row(kv=0.7, waiting=4)}, fl=FL, current={"p": 4}))
    assert out.admission == {} and out.pools["p"].inflight_cap == 0
    # saturated on queue (6 waiting per replica ≥ 5): sheddable rejected, the rest held at the router
    # beyond what runs (100 / 4 = 25 per replica) + the detector's queue threshold 5
    s, out = decide(pol, s, inp(15.0, {"p": row(kv=0.7, waiting=24, running=100)}, fl=FL, current={"p": 4}))
    assert out.admission["sheddable"].shed_frac == 1.0
    assert set(out.admission) == {"sheddable"}
    assert out.pools["p"].inflight_cap == 30
    assert "shed_sheddable" in codes(out, None)
    # saturated on KV alone
    _, out2 = decide(pol, pol.initial_state(), inp(0.0, {"p": row(kv=0.85)}, fl=FL, current={"p": 4}))
    assert out2.admission["sheddable"].shed_frac == 1.0
    # back below both thresholds: released
    _, out = decide(pol, s, inp(30.0, {"p": row(kv=0.5, waiting=0)}, fl=FL, current={"p": 4}))
    assert out.admission == {} and out.pools["p"].inflight_cap == 0 and "shed_release" in codes(out, None)


def test_group_is_saturated_only_when_no_pool_has_capacity():
    pol = LlmdStackPolicy()
    one_free = {"cheap": row(ready=2, kv=0.9), "dear": row(ready=2, kv=0.2)}
    _, out = decide(pol, pol.initial_state(), inp(0.0, one_free, fl=TWO, current={"cheap": 2, "dear": 2}))
    assert out.admission == {}
    # stale metrics count as no capacity (GAIE): both pools without a KV reading → saturated
    blind = {"cheap": dict(ready=2, waiting=0), "dear": dict(ready=2, waiting=0)}
    _, out = decide(pol, pol.initial_state(), inp(0.0, blind, fl=TWO, current={"cheap": 2, "dear": 2}))
    assert out.admission["sheddable"].shed_frac == 1.0


def test_builds_from_the_registry_and_refuses_inverted_thresholds():
    assert build_policy("llm-d-stack", FL, {}).name == "llm-d-stack"
    with pytest.raises(ValueError, match="spare triggers must be below"):
        build_policy("llm-d-stack", FL, {"kv_spare_trigger": 0.9})
