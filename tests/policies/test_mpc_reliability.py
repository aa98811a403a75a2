"""The MPC's reliability dial (controller/core/objective.py, policies/mpc/dial.py): monotone in the
capacity it buys, one setting found in one order (override, parameter, profile), checked by name.

The fixed case: one 70B pool warmed up on 40 ticks of seeded, wavy demand (so the forecaster has a
spread and a measured error), then one decision at each setting from that same state.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, cast

import numpy as np
import pytest

from controller.core.forecast import LoadForecast
from controller.core.mpc import PoolInput
from controller.core.mpc_model import LatencyAnswer, PlanModel
from controller.core.objective import RELIABILITY_MAX, RELIABILITY_MIN, resolve_weights
from controller.policies import build_policy
from controller.policies.mpc import MpcPolicy
from controller.policies.mpc.dial import planned_quantile, reachable_replicas, reachable_rps
from tests.policies.builders import inp
from tests.policies.test_mpc_policy import FAST, FL, loop, pool_signals

SETTINGS = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99)


@pytest.fixture(scope="module")
def warmed():
    """(policy, its state after 40 ticks of wavy demand, the next tick's input)."""
    rng = np.random.default_rng(3)
    series = [(24.0 + 6.0 * math.sin(k / 3.0) + rng.normal(0.0, 2.0), None) for k in range(40)]
    pol = MpcPolicy(**FAST)
    state, outs, _ = loop(pol, series, start=8)
    replicas = outs[-1].pools["p"].replicas
    i = inp(15.0 * 41, {"p": pool_signals(26.0, replicas)}, fl=FL, current={"p": replicas})
    return pol, state, i


def _decide(pol, state, i):
    _, out = pol.decide(state, i, np.random.default_rng(0))
    return out


def test_capacity_planned_is_non_decreasing_in_the_dial(warmed):
    pol, state, i = warmed
    now, peak, planned = [], [], []
    for r in SETTINGS:
        out = _decide(pol, state, replace(i, reliability=r))
        d = out.diagnostics
        now.append(out.pools["p"].replicas)
        peak.append(max(d["plan"]["p"]["replicas"]))
        planned.append(d["reliability"]["planned_rps"])
        assert d["reliability"]["value"] == r and d["reliability"]["source"] == "override"
    assert now == sorted(now) and peak == sorted(peak), (SETTINGS, now, peak)
    assert planned == sorted(planned) and len(set(planned)) == len(planned), planned
    assert now[-1] > now[0], now  # the dial buys something over its range
    median = _decide(pol, state, replace(i, reliability=0.5)).diagnostics["reliability"]
    assert median["planned_rps"] == median["median_rps"]  # 0.5 plans for the median forecast


def test_parameter_then_override_then_profile(warmed):
    _, state, i = warmed
    by_param = _decide(MpcPolicy(**FAST, reliability=0.9), state, i)
    by_override = _decide(MpcPolicy(**FAST), state, replace(i, reliability=0.9))
    assert by_param.diagnostics["reliability"]["source"] == "policy parameter"
    assert by_param.diagnostics["plan"] == by_override.diagnostics["plan"]
    # the live override wins over the configured parameter
    both = _decide(MpcPolicy(**FAST, reliability=0.9), state, replace(i, reliability=0.5))
    assert both.diagnostics["reliability"]["source"] == "override" and both.diagnostics["reliability"]["value"] == 0.5
    # without either, the profile's own setting, which is what the dial's default plans exactly as
    for profile, value in (("balanced", 0.6), ("latency", 0.9), ("cost", 0.6)):
        out = _decide(MpcPolicy(**FAST), state, replace(i, profile=profile))
        assert out.diagnostics["reliability"] == {**out.diagnostics["reliability"], "value": value,
                                                  "source": f"profile {profile}"}
    assert resolve_weights("latency").reliability == 0.9
    default = _decide(MpcPolicy(**FAST), state, i)
    explicit = _decide(MpcPolicy(**FAST, reliability=0.6), state, i)
    assert default.diagnostics["plan"] == explicit.diagnostics["plan"]


@pytest.mark.parametrize("params, msg", [
    ({"reliability": 0.3}, r"mpc.reliability must be a probability in \[0.5, 0.99\] \(got 0.3\)"),
    ({"reliability": 1.0}, "mpc.reliability must be a probability"),
    ({"reliability": "high"}, "mpc.reliability must be a probability"),
    ({"reliability": True}, "mpc.reliability must be a probability"),
    ({"weights": {"plan_quantile": 0.8}}, "plan_quantile is the MPC's reliability dial"),
    ({"weights": {"reliability": 0.8}}, "set the policy parameter `reliability`"),
])
def test_a_bad_setting_is_refused_by_name(params, msg):
    with pytest.raises(ValueError, match=msg):
        build_policy("mpc", FL, params)


def test_a_bad_override_value_reaching_the_policy_is_refused(warmed):
    """The API refuses it first (tests/runtime/test_reliability_override.py); the policy does not plan on it."""
    pol, state, i = warmed
    with pytest.raises(ValueError, match="reliability override must be a probability"):
        _decide(pol, state, replace(i, reliability=RELIABILITY_MAX + 0.005))
    with pytest.raises(ValueError, match="reliability override must be a probability"):
        _decide(pol, state, replace(i, reliability=RELIABILITY_MIN - 0.005))


# ------------------------------------------------------------------ what the dial can reach (dial.py)


class FluidModel:
    """A planning model whose replica carries `rps` req/s uncapped, `capped` under any in-flight cap."""

    pools = ("a", "b")

    def __init__(self, rps: float = 4.0, capped: float = 3.0) -> None:
        self.rps, self.capped = rps, capped

    @staticmethod
    def make(**kw: float) -> PlanModel:
        return cast(PlanModel, FluidModel(**kw))  # the part of the protocol reachable_rps asks: latency()

    def latency(self, q):
        cap = np.where(np.asarray(q.inflight_cap) > 0, self.capped, self.rps)
        z = np.zeros(np.shape(q.rps_per_replica))
        return LatencyAnswer(ttft_p50_s=z, ttft_p95_s=z, tpot_p50_s=z, tpot_p95_s=z, capacity_rps=z + cap,
                             utilisation=np.asarray(q.rps_per_replica) / cap, batch=z, confidence=z + 1.0)


def _pool(name: str, **kw: Any) -> PoolInput:
    base: dict[str, Any] = dict(name=name, model_index=0, group="g", role="mixed", usd_per_hour=1.0, lo=1, hi=8,
                                target=5, ready=5, startup_warm_s=60.0, startup_cold_s=285.0)
    base.update(kw)
    return PoolInput(**base)


def test_reachable_replicas_follow_the_startups():
    p = _pool("a", ready=5, starting_eta_s=(100.0,), warm_slots=1, hi=8)
    # 75 s: the warm slot; 105 s: and the replica starting; 300 s: the maximum
    assert [reachable_replicas(p, t) for t in (15.0, 75.0, 105.0, 300.0)] == [5, 6, 7, 8]
    assert reachable_replicas(_pool("a", ready=9, hi=8), 0.0) == 8  # never past the maximum (an override lowered it)


def test_reachable_load_is_the_fluid_capacity_of_the_reachable_fleet():
    lead = np.array([15.0, 135.0, 285.0, 315.0])
    one = reachable_rps([_pool("a", ready=5, hi=8)], FluidModel.make(), lead, {})
    assert one == pytest.approx(0.97 * 4.0 * np.array([5, 5, 8, 8]))  # 19.4 until the cold start-up, 31 after
    # under a ceiling on the in-flight cap, what a capped replica carries
    capped = reachable_rps([_pool("a", ready=5, hi=8, max_inflight_cap=32)], FluidModel.make(), lead, {})
    assert capped == pytest.approx(0.97 * 3.0 * np.array([5, 5, 8, 8]))
    # a disaggregated group is as wide as its narrower hop; two groups fill at their measured shares
    dis = [_pool("a", ready=5, hi=8, role="prefill"), _pool("b", ready=2, hi=3, role="decode")]
    assert reachable_rps(dis, FluidModel.make(), lead, {}) == pytest.approx(0.97 * 4.0 * np.array([2, 2, 3, 3]))
    two = [_pool("a", ready=4, hi=4), _pool("b", ready=4, hi=4, group="h")]
    shared = reachable_rps(two, FluidModel.make(), lead, {"g": 0.8, "h": 0.2})
    assert shared == pytest.approx(np.full(4, 0.97 * 16 / 0.8))  # g fills first: 15.5 req/s at 80 % of the load
    assert reachable_rps(two, FluidModel.make(), lead, {}) == pytest.approx(np.full(4, 0.97 * 32))


def test_the_planned_quantile_is_held_at_the_reachable_load_and_stays_monotone():
    lead = np.array([15.0, 285.0])
    fc = LoadForecast(lead, np.array([20.0, 20.0]), np.array([26.0, 30.0]), 20.0, 0.0)
    reach = np.array([22.0, 40.0])
    free = [planned_quantile(fc, r, None) for r in SETTINGS]
    held = [planned_quantile(fc, r, reach) for r in SETTINGS]
    assert free[-1] == pytest.approx([20.0 + 1.8153 * 6.0, 20.0 + 1.8153 * 10.0], abs=1e-3)
    assert held[-1] == pytest.approx([22.0, 20.0 + 1.8153 * 10.0], abs=1e-3)  # step 0 held at what 5 replicas carry
    for a, b in zip(held, held[1:], strict=False):
        assert np.all(b >= a)  # the dial stays monotone
    # never below the median: a fleet that cannot carry the median plans for the median
    assert planned_quantile(fc, 0.99, np.array([10.0, 10.0])) == pytest.approx([20.0, 20.0])


def test_the_dial_plans_for_no_more_than_the_largest_fleet_carries(warmed):
    """On the fixed case at 0.99, with the pool's maximum lowered to the replicas it has: the load
    planned for at the start-up is what six replicas carry under the stream guard's ceiling, not the
    quantile seven would be needed for, and the plan holds the maximum."""
    pol, state, i = warmed
    free = _decide(pol, state, replace(i, reliability=0.99))
    replicas = i.current.pools["p"].replicas
    small = replace(i, reliability=0.99,
                    fleet=replace(i.fleet, pools=(replace(i.fleet.pools[0], max_replicas=replicas),)))
    out = _decide(pol, state, small)
    d, f = out.diagnostics["reliability"], free.diagnostics["reliability"]
    assert d["median_rps"] == f["median_rps"] < d["planned_rps"] < f["planned_rps"]
    assert out.pools["p"].replicas == replicas == max(out.diagnostics["plan"]["p"]["replicas"])
