"""The shared helpers' worked examples (the ones quoted in their docstrings)."""

from __future__ import annotations

import pytest

from controller.policies.common import (
    ScalingPolicy,
    ceil_replicas,
    current_target,
    push_sample,
    replica_floor,
    scale_down_limit,
    scale_up_limit,
    slope_per_s,
    stabilise,
    tightest_slo,
    window_mean,
)
from tests.policies.builders import fleet, inp, spec

UP = (ScalingPolicy("pods", 4, 15.0), ScalingPolicy("percent", 100, 15.0))


def test_ceil_ignores_float_noise():
    assert ceil_replicas(4 * 1.75) == 7 and ceil_replicas(7.000000000001) == 7 and ceil_replicas(7.2) == 8


STAB_ROWS = [
    ("held by the highest in 300 s", ((0.0, 10), (60.0, 6)), 120.0, 4, 10, 10),
    ("old entries leave the window", ((0.0, 10), (60.0, 6)), 301.0, 4, 10, 6),
    ("scale-up is immediate (up window 0)", ((0.0, 3),), 15.0, 8, 3, 8),
]


@pytest.mark.parametrize("label,recs,now,desired,current,expected", STAB_ROWS, ids=[r[0] for r in STAB_ROWS])
def test_stabilise(label, recs, now, desired, current, expected):
    out, kept = stabilise(recs, now, desired, current, 0.0, 300.0)
    assert out == expected
    assert kept[-1] == (now, desired)


LIMIT_ROWS = [
    ("2 → 6: 4 pods beats 100 %", 2, (), 6),
    ("10 → 20: 100 % beats 4 pods", 10, (), 20),
    ("after +4 this period, measured from the period start", 6, ((10.0, 4),), 6),
    ("events older than the period do not count", 6, ((0.0, 4),), 12),
]


@pytest.mark.parametrize("label,current,up_events,expected", LIMIT_ROWS, ids=[r[0] for r in LIMIT_ROWS])
def test_scale_up_limit(label, current, up_events, expected):
    assert scale_up_limit(current, up_events, (), UP, 15.0) == expected


def test_scale_down_limit_100_percent_is_no_limit():
    assert scale_down_limit(8, (), (), (ScalingPolicy("percent", 100, 15.0),), 15.0) == 0
    assert scale_down_limit(8, (), (), (ScalingPolicy("percent", 50, 15.0),), 15.0) == 4


def test_windows_and_slope():
    s: tuple[tuple[float, float], ...] = ()
    for t, v in ((15.0, 40.0), (30.0, 60.0), (45.0, 80.0), (60.0, 100.0)):
        s = push_sample(s, t, v, keep_s=60.0)
    assert window_mean(s, 60.0, 60.0) == 70.0 and window_mean(s, 60.0, 6.0) == 100.0
    assert window_mean(s, 200.0, 6.0) is None
    assert slope_per_s(((0.0, 0.0), (15.0, 10.0), (30.0, 20.0)), 30.0, 60.0) == pytest.approx(2 / 3)
    assert push_sample(s, 120.0, 1.0, keep_s=60.0) == ((120.0, 1.0),)


def test_current_target_sources():
    fl = fleet(spec(min_replicas=2))
    i = inp(0.0, {"p": dict(ready=3, starting=1)}, fl=fl, current={"p": 7})
    assert current_target(i, fl.pools[0]) == (7, "decision")
    assert current_target(inp(0.0, {"p": dict(ready=3, starting=1)}, fl=fl), fl.pools[0]) == (4, "observed")
    assert current_target(inp(0.0, {"p": dict(ready=None)}, fl=fl), fl.pools[0]) == (2, "pool_min")


def test_floor_and_slo():
    assert replica_floor(spec(min_replicas=0)) == 1 and replica_floor(spec(min_replicas=0), allow_zero=True) == 0
    fl = fleet()
    tight, standard = tightest_slo(fl), tightest_slo(fl, "standard")
    assert tight is not None and standard is not None
    assert tight.ttft_s == 2.0 and standard.ttft_s == 5.0
    with pytest.raises(ValueError, match="not in the fleet"):
        tightest_slo(fl, "gold")
