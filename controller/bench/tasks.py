"""`governor bench tasks`: the picker's task book under hostile ids (issue 35).

Hostile clients: `--requests` requests (default 1,000,000), each with a task id never seen before (a random
32-hex-digit id, so the book sees a million distinct tasks), from `--tenants` distinct tenant ids (default 10,000:
more than the picker names, so most share `_other`), and one in `--bad-every` (default 100) with a header that
breaks the convention (a 4 KiB task id, a step that is not a number, a step past the expected count, a tenant id
with spaces: a real client's mistakes and an attacker's, in turn). Each request goes through what the picker's
edge does per request before any network: the headers parsed (`parse_identity`), then `Picker.route` with the
book's expiry and LRU, then `finish` (its step settled), on a picker of two pools of four replicas with its
defaults (`--max-tasks` 100,000, `--max-tenants` 64, step-aware).

Reported: the decision's time per request (parse + route + finish, perf_counter_ns around each: p50, p99,
p99.9, max in µs; the gRPC and Envoy hops are not in it: `governor bench dataplane` measures those), the book's
size and the tenants named at the end, the requests refused for their headers, and the process's resident memory
(psutil) at each tenth of the run: bounded means it stops growing once the book is full. Figures from a loaded
machine are the machine's: compare their ratios, not the absolute times.

Must not: touch the network; print anything but one JSON object on stdout with --json.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time

import numpy as np

from controller.dataplane.picker import Picker
from controller.dataplane.policy_store import PoolSettings, Settings
from controller.dataplane.task_book import (
    STEP_HEADER,
    STEPS_HEADER,
    TASK_HEADER,
    TENANT_HEADER,
    IdentityError,
    TaskBook,
    parse_identity,
)


def _bad(i: int) -> dict[str, str]:
    kinds = ({TASK_HEADER: "x" * 4096}, {TASK_HEADER: f"t{i}", STEP_HEADER: "first"},
             {TASK_HEADER: f"t{i}", STEP_HEADER: "7", STEPS_HEADER: "3"}, {TENANT_HEADER: "acme corp"})
    return kinds[i % len(kinds)]


def run_hostile(requests: int, tenants: int, bad_every: int, max_tasks: int, max_tenants: int,
                seed: int = 0) -> dict:
    import psutil

    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 2**63, size=(requests, 2), dtype=np.int64)
    tenant_of = rng.integers(0, tenants, size=requests)
    pools = {"a": [f"10.0.0.{i}:8000" for i in range(1, 5)], "b": [f"10.0.1.{i}:8000" for i in range(1, 5)]}
    picker = Picker({"g": ["a", "b"]}, book=TaskBook(max_tasks=max_tasks, max_tenants=max_tenants))
    for p, addrs in pools.items():
        picker.set_endpoints(p, addrs)
    settings = Settings({p: PoolSettings() for p in pools})
    proc = psutil.Process()
    lat = np.empty(requests, dtype=np.int64)
    rss: list[tuple[int, float]] = []
    refused = 0
    checkpoint = max(1, requests // 10)
    gc.collect()
    rss.append((0, proc.memory_info().rss / 2**20))
    sizes = [0]
    t_start = time.perf_counter()
    prompt = "system: you are an agent. " * 4
    for i in range(requests):
        if bad_every and i % bad_every == bad_every - 1:
            headers = _bad(i)
        else:
            headers = {TENANT_HEADER: f"tenant-{tenant_of[i]}", TASK_HEADER: f"{ids[i, 0]:016x}{ids[i, 1]:016x}",
                       STEP_HEADER: "0", STEPS_HEADER: "4"}
        t0 = time.perf_counter_ns()
        try:
            ident = parse_identity(headers.get)
        except IdentityError:
            ident = None
            refused += 1
        if ident is not None:
            r = picker.route("standard", prompt, settings, i * 1e-4, ident=ident, tokens=300.0)
            if r.endpoint is not None:
                picker.finish(r.endpoint, settings, r.ticket, ok=True)
        lat[i] = time.perf_counter_ns() - t0
        if (i + 1) % checkpoint == 0:
            rss.append((i + 1, proc.memory_info().rss / 2**20))
            sizes.append(len(picker.book))
    wall = time.perf_counter() - t_start
    us = lat / 1e3
    full_at = next((k for k, size in enumerate(sizes) if size >= max_tasks), None)
    after_full = [m for k, (_n, m) in enumerate(rss) if full_at is not None and k >= full_at]
    c = picker.book.counters
    return {
        "requests": requests, "distinct_task_ids": requests - refused, "tenant_ids": tenants,
        "refused_bad_header": refused, "max_tasks": max_tasks, "max_tenants": max_tenants,
        "book_size": len(picker.book), "tenants_named": len(picker.book.tenants),
        "tasks_started": c.count("started"), "tasks_evicted": c.count("evicted"),
        "decide_us": {"p50": float(np.percentile(us, 50)), "p99": float(np.percentile(us, 99)),
                      "p999": float(np.percentile(us, 99.9)), "max": float(us.max())},
        "rss_mib": [[n, round(m, 1)] for n, m in rss], "book_at_checkpoints": sizes,
        "rss_growth_after_full_mib": round(after_full[-1] - after_full[0], 1) if len(after_full) > 1 else None,
        "wall_s": round(wall, 2), "requests_per_s": round(requests / wall, 1),
    }


def cmd_bench_tasks(args: argparse.Namespace) -> int:
    if args.requests < 1 or args.tenants < 1 or args.bad_every < 0:
        print("governor bench tasks: --requests and --tenants must be >= 1, --bad-every >= 0", file=sys.stderr)
        return 2
    res: dict = {}
    if not args.skip_hostile:
        res["hostile"] = run_hostile(args.requests, args.tenants, args.bad_every, args.max_tasks, args.max_tenants,
                                     args.seed)
    if args.live:
        from controller.bench.tasks_live import run_live

        res["live"] = run_live(task_rate=args.task_rate, duration_s=args.duration, cap=args.cap, budget=args.budget,
                               hold_s=args.hold_timeout, think_s=args.think, slo_ttft_s=args.slo_ttft,
                               drain_s=args.drain, length_scale=args.length_scale, max_output=args.max_output,
                               seed=args.seed, tenants=not args.no_tenants, light_rate=args.light_rate,
                               steps=not args.tenants_only)
    if args.sim or args.sim_mpc:
        from controller.bench.tasks_sim import run_sim, run_sim_mpc

        try:
            loads = [float(x) for x in args.sim_loads.split(",")]
            seeds = [int(x) for x in args.sim_seeds.split(",")]
        except ValueError:
            print(f"governor bench tasks: --sim-loads takes numbers and --sim-seeds integers, comma-separated (got "
                  f"{args.sim_loads!r}, {args.sim_seeds!r})", file=sys.stderr)
            return 2
        if args.sim_replicas < 1 or not all(x > 0 for x in loads) or args.cap < 1 or args.sim_duration <= 0:
            print("governor bench tasks: --sim-replicas and --cap must be >= 1, --sim-loads and --sim-duration > 0",
                  file=sys.stderr)
            return 2
        common = dict(scenario=args.sim_scenario, replicas=args.sim_replicas, loads=loads, seeds=seeds, cap=args.cap,
                      budget=args.budget, hold_s=args.hold_timeout, duration_s=args.sim_duration)
        if args.sim:
            res["sim"] = run_sim(**common)
        if args.sim_mpc:
            res["sim_mpc"] = run_sim_mpc(**common)
    if args.json:
        print(json.dumps(res))
    elif "hostile" in res:
        h = res["hostile"]
        d = h["decide_us"]
        print(f"hostile ids: {h['requests']:,} requests ({h['refused_bad_header']:,} refused for their headers), "
              f"book {h['book_size']:,} of {h['max_tasks']:,}, {h['tenants_named']} tenants named")
        print(f"decide µs p50 {d['p50']:.1f}  p99 {d['p99']:.1f}  p99.9 {d['p999']:.1f}  max {d['max']:.0f}")
        print("rss MiB: " + ", ".join(f"{n:,}: {m}" for n, m in h["rss_mib"])
              + f"  (growth after the book filled: {h['rss_growth_after_full_mib']} MiB)")
    if "sim" in res and not args.json:
        for x in res["sim"]["summary"]:
            print(f"sim load x{x['load']:g}: completed tasks aware/blind {x['completed']['step_aware']}/"
                  f"{x['completed']['step_blind']} of {x['tasks']}, tasks per $ ratio {x['tasks_per_usd_ratio']:.2f}, "
                  f"GPU-s on failed tasks {x['wasted_gpu_s']['step_aware']:.0f}/{x['wasted_gpu_s']['step_blind']:.0f}")
    if "sim_mpc" in res and not args.json:
        for x in res["sim_mpc"]["summary"]:
            print(f"sim MPC load x{x['load']:g}: completed tasks profile/static {x['completed']['mpc_profile']}/"
                  f"{x['completed']['mpc_static']} of {x['tasks']}, tasks per $ ratio {x['tasks_per_usd_ratio']:.2f}, "
                  f"GPU-s on failed tasks {x['wasted_gpu_s']['mpc_profile']:.0f}/"
                  f"{x['wasted_gpu_s']['mpc_static']:.0f}, "
                  f"decisions step-aware {x['step_aware_share']['mpc_profile']:.0%}")
    return 0
