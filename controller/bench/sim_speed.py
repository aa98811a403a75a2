"""`governor bench sim-speed`: how fast the simulator replays a scenario, and its peak memory.

The scenario is run as a *static 16-replica fleet* (no controller), so the figure
measures the plant alone and is comparable across scenarios: each pool's initial
replicas are rescaled so the fleet has 16 serving replicas in total (a single
pool gets all 16; several pools keep their proportions, at least 1 each), with
max_replicas raised where needed. Faults, SLOs and the trace are the scenario's.
The fleet used is printed (stderr in --json mode, and in the JSON as "fleet").

Output: one JSON object {"scenario", "requests", "sim_seconds", "wall_seconds",
"speedup", "peak_rss_mb", "fleet"} with --json, else a short table. wall_seconds
covers loading the trace, building the fleet and running it to the end;
peak_rss_mb is the process's peak resident set (ru_maxrss).

Must not: change the scenario file or write anywhere; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import sys

from controller.clock import WallClock
from controller.sim.scenario import Scenario, ScenarioError, load_scenario

FLEET_REPLICAS = 16
log = logging.getLogger("governor.bench.sim_speed")


def sixteen_replica_variant(scenario: Scenario, total: int = FLEET_REPLICAS) -> Scenario:
    """The scenario with its pools' initial replicas rescaled to `total` serving replicas."""
    pools = scenario.pools
    base = [max(p.replicas, 1) for p in pools]
    share = [b / sum(base) for b in base]
    counts = [max(1, int(round(total * s))) for s in share]
    # fix rounding so the fleet has exactly `total` (when there are at most `total` pools)
    while sum(counts) > total and max(counts) > 1:
        counts[counts.index(max(counts))] -= 1
    while sum(counts) < total:
        counts[counts.index(min(counts))] += 1
    new = [p.model_copy(update={"replicas": n, "min_replicas": min(p.min_replicas, n),
                                "max_replicas": max(p.max_replicas, n)}) for p, n in zip(pools, counts, strict=True)]
    return scenario.model_copy(update={"pools": new})


def describe_fleet(scenario: Scenario) -> str:
    return ", ".join(f"{p.name}: {p.replicas} x {p.model} on {p.sku} tp{p.tp} ({p.role})" for p in scenario.pools)


def measure(scenario: Scenario, seed: int | None = None) -> dict:
    """Build and run the fleet; return the figures."""
    from controller.sim.fleet import Fleet  # heavy import, only when measuring

    clock = WallClock()
    t0 = clock.monotonic_s()
    fleet = Fleet(scenario, seed=seed, record_requests=False)
    t1 = clock.monotonic_s()
    log.info("built the fleet in %.2f s (%d requests)", t1 - t0, len(fleet.workload))
    summary = fleet.run()
    t2 = clock.monotonic_s()
    wall = t2 - t0
    sim = float(fleet.now_s)
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return {
        "scenario": scenario.name,
        "requests": int(len(fleet.workload)),
        "sim_seconds": round(sim, 3),
        "wall_seconds": round(wall, 3),
        "speedup": round(sim / wall, 1) if wall > 0 else None,
        "peak_rss_mb": round(peak_kb / 1024.0, 1),
        "fleet": describe_fleet(scenario),
        "completed": summary.completed,
        "run_seconds": round(t2 - t1, 3),
    }


def cmd_bench_sim_speed(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    try:
        scenario = load_scenario(args.scenario)
    except ScenarioError as exc:
        print(f"governor bench sim-speed: {exc}", file=sys.stderr)
        return 2
    if args.rate_scale is not None:
        if not args.rate_scale > 0:
            print(f"governor bench sim-speed: --rate-scale {args.rate_scale} must be > 0", file=sys.stderr)
            return 2
        trace = scenario.trace.model_copy(update={"rate_scale": args.rate_scale})
        scenario = scenario.model_copy(update={"trace": trace})
    variant = sixteen_replica_variant(scenario)
    print(f"sim-speed: {scenario.name}: static fleet {describe_fleet(variant)}", file=sys.stderr)
    try:
        out = measure(variant, seed=args.seed)
    except (ValueError, FileNotFoundError) as exc:
        print(f"governor bench sim-speed: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(out))
        return 0
    cols = ("scenario", "requests", "sim_seconds", "wall_seconds", "speedup", "peak_rss_mb")
    widths = [max(len(c), len(str(out[c]))) for c in cols]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)))
    print("  ".join(str(out[c]).ljust(w) for c, w in zip(cols, widths, strict=True)))
    print(f"fleet: {out['fleet']}")
    return 0
