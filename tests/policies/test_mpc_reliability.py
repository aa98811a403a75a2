"""The MPC's reliability dial (controller/core/objective.py, policies/mpc/dial.py): monotone in the
capacity it buys, one setting found in one order (override, parameter, profile), checked by name.

The fixed case: one 70B pool warmed up on 40 ticks of seeded, wavy demand (so the forecaster has a
spread and a measured error), then one decision at each setting from that same state.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from controller.core.objective import RELIABILITY_MAX, RELIABILITY_MIN, resolve_weights
from controller.policies import build_policy
from controller.policies.mpc import MpcPolicy
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
