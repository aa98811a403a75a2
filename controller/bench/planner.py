"""`governor bench planner`: the MPC planner's time per tick for a 10-pool fleet on one core.

A 10-pool fleet (Llama-3-8B / 70B on A100 / H100, two route groups) gets synthetic telemetry
with a slowly varying, noisy load, so forecasts, corrections and plans move from tick to tick;
`MpcPolicy.decide` is timed per tick in CPU time (what one core spends; the process is pinned
to one CPU where the platform allows) and wall time. Prints p50/p95/p99/max and the number of
candidates scored per tick; `--json` prints one object (`cpu_p50_ms`, `cpu_p99_ms`,
`wall_p99_ms`, ...). Deterministic inputs (seed 0). Must not: touch the network or files.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from controller.types import (ClassObservation, Decision, FleetObservation, FleetSpec, PolicyInput, PoolDecision,
                              PoolObservation, PoolSpec, Reading, SloSpec)

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


def measure(n_pools: int = 10, ticks: int = 120) -> dict:
    from controller.policies.mpc import MpcPolicy

    if n_pools < 1 or ticks < 1:
        raise ValueError(f"need pools >= 1 and ticks >= 1 (got {n_pools}, {ticks})")
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    fleet = _fleet(n_pools)
    policy = MpcPolicy()
    rng = np.random.default_rng(0)
    state = policy.initial_state()
    current = Decision("d0", 0, 0.0, 120.0, pools={p.name: PoolDecision(6) for p in fleet.pools})
    cpu, wall, evals = [], [], []
    for k in range(ticks):
        t = 15.0 * (k + 1)
        inp = PolicyInput(now_s=t, observation=_observation(t, fleet, current, rng), fleet=fleet, current=current)
        c0, w0 = time.process_time(), time.perf_counter()
        state, out = policy.decide(state, inp, np.random.default_rng([0, k]))
        cpu.append(1e3 * (time.process_time() - c0))
        wall.append(1e3 * (time.perf_counter() - w0))
        evals.append(int(out.diagnostics.get("evaluations", 0)))
        current = Decision(f"d{k}", k, t, t + 120, pools=dict(out.pools), admission=dict(out.admission))
    cpu_a, wall_a = np.array(cpu), np.array(wall)
    return {"pools": n_pools, "ticks": ticks,
            "cpu_p50_ms": round(float(np.percentile(cpu_a, 50)), 1), "cpu_p95_ms": round(float(np.percentile(cpu_a, 95)), 1),
            "cpu_p99_ms": round(float(np.percentile(cpu_a, 99)), 1), "cpu_max_ms": round(float(cpu_a.max()), 1),
            "wall_p99_ms": round(float(np.percentile(wall_a, 99)), 1),
            "candidates_per_tick_median": int(np.median(evals)), "candidates_per_tick_max": int(max(evals)),
            "load_average_1m": round(os.getloadavg()[0], 2)}


def cmd_bench_planner(args: argparse.Namespace) -> int:
    try:
        out = measure(int(args.pools), int(args.ticks))
    except ValueError as exc:
        print(f"governor bench planner: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(out, sort_keys=True))
        return 0
    print(f"MPC planner, {out['pools']} pools, {out['ticks']} ticks, one core: CPU ms per tick p50 {out['cpu_p50_ms']}, "
          f"p95 {out['cpu_p95_ms']}, p99 {out['cpu_p99_ms']}, max {out['cpu_max_ms']}; wall p99 {out['wall_p99_ms']} ms; "
          f"candidates scored per tick median {out['candidates_per_tick_median']} (load average {out['load_average_1m']})")
    return 0
