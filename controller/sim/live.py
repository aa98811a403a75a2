"""Live fleet: the simulator served on loopback so the daemon and Prometheus see a vLLM fleet.

`LiveFleet` advances a `Fleet` in real time × speed on a background thread and
serves what a real fleet serves:

- one HTTP `/metrics` per replica whose engine is up (vLLM names; a new port when a
  replica becomes ready, closed when it is drained away or crashes; a replica
  still starting serves nothing, like a vLLM server loading weights), one per
  GPU node (DCGM exporter names) and one for the router (llm-d EPP names), which
  also serves `/sd`: Prometheus HTTP service discovery listing every current target;
- gRPC `governor.v1.RouterControl` and `governor.v1.AutoscalerControl` (plus the
  standard gRPC health service), with the command semantics of
  protos/governor/v1/control.proto, implemented by `ControlPlane`.

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
from concurrent import futures
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest

from controller.clock import Clock, WallClock
from controller.gen.governor.v1 import control_pb2 as pb
from controller.gen.governor.v1 import control_pb2_grpc as pb_grpc
from controller.sim.exposition import NodeCollector, ReplicaCollector, RouterCollector
from controller.sim.scenario import AdmissionSpec, Scenario, ScenarioError, load_scenario
from controller.types import PRIORITY_CLASSES

log = logging.getLogger(__name__)

# Engine bounds, as the scenario schema enforces them (EngineSpec).
MAX_NUM_SEQS_RANGE = (1, 4096)
MAX_NUM_BATCHED_TOKENS_RANGE = (16, 262144)

K8S_NAMESPACE = "governor-sim"


# =========================================================================== control plane


class CommandInvalid(ValueError):
    """A command failed validation; the message names the field, the bad value and the allowed range."""


@dataclass
class _Channel:
    """Generation bookkeeping of one control service (router or autoscaler)."""

    name: str
    generation: int = 0
    decision_id: str = ""
    meta: pb.CommandMeta | None = None
    command: Any = None  # the last applied message
    fallback: bool = False  # the last command expired; defaults in force

    def live(self) -> bool:
        return self.command is not None and not self.fallback


def _finite_nonneg(x: float) -> bool:
    return math.isfinite(x) and x >= 0


@dataclass
class _Views:
    """The control settings in force, as this actuator last applied them (for Get* and rollback)."""

    routing: dict[str, dict[str, float]] = field(default_factory=dict)
    admission: dict[str, dict[str, float]] = field(default_factory=dict)
    scaling: dict[str, dict[str, int]] = field(default_factory=dict)


class ControlPlane:
    """RouterControl and AutoscalerControl semantics over a Fleet (or anything with its control methods).

    - generation lower than the last applied → STALE_GENERATION; equal with the same
      decision_id → REPLAY (nothing re-applied); equal with another id → STALE_GENERATION;
    - the whole command is validated before anything is applied → INVALID naming
      the field (`pools[1].replicas: -1 is out of range [1, 8] …`), nothing applied;
    - a command whose `valid_until_unix_s` passes with no newer command is replaced
      by the scenario's defaults (`check_deadlines`, called by the advance loop and
      before every Get*): `Fleet.reset_controls()` when neither service holds a live
      command, else only the expired service's settings are reset to their defaults.

    Router and autoscaler keep separate generations and deadlines. All fleet
    access happens under `lock`. `sim_to_unix` maps simulated seconds to Unix time
    (for ReplicaState.phase_since_unix_s).
    """

    def __init__(self, fleet, lock: threading.RLock, clock: Clock,
                 sim_to_unix: Callable[[float], float] | None = None) -> None:
        self.fleet = fleet
        self.lock = lock
        self.clock = clock
        self.sim_to_unix = sim_to_unix or (lambda t: t)
        self.scenario: Scenario = fleet.scenario
        self.pools = {p.name: p for p in self.scenario.pools}
        self.router = _Channel("router")
        self.autoscaler = _Channel("autoscaler")
        self.views = _Views()
        self._reset_router_view()
        self._reset_scaling_view()

    # ------------------------------------------------------------------ defaults

    def _default_routing(self, pool: str) -> dict[str, float]:
        r = self.scenario.router
        return {"traffic_weight": self.pools[pool].traffic_weight, "inflight_cap": r.inflight_cap,
                "prefix_weight": r.prefix_weight, "queue_weight": r.queue_weight, "kv_weight": r.kv_weight}

    def _default_admission(self, cls: str) -> dict[str, float]:
        a = self.scenario.router.admission.get(cls, AdmissionSpec())
        return {"rate_limit_rps": a.rate_limit_rps, "queue_budget": a.queue_budget, "shed_frac": a.shed_frac}

    def _default_scaling(self, pool: str) -> dict[str, int]:
        p = self.pools[pool]
        return {"replicas": p.replicas, "warm_standby": p.warm_standby, "max_num_seqs": p.engine.max_num_seqs,
                "max_num_batched_tokens": p.engine.max_num_batched_tokens}

    def _reset_router_view(self) -> None:
        self.views.routing = {p: self._default_routing(p) for p in self.pools}
        self.views.admission = {c: self._default_admission(c) for c in PRIORITY_CLASSES}

    def _reset_scaling_view(self) -> None:
        self.views.scaling = {p: self._default_scaling(p) for p in self.pools}

    # ------------------------------------------------------------------ meta

    def _check_meta(self, ch: _Channel, msg) -> pb.Ack | None:
        """Validate CommandMeta and order generations. Returns an Ack to send back, or None to go on."""
        if not msg.HasField("meta"):
            return self._invalid(ch, "meta: missing (every command carries decision_id, generation, valid_until_unix_s)")
        m = msg.meta
        if not m.decision_id:
            return self._invalid(ch, "meta.decision_id: must be non-empty")
        if m.generation < 1:
            return self._invalid(ch, f"meta.generation: {m.generation} must be >= 1")
        if m.generation < ch.generation:
            return pb.Ack(status=pb.ACK_STATUS_STALE_GENERATION, applied_generation=ch.generation,
                          message=f"generation {m.generation} is older than the applied generation {ch.generation}")
        if m.generation == ch.generation:
            if m.decision_id == ch.decision_id:
                return pb.Ack(status=pb.ACK_STATUS_REPLAY, applied_generation=ch.generation,
                              message=f"generation {m.generation} ({m.decision_id}) already applied; nothing changed")
            return pb.Ack(status=pb.ACK_STATUS_STALE_GENERATION, applied_generation=ch.generation,
                          message=f"generation {m.generation} was already applied as decision {ch.decision_id!r}, "
                                  f"not {m.decision_id!r}")
        now = self.clock.now_s()
        if not math.isfinite(m.valid_until_unix_s) or m.valid_until_unix_s <= now:
            return self._invalid(ch, f"meta.valid_until_unix_s: {m.valid_until_unix_s!r} must be a Unix time after "
                                     f"now ({now:.3f})")
        return None

    @staticmethod
    def _invalid(ch: _Channel, message: str) -> pb.Ack:
        log.warning("%s command rejected: %s", ch.name, message)
        return pb.Ack(status=pb.ACK_STATUS_INVALID, applied_generation=ch.generation, message=message)

    @staticmethod
    def _apply_all_or_nothing(steps: list[tuple[Callable[[], None], Callable[[], None]]]) -> str:
        """Run (apply, undo) pairs in order; if the fleet rejects one, undo those done. Returns an error or ""."""
        done: list[Callable[[], None]] = []
        for apply, undo in steps:
            try:
                apply()
            except ValueError as exc:
                # The fleet rejected something the checks above let through: put back what was in force.
                for u in reversed(done):
                    u()
                return f"rejected by the fleet: {exc}"
            done.append(undo)
        return ""

    def _accept(self, ch: _Channel, msg) -> pb.Ack:
        ch.generation = msg.meta.generation
        ch.decision_id = msg.meta.decision_id
        ch.meta = pb.CommandMeta()
        ch.meta.CopyFrom(msg.meta)
        ch.command = msg
        ch.fallback = False
        return pb.Ack(status=pb.ACK_STATUS_APPLIED, applied_generation=ch.generation,
                      message=f"applied {msg.meta.decision_id}")

    def _each_pool(self, entries):
        """(field path, entry) per pool entry of a command, refusing unknown and repeated pools."""
        seen: set[str] = set()
        for i, p in enumerate(entries):
            where = f"pools[{i}]"
            if p.pool not in self.pools:
                raise CommandInvalid(f"{where}.pool: unknown pool {p.pool!r}; pools are {sorted(self.pools)}")
            if p.pool in seen:
                raise CommandInvalid(f"{where}.pool: pool {p.pool!r} appears more than once")
            seen.add(p.pool)
            yield where, p

    # ------------------------------------------------------------------ router

    def _validate_routing(self, msg: pb.RoutingPolicy) -> None:
        for where, p in self._each_pool(msg.pools):
            if not _finite_nonneg(p.traffic_weight):
                raise CommandInvalid(f"{where}.traffic_weight: {p.traffic_weight!r} must be a finite number >= 0")
            if p.inflight_cap < 0:
                raise CommandInvalid(f"{where}.inflight_cap: {p.inflight_cap} must be >= 0 (0 = no cap)")
            if p.HasField("weights"):
                for fname in ("prefix", "queue", "kv_usage"):
                    v = getattr(p.weights, fname)
                    if not _finite_nonneg(v):
                        raise CommandInvalid(f"{where}.weights.{fname}: {v!r} must be a finite number >= 0")
        seen = set()
        for j, a in enumerate(msg.admission):
            where = f"admission[{j}]"
            if a.priority_class not in PRIORITY_CLASSES:
                raise CommandInvalid(f"{where}.priority_class: unknown class {a.priority_class!r}; "
                                     f"allowed: {list(PRIORITY_CLASSES)}")
            if a.priority_class in seen:
                raise CommandInvalid(f"{where}.priority_class: class {a.priority_class!r} appears more than once")
            seen.add(a.priority_class)
            if not _finite_nonneg(a.rate_limit_rps):
                raise CommandInvalid(f"{where}.rate_limit_rps: {a.rate_limit_rps!r} must be a finite number >= 0 "
                                     "(0 = unlimited)")
            if a.queue_budget < -1:
                raise CommandInvalid(f"{where}.queue_budget: {a.queue_budget} must be >= -1 (-1 = unlimited)")
            if not (math.isfinite(a.shed_fraction) and 0.0 <= a.shed_fraction <= 1.0):
                raise CommandInvalid(f"{where}.shed_fraction: {a.shed_fraction!r} is outside [0, 1]")

    def _apply_routing_settings(self, routing: dict[str, dict[str, float]],
                                admission: dict[str, dict[str, float]]) -> None:
        for pool, s in routing.items():
            self.fleet.set_pool_routing(pool, traffic_weight=s["traffic_weight"], inflight_cap=int(s["inflight_cap"]),
                                        prefix_weight=s["prefix_weight"], queue_weight=s["queue_weight"],
                                        kv_weight=s["kv_weight"])
        for cls, a in admission.items():
            self.fleet.set_admission(cls, rate_limit_rps=a["rate_limit_rps"], queue_budget=int(a["queue_budget"]),
                                     shed_frac=a["shed_frac"])

    def _command(self, ch: _Channel, msg, validate: Callable[[Any], None], apply: Callable[[Any], str]) -> pb.Ack:
        """One command, all or nothing: deadlines, generation rules, validation, then apply."""
        with self.lock:
            self.check_deadlines()
            ack = self._check_meta(ch, msg)
            if ack is not None:
                return ack
            try:
                validate(msg)
            except CommandInvalid as exc:
                return self._invalid(ch, str(exc))
            error = apply(msg)
            if error:
                return self._invalid(ch, error)
            return self._accept(ch, msg)

    def apply_routing(self, msg: pb.RoutingPolicy) -> pb.Ack:
        return self._command(self.router, msg, self._validate_routing, self._apply_routing_msg)

    def _apply_routing_msg(self, msg: pb.RoutingPolicy) -> str:
        routing: dict[str, dict[str, float]] = {}
        for p in msg.pools:
            s = dict(self.views.routing[p.pool])
            s["traffic_weight"] = p.traffic_weight
            s["inflight_cap"] = p.inflight_cap
            if p.HasField("weights"):
                s.update(prefix_weight=p.weights.prefix, queue_weight=p.weights.queue,
                         kv_weight=p.weights.kv_usage)
            routing[p.pool] = s
        admission = {a.priority_class: {"rate_limit_rps": a.rate_limit_rps, "queue_budget": a.queue_budget,
                                        "shed_frac": a.shed_fraction} for a in msg.admission}
        steps = [(lambda p=p: self._apply_routing_settings({p: routing[p]}, {}),
                  lambda p=p: self._apply_routing_settings({p: self.views.routing[p]}, {})) for p in routing]
        steps += [(lambda c=c: self._apply_routing_settings({}, {c: admission[c]}),
                   lambda c=c: self._apply_routing_settings({}, {c: self.views.admission[c]})) for c in admission]
        error = self._apply_all_or_nothing(steps)
        if not error:
            self.views.routing.update(routing)
            self.views.admission.update(admission)
            log.info("router: applied generation %d (%s)", msg.meta.generation, msg.meta.decision_id)
        return error

    def routing_policy(self) -> pb.RoutingPolicy:
        """The routing and admission settings in force, with the meta of the last applied command.

        After a fallback the settings are the defaults and meta.valid_until_unix_s is in the past.
        """
        with self.lock:
            self.check_deadlines()
            out = pb.RoutingPolicy()
            if self.router.meta is not None:
                out.meta.CopyFrom(self.router.meta)
            for pool, s in self.views.routing.items():
                out.pools.add(pool=pool, traffic_weight=s["traffic_weight"], inflight_cap=int(s["inflight_cap"]),
                              weights=pb.ScorerWeights(prefix=s["prefix_weight"], queue=s["queue_weight"],
                                                       kv_usage=s["kv_weight"]))
            for cls, a in self.views.admission.items():
                out.admission.add(priority_class=cls, rate_limit_rps=a["rate_limit_rps"],
                                  queue_budget=int(a["queue_budget"]), shed_fraction=a["shed_frac"])
            return out

    # ------------------------------------------------------------------ autoscaler

    def _validate_scaling(self, msg: pb.ScalingPlan) -> None:
        for where, p in self._each_pool(msg.pools):
            spec = self.pools[p.pool]
            if not (spec.min_replicas <= p.replicas <= spec.max_replicas):
                raise CommandInvalid(f"{where}.replicas: {p.replicas} is out of range "
                                     f"[{spec.min_replicas}, {spec.max_replicas}] for pool {p.pool!r}")
            if not (0 <= p.warm_standby <= spec.max_replicas):
                raise CommandInvalid(f"{where}.warm_standby: {p.warm_standby} is out of range "
                                     f"[0, {spec.max_replicas}] for pool {p.pool!r}")
            lo, hi = MAX_NUM_SEQS_RANGE
            if p.max_num_seqs != 0 and not (lo <= p.max_num_seqs <= hi):
                raise CommandInvalid(f"{where}.max_num_seqs: {p.max_num_seqs} must be 0 (unchanged) or in [{lo}, {hi}]")
            lo, hi = MAX_NUM_BATCHED_TOKENS_RANGE
            if p.max_num_batched_tokens != 0 and not (lo <= p.max_num_batched_tokens <= hi):
                raise CommandInvalid(f"{where}.max_num_batched_tokens: {p.max_num_batched_tokens} must be 0 "
                                     f"(unchanged) or in [{lo}, {hi}]")
            # vLLM refuses a token budget below the sequence cap; 0 keeps the value in force
            seqs = p.max_num_seqs or self.views.scaling[p.pool]["max_num_seqs"]
            tokens = p.max_num_batched_tokens or self.views.scaling[p.pool]["max_num_batched_tokens"]
            if tokens < seqs:
                raise CommandInvalid(f"{where}.max_num_batched_tokens: {tokens} must be >= max_num_seqs ({seqs})")

    def _apply_scaling_settings(self, scaling: dict[str, dict[str, int]]) -> None:
        for pool, s in scaling.items():
            self.fleet.set_pool_target(pool, replicas=s["replicas"], warm_standby=s["warm_standby"],
                                       max_num_seqs=s["max_num_seqs"] or None,
                                       max_num_batched_tokens=s["max_num_batched_tokens"] or None)

    def apply_scaling(self, msg: pb.ScalingPlan) -> pb.Ack:
        return self._command(self.autoscaler, msg, self._validate_scaling, self._apply_scaling_msg)

    def _apply_scaling_msg(self, msg: pb.ScalingPlan) -> str:
        scaling: dict[str, dict[str, int]] = {}
        for p in msg.pools:
            s = dict(self.views.scaling[p.pool])
            s.update(replicas=p.replicas, warm_standby=p.warm_standby)
            if p.max_num_seqs:
                s["max_num_seqs"] = p.max_num_seqs
            if p.max_num_batched_tokens:
                s["max_num_batched_tokens"] = p.max_num_batched_tokens
            scaling[p.pool] = s
        error = self._apply_all_or_nothing(
            [(lambda p=p: self._apply_scaling_settings({p: scaling[p]}),
              lambda p=p: self._apply_scaling_settings({p: self.views.scaling[p]})) for p in scaling])
        if not error:
            self.views.scaling.update(scaling)
            log.info("autoscaler: applied generation %d (%s): %s", msg.meta.generation, msg.meta.decision_id,
                     {p: s["replicas"] for p, s in scaling.items()})
        return error

    def fleet_state(self) -> pb.FleetState:
        """Autoscaler view. fallback_active: some command (router or autoscaler) expired and defaults are in force."""
        with self.lock:
            self.check_deadlines()
            out = pb.FleetState(applied_generation=self.autoscaler.generation,
                                applied_decision_id=self.autoscaler.decision_id,
                                fallback_active=self.router.fallback or self.autoscaler.fallback)
            for name, st in self.fleet.pool_states().items():
                out.pools.add(pool=name, target_replicas=st.target_replicas, ready=st.ready, starting=st.starting,
                              draining=st.draining, standby=st.standby, max_num_seqs=st.max_num_seqs,
                              max_num_batched_tokens=st.max_num_batched_tokens)
            for rid, pool, phase, since_s in self.fleet.replica_phases():
                out.replicas.add(id=rid, pool=pool, phase=phase, phase_since_unix_s=self.sim_to_unix(since_s))
            return out

    # ------------------------------------------------------------------ deadlines

    def check_deadlines(self) -> list[str]:
        """Fall back to defaults for every service whose command has expired. Returns their names."""
        with self.lock:
            now = self.clock.now_s()
            expired = [ch for ch in (self.router, self.autoscaler)
                       if ch.live() and ch.meta is not None and ch.meta.valid_until_unix_s <= now]
            if not expired:
                return []
            for ch in expired:
                ch.fallback = True
                log.warning("%s: generation %d (%s) expired at %.3f with no newer command; falling back to the "
                            "scenario's defaults", ch.name, ch.generation, ch.decision_id, ch.meta.valid_until_unix_s)
            if not self.router.live() and not self.autoscaler.live():
                self.fleet.reset_controls()
                self._reset_router_view()
                self._reset_scaling_view()
            elif self.router in expired:
                self._reset_router_view()
                self._apply_routing_settings(self.views.routing, self.views.admission)
            else:
                self._reset_scaling_view()
                self._apply_scaling_settings(self.views.scaling)
            return [ch.name for ch in expired]


class RouterControlServicer(pb_grpc.RouterControlServicer):
    def __init__(self, plane: ControlPlane) -> None:
        self.plane = plane

    def ApplyRoutingPolicy(self, request, context):  # noqa: N802 - gRPC method name
        return self.plane.apply_routing(request)

    def GetRoutingPolicy(self, request, context):  # noqa: N802
        return self.plane.routing_policy()


class AutoscalerControlServicer(pb_grpc.AutoscalerControlServicer):
    def __init__(self, plane: ControlPlane) -> None:
        self.plane = plane

    def ApplyScalingPlan(self, request, context):  # noqa: N802
        return self.plane.apply_scaling(request)

    def GetFleetState(self, request, context):  # noqa: N802
        return self.plane.fleet_state()


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class GrpcEndpoint:
    """One gRPC server on host:free port with one control service and the gRPC health service."""

    def __init__(self, host: str, service_name: str, add: Callable[[grpc.Server], None]) -> None:
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="sim-grpc"))
        add(self.server)
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        port = self.server.add_insecure_port(_host_port(host, 0))
        if port == 0:
            raise OSError(f"cannot listen for gRPC on {host}")
        self.address = _host_port(host, port)
        self.server.start()
        for name in ("", service_name):
            self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

    def stop(self, grace_s: float = 1.0) -> None:
        self.health.enter_graceful_shutdown()
        self.server.stop(grace_s).wait(grace_s + 1.0)


def serve_control(plane: ControlPlane, host: str = "127.0.0.1") -> tuple[GrpcEndpoint, GrpcEndpoint]:
    """Start RouterControl and AutoscalerControl on two loopback ports (as two separate components would be)."""
    router = GrpcEndpoint(host, "governor.v1.RouterControl",
                          lambda s: pb_grpc.add_RouterControlServicer_to_server(RouterControlServicer(plane), s))
    try:
        autoscaler = GrpcEndpoint(host, "governor.v1.AutoscalerControl",
                                  lambda s: pb_grpc.add_AutoscalerControlServicer_to_server(
                                      AutoscalerControlServicer(plane), s))
    except Exception:
        router.stop(0)
        raise
    return router, autoscaler


# =========================================================================== HTTP


class HttpEndpoint:
    """A small threaded HTTP server: path → callable returning (body, content type)."""

    def __init__(self, host: str, routes: dict[str, Callable[[], tuple[bytes, str]]], name: str) -> None:
        routes = dict(routes)

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server API
                route = routes.get(self.path.split("?", 1)[0])
                if route is None:
                    self.send_error(404, "not found")
                    return
                try:
                    body, ctype = route()
                except Exception as exc:  # noqa: BLE001 - report as a 500, never kill the server
                    log.exception("%s: %s failed", name, self.path)
                    self.send_error(500, str(exc))
                    return
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, fmt: str, *args) -> None:
                log.debug("%s: " + fmt, name, *args)

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.address = _host_port(host, self.port)
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                       name=f"http-{name}", daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"http://{self.address}{path}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(2.0)


def _metrics_route(registry: CollectorRegistry, lock: threading.RLock) -> Callable[[], tuple[bytes, str]]:
    def render() -> tuple[bytes, str]:
        # Always the classic text format (0.0.4), which every Prometheus and our own scraper accept.
        with lock:
            return generate_latest(registry), CONTENT_TYPE_PLAIN_0_0_4

    return render


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
        self.fleet = None
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
            self._router = HttpEndpoint(self.host, {"/metrics": _metrics_route(router_registry, self.lock),
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
            replicas = [{"id": rid, "pool": t.labels["pool"], "metrics": t.endpoint.url("/metrics")}
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
        with self.lock:
            return self.fleet.summary().to_dict()

    # ------------------------------------------------------------------ advance

    def _advance_loop(self) -> None:
        chunk_sim_s = self.step_wall_s * self.speed
        try:
            while not self._stop.is_set():
                target = self._target_sim_s()
                # Advance in chunks of one step's worth so the lock is never held long (scrapes, gRPC).
                while not self._stop.is_set():
                    with self.lock:
                        # Past the end of the trace the clock keeps running (an idle fleet that still
                        # obeys scaling commands), as a real fleet would.
                        if self.fleet.done and not self._finished_logged:
                            self._finished_logged = True
                            log.info("scenario finished at t=%.1f s (simulated); still serving", self.fleet.now_s)
                        now = float(self.fleet.now_s)
                        if now >= target:
                            break
                        self.fleet.run_until(min(target, now + chunk_sim_s))
                        self.plane.check_deadlines()
                    self._sync_targets()
                with self.lock:
                    self.plane.check_deadlines()
                self._sync_targets()
                self._stop.wait(self.step_wall_s)
        except BaseException as exc:  # noqa: BLE001 - surfaced through .error and the log
            self.error = exc
            log.exception("the simulation stopped with an error")

    # ------------------------------------------------------------------ targets

    def _sync_targets(self) -> None:
        """Open a /metrics server for each replica whose engine came up, close those that went away."""
        with self.lock:
            replicas = {r.replica_id: r for r in self.fleet.replica_stats()}
            nodes = {n.node_id: n for n in self.fleet.node_stats()}
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
            registry.register(ReplicaCollector(stats, enable_prefix_caching=pool.engine.enable_prefix_caching,
                                               created_unix_s=self.clock.now_s()))
            ep = HttpEndpoint(self.host, {"/metrics": _metrics_route(registry, self.lock)}, rid)
            labels = {"kind": "vllm", "pool": stats.pool, "replica": rid, "pod": rid, "namespace": K8S_NAMESPACE}
            with self._targets_lock:
                self._replicas[rid] = _Target(ep, labels)
            log.info("replica %s (%s) ready: %s", rid, stats.pool, ep.url("/metrics"))
        for nid in new_n:
            stats = nodes[nid]
            collector = NodeCollector(stats, self._replicas_on(nid), now_s=lambda: float(self.fleet.now_s))
            registry = CollectorRegistry(auto_describe=False)
            registry.register(collector)
            ep = HttpEndpoint(self.host, {"/metrics": _metrics_route(registry, self.lock)}, nid)
            pool = getattr(stats, "pool", "") or self._node_pool(nid)
            labels = {"kind": "dcgm", "node": nid, **({"pool": pool} if pool else {})}
            with self._targets_lock:
                self._nodes[nid] = _Target(ep, labels)
                self._node_collectors[nid] = collector
            log.info("node %s up: %s", nid, ep.url("/metrics"))

    def _replicas_on(self, node_id: str) -> Callable[[], list]:
        def replicas() -> list:
            return [r for r in self.fleet.replica_stats() if r.node_id == node_id]  # called under the lock

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
        with self._targets_lock:
            out = [{"targets": [t.endpoint.address], "labels": dict(t.labels)}
                   for t in list(self._replicas.values()) + list(self._nodes.values())]
        out.append({"targets": [self._router.address], "labels": {"kind": "router"}})
        return out

    def _sd_route(self) -> tuple[bytes, str]:
        return json.dumps(self.targets()).encode(), "application/json"


# =========================================================================== CLI


def cmd_sim(args) -> int:
    """`governor sim SCENARIO [--for S] [--speed X] [--host H] [--seed N]`.

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
        live = LiveFleet(scenario, speed=args.speed, host=args.host, seed=args.seed)
    except (ScenarioError, ValueError) as exc:
        print(f"governor sim: {exc}", file=sys.stderr)
        return 2

    stop = threading.Event()
    previous: dict[int, Any] = {}

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
