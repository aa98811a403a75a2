"""One daemon tick, end to end: read telemetry → Controller.step → record → actuate → report.

`Daemon` holds the edges (telemetry source, actuators, state store, metrics,
logger, clock) and the controller state between ticks. It is also the
`DaemonHandle` the PolicyService serves (status, mode). It does not schedule
itself: `runtime/loop.py` calls `tick()`; tests and `--once` call it directly.

Under leader election (`leadership`, runtime/leader.py) a daemon that does not lead its
shard still reads, decides and learns every tick, but records its decisions as shadow,
refuses write RPCs, takes the leader's published mode and serves KEDA the leader's
published targets. The leader numbers its decisions from the term's generation floor,
which fences a deposed leader's late commands at the actuators.

Faults (docs/RELIABILITY.md): the telemetry read and the autoscaler's fleet-state call run side
by side, each bounded by its own timeout; actuation gets what is left of `PLAN_SHARE` of the
tick as its deadline (controller/config/tick_budget.py). A state-store write that fails (disk full,
read-only) is reported in status and `governor_state_store_errors`; when the generation cannot
be persisted the decision is not sent (a restart could otherwise reuse it). A config reload's
result is kept for status and `governor_config_reloads`. `GOVERNOR_FAULT_KILL_AT=PHASE[:TICK]`
(read, step, persist, actuate, record, learn) SIGKILLs the process at that point of a tick, for
the crash tests (tests/reliability/test_faults_controller.py); unset in production.
"""

from __future__ import annotations

import logging
import os
import signal
import sqlite3
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

from controller.actuation.outcome import FAILED, ActuationOutcome
from controller.api.server import ComponentStatus, PoolStatusView, StatusView
from controller.api.store import StoreError
from controller.clock import Clock
from controller.config.tick_budget import PLAN_SHARE
from controller.core.step import Controller, ControllerState, TickInput, TickResult
from controller.obs.daemon_metrics import DaemonMetrics
from controller.obs.otel import Phase, TickTelemetry
from controller.obs.task_cost import CostSnapshot
from controller.types import FleetObservation, Mode, PoolPhases, TaskProfile

if TYPE_CHECKING:
    from controller.obs.task_cost import CostTracker


class Leadership(Protocol):
    """The part of runtime/leader.py's LeaderElector the daemon uses."""

    lease_name: str
    identity: str

    def leading(self, within_s: float = 0.0) -> bool: ...

    def generation_floor(self) -> int: ...

    def leader(self) -> tuple[str, Mapping[str, str]]: ...

    def leader_targets(self) -> dict[str, int]: ...


@dataclass(frozen=True, slots=True)
class TickReport:
    """What one tick produced, for the live view and the headless JSON lines."""

    result: TickResult
    observation: FleetObservation
    outcome: Any  # ActuationOutcome, or None when paused
    durations_ms: dict[str, float]
    costs: CostSnapshot | None = None  # spend and cost per successful task so far (runtime/costs.py), if tracked


KILL_PHASES = ("read", "step", "persist", "actuate", "record", "learn")
_STORE_ERRORS = (sqlite3.Error, OSError, StoreError)  # StoreError covers the shared state's (api/kube_store.py)


def _kill_point() -> tuple[str, int] | None:
    """(phase, tick) of GOVERNOR_FAULT_KILL_AT=PHASE[:TICK] (tick 1-based, default 1), or None."""
    spec = os.environ.get("GOVERNOR_FAULT_KILL_AT", "")
    if not spec:
        return None
    phase, _, tick = spec.partition(":")
    if phase not in KILL_PHASES or (tick and not tick.isdigit()):
        raise ValueError(f"GOVERNOR_FAULT_KILL_AT={spec!r}: expected one of {list(KILL_PHASES)}, optionally :TICK")
    return phase, int(tick or 1)


class Daemon:
    def __init__(self, *, controller: Controller, source, actuator, shadow, store, metrics: DaemonMetrics,
                 clock: Clock, logger: logging.Logger, mode: Mode, profile: str = "balanced",
                 on_tick: Callable[[TickReport], None] | None = None, learning=None,
                 leadership: Leadership | None = None, otel: TickTelemetry | None = None,
                 costs: CostTracker | None = None) -> None:
        self.controller = controller
        self.source = source
        self.actuator = actuator  # None when no actuator is configured (shadow only)
        self.shadow = shadow
        self.store = store
        self.metrics = metrics
        self.clock = clock
        self.log = logger
        self.on_tick = on_tick
        self.learning = learning  # runtime.learning.Learning, or None (no learned models)
        self.leadership = leadership  # None: no leader election, this daemon always leads
        self.otel = otel  # obs/otel.py: a span per tick and per phase, over OTLP; None when not configured
        self.costs = costs  # runtime/costs.py: spend and the pickers' task outcomes; None: not tracked
        self._lock = threading.RLock()
        # A mode or profile set through the API survives a restart; otherwise the configured one applies.
        stored_mode = store.get_mode()
        self.mode = Mode(stored_mode) if stored_mode else mode
        self.profile = store.get_profile() or profile
        self.state: ControllerState = controller.initial_state(generation=store.peek_generation())
        self.last_report: TickReport | None = None
        self.last_tick_s: float = 0.0
        self.applied_replicas: dict[str, int] = {}  # last replica targets sent in active mode (served to KEDA)
        self.after_tick: list[Callable[[], None]] = []
        self.store_problem = ""  # the last state-store write that failed ("" while writes succeed)
        self.reload_result: tuple[bool, str, float] | None = None  # (ok, detail, at_s) of the last SIGHUP reload
        self._ticks = 0
        self._kill_at = _kill_point()
        self._side = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fleet-state")  # beside the read
        metrics.set_mode(self.mode)

    def _phase(self, name: str) -> None:
        """A fault-injection point: SIGKILL here when GOVERNOR_FAULT_KILL_AT names this phase and tick."""
        if self._kill_at is not None and self._kill_at == (name, self._ticks):
            self.log.warning(f"fault injection: SIGKILL at phase {name} of tick {self._ticks}",
                             extra={"event": "fault_kill", "phase": name})
            for h in logging.getLogger().handlers + self.log.handlers:
                h.flush()
            os.kill(os.getpid(), signal.SIGKILL)

    def _store_write(self, what: str, write: Callable[[], object]) -> bool:
        """Run one state-store write; on failure report it (status, metric, log) and return False."""
        try:
            write()
        except _STORE_ERRORS as exc:
            self.store_problem = f"{what}: {exc}"
            self.metrics.store_errors.labels(what).inc()
            self.log.error(f"state store: cannot write the {what}: {exc}", extra={"event": "store_error"})
            return False
        if self.store_problem.startswith(f"{what}:"):
            self.store_problem = ""
        return True

    # ------------------------------------------------------------------ tick

    def _fleet_state(self) -> Mapping[str, PoolPhases] | None:
        """Replicas per phase as the autoscaler reports them (None when unknown); `Controller.step`
        merges them into the telemetry (core/estimate.py)."""
        state = self.actuator.fleet_state() if self.actuator is not None else None
        return state.pools if state else None

    def _read(self, now_s: float):
        """The telemetry and the autoscaler's fleet state, side by side (each bounded by its own timeout)."""
        pending = self._side.submit(self._fleet_state) if self.actuator is not None else None
        raw = self.source.read(now_s)
        fleet_state = None
        if pending is not None:
            try:
                fleet_state = pending.result()
            except Exception as exc:  # noqa: BLE001 - an actuator that cannot say is "unknown", never a crash
                self.log.warning(f"fleet state unavailable: {exc}", extra={"event": "fleet_state"})
        return raw, fleet_state

    def tick(self) -> TickReport:
        with self._lock:
            clock = self.clock
            self._ticks += 1
            t0 = clock.monotonic_s()
            now_s = clock.now_s()
            raw, fleet_state = self._read(now_s)
            self._phase("read")
            t1 = clock.monotonic_s()
            leading = self.leadership is None or self.leadership.leading()
            if getattr(self.store, "replicated", False):
                self._sync_shared_state(now_s, leading)
            self._store_write("override expiry", lambda: self.store.expire_overrides(now_s))
            overrides = self.store.active_overrides(now_s)
            in_force = self.state.current
            if self.leadership is not None and not leading and not getattr(self.store, "replicated", False):
                self._follow_leader_mode(now_s)
            if self.leadership is not None and leading:
                floor = self.leadership.generation_floor()
                if self.state.generation < floor:  # a new term: number above every earlier term's decisions
                    self.state = replace(self.state, generation=floor)
            self.state, result = self.controller.step(
                self.state, TickInput(now_s=now_s, observation=raw, fleet_state=fleet_state, mode=self.mode,
                                      overrides=overrides, profile=self.profile, tasks=self._task_profile()))
            obs = result.estimate.observation  # the telemetry with the autoscaler's replica phases
            self._phase("step")
            t2 = clock.monotonic_s()
            outcome = None
            d = result.decision
            if d is not None:
                # persisted before sending: a restart never goes backwards (nor reuses a generation)
                persisted = self._store_write("generation", lambda: self.store.advance_generation_to(d.generation))
                self._phase("persist")
                # Checked again right before sending: the step may have taken a while.
                leading = leading and (self.leadership is None or self.leadership.leading())
                if not persisted and self.mode is Mode.ACTIVE and self.actuator is not None and leading:
                    outcome = ActuationOutcome(d.decision_id, d.generation, FAILED,
                                               detail=f"not sent: the state store cannot persist generation "
                                                      f"{d.generation} ({self.store_problem})")
                elif self.mode is Mode.ACTIVE and self.actuator is not None and leading:
                    outcome = self._apply(d, t0)
                if self.mode is Mode.ACTIVE and leading and persisted:
                    self.applied_replicas = {p: pd.replicas for p, pd in d.pools.items()}
                if outcome is None:
                    outcome = self.shadow.apply(d)
                self._phase("actuate")
            t3 = clock.monotonic_s()
            if self.learning is not None:
                self.learning.on_tick(now_s, obs, in_force)
            self._phase("learn")
            t4 = clock.monotonic_s()
            durations = {"read_ms": (t1 - t0) * 1e3, "step_ms": (t2 - t1) * 1e3, "actuate_ms": (t3 - t2) * 1e3,
                         "learn_ms": (t4 - t3) * 1e3}
            record = result.record()
            record["outcome"] = outcome.status if outcome is not None else "paused"
            record["outcome_detail"] = getattr(outcome, "detail", "")
            record["durations_ms"] = durations
            costs = self._observe_costs(now_s, obs)
            if costs is not None:
                record["costs"] = costs.to_dict()
            if self.leadership is not None:
                record["leader"] = leading
            if d is not None:
                self._store_write("decision record", lambda: self.store.record_decision(record))
                self._phase("record")
            self._report_metrics(result, obs, outcome, durations)
            self._log_tick(result, outcome, durations)
            if self.otel is not None:
                self._trace_tick(now_s, (t0, t1, t2, t3, t4), result, obs, outcome, leading)
            report = TickReport(result, obs, outcome, durations, costs)
            self.last_report = report
            self.last_tick_s = now_s
        for hook in self.after_tick:
            hook()
        if self.on_tick is not None:
            self.on_tick(report)
        return report

    def _task_profile(self) -> TaskProfile | None:
        """The pickers' task profile as of the last tick's reading (obs/task_cost.py), for the planner; None
        without pickers or before two readings. A failure to build it never stops the tick."""
        if self.costs is None:
            return None
        try:
            return self.costs.task_profile()
        except Exception as exc:  # noqa: BLE001 - the planner then weighs steps statically this tick
            self.log.warning(f"task profile failed: {exc!r}", extra={"event": "costs"})
            return None

    def _observe_costs(self, now_s: float, obs: FleetObservation) -> CostSnapshot | None:
        if self.costs is None:
            return None
        try:
            snap = self.costs.observe(now_s, obs)
        except Exception as exc:  # noqa: BLE001 - the accounting must never stop a tick
            self.log.warning(f"cost accounting failed: {exc!r}", extra={"event": "costs"})
            return None
        self.metrics.observe_costs(snap)
        return snap

    def _apply(self, d, t0: float):
        """Send a decision within what is left of the tick's budget (an actuator that takes a deadline
        stops retrying at it; controller/actuation/grpc_actuator.py)."""
        if getattr(self.actuator, "takes_deadline", False):
            return self.actuator.apply(d, deadline_s=t0 + PLAN_SHARE * self.controller.tick_s)
        return self.actuator.apply(d)

    def _sync_shared_state(self, now_s: float, leading: bool) -> None:
        """Under leader election with the state in the API server (controller/api/kube_store.py): read the
        shared overrides, audit trail and mode; the leader claims the object for its term and publishes its
        refit verdict; every replica runs in the shared mode (a takeover keeps the one operators set)."""
        store = self.store
        if not self._store_write("shared state", store.sync):
            return
        if leading:
            self._store_write("shared state", lambda: store.claim(now_s))
            last = self.learning.job.last if self.learning is not None else None
            shared = store.get_refit()
            if last is not None and (shared is None or shared.get("at_s", 0.0) < last.at_s):
                self._store_write("refit verdict",
                                  lambda: store.set_refit({**last.to_dict(), "by": self._identity()}))
        stored = store.get_mode()
        if stored in {m.value for m in Mode} and Mode(stored) is not self.mode:
            previous, self.mode = self.mode, Mode(stored)
            self.metrics.set_mode(self.mode)
            self.log.warning(f"mode {previous.value} → {self.mode.value} (the shared state's)",
                             extra={"event": "mode", "author": "shared state", "reason": "GovernorState"})

    def _identity(self) -> str:
        return self.leadership.identity if self.leadership is not None else ""

    def _follow_leader_mode(self, now_s: float) -> None:
        """A follower takes the mode the leader publishes, so a takeover keeps the mode operators set."""
        from controller.runtime.leader import ANNOTATION_MODE

        assert self.leadership is not None
        holder, annotations = self.leadership.leader()
        published = annotations.get(ANNOTATION_MODE, "")
        if not holder or published not in {m.value for m in Mode} or Mode(published) is self.mode:
            return
        previous, self.mode = self.mode, Mode(published)
        self.metrics.set_mode(self.mode)
        self.store.set_mode(self.mode, author=f"leader {holder}", now_s=now_s, reason="follows the leader's mode")
        self.log.warning(f"mode {previous.value} → {self.mode.value} (the leader's)",
                         extra={"event": "mode", "author": f"leader {holder}", "reason": "follows the leader"})

    def keda_targets(self) -> dict[str, int]:
        """Replica targets for KEDA: what was decided in active mode; before that (or in shadow/paused
        mode) what the fleet already runs, so KEDA changes nothing until Governor is active."""
        if self.leadership is not None and not self.leadership.leading():
            published = self.leadership.leader_targets()
            if published:
                return published
        with self._lock:
            if self.applied_replicas:
                return dict(self.applied_replicas)
            rep = self.last_report
            out = {}
            if rep is not None:
                for name, p in rep.observation.pools.items():
                    if p.replicas_ready.ok:
                        out[name] = int(p.replicas_ready.value + p.replicas_starting.or_default(0.0))
            return out

    def reload(self, controller: Controller, physics: Mapping[str, Any] | None = None) -> None:
        """Swap in a controller built from a reloaded config; the controller state carries over
        (generation, decision in force); the policy's own state restarts if the policy changed. When the
        pools changed, the telemetry source reads the new list and learning (given each pool's `physics`)
        scores and refits with it from the next tick."""
        with self._lock:
            same_policy = controller.policy.name == self.controller.policy.name
            before = [p.name for p in self.controller.fleet.pools]
            self.controller = controller
            if not same_policy:
                self.state = replace(self.state, policy_state=controller.policy.initial_state())
            after = [p.name for p in controller.fleet.pools]
            if after != before:
                set_pools = getattr(self.source, "set_pools", None)
                if callable(set_pools):
                    set_pools(after)
                if self.learning is not None and physics is not None:
                    self.learning.set_physics(physics)
            self.note_reload(True, f"pools {after}", self.clock.now_s())

    def note_reload(self, ok: bool, detail: str, at_s: float) -> None:
        """Keep a reload's result for `governor status` and governor_config_reloads."""
        self.reload_result = (ok, detail, at_s)
        self.metrics.config_reloads.labels("ok" if ok else "failed").inc()

    def _report_metrics(self, result: TickResult, obs: FleetObservation, outcome, durations: dict[str, float]) -> None:
        m = self.metrics
        m.observe_tick(result, obs)
        m.observe_slos(obs.at_s, obs, self.controller.fleet.slos)
        if self.leadership is not None:
            m.leader.labels(self.leadership.lease_name).set(1 if self.leadership.leading() else 0)
        m.ticks.labels("paused" if result.decision is None else "decided").inc()
        for phase, ms in durations.items():
            m.tick_duration.labels(phase.removesuffix("_ms")).observe(ms / 1e3)
        if outcome is not None:
            m.decisions.labels(outcome.status).inc()
            for target, r in outcome.targets.items():
                m.actuation.labels(target, r.status).inc()
        if result.status.candidates is not None:  # a planner's search (the MPC's)
            m.planner_candidates.set(float(result.status.candidates))
            if result.status.budget_cut:
                m.planner_budget_cut.inc()
        if result.breaker is not None:
            m.breaker_stage.set(float(result.breaker.stage))
            m.breaker_trips.set(float(result.breaker.trips))
        if self.learning is not None:
            for name, v in self.learning.tracker.snapshot().errors.items():
                if v is not None:
                    m.model_error.labels(name).set(v)
        slos = self.controller.fleet.slos
        if slos:
            m.slo_ttft.set(min(s.ttft_s for s in slos.values()))

    def _trace_tick(self, now_s: float, t: tuple[float, float, float, float, float], result: TickResult,
                    obs: FleetObservation, outcome, leading: bool) -> None:
        assert self.otel is not None
        d = result.decision
        status = outcome.status if outcome is not None else "paused"
        attrs: dict[str, str | bool | int | float] = {
            "governor.mode": result.mode.value, "governor.policy": self.controller.policy.name,
            "governor.profile": self.profile, "governor.outcome": status, "governor.changed": result.changed,
            "governor.frozen": result.frozen, "governor.leader": leading,
        }
        if d is not None:
            attrs.update({"governor.decision_id": d.decision_id, "governor.generation": d.generation})
        stale = sorted(p for p, s in result.telemetry.items() if s != "ok")
        phases = [
            Phase("read", 0.0, t[1] - t[0], {"governor.telemetry.source": obs.source or self.source.name,
                                             "governor.pools": len(obs.pools),
                                             "governor.telemetry.not_ok": ",".join(stale)}),
            Phase("step", t[1] - t[0], t[2] - t[0], {"governor.reasons": ",".join(
                sorted({r.code for r in result.policy_reasons})), "governor.guards": ",".join(
                sorted({r.code for r in result.guard_adjustments}))}),
            Phase("actuate", t[2] - t[0], t[3] - t[0], {"governor.outcome": status,
                                                        "governor.targets": ",".join(
                                                            getattr(outcome, "targets", {}) or {})}),
            Phase("learn", t[3] - t[0], t[4] - t[0], {"governor.learning": self.learning is not None}),
        ]
        failed = outcome is not None and outcome.status == "failed"
        self.otel.record_tick(now_s, phases, attrs,
                              error=f"actuation failed: {getattr(outcome, 'detail', '')}" if failed else None)

    def _log_tick(self, result: TickResult, outcome, durations: dict[str, float]) -> None:
        d = result.decision
        failed = outcome is not None and outcome.status == "failed"
        level = logging.WARNING if result.frozen or failed else logging.INFO
        self.log.log(level, result.explanation.splitlines()[0] if result.explanation else "tick", extra={
            "event": "tick",
            "decision_id": d.decision_id if d else None,
            "generation": d.generation if d else None,
            "mode": result.mode.value,
            "changed": result.changed,
            "frozen": result.frozen,
            "replicas": {p: pd.replicas for p, pd in d.pools.items()} if d else {},
            "telemetry": dict(result.telemetry),
            "reasons": sorted({r.code for r in result.policy_reasons}),
            "guards": sorted({r.code for r in result.guard_adjustments}),
            "outcome": outcome.status if outcome is not None else "paused",
            **{k: round(v, 2) for k, v in durations.items()},
        })

    # ------------------------------------------------------- DaemonHandle

    def pool_names(self) -> list[str]:
        return [p.name for p in self.controller.fleet.pools]

    def set_mode(self, mode: Mode, author: str, reason: str) -> None:
        """Switch mode from the next tick on (the API server persists it with an audit entry)."""
        with self._lock:
            previous, self.mode = self.mode, Mode(mode)
            self.metrics.set_mode(self.mode)
        self.log.warning(f"mode {previous.value} → {self.mode.value}",
                         extra={"event": "mode", "author": author, "reason": reason})

    def write_refusal(self) -> str | None:
        le = self.leadership
        if le is None or le.leading():
            return None
        holder, annotations = le.leader()
        from controller.runtime.leader import ANNOTATION_ADDRESS

        where = f" at {annotations[ANNOTATION_ADDRESS]}" if annotations.get(ANNOTATION_ADDRESS) else ""
        who = f"the leader is {holder}{where}" if holder else "no leader is known yet"
        return (f"this daemon ({le.identity}) does not lead shard {le.lease_name!r}: {who}; "
                "send writes (mode, overrides) to the leader")

    def published_targets(self) -> dict[str, int]:
        """What the leader publishes in its Lease for followers; read without the tick lock (the elector's
        thread must never wait for a tick)."""
        return dict(self.applied_replicas)

    def on_overrides_changed(self) -> None:
        self.log.info("overrides changed; they apply from the next tick", extra={"event": "overrides"})

    def status(self) -> StatusView:
        rep = self.last_report
        pools = []
        slo = min((s.ttft_s for s in self.controller.fleet.slos.values()), default=float("nan"))
        for spec in self.controller.fleet.pools:
            p = rep.observation.pools.get(spec.name) if rep else None
            d = rep.result.decision.pools.get(spec.name) if rep and rep.result.decision else None
            pools.append(PoolStatusView(
                pool=spec.name,
                replicas_desired=d.replicas if d else -1,
                replicas_ready=int(p.replicas_ready.value) if p and p.replicas_ready.ok else -1,
                ttft_p95_s=p.ttft_p95_s.value if p and p.ttft_p95_s.ok else float("nan"),
                slo_ttft_s=slo,
                hit_rate=p.hit_rate.value if p and p.hit_rate.ok else float("nan"),
                telemetry=rep.result.telemetry.get(spec.name, "missing") if rep else "missing",
                gpu_mem_used_frac=p.gpu_mem_used_frac.value if p and p.gpu_mem_used_frac.ok else float("nan"),
            ))
        components = []
        ok, detail = self.source.health()
        components.append(ComponentStatus(f"telemetry:{self.source.name}", ok, detail, self.last_tick_s if ok else 0.0))
        if self.actuator is not None:
            ok, detail = self.actuator.health()
            components.append(ComponentStatus("actuator:grpc", ok, detail, self.last_tick_s if ok else 0.0))
        components.append(ComponentStatus("state:store", not self.store_problem,
                                          self.store_problem or "writes succeed", 0.0 if self.store_problem
                                          else self.last_tick_s))
        decision = rep.result.decision if rep else None
        details: list[tuple[str, str]] = []
        if rep is not None:
            stale = sorted(p for p, st in rep.result.telemetry.items() if st != "ok")
            details.append(("telemetry.frozen", str(rep.result.frozen).lower()))
            if stale:
                details.append(("telemetry.not_ok", ", ".join(f"{p}={rep.result.telemetry[p]}" for p in stale)))
        if self.reload_result is not None:
            ok, what, _at = self.reload_result
            details.append(("config.reload", ("ok: " if ok else "failed, running config kept: ") + what))
        if self.leadership is not None:
            holder, _ = self.leadership.leader()
            details.append(("leader.lease", self.leadership.lease_name))
            details.append(("leader.leading", str(self.leadership.leading()).lower()))
            details.append(("leader.holder", holder or "none"))
        if self.learning is not None:
            ls = self.learning.status()
            details.append(("models.source", ls["source"]))
            for name, v in ls["tracker"]["errors"].items():
                shown = ("n/a (not enough ticks yet)" if v is None
                         else (f"{v:.1%}" if name.endswith("_ape") else f"{v:.3g}"))
                details.append((f"models.{name}", shown))
            if ls["tracker"].get("confidence") is not None:
                details.append(("models.confidence", f"{ls['tracker']['confidence']:.2f}"))
            if ls["last_refit"]:
                lr = ls["last_refit"]
                details.append(("models.last_refit",
                                ", ".join(f"{k}={v}" for k, v in lr.items() if not isinstance(v, (dict, list)))))
        shared_refit = self.store.get_refit() if getattr(self.store, "replicated", False) else None
        if shared_refit:  # the leader's last verdict, from the shared state (it survives a failover)
            details.append(("models.leader_refit", ", ".join(f"{k}={v}" for k, v in sorted(shared_refit.items())
                                                             if not isinstance(v, (dict, list)))))
        if getattr(self.store, "replicated", False):
            who, epoch = self.store.writer
            details.append(("state.shared", f"GovernorState {self.store.api.namespace}/{self.store.api.name}, "
                                            f"last written by {who or 'nobody'} (term {epoch})"))
        if rep is not None:  # what the policy reports of the last tick (typed: PolicyStatus)
            details.extend(rep.result.status.lines)
        if rep is not None and rep.costs is not None:
            details.extend(cost_details(rep.costs))
        if rep is not None and rep.result.breaker is not None:  # the cascading-failure breaker (core/breaker.py)
            details.extend(rep.result.breaker.lines())
        return StatusView(
            mode=self.mode, profile=self.profile, policy=self.controller.policy.name,
            last_tick_s=self.last_tick_s, last_decision_id=decision.decision_id if decision else "",
            generation=self.state.generation, components=tuple(components), pools=tuple(pools),
            telemetry_frozen=bool(rep and rep.result.frozen), details=tuple(details),
        )


def cost_details(c: CostSnapshot) -> list[tuple[str, str]]:
    """`governor status` lines: spend, tasks and cost per successful task so far (and on what basis)."""
    out = [("cost.spend_usd_per_hour", ", ".join(f"{p}={v:.2f}" for p, v in sorted(c.spend_usd_per_hour.items()))
            + f" (total {sum(c.spend_usd_per_hour.values()):.2f})"),
           ("cost.spend_usd", f"{c.spend_usd:.4f} over {c.watched_s:.0f} s")]
    if c.basis == "none":
        out.append(("cost.per_successful_task", "unknown: no picker's task counters (governor_picker_tasks_total) "
                                                "among the router targets"))
        return out
    share = c.success_share()
    out.append(("tasks", f"started {c.count('started'):.0f}, completed {c.count('completed'):.0f}, failed "
                         f"{c.count('failed'):.0f}, abandoned {c.count('abandoned'):.0f}"
                + (f" ({share:.1%} of settled tasks completed)" if share is not None else "")))
    per = "n/a (none completed yet)" if c.cost_per_success_usd is None else f"{c.cost_per_success_usd:.5f} USD"
    note = (" — per request: no request carried x-governor-task-id, so each request counts as a task"
            if c.basis == "requests" else "")
    out.append(("cost.per_successful_task", per + note))
    return out

