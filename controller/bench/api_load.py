"""`governor bench api-load` (`make loadtest`): the PolicyService under load while the daemon ticks, with the
picker serving its bench rate beside it.

Why: an operator's dashboards and scripts poll the API, and overrides change while the fleet is governed. The
API shares the daemon's process (and GIL) with the tick loop, so a busy API must neither slow a tick past its
period nor make the loop skip one, and it must answer every call.

Setup, each part in its own process so that none competes for another's GIL (2 cores here, shared):
- the daemon: `governor run --demo --headless --for D` (the embedded simulated fleet, ticking every 3 s,
  PolicyService on a loopback port);
- the data plane of `governor bench dataplane` (controller/bench/dataplane.py `DataplaneRig`: simulated
  replicas, `governor picker`, Envoy) driven through Envoy at `--picker-rate` (the dataplane bench's default
  rate, 500 req/s) from a child process;
- this process: a grpc.aio client, open loop, for `--duration` seconds:
  - `--rps` reads, round robin over GetStatus, ListDecisions (limit 20), ListOverrides and ListAudit
    (limit 20);
  - `--write-rps` override changes: each pair is a SetOverride (a `max_replicas` ceiling at the largest value
    the API accepts, so it changes the store, the audit trail and every explain record but never the fleet)
    and, 2 / write-rps seconds later, the DeleteOverride of it.

Bounded: exactly rps × duration reads and write-rps × duration changes are scheduled; each call has a
`CALL_TIMEOUT_S` deadline; at most `MAX_INFLIGHT` calls wait at once (a call due while that many wait is not
sent and counted in `not_sent`); the daemon stops itself (`--for`), and every child is stopped on the way out.

Output (one JSON object with --json): per RPC kind the calls, p50/p99 latency (ms) and errors (by status code);
`errors` and `not_sent` in total; the daemon's `ticks` in the window, `tick_overruns` (ticks whose
read + step + actuate + learn, from each decision's recorded `durations_ms`, exceeded the tick interval),
`tick_max_ms`, `skipped_ticks` and `tick_errors` (its `governor_ticks_total{result=...}`); and the picker's
requests, errors (any status but 200 through Envoy), pick latency p50/p99 (its own histogram) and achieved rate.
Must not: listen anywhere but 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from collections import defaultdict
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import grpc
import numpy as np

from controller.api.store import MAX_REPLICAS_VALUE
from controller.bench.dataplane import DataplaneRig, _metric_sum, _open_loop, _scrape, histogram_quantile
from controller.dataplane.child import GovernorChild
from controller.gen.governor.v1 import policy_pb2 as ppb
from controller.gen.governor.v1 import policy_pb2_grpc as ppb_grpc

TICK_INTERVAL_S = 3.0  # the demo daemon's tick period (controller/runtime/main.py demo_settings)
CALL_TIMEOUT_S = 5.0  # per call: longer than a tick, so a call stuck behind one tick still counts as late, not lost
MAX_INFLIGHT = 512  # ~0.5 s of calls at 1,000/s: a daemon that stalls longer than that sheds the client's load
START_TIMEOUT_S = 90.0  # every part started (processes, Envoy, the daemon's first tick) on a loaded 2-core machine
READ_KINDS = ("GetStatus", "ListDecisions", "ListOverrides", "ListAudit")
PICKER_BENCH_RATE = 500.0  # `governor bench dataplane`'s default --rate (controller/cli.py)


@dataclass
class Calls:
    """Latencies and failures of one RPC kind."""

    latencies_s: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    samples: list[str] = field(default_factory=list)  # the first few error messages, for the report

    def fail(self, code: str, detail: str) -> None:
        self.errors[code] += 1
        if len(self.samples) < 3:
            self.samples.append(f"{code}: {detail[:200]}")

    def summary(self) -> dict[str, Any]:
        lat = np.asarray(self.latencies_s) * 1000
        return {"calls": len(self.latencies_s) + sum(self.errors.values()),
                "p50_ms": round(float(np.percentile(lat, 50)), 3) if lat.size else None,
                "p99_ms": round(float(np.percentile(lat, 99)), 3) if lat.size else None,
                "errors": dict(self.errors), "error_samples": self.samples}


class ApiLoad:
    """The bounded open-loop client of the PolicyService."""

    def __init__(self, address: str, pools: list[str], *, rps: float, write_rps: float, duration_s: float) -> None:
        self.address = address
        self.pools = pools
        self.rps = rps
        self.write_rps = write_rps
        self.duration_s = duration_s
        self.calls: dict[str, Calls] = defaultdict(Calls)
        self.not_sent = 0
        self._inflight = 0

    async def _call(self, kind: str, fn, request) -> Any:
        t = time.perf_counter()
        try:
            resp = await fn(request, timeout=CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            self.calls[kind].fail(exc.code().name, exc.details() or "")
            return None
        self.calls[kind].latencies_s.append(time.perf_counter() - t)
        return resp

    async def _read(self, stub: ppb_grpc.PolicyServiceStub, i: int) -> None:
        kind = READ_KINDS[i % len(READ_KINDS)]
        if kind == "GetStatus":
            await self._call(kind, stub.GetStatus, ppb.GetStatusRequest())
        elif kind == "ListDecisions":
            await self._call(kind, stub.ListDecisions, ppb.ListDecisionsRequest(limit=20))
        elif kind == "ListOverrides":
            await self._call(kind, stub.ListOverrides, ppb.ListOverridesRequest())
        else:
            await self._call(kind, stub.ListAudit, ppb.ListAuditRequest(limit=20))

    async def _change_pair(self, stub: ppb_grpc.PolicyServiceStub, j: int, clear_at: float) -> None:
        o = ppb.Override(kind=ppb.OVERRIDE_KIND_MAX_REPLICAS, pool=self.pools[j % len(self.pools)],
                         value=MAX_REPLICAS_VALUE, ttl_s=600, author="loadtest", reason=f"api-load change {j}")
        stored = await self._call("SetOverride", stub.SetOverride, ppb.SetOverrideRequest(override=o))
        wait = clear_at - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)  # the schedule of the clear
        if stored is not None:
            resp = await self._call("DeleteOverride", stub.DeleteOverride,
                                    ppb.DeleteOverrideRequest(id=stored.id, author="loadtest"))
            if resp is not None and not resp.deleted:
                self.calls["DeleteOverride"].fail("NOT_DELETED", f"{stored.id} was not found")

    def _launch(self, coro, tasks: list[asyncio.Task]) -> None:
        if self._inflight >= MAX_INFLIGHT:
            coro.close()
            self.not_sent += 1
            return
        self._inflight += 1
        task = asyncio.ensure_future(coro)

        def done(_t: asyncio.Task) -> None:
            self._inflight -= 1

        task.add_done_callback(done)
        tasks.append(task)

    async def run(self) -> float:
        """Send the whole schedule; returns the wall seconds it took (in-flight calls included)."""
        n_reads = round(self.rps * self.duration_s)
        n_pairs = round(self.write_rps * self.duration_s / 2)  # a pair is two changes: set, then clear
        events = [(i / self.rps, "r", i) for i in range(n_reads)]
        events += [(2 * j / self.write_rps, "w", j) for j in range(n_pairs)]
        events.sort()
        tasks: list[asyncio.Task] = []
        async with grpc.aio.insecure_channel(self.address) as ch:
            stub = ppb_grpc.PolicyServiceStub(ch)
            await stub.GetStatus(ppb.GetStatusRequest(), timeout=CALL_TIMEOUT_S)  # connected before the clock starts
            t0 = time.monotonic()
            for at, what, k in events:
                wait = t0 + at - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)  # the open loop's schedule
                if what == "r":
                    self._launch(self._read(stub, k), tasks)
                else:
                    self._launch(self._change_pair(stub, k, t0 + at + 1.0 / self.write_rps), tasks)
            await asyncio.wait_for(asyncio.gather(*tasks), CALL_TIMEOUT_S * 3)
            return time.monotonic() - t0


def process_cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system) process `pid` has used, from /proc (None where there is no /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime (proc(5) fields 14, 15)


def _cpu_delta(before: float | None, after: float | None) -> float | None:
    return None if before is None or after is None else round(after - before, 2)


# ----------------------------------------------------------------------------- the picker's side (a child process)


def picker_load(conn, rate: float, duration_s: float) -> None:
    """Child process: start the dataplane rig, say "ready", wait for "go", drive it for `duration_s`, send the
    result."""
    # terminate() from the parent: unwind (the rig stops its processes) instead of dying with them orphaned
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    try:
        with DataplaneRig((0.7, 0.3), duration_s + START_TIMEOUT_S) as rig:
            asyncio.run(_open_loop([rig.envoy], min(200, max(1, round(rate))), rate, 10))  # warm-up: connections
            conn.send({"event": "ready"})
            if not conn.poll(START_TIMEOUT_S) or conn.recv() != "go":
                return
            before = rig.pick_buckets()
            pids = {"picker": rig.picker.proc.pid, "envoy": rig.envoy_pid, "replicas": rig.sim_pid,
                    "driver": os.getpid()}
            cpu0 = {k: process_cpu_s(p) for k, p in pids.items()}
            phase = asyncio.run(_open_loop([rig.envoy], max(1, round(rate * duration_s)), rate, 10))
            cpu1 = {k: process_cpu_s(p) for k, p in pids.items()}
            after = rig.pick_buckets()
            errors = sum(1 for s in phase.statuses if s != 200)
            conn.send({"event": "result", "requests": len(phase.statuses), "errors": errors,
                       "statuses": {str(s): phase.statuses.count(s) for s in sorted(set(phase.statuses))},
                       "pick_latency_p50_ms": round(histogram_quantile(0.5, before, after) * 1000, 3),
                       "pick_latency_p99_ms": round(histogram_quantile(0.99, before, after) * 1000, 3),
                       "client_p50_ms": phase.pct_ms(50), "client_p99_ms": phase.pct_ms(99),
                       "rps": round(len(phase.statuses) / phase.wall_s, 1), "target_rps": rate,
                       "cpu_s": {k: _cpu_delta(cpu0[k], cpu1[k]) for k in pids}})
    except Exception as exc:  # noqa: BLE001 - whatever failed is reported to the parent, which fails the run
        conn.send({"event": "error", "error": f"{type(exc).__name__}: {exc}"})


class _PickerSide:
    def __init__(self, rate: float, duration_s: float) -> None:
        ctx = mp.get_context("spawn")  # a fresh interpreter: no threads or gRPC state inherited from this one
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=picker_load, args=(child, rate, duration_s), name="api-load-picker",
                                daemon=True)
        self.proc.start()

    def wait(self, event: str, timeout_s: float) -> dict:
        if not self.conn.poll(timeout_s):
            raise RuntimeError(f"the picker's side sent no {event!r} within {timeout_s:g} s")
        msg = self.conn.recv()
        if msg.get("event") == "error":
            raise RuntimeError(f"the picker's side failed: {msg['error']}")
        if msg.get("event") != event:
            raise RuntimeError(f"the picker's side sent {msg!r}, expected {event!r}")
        return msg

    def stop(self) -> None:
        if self.proc.is_alive():
            self.proc.terminate()  # its DataplaneRig children are stopped by the rig's exit (SIGTERM → finally)
            self.proc.join(15)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)


# ----------------------------------------------------------------------------- the daemon's side


class _Daemon:
    """`governor run --demo --headless` as a child; its stdout lines (tick events) are collected by a thread."""

    def __init__(self, run_for_s: float) -> None:
        self.child = GovernorChild(["run", "--demo", "--headless", "--for", f"{run_for_s:g}"])
        self.info = self.child.info
        self.ticks = 0
        self._first_tick = threading.Event()
        self._reader = threading.Thread(target=self._read, name="daemon-stdout", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.child.proc.stdout is not None
        for line in self.child.proc.stdout:
            if line.startswith('{"event": "tick"'):
                self.ticks += 1
                self._first_tick.set()

    def wait_first_tick(self, timeout_s: float) -> None:
        if not self._first_tick.wait(timeout_s):
            raise RuntimeError(f"the daemon did not tick within {timeout_s:g} s")

    def ticks_by_result(self) -> dict[str, float]:
        text = _scrape(self.info["metrics"])
        return {r: _metric_sum(text, f'governor_ticks_total{{result="{r}"}}')
                for r in ("decided", "paused", "skipped", "error")}

    def stop(self) -> None:
        self.child.stop()


def _tick_durations(address: str, since_unix_s: float) -> list[float]:
    """read + step + actuate + learn (ms) of every decision the daemon recorded since `since_unix_s`."""
    out = []
    with grpc.insecure_channel(address) as ch:
        stub = ppb_grpc.PolicyServiceStub(ch)
        rows = stub.ListDecisions(ppb.ListDecisionsRequest(limit=1000, since_unix_s=since_unix_s), timeout=10)
        for d in rows.decisions:
            rec = json.loads(stub.ExplainDecision(ppb.ExplainDecisionRequest(decision_id=d.decision_id),
                                                  timeout=10).json)
            out.append(sum(float(v) for v in (rec.get("durations_ms") or {}).values()))
    return out


def run_api_load(*, duration_s: float, rps: float, write_rps: float, picker_rate: float) -> dict[str, Any]:
    with ExitStack() as stack:
        picker = None
        if picker_rate > 0:
            picker = _PickerSide(picker_rate, duration_s)
            stack.callback(picker.stop)
        daemon = _Daemon(run_for_s=duration_s + START_TIMEOUT_S + 30)
        stack.callback(daemon.stop)
        daemon.wait_first_tick(START_TIMEOUT_S)
        if picker is not None:
            picker.wait("ready", START_TIMEOUT_S)
        address = daemon.info["policy_api"]
        with grpc.insecure_channel(address) as ch:
            status = ppb_grpc.PolicyServiceStub(ch).GetStatus(ppb.GetStatusRequest(), timeout=CALL_TIMEOUT_S)
        pools = [p.pool for p in status.pools]
        load = ApiLoad(address, pools, rps=rps, write_rps=write_rps, duration_s=duration_s)
        ticks_before = daemon.ticks_by_result()
        cpu0 = process_cpu_s(daemon.child.proc.pid), process_cpu_s(os.getpid())
        load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
        since = time.time()
        print(f"api-load: {rps:g} reads/s and {write_rps:g} changes/s for {duration_s:g} s against {address}"
              + (f", the picker at {picker_rate:g} req/s" if picker else ""), file=sys.stderr)
        if picker is not None:
            picker.conn.send("go")
        wall_s = asyncio.run(load.run())
        cpu1 = process_cpu_s(daemon.child.proc.pid), process_cpu_s(os.getpid())
        ticks_after = daemon.ticks_by_result()
        durations = _tick_durations(address, since)
        picker_result = picker.wait("result", duration_s + START_TIMEOUT_S) if picker is not None else None
    kinds = {k: c.summary() for k, c in sorted(load.calls.items())}
    errors = sum(sum(c["errors"].values()) for c in kinds.values())
    delta = {r: int(ticks_after[r] - ticks_before[r]) for r in ticks_after}
    reads = sum(kinds[k]["calls"] for k in READ_KINDS if k in kinds)
    changes = sum(kinds[k]["calls"] for k in ("SetOverride", "DeleteOverride") if k in kinds)
    out: dict[str, Any] = {
        "duration_s": duration_s, "wall_s": round(wall_s, 2),
        "target_rps": rps, "target_write_rps": write_rps,
        "reads": reads, "changes": changes,
        "read_rps": round(reads / wall_s, 1), "write_rps": round(changes / wall_s, 1),
        "errors": errors, "not_sent": load.not_sent, "rpcs": kinds,
        "tick_interval_s": TICK_INTERVAL_S, "ticks": delta["decided"] + delta["paused"],
        "tick_overruns": sum(1 for ms in durations if ms > TICK_INTERVAL_S * 1000),
        "tick_max_ms": round(max(durations), 1) if durations else None,
        "tick_p50_ms": round(float(np.percentile(durations, 50)), 1) if durations else None,
        "skipped_ticks": delta["skipped"], "tick_errors": delta["error"],
        # CPU seconds over the window: the daemon (ticking + answering) and this client; with /proc only
        "cpu_s": {"daemon": _cpu_delta(cpu0[0], cpu1[0]), "api_client": _cpu_delta(cpu0[1], cpu1[1])},
        "load_avg_1m_before": None if load_before is None else round(load_before, 2),
        "picker": None,
    }
    if picker_result is not None:
        out["picker"] = {k: v for k, v in picker_result.items() if k != "event"}
    return out


def cmd_bench_api_load(args: argparse.Namespace) -> int:
    bad = []
    if not (math.isfinite(args.duration) and 0 < args.duration <= 3600):
        bad.append(f"--duration {args.duration:g}: must be in (0, 3600] seconds")
    if not (math.isfinite(args.rps) and 0 < args.rps <= 20_000):
        bad.append(f"--rps {args.rps:g}: must be in (0, 20000]")
    if not (math.isfinite(args.write_rps) and 0 <= args.write_rps <= 1000):
        bad.append(f"--write-rps {args.write_rps:g}: must be in [0, 1000]")
    if not (math.isfinite(args.picker_rate) and 0 <= args.picker_rate <= 10_000):
        bad.append(f"--picker-rate {args.picker_rate:g}: must be in [0, 10000] (0 = no picker)")
    if bad:
        for b in bad:
            print(f"governor bench api-load: {b}", file=sys.stderr)
        return 2
    try:
        out = run_api_load(duration_s=args.duration, rps=args.rps, write_rps=args.write_rps,
                           picker_rate=args.picker_rate)
    except (RuntimeError, OSError, grpc.RpcError) as exc:
        print(f"governor bench api-load: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k:16s} {json.dumps(v) if isinstance(v, dict) else v}")
    return 0
