"""HPA: worked examples from the Kubernetes documentation and controller, one row per case."""

from __future__ import annotations

import pytest

from controller.policies.hpa import HpaPolicy, calc_replicas
from tests.policies.builders import codes, decide, drive, fleet, inp, spec

# label, policy kwargs, current, pool signals, max replicas, expected replicas, expected reason codes (subset)
SYNC_ROWS = [
    ("4 replicas at 90% vs target 50% → 8 (docs example)",
     dict(target=0.5), 4, dict(ready=4, starting=0, gpu=0.9), 64, 8, {"scale_up"}),
    ("within 10% tolerance → unchanged", dict(target=0.5), 4, dict(ready=4, starting=0, gpu=0.52), 64, 4, set()),
    ("just outside tolerance (1.12) → ceil(4.48) = 5", dict(target=0.5), 4, dict(ready=4, starting=0, gpu=0.56), 64, 5,
     {"scale_up"}),
    ("scale-up rate: 2 → at most 6 in one 15 s period (4 pods > 100%)",
     dict(target=0.1), 2, dict(ready=2, starting=0, gpu=1.0), 64, 6, {"scale_up", "scale_up_limited"}),
    ("scale-up rate: 10 → at most 20 (100% > 4 pods)",
     dict(target=0.1), 10, dict(ready=10, starting=0, gpu=1.0), 64, 20, {"scale_up", "scale_up_limited"}),
    ("maxReplicas bounds the scale-up", dict(target=0.5), 4, dict(ready=4, starting=0, gpu=0.9), 6, 6,
     {"scale_up", "clamped_max"}),
    ("missing GPU metric → hold",
     dict(target=0.5), 4, dict(ready=4, starting=0, gpu=None), 64, 4, {"missing_data_hold"}),
    ("NaN GPU metric → hold", dict(target=0.5), 4, dict(ready=4, starting=0, gpu="nan"), 64, 4, {"missing_data_hold"}),
    ("stale GPU metric → hold",
     dict(target=0.5), 4, dict(ready=4, starting=0, gpu="stale"), 64, 4, {"missing_data_hold"}),
    ("missing ready count → hold", dict(target=0.5), 4, dict(ready=None, gpu=0.9), 64, 4, {"missing_data_hold"}),
    ("low metric: first sync never scales down (window seeded with current)",
     dict(target=0.5), 8, dict(ready=8, starting=0, gpu=0.1), 64, 8, {"scale_down_stabilised"}),
    ("starting replicas count as idle on scale-up: 1.8 → 0.9 flips → hold",
     dict(target=0.5), 4, dict(ready=2, starting=2, gpu=0.9), 64, 4, set()),
    ("starting replicas count as idle on scale-up: 4.0 → 2.0 → 8",
     dict(target=0.25), 4, dict(ready=2, starting=2, gpu=1.0), 64, 8, {"scale_up"}),
    ("unknown starting count: absent replicas count as missing (0 on scale-up) → hold",
     dict(target=0.5), 4, dict(ready=2, starting=None, gpu=0.9), 64, 4, set()),
    ("queue metric (production-stack): 8 waiting on 2 ready, target 1 → 8, rate-limited to 6",
     dict(metric="queue_per_replica"), 2, dict(ready=2, starting=0, waiting=8), 64, 6,
     {"scale_up", "scale_up_limited"}),
    ("queue metric with the queue missing → hold", dict(metric="queue_per_replica"), 2,
     dict(ready=2, starting=0, waiting=None), 64, 2, {"missing_data_hold"}),
]


@pytest.mark.parametrize("label,kw,current,signals,max_r,expected,expected_codes", SYNC_ROWS,
                         ids=[r[0] for r in SYNC_ROWS])
def test_hpa_single_sync(label, kw, current, signals, max_r, expected, expected_codes):
    pol = HpaPolicy(**kw)
    fl = fleet(spec(max_replicas=max_r))
    _, out = decide(pol, pol.initial_state(), inp(0.0, {"p": signals}, fl=fl, current={"p": current}))
    assert out.pools["p"].replicas == expected, label
    assert expected_codes <= set(codes(out)), (label, codes(out))
    if expected == current:
        assert "scale_up" not in codes(out) and "scale_down" not in codes(out)


# label, current, metric, target, ready, unready, missing, expected (the HPA replica calculator on its own)
CALC_ROWS = [
    ("plain scale-up", 4, 0.9, 0.5, 4, 0, 0, 8),
    ("plain scale-down", 8, 0.1, 0.5, 8, 0, 0, 2),
    ("tolerance", 4, 0.54, 0.5, 4, 0, 0, 4),
    ("missing pods count at target on scale-down: (0.4 + 1.0) / 2.0 = 0.7 → 3, not 1", 4, 0.2, 0.5, 2, 0, 2, 3),
    ("missing pods count as 0 on scale-up: 1.0×2/(0.25×4) = 2 → 8", 4, 1.0, 0.25, 2, 0, 2, 8),
    ("missing pods: recomputed ratio flips direction → hold", 4, 0.9, 0.5, 2, 0, 2, 4),
    ("unready pods ignored on scale-down: 0.1/0.5 on 2 ready → 1", 4, 0.1, 0.5, 2, 2, 0, 1),
]


@pytest.mark.parametrize("label,current,metric,target,ready,unready,missing,expected", CALC_ROWS,
                         ids=[r[0] for r in CALC_ROWS])
def test_hpa_replica_calculator(label, current, metric, target, ready, unready, missing, expected):
    assert calc_replicas(current, metric, target, ready, unready, missing, 0.1).replicas == expected


def _load(target: float, replicas_worth: float, ready: int) -> float:
    """GPU utilisation that makes the HPA recommend `replicas_worth` replicas on `ready` ready ones."""
    return target * replicas_worth / ready


# label, load per tick (in replicas' worth; first entry at t=0, then 15 s apart), expected {t: replicas}
STABILISATION_ROWS = [
    ("waits 300 s, then takes the max recommendation left in the window",
     [10, 6] + [4] * 21, {0: 10, 15: 10, 150: 10, 285: 10, 300: 6, 315: 4}),
    ("the max in the window, not the latest: 8 at t=15 holds until it leaves",
     [10, 8] + [3] * 21, {285: 10, 300: 8, 315: 3}),
    ("a spike inside the window restarts the wait", [10, 4, 4, 8] + [4] * 22, {300: 8, 330: 8, 345: 4}),
]


@pytest.mark.parametrize("label,loads,expected", STABILISATION_ROWS, ids=[r[0] for r in STABILISATION_ROWS])
def test_scale_down_stabilisation_window(label, loads, expected):
    pol = HpaPolicy(target=0.5)
    fl = fleet(spec())
    state, cur, seen = pol.initial_state(), 10, {}
    for k, want in enumerate(loads):
        t = 15.0 * k
        i = inp(t, {"p": dict(ready=cur, starting=0, gpu=_load(0.5, want, cur))}, fl=fl, current={"p": cur})
        state, out = decide(pol, state, i)
        cur = out.pools["p"].replicas
        seen[int(t)] = (cur, codes(out))
    assert {t: seen[t][0] for t in expected} == expected, label
    assert "scale_down_stabilised" in seen[150][1]


def test_sync_period_evaluates_only_every_15s_and_rate_limit_resets_per_period():
    pol = HpaPolicy(target=0.1)
    fl = fleet(spec())
    steps = [(float(t), {"p": dict(ready=2, starting=0, gpu=1.0)}) for t in range(0, 31, 5)]
    outs = drive(pol, fl, steps, start={"p": 2})
    got = [o.pools["p"].replicas for o in outs]
    # t=0: 2 → 6; t=5, 10: not evaluated; t=15: from 6 the limit is max(6+4, 12) = 12;
    # t=30: the metric asks ceil(10 × 2 ready) = 20, within the limit of 24.
    assert got == [6, 6, 6, 12, 12, 12, 20]
    assert [o.diagnostics["synced"] for o in outs] == [True, False, False, True, False, False, True]


def test_missing_data_never_scales_down_even_after_the_window():
    pol = HpaPolicy(target=0.5)
    fl = fleet(spec())
    steps = [(float(t), {"p": dict(ready=8, starting=0, gpu=None)}) for t in range(0, 601, 15)]
    outs = drive(pol, fl, steps, start={"p": 8})
    assert {o.pools["p"].replicas for o in outs} == {8}
    assert all("missing_data_hold" in codes(o) for o in outs)


def test_routing_is_least_loaded():
    pol = HpaPolicy()
    _, out = decide(pol, pol.initial_state(), inp(0.0, {"p": dict(ready=2, gpu=0.7)}, current={"p": 2}))
    pd = out.pools["p"]
    assert (pd.prefix_weight, pd.queue_weight, pd.kv_weight) == (0.0, 1.0, 0.0)
    assert "routing_set" in codes(out)


def test_bad_parameters_are_named():
    with pytest.raises(ValueError, match="hpa.metric"):
        HpaPolicy(metric="cpu")
    with pytest.raises(ValueError, match="hpa.target"):
        HpaPolicy(target=0)
