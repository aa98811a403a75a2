"""A fake fleet control plane: RouterControl + AutoscalerControl servicers with control.proto's generation rules.

Rules (both servicers): generation < applied → STALE_GENERATION; generation == applied with the same
decision id → REPLAY (nothing re-applied); same generation with another id → STALE_GENERATION; a command
that fails validation → INVALID (nothing applied); otherwise APPLIED. Every call is recorded (a copy of
the request). `faults` scripts the next calls: "unavailable" aborts with UNAVAILABLE before anything is
applied; "hang" applies, then withholds the answer until `release` is set (so the client's deadline fires).
"""

from __future__ import annotations

import threading
from collections import deque
from concurrent import futures

import grpc

from controller.gen.governor.v1 import control_pb2, control_pb2_grpc

HANG_LIMIT_S = 10.0  # a hung handler gives up after this even if nobody releases it


class _Gate:
    def __init__(self, pools: set[str] | None) -> None:
        self.pools = pools
        self.applied_generation = 0
        self.applied_decision_id = ""
        self.calls: list = []
        self.faults: deque[str] = deque()
        self.release = threading.Event()
        self.lock = threading.Lock()

    def record(self, request) -> str | None:
        copy = type(request)()
        copy.CopyFrom(request)
        with self.lock:
            self.calls.append(copy)
            return self.faults.popleft() if self.faults else None

    def decide(self, meta: control_pb2.CommandMeta, problem: str | None, apply) -> control_pb2.Ack:
        with self.lock:
            gen, did = meta.generation, meta.decision_id
            if gen < self.applied_generation or (gen == self.applied_generation and did != self.applied_decision_id
                                                 and self.applied_generation > 0):
                return control_pb2.Ack(status=control_pb2.ACK_STATUS_STALE_GENERATION,
                                       applied_generation=self.applied_generation,
                                       message=f"generation {gen} is not newer than {self.applied_generation}")
            if gen == self.applied_generation and gen > 0:
                return control_pb2.Ack(status=control_pb2.ACK_STATUS_REPLAY, applied_generation=gen, message="replay")
            if gen == 0:
                problem = problem or "meta.generation must be >= 1"
            if problem:
                return control_pb2.Ack(status=control_pb2.ACK_STATUS_INVALID,
                                       applied_generation=self.applied_generation, message=problem)
            apply()
            self.applied_generation, self.applied_decision_id = gen, did
            return control_pb2.Ack(status=control_pb2.ACK_STATUS_APPLIED, applied_generation=gen)

    def serve(self, request, context, problem: str | None, apply) -> control_pb2.Ack:
        fault = self.record(request)
        if fault == "unavailable":
            context.abort(grpc.StatusCode.UNAVAILABLE, "injected: unavailable")
        ack = self.decide(request.meta, problem, apply)
        if fault == "hang":
            self.release.wait(HANG_LIMIT_S)
        return ack


class FakeRouter(control_pb2_grpc.RouterControlServicer):
    def __init__(self, pools: set[str] | None = None) -> None:
        self.gate = _Gate(pools)
        self.policy = control_pb2.RoutingPolicy()

    @property
    def calls(self) -> list[control_pb2.RoutingPolicy]:
        return list(self.gate.calls)

    def _problem(self, request: control_pb2.RoutingPolicy) -> str | None:
        for p in request.pools:
            if self.gate.pools is not None and p.pool not in self.gate.pools:
                return f"pools.pool: unknown pool {p.pool!r}"
            if p.traffic_weight < 0:
                return f"pools.traffic_weight: must be >= 0 (got {p.traffic_weight})"
        for a in request.admission:
            if not 0.0 <= a.shed_fraction <= 1.0:
                return f"admission.shed_fraction: must be in 0..1 (got {a.shed_fraction})"
        return None

    def ApplyRoutingPolicy(self, request, context):  # noqa: N802 - gRPC method name
        return self.gate.serve(request, context, self._problem(request), lambda: self.policy.CopyFrom(request))

    def GetRoutingPolicy(self, request, context):  # noqa: N802 - gRPC method name
        return self.policy


class FakeAutoscaler(control_pb2_grpc.AutoscalerControlServicer):
    def __init__(self, pools: set[str] | None = None) -> None:
        self.gate = _Gate(pools)
        self.plan = control_pb2.ScalingPlan()
        self.draining: dict[str, int] = {}  # replicas GetFleetState reports draining, per pool (set by tests)

    @property
    def calls(self) -> list[control_pb2.ScalingPlan]:
        return list(self.gate.calls)

    def _problem(self, request: control_pb2.ScalingPlan) -> str | None:
        for p in request.pools:
            if self.gate.pools is not None and p.pool not in self.gate.pools:
                return f"pools.pool: unknown pool {p.pool!r}"
            if p.replicas < 0:
                return f"pools.replicas: must be >= 0 (got {p.replicas})"
        return None

    def ApplyScalingPlan(self, request, context):  # noqa: N802 - gRPC method name
        return self.gate.serve(request, context, self._problem(request), lambda: self.plan.CopyFrom(request))

    def GetFleetState(self, request, context):  # noqa: N802 - gRPC method name
        with self.gate.lock:
            pools = [control_pb2.PoolState(pool=p.pool, target_replicas=p.replicas, ready=p.replicas,
                                           standby=p.warm_standby, max_num_seqs=p.max_num_seqs,
                                           draining=self.draining.get(p.pool, 0))
                     for p in self.plan.pools]
            return control_pb2.FleetState(applied_generation=self.gate.applied_generation,
                                          applied_decision_id=self.gate.applied_decision_id, pools=pools)


class FakeFleetServer:
    """Both fakes on one loopback port. Use as a context manager."""

    def __init__(self, pools: set[str] | None = None) -> None:
        self.router = FakeRouter(pools)
        self.autoscaler = FakeAutoscaler(pools)
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        control_pb2_grpc.add_RouterControlServicer_to_server(self.router, self._server)
        control_pb2_grpc.add_AutoscalerControlServicer_to_server(self.autoscaler, self._server)
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self.address = f"127.0.0.1:{self.port}"

    @property
    def total_calls(self) -> int:
        return len(self.router.calls) + len(self.autoscaler.calls)

    def __enter__(self) -> FakeFleetServer:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.router.gate.release.set()
        self.autoscaler.gate.release.set()
        self._server.stop(0).wait()
