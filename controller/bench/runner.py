"""Replay one scenario under one policy: the bench's closed loop on a virtual clock.

`run_policy(scenario, name, seed=...)` builds the simulated fleet, the in-process
observer and the same pure `Controller` the daemon drives, then loops:

    advance the fleet to t → observe → Controller.step → apply_decision

every `tick_s` simulated seconds until every task is resolved. The result is a
`RunResult`: the fleet's summary, its timeline and how many decisions and scaling
actions were made. Same scenario, policy, parameters and seed → the same result,
bit for bit (nothing here reads the wall clock or draws unseeded randomness).

Policy parameters that depend on the scenario (the static replica counts, the
SLA planner's per-replica capacity) are not invented here: the caller passes them
(`controller.bench.side_by_side` derives them from the profile). Must not: print,
write files, or read the wall clock.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from controller.bench.observe import SimObserver
from controller.bench.task_profile import sim_task_profile
from controller.core.breaker import DEFAULT_BREAKER, BreakerConfig
from controller.core.estimate import DEFAULT_ESTIMATOR, EstimatorConfig
from controller.core.guards import GuardConfig
from controller.core.outliers import OutlierConfig
from controller.core.step import Controller, TickInput
from controller.perf.engine_figures import EngineFigures
from controller.policies.registry import breaker_for, build_policy, estimator_for, figures_in, outliers_for
from controller.sim.control import apply_decision
from controller.sim.fleet import Fleet
from controller.sim.fleet_accounting import TimelinePoint
from controller.sim.fleetspec import fleet_spec_from_scenario
from controller.sim.scenario import Scenario
from controller.sim.workload import Workload
from controller.types import PRIORITY_CLASSES, Override, Policy

# The loop stops this long after the trace's last arrival even if tasks are still open
# (a safety net: the fleet's own timeouts resolve every task well before).
MAX_TAIL_S = 7200.0
OBSERVE_WINDOW_S = 60.0  # the observer's rate/quantile window, as the daemon's default scrape window
DECISION_VALIDITY_S = 120.0

Progress = Callable[[float, float], None]  # (simulated seconds done, expected total)


@dataclass(frozen=True)
class RunResult:
    """One policy on one scenario. `summary` is `SimSummary.to_dict()` (JSON-ready)."""

    scenario: str
    policy: str
    seed: int
    tick_s: float
    summary: Mapping[str, Any]
    timeline: tuple[Mapping[str, Any], ...]
    decisions: int  # ticks that produced a decision
    changed_decisions: int  # decisions that differ from the one in force
    scaling_actions: int  # replica/standby target changes the fleet applied
    request_slo_attainment: Mapping[str, float | None] = field(default_factory=dict)  # per class, see below
    params: Mapping[str, Any] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)  # e.g. the oracle's margin and schedule

    def to_dict(self) -> dict[str, Any]:
        return {"scenario": self.scenario, "policy": self.policy, "seed": self.seed, "tick_s": self.tick_s,
                "summary": dict(self.summary), "decisions": self.decisions,
                "changed_decisions": self.changed_decisions, "scaling_actions": self.scaling_actions,
                "request_slo_attainment": _jsonable(self.request_slo_attainment), "params": _jsonable(self.params),
                "extra": _jsonable(self.extra)}


def _jsonable(v: Any) -> Any:
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, Mapping):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if hasattr(v, "__dataclass_fields__"):
        return _jsonable({k: getattr(v, k) for k in v.__dataclass_fields__})
    if hasattr(v, "item"):  # numpy scalars
        return _jsonable(v.item())
    return v


def timeline_dict(p: TimelinePoint) -> dict[str, Any]:
    return _jsonable({
        "t_s": p.t_s,
        "pools": {name: {"replicas_ready": pp.replicas_ready, "replicas_target": pp.replicas_target,
                         "arrival_rps": pp.arrival_rps, "ttft_p95_s": pp.ttft_p95_s, "hit_rate": pp.hit_rate,
                         "kv_usage_frac": pp.kv_usage_frac, "gpu_busy_frac": pp.gpu_busy_frac}
                  for name, pp in p.pools.items()},
        "shed": dict(p.shed),
        "cost_usd": p.cost_usd,
    })


def request_slo_attainment(fleet: Fleet, from_s: float = 0.0) -> dict[str, float | None]:
    """Per class: the fraction of requests sent (at least once) that completed within both their SLOs.

    The request-level figure a p95 SLO speaks of (the summary's slo_attainment is per task).
    Only requests of tasks whose first step arrived at or after `from_s` count. None for a
    class with no such request.
    """
    rec = fleet.request_records()
    sent = rec["attempts"] > 0
    if from_s > 0:
        wl = fleet.workload
        task_start = np.asarray(wl.trace.arrival_s)[wl.task_first_index()]
        sent &= task_start[wl.task_id] >= from_s
    prio = np.asarray(fleet.workload.priority)
    out: dict[str, float | None] = {}
    for k, c in enumerate(PRIORITY_CLASSES):
        mask = sent & (prio == k)
        n = int(mask.sum())
        out[c] = float(rec["slo_met"][mask].sum()) / n if n else None
    return out


def task_slo_attainment(fleet: Fleet, from_s: float = 0.0) -> dict[str, float | None]:
    """Per class: the fraction of tasks whose every request completed within both its SLOs.

    The task-level figure the bench table reports (a task with a step that was shed, failed,
    late or never sent is not met), over tasks whose first step arrived at or after `from_s`.
    Example: 3 critical tasks after from_s, one with a late second step → 2/3. None for a class
    with no such task.
    """
    rec = fleet.request_records()
    wl = fleet.workload
    tid = np.asarray(wl.task_id)
    bad_task = np.bincount(tid, weights=(~rec["slo_met"]).astype(np.float64), minlength=wl.n_tasks) > 0
    first = wl.task_first_index()
    start = np.asarray(wl.trace.arrival_s)[first]
    prio = np.asarray(wl.priority)[first]
    keep = start >= from_s
    out: dict[str, float | None] = {}
    for k, c in enumerate(PRIORITY_CLASSES):
        mask = keep & (prio == k)
        n = int(mask.sum())
        out[c] = float((~bad_task[mask]).sum()) / n if n else None
    return out


def late_requests(fleet: Fleet, from_s: float = 0.0) -> dict[str, np.ndarray]:
    """Send times and classes of the requests (of tasks that started at or after `from_s`) that
    were sent and did not meet their SLOs, and the send times of all such sent requests.

    What the oracle's repair reads to find the minutes that need more replicas. Not JSON: callers
    must not put it in a report.
    """
    rec = fleet.request_records()
    wl = fleet.workload
    task_start = np.asarray(wl.trace.arrival_s)[wl.task_first_index()]
    sent = (rec["attempts"] > 0) & (task_start[wl.task_id] >= from_s)
    bad = sent & ~rec["slo_met"]
    return {"late_sent_s": rec["sent_s"][bad], "late_prio": np.asarray(wl.priority)[bad],
            "sent_s": rec["sent_s"][sent]}


RECOVERY_WINDOW_S = 30.0  # crash recovery: critical requests judged per 30 s of send time...
RECOVERY_LATE_FRAC = 0.01  # ...and recovered once under 1 % of them are late...
RECOVERY_CALM_WINDOWS = 3  # ...for this many windows in a row
RECOVERY_HORIZON_S = 1800.0  # not recovered within this → None


def crash_recovery(fleet: Fleet) -> dict[str, Any] | None:
    """How the first scheduled crash went for the critical class, or None without one.

    recovery_s: from the crash until the first of `RECOVERY_CALM_WINDOWS` consecutive 30 s
    windows (by send time) in which under 1 % of the critical requests sent missed their SLO
    (windows with no critical request count as calm); None if that does not happen within
    30 minutes. critical_late_frac_10min: the late share of critical requests sent in the 10
    minutes after the crash. Example: late shares 4 %, 2 %, 0.5 %, 0.3 %, 0 % in the windows
    after a crash at 1,640 s → recovery_s = 60 (the calm run starts at the third window).
    """
    crashes = [f.at_s for f in fleet.scenario.faults if f.kind == "crash" and f.at_s is not None]
    if not crashes:
        return None
    at = float(min(crashes))
    rec = fleet.request_records()
    crit = (np.asarray(fleet.workload.priority) == PRIORITY_CLASSES.index("critical")) & (rec["attempts"] > 0)
    sent, late = rec["sent_s"][crit], ~rec["slo_met"][crit]

    def late_frac(lo: float, hi: float) -> float | None:
        m = (sent >= lo) & (sent < hi)
        return float(late[m].mean()) if m.any() else None

    recovery = None
    n = int(RECOVERY_HORIZON_S // RECOVERY_WINDOW_S)
    calm = [(f := late_frac(at + k * RECOVERY_WINDOW_S, at + (k + 1) * RECOVERY_WINDOW_S)) is None
            or f < RECOVERY_LATE_FRAC for k in range(n + RECOVERY_CALM_WINDOWS)]
    for k in range(n):
        if all(calm[k:k + RECOVERY_CALM_WINDOWS]):
            recovery = k * RECOVERY_WINDOW_S
            break
    return {"at_s": at, "recovery_s": recovery, "critical_late_frac_10min": late_frac(at, at + 600.0)}


def expected_end_s(fleet: Fleet) -> float:
    """Rough simulated length, for progress bars: the last arrival plus a little drain."""
    arr = fleet.workload.trace.arrival_s
    end = float(arr[-1]) if len(arr) else 0.0
    if fleet.scenario.duration_s is not None:
        return float(fleet.scenario.duration_s)
    return end + 60.0


def run_closed_loop(scenario: Scenario, policy: Policy, *, seed: int, tick_s: float = 15.0,
                    workload: Workload | None = None, progress: Progress | None = None,
                    label: str | None = None, params: Mapping[str, Any] | None = None,
                    guards: GuardConfig | None = None, slo_check_from_s: float | None = None,
                    profile: str = "balanced", breaker: BreakerConfig | None = DEFAULT_BREAKER,
                    estimator: EstimatorConfig = DEFAULT_ESTIMATOR, outliers: OutlierConfig | None = None,
                    engine_figures: Mapping[str, EngineFigures] | None = None, overrides: Sequence[Override] = (),
                    measure: Callable[[Fleet], Mapping[str, Any]] | None = None,
                    task_profile: bool = True) -> RunResult:
    """Drive `policy` over the scenario: the loop every driver of the core shares. `profile` is the
    objective profile each tick carries, as the daemon's config sets it (only the MPC reads it);
    `breaker` the controller's breaker (None: none, for the yardsticks replayed as found); `engine_figures`
    the step-time figures by pool the controller judges slow replicas on (None: each engine's default);
    `overrides` are operator overrides every tick carries (an SLO the policy is told, as `governor
    override` sets one); `measure`, when given, reads the finished fleet and its mapping joins
    `extra` (figures a bench needs beyond the summary); `task_profile`: each tick carries the step profile
    measured from the simulator's tasks (controller/bench/task_profile.py; None where no task is labelled), as
    the daemon carries the picker's: False plans on the static steps-per-task weight instead."""
    if not (math.isfinite(tick_s) and tick_s > 0):
        raise ValueError(f"tick_s must be a finite number > 0 (got {tick_s!r})")
    fleet = Fleet(scenario, seed=seed, workload=workload)
    observer = SimObserver(fleet, window_s=OBSERVE_WINDOW_S)
    controller = Controller(fleet_spec_from_scenario(scenario), policy, guards=guards or GuardConfig(), breaker=breaker,
                            estimator=estimator, outliers=outliers, engine_figures=engine_figures,
                            decision_validity_s=DECISION_VALIDITY_S, seed=seed, tick_s=tick_s)
    state = controller.initial_state()
    total_s = expected_end_s(fleet)
    hard_stop_s = total_s - 60.0 + MAX_TAIL_S
    decisions = changed = 0
    t = 0.0
    k = 0
    while not fleet.done and t < hard_stop_s:
        k += 1
        t = k * tick_s  # multiply, not accumulate: no float drift between runs of different length
        fleet.run_until(t)
        if fleet.done:
            break
        tasks = sim_task_profile(fleet, t) if task_profile else None
        state, result = controller.step(state, TickInput(now_s=t, observation=observer.read(t),
                                                         fleet_state=observer.fleet_state(), profile=profile,
                                                         overrides=tuple(overrides), tasks=tasks))
        if result.decision is not None:
            apply_decision(fleet, result.decision)
            decisions += 1
            changed += int(result.changed)
        if progress is not None:
            progress(t, total_s)
    summary = fleet.summary()
    attainment = request_slo_attainment(fleet)
    extra: dict[str, Any] = {}
    if slo_check_from_s is not None:
        extra = {"slo_check_from_s": slo_check_from_s,
                 "request_slo_attainment_checked": request_slo_attainment(fleet, slo_check_from_s),
                 "task_slo_attainment_checked": task_slo_attainment(fleet, slo_check_from_s),
                 "late_requests": late_requests(fleet, slo_check_from_s)}
    recovery = crash_recovery(fleet)
    if recovery is not None:
        extra["crash_recovery"] = recovery
    if measure is not None:
        extra.update(measure(fleet))
    if progress is not None:
        progress(total_s, total_s)
    return RunResult(scenario=scenario.name, policy=label or policy.name, seed=int(seed), tick_s=float(tick_s),
                     summary=summary.to_dict(), timeline=tuple(timeline_dict(p) for p in fleet.timeline()),
                     decisions=decisions, changed_decisions=changed, scaling_actions=int(summary.scaling_actions),
                     request_slo_attainment=attainment, params=dict(params or {}), extra=extra)


def run_policy(scenario: Scenario, policy_name: str, *, seed: int, tick_s: float = 15.0,
               params: Mapping[str, Any] | None = None, progress: Progress | None = None,
               workload: Workload | None = None, label: str | None = None, profile: str = "balanced",
               overrides: Sequence[Override] = (),
               measure: Callable[[Fleet], Mapping[str, Any]] | None = None,
               task_profile: bool = True) -> RunResult:
    """Replay `scenario` under the registered policy `policy_name` built with `params` (`overrides`,
    `measure`, `task_profile`: as `run_closed_loop`).

    Raises ValueError for an unknown policy or bad parameters (from `build_policy`).
    """
    policy = build_policy(policy_name, fleet_spec_from_scenario(scenario), params or {})
    recorded = {k: v for k, v in (params or {}).items() if not callable(v)}  # e.g. a model source: not data
    return run_closed_loop(scenario, policy, seed=seed, tick_s=tick_s, workload=workload, progress=progress,
                           label=label or policy_name, params=recorded, profile=profile,
                           breaker=breaker_for(policy_name, params), estimator=estimator_for(policy_name, params),
                           outliers=outliers_for(policy_name, params),
                           engine_figures=figures_in(policy_name, params), overrides=overrides, measure=measure,
                           task_profile=task_profile)
