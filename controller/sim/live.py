"""Live fleet: the simulator served on loopback so the daemon and Prometheus see a vLLM fleet.

`LiveFleet` advances a `Fleet` in real time × speed on a background thread and
serves what a real fleet serves:

- one HTTP server per replica whose engine is up, with `/metrics` (vLLM names, or SGLang's for a
  pool with `engine.exposition: sglang`) and the engine's OpenAI-compatible API (`/v1/completions`,
  `/v1/chat/completions`, `/health`, `/v1/models`: openai_api.py), so real traffic can reach it
  through a real proxy (a new port when a replica becomes ready, closed when it is drained away or
  crashes; a replica
  still starting serves nothing, like a vLLM server loading weights), one per
  GPU node (DCGM exporter names) and one for the router (llm-d EPP names), which
  also serves `/sd`: Prometheus HTTP service discovery listing every current target;
- gRPC `governor.v1.RouterControl` and `governor.v1.AutoscalerControl` (plus the
  standard gRPC health service), with the command semantics of
  protos/governor/v1/control.proto, implemented by `ControlPlane` (control_plane.py).

The HTTP server is http_endpoint.py; this module wires them to a Fleet and holds
`governor sim` (`cmd_sim`).

One re-entrant lock guards the Fleet: the advance thread, every scrape and every
gRPC call take it, so a scrape never sees a half-processed event. This module is
an edge: it reads the wall clock only through a `Clock`, and it must not model
the fleet itself (that is `controller.sim.fleet`).
"""

from __future__ import annotations

import json
import logging
import math
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry

from controller.clock import Clock, WallClock
from controller.sim.control_plane import ControlPlane, GrpcEndpoint, serve_control
from controller.sim.exposition import NodeCollector, ReplicaCollector, RouterCollector
from controller.sim.exposition_sglang import SglangReplicaCollector
from controller.sim.http_endpoint import HttpEndpoint, metrics_route
from controller.sim.openai_api import ApiError, Progress, ReplicaApi, ReplicaSink, read_body, send_json
from controller.sim.scenario import Scenario, ScenarioError, load_scenario

if TYPE_CHECKING:
    from controller.sim.engine import Replica
    from controller.sim.fleet import Fleet

log = logging.getLogger(__name__)

K8S_NAMESPACE = "governor-sim"


@dataclass
class _Target:
    endpoint: HttpEndpoint
    labels: dict[str, str]


# =========================================================================== live fleet


class LiveFleet:
    """A Fleet run in real time × `speed`, served on `host` (metrics over HTTP, control over gRPC).

    `start()` returns the listening info (see `listening()`); `stop()` shuts every
    server down and stops the clock. `error` holds the exception if the advance
    thread died (the servers keep serving the last state).
    """

    def __init__(self, scenario: Scenario | str | Path, *, speed: float = 1.0, host: str = "127.0.0.1",
                 seed: int | None = None, clock: Clock | None = None, step_wall_s: float = 0.05) -> None:
        if not (math.isfinite(speed) and speed > 0):
            raise ValueError(f"speed: {speed!r} must be a finite number > 0 (simulated seconds per wall second)")
        if not (0 < step_wall_s <= 0.1):
            raise ValueError(f"step_wall_s: {step_wall_s!r} must be in (0, 0.1]")
        self.scenario = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
        self.speed = float(speed)
        self.host = host
        self.seed = seed
        self.clock: Clock = clock or WallClock()
        self.step_wall_s = step_wall_s
        self.lock = threading.RLock()
        self.fleet: Fleet | None = None
        self.plane: ControlPlane | None = None
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._targets_lock = threading.Lock()
        self._replicas: dict[str, _Target] = {}
        self._nodes: dict[str, _Target] = {}
        self._node_collectors: dict[str, NodeCollector] = {}
        self._router: HttpEndpoint | None = None
        self._grpc: tuple[GrpcEndpoint, GrpcEndpoint] | None = None
        self.progress = Progress()  # bumped after every advance: the HTTP API's streams wait on it
        self._served: dict[str, int] = {}
        self._unix0 = 0.0
        self._mono0 = 0.0
        self._sim0 = 0.0
        self._finished_logged = False
        self._started = False
        self._stopped = False

    # ------------------------------------------------------------------ time

    def sim_to_unix(self, t_s: float) -> float:
        """Unix time at which the simulated time `t_s` is (or was) reached: 1 sim s = 1/speed wall s."""
        return self._unix0 + (t_s - self._sim0) / self.speed

    def _target_sim_s(self) -> float:
        return self._sim0 + (self.clock.monotonic_s() - self._mono0) * self.speed

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> dict:
        if self._started:
            raise RuntimeError("LiveFleet.start() called twice")
        self._started = True
        from controller.sim.fleet import Fleet  # the engine; imported here so the control plane loads without it

        self.fleet = Fleet(self.scenario, seed=self.seed, record_requests=False)
        self._sim0 = float(self.fleet.now_s)
        self._unix0 = self.clock.now_s()
        self._mono0 = self.clock.monotonic_s()
        self.plane = ControlPlane(self.fleet, self.lock, self.clock, self.sim_to_unix)
        try:
            created = self._unix0
            router_registry = CollectorRegistry(auto_describe=False)
            router_registry.register(RouterCollector(self.fleet.router_stats, created_unix_s=created))
            self._router = HttpEndpoint(self.host, {"/metrics": metrics_route(router_registry, self.lock),
                                                    "/sd": self._sd_route}, "router")
            self._sync_targets()
            self._grpc = serve_control(self.plane, self.host)
        except BaseException:
            self.stop()
            raise
        self._thread = threading.Thread(target=self._advance_loop, name="sim-advance", daemon=True)
        self._thread.start()
        info = self.listening()
        log.info("live fleet %r at %gx: %d replicas, %d nodes, router %s, discovery %s", self.scenario.name,
                 self.speed, len(info["replicas"]), len(info["nodes"]), info["router_metrics"], info["discovery"])
        return info

    def listening(self) -> dict:
        """Where everything is served right now (the replica list changes as replicas come and go)."""
        assert self._router is not None and self._grpc is not None, "not started"
        with self._targets_lock:
            replicas = [{"id": rid, "pool": t.labels["pool"], "metrics": t.endpoint.url("/metrics"),
                         "api": t.endpoint.url(""), "address": t.endpoint.address}
                        for rid, t in self._replicas.items()]
            nodes = [{"id": nid, "metrics": t.endpoint.url("/metrics")} for nid, t in self._nodes.items()]
        return {"replicas": replicas, "nodes": nodes, "router_metrics": self._router.url("/metrics"),
                "router_control": self._grpc[0].address, "autoscaler_control": self._grpc[1].address,
                "discovery": self._router.url("/sd")}

    def stop(self) -> None:
        """Stop advancing and close every server. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10.0)
        if self._grpc is not None:
            for g in self._grpc:
                g.stop()
        with self._targets_lock:
            targets = list(self._replicas.values()) + list(self._nodes.values())
            self._replicas.clear()
            self._nodes.clear()
        for t in targets:
            t.endpoint.stop()
        if self._router is not None:
            self._router.stop()
        log.info("live fleet stopped at t=%.1f s (simulated)", self.now_s())

    def now_s(self) -> float:
        if self.fleet is None:
            return 0.0
        with self.lock:
            return float(self.fleet.now_s)

    def summary(self) -> dict:
        """The fleet's summary so far, with SLO attainment over the tasks resolved so far (a live run
        is cut while the trace still has tasks to come and tasks in flight)."""
        with self.lock:
            fleet = self._running()
            out = fleet.summary().to_dict()
            att, resolved = fleet.resolved_attainment()
            out["slo_attainment"] = {c: (None if math.isnan(v) else v) for c, v in att.items()}
            out["tasks_resolved"] = resolved
            return out

    def served(self) -> dict[str, int]:
        """Requests each replica's HTTP API accepted so far, by replica id (gone replicas included)."""
        with self._targets_lock:
            return dict(self._served)

    def _count_served(self, rid: str) -> None:
        with self._targets_lock:
            self._served[rid] = self._served.get(rid, 0) + 1

    def _running(self) -> Fleet:
        assert self.fleet is not None, "not started"
        return self.fleet

    # ------------------------------------------------------------------ advance

    def _advance_loop(self) -> None:
        chunk_sim_s = self.step_wall_s * self.speed
        try:
            fleet, plane = self._running(), self.plane
            assert plane is not None, "not started"
            while not self._stop.is_set():
                target = self._target_sim_s()
                # Advance in chunks of one step's worth so the lock is never held long (scrapes, gRPC).
                while not self._stop.is_set():
                    with self.lock:
                        # Past the end of the trace the clock keeps running (an idle fleet that still
                        # obeys scaling commands), as a real fleet would.
                        if fleet.done and not self._finished_logged:
                            self._finished_logged = True
                            log.info("scenario finished at t=%.1f s (simulated); still serving", fleet.now_s)
                        now = float(fleet.now_s)
                        if now >= target:
                            break
                        fleet.run_until(min(target, now + chunk_sim_s))
                        plane.check_deadlines()
                    self.progress.bump()
                    self._sync_targets()
                with self.lock:
                    plane.check_deadlines()
                self._sync_targets()
                self._stop.wait(self.step_wall_s)
        except BaseException as exc:  # surfaced through .error and the log
            self.error = exc
            log.exception("the simulation stopped with an error")

    # ------------------------------------------------------------------ targets

    def _sync_targets(self) -> None:
        """Open a /metrics server for each replica whose engine came up, close those that went away."""
        fleet = self._running()
        with self.lock:
            replicas = {r.replica_id: r for r in fleet.replica_stats()}
            nodes = {n.node_id: n for n in fleet.node_stats()}
            engines = self._engines()
        with self._targets_lock:
            gone_r = [rid for rid in self._replicas if rid not in replicas]
            new_r = [rid for rid in replicas if rid not in self._replicas]
            gone_n = [nid for nid in self._nodes if nid not in nodes]
            new_n = [nid for nid in nodes if nid not in self._nodes]
        if not (gone_r or new_r or gone_n or new_n):
            return
        closing: list[_Target] = []
        with self._targets_lock:
            for rid in gone_r:
                closing.append(self._replicas.pop(rid))
            for nid in gone_n:
                closing.append(self._nodes.pop(nid))
                self._node_collectors.pop(nid, None)
        for t in closing:
            t.endpoint.stop()
            log.info("closed %s", t.labels)
        for rid in new_r:
            stats = replicas[rid]
            pool = self.scenario.pool(stats.pool)
            registry = CollectorRegistry(auto_describe=False)
            kind = pool.engine.exposition
            if kind == "sglang":
                registry.register(SglangReplicaCollector(stats, created_unix_s=self.clock.now_s()))
            else:
                registry.register(ReplicaCollector(stats, enable_prefix_caching=pool.engine.enable_prefix_caching,
                                                   created_unix_s=self.clock.now_s()))
            ep = HttpEndpoint(self.host, {"/metrics": metrics_route(registry, self.lock)}, rid,
                              self._api_handlers(fleet, engines[rid], stats.model_name, stats.max_model_len))
            labels = {"kind": kind, "pool": stats.pool, "replica": rid, "pod": rid, "namespace": K8S_NAMESPACE}
            with self._targets_lock:
                self._replicas[rid] = _Target(ep, labels)
            log.info("replica %s (%s) ready: %s", rid, stats.pool, ep.url("/metrics"))
        for nid in new_n:
            node = nodes[nid]
            collector = NodeCollector(node, self._replicas_on(nid), now_s=lambda: float(fleet.now_s))
            registry = CollectorRegistry(auto_describe=False)
            registry.register(collector)
            ep = HttpEndpoint(self.host, {"/metrics": metrics_route(registry, self.lock)}, nid)
            node_pool = getattr(node, "pool", "") or self._node_pool(nid)
            labels = {"kind": "dcgm", "node": nid, **({"pool": node_pool} if node_pool else {})}
            with self._targets_lock:
                self._nodes[nid] = _Target(ep, labels)
                self._node_collectors[nid] = collector
            log.info("node %s up: %s", nid, ep.url("/metrics"))

    def _engines(self) -> dict[str, Replica]:
        """Engines of ready and draining replicas by id (call under the lock)."""
        return {i.rid: i.engine for p in self._running().pools.values() for i in p.insts
                if i.engine is not None and i.engine.alive}

    def _api_handlers(self, fleet: Fleet, engine: Replica, model: str, max_model_len: int) -> dict:
        with self.lock:
            if not isinstance(engine.sink, ReplicaSink):
                engine.sink = ReplicaSink(fleet)
        api = ReplicaApi(fleet, engine, self.lock, self.progress, served_model=model, max_model_len=max_model_len,
                         on_served=self._count_served)

        def simple(fn: Callable[[], tuple[int, bytes, str]]) -> Callable[[Any], None]:
            def handle(h) -> None:
                status, body, ctype = fn()
                h.send_response(status)
                h.send_header("Content-Type", ctype)
                h.send_header("Content-Length", str(len(body)))
                h.end_headers()
                h.wfile.write(body)

            return handle

        def completion(chat: bool) -> Callable[[Any], None]:
            def handle(h) -> None:
                try:
                    body = read_body(h)
                except ApiError as exc:
                    h.close_connection = True
                    send_json(h, exc.status, {"error": {"message": str(exc), "type": exc.kind, "code": exc.status}})
                    return
                api.handle(h, body, chat=chat)

            return handle

        return {("POST", "/v1/completions"): completion(False), ("POST", "/v1/chat/completions"): completion(True),
                ("GET", "/health"): simple(api.health), ("GET", "/v1/models"): simple(api.models)}

    def _replicas_on(self, node_id: str) -> Callable[[], list]:
        def replicas() -> list:
            return [r for r in self._running().replica_stats() if r.node_id == node_id]  # called under the lock

        return replicas

    def _node_pool(self, node_id: str) -> str:
        """The pool of a node whose stats do not name it: the fleet names nodes `<pool>-node-<k>`."""
        for p in sorted(self.scenario.pools, key=lambda p: -len(p.name)):
            if node_id == p.name or node_id.startswith(p.name + "-"):
                return p.name
        return ""

    def targets(self) -> list[dict]:
        """Prometheus HTTP SD: every current target with its labels."""
        assert self._router is not None
        with self.lock:
            draining = {rid for rid, e in self._engines().items() if e.draining}
        with self._targets_lock:
            # a draining replica stays scraped (it still serves its requests) but is marked, as
            # Kubernetes drops a terminating pod from a Service's ready endpoints
            out = [{"targets": [t.endpoint.address],
                    "labels": {**t.labels, **({"draining": "true"} if rid in draining else {})}}
                   for rid, t in self._replicas.items()]
            out += [{"targets": [t.endpoint.address], "labels": dict(t.labels)} for t in self._nodes.values()]
        out.append({"targets": [self._router.address], "labels": {"kind": "router"}})
        return out

    def _sd_route(self) -> tuple[bytes, str]:
        return json.dumps(self.targets()).encode(), "application/json"


# =========================================================================== CLI


def cmd_sim(args) -> int:
    """`governor sim SCENARIO [--for S] [--speed X] [--host H] [--seed N] [--step-wall S]`.

    stdout: one JSON line {"event": "listening", ...} at start, one {"event": "summary", ...}
    at the end; logs go to stderr. Stops after --for wall seconds or on SIGINT/SIGTERM.
    """
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for_s = args.for_s
    if for_s is not None and not (math.isfinite(for_s) and for_s > 0):
        print(f"governor sim: --for {for_s!r} must be a number of seconds > 0", file=sys.stderr)
        return 2
    try:
        scenario = load_scenario(args.scenario)
        live = LiveFleet(scenario, speed=args.speed, host=args.host, seed=args.seed,
                         step_wall_s=getattr(args, "step_wall", 0.05))
    except (ScenarioError, ValueError) as exc:
        print(f"governor sim: {exc}", file=sys.stderr)
        return 2

    stop = threading.Event()
    previous: dict[signal.Signals, Any] = {}

    def on_signal(signum, frame) -> None:
        log.info("received %s; shutting down", signal.Signals(signum).name)
        stop.set()

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, on_signal)
    rc = 0
    try:
        try:
            info = live.start()
        except (ScenarioError, ValueError, OSError) as exc:
            print(f"governor sim: {exc}", file=sys.stderr)
            return 2
        print(json.dumps({"event": "listening", **info}), flush=True)
        end = None if for_s is None else live.clock.monotonic_s() + for_s
        while not stop.is_set():
            if live.error is not None:
                rc = 1
                break
            left = None if end is None else end - live.clock.monotonic_s()
            if left is not None and left <= 0:
                break
            stop.wait(0.2 if left is None else min(0.2, left))
        live.stop()
        if live.error is not None:
            rc = 1
        print(json.dumps({"event": "summary", **live.summary()}), flush=True)
    finally:
        live.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return rc
