"""The live simulator's control plane: RouterControl and AutoscalerControl over gRPC, applied to a Fleet.

`ControlPlane` holds the command semantics of protos/governor/v1/control.proto
(generations, replays, all-or-nothing validation, deadlines that fall back to the
scenario's defaults); the servicers adapt it to gRPC and `serve_control` starts the
two services (plus the standard health service) on loopback ports. Bytes that are not
the request message are answered INVALID_ARGUMENT, messages over MAX_MESSAGE_BYTES
RESOURCE_EXHAUSTED (tests/reliability/test_fuzz_dataplane.py).

Must not: read the wall clock except through its `Clock`, model the fleet (it only
calls the Fleet's control methods), or touch the fleet outside `lock`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from controller.clock import Clock
from controller.gen.governor.v1 import control_pb2 as pb
from controller.gen.governor.v1 import control_pb2_grpc as pb_grpc
from controller.levers import admission_levers, lever
from controller.rpc import command_rules, lever_wire
from controller.rpc.command_rules import CommandInvalidError, check_meta, each_pool
from controller.rpc.transport import CheckedRequestsInterceptor
from controller.sim.fleet_lifecycle import route_defaults
from controller.sim.http_endpoint import host_port
from controller.sim.scenario import (
    MAX_NUM_BATCHED_TOKENS_RANGE,
    MAX_NUM_SEQS_RANGE,
    AdmissionSpec,
    PoolSpecModel,
    Scenario,
)
from controller.types import PRIORITY_CLASSES

log = logging.getLogger(__name__)
# A command is ~60 bytes a pool: 1 MiB is ~15,000 pools, far beyond a scenario, and bounds what one call costs.
MAX_MESSAGE_BYTES = 1 << 20
_Step = tuple[Callable[[], None], Callable[[], None]]  # (apply, undo) of one part of a command


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


@dataclass
class _Views:
    """The control settings in force, as this actuator last applied them (for Get* and rollback)."""

    routing: dict[str, dict[str, float]] = field(default_factory=dict)
    admission: dict[str, dict[str, float]] = field(default_factory=dict)
    scaling: dict[str, dict[str, int]] = field(default_factory=dict)
    step_aware: bool | None = None  # the last command's; None: the scenario's own


def validate_routing(msg: pb.RoutingPolicy, pools: Mapping[str, PoolSpecModel]) -> None:
    """Raise CommandInvalidError naming the first bad field of a RoutingPolicy."""
    command_rules.validate_routing(msg, pools, rate_limit_note=" (0 = unlimited)")


def validate_scaling(msg: pb.ScalingPlan, pools: Mapping[str, PoolSpecModel],
                     scaling: Mapping[str, Mapping[str, int]]) -> None:
    """Raise CommandInvalidError naming the first bad field of a ScalingPlan (`scaling`: the settings in force)."""
    for where, p in each_pool(msg.pools, pools):
        spec = pools[p.pool]
        command_rules.check_replica_names(p.replace_replicas, f"{where}.replace_replicas")
        if not (spec.min_replicas <= p.replicas <= spec.max_replicas):
            raise CommandInvalidError(f"{where}.replicas: {p.replicas} is out of range "
                                      f"[{spec.min_replicas}, {spec.max_replicas}] for pool {p.pool!r}")
        if not (0 <= p.warm_standby <= spec.max_replicas):
            raise CommandInvalidError(f"{where}.warm_standby: {p.warm_standby} is out of range "
                                      f"[0, {spec.max_replicas}] for pool {p.pool!r}")
        lo, hi = MAX_NUM_SEQS_RANGE
        if p.max_num_seqs != 0 and not (lo <= p.max_num_seqs <= hi):
            raise CommandInvalidError(f"{where}.max_num_seqs: {p.max_num_seqs} must be 0 (unchanged) "
                                      f"or in [{lo}, {hi}]")
        lo, hi = MAX_NUM_BATCHED_TOKENS_RANGE
        if p.max_num_batched_tokens != 0 and not (lo <= p.max_num_batched_tokens <= hi):
            raise CommandInvalidError(f"{where}.max_num_batched_tokens: {p.max_num_batched_tokens} must be 0 "
                                      f"(unchanged) or in [{lo}, {hi}]")
        # vLLM refuses a token budget below the sequence cap; 0 keeps the value in force
        seqs = p.max_num_seqs or scaling[p.pool]["max_num_seqs"]
        tokens = p.max_num_batched_tokens or scaling[p.pool]["max_num_batched_tokens"]
        if tokens < seqs:
            raise CommandInvalidError(f"{where}.max_num_batched_tokens: {tokens} must be >= max_num_seqs ({seqs})")


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
        return route_defaults(self.scenario, self.pools[pool])

    def _default_admission(self, cls: str) -> dict[str, float]:
        a = self.scenario.router.admission.get(cls, AdmissionSpec())
        return {lv.name: getattr(a, lv.name) for lv in admission_levers()}

    def _default_scaling(self, pool: str) -> dict[str, int]:
        p = self.pools[pool]
        return {"replicas": p.replicas, "warm_standby": p.warm_standby, "max_num_seqs": p.engine.max_num_seqs,
                "max_num_batched_tokens": p.engine.max_num_batched_tokens}

    def _reset_router_view(self) -> None:
        self.views.step_aware = None
        self.views.routing = {p: self._default_routing(p) for p in self.pools}
        self.views.admission = {c: self._default_admission(c) for c in PRIORITY_CLASSES}

    def _reset_scaling_view(self) -> None:
        self.views.scaling = {p: self._default_scaling(p) for p in self.pools}

    # ------------------------------------------------------------------ meta

    def _check_meta(self, ch: _Channel, msg) -> pb.Ack | None:
        """Validate CommandMeta and order generations. Returns an Ack to send back, or None to go on."""
        try:
            return check_meta(msg, ch.generation, ch.decision_id, self.clock.now_s(), replay_note="; nothing changed")
        except CommandInvalidError as exc:
            return self._invalid(ch, str(exc))

    @staticmethod
    def _invalid(ch: _Channel, message: str) -> pb.Ack:
        log.warning("%s command rejected: %s", ch.name, message)
        return pb.Ack(status=pb.ACK_STATUS_INVALID, applied_generation=ch.generation, message=message)

    @staticmethod
    def _apply_all_or_nothing(steps: list[_Step]) -> str:
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

    # ------------------------------------------------------------------ router

    def _apply_routing_settings(self, routing: dict[str, dict[str, float]],
                                admission: dict[str, dict[str, float]]) -> None:
        for pool, s in routing.items():
            self.fleet.set_pool_routing(pool, **{k: lever(k).kind(v) for k, v in s.items()})
        for cls, a in admission.items():
            self.fleet.set_admission(cls, **{k: lever(k).kind(v) for k, v in a.items()})

    def _command(self, ch: _Channel, msg, validate: Callable[[Any], None], apply: Callable[[Any], str]) -> pb.Ack:
        """One command, all or nothing: deadlines, generation rules, validation, then apply."""
        with self.lock:
            self.check_deadlines()
            ack = self._check_meta(ch, msg)
            if ack is not None:
                return ack
            try:
                validate(msg)
            except CommandInvalidError as exc:
                return self._invalid(ch, str(exc))
            error = apply(msg)
            if error:
                return self._invalid(ch, error)
            return self._accept(ch, msg)

    def apply_routing(self, msg: pb.RoutingPolicy) -> pb.Ack:
        return self._command(self.router, msg, lambda m: validate_routing(m, self.pools), self._apply_routing_msg)

    def _apply_routing_msg(self, msg: pb.RoutingPolicy) -> str:
        routing: dict[str, dict[str, float]] = {}
        for p in msg.pools:
            s = dict(self.views.routing[p.pool])
            s.update(lever_wire.values(p, "PoolRouting"))  # the scorer weights only when the command sets them
            routing[p.pool] = s
        admission = {a.priority_class: lever_wire.values(a, "ClassAdmission") for a in msg.admission}

        def pool_step(p: str) -> _Step:
            return (lambda: self._apply_routing_settings({p: routing[p]}, {}),
                    lambda: self._apply_routing_settings({p: self.views.routing[p]}, {}))

        def class_step(c: str) -> _Step:
            return (lambda: self._apply_routing_settings({}, {c: admission[c]}),
                    lambda: self._apply_routing_settings({}, {c: self.views.admission[c]}))

        steps = [pool_step(p) for p in routing]
        steps += [class_step(c) for c in admission]
        error = self._apply_all_or_nothing(steps)
        if not error:
            self.views.routing.update(routing)
            self.views.admission.update(admission)
            for p in msg.pools:  # slow replicas ejected (a pool the command names with none: none ejected)
                self.fleet.set_ejected(p.pool, list(p.ejected_replicas))
            # step awareness: the command's, else the scenario's own; tenant limits are validated but not carried
            # (the simulated router has no tenant limits: the lever table's tenant levers name the picker only)
            self.views.step_aware = msg.step_aware if msg.HasField("step_aware") else None
            self.fleet.set_step_aware(self.views.step_aware)
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
                out.pools.append(lever_wire.build("PoolRouting", {"pool": pool}, s))
            for cls, a in self.views.admission.items():
                out.admission.append(lever_wire.build("ClassAdmission", {"priority_class": cls}, a))
            out.step_aware = (self.scenario.router.step_aware if self.views.step_aware is None
                              else self.views.step_aware)
            return out

    def _apply_scaling_settings(self, scaling: dict[str, dict[str, int]]) -> None:
        for pool, s in scaling.items():
            self.fleet.set_pool_target(pool, replicas=s["replicas"], warm_standby=s["warm_standby"],
                                       max_num_seqs=s["max_num_seqs"] or None,
                                       max_num_batched_tokens=s["max_num_batched_tokens"] or None)

    def apply_scaling(self, msg: pb.ScalingPlan) -> pb.Ack:
        return self._command(self.autoscaler, msg, lambda m: validate_scaling(m, self.pools, self.views.scaling),
                             self._apply_scaling_msg)

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

        def pool_step(p: str) -> _Step:
            return (lambda: self._apply_scaling_settings({p: scaling[p]}),
                    lambda: self._apply_scaling_settings({p: self.views.scaling[p]}))

        error = self._apply_all_or_nothing([pool_step(p) for p in scaling])
        if not error:
            self.views.scaling.update(scaling)
            for p in msg.pools:  # slow replicas to replace: once per command (a replay never gets here)
                if p.replace_replicas:
                    self.fleet.replace_replicas(p.pool, list(p.replace_replicas))
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
                              max_num_batched_tokens=st.max_num_batched_tokens, unavailable=st.unavailable)
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
                assert ch.meta is not None  # `expired` keeps only channels with a command
                log.warning("%s: generation %d (%s) expired at %.3f with no newer command; falling back to the "
                            "scenario's defaults", ch.name, ch.generation, ch.decision_id, ch.meta.valid_until_unix_s)
            if not self.router.live() and not self.autoscaler.live():
                self.fleet.reset_controls()
                self._reset_router_view()
                self._reset_scaling_view()
            elif self.router in expired:
                self._reset_router_view()
                for pool in self.views.routing:  # an ejection lives only as long as the command naming it
                    self.fleet.set_ejected(pool, [])
                self._apply_routing_settings(self.views.routing, self.views.admission)
            else:
                self._reset_scaling_view()
                self._apply_scaling_settings(self.views.scaling)
            if self.router in expired:
                self.fleet.set_step_aware(None)  # the scenario's own
            return [ch.name for ch in expired]



class RouterControlServicer(pb_grpc.RouterControlServicer):
    def __init__(self, plane: ControlPlane) -> None:
        self.plane = plane

    def ApplyRoutingPolicy(self, request, context):  # noqa: N802 - gRPC method name
        return self.plane.apply_routing(request)

    def GetRoutingPolicy(self, request, context):  # noqa: N802 - gRPC method name
        return self.plane.routing_policy()


class AutoscalerControlServicer(pb_grpc.AutoscalerControlServicer):
    def __init__(self, plane: ControlPlane) -> None:
        self.plane = plane

    def ApplyScalingPlan(self, request, context):  # noqa: N802 - gRPC method name
        return self.plane.apply_scaling(request)

    def GetFleetState(self, request, context):  # noqa: N802 - gRPC method name
        return self.plane.fleet_state()


class GrpcEndpoint:
    """One gRPC server on host:free port with one control service and the gRPC health service."""

    def __init__(self, host: str, service_name: str, add: Callable[[grpc.Server], None]) -> None:
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="sim-grpc"),
                                  interceptors=[CheckedRequestsInterceptor()],
                                  options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)])
        add(self.server)
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        port = self.server.add_insecure_port(host_port(host, 0))
        if port == 0:
            raise OSError(f"cannot listen for gRPC on {host}")
        self.address = host_port(host, port)
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

