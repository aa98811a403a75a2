"""Sends decisions to the fleet over gRPC: RoutingPolicy to RouterControl, ScalingPlan to AutoscalerControl.

Each decision becomes at most two commands, each carrying CommandMeta (decision id,
generation, validity deadline, issuer), sent to the router and the autoscaler side by
side (a hung router does not delay the scaling plan). A call has a deadline; UNAVAILABLE and
DEADLINE_EXCEEDED are retried a bounded number of times with exponential backoff
(waits go through the injected Clock, so a virtual clock never really sleeps);
an ack (APPLIED, REPLAY, STALE_GENERATION, INVALID) is final and never retried.
`apply(decision, deadline_s=...)` bounds the whole send by the tick's actuation deadline
(the daemon's, controller/config/tick_budget.py): no attempt starts or waits past it, and an
attempt's timeout is cut to what is left. A re-send is the same generation and decision id,
so a target that applied an attempt whose answer was lost replays it: no duplicate effect.
Every `apply` returns exactly one ActuationOutcome and never raises for
transport problems.

This module must not decide anything: it maps a Decision field by field and
reports what the fleet said.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import grpc

from controller.actuation.outcome import (
    APPLIED,
    FAILED,
    INVALID,
    REPLAY,
    SKIPPED,
    STALE,
    ActuationOutcome,
    FleetStateView,
    PoolStateView,
    TargetHealth,
    TargetResult,
    combine_status,
)
from controller.clock import Clock
from controller.gen.governor.v1 import control_pb2, control_pb2_grpc
from controller.rpc import lever_wire
from controller.rpc.transport import ClientTls, bearer_metadata, make_channel
from controller.types import PRIORITY_CLASSES, ClassAdmission, Decision

ROUTER = "router"
AUTOSCALER = "autoscaler"

# Only these codes say "the call may not have reached the target": retrying is safe because a
# repeat of the same generation and decision id is an idempotent replay on the target's side.
RETRYABLE_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})

_ACK_STATUS = {
    control_pb2.ACK_STATUS_APPLIED: APPLIED,
    control_pb2.ACK_STATUS_REPLAY: REPLAY,
    control_pb2.ACK_STATUS_STALE_GENERATION: STALE,
    control_pb2.ACK_STATUS_INVALID: INVALID,
}


# --------------------------------------------------------------------------- Decision → proto


def command_meta(decision: Decision, issuer: str) -> control_pb2.CommandMeta:
    return control_pb2.CommandMeta(
        decision_id=decision.decision_id,
        generation=decision.generation,
        valid_until_unix_s=decision.valid_until_s,
        issuer=issuer,
    )


def _admission_classes(decision: Decision) -> list[str]:
    # Every known class is sent, defaults included, so that the router's admission state is the whole
    # desired state (a class the core dropped because it returned to default is reset, not left shedding).
    extra = sorted(c for c in decision.admission if c not in PRIORITY_CLASSES)
    return [*PRIORITY_CLASSES, *extra]


def routing_policy_for(decision: Decision, issuer: str) -> control_pb2.RoutingPolicy:
    """RoutingPolicy: one PoolRouting per pool of the decision, one ClassAdmission per priority class, one
    TenantLimits per tenant the decision limits (each with every lever its message carries, controller/levers.py),
    and step awareness when the decision sets it (unset: the router keeps its own)."""
    pools = [lever_wire.build("PoolRouting", {"pool": name, "ejected_replicas": list(pd.ejected)}, pd)
             for name, pd in decision.pools.items()]
    admission = [lever_wire.build("ClassAdmission", {"priority_class": c}, decision.admission.get(c, ClassAdmission()))
                 for c in _admission_classes(decision)]
    tenants = [lever_wire.build("TenantLimits", {"tenant": t}, lim) for t, lim in sorted(decision.tenants.items())]
    msg = control_pb2.RoutingPolicy(meta=command_meta(decision, issuer), pools=pools, admission=admission,
                                    tenants=tenants)
    if decision.step_aware is not None:
        msg.step_aware = decision.step_aware
    return msg


def scaling_plan_for(decision: Decision, issuer: str) -> control_pb2.ScalingPlan:
    """ScalingPlan: one PoolScaling per pool of the decision."""
    pools = [lever_wire.build("PoolScaling", {"pool": name, "replace_replicas": list(pd.replace)}, pd)
             for name, pd in decision.pools.items()]
    return control_pb2.ScalingPlan(meta=command_meta(decision, issuer), pools=pools)


def fleet_state_view(msg: control_pb2.FleetState) -> FleetStateView:
    pools = {
        p.pool: PoolStateView(
            pool=p.pool, target_replicas=p.target_replicas, ready=p.ready, starting=p.starting,
            draining=p.draining, standby=p.standby, max_num_seqs=p.max_num_seqs,
            max_num_batched_tokens=p.max_num_batched_tokens, unavailable=p.unavailable,
        )
        for p in msg.pools
    }
    return FleetStateView(applied_generation=msg.applied_generation, applied_decision_id=msg.applied_decision_id,
                          fallback_active=msg.fallback_active, pools=pools)


# --------------------------------------------------------------------------- the actuator


class _Send:
    """One target's command within one apply: its request, attempts so far and final result."""

    def __init__(self, target: str, method, build: Callable) -> None:
        self.target = target
        self.method = method
        self.build = build
        self.request = None
        self.attempts = 0
        self.last_code = ""
        self.last_error = ""
        self.result: TargetResult | None = None

    def check_deadlines(self, clock: Clock, decision: Decision, deadline_s: float | None) -> None:
        """Finish with FAILED when the decision's validity or the tick's actuation deadline has passed."""
        last = f"; last error {self.last_code}: {self.last_error}" if self.last_code else ""
        if clock.now_s() >= decision.valid_until_s:
            self.result = TargetResult(self.target, FAILED, self.attempts, code=self.last_code or "DEADLINE_PASSED",
                                       detail=f"validity deadline {decision.valid_until_s:.3f} passed before "
                                              f"delivery{last}")
        elif deadline_s is not None and deadline_s - clock.monotonic_s() <= 0:
            self.result = TargetResult(self.target, FAILED, self.attempts, code=self.last_code or "TICK_DEADLINE",
                                       detail=f"the tick's actuation deadline passed after {self.attempts} "
                                              f"attempt(s){last}")


class GrpcActuator:
    """Actuator over gRPC to a router adapter and an autoscaler adapter (either may be absent: None)."""

    takes_deadline = True  # apply() accepts deadline_s (the daemon passes the tick's actuation deadline)

    def __init__(self, router_address: str | None, autoscaler_address: str | None, *, clock: Clock,
                 call_timeout_s: float = 2.0, retries: int = 3, backoff_s: float = 0.2,
                 tls: ClientTls | None = None, issuer: str = "governor", token: str | None = None) -> None:
        """`retries` is the number of re-sends after the first call: at most retries + 1 calls per target.

        Backoff before re-send k (1-based) is backoff_s * 2**(k-1): with 0.2 s and 3 retries the waits are
        0.2, 0.4 and 0.8 s, so a target that is down costs 4 calls and 1.4 s of waiting (plus call time).
        """
        if call_timeout_s <= 0:
            raise ValueError(f"call_timeout_s must be > 0 (got {call_timeout_s})")
        if retries < 0:
            raise ValueError(f"retries must be >= 0 (got {retries})")
        if backoff_s < 0:
            raise ValueError(f"backoff_s must be >= 0 (got {backoff_s})")
        self._clock = clock
        self._call_timeout_s = float(call_timeout_s)
        self._retries = int(retries)
        self._backoff_s = float(backoff_s)
        self._issuer = issuer
        self._metadata = bearer_metadata(token) or None
        self._addresses = {ROUTER: router_address, AUTOSCALER: autoscaler_address}
        self._channels: dict[str, grpc.Channel] = {}
        self._router: control_pb2_grpc.RouterControlStub | None = None
        self._autoscaler: control_pb2_grpc.AutoscalerControlStub | None = None
        if router_address:
            self._channels[ROUTER] = make_channel(router_address, tls)
            self._router = control_pb2_grpc.RouterControlStub(self._channels[ROUTER])
        if autoscaler_address:
            self._channels[AUTOSCALER] = make_channel(autoscaler_address, tls)
            self._autoscaler = control_pb2_grpc.AutoscalerControlStub(self._channels[AUTOSCALER])
        self._lock = threading.Lock()
        self._last: dict[str, TargetResult] = {}
        self._last_ok_s: dict[str, float] = {}

    @property
    def issuer(self) -> str:
        return self._issuer

    def apply(self, decision: Decision, *, deadline_s: float | None = None) -> ActuationOutcome:
        """Send both commands side by side; `deadline_s` (on the clock's monotonic scale) bounds them."""
        started_s = self._clock.monotonic_s()
        sends = []
        if self._router is not None:
            sends.append(_Send(ROUTER, self._router.ApplyRoutingPolicy,
                               lambda: routing_policy_for(decision, self._issuer)))
        if self._autoscaler is not None:
            sends.append(_Send(AUTOSCALER, self._autoscaler.ApplyScalingPlan,
                               lambda: scaling_plan_for(decision, self._issuer)))
        self._send_all(sends, decision, deadline_s)
        done = {x.target: x.result for x in sends}
        results = [done.get(ROUTER) or TargetResult(ROUTER, SKIPPED, detail="no router address configured"),
                   done.get(AUTOSCALER) or TargetResult(AUTOSCALER, SKIPPED, detail="no autoscaler address configured")]
        self._remember(results)
        status = combine_status([r.status for r in results])
        detail = "; ".join(f"{r.target}: {r.status}" + (f" ({r.detail})" if r.detail else "") for r in results)
        return ActuationOutcome(
            decision_id=decision.decision_id, generation=decision.generation, status=status, detail=detail,
            attempts=sum(r.attempts for r in results), duration_s=self._clock.monotonic_s() - started_s,
            targets={r.target: r for r in results},
        )

    def _send_all(self, sends: list[_Send], decision: Decision, deadline_s: float | None) -> None:
        """Rounds of attempts: every unfinished target's call goes out at once (gRPC futures), the round
        waits for them all, then one backoff wait before the next round. One thread does the waiting, so
        the time spent is the slowest target's, never the sum, and a virtual clock stays deterministic."""
        for x in sends:
            try:
                x.request = x.build()
            except (ValueError, TypeError) as exc:  # e.g. a replica count outside int32
                x.result = TargetResult(x.target, INVALID, 0, detail=f"cannot encode the command: {exc}")
        while True:
            pending = [x for x in sends if x.result is None]
            for x in pending:
                x.check_deadlines(self._clock, decision, deadline_s)
            pending = [x for x in pending if x.result is None]
            if not pending:
                return
            calls = []
            for x in pending:
                timeout_s = self._call_timeout_s
                if deadline_s is not None:
                    timeout_s = min(timeout_s, deadline_s - self._clock.monotonic_s())
                x.attempts += 1
                try:
                    calls.append((x, x.method.future(x.request, timeout=timeout_s, metadata=self._metadata)))
                except ValueError as exc:  # the channel was closed under us (shutdown)
                    x.result = TargetResult(x.target, FAILED, x.attempts, code="CLOSED",
                                            detail=f"actuator closed: {exc}")
            waits = []
            for x, call in calls:
                try:
                    ack = call.result()  # bounded by the call's own timeout
                except grpc.RpcError as exc:
                    code = exc.code() if callable(getattr(exc, "code", None)) else grpc.StatusCode.UNKNOWN
                    x.last_code = code.name
                    x.last_error = (exc.details() if callable(getattr(exc, "details", None)) else str(exc)) or ""
                    if code in RETRYABLE_CODES and x.attempts <= self._retries:
                        waits.append(self._backoff_s * 2 ** (x.attempts - 1))
                        continue
                    x.result = TargetResult(x.target, FAILED, x.attempts, code=x.last_code,
                                            detail=f"{x.last_code} after {x.attempts} attempt(s): {x.last_error}")
                    continue
                except ValueError as exc:  # closed under us
                    x.result = TargetResult(x.target, FAILED, x.attempts, code="CLOSED",
                                            detail=f"actuator closed: {exc}")
                    continue
                x.result = self._from_ack(x.target, ack, x.attempts, retried=bool(x.last_code))
            if not waits:
                continue
            wait_s = max(waits)
            if deadline_s is not None and self._clock.monotonic_s() + wait_s >= deadline_s:
                for x in sends:
                    if x.result is None:
                        x.result = TargetResult(x.target, FAILED, x.attempts, code=x.last_code,
                                                detail=f"{x.last_code} after {x.attempts} attempt(s), no time left "
                                                       f"in the tick for another: {x.last_error}")
                return
            self._clock.sleep(wait_s)

    @staticmethod
    def _from_ack(target: str, ack: control_pb2.Ack, attempts: int, *, retried: bool) -> TargetResult:
        status = _ACK_STATUS.get(ack.status)
        if status is None:
            return TargetResult(target, FAILED, attempts, ack.applied_generation, code="UNKNOWN_ACK",
                                detail=f"the target answered with an unknown ack status {ack.status}: {ack.message}")
        detail = ack.message
        if status == REPLAY and retried:
            # An earlier attempt reached the target but its answer was lost (deadline or dropped connection):
            # the command is in force, applied by that attempt.
            status = APPLIED
            detail = "applied by an earlier attempt whose answer was lost (replay ack)"
            detail += f": {ack.message}" if ack.message else ""
        return TargetResult(target, status, attempts, ack.applied_generation, detail=detail)

    def _remember(self, results: list[TargetResult]) -> None:
        now_s = self._clock.now_s()
        with self._lock:
            for r in results:
                if r.status == SKIPPED:
                    continue
                self._last[r.target] = r
                if r.status in (APPLIED, REPLAY):
                    self._last_ok_s[r.target] = now_s

    def fleet_state(self) -> FleetStateView | None:
        if self._autoscaler is None:
            return None
        try:
            msg = self._autoscaler.GetFleetState(control_pb2.GetFleetStateRequest(), timeout=self._call_timeout_s,
                                                 metadata=self._metadata)
        except grpc.RpcError:
            return None
        return fleet_state_view(msg)

    def components(self) -> tuple[TargetHealth, ...]:
        """Per configured target: healthy when its last command was applied or replayed (or none was sent yet)."""
        out = []
        with self._lock:
            for target, address in self._addresses.items():
                if not address:
                    continue
                last = self._last.get(target)
                if last is None:
                    out.append(TargetHealth(f"actuator:{target}", True, f"{address}: no command sent yet"))
                    continue
                healthy = last.status in (APPLIED, REPLAY)
                detail = f"{address}: {last.status}" + (f" ({last.detail})" if last.detail and not healthy else "")
                if last.applied_generation:
                    detail += f", applied generation {last.applied_generation}"
                out.append(TargetHealth(f"actuator:{target}", healthy, detail, self._last_ok_s.get(target, 0.0)))
        return tuple(out)

    def health(self) -> tuple[bool, str]:
        parts = self.components()
        if not parts:
            return False, "no router or autoscaler address configured"
        return all(p.healthy for p in parts), "; ".join(f"{p.name.split(':', 1)[1]} {p.detail}" for p in parts)

    def close(self) -> None:
        for ch in self._channels.values():
            ch.close()
        self._channels.clear()

