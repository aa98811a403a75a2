"""What the MPC planner minimises: named profiles and explicit weights (pure values, no I/O).

The planner scores a candidate plan over its horizon as

    J = cost_usd / E[successful requests]
        × (1 + Σ_k violation_weight[k] × E[violations_k] / E[requests]
             + Σ_k shed_weight[k] × E[shed_k] / E[requests])
        + change terms

so every penalty is a multiple of the plan's own cost per successful request and the
objective is scale-free (a 70B fleet at $0.005 per task and an 8B fleet at $0.0005 are
weighed alike). Example (balanced): a plan at $0.004 per success that leaves 1 % of
critical requests late pays ×(1 + 40 × 0.01 × share_critical); with a 20 % critical
share that is ×1.08, i.e. worth $0.00032 per success of extra GPUs to avoid.

On top of the ratio, a chance constraint per class: the share of its requests predicted
late *or shed* under the planned load quantile (balanced: p60) may exceed `risk_tolerance[k]` only at
a steep price (`risk_weight` × `risk_priority[k]` × cost per success per point of excess), per class
and not weighted by the class's traffic share (each class has its own attainment target). This is
what holds each class to its attainment target where the ratio alone would trade a few late
requests for GPUs.

Workflow context: a request of a class whose tasks have `steps_per_task[k]` steps on
average carries the work already sunk in its earlier steps, so losing it (late or shed)
costs (1 + steps_per_task[k]) / 2 requests' worth — late steps are shed last.

Profiles (the operator's point on the latency–cost–throughput triangle):
  cost        cheapest plan that still meets the chance constraints (looser tolerance)
  balanced    the default
  latency     more headroom: tighter tolerances, higher violation weights, p95 planned well below the SLO
  throughput  maximise successful tasks: shedding is expensive, late requests cheaper than lost ones

This module must not do I/O, read the clock or import anything outside controller.types.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from controller.names import PROFILES as PROFILE_NAMES
from controller.types import PRIORITY_CLASSES


def _per_class(crit: float, std: float, shed: float) -> Mapping[str, float]:
    return {"critical": crit, "standard": std, "sheddable": shed}


@dataclass(frozen=True)
class ObjectiveWeights:
    """Weights of the planner's objective; units are noted per field."""

    # E[late requests of class k] / E[requests] is multiplied by this (× cost per success).
    violation_weight: Mapping[str, float] = field(default_factory=lambda: _per_class(60.0, 15.0, 3.0))
    # E[requests of class k finally rejected] / E[requests] × this (× cost per success).
    shed_weight: Mapping[str, float] = field(default_factory=lambda: _per_class(400.0, 40.0, 3.0))
    # Chance constraint: allowed violation fraction per class under the planned load quantile (plan_quantile).
    # Critical and standard both at ≥ 99 % (the acceptance target) with a margin for model error:
    # 0.6 % and 0.8 %; a tighter tolerance buys replicas the target does not need.
    risk_tolerance: Mapping[str, float] = field(default_factory=lambda: _per_class(0.006, 0.008, 0.03))
    # Price of exceeding the tolerance: × cost per success per unit of excess fraction, × the
    # class's priority (critical is protected first, sheddable last).
    risk_weight: float = 100.0
    risk_priority: Mapping[str, float] = field(default_factory=lambda: _per_class(1.0, 0.4, 0.03))
    # Change penalty: × (price of one replica for one planning step) per replica added or removed now.
    change_weight: float = 0.3
    # Penalty per routing/cap change (fraction of one replica-step's price), keeps levers steady.
    lever_change_weight: float = 0.05
    # Forecast quantile the chance constraint is checked at (0.5 … 0.95; the policy interpolates
    # between the forecaster's p50 and p90 assuming a normal spread: q = 0.6 → p50 + 0.2 × (p90 − p50)).
    # Balanced plans at 0.6: the p95 corrections already carry the model's error, and the
    # scale-down window keeps what a burst needed; a higher quantile counts that margin twice.
    plan_quantile: float = 0.6
    # Mean steps per task of each class (workflow context); 1 = single requests.
    steps_per_task: Mapping[str, float] = field(default_factory=lambda: _per_class(1.0, 1.0, 1.0))
    # Plan p95 latency against SLO × this (latency profile plans below the SLO).
    slo_margin: float = 1.0

    def __post_init__(self) -> None:
        for name in ("violation_weight", "shed_weight", "risk_tolerance", "steps_per_task", "risk_priority"):
            m = getattr(self, name)
            if not isinstance(m, Mapping):
                raise ValueError(f"objective.{name} must be a mapping class -> number (got {type(m).__name__})")
            unknown = sorted(set(m) - set(PRIORITY_CLASSES))
            if unknown:
                raise ValueError(f"objective.{name}: unknown class(es) {unknown}; classes: {list(PRIORITY_CLASSES)}")
            for k, v in m.items():
                if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                    raise ValueError(f"objective.{name}[{k}] must be a finite number >= 0 (got {v!r})")
            if name == "steps_per_task" and any(v < 1 for v in m.values()):
                raise ValueError(f"objective.steps_per_task values must be >= 1 (got {dict(m)})")
            if name == "risk_tolerance" and any(v > 1 for v in m.values()):
                raise ValueError(f"objective.risk_tolerance values must be in [0, 1] (got {dict(m)})")
        for name in ("risk_weight", "change_weight", "lever_change_weight"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"objective.{name} must be a finite number >= 0 (got {v!r})")
        if not (isinstance(self.plan_quantile, (int, float)) and 0.5 <= self.plan_quantile <= 0.95):
            raise ValueError(f"objective.plan_quantile must be in [0.5, 0.95] (got {self.plan_quantile!r})")
        if not (isinstance(self.slo_margin, (int, float)) and 0.3 <= self.slo_margin <= 1.0):
            raise ValueError(f"objective.slo_margin must be in [0.3, 1] (got {self.slo_margin!r})")

    def cls(self, name: str, k: str) -> float:
        """Per-class value with the class missing meaning the sheddable (least protected) value."""
        m = getattr(self, name)
        return float(m.get(k, m.get("sheddable", 0.0)))

    def to_dict(self) -> dict[str, Any]:
        return {f.name: (dict(getattr(self, f.name)) if isinstance(getattr(self, f.name), Mapping)
                         else getattr(self, f.name)) for f in fields(self)}


PROFILES: Mapping[str, ObjectiveWeights] = {
    "balanced": ObjectiveWeights(),
    "cost": ObjectiveWeights(violation_weight=_per_class(25.0, 12.0, 2.0),
                             shed_weight=_per_class(300.0, 40.0, 4.0),
                             risk_tolerance=_per_class(0.006, 0.008, 0.05), risk_weight=60.0,
                             change_weight=0.2),
    "latency": ObjectiveWeights(plan_quantile=0.9, violation_weight=_per_class(80.0, 40.0, 10.0),
                                shed_weight=_per_class(600.0, 120.0, 12.0),
                                risk_tolerance=_per_class(0.002, 0.003, 0.01), risk_weight=200.0,
                                change_weight=0.3, slo_margin=0.8),
    "throughput": ObjectiveWeights(violation_weight=_per_class(30.0, 15.0, 6.0),
                                   shed_weight=_per_class(600.0, 200.0, 60.0),
                                   risk_tolerance=_per_class(0.005, 0.008, 0.04), risk_weight=75.0,
                                   change_weight=0.3),
}


def resolve_weights(profile: str, explicit: Mapping[str, Any] | None = None) -> ObjectiveWeights:
    """The named profile's weights, with `explicit` fields replacing the profile's.

    Per-class mappings are merged key by key: {"violation_weight": {"critical": 100}}
    keeps the profile's standard and sheddable weights. Raises ValueError naming an
    unknown profile or field, or a bad value.
    """
    if profile not in PROFILES:
        raise ValueError(f"unknown objective profile {profile!r}; profiles: {list(PROFILE_NAMES)}")
    base = PROFILES[profile]
    if not explicit:
        return base
    valid = {f.name for f in fields(ObjectiveWeights)}
    unknown = sorted(set(explicit) - valid)
    if unknown:
        raise ValueError(f"objective weights: unknown field(s) {unknown}; valid: {sorted(valid)}")
    upd: dict[str, Any] = {}
    for k, v in explicit.items():
        cur = getattr(base, k)
        if isinstance(cur, Mapping):
            if not isinstance(v, Mapping):
                raise ValueError(f"objective weights: {k} must be a mapping class -> number (got {v!r})")
            upd[k] = {**cur, **{str(c): float(x) for c, x in v.items()}}
        else:
            try:
                upd[k] = float(v)
            except (TypeError, ValueError):
                raise ValueError(f"objective weights: {k} must be a number (got {v!r})") from None
    return replace(base, **upd)
