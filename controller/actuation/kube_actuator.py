"""The in-process actuator for a Kubernetes fleet: the Kubernetes adapter scales, routers follow the replicas.

`FleetActuator` implements the `Actuator` protocol over
- a `KubernetesAutoscaler` (kube.py) for replicas, warm standby and engine batch caps,
- any number of `MembershipRouter`s (routers/: vllm-router, sglang-router) whose worker lists follow
  the ready replicas, and
- optionally a gRPC RouterControl (e.g. `governor picker`) for the routing levers, through GrpcActuator.

It keeps the command semantics of protos/governor/v1/control.proto on its side: a generation below the
last applied one is STALE, a repeat with the same decision id is a REPLAY, a command past its validity
deadline is not sent. Order within one decision: plan every pool (a refused pool, e.g. one an HPA also
scales, makes the whole plan INVALID and nothing is applied) → take the pods that will go out of every
router that fronts their pool → annotate and scale → add replicas that are ready. A pool whose leaving
pods could not be taken out of a router is not scaled down this time (no request goes to a pod about to
stop). `sync_membership` (called on every `fleet_state`, and by `MembershipLoop` between ticks) adds
replicas once they turn ready and removes the ones that are gone, but only while the last applied plan
is valid: in shadow or paused mode (no plan applied, or the last one expired) Governor changes no
router, and a router keeps the list it has.

When the last scaling plan expires, Kubernetes keeps the replicas it has: there is no safer default to
return to, so `fallback_active` is reported and nothing is changed. This module must not decide anything.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

from controller.actuation.grpc_actuator import AUTOSCALER, ROUTER, GrpcActuator
from controller.actuation.kube import KubeError, KubernetesAutoscaler, PoolPlan
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
from controller.actuation.routers.membership import (
    READY,
    Endpoint,
    MembershipRouter,
    RouterError,
    remove_leaving,
    sync,
)
from controller.clock import Clock
from controller.types import Decision

ROUTERS = "routers"  # the membership routers, as one target in the outcome
log = logging.getLogger(__name__)


class FleetActuator:
    def __init__(self, kube: KubernetesAutoscaler, routers: Sequence[MembershipRouter] = (), *, clock: Clock,
                 grpc_router: GrpcActuator | None = None) -> None:
        self.kube = kube
        self.routers = list(routers)
        self._clock = clock
        self._grpc = grpc_router
        self._lock = threading.RLock()  # one writer at a time: apply and membership syncs
        self._generation = 0
        self._decision_id = ""
        self._valid_until_s = 0.0
        self._last: dict[str, TargetResult] = {}
        self._last_ok_s: dict[str, float] = {}
        self._router_status: dict[str, tuple[bool, str]] = {r.url: (True, "not synced yet") for r in self.routers}

    # ------------------------------------------------------------------ apply

    def apply(self, decision: Decision) -> ActuationOutcome:
        started = self._clock.monotonic_s()
        with self._lock:
            results = [self._route(decision), *self._scale(decision)]
        now = self._clock.now_s()
        for r in results:
            if r.status != SKIPPED:
                self._last[r.target] = r
                if r.status in (APPLIED, REPLAY):
                    self._last_ok_s[r.target] = now
        status = combine_status([r.status for r in results])
        detail = "; ".join(f"{r.target}: {r.status}" + (f" ({r.detail})" if r.detail else "") for r in results)
        return ActuationOutcome(decision.decision_id, decision.generation, status, detail,
                                attempts=sum(r.attempts for r in results),
                                duration_s=self._clock.monotonic_s() - started, targets={r.target: r for r in results})

    def _route(self, decision: Decision) -> TargetResult:
        if self._grpc is None:
            return TargetResult(ROUTER, SKIPPED, detail="no gRPC router configured")
        result = self._grpc.apply(decision).target(ROUTER)
        return result or TargetResult(ROUTER, FAILED, detail="the gRPC router gave no result")

    def _scale(self, decision: Decision) -> list[TargetResult]:
        gen, did = decision.generation, decision.decision_id
        if gen < self._generation or (gen == self._generation and did != self._decision_id):
            why = f"generation {gen} ({did}) is not newer than the applied {self._generation} ({self._decision_id})"
            return [TargetResult(AUTOSCALER, STALE, 0, self._generation, detail=why)]
        if gen == self._generation:
            return [TargetResult(AUTOSCALER, REPLAY, 0, gen, detail="already applied")]
        if self._clock.now_s() >= decision.valid_until_s:
            return [TargetResult(AUTOSCALER, FAILED, 0, self._generation, code="DEADLINE_PASSED",
                                 detail=f"validity deadline {decision.valid_until_s:.3f} passed before delivery")]
        plans: list[PoolPlan] = []
        try:
            for name, pd in decision.pools.items():
                plans.append(self.kube.plan_pool(name, int(pd.replicas), int(pd.warm_standby), int(pd.max_num_seqs),
                                                 int(pd.max_num_batched_tokens), pd.replace))
        except KubeError as exc:
            status = INVALID if exc.invalid else FAILED
            return [TargetResult(AUTOSCALER, status, 1, self._generation, detail=f"nothing applied: {exc}")]
        notes: list[str] = []
        membership_errors: list[str] = []
        for plan in plans:
            if plan.replacing and not self._drain(plan.replacing, membership_errors):
                notes.append(f"{plan.target.pool}: replacing {[e.id for e in plan.replacing]} held: they could not be "
                             "taken out of every router")
                plan.replacing = []
            if plan.leaving and not self._drain(plan.leaving, membership_errors):
                notes.append(f"{plan.target.pool}: scale-down to {plan.replicas} held at {plan.current}: its leaving "
                             "pods could not be taken out of every router")
                plan.replicas = plan.current
                plan.leaving = []
        failed = []
        for plan in plans:
            try:
                notes.extend(self.kube.execute(plan))
            except KubeError as exc:
                failed.append(str(exc))
        membership = self._sync_locked()
        membership_errors.extend(membership.errors)
        if failed:
            return [TargetResult(AUTOSCALER, FAILED, 1, self._generation, detail="; ".join(failed + notes)),
                    self._membership_result(membership_errors)]
        self._generation, self._decision_id, self._valid_until_s = gen, did, decision.valid_until_s
        return [TargetResult(AUTOSCALER, APPLIED, 1, gen, detail="; ".join(notes)),
                self._membership_result(membership_errors)]

    def _drain(self, leaving: list[Endpoint], errors: list[str]) -> bool:
        ok = True
        for r in self.routers:
            res = remove_leaving(r, [e for e in leaving if e.url])
            if res.errors:
                ok = False
                errors.extend(res.errors)
        return ok

    def _membership_result(self, errors: list[str]) -> TargetResult:
        if not self.routers:
            return TargetResult(ROUTERS, SKIPPED, detail="no membership routers configured")
        if errors:
            return TargetResult(ROUTERS, FAILED, 1, detail="; ".join(errors))
        return TargetResult(ROUTERS, APPLIED, 1, detail=f"{len(self.routers)} router(s) follow the ready replicas")

    # ------------------------------------------------------------------ membership

    def _sync_locked(self, endpoints: list[Endpoint] | None = None) -> _Sync:
        out = _Sync()
        if not self.routers:
            return out
        if endpoints is None:
            try:
                endpoints = self.kube.endpoints()
            except KubeError as exc:
                out.errors.append(f"cannot list the replicas: {exc}")
                return out
        for r in self.routers:
            res = sync(r, endpoints)
            ok, detail = res.ok, f"{r.kind} {r.url}: {res.summary()}"
            try:  # the router's own view of its members, kept for health() (which makes no calls itself)
                reading = r.reading()
                members = {e.url for e in endpoints if e.phase == READY}
                bad = sorted(w for w, h in reading.healthy.items() if not h and w in members)
                if bad:
                    ok, detail = False, f"{detail}; the router reports unhealthy workers: {', '.join(bad)}"
            except RouterError as exc:
                ok, detail = False, f"{detail}; {exc}"
            self._router_status[r.url] = (ok, detail)
            out.errors.extend(res.errors)
            if res.added or res.removed:
                log.info("router membership changed", extra={"event": "membership", "router": r.url,
                                                              "added": res.added, "removed": res.removed})
        return out

    def membership_live(self) -> bool:
        """True while a plan this actuator applied is still valid: only then does it change routers."""
        return self._generation > 0 and self._clock.now_s() < self._valid_until_s

    def sync_membership(self) -> list[str]:
        """Make every router's worker list the ready replicas now; returns the errors (empty: in sync).
        Does nothing while no applied plan is valid (see `membership_live`)."""
        with self._lock:
            if not self.membership_live():
                return []
            return self._sync_locked().errors

    # ------------------------------------------------------------------ the Actuator protocol

    def fleet_state(self) -> FleetStateView | None:
        with self._lock:
            pools: dict[str, PoolStateView] = {}
            endpoints: list[Endpoint] = []
            try:
                for pool in self.kube.targets:
                    view, eps = self.kube.pool_state(pool)
                    pools[pool] = view
                    endpoints += eps
            except KubeError as exc:
                self._last[AUTOSCALER] = TargetResult(AUTOSCALER, FAILED, detail=f"fleet state: {exc}")
                return None
            if self.membership_live():
                self._sync_locked(endpoints)
            expired = self._generation > 0 and self._clock.now_s() >= self._valid_until_s
            return FleetStateView(self._generation, self._decision_id, expired, pools)

    def components(self) -> tuple[TargetHealth, ...]:
        out = []
        for target in (ROUTER, AUTOSCALER) if self._grpc is not None else (AUTOSCALER,):
            last = self._last.get(target)
            if last is None:
                out.append(TargetHealth(f"actuator:{target}", True, "no command sent yet"))
            else:
                ok = last.status in (APPLIED, REPLAY)
                out.append(TargetHealth(f"actuator:{target}", ok, f"{last.status}" + (f" ({last.detail})" if
                                        last.detail and not ok else ""), self._last_ok_s.get(target, 0.0)))
        for r in self.routers:
            ok, detail = self._router_status[r.url]  # as of the last membership sync
            out.append(TargetHealth(f"router:{r.kind}:{r.url}", ok, detail))
        return tuple(out)

    def health(self) -> tuple[bool, str]:
        parts = self.components()
        return all(p.healthy for p in parts), "; ".join(f"{p.name} {p.detail}" for p in parts)

    def close(self) -> None:
        if self._grpc is not None:
            self._grpc.close()
        self.kube.api.close()


class _Sync:
    def __init__(self) -> None:
        self.errors: list[str] = []


class MembershipLoop:
    """Re-syncs router membership every `interval_s` between ticks, so a replica that turns ready is added
    within that time rather than at the next tick. Stops on `stop()`."""

    def __init__(self, actuator: FleetActuator, interval_s: float) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0 (got {interval_s})")
        self._act = actuator
        self._interval = float(interval_s)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="membership", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                errors = self._act.sync_membership()
            except Exception:  # a background loop must survive one bad sync; logged
                log.exception("router membership sync failed")
                continue
            if errors:
                log.warning("router membership sync: %s", "; ".join(errors), extra={"event": "membership"})

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)
