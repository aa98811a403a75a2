"""The hindsight oracle: the DP against worked examples, its cost against static provisioning, its replay."""

from __future__ import annotations

import numpy as np
import pytest

from controller.bench.oracle import (
    PoolDemand,
    burst_rates,
    peak_rate,
    plan_cost,
    plan_pool,
    run_oracle,
    schedule_targets,
    window_rates,
)
from controller.bench.policies import prepare
from controller.bench.runner import run_policy
from controller.sim.scenario import PoolSpecModel, load_scenario


def pool(**kw) -> PoolSpecModel:
    base = dict(name="p", model="llama-3-8b", sku="a100-80gb", replicas=1, min_replicas=1, max_replicas=8,
                startup_warm_s=20.0, startup_cold_s=300.0, usd_per_gpu_hour=3.6)
    return PoolSpecModel(**{**base, **kw})


# One row per case: label, pool overrides, demand per window (req/s), capacity per replica, expected schedule.
PLAN_CASES = [
    # a one-window dip is cheaper to ride out (2 × 60 s) than two cold restarts (2 × 90 s); the first
    # two windows end before a 90 s start-up ordered at t = 0 could serve, so they keep the initial replica
    ("keeps through a short dip", {"replicas": 1, "startup_cold_s": 90.0}, [3, 3, 9, 3, 9], 4.0, (1, 1, 3, 3, 3)),
    # with a 10 s start-up, dropping and restarting is cheaper than holding for a window
    ("drops when restarts are cheap", {"replicas": 1, "startup_cold_s": 10.0}, [3, 9, 3, 9], 4.0, (1, 3, 1, 3)),
    ("floor is max(min, 1)", {"replicas": 2, "min_replicas": 0, "startup_cold_s": 0.0}, [0, 0, 0], 4.0, (1, 1, 1)),
    ("capped at max_replicas", {"replicas": 2, "max_replicas": 3, "startup_cold_s": 0.0}, [40, 40], 4.0, (3, 3)),
    # the first windows only have the initial replicas, whatever the demand (a cold start takes 300 s)
    ("early windows use what is there", {"replicas": 2, "startup_cold_s": 120.0}, [20, 20, 20], 4.0, (2, 2, 5)),
]


@pytest.mark.parametrize("label, kw, rates, cap, want", PLAN_CASES, ids=[c[0] for c in PLAN_CASES])
def test_plan_pool(label, kw, rates, cap, want) -> None:
    plan = plan_pool(pool(**kw), np.array(rates, dtype=float), cap, window_s=60.0, drain_s=0.0)
    assert plan.replicas == want


def test_plan_margin_raises_need() -> None:
    p = pool(startup_cold_s=0.0)
    assert plan_pool(p, np.array([8.0]), 4.0, margin=1.0, window_s=60.0).replicas == (2,)
    assert plan_pool(p, np.array([8.0]), 4.0, margin=1.3, window_s=60.0).replicas == (3,)


def test_dp_never_dearer_than_static_on_random_demand() -> None:
    rng = np.random.default_rng(3)
    for _ in range(40):
        spec = pool(replicas=int(rng.integers(1, 5)), startup_cold_s=float(rng.choice([0, 60, 300])),
                    max_replicas=12)
        rates = rng.gamma(2.0, 6.0, size=int(rng.integers(5, 40)))
        cap = float(rng.uniform(2.0, 6.0))
        plan = plan_pool(spec, rates, cap, window_s=60.0, drain_s=5.0)
        assert all(m >= n for m, n in zip(plan.replicas, plan.need))
        static_n = int(min(max(np.ceil(rates.max() / cap - 1e-9), 1), spec.max_replicas))
        usd_s = 3.6 / 3600.0
        static_cost = plan_cost([static_n] * len(rates), spec.replicas, window_s=60.0, usd_per_s=usd_s,
                                startup_s=spec.startup_cold_s, drain_s=5.0)
        assert plan.planned_cost_usd <= static_cost + 1e-9
        assert plan.planned_cost_usd == pytest.approx(plan_cost(plan.replicas, spec.replicas, window_s=60.0,
                                                                usd_per_s=usd_s, startup_s=spec.startup_cold_s,
                                                                drain_s=5.0))


def test_peak_and_window_rates() -> None:
    d = PoolDemand("p", np.array([0.0, 10.0, 20.0, 70.0]), np.ones(4))
    assert peak_rate(d, 60.0) == pytest.approx(3 / 60)
    assert list(window_rates(d, 60.0, 2)) == pytest.approx([3 / 60, 1 / 60])
    bursty = PoolDemand("p", np.array([1.0, 2.0, 3.0, 50.0]), np.ones(4))
    assert list(burst_rates(bursty, 60.0, 20.0, 1)) == pytest.approx([3 / 20])


def test_schedule_orders_replicas_ahead_of_their_window() -> None:
    spec = pool(replicas=1, startup_warm_s=20.0, startup_cold_s=90.0)
    # up at 300 s (cold), down at 600 s, up again at 660 s (a warm slot is free then)
    targets = schedule_targets(spec, [1, 1, 1, 1, 1, 3, 3, 3, 3, 3, 1, 3], window_s=60.0, tick_s=15.0)
    assert targets[0] == (0.0, 1)
    assert (300.0 - 90.0 - 15.0, 3) in targets  # both cold: ordered startup + one tick early
    assert (600.0, 1) in targets
    assert (660.0 - 20.0 - 15.0, 3) in targets  # warm: the slots left at 600 s


def test_oracle_replay_meets_slo_and_beats_static(tiny_scenario) -> None:
    scenario = load_scenario(tiny_scenario)
    ctx = prepare(scenario, seed=scenario.seed, cache_dir=tiny_scenario.parent / ".cache")
    oracle = run_oracle(scenario, workload=ctx.workload, profiles=ctx.profiles, demands=ctx.demands,
                        seed=scenario.seed)
    assert oracle.slo_met
    assert oracle.run.extra["worst_class_request_slo"] >= 0.95
    assert oracle.candidate.planned_cost_usd <= oracle.static_planned_cost_usd
    static = run_policy(scenario, "static", seed=scenario.seed, params={"replicas": dict(ctx.static_replicas)},
                        workload=ctx.workload)
    assert oracle.run.summary["cost_usd"] <= static.summary["cost_usd"]
    # the schedule follows the load step: more replicas in the busy middle than at either end
    sched = oracle.run.extra["schedule"]["small"]
    assert max(sched[2:5]) > sched[0] and max(sched[2:5]) > sched[-1]


def test_fault_extra_covers_the_replacement_start_up(tiny_scenario) -> None:
    from controller.bench.oracle import fault_extra

    text = tiny_scenario.read_text() + """faults:
  - {kind: crash, pool: small, at_s: 130, count: 2}
  - {kind: slow, pool: small, at_s: 300, count: 2, factor: 2, duration_s: 60}
"""
    tiny_scenario.write_text(text)
    scenario = load_scenario(tiny_scenario)
    # crash: 2 missing from 130 s until the cold start-up (20 s) + a tick (15 s) later: windows 2 (120-180)
    # slow ×2 on 2 replicas: one replica's worth missing over [300, 360): window 5
    assert list(fault_extra(scenario, "small", 8, window_s=60.0, tick_s=15.0)) == [0, 0, 2, 0, 0, 1, 0, 0]
    plan = plan_pool(scenario.pool("small"), np.array([4.0] * 8), 4.0, window_s=60.0,
                     extra=fault_extra(scenario, "small", 8, window_s=60.0, tick_s=15.0))
    assert plan.need[2] == 3 and plan.need[5] == 2 and plan.need[7] == 1
