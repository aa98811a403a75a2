"""`governor bench planner`: the MPC planner's time per tick for a 10-pool fleet on one core.

A 10-pool fleet (Llama-3-8B / 70B on A100 / H100, two route groups) gets synthetic telemetry
with a slowly varying, noisy load, so forecasts, corrections and plans move from tick to tick;
`MpcPolicy.decide` is timed per tick in CPU time (what one core spends; the process is pinned
to one CPU where the platform allows) and wall time. Prints p50/p95/p99/max and the number of
candidates scored per tick; `--json` prints one object (`cpu_p50_ms`, `cpu_p99_ms`,
`wall_p99_ms`, `objective_gap_p90`, `complete_cpu_p99_ms`, ...). Deterministic inputs (seed 0).
Must not: touch the network or files.

Two budgets. By default the search scores a fixed count of candidate rows (`MpcConfig.max_evaluations`,
as the bench replays do): the time shows what that search costs on this machine. With
`--budget-ms B` it runs as the daemon runs it, against a monotonic wall clock with a budget of B ms
per tick: the time is then bounded by construction and what varies is how much search fits. Either
way each tick is also solved from the same state by the search run to completion (every phase, no
budget), and `objective_gap_*` reports how much worse the budgeted plan scored (J_budget /
J_complete − 1; 0 = as good), `complete_*` what that complete search costs (CPU and wall ms per
tick, candidates): where it fits the budget, the planner need not cut its search at all. The state
carried from tick to tick is the budgeted search's. One untimed tick runs first (the process's first
query compiles or loads the planner's compiled loops, controller/core/mpc_kernel.py).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import numpy as np

from controller.types import (
    ClassObservation,
    Decision,
    FleetObservation,
    FleetSpec,
    PolicyInput,
    PoolDecision,
    PoolObservation,
    PoolSpec,
    Reading,
    SloSpec,
)

# (model, SKU, GPUs per replica, $/replica-hour, warm start s, cold start s)
KINDS = (("llama-3-8b", "a100-80gb", 1, 5.12, 20, 90), ("llama-3-8b", "h100-80gb", 1, 12.29, 20, 90),
         ("llama-3-70b", "h100-80gb", 4, 49.16, 60, 300), ("llama-3-70b", "a100-80gb", 4, 20.48, 60, 300))
SLOS = {"critical": SloSpec(2.5, 0.1), "standard": SloSpec(5.0, 0.15), "sheddable": SloSpec(10.0, 0.3)}
CLASS_SHARES = (("critical", 0.2), ("standard", 0.6), ("sheddable", 0.2))


def _fleet(n_pools: int) -> FleetSpec:
    pools = []
    for k in range(n_pools):
        m, sku, tp, price, warm, cold = KINDS[k % len(KINDS)]
        pools.append(PoolSpec(f"p{k}", m, sku, gpus_per_replica=tp, usd_per_replica_hour=price, min_replicas=1,
                              max_replicas=32, startup_warm_s=warm, startup_cold_s=cold, group=f"g{k % 2}"))
    return FleetSpec(pools=tuple(pools), slos=SLOS)


def _observation(t: float, fleet: FleetSpec, current: Decision, rng: np.random.Generator) -> FleetObservation:
    base = 60.0 * (1.0 + 0.4 * np.sin(t / 600.0)) * (1 + 0.05 * rng.standard_normal())
    pools = {}
    for p in fleet.pools:
        ready = current.pools[p.name].replicas
        rps = base / len(fleet.pools)
        per = rps / max(ready, 1)
        pools[p.name] = PoolObservation(
            pool=p.name, replicas_ready=Reading(float(ready)), replicas_starting=Reading(0.0),
            arrival_rps=Reading(rps), running=Reading(per * 20 * ready), waiting=Reading(0.0),
            kv_usage_frac=Reading(0.3), hit_rate=Reading(0.3), ttft_p95_s=Reading(0.4 + 0.1 * per),
            ttft_p50_s=Reading(0.2), tpot_p95_s=Reading(0.04 + 0.01 * per), tpot_p50_s=Reading(0.03),
            prompt_tokens_rps=Reading(rps * 1100), generation_tokens_rps=Reading(rps * 210))
    classes = {c: ClassObservation(priority_class=c, arrival_rps=Reading(base * s), retry_rps=Reading(0.0),
                                   shed_rps=Reading(0.0), ttft_p95_s=Reading(0.6), tpot_p95_s=Reading(0.07))
               for c, s in CLASS_SHARES}
    return FleetObservation(at_s=t, pools=pools, classes=classes, source="bench")


COMPLETE_EVALUATIONS = 10**7  # rows: enough that no phase of the search is cut


def measure(n_pools: int = 10, ticks: int = 120, budget_ms: float | None = None) -> dict:
    from controller.policies.mpc import MpcPolicy

    if n_pools < 1 or ticks < 1:
        raise ValueError(f"need pools >= 1 and ticks >= 1 (got {n_pools}, {ticks})")
    if budget_ms is not None and not (math.isfinite(budget_ms) and 25.0 <= budget_ms <= 10_000.0):
        raise ValueError(f"--budget-ms must be between 25 and 10000 (got {budget_ms:g})")
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    fleet = _fleet(n_pools)
    complete = MpcPolicy(max_evaluations=COMPLETE_EVALUATIONS)
    policy = MpcPolicy() if budget_ms is None else MpcPolicy(timer=time.perf_counter, time_budget_s=budget_ms / 1e3)
    rng = np.random.default_rng(0)
    state = policy.initial_state()
    current = Decision("d0", 0, 0.0, 120.0, pools={p.name: PoolDecision(6) for p in fleet.pools})
    # One untimed tick first: the process's first query compiles or loads the planner's compiled
    # loops (controller/core/mpc_kernel.py), a once-per-process cost, not a tick's.
    warm_inp = PolicyInput(now_s=0.0, observation=_observation(0.0, fleet, current, np.random.default_rng(1)),
                           fleet=fleet, current=current)
    complete.decide(state, warm_inp, np.random.default_rng(1))
    cpu, wall, evals, gaps, c_cpu, c_wall, c_evals = [], [], [], [], [], [], []
    for k in range(ticks):
        t = 15.0 * (k + 1)
        inp = PolicyInput(now_s=t, observation=_observation(t, fleet, current, rng), fleet=fleet, current=current)
        before = state
        c0, w0 = time.process_time(), time.perf_counter()
        state, out = policy.decide(before, inp, np.random.default_rng([0, k]))
        cpu.append(1e3 * (time.process_time() - c0))
        wall.append(1e3 * (time.perf_counter() - w0))
        evals.append(int(out.diagnostics.get("evaluations", 0)))
        # the same tick from the same state (states are immutable), searched to completion
        c0, w0 = time.process_time(), time.perf_counter()
        _, ref = complete.decide(before, inp, np.random.default_rng([0, k]))
        c_cpu.append(1e3 * (time.process_time() - c0))
        c_wall.append(1e3 * (time.perf_counter() - w0))
        c_evals.append(int(ref.diagnostics.get("evaluations", 0)))
        gaps.append(float(out.diagnostics["objective"]) / float(ref.diagnostics["objective"]) - 1.0)
        current = Decision(f"d{k}", k, t, t + 120, pools=dict(out.pools), admission=dict(out.admission))
    cpu_a, wall_a = np.array(cpu), np.array(wall)
    res = {"pools": n_pools, "ticks": ticks, "budget": "rows" if budget_ms is None else "wall",
           "budget_ms": budget_ms,
           "cpu_p50_ms": round(float(np.percentile(cpu_a, 50)), 1),
           "cpu_p95_ms": round(float(np.percentile(cpu_a, 95)), 1),
           "cpu_p99_ms": round(float(np.percentile(cpu_a, 99)), 1), "cpu_max_ms": round(float(cpu_a.max()), 1),
           "wall_p99_ms": round(float(np.percentile(wall_a, 99)), 1), "wall_max_ms": round(float(wall_a.max()), 1),
           "candidates_per_tick_median": int(np.median(evals)), "candidates_per_tick_max": int(max(evals)),
           "load_average_1m": round(os.getloadavg()[0], 2)}
    g = np.array(gaps)
    res.update({"candidates_per_tick_min": int(min(evals)),
                "objective_gap_median": round(float(np.median(g)), 5),
                "objective_gap_p90": round(float(np.percentile(g, 90)), 5),
                "objective_gap_max": round(float(g.max()), 5)})
    cc = np.array(c_cpu)
    res.update({"complete_cpu_p50_ms": round(float(np.percentile(cc, 50)), 1),
                "complete_cpu_p99_ms": round(float(np.percentile(cc, 99)), 1),
                "complete_cpu_max_ms": round(float(cc.max()), 1),
                "complete_wall_p99_ms": round(float(np.percentile(np.array(c_wall), 99)), 1),
                "complete_candidates_per_tick_median": int(np.median(c_evals))})
    return res


def cmd_bench_planner(args: argparse.Namespace) -> int:
    budget = getattr(args, "budget_ms", None)
    try:
        out = measure(int(args.pools), int(args.ticks), None if budget is None else float(budget))
    except ValueError as exc:
        print(f"governor bench planner: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(out, sort_keys=True))
        return 0
    how = "fixed candidate count" if budget is None else f"wall budget {budget:g} ms"
    print(f"MPC planner, {out['pools']} pools, {out['ticks']} ticks, one core, {how}: CPU ms per tick p50 "
          f"{out['cpu_p50_ms']}, p95 {out['cpu_p95_ms']}, p99 {out['cpu_p99_ms']}, max {out['cpu_max_ms']}; wall p99 "
          f"{out['wall_p99_ms']} ms; candidates scored per tick median {out['candidates_per_tick_median']} "
          f"(load average {out['load_average_1m']})")
    print(f"objective against the search run to completion from the same state: median "
          f"{100 * out['objective_gap_median']:+.2f} %, p90 {100 * out['objective_gap_p90']:+.2f} %, max "
          f"{100 * out['objective_gap_max']:+.2f} %; candidates per tick {out['candidates_per_tick_min']}-"
          f"{out['candidates_per_tick_max']}")
    print(f"the search run to completion: CPU ms per tick p50 {out['complete_cpu_p50_ms']}, p99 "
          f"{out['complete_cpu_p99_ms']}, max {out['complete_cpu_max_ms']}; wall p99 {out['complete_wall_p99_ms']} ms; "
          f"candidates per tick median {out['complete_candidates_per_tick_median']}")
    return 0
