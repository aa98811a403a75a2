"""AIBrix stack: prefix-cache routing weights, KPA/APA on KV usage, the GPU optimizer's SKU mix."""

from __future__ import annotations

import pytest

from controller.policies import ReplicaCapacity, build_policy
from controller.policies.aibrix_stack import AIBRIX_PREFIX_CACHE, AibrixStackPolicy, optimal_mix
from controller.policies.scorer_kpa import ScorerKpaPolicy
from tests.policies.builders import codes, decide, drive, fleet, inp, spec

FL = fleet(spec("p"))
MIX = fleet(spec("a100", usd_per_replica_hour=5.12, max_replicas=8),
            spec("h100", sku="h100-80gb", usd_per_replica_hour=12.29, max_replicas=8))
CAP = {"a100": ReplicaCapacity(rps=3.0), "h100": ReplicaCapacity(rps=6.5)}


def test_prefix_cache_weights_break_even_at_a_half_match_on_the_busiest_replica():
    w = AIBRIX_PREFIX_CACHE
    # a 50 % hit on the busiest replica ties an idle replica without a hit (AIBrix's 50 % threshold)
    assert w.prefix_weight * 0.5 - w.queue_weight * 1.0 == pytest.approx(0.0)
    assert w.prefix_weight * 0.6 - w.queue_weight > 0 > w.prefix_weight * 0.4 - w.queue_weight
    pol = AibrixStackPolicy()
    _, out = decide(pol, pol.initial_state(), inp(0.0, {"p": dict(ready=2, kv=0.3)}, fl=FL, current={"p": 2}))
    assert (out.pools["p"].prefix_weight, out.pools["p"].queue_weight, out.pools["p"].kv_weight) == (2.0, 1.0, 0.0)


def test_kpa_layer_is_scorer_kpas_decider_with_aibrix_defaults():
    # single pool: the stack's replica decisions equal scorer-kpa's on the same inputs
    steps = [(15.0 * k, {"p": dict(ready=4, kv=0.3 + 0.08 * k)}) for k in range(10)]
    ours = [o.pools["p"].replicas for o in drive(AibrixStackPolicy(), FL, steps, start={"p": 4})]
    ref = [o.pools["p"].replicas for o in drive(ScorerKpaPolicy(), FL, steps, start={"p": 4})]
    assert ours == ref
    assert max(ours) > 4  # KV usage climbing past the 0.5 target scales up


def test_apa_has_no_panic_and_its_own_tolerances():
    apa = AibrixStackPolicy(autoscaler="apa")
    p = apa.inner.params
    assert (p.stable_window_s, p.panic_window_s, p.up_tolerance, p.down_tolerance) == (60.0, 60.0, 0.1, 0.2)
    # KV 1.0 everywhere: desired/ready = 2 with target 0.5 — below the panic threshold
    steps = [(15.0 * k, {"p": dict(ready=4, kv=1.0)}) for k in range(3)]
    outs = drive(apa, FL, steps, start={"p": 4})
    assert not any("panic_enter" in codes(o) for o in outs)
    # down tolerance 0.2: KV 0.42 is ratio 0.84, inside the band → no scale-down
    steps = [(15.0 * k, {"p": dict(ready=4, kv=0.42)}) for k in range(3)]
    assert [o.pools["p"].replicas for o in drive(apa, FL, steps, start={"p": 4})] == [4, 4, 4]


def test_optimal_mix_is_the_cheapest_cover():
    table = [("a", 5.12, 3.0, 1, 8), ("h", 12.29, 6.5, 1, 8)]
    assert optimal_mix(table, 20.0) == {"a": 5, "h": 1}
    # beyond what the A100s can carry, the H100s come in: 8 × 3 + 1 × 6.5 = 30.5 < 40
    mix = optimal_mix(table, 40.0)
    assert 3.0 * mix["a"] + 6.5 * mix["h"] >= 40.0
    cost = 5.12 * mix["a"] + 12.29 * mix["h"]
    assert all(5.12 * a + 12.29 * h >= cost - 1e-9 for a in range(1, 9) for h in range(1, 9)
               if 3.0 * a + 6.5 * h >= 40.0)
    # infeasible: everything at its max
    assert optimal_mix(table, 1000.0) == {"a": 8, "h": 8}
    # cheaper H100 per throughput → it is preferred
    assert optimal_mix([("a", 5.12, 3.0, 0, 8), ("h", 8.0, 6.5, 0, 8)], 13.0) == {"a": 0, "h": 2}


def test_optimizer_sets_the_mix_through_the_kpa_and_traffic_follows_capacity():
    pol = build_policy("aibrix-stack", MIX, {"capacity": CAP})
    obs = {"a100": dict(ready=2, kv=0.4, rps=10.0), "h100": dict(ready=2, kv=0.4, rps=10.0)}
    s, out = decide(pol, pol.initial_state(), inp(0.0, obs, fl=MIX, current={"a100": 2, "h100": 2}))
    # 20 req/s → recommendation 5 × A100 + 1 × H100; the KPA (target 1 per replica) starts in panic at 2 ready,
    # its scale-up rate 2 allows at most 4 from 2 ready; the H100 pool is held by panic mode at 2
    assert "sku_mix" in codes(out, None)
    assert out.diagnostics["optimizer"]["default"]["recommendation"] == {"a100": 5, "h100": 1}
    assert out.pools["a100"].replicas == 4 and out.pools["h100"].replicas == 2
    # traffic: ready × profiled throughput, 2 × 3 against 2 × 6.5
    assert out.pools["a100"].traffic_weight == pytest.approx(6 / 19)
    obs = {"a100": dict(ready=4, kv=0.4, rps=10.0), "h100": dict(ready=2, kv=0.4, rps=10.0)}
    _, out = decide(pol, s, inp(15.0, obs, fl=MIX, current={"a100": 4, "h100": 2}))
    assert out.pools["a100"].replicas == 5
    assert out.pools["a100"].traffic_weight == pytest.approx(12 / 25)


def test_pool_without_profile_or_alone_is_left_to_the_kpa():
    pol = build_policy("aibrix-stack", MIX, {"capacity": {"a100": CAP["a100"]}})
    obs = {"a100": dict(ready=2, kv=0.4, rps=10.0), "h100": dict(ready=2, kv=0.4, rps=10.0)}
    _, out = decide(pol, pol.initial_state(), inp(0.0, obs, fl=MIX, current={"a100": 2, "h100": 2}))
    assert out.diagnostics["optimizer"] == {} and "sku_mix" not in codes(out, None)


def test_registry_refuses_capacity_for_unknown_pools():
    with pytest.raises(ValueError, match=r"unknown pool\(s\) \['x'\]"):
        build_policy("aibrix-stack", MIX, {"capacity": {"x": {"rps": 1.0}}})
    with pytest.raises(ValueError, match="autoscaler must be one of"):
        build_policy("aibrix-stack", MIX, {"autoscaler": "hpa"})
