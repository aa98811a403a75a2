"""The controller's one pure step: observation in, decision and its explanation out.

`Controller.step(state, tick_input) -> (state, TickResult)` is what the daemon,
the offline bench and the tests all drive. It does no I/O, reads no clock (time
is `tick_input.now_s`) and draws randomness only from a Generator seeded by
(seed, generation), so a replay with the same inputs gives the same decisions.

A tick: estimate the fleet (core/estimate.py: the autoscaler's replica phases
join the telemetry) → apply SLO/profile/reliability overrides to what the policy sees →
judge slow replicas (core/outliers.py, when configured: the policy and the breaker then see the
pool without its ejected replicas, `planning_view`) → advance the cascading-failure breaker
(core/breaker.py; its constraints go to the policy) → run the policy → hold the proposal to the
breaker's constraints, put the ejected replicas' slots back on the target, then apply the
guardrails (core/guards.py) and the operator's tenant and step-admission overrides (`forced_tenants`)
→ number the decision (generation, id, validity deadline) → explain it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from controller.core.breaker import (
    DEFAULT_BREAKER,
    BreakerConfig,
    BreakerState,
    BreakerStatus,
    advance_breaker,
    apply_breaker,
    breaker_reasons,
)
from controller.core.capacity import CapacityState, advance_capacity, capped_fleet
from controller.core.estimate import DEFAULT_ESTIMATOR, Estimate, EstimatorConfig, account_fleet, decided_caps, estimate
from controller.core.guards import GuardConfig, GuardState, apply_guards, forced_tenants, pool_telemetry_status
from controller.core.outliers import (
    OutlierConfig,
    OutlierResult,
    OutlierState,
    detect,
    planning_view,
    with_ejected_slots,
)
from controller.jsonsafe import json_safe
from controller.names import PROFILES
from controller.perf.engine_figures import EngineFigures
from controller.types import (
    BreakerAction,
    BreakerSignals,
    ClassAdmission,
    Decision,
    FleetObservation,
    FleetSpec,
    Mode,
    Override,
    Policy,
    PolicyInput,
    PolicyOutput,
    PolicyStatus,
    PoolDecision,
    PoolPhases,
    Reason,
    SloSpec,
    TaskProfile,
)


@dataclass(frozen=True, slots=True)
class ControllerState:
    generation: int = 0  # last generation issued (persisted by the edge so it never goes backwards)
    current: Decision | None = None  # the decision in force (the last safe one)
    policy_state: Any = None
    guard_state: GuardState = field(default_factory=GuardState)
    estimate: Estimate | None = None  # the last tick's estimate
    breaker: BreakerState = field(default_factory=BreakerState)
    capacity: CapacityState = field(default_factory=CapacityState)  # pools held for capacity that never came
    outliers: OutlierState = field(default_factory=OutlierState)  # slow replicas: strikes, ejections (outliers.py)


@dataclass(frozen=True, slots=True)
class TickInput:
    now_s: float
    observation: FleetObservation  # telemetry as read (no autoscaler state merged in)
    fleet_state: Mapping[str, PoolPhases] | None = None  # replicas per phase per pool, as the autoscaler reports
    mode: Mode = Mode.ACTIVE
    overrides: tuple[Override, ...] = ()
    profile: str = "balanced"
    # tasks, steps and tenants as the data plane measured them over its window (the picker's task book in the
    # daemon, the simulator's tasks in the bench); None: not measured, or no request carried a task id
    tasks: TaskProfile | None = None


@dataclass(frozen=True, slots=True)
class TickResult:
    decision: Decision | None  # None when paused
    mode: Mode
    changed: bool  # the decision differs from the one in force
    frozen: bool  # telemetry stale as a whole: the last safe decision is held
    policy_reasons: tuple[Reason, ...]
    guard_adjustments: tuple[Reason, ...]
    telemetry: Mapping[str, str]  # per pool: ok | partial | missing | stale
    diagnostics: Mapping[str, Any]
    overrides: tuple[Override, ...]  # overrides active at this tick
    explanation: str
    estimate: Estimate  # what the tick took the fleet to be (its observation is what the policy saw)
    breaker: BreakerStatus | None = None  # the breaker after this tick (None: paused, or no breaker)
    status: PolicyStatus = field(default_factory=PolicyStatus)  # the policy's typed status (status lines, gauges)

    def record(self) -> dict[str, Any]:
        """A JSON-ready account of the tick, stored for `governor explain`."""
        d = self.decision
        obs = self.diagnostics.get("observation", {})
        return {
            "decision_id": d.decision_id if d else None,
            "generation": d.generation if d else None,
            "at_s": d.at_s if d else None,
            "valid_until_s": d.valid_until_s if d else None,
            "mode": self.mode.value,
            "changed": self.changed,
            "frozen": self.frozen,
            "summary": self.explanation.splitlines()[0] if self.explanation else "",
            "pools": {p: asdict(pd) for p, pd in (d.pools.items() if d else ())},
            "admission": {c: asdict(a) for c, a in (d.admission.items() if d else ())},
            "tenants": {t: asdict(lim) for t, lim in (d.tenants.items() if d else ())},
            "step_aware": d.step_aware if d else None,
            "inputs": obs,
            "telemetry": dict(self.telemetry),
            "reasons": [_reason_dict(r) for r in self.policy_reasons],
            "guard_adjustments": [_reason_dict(r) for r in self.guard_adjustments],
            "overrides": [asdict(o) for o in self.overrides],
            "diagnostics": {k: v for k, v in self.diagnostics.items() if k != "observation"},
            "policy": self.diagnostics.get("policy"),
            "explanation": self.explanation,
        }


def _breaker_signals(est: Estimate, cfg: BreakerConfig) -> BreakerSignals:
    """What the estimate tells the breaker: the replacements the fleet started that nobody ordered (when
    the breaker counts losses that way, `count_replacements`) and whether the fleet carries its load."""
    lost = {p: a.unordered for p, a in est.pools.items()} if cfg.count_replacements else None
    return BreakerSignals(lost=lost, carried=est.carried)


def _less_ordered(signals: BreakerSignals, outliers: OutlierState, fleet: FleetSpec, now_s: float) -> BreakerSignals:
    """The breaker's `lost` replicas less the replacements of slow replicas ordered within each pool's cold
    start-up (their new replica shows as one nobody ordered until it is ready). A crash in the same pool within
    that time is under-counted by as many: the cost of not taking our own replacement for a cascade."""
    if not signals.lost:
        return signals
    ordered = outliers.replaced_since({p.name: now_s - p.startup_cold_s for p in fleet.pools})
    if not ordered:
        return signals
    return replace(signals, lost={p: max(n - ordered.get(p, 0), 0) for p, n in signals.lost.items()})


def _with_outliers(pools: Mapping[str, PoolDecision], out: OutlierResult) -> dict[str, PoolDecision]:
    """Each pool's decision with the replicas ejected now and those to replace this tick."""
    res = dict(pools)
    for name, pd in pools.items():
        ejected, again = out.ejected.get(name, ()), out.replace.get(name, ())
        if ejected != pd.ejected or again != pd.replace:
            res[name] = replace(pd, ejected=ejected, replace=again)
    return res


def _confidence(out: PolicyOutput) -> float | None:
    """The policy's model confidence, when it reports a finite one."""
    c = out.confidence
    return float(c) if c is not None and math.isfinite(c) else None


def _reason_dict(r: Reason) -> dict[str, Any]:
    return {"code": r.code, "message": r.message, "pool": r.pool, "data": json_safe(dict(r.data))}


def observation_summary(obs: FleetObservation) -> dict[str, Any]:
    """The inputs a decision was made from, compact and JSON-ready."""
    out: dict[str, Any] = {"at_s": obs.at_s, "source": obs.source, "errors": list(obs.errors),
                           "pools": {}, "classes": {}}
    for name, p in obs.pools.items():
        out["pools"][name] = {
            f: (json_safe(getattr(p, f).value) if getattr(p, f).ok else getattr(p, f).status.value)
            for f in ("replicas_ready", "replicas_starting", "arrival_rps", "running", "waiting", "kv_usage_frac",
                      "hit_rate", "ttft_p95_s", "tpot_p95_s", "gpu_util_frac", "gpu_mem_used_frac")
        }
    for name, c in obs.classes.items():
        out["classes"][name] = {
            f: (json_safe(getattr(c, f).value) if getattr(c, f).ok else getattr(c, f).status.value)
            for f in ("arrival_rps", "shed_rps", "queue_depth", "ttft_p95_s")
        }
    return out


class Controller:
    """Pure: holds only configuration; all mutable state travels in ControllerState.

    `breaker`: the cascading-failure breaker every policy runs under (core/breaker.py; None: no breaker,
    as the bench's yardsticks replay their schedules as found); `estimator`: how the estimate stage's
    replica accounting reads the fleet (core/estimate.py); `engine_figures`: each pool's step-time figures
    (perf/), as the composition root resolved its engine, which the slow-replica detection judges a replica's
    step time against (a pool not in it: its engine's default, perf/figures.py `figures_for`)."""

    def __init__(self, fleet: FleetSpec, policy: Policy, *, guards: GuardConfig | None = None,
                 breaker: BreakerConfig | None = DEFAULT_BREAKER, estimator: EstimatorConfig = DEFAULT_ESTIMATOR,
                 decision_validity_s: float = 120.0, seed: int = 0, tick_s: float = 15.0,
                 outliers: OutlierConfig | None = None,
                 engine_figures: Mapping[str, EngineFigures] | None = None) -> None:
        if decision_validity_s <= 0:
            raise ValueError(f"decision_validity_s must be > 0 (got {decision_validity_s})")
        self.fleet = fleet
        self.policy = policy
        self.guards = guards or GuardConfig()
        self.decision_validity_s = decision_validity_s
        self.seed = seed
        self.tick_s = tick_s
        self.breaker = breaker
        self.estimator = estimator
        # slow replicas (core/outliers.py): configured on the Controller like the breaker (the MPC's `outliers`
        # parameter, policies/registry.py outliers_for); None or disabled: off
        self.outliers = outliers if outliers is not None and outliers.enabled else None
        self.engine_figures: Mapping[str, EngineFigures] = dict(engine_figures or {})

    def initial_state(self, generation: int = 0, current: Decision | None = None) -> ControllerState:
        return ControllerState(generation=generation, current=current, policy_state=self.policy.initial_state())

    def _effective_fleet(self, overrides: tuple[Override, ...]) -> FleetSpec:
        slos = dict(self.fleet.slos)
        for o in overrides:
            if o.kind in ("slo_ttft", "slo_tpot") and o.priority_class in slos:
                s = slos[o.priority_class]
                slos[o.priority_class] = (SloSpec(ttft_s=o.value, tpot_s=s.tpot_s) if o.kind == "slo_ttft"
                                          else SloSpec(s.ttft_s, o.value))
        return replace(self.fleet, slos=slos)

    def _observed_current(self, obs: FleetObservation, prior: Decision | None) -> Decision | None:
        """In shadow mode nothing is applied, so the policy starts from what the fleet really runs."""
        pools: dict[str, PoolDecision] = {}
        for spec in self.fleet.pools:
            p = obs.pools.get(spec.name)
            base = prior.pools.get(spec.name) if prior else None
            if p is None or not p.replicas_ready.ok:
                if base is not None:
                    pools[spec.name] = base
                continue
            n = int(round(p.replicas_ready.value + p.replicas_starting.or_default(0.0)))
            pools[spec.name] = replace(base, replicas=n) if base else PoolDecision(replicas=n)
        if not pools:
            return prior
        return Decision(decision_id=prior.decision_id if prior else "observed",
                        generation=prior.generation if prior else 0,
                        at_s=obs.at_s, valid_until_s=obs.at_s, pools=pools,
                        admission=prior.admission if prior else {})

    def step(self, state: ControllerState, tick: TickInput) -> tuple[ControllerState, TickResult]:
        now_s = tick.now_s
        est = estimate(state.estimate, tick.observation, tick.fleet_state, now_s, tick.tasks)
        obs = est.observation
        active = tuple(o for o in tick.overrides if o.active(now_s))
        telemetry = {p.name: pool_telemetry_status(obs.pools.get(p.name)) for p in self.fleet.pools}
        inputs = observation_summary(obs)
        if tick.mode is Mode.PAUSED:
            return state, TickResult(
                None, tick.mode, False, False, (), (), telemetry, {"observation": inputs, "policy": self.policy.name},
                active, "paused: no decision made; actuators keep their settings until they expire", est)

        profile = next((o.text for o in reversed(active) if o.kind == "profile" and o.text in PROFILES), tick.profile)
        # the MPC's reliability dial, set live (policies that have no dial ignore it)
        reliability = next((o.value for o in reversed(active) if o.kind == "reliability"), None)
        capacity, capacity_reasons = advance_capacity(state.capacity, self.fleet, tick.fleet_state, now_s)
        fleet = capped_fleet(self._effective_fleet(active), capacity)
        current = self._observed_current(obs, state.current) if tick.mode is Mode.SHADOW else state.current
        generation = state.generation + 1
        rng = np.random.default_rng([self.seed, generation])
        est = account_fleet(est, state.estimate, fleet, current, self.estimator)  # once a tick, for everyone
        inp = PolicyInput(now_s=now_s, observation=obs, fleet=fleet, current=current, overrides=active,
                          profile=profile, tick_s=self.tick_s, estimate=est, reliability=reliability)
        outliers, found = state.outliers, None
        if self.outliers is not None:
            # slow replicas: eject, expire, replace within the guardrails (outliers.py), before the policy, which
            # plans the pool without its ejected replicas (their slots go back on the target after it)
            found = detect(state.outliers, self.outliers, fleet, obs, now_s, guards=self.guards, overrides=active,
                           telemetry_frozen=obs.all_stale and current is not None and bool(current.pools),
                           figures=self.engine_figures)
            outliers = found.state
            inp = planning_view(inp, found)
        bstate, action = state.breaker, BreakerAction()
        notes: list[str] = []
        if self.breaker is not None:
            signals = _breaker_signals(est, self.breaker)
            if self.outliers is not None:  # a slow replica replaced on our order is not a replica lost
                signals = _less_ordered(signals, state.outliers, fleet, now_s)
            bstate, action, notes = advance_breaker(state.breaker, self.breaker, inp, signals)
            inp = replace(inp, breaker=action)
        policy_state, out = self.policy.decide(state.policy_state, inp, rng)
        # what the policy set in motion, for the next tick's accounting (a batch-cap change's restart)
        needs = dict(out.needs)
        if found is not None:  # the policy's needs count replicas taking traffic; the telemetry's ready, all
            needs = {p: n + found.out_of_service.get(p, 0) for p, n in needs.items()}
        est = replace(est, decided_caps=decided_caps(fleet, out.pools), needs=needs)
        reasons = capacity_reasons + breaker_reasons(notes, bstate) + tuple(out.reasons)
        proposal, admission, held = apply_breaker(action, fleet=fleet, pools=out.pools, admission=out.admission,
                                                  overrides=active, now_s=now_s)
        if found is not None:
            proposal = with_ejected_slots(proposal, found, fleet)
        guarded = apply_guards(
            now_s=now_s, fleet=fleet, proposal=proposal, admission=admission,
            current=current.pools if current else None, observation=obs,
            overrides=active, config=self.guards, state=state.guard_state,
            confidence=_confidence(out), current_admission=current.admission if current else None,
        )
        adjustments = guarded.adjustments if guarded.frozen else held + guarded.adjustments
        pools_out: Mapping[str, PoolDecision] = guarded.pools
        if found is not None:
            pools_out = _with_outliers(guarded.pools, found)
            reasons = reasons + found.reasons
        tenants, step_aware, forced = forced_tenants(out.tenants, out.step_aware, active)
        adjustments += forced
        decision = Decision(
            decision_id=f"d-{generation:08d}",
            generation=generation,
            at_s=now_s,
            valid_until_s=now_s + self.decision_validity_s,
            pools=dict(pools_out),
            admission=({c: a for c, a in guarded.admission.items() if a != ClassAdmission()}
                       if guarded.admission else {}),
            reasons=reasons + adjustments,
            tenants=tenants,
            step_aware=step_aware,
        )
        changed = (current is None or dict(current.pools) != dict(decision.pools)
                   or dict(current.admission) != dict(decision.admission)
                   or dict(current.tenants) != dict(decision.tenants) or current.step_aware != decision.step_aware)
        diagnostics = {"observation": inputs, "policy": self.policy.name, "profile": profile,
                       **{k: json_safe(v) for k, v in out.diagnostics.items()}}
        if found is not None:
            diagnostics["outliers"] = json_safe({"ejected": {p: list(v) for p, v in outliers.ejected(now_s).items()},
                                                 "scores": found.scores, "planned_without": dict(found.in_target)})
        if out.confidence is not None:
            diagnostics["confidence"] = json_safe(out.confidence)
        if self.breaker is not None:
            diagnostics["breaker"] = json_safe(bstate.status().to_dict())
            diagnostics["breaker_constraints"] = json_safe({
                "min_replicas": dict(action.min_replicas), "max_prefix_weight": dict(action.max_prefix_weight),
                "protect_streams": action.protect_streams, "min_shed": dict(action.min_shed)})
        text = explain(decision, current, reasons, adjustments, telemetry, active, guarded.frozen, tick.mode)
        new_state = ControllerState(generation=generation, current=decision, policy_state=policy_state,
                                    guard_state=guarded.state, estimate=est, breaker=bstate, capacity=capacity,
                                    outliers=outliers)
        return new_state, TickResult(decision, tick.mode, changed, guarded.frozen, reasons, adjustments,
                                     telemetry, diagnostics, active, text, est,
                                     bstate.status() if self.breaker is not None else None, out.status)


def explain(decision: Decision, current: Decision | None, reasons: tuple[Reason, ...], adjustments: tuple[Reason, ...],
            telemetry: Mapping[str, str], overrides: tuple[Override, ...], frozen: bool, mode: Mode) -> str:
    """A readable account: first line is the summary (what changed), then per pool the why."""
    changes = []
    for name, pd in decision.pools.items():
        before = current.pools[name].replicas if current and name in current.pools else None
        if before is None:
            changes.append(f"{name}={pd.replicas}")
        elif before != pd.replicas:
            changes.append(f"{name} {before}→{pd.replicas}")
    if frozen:
        head = "hold (telemetry frozen)"
    elif changes:
        head = "scale " + ", ".join(changes)
    elif reasons:  # other levers moved, or a change was held: say which, not "no change"
        head = "replicas unchanged: " + ", ".join(dict.fromkeys(r.code for r in reasons))
    else:
        head = "no change"
    lines = [f"{decision.decision_id} ({mode.value}) {head}"]
    for name, pd in decision.pools.items():
        why = [r for r in reasons if r.pool == name]
        adj = [r for r in adjustments if r.pool == name]
        parts = [f"  {name}: {pd.replicas} replicas (telemetry {telemetry.get(name, '?')})"]
        parts += [f"    because {r.code}: {r.message}" for r in why]
        parts += [f"    guardrail {r.code}: {r.message}" for r in adj]
        lines += parts
    for r in list(reasons) + list(adjustments):
        if r.pool is None:
            lines.append(f"  {r.code}: {r.message}")
    if decision.admission:
        lines.append("  admission: " + ", ".join(
            f"{c} shed {a.shed_frac:.0%}" + (f" rate≤{a.rate_limit_rps:g}/s" if a.rate_limit_rps else "")
            for c, a in decision.admission.items()))
    if overrides:
        lines.append("  overrides: " + ", ".join(
            f"{o.kind}{'(' + o.pool + ')' if o.pool else ''}={o.text or o.value:g} by {o.author}"
            if not o.text else f"{o.kind}={o.text} by {o.author}" for o in overrides))
    return "\n".join(lines)
