"""Static peak provisioning."""

from __future__ import annotations

import pytest

from controller.policies.static import StaticPolicy
from controller.types import Policy
from tests.policies.builders import codes, decide, fleet, inp, spec

# label, configured, pool bounds (min, max), current in force, expected, codes (subset)
ROWS = [
    ("first decision sets the configured count", 6, (1, 64), None, 6, {"routing_set"}),
    ("change from the count in force", 6, (1, 64), 2, 6, {"scale_up"}),
    ("already there: no change reason", 6, (1, 64), 6, 6, set()),
    ("clamped to the pool max", 80, (1, 64), 64, 64, {"clamped_max"}),
    ("clamped to the pool min", 0, (2, 64), 2, 2, {"clamped_min"}),
    ("zero allowed when the pool min is 0", 0, (0, 64), 3, 0, {"scale_down"}),
]


@pytest.mark.parametrize("label,configured,bounds,current,expected,expected_codes", ROWS, ids=[r[0] for r in ROWS])
def test_static_rows(label, configured, bounds, current, expected, expected_codes):
    pol: Policy = StaticPolicy({"p": configured})  # through the Protocol, as the Controller holds it
    fl = fleet(spec(min_replicas=bounds[0], max_replicas=bounds[1]))
    _, out = decide(pol, pol.initial_state(),
                    inp(0.0, {"p": dict(ready=None)}, fl=fl, current=None if current is None else {"p": current}))
    assert out.pools["p"].replicas == expected, label
    assert expected_codes <= set(codes(out)), (label, codes(out))
    if current == expected:
        assert not {"scale_up", "scale_down"} & set(codes(out))


def test_static_ignores_telemetry_and_routes_least_loaded():
    pol = StaticPolicy({"p": 5})
    for signals in (dict(ready=None, ttft=None), dict(ready=1, ttft=50.0, waiting=500), dict(ready="stale")):
        _, out = decide(pol, None, inp(0.0, {"p": signals}, current={"p": 5}))
        pd = out.pools["p"]
        assert pd.replicas == 5
        assert (pd.prefix_weight, pd.queue_weight, pd.kv_weight) == (0.0, 1.0, 0.0)
        assert out.admission == {}


def test_static_validates_counts():
    with pytest.raises(ValueError, match=r"replicas\['p'\]"):
        StaticPolicy({"p": -1})
    with pytest.raises(ValueError, match=r"replicas\['p'\]"):
        StaticPolicy({"p": 2.5})  # type: ignore[dict-item]  # a fractional count on purpose: it must be refused
    with pytest.raises(ValueError, match="non-empty"):
        StaticPolicy({})
