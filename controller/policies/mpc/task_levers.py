"""The delay quadrant's task levers, from the plan: step-aware admission and each tenant's limits.

- Step-aware admission (`PolicyOutput.step_aware`): the planner scores every plan's shedding twice, falling on any
  step and falling on first steps only, with the measured step profile (controller/core/mpc/score.py,
  controller/core/workflow.py); where the plan sheds and later steps carry sunk work, step-aware costs less and the
  plan says so (`terms["step_aware"]`): on; also while the router is measured shedding a class whose later steps
  carry sunk work (the model may lag an overload by a few ticks, and what is shed now falls on some step now);
  kept on through the scale-down stabilisation window after the last tick that chose it. Otherwise None: the
  router keeps its own setting (nothing to protect, or no profile measured: the planner behaves as it did
  without one).
- Tenant limits (`PolicyOutput.tenants`): while the plan sheds (it predicts demand beyond what it provisions),
  each measured tenant gets its token-weighted fair share of what the plan admits: the max-min fair share of the
  admitted tokens (controller/core/workflow.py `fair_shares`), turned into requests in flight at the replicas the
  plan has ready in its first step (each replica's in-flight cap, or its engine's max_num_seqs where uncapped).
  A tenant asking no more than the level keeps no limit (0: capping it at its mean would refuse its bursts); the
  tenants above the level are held to it. Weights stay equal (1): the picker's fair queue is max-min fair in
  tokens at equal weights. Not overloaded, or fewer than two tenants measured: no limits (the router's own).
  Operator overrides win over both (controller/core/guards.py `forced_tenants`).

Must not: do I/O or read a clock.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from controller.core.mpc import PlanProblem, PlanResult
from controller.core.workflow import fair_shares
from controller.policies.common import value
from controller.types import FleetObservation, PoolDecision, TaskProfile, TenantLimits

OVERLOAD_SHED = 0.005  # the plan sheds beyond this share of some class: demand beyond what it provisions


@dataclass(frozen=True)
class TenantPlan:
    """Tenant limits and what they came from (for reasons and diagnostics)."""

    limits: Mapping[str, TenantLimits] = field(default_factory=dict)
    admitted_frac: float = 1.0  # share of the demand the plan admits
    slots: int = 0  # requests in flight the plan's first step serves
    token_share: Mapping[str, float] = field(default_factory=dict)  # each tenant's share of the tokens


@dataclass(frozen=True)
class StepAdmission:
    """Step-aware admission this tick and why: `planned` (the plan drops requests of these classes), `measured`
    (the router holds or sheds them now), `until_s` (on until then, after the last tick that chose it)."""

    on: bool | None
    until_s: float
    planned: bool = False
    measured: Mapping[str, float] = field(default_factory=dict)  # class → requests shed per second now


def measured_pressure(obs: FleetObservation, result: PlanResult) -> dict[str, float]:
    """The classes whose later steps carry sunk work (task loss > 1) that the router sheds now: requests shed per
    second (what it refuses right now, whatever the plan predicts). Requests merely held are not counted: a queue
    the fleet works off drops nothing, and holding new tasks behind the tasks under way delays them for nothing."""
    out: dict[str, float] = {}
    for c, loss in result.terms.get("task_loss", {}).items():
        co = obs.classes.get(c)
        if co is None or loss <= 1.0 + 1e-9:
            continue
        shed = value(co.shed_rps) or 0.0
        if shed > 0.0:
            out[c] = shed
    return out


def step_admission(result: PlanResult, obs: FleetObservation, now_s: float, until_s: float,
                   hold_s: float) -> StepAdmission:
    """Step-aware admission: on where the plan chooses it (it predicts drops of a class whose later steps carry
    sunk work) or the router is measured shedding such a class now (as feedback.py, a measurement the model may
    not have caught up with), and for `hold_s` after
    the last tick that did, else None (the router's own setting). The hold is the scale-down stabilisation
    window, for the reason the planner keeps capacity through it: an overload that eases for a tick or two comes
    back, and the tasks started under it still have steps to send."""
    planned = bool(result.terms.get("step_aware"))
    measured = measured_pressure(obs, result)
    if planned or measured:
        return StepAdmission(True, now_s + hold_s, planned, measured)
    return StepAdmission(True if now_s < until_s else None, until_s)


def admitted_fraction(result: PlanResult, class_share: Mapping[str, float]) -> float:
    """The share of the demand the plan admits over its horizon (1 − Σ class share × its shed share)."""
    shed = result.terms.get("shed_frac", {})
    return max(0.0, 1.0 - sum(class_share.get(c, 0.0) * float(s) for c, s in shed.items()))


def overloaded(result: PlanResult) -> bool:
    """The plan sheds some class (now, or over its horizon): it predicts demand beyond what it provisions."""
    now = max(result.plan.shed.values(), default=0.0)
    horizon = max((float(s) for s in result.terms.get("shed_frac", {}).values()), default=0.0)
    return max(now, horizon) > OVERLOAD_SHED


def inflight_slots(problem: PlanProblem, result: PlanResult, pools_out: Mapping[str, PoolDecision]) -> int:
    """Requests in flight the plan's first step serves: replicas ready × in-flight cap (max_num_seqs uncapped)."""
    total = 0.0
    for p in problem.pools:
        terms = result.terms.get("pools", {}).get(p.name, {})
        ready = (terms.get("ready_by_step") or [p.ready])[0]
        d = pools_out.get(p.name)
        per = d.inflight_cap if d is not None and d.inflight_cap > 0 else p.max_num_seqs
        total += float(ready) * per
    return int(total)


def tenant_limits(problem: PlanProblem, result: PlanResult, pools_out: Mapping[str, PoolDecision],
                  tasks: TaskProfile | None, class_share: Mapping[str, float]) -> TenantPlan:
    """Each measured tenant's limits under predicted overload (module docstring); none otherwise."""
    demand = {t: float(v) for t, v in (tasks.tenant_tokens_rps.items() if tasks is not None else ())
              if math.isfinite(v) and v > 0}
    total = sum(demand.values())
    if len(demand) < 2 or total <= 0 or not overloaded(result):
        return TenantPlan()
    adm = admitted_fraction(result, class_share)
    slots = inflight_slots(problem, result, pools_out)
    if slots <= 0:
        return TenantPlan()
    fair = fair_shares(demand, adm * total)
    level = max(fair.values())
    limits: dict[str, TenantLimits] = {}
    for t, d in sorted(demand.items()):
        held = fair[t] < d - 1e-9 and fair[t] >= level - 1e-9
        n = max(1, math.ceil(slots * fair[t] / max(adm * total, 1e-9))) if held else 0
        limits[t] = TenantLimits(max_inflight=n, weight=1.0)
    if not any(lim.max_inflight for lim in limits.values()):
        return TenantPlan()  # every tenant within its share: nothing to hold
    return TenantPlan(limits=limits, admitted_frac=adm, slots=slots,
                      token_share={t: d / total for t, d in demand.items()})
