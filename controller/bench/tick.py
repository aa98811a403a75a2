"""`governor bench tick`: the daemon's per-tick overhead for a large fleet (read + step + actuate).

Setup, all on loopback:
- a real HTTP server in a child process serves canned vLLM V1 /metrics for
  `replicas` engines in `pools` pools (rendered once by the simulator's vLLM
  collector; counters and histogram series grow by one tick's worth of traffic on
  every scrape, gauges stay), plus the router's /metrics;
- `ScrapeSource` (controller/telemetry/scrape.py) reads all of them every tick; or, with
  `--source prometheus`, a real Prometheus scrapes them every `--scrape-interval` s
  (default 10, production-like) and evaluates Governor's recording rules
  (controller/telemetry/rules.py) as often, and `PrometheusSource` reads the recorded
  series with one query (`--no-recording-rules`: the ~25 raw queries instead);
- the pure `Controller` steps with the slo-feedback policy (cheap on purpose: this
  measures the plumbing, not a planner's search), or with `--policy mpc` the MPC on the planner
  bench's fleet of regions and route groups (controller/bench/planner.py), its search bounded as in
  the daemon by a wall-clock budget (`--budget-ms`, `--clock cpu` for this thread's CPU time);
  `--one-core` pins the daemon's side to one CPU once the fleet's side (the /metrics server,
  Prometheus) is running, as on a machine where those are elsewhere;
- `GrpcActuator` sends each decision to a small in-process gRPC fake fleet
  (RouterControl + AutoscalerControl that ack with control.proto's generation rules).

Ticks run back to back on a virtual clock (15 s of fleet time each; through
Prometheus, on the wall clock and 0.1 s apart, so that they meet its scrapes and
rule evaluations) and each phase is timed with the wall clock's monotonic time, and with this thread's
CPU time (`thread_cpu_*`: what the tick costs a core, whatever else the machine runs). Output: p50/p99
of the whole tick and p99 per phase in ms, and the process RSS (MB), as a table or one JSON object
(`tick_p50_ms`, `tick_p99_ms`, `rss_mb`, `phases_p99_ms`, `thread_cpu_p99_ms`, ...). The server runs in
another process so its rendering does not compete with the measured process for
the GIL (as a real fleet's exporters would not). Must not: listen anywhere but 127.0.0.1.
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing
import os
import sys
import threading
import time
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np

from controller.clock import VirtualClock, WallClock, budget_timer
from controller.types import FleetSpec, PoolSpec, SloSpec

TICK_S = 15.0
PROMETHEUS_SCRAPE_S = 10.0  # a production-like scrape and rule-evaluation interval (production: 10-30 s)
PROMETHEUS_WINDOW_S = 60.0  # the default telemetry.window_s, which the shipped rules are generated for
PROMETHEUS_PACE_S = 0.1  # pause between ticks through Prometheus (see measure)
MODEL_NAME = "meta-llama/Meta-Llama-3-8B-Instruct"


# --------------------------------------------------------------------------- the /metrics server (child process)


_SCALED_SUFFIXES = ("_total", "_bucket", "_count", "_sum")


def canned_template(text: str) -> list[tuple[str, float | None, bool]]:
    """Split exposition text into (line or series, value, grows) entries.

    Counter and histogram series (…_total, _bucket, _count, _sum) grow linearly with the
    scrape number, gauges stay, comments are kept as they are (value None).
    """
    out: list[tuple[str, float | None, bool]] = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            out.append((line, None, False))
            continue
        series, _, value = line.rpartition(" ")
        name = series.split("{", 1)[0]
        out.append((series, float(value), name.endswith(_SCALED_SUFFIXES)))
    return out


def render_canned(template: list[tuple[str, float | None, bool]], n: int) -> bytes:
    """The text at scrape n: growing series × n (one tick's traffic per scrape)."""
    lines = [series if v is None else f"{series} {v * n if grows else v!r}" for series, v, grows in template]
    return ("\n".join(lines) + "\n").encode()


def _replica_text(i: int, n_pools: int, rng: np.random.Generator) -> str:
    """One replica's /metrics after one tick (15 s) of ~2 req/s, rendered by the simulator's vLLM collector."""
    from prometheus_client import CollectorRegistry, generate_latest

    from controller.sim.exposition import ReplicaCollector
    from controller.sim.stats import ReplicaStats

    s = ReplicaStats(replica_id=f"r{i}", pool=f"pool-{i % n_pools}", model_name=MODEL_NAME, node_id=f"node-{i // 8}",
                     gpu_indices=(i % 8,), num_gpu_blocks=20000, block_size=16, gpu_memory_utilization=0.9)
    n = int(rng.integers(20, 40))
    s.num_requests_running = int(rng.integers(4, 24))
    s.num_requests_waiting = int(rng.integers(0, 6))
    s.kv_cache_usage_perc = float(rng.uniform(0.2, 0.8))
    s.prefix_cache_queries = n * 1000.0
    s.prefix_cache_hits = n * 300.0
    s.prompt_tokens = n * 1000.0
    s.generation_tokens = n * 200.0
    s.request_success["stop"] = float(n)
    for _ in range(3):
        s.ttft_s.observe(float(rng.uniform(0.05, 1.5)), n / 3)
        s.itl_s.observe(float(rng.uniform(0.01, 0.08)), n * 60.0)
        s.tpot_s.observe(float(rng.uniform(0.01, 0.08)), n / 3)
        s.e2e_s.observe(float(rng.uniform(1.0, 12.0)), n / 3)
        s.queue_time_s.observe(float(rng.uniform(0.0, 0.5)), n / 3)
    reg = CollectorRegistry(auto_describe=False)
    reg.register(ReplicaCollector(s))
    return generate_latest(reg).decode()


def _serve(n_replicas: int, n_pools: int, ready: Any, port_out: Any, stop: Any) -> None:
    """Child process: serve canned /r/<i>/metrics for every replica and /router/metrics until `stop` is set."""
    from prometheus_client import CollectorRegistry, generate_latest

    from controller.sim.exposition import RouterCollector
    from controller.sim.stats import RouterStats

    rng = np.random.default_rng(0)
    templates = [canned_template(_replica_text(i, n_pools, rng)) for i in range(n_replicas)]
    scrapes = [0] * n_replicas
    router_reg = CollectorRegistry(auto_describe=False)
    router_reg.register(RouterCollector(RouterStats(model_name=MODEL_NAME)))
    router_body = generate_latest(router_reg)
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            parts = self.path.strip("/").split("/")
            if parts[0] == "router":
                body = router_body
            elif parts[0] == "r" and len(parts) == 3 and parts[1].isdigit() and int(parts[1]) < n_replicas:
                i = int(parts[1])
                with lock:
                    scrapes[i] += 1
                    n = scrapes[i]
                body = render_canned(templates[i], n)
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    port_out.value = server.server_address[1]
    t = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    ready.set()
    stop.wait(3600.0)  # bounded: the parent sets it when done
    server.shutdown()


# --------------------------------------------------------------------------- the gRPC fake fleet (in process)


def _fake_fleet(pools: set[str]):
    """RouterControl + AutoscalerControl on 127.0.0.1 that apply newer generations and ack (control.proto rules)."""
    import grpc

    from controller.gen.governor.v1 import control_pb2, control_pb2_grpc

    class _Gate:
        def __init__(self) -> None:
            self.generation = 0
            self.decision_id = ""
            self.lock = threading.Lock()

        def ack(self, meta) -> control_pb2.Ack:
            with self.lock:
                if meta.generation < self.generation or (meta.generation == self.generation
                                                         and meta.decision_id != self.decision_id):
                    return control_pb2.Ack(status=control_pb2.ACK_STATUS_STALE_GENERATION,
                                           applied_generation=self.generation)
                if meta.generation == self.generation:
                    return control_pb2.Ack(status=control_pb2.ACK_STATUS_REPLAY, applied_generation=self.generation)
                self.generation, self.decision_id = meta.generation, meta.decision_id
                return control_pb2.Ack(status=control_pb2.ACK_STATUS_APPLIED, applied_generation=self.generation)

    class Router(control_pb2_grpc.RouterControlServicer):
        def __init__(self) -> None:
            self.gate = _Gate()

        def ApplyRoutingPolicy(self, request, context):  # noqa: N802 - gRPC method name
            if any(p.pool not in pools for p in request.pools):
                return control_pb2.Ack(status=control_pb2.ACK_STATUS_INVALID, message="unknown pool")
            return self.gate.ack(request.meta)

    class Autoscaler(control_pb2_grpc.AutoscalerControlServicer):
        def __init__(self) -> None:
            self.gate = _Gate()

        def ApplyScalingPlan(self, request, context):  # noqa: N802 - gRPC method name
            if any(p.pool not in pools for p in request.pools):
                return control_pb2.Ack(status=control_pb2.ACK_STATUS_INVALID, message="unknown pool")
            return self.gate.ack(request.meta)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    control_pb2_grpc.add_RouterControlServicer_to_server(Router(), server)
    control_pb2_grpc.add_AutoscalerControlServicer_to_server(Autoscaler(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"127.0.0.1:{port}"


# --------------------------------------------------------------------------- the measurement


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q)) if xs else float("nan")


POLICIES = ("slo-feedback", "mpc")


def _tick_fleet(pools: int, replicas: int, policy: str) -> FleetSpec:
    """slo-feedback: `pools` Llama-3-8B A100 pools in one route group (what the plumbing needs). mpc: the
    planner bench's fleet of regions and route groups (controller/bench/planner.py), each pool allowed up
    to 4× its share of the replicas: the planner's cost depends on the route groups it searches."""
    per_pool = replicas // pools
    slos = {"critical": SloSpec(2.5, 0.1), "standard": SloSpec(5.0, 0.15), "sheddable": SloSpec(10.0, 0.3)}
    if policy == "mpc":
        from dataclasses import replace

        from controller.bench.planner import _fleet

        grouped = _fleet(pools)
        return replace(grouped, pools=tuple(replace(p, max_replicas=4 * per_pool) for p in grouped.pools), slos=slos)
    return FleetSpec(
        pools=tuple(PoolSpec(name=f"pool-{k}", model="llama-3-8b", sku="a100-80gb", usd_per_replica_hour=2.0,
                             min_replicas=1, max_replicas=4 * per_pool) for k in range(pools)),
        slos=slos)


def measure(pools: int, replicas: int, ticks: int, source_kind: str = "scrape", *, recording_rules: bool = True,
            scrape_interval_s: float = PROMETHEUS_SCRAPE_S, policy: str = "slo-feedback",
            budget_ms: float | None = None, budget_clock: str = "wall", one_core: bool = False) -> dict[str, Any]:
    """Run the bench; `recording_rules` and `scrape_interval_s` apply to `source_kind="prometheus"` only;
    `budget_ms` and `budget_clock` to the MPC's search (default: its own 200 ms, on the wall clock as in
    the daemon; "cpu": this thread's CPU time, which other processes on a loaded machine do not eat)."""
    if source_kind not in ("scrape", "prometheus"):
        raise ValueError(f"source: {source_kind!r} is not one of ['scrape', 'prometheus']")
    if policy not in POLICIES:
        raise ValueError(f"policy: {policy!r} is not one of {list(POLICIES)}")
    budget_timer(budget_clock)  # a bad name fails here, before anything starts
    if budget_ms is not None and not (25.0 <= budget_ms <= 10_000.0):
        raise ValueError(f"budget: {budget_ms:g} ms is outside [25, 10000]")
    if not 1 <= scrape_interval_s <= 60:
        raise ValueError(f"scrape interval: {scrape_interval_s:g} s is outside [1, 60]")
    if pools < 1 or replicas < pools or ticks < 1:
        raise ValueError(f"need pools >= 1, replicas >= pools and ticks >= 1 (got {pools}, {replicas}, {ticks})")
    fleet = _tick_fleet(pools, replicas, policy)
    names = [p.name for p in fleet.pools]
    ctx = multiprocessing.get_context("fork")
    ready, stop = ctx.Event(), ctx.Event()
    port = ctx.Value("i", 0)
    proc = ctx.Process(target=_serve, args=(replicas, pools, ready, port, stop), daemon=True)
    proc.start()  # fork before gRPC is imported or any thread exists in this process

    import psutil

    from controller.actuation.grpc_actuator import GrpcActuator
    from controller.core.step import Controller, TickInput
    from controller.policies.registry import build_policy
    from controller.telemetry.scrape import ScrapeSource
    from controller.telemetry.source import ScrapeTarget

    grpc_server = None
    source = actuator = prom = None
    tmp = None
    queries_per_read = 0
    try:
        if not ready.wait(30.0):
            raise RuntimeError("the /metrics server did not start within 30 s")
        base = f"http://127.0.0.1:{port.value}"
        targets = [ScrapeTarget(f"{base}/r/{i}/metrics", names[i % pools], "vllm") for i in range(replicas)]
        targets.append(ScrapeTarget(f"{base}/router/metrics", "", "router"))
        if source_kind == "scrape":
            source = ScrapeSource(names, targets=targets, timeout_s=5.0, window_s=60.0, stale_after_s=3600.0)
        else:
            prom, tmp, source = _prometheus_source(names, base, replicas, pools, recording_rules, scrape_interval_s)
            queries_per_read = 1 if recording_rules else len(source.queries)
        if one_core and hasattr(os, "sched_setaffinity"):
            # the daemon's side on one CPU from here (this thread and those it starts: the policy, the
            # gRPC actuation); the fleet's side started above (the exporters' process, Prometheus) is not
            os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
        params: dict[str, Any] = {}
        if policy == "mpc":  # as the daemon builds it (runtime/main.py): the search bounded by a clock
            params["timer"] = budget_timer(budget_clock)
            if budget_ms is not None:
                params["time_budget_s"] = budget_ms / 1e3
        controller = Controller(fleet, build_policy(policy, fleet, params), seed=0, tick_s=TICK_S)
        grpc_server, address = _fake_fleet(set(names))
        vclock = VirtualClock(1_000_000.0)
        actuator = GrpcActuator(address, address, clock=vclock, call_timeout_s=5.0)
        wall = WallClock()
        state = controller.initial_state()
        phases: dict[str, list[float]] = {"read": [], "step": [], "actuate": []}
        cpu: dict[str, list[float]] = {"read": [], "step": [], "actuate": [], "tick": []}
        totals: list[float] = []
        failures = 0
        warmup = min(3, ticks)
        for k in range(ticks + warmup):
            if prom is not None and k > 0:
                # Through Prometheus, pace the ticks so that they span its scrapes and rule evaluations
                # (back to back, 200 ticks would fit between two of them and never meet that load).
                time.sleep(PROMETHEUS_PACE_S)
            # Prometheus stamps samples with wall time; staleness is judged against it
            now = vclock.advance(TICK_S) if prom is None else wall.now_s()
            t0, c0 = wall.monotonic_s(), time.thread_time()
            obs = source.read(now)
            t1, c1 = wall.monotonic_s(), time.thread_time()
            state, result = controller.step(state, TickInput(now_s=now, observation=obs))
            t2, c2 = wall.monotonic_s(), time.thread_time()
            outcome = actuator.apply(result.decision) if result.decision is not None else None
            t3, c3 = wall.monotonic_s(), time.thread_time()
            if k < warmup:
                if k == warmup - 1:  # as the daemon after its first tick (controller/runtime/loop.py, settle_heap)
                    gc.collect()
                    gc.freeze()
                continue  # connection set-up and first-window effects are not steady state
            failures += int(outcome is not None and not outcome.ok)
            phases["read"].append(1000 * (t1 - t0))
            phases["step"].append(1000 * (t2 - t1))
            phases["actuate"].append(1000 * (t3 - t2))
            totals.append(1000 * (t3 - t0))
            # this thread's CPU per phase: what the tick costs a core, whatever else runs beside it
            for name, dt in (("read", c1 - c0), ("step", c2 - c1), ("actuate", c3 - c2), ("tick", c3 - c0)):
                cpu[name].append(1000 * dt)
        rss_mb = psutil.Process().memory_info().rss / 2**20
        pools_seen = sum(1 for p in obs.pools.values() if p.replicas_ready.ok)
        return {
            "pools": pools, "replicas": replicas, "ticks": ticks,
            "tick_p50_ms": round(_pct(totals, 50), 2), "tick_p99_ms": round(_pct(totals, 99), 2),
            "tick_max_ms": round(max(totals), 2),
            "thread_cpu_p50_ms": {k: round(_pct(v, 50), 2) for k, v in cpu.items()},
            "thread_cpu_p99_ms": {k: round(_pct(v, 99), 2) for k, v in cpu.items()},
            "phases_p50_ms": {k: round(_pct(v, 50), 2) for k, v in phases.items()},
            "phases_p99_ms": {k: round(_pct(v, 99), 2) for k, v in phases.items()},
            "read_p99_ms": round(_pct(phases["read"], 99), 2), "step_p99_ms": round(_pct(phases["step"], 99), 2),
            "actuate_p99_ms": round(_pct(phases["actuate"], 99), 2),
            "rss_mb": round(rss_mb, 1), "actuation_failures": failures, "pools_observed": pools_seen,
            "replicas_observed": int(sum(p.replicas_ready.value for p in obs.pools.values() if p.replicas_ready.ok)),
            "policy": policy, "source": source_kind, "one_core": one_core,
            **({"budget_ms": budget_ms, "budget_clock": budget_clock,
                "route_groups": len({p.group for p in fleet.pools})} if policy == "mpc" else {}),
            **({"recording_rules": recording_rules, "scrape_interval_s": scrape_interval_s,
                "queries_per_read": queries_per_read, "pace_s": PROMETHEUS_PACE_S,
                "read_errors": list(obs.errors[:3])}
               if prom is not None else {"page_lines_kept_frac": _kept_fraction(source)}),
        }
    finally:
        if prom is not None:
            prom.stop()
        if tmp is not None:
            tmp.cleanup()
        if actuator is not None:
            actuator.close()
        if source is not None:
            source.close()
        if grpc_server is not None:
            grpc_server.stop(0).wait()
        stop.set()
        proc.join(10.0)
        if proc.is_alive():
            proc.terminate()
            proc.join(5.0)


def _prometheus_source(names: list[str], base: str, replicas: int, pools: int, recording_rules: bool,
                       scrape_interval_s: float):
    """A real Prometheus scraping the canned endpoints every `scrape_interval_s` (pool as a target label) and
    evaluating Governor's recording rules as often, and the daemon's PrometheusSource reading it (the
    recorded series with one query, or the raw queries); waits until what it reads exists for every pool."""
    import tempfile
    from pathlib import Path

    from controller.bench.prometheus_server import PrometheusServer, wait_until
    from controller.telemetry import rules
    from controller.telemetry.prometheus import PrometheusSource

    host = base.removeprefix("http://")
    tmp = tempfile.TemporaryDirectory(prefix="governor-bench-tick-")
    rules_path = Path(tmp.name) / "governor-rules.yml"
    rules_path.write_text(rules.render_rules_yaml("pool", PROMETHEUS_WINDOW_S))
    interval = f"{scrape_interval_s:g}s"
    # One job per replica path is what Prometheus needs (metrics_path is per job); group by pool.
    prom = PrometheusServer(Path(tmp.name), static_targets={}, scrape_interval=interval, rule_files=[rules_path],
                            extra_jobs=[{"job_name": f"r{i}", "metrics_path": f"/r/{i}/metrics",
                                         "static_configs": [{"targets": [host], "labels": {
                                             "pool": names[i % pools], "instance": f"replica-{i}"}}]}
                                        for i in range(replicas)]
                            + [{"job_name": "router", "metrics_path": "/router/metrics",
                                "static_configs": [{"targets": [host]}]}])
    ready = (f"count({rules.record_name('prompt_tokens_rps', PROMETHEUS_WINDOW_S)})" if recording_rules
             else f"count(count by (pool) (rate(vllm:prompt_tokens_total[{PROMETHEUS_WINDOW_S:g}s])))")
    try:
        wait_until(lambda: (r := prom.query(ready)) and int(float(r[0]["value"][1])) == pools,
                   deadline_s=30 + 4 * scrape_interval_s, interval_s=0.5,
                   what="Prometheus to have rates for every pool")
    except BaseException:
        prom.stop()
        tmp.cleanup()
        raise
    source = PrometheusSource(names, url=prom.url, timeout_s=10.0, window_s=PROMETHEUS_WINDOW_S,
                              stale_after_s=120.0, recording_rules=recording_rules)
    return prom, tmp, source


def _kept_fraction(source) -> float | None:
    """Share of /metrics lines the scrape source kept after filtering (None if it does not filter)."""
    stats = getattr(source, "filter_stats", None)
    if not stats or not stats[1]:
        return None
    return round(stats[0] / stats[1], 3)


def cmd_bench_tick(args: argparse.Namespace) -> int:
    try:
        budget = getattr(args, "budget_ms", None)
        out = measure(int(args.pools), int(args.replicas), int(args.ticks), getattr(args, "source", "scrape"),
                      recording_rules=not getattr(args, "no_recording_rules", False),
                      scrape_interval_s=float(getattr(args, "scrape_interval", PROMETHEUS_SCRAPE_S)),
                      policy=getattr(args, "policy", "slo-feedback"),
                      budget_ms=None if budget is None else float(budget),
                      budget_clock=getattr(args, "clock", "wall"), one_core=getattr(args, "one_core", False))
    except (ValueError, RuntimeError) as exc:
        print(f"governor bench tick: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(out, sort_keys=True))
        return 0
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"tick overhead: {out['replicas']} replicas in {out['pools']} pools, {out['ticks']} ticks "
                    f"(policy {out['policy']}, read via {out['source']})")
    for c in ("phase", "p50 ms", "p99 ms"):
        t.add_column(c, justify="left" if c == "phase" else "right")
    for k in ("read", "step", "actuate"):
        t.add_row(k, f"{out['phases_p50_ms'][k]:.2f}", f"{out['phases_p99_ms'][k]:.2f}")
    t.add_row("[b]tick", f"[b]{out['tick_p50_ms']:.2f}", f"[b]{out['tick_p99_ms']:.2f}")
    Console().print(t)
    print(f"RSS {out['rss_mb']:.0f} MB; observed {out['replicas_observed']} replicas in {out['pools_observed']} pools; "
          f"{out['actuation_failures']} actuation failures")
    if out["source"] == "prometheus":
        how = "recorded series (1 query)" if out["recording_rules"] else f"{out['queries_per_read']} raw queries"
        print(f"read via Prometheus: {how}; scrape and rule evaluation every {out['scrape_interval_s']:g} s; "
              f"ticks {out['pace_s']:g} s apart")
    return 0
