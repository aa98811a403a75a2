"""SLA planner (Dynamo style): capacity profiles, forecasts, interval, disaggregated counts, shedding."""

from __future__ import annotations

import math

import numpy as np
import pytest

from controller.perf.replica_capacity import ReplicaCapacity, capacity_from_samples
from controller.policies.sla_planner import SlaPlannerPolicy, forecast_next
from controller.types import SloSpec
from tests.policies.builders import codes, decide, drive, fleet, inp, spec

# --------------------------------------------------------------------------- capacity

CAP_ROWS = [
    ("TTFT-bound: interpolate between 2 (0.5 s) and 4 (2.1 s) for 1.3 s → 3",
     [1, 2, 4], [0.3, 0.5, 2.1], None, SloSpec(1.3, 0.1), 3.0),
    ("TPOT-bound is the tighter one → 2.5", [1, 2, 4], [0.3, 0.5, 2.1], [0.02, 0.05, 0.11], SloSpec(1.3, 0.065), 2.5),
    ("never extrapolates past the highest profiled load", [1, 2], [0.1, 0.2], None, SloSpec(5.0, 1.0), 2.0),
    ("repeated loads are averaged: (0.4+0.6)/2 = 0.5 at 2", [1, 2, 2, 4], [0.3, 0.4, 0.6, 2.1], None,
     SloSpec(1.3, 1), 3.0),
    ("noise cannot invent capacity (latency made non-decreasing)", [1, 2, 3, 4], [0.3, 2.0, 0.5, 2.1], None,
     SloSpec(1.0, 1), 1.0 + 0.7 / 1.7),
    ("NaN rows (windows without completions) are dropped", [1, 2, 3, 4], [0.3, 0.5, math.nan, 2.1], None,
     SloSpec(1.3, 1), 3.0),
]


@pytest.mark.parametrize("label,load,ttft,tpot,slo,expected", CAP_ROWS, ids=[r[0] for r in CAP_ROWS])
def test_capacity_from_samples(label, load, ttft, tpot, slo, expected):
    cap = capacity_from_samples(load, ttft, tpot, slo, mean_prompt_tokens=1000, mean_output_tokens=100)
    assert cap.rps == pytest.approx(expected), label
    assert cap.prompt_tokens_per_s == pytest.approx(expected * 1000)
    assert cap.generation_tokens_per_s == pytest.approx(expected * 100)


def test_capacity_errors_name_the_problem():
    with pytest.raises(ValueError, match="exceeds the SLO"):
        capacity_from_samples([1, 2], [3.0, 4.0], None, SloSpec(2.0, 0.1))
    with pytest.raises(ValueError, match="has 2 samples, load_rps has 3"):
        capacity_from_samples([1, 2, 3], [0.1, 0.2], None, SloSpec(2.0, 0.1))
    with pytest.raises(ValueError, match="no sample"):
        capacity_from_samples([0, -1], [0.1, 0.2], None, SloSpec(2.0, 0.1))
    with pytest.raises(ValueError, match="capacity.rps"):
        ReplicaCapacity(rps=0)
    with pytest.raises(ValueError, match="ascending"):
        ReplicaCapacity(rps=1, profile_rps=(2.0, 1.0), profile_ttft_s=(0.1, 0.2))
    with pytest.raises(ValueError, match="unknown field"):
        ReplicaCapacity.of({"rps": 1, "qps": 2})


def test_capacity_profile_lookups():
    cap = ReplicaCapacity(rps=3, profile_rps=(1.0, 2.0, 4.0), profile_ttft_s=(0.3, 0.5, 2.1),
                          profile_tpot_s=(0.02, 0.04, 0.08))
    assert cap.expected_ttft_s(3.0) == pytest.approx(1.3)
    assert cap.rps_within(tpot_s=0.06) == pytest.approx(3.0)
    assert cap.rps_within(tpot_s=0.01) is None


# --------------------------------------------------------------------------- forecasting

FC_ROWS = [
    ("constant: the last interval", [5, 9, 7], "constant", 7.0),
    ("holt on a straight line continues it", [10, 12, 14, 16], "holt", 18.0),
    ("holt with < 3 points falls back to the last value", [4, 8], "holt", 8.0),
    ("holt on a flat series stays flat", [6, 6, 6, 6, 6], "holt", 6.0),
    ("holt never forecasts a negative load", [9, 6, 3, 0.5], "holt", None),
]


@pytest.mark.parametrize("label,history,method,expected", FC_ROWS, ids=[r[0] for r in FC_ROWS])
def test_forecast_next(label, history, method, expected):
    got = forecast_next(history, method)
    if expected is None:
        assert got is not None and got >= 0.0
    else:
        assert got == pytest.approx(expected, abs=1e-6), label


def test_forecast_of_nothing_is_none():
    assert forecast_next([], "holt") is None


# --------------------------------------------------------------------------- the planner


def _steps(duration_s: float, tick_s: float, signals: dict, pool: str = "p") -> list:
    return [(k * tick_s, {pool: dict(signals)}) for k in range(int(duration_s / tick_s) + 1)]


def test_interval_is_respected_and_forecast_becomes_replicas():
    # 18 req/s steady; a replica sustains 4 req/s at the SLO → ceil(18/4) = 5, decided at t=180 only.
    pol = SlaPlannerPolicy({"p": ReplicaCapacity(rps=4.0)}, forecaster="constant")
    outs = drive(pol, fleet(spec()), _steps(360, 15, dict(ready=2, rps=18.0)), start={"p": 2})
    got = [o.pools["p"].replicas for o in outs]
    assert got[:12] == [2] * 12  # t = 0 … 165: collecting the first interval
    assert got[12] == 5 and {"scale_up", "forecast_scale"} <= set(codes(outs[12]))  # t = 180
    assert [o.diagnostics["adjusted"] for o in outs].count(True) == 2  # t = 180 and t = 360


def test_shorter_interval_acts_sooner():
    pol = SlaPlannerPolicy({"p": ReplicaCapacity(rps=4.0)}, adjustment_interval_s=30.0, forecaster="constant")
    outs = drive(pol, fleet(spec()), _steps(60, 15, dict(ready=2, rps=18.0)), start={"p": 2})
    assert [o.pools["p"].replicas for o in outs] == [2, 2, 5, 5, 5]


def test_trend_is_forecast_with_holt():
    pol = SlaPlannerPolicy({"p": ReplicaCapacity(rps=1.0)}, adjustment_interval_s=60.0)
    # The first interval holds the samples at t=0 and t=60 (both 12), the next ones one sample each.
    steps = [(k * 60.0, {"p": dict(ready=10, rps=10.0 + 2 * max(k, 1))}) for k in range(6)]
    outs = drive(pol, fleet(spec()), steps, start={"p": 10})
    # Intervals see 12, 14, 16, 18, 20 → the last decision forecasts 22 → 22 replicas.
    assert outs[-1].pools["p"].replicas == 22
    assert outs[-1].diagnostics["pools"]["p"]["forecast_rps"] == pytest.approx(22.0, abs=1e-6)


def test_disaggregated_prefill_and_decode_are_counted_separately():
    fl = fleet(spec("pre", role="prefill"), spec("dec", role="decode"))
    cap = {"pre": ReplicaCapacity(rps=5.0, prompt_tokens_per_s=5000.0),
           "dec": ReplicaCapacity(rps=10.0, generation_tokens_per_s=1000.0)}
    pol = SlaPlannerPolicy(cap, adjustment_interval_s=15.0, forecaster="constant")
    signals = {"pre": dict(ready=1, rps=10.0, prompt=20000.0, gen=10.0),
               "dec": dict(ready=1, rps=10.0, prompt=0.0, gen=3000.0)}
    outs = drive(pol, fl, [(0.0, signals), (15.0, signals)], start={"pre": 1, "dec": 1})
    last = outs[-1]
    assert last.pools["pre"].replicas == 4  # 20000 prompt tokens/s / 5000 per replica
    assert last.pools["dec"].replicas == 3  # 3000 generated tokens/s / 1000 per replica
    assert [t["term"] for t in last.diagnostics["pools"]["pre"]["terms"]] == ["prefill_tokens"]
    assert [t["term"] for t in last.diagnostics["pools"]["dec"]["terms"]] == ["decode_tokens"]


def test_correction_factors_as_dynamo():
    # Profile: at 2 req/s per replica TTFT 0.5 s and TPOT 0.04 s.
    cap = ReplicaCapacity(rps=4.0, profile_rps=(1.0, 2.0, 4.0, 8.0), profile_ttft_s=(0.3, 0.5, 1.0, 3.0),
                          profile_tpot_s=(0.02, 0.04, 0.05, 0.1))
    fl = fleet(spec("pre", role="prefill"), spec("dec", role="decode"),
               slos={"critical": SloSpec(ttft_s=1.0, tpot_s=0.05)})
    pol = SlaPlannerPolicy({"pre": cap, "dec": cap}, adjustment_interval_s=15.0, forecaster="constant")
    # Measured TTFT 0.25 s (half the profile: prefix hits) and TPOT 0.08 s (double: slower decode).
    sig = dict(ready=5, rps=10.0, ttft=0.25, tpot=0.08)
    outs = drive(pol, fl, [(0.0, {"pre": sig, "dec": sig}), (15.0, {"pre": sig, "dec": sig})],
                 start={"pre": 5, "dec": 5})
    d = outs[-1].diagnostics["pools"]
    assert d["pre"]["prefill_correction"] == pytest.approx(0.5)
    assert d["dec"]["decode_correction"] == pytest.approx(2.0)
    assert outs[-1].pools["pre"].replicas == 2  # 10 × min(1, 0.5) / 4 = 1.25 → 2
    # Decode: the TPOT SLO 0.05 / 2 = 0.025 → 1.25 req/s per replica in the profile → ceil(10/1.25) = 8.
    assert outs[-1].pools["dec"].replicas == 8


def test_missing_arrival_rate_holds_the_pool():
    pol = SlaPlannerPolicy({"p": ReplicaCapacity(rps=4.0)}, adjustment_interval_s=15.0)
    outs = drive(pol, fleet(spec()), [(0.0, {"p": dict(ready=6, rps=None)}), (15.0, {"p": dict(ready=6, rps="nan")})],
                 start={"p": 6})
    assert outs[-1].pools["p"].replicas == 6 and "missing_data_hold" in codes(outs[-1])


def test_min_endpoint_and_max_bounds():
    pol = SlaPlannerPolicy({"p": ReplicaCapacity(rps=4.0)}, adjustment_interval_s=15.0, forecaster="constant")
    fl = fleet(spec(min_replicas=0, max_replicas=3))
    outs = drive(pol, fl, [(0.0, {"p": dict(ready=2, rps=0.0)}), (15.0, {"p": dict(ready=2, rps=0.0)})], start={"p": 2})
    assert outs[-1].pools["p"].replicas == 1  # Dynamo's min_endpoint = 1
    outs = drive(pol, fl, [(0.0, {"p": dict(ready=2, rps=40.0)}), (15.0, {"p": dict(ready=2, rps=40.0)})],
                 start={"p": 2})
    assert outs[-1].pools["p"].replicas == 3 and "clamped_max" in codes(outs[-1])


SHED_ROWS = [
    ("KV 0.95 on the decode pool → shed sheddable", False, {"dec": 0.95, "pre": 0.2}, True, "shed_sheddable"),
    ("KV on the prefill pool is not a busy signal", False, {"dec": 0.5, "pre": 0.99}, False, None),
    ("below the threshold again → release", True, {"dec": 0.6, "pre": 0.2}, False, "shed_release"),
    ("KV missing everywhere → keep shedding", True, {"dec": None, "pre": None}, True, "missing_data_hold"),
    ("partial data cannot release shedding", True, {"dec": None, "dec2": 0.3, "pre": 0.2}, True, "missing_data_hold"),
]


@pytest.mark.parametrize("label,was,kvs,shedding,code", SHED_ROWS, ids=[r[0] for r in SHED_ROWS])
def test_load_shedding_of_sheddable_traffic(label, was, kvs, shedding, code):
    from controller.policies.sla_planner import PlannerState
    pools = ([spec("pre", role="prefill"), spec("dec", role="decode")]
             + ([spec("dec2", role="decode")] if "dec2" in kvs else []))
    fl = fleet(*pools)
    pol = SlaPlannerPolicy({p.name: ReplicaCapacity(rps=4.0) for p in pools})
    st = PlannerState(shedding=was)
    _, out = decide(pol, st, inp(0.0, {p: dict(ready=2, rps=5.0, kv=kv) for p, kv in kvs.items()}, fl=fl,
                                 current={p.name: 2 for p in pools}))
    assert (out.admission.get("sheddable") is not None) is shedding, label
    if shedding:
        assert out.admission["sheddable"].shed_frac == 1.0
        assert set(out.admission) == {"sheddable"}  # critical and standard are never shed here
    if code:
        assert code in codes(out, pool=None)


def test_routing_is_kv_aware_prefix_and_load_1_to_1():
    pol = SlaPlannerPolicy({"p": ReplicaCapacity(rps=4.0)})
    _, out = decide(pol, pol.initial_state(), inp(0.0, {"p": dict(ready=2, rps=5.0)}, current={"p": 2}))
    pd = out.pools["p"]
    assert (pd.prefix_weight, pd.queue_weight, pd.kv_weight) == (1.0, 1.0, 0.0)


def test_decide_is_deterministic_and_leaves_its_input_state_alone():
    pol = SlaPlannerPolicy({"p": ReplicaCapacity(rps=4.0)}, adjustment_interval_s=15.0)
    s0 = pol.initial_state()
    s1, _ = decide(pol, s0, inp(0.0, {"p": dict(ready=2, rps=9.0)}, current={"p": 2}))
    a = decide(pol, s1, inp(15.0, {"p": dict(ready=2, rps=9.0)}, current={"p": 2}))
    b = decide(pol, s1, inp(15.0, {"p": dict(ready=2, rps=9.0)}, current={"p": 2}))
    assert a == b
    assert s1.pools["p"].interval["rps"] == (9.0,)
    assert np.isfinite(a[1].diagnostics["pools"]["p"]["forecast_rps"])
