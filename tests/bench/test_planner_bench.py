"""`governor bench planner`'s fleets: regions of route groups, each one model over pools of several SKUs."""

from __future__ import annotations

from collections import defaultdict

import pytest

from controller.bench.planner import ROUTE_GROUPS, _fleet, measure, reference_every


@pytest.mark.parametrize("n", [10, 40, 100])
def test_fleets_are_regions_of_route_groups_one_model_each(n: int) -> None:
    fleet = _fleet(n)
    assert len(fleet.pools) == n and len({p.name for p in fleet.pools}) == n
    groups: dict[str, list] = defaultdict(list)
    for p in fleet.pools:
        groups[p.group].append(p)
    for name, pools in groups.items():
        assert len({p.model for p in pools}) == 1, name  # a route group serves one model
        assert len({p.sku for p in pools}) == len(pools), name  # over pools of different SKUs
    per_region = sum(len(skus) for _, skus, _, _ in ROUTE_GROUPS)
    assert len({g.split("-", 1)[0] for g in groups}) == -(-n // per_region)


def test_the_reference_is_a_sample_on_large_fleets_and_bad_input_is_named() -> None:
    assert reference_every(10) == 1 and reference_every(100) == 4
    with pytest.raises(ValueError, match="--clock"):
        measure(10, 1, 200.0, clock="gpu")
    with pytest.raises(ValueError, match="--reference-every"):
        measure(10, 1, 200.0, every=0)


def test_timing_summary_reports_the_work_after_the_search_and_the_reserve() -> None:
    from controller.bench.planner import _timing

    ticks = [{"after_search_ms": a, "reserve_ms": r, "spill_ms": a + max(o, 0.0), "search_over_deadline_ms": o,
              "tick_ms": t, "reserve_basis": b}
             for a, r, o, t, b in [(16.0, 100.0, -30.0, 900.0, "first"), (17.0, 40.0, -5.0, 990.0, "measured"),
                                   (18.0, 38.0, 2.0, 1001.0, "measured")]]
    out = _timing(ticks, 1000.0)
    assert out["after_search_p50_ms"] == 17.0 and out["after_search_max_ms"] == 18.0
    assert out["spill_max_ms"] == 20.0 and out["search_over_deadline_max_ms"] == 2.0
    assert out["reserve_basis"] == {"first": 1, "measured": 2} and out["ticks_over_budget"] == 1
    assert _timing(ticks, None) == {} and _timing([], 1000.0) == {}
