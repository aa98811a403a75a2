"""Scale to zero with the MPC on the simulated fleet: an idle pool goes to zero replicas and comes
back when traffic returns (the router holds the first requests while a replica starts)."""

from __future__ import annotations

import numpy as np

from controller.bench.runner import run_closed_loop
from controller.policies.mpc import MpcPolicy
from tests.fakes.sim_fleet import pool, scenario, workload

BUSY_S, IDLE_S, AGAIN_S, COLD_S = 300.0, 1200.0, 900.0, 300.0


def test_idle_pool_goes_to_zero_and_comes_back_when_traffic_returns():
    rng = np.random.default_rng(3)
    back_at = BUSY_S + IDLE_S
    first = np.sort(rng.uniform(0.0, BUSY_S, 600))  # ~2 req/s
    again = np.sort(rng.uniform(back_at, back_at + AGAIN_S, 1800))
    # a cold start of 300 s: the planner alone would rather lose the returning requests than pay for a
    # replica that serves nothing for ten of its twenty steps; the activation rule starts one
    sc = scenario([pool(replicas=2, min_replicas=0, max_replicas=4, startup_warm_s=60.0, startup_cold_s=COLD_S)],
                  duration_s=back_at + AGAIN_S + 300.0)
    wl = workload(list(np.concatenate([first, again])), prompt=800, output=120, priority=1)
    run = run_closed_loop(sc, MpcPolicy(max_evaluations=600), seed=1, tick_s=15.0, workload=wl)
    ready = {round(p["t_s"]): p["pools"]["p8"]["replicas_ready"] for p in run.timeline}
    idle = [r for t, r in ready.items() if BUSY_S + 600.0 <= t < back_at]
    back = [r for t, r in ready.items() if back_at + COLD_S + 60.0 <= t < back_at + AGAIN_S]
    assert idle and max(idle) == 0, f"the idle pool should be at zero: {idle}"
    assert back and min(back) >= 1, f"the pool should serve again once traffic returns: {back}"
    # served: the first phase, and what returns once a replica is up (the requests sent during the
    # cold start may be shed or time out at the router; without the fix none of the second phase is)
    after_start = int((again >= back_at + COLD_S + 60.0).sum())
    assert run.summary["completed"] >= 0.98 * len(first) + 0.95 * after_start, run.summary
