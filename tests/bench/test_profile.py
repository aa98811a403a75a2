"""The capacity profile: monotone in the SLO, cached on disk, and a clear error when the SLO is unreachable."""

from __future__ import annotations

import pytest

from controller.bench.profile import ProfileError, profile_pool
from controller.sim.fleet import Fleet
from controller.sim.scenario import load_scenario
from controller.types import SloSpec


@pytest.fixture
def setup(tiny_scenario):
    scenario = load_scenario(tiny_scenario)
    workload = Fleet(scenario, seed=scenario.seed, record_requests=False).workload
    return scenario, workload, tiny_scenario.parent / ".cache"


def test_capacity_is_monotone_in_the_slo(setup) -> None:
    scenario, workload, cache = setup
    caps = []
    for slo in (SloSpec(1.0, 0.05), SloSpec(2.5, 0.1), SloSpec(10.0, 0.3)):
        prof = profile_pool(scenario, "small", workload=workload, slo=slo, seed=1, cache_dir=cache)
        assert prof.capacity.rps > 0
        assert all(p.requests > 0 for p in prof.points)
        caps.append(prof.capacity.rps)
    assert caps[0] <= caps[1] <= caps[2]
    assert caps[0] < caps[2]


def test_profile_is_cached_and_identical(setup) -> None:
    scenario, workload, cache = setup
    first = profile_pool(scenario, "small", workload=workload, seed=1, cache_dir=cache)
    again = profile_pool(scenario, "small", workload=workload, seed=1, cache_dir=cache)
    assert not first.cached and again.cached
    assert again.capacity == first.capacity
    assert list(cache.glob("profile-*.json")) == [cache / f"profile-{first.cache_key}.json"]
    other = profile_pool(scenario, "small", workload=workload, seed=1, cache_dir=cache, slo=SloSpec(3.0, 0.1))
    assert other.cache_key != first.cache_key


def test_unreachable_slo_is_a_clear_error(setup) -> None:
    scenario, workload, _ = setup
    with pytest.raises(ProfileError, match="pool small.*miss the SLO"):
        profile_pool(scenario, "small", workload=workload, slo=SloSpec(0.001, 0.0001), seed=1)
