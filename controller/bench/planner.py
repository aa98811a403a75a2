"""`governor bench planner`: the MPC planner's time per tick and plan quality for a fleet of N pools on one core.

The fleet (`--pools N`, default 10) is made of regions of ten route groups, each one model spread over
pools of two or three SKUs (`ROUTE_GROUPS`: 23 pools a region; 100 pools = four regions and part of a
fifth). It gets synthetic telemetry with a slowly varying, noisy load (each region its own phase), so
forecasts, corrections and plans move from tick to tick; `MpcPolicy.decide` is timed per tick in CPU
time (what one core spends; the process is pinned to one CPU where the platform allows) and wall time.
Prints p50/p95/p99/max and the number of candidates scored per tick; `--json` prints one object
(`cpu_p50_ms`, `cpu_p99_ms`, `wall_p99_ms`, `objective_gap_p90`, `complete_cpu_p99_ms`,
`search_groups`, ...; with several pool counts `{"runs": [...]}`). Deterministic inputs (seed 0).
Must not: touch the network or files.

Two budgets. By default the search scores a fixed count of candidate rows (`MpcConfig.max_evaluations`,
as the bench replays do): the time shows what that search costs on this machine. With
`--budget-ms B` it runs as the daemon runs it, against a monotonic clock with a budget of B ms per tick
(`--clock wall`, the daemon's, or `--clock cpu`: this thread's CPU time, which other processes on a
loaded machine do not eat into): what varies is then how much search fits. Each tick (or every K-th,
`--reference-every`; by default every 4th from 20 pools, where the complete search takes seconds:
the output then says the reference is a sample) is also solved from the same state by the complete
search: every phase, no budget, the whole fleet as one search (`group_search` off), and
`objective_gap_*` reports how much worse the budgeted plan scored (J_budget / J_complete − 1; 0 = as
good, below 0 = better), `complete_*` what that complete search costs (CPU and wall ms per tick,
candidates). `search_groups` is the grouping the planner searched in on the last tick (the route
groups, largest spend first; empty below `MpcConfig.group_search_min_pools`). The state carried from
tick to tick is the budgeted search's. One untimed tick runs first (the process's first query compiles
or loads the planner's compiled loops, controller/core/mpc_kernel.py), then the heap is frozen as the
daemon freezes it after its first tick. With a budget the policy's own timing is summarised too, in the
budget's clock: what followed the search (`after_search_*`), the reserve it kept for it (`reserve_*`,
measured tick by tick: controller/policies/mpc/reserve.py, `reserve_basis` counts the ticks on the
first ticks' bound), the spill past the search's deadline and `ticks_over_budget`.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import sys
import time

import numpy as np

from controller.clock import BUDGET_CLOCKS, budget_timer
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

# A region's route groups: each spreads one model's traffic over pools of several SKUs,
# (model, ((SKU, GPUs per replica), ...), warm start s, cold start s). List prices per GPU-hour below.
ROUTE_GROUPS = (
    ("llama-3-8b", (("a100-80gb", 1), ("h100-80gb", 1), ("l40s-48gb", 1)), 20, 90),
    ("llama-3-70b", (("h100-80gb", 4), ("a100-80gb", 4)), 60, 300),
    ("qwen-2.5-7b", (("a100-80gb", 1), ("l40s-48gb", 1)), 20, 90),
    ("mistral-7b", (("l4-24gb", 1), ("a100-80gb", 1)), 20, 90),
    ("llama-3.1-70b", (("h100-80gb", 4), ("h200-141gb", 2)), 60, 300),
    ("mixtral-8x7b", (("h100-80gb", 2), ("a100-80gb", 2)), 40, 200),
    ("llama-3.1-8b", (("h100-80gb", 1), ("l40s-48gb", 1), ("l4-24gb", 1)), 20, 90),
    ("qwen-2.5-72b", (("h100-80gb", 4), ("mi300x-192gb", 1)), 60, 300),
    ("llama-2-7b", (("a100-80gb", 1), ("h100-80gb", 1)), 20, 90),
    ("llama-2-70b", (("a100-80gb", 4), ("h100-80gb", 4)), 60, 300),
)
USD_PER_GPU_HOUR = {"a100-80gb": 5.12, "h100-80gb": 12.29, "h200-141gb": 14.5, "l40s-48gb": 3.2, "l4-24gb": 1.4,
                    "mi300x-192gb": 9.8}
SLOS = {"critical": SloSpec(2.5, 0.1), "standard": SloSpec(5.0, 0.15), "sheddable": SloSpec(10.0, 0.3)}
CLASS_SHARES = (("critical", 0.2), ("standard", 0.6), ("sheddable", 0.2))
RPS_PER_POOL = 6.0  # the synthetic load's mean, per pool of the fleet


def _fleet(n_pools: int) -> FleetSpec:
    """n pools in regions of the ten route groups above (23 pools a region), filled in order: 10 pools
    are region 0's first four groups and one pool of the fifth; 100 pools four regions and eight pools
    of a fifth. A route group is one model in one region."""
    pools: list[PoolSpec] = []
    region = 0
    while len(pools) < n_pools:
        for model, skus, warm, cold in ROUTE_GROUPS:
            for sku, tp in skus:
                if len(pools) == n_pools:
                    break
                pools.append(PoolSpec(f"r{region}-{model}-{sku}", model, sku, gpus_per_replica=tp,
                                      usd_per_replica_hour=round(tp * USD_PER_GPU_HOUR[sku], 2), min_replicas=1,
                                      max_replicas=32, startup_warm_s=warm, startup_cold_s=cold,
                                      group=f"r{region}-{model}"))
        region += 1
    return FleetSpec(pools=tuple(pools), slos=SLOS)


def _observation(t: float, fleet: FleetSpec, current: Decision, rng: np.random.Generator) -> FleetObservation:
    """A slowly varying, noisy load: each region's own daily-like swing (phase by region), shared
    evenly by its pools."""
    noise = 1 + 0.05 * rng.standard_normal()
    pools = {}
    total = 0.0
    for p in fleet.pools:
        region = int(p.group.split("-", 1)[0][1:])
        rps = RPS_PER_POOL * (1.0 + 0.4 * np.sin(t / 600.0 + 0.7 * region)) * noise
        total += rps
        ready = current.pools[p.name].replicas
        per = rps / max(ready, 1)
        pools[p.name] = PoolObservation(
            pool=p.name, replicas_ready=Reading(float(ready)), replicas_starting=Reading(0.0),
            arrival_rps=Reading(rps), running=Reading(per * 20 * ready), waiting=Reading(0.0),
            kv_usage_frac=Reading(0.3), hit_rate=Reading(0.3), ttft_p95_s=Reading(0.4 + 0.1 * per),
            ttft_p50_s=Reading(0.2), tpot_p95_s=Reading(0.04 + 0.01 * per), tpot_p50_s=Reading(0.03),
            prompt_tokens_rps=Reading(rps * 1100), generation_tokens_rps=Reading(rps * 210))
    classes = {c: ClassObservation(priority_class=c, arrival_rps=Reading(total * s), retry_rps=Reading(0.0),
                                   shed_rps=Reading(0.0), ttft_p95_s=Reading(0.6), tpot_p95_s=Reading(0.07))
               for c, s in CLASS_SHARES}
    return FleetObservation(at_s=t, pools=pools, classes=classes, source="bench")


COMPLETE_EVALUATIONS = 10**7  # rows: enough that no phase of the search is cut


def reference_every(n_pools: int) -> int:
    """Ticks between two complete searches by default: every tick below 20 pools; beyond, the complete
    search (which grows as the square of the pools: ~1 s of CPU at 40, ~7 s at 100) every 4th tick."""
    return 1 if n_pools < 20 else 4


def _pcts(xs: list[float], name: str) -> dict[str, float]:
    a = np.array(xs)
    out = {f"{name}_p{q}_ms": round(float(np.percentile(a, q)), 1) for q in (50, 95, 99)}
    out[f"{name}_max_ms"] = round(float(a.max()), 1)
    return out


def _timing(timings: list[dict], budget_ms: float | None) -> dict:
    """With a budget, the policy's own timing per tick (its diagnostics, in the budget's clock): what
    followed the search, the reserve it kept for it (measured, controller/policies/mpc/reserve.py), how
    far the search ran past its deadline, and the ticks over the budget."""
    if not timings or budget_ms is None:
        return {}
    out: dict = {}
    for key in ("after_search", "reserve", "spill"):
        a = np.array([t[f"{key}_ms"] for t in timings])
        out.update({f"{key}_p50_ms": round(float(np.percentile(a, 50)), 1),
                    f"{key}_p99_ms": round(float(np.percentile(a, 99)), 1), f"{key}_max_ms": round(float(a.max()), 1)})
    out["search_over_deadline_max_ms"] = round(max(t["search_over_deadline_ms"] for t in timings), 1)
    out["reserve_basis"] = {b: sum(1 for t in timings if t["reserve_basis"] == b)
                            for b in sorted({t["reserve_basis"] for t in timings})}
    out["ticks_over_budget"] = sum(1 for t in timings if t["tick_ms"] > budget_ms)
    return out


def measure(n_pools: int = 10, ticks: int = 120, budget_ms: float | None = None, clock: str = "wall",
            every: int | None = None) -> dict:
    from controller.policies.mpc import MpcPolicy

    if n_pools < 1 or ticks < 1:
        raise ValueError(f"need pools >= 1 and ticks >= 1 (got {n_pools}, {ticks})")
    if budget_ms is not None and not (math.isfinite(budget_ms) and 25.0 <= budget_ms <= 10_000.0):
        raise ValueError(f"--budget-ms must be between 25 and 10000 (got {budget_ms:g})")
    if clock not in BUDGET_CLOCKS:
        raise ValueError(f"--clock must be one of {', '.join(BUDGET_CLOCKS)} (got {clock!r})")
    every = reference_every(n_pools) if every is None else every
    if every < 1:
        raise ValueError(f"--reference-every must be >= 1 (got {every})")
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    fleet = _fleet(n_pools)
    complete = MpcPolicy(max_evaluations=COMPLETE_EVALUATIONS, planner={"group_search": False})
    timer = budget_timer(clock)
    policy = MpcPolicy() if budget_ms is None else MpcPolicy(timer=timer, time_budget_s=budget_ms / 1e3)
    rng = np.random.default_rng(0)
    state = policy.initial_state()
    current = Decision("d0", 0, 0.0, 120.0, pools={p.name: PoolDecision(6) for p in fleet.pools})
    # One untimed tick first: the process's first query compiles or loads the planner's compiled
    # loops (controller/core/mpc_kernel.py), a once-per-process cost, not a tick's.
    warm_inp = PolicyInput(now_s=0.0, observation=_observation(0.0, fleet, current, np.random.default_rng(1)),
                           fleet=fleet, current=current)
    policy.decide(state, warm_inp, np.random.default_rng(1))
    # ... and, as the daemon does after its first tick (controller/runtime/loop.py, settle_heap), what the
    # process holds for its lifetime is frozen out of the collector's full passes
    gc.collect()
    gc.freeze()
    cpu, wall, evals, gaps, c_cpu, c_wall, c_evals = [], [], [], [], [], [], []
    timings: list[dict] = []
    groups: list[list[str]] = []
    for k in range(ticks):
        t = 15.0 * (k + 1)
        inp = PolicyInput(now_s=t, observation=_observation(t, fleet, current, rng), fleet=fleet, current=current)
        before = state
        c0, w0 = time.process_time(), time.perf_counter()
        state, out = policy.decide(before, inp, np.random.default_rng([0, k]))
        cpu.append(1e3 * (time.process_time() - c0))
        wall.append(1e3 * (time.perf_counter() - w0))
        evals.append(int(out.diagnostics.get("evaluations", 0)))
        if "timing" in out.diagnostics:
            timings.append(out.diagnostics["timing"])
        groups = [list(g) for g in out.diagnostics.get("search_groups", [])]
        if k % every == 0:
            # the same tick from the same state (states are immutable), searched to completion
            c0, w0 = time.process_time(), time.perf_counter()
            _, ref = complete.decide(before, inp, np.random.default_rng([0, k]))
            c_cpu.append(1e3 * (time.process_time() - c0))
            c_wall.append(1e3 * (time.perf_counter() - w0))
            c_evals.append(int(ref.diagnostics.get("evaluations", 0)))
            gaps.append(float(out.diagnostics["objective"]) / float(ref.diagnostics["objective"]) - 1.0)
        current = Decision(f"d{k}", k, t, t + 120, pools=dict(out.pools), admission=dict(out.admission))
    res: dict = {"pools": n_pools, "ticks": ticks, "budget": "rows" if budget_ms is None else clock,
                 "budget_ms": budget_ms, **_pcts(cpu, "cpu"), **_pcts(wall, "wall"),
                 "candidates_per_tick_median": int(np.median(evals)), "candidates_per_tick_max": int(max(evals)),
                 "candidates_per_tick_min": int(min(evals)), "load_average_1m": round(os.getloadavg()[0], 2)}
    g = np.array(gaps)
    res.update({"objective_gap_median": round(float(np.median(g)), 5),
                "objective_gap_p90": round(float(np.percentile(g, 90)), 5),
                "objective_gap_max": round(float(g.max()), 5)})
    cc = np.array(c_cpu)
    res.update({"complete_cpu_p50_ms": round(float(np.percentile(cc, 50)), 1),
                "complete_cpu_p99_ms": round(float(np.percentile(cc, 99)), 1),
                "complete_cpu_max_ms": round(float(cc.max()), 1),
                "complete_wall_p99_ms": round(float(np.percentile(np.array(c_wall), 99)), 1),
                "complete_candidates_per_tick_median": int(np.median(c_evals)),
                # the complete search every `every` ticks (a sample when > 1): the gap is over those ticks
                "reference": {"search": "complete", "every": every, "ticks": len(gaps), "sampled": every > 1},
                **_timing(timings, budget_ms),
                "route_groups": len({p.group for p in fleet.pools}),
                "search_groups": groups, "search_group_sizes": sorted((len(x) for x in groups), reverse=True)})
    return res


def _print(out: dict, budget: float | None) -> None:
    how = "fixed candidate count" if budget is None else f"{out['budget']} budget {budget:g} ms"
    print(f"MPC planner, {out['pools']} pools in {out['route_groups']} route groups, {out['ticks']} ticks, one core, "
          f"{how}: CPU ms per tick p50 {out['cpu_p50_ms']}, p99 {out['cpu_p99_ms']}, max {out['cpu_max_ms']}; wall "
          f"p50 {out['wall_p50_ms']}, p99 {out['wall_p99_ms']} ms; candidates scored per tick median "
          f"{out['candidates_per_tick_median']} (load average {out['load_average_1m']})")
    ref = out["reference"]
    which = (f"every {ref['every']} ticks ({ref['ticks']} ticks, a sample: the complete search is too slow to run "
             f"every tick)" if ref["sampled"] else "every tick")
    print(f"objective against the complete search from the same state, {which}: median "
          f"{100 * out['objective_gap_median']:+.2f} %, p90 {100 * out['objective_gap_p90']:+.2f} %, max "
          f"{100 * out['objective_gap_max']:+.2f} %; candidates per tick {out['candidates_per_tick_min']}-"
          f"{out['candidates_per_tick_max']}")
    print(f"the complete search: CPU ms per tick p50 {out['complete_cpu_p50_ms']}, p99 "
          f"{out['complete_cpu_p99_ms']}, max {out['complete_cpu_max_ms']}; wall p99 {out['complete_wall_p99_ms']} ms; "
          f"candidates per tick median {out['complete_candidates_per_tick_median']}")
    if "after_search_p99_ms" in out:
        print(f"in the budget's clock ({out['budget']}): after the search p50 {out['after_search_p50_ms']}, p99 "
              f"{out['after_search_p99_ms']}, max {out['after_search_max_ms']} ms; reserve kept for it p50 "
              f"{out['reserve_p50_ms']}, p99 {out['reserve_p99_ms']} ms (ticks by basis: "
              f"{', '.join(f'{k} {v}' for k, v in out['reserve_basis'].items())}); the search's last batch past "
              f"its deadline by at most {out['search_over_deadline_max_ms']} ms; ticks over the budget: "
              f"{out['ticks_over_budget']} of {out['ticks']}")
    sizes = out["search_group_sizes"]
    print("searched as one fleet" if not sizes else
          f"searched in {len(sizes)} groups (the route groups) of {', '.join(str(x) for x in sizes)} pools")


def cmd_bench_planner(args: argparse.Namespace) -> int:
    budget = getattr(args, "budget_ms", None)
    try:
        counts = [int(x) for x in str(args.pools).split(",") if x.strip()]
        if not counts:
            raise ValueError(f"--pools: no pool count in {args.pools!r}")
        outs = [measure(n, int(args.ticks), None if budget is None else float(budget),
                        clock=getattr(args, "clock", "wall"), every=getattr(args, "reference_every", None))
                for n in counts]
    except ValueError as exc:
        print(f"governor bench planner: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(outs[0] if len(outs) == 1 else {"runs": outs}, sort_keys=True))
        return 0
    for out in outs:
        _print(out, budget)
    return 0
