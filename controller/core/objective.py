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
late *or shed* under the planned load quantile (the reliability dial, below) may exceed `risk_tolerance[k]` only at
a steep price (`risk_weight` × `risk_priority[k]` × cost per success per point of excess), per class
and not weighted by the class's traffic share (each class has its own attainment target). This is
what holds each class to its attainment target where the ratio alone would trade a few late
requests for GPUs.

Workflow context: a request of a class whose tasks have `steps_per_task[k]` steps on
average carries the work already sunk in its earlier steps, so losing it (late or shed)
costs (1 + steps_per_task[k]) / 2 requests' worth — late steps are shed last.

The reliability dial (`reliability`, the MPC's one operator-facing setting of how much capacity
to buy): the probability that the demand the fleet meets through the longest start-up the planner
must wait for stays within what the plan provisions for. The chance constraint is checked at that
quantile of the load forecast, whose spread is the forecaster's own measured error over that horizon
(controller/policies/mpc/forecasting.py widens the p90 to it; plan_inputs.py interpolates between
the p50 and the p90 assuming a normal error). Example: p50 30 req/s, p90 36 req/s through a 300 s
cold start; reliability 0.6 plans for 30 + 0.198 × 6 = 31.2 req/s, 0.9 for 36, 0.99 for 40.9. A
higher setting buys more capacity (more replicas, earlier), so more SLO passes at more cost: the
load planned for is non-decreasing in it and nothing else in the problem moves with it
(tests/policies/test_mpc_reliability.py pins the replicas planned on a fixed case). Each
profile carries its default setting (0.6; `latency` 0.9); the MPC's `reliability` parameter or a
live `reliability` override (PolicyService, `governor override set reliability`) replaces it. It is
not an objective weight: `resolve_weights` refuses it among the explicit weights, so it is set in
one place.

Profiles (the operator's point on the latency–cost–throughput triangle):
  cost        cheapest plan that still meets the chance constraints (looser tolerance)
  balanced    the default
  latency     more headroom: tighter tolerances, higher violation weights, p95 planned well below the SLO,
              reliability 0.9
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

# The reliability dial's range: at 0.5 the plan meets the median forecast; past 0.99 the normal
# extrapolation of the forecaster's p50-p90 spread (z = 2.33 at 0.99, 1.82 × the p90's distance) says
# more about the normal assumption than about the traffic's tail.
RELIABILITY_MIN = 0.5
RELIABILITY_MAX = 0.99


def check_reliability(value: object, where: str = "reliability") -> float:
    """`value` as a reliability setting, or ValueError naming `where` and the range."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not RELIABILITY_MIN <= value <= RELIABILITY_MAX:
        raise ValueError(f"{where} must be a probability in [{RELIABILITY_MIN}, {RELIABILITY_MAX}] "
                         f"(got {value!r})")
    return float(value)


def _per_class(crit: float, std: float, shed: float) -> Mapping[str, float]:
    return {"critical": crit, "standard": std, "sheddable": shed}


@dataclass(frozen=True)
class ObjectiveWeights:
    """Weights of the planner's objective; units are noted per field."""

    # E[late requests of class k] / E[requests] is multiplied by this (× cost per success).
    violation_weight: Mapping[str, float] = field(default_factory=lambda: _per_class(60.0, 15.0, 3.0))
    # E[requests of class k finally rejected] / E[requests] × this (× cost per success).
    shed_weight: Mapping[str, float] = field(default_factory=lambda: _per_class(400.0, 40.0, 3.0))
    # Chance constraint: allowed violation fraction per class under the planned load quantile (reliability).
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
    # The reliability dial (module docstring): the forecast quantile the chance constraint is checked
    # at (0.5 … 0.99; the policy interpolates between the forecaster's p50 and p90 assuming a normal
    # spread: 0.6 → p50 + 0.2 × (p90 − p50)). Balanced plans at 0.6: the p95 corrections already carry
    # the model's error, and the scale-down window keeps what a burst needed; a higher quantile counts
    # that margin twice (docs/decisions/0004-plan-quantile-and-risk.md).
    reliability: float = 0.6
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
        check_reliability(self.reliability, "objective.reliability")
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
    "latency": ObjectiveWeights(reliability=0.9, violation_weight=_per_class(80.0, 40.0, 10.0),
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
    unknown profile or field, or a bad value. The reliability dial is not a weight (module
    docstring): `reliability` (or its old name `plan_quantile`) among them is refused, naming
    where it is set.
    """
    if profile not in PROFILES:
        raise ValueError(f"unknown objective profile {profile!r}; profiles: {list(PROFILE_NAMES)}")
    base = PROFILES[profile]
    if not explicit:
        return base
    dial = sorted({"reliability", "plan_quantile"} & set(explicit))
    if dial:
        raise ValueError(f"objective weights: {dial[0]} is the MPC's reliability dial, not a weight: set the "
                         "policy parameter `reliability` (policy_params) or a live `reliability` override")
    valid = {f.name for f in fields(ObjectiveWeights)} - {"reliability"}
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
