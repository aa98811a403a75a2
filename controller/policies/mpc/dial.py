"""The MPC's reliability dial in force this tick, and what it bought (pure).

The dial (controller/core/objective.py, `ObjectiveWeights.reliability`) is the probability that the
demand through the longest start-up the planner must wait for stays within what the plan provisions
for. Its setting is, first found: a live `reliability` override (PolicyService; `Controller.step`
hands the newest active one over as `PolicyInput.reliability`), the policy's `reliability`
parameter, the objective profile's own (balanced 0.6, latency 0.9). `dial_diagnostics` is what
`governor explain` and `governor status` show: the setting, where it came from, and the load it
plans for against the median forecast at the longest start-up.

Must not: do I/O or read a clock.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from controller.core.forecast import LoadForecast
from controller.core.mpc import PlanProblem
from controller.core.objective import ObjectiveWeights, check_reliability


def dial_in_force(weights: ObjectiveWeights, profile: str, parameter: float | None,
                  override: float | None) -> tuple[ObjectiveWeights, str]:
    """The weights with the dial's setting in force, and where it came from: "override", "policy
    parameter" or "profile <name>". The profile's weights come back unchanged (the same object) when
    neither is set, so the default plans exactly as before the dial existed."""
    if override is not None:
        return replace(weights, reliability=check_reliability(override, "reliability override")), "override"
    if parameter is not None:
        return replace(weights, reliability=parameter), "policy parameter"
    return weights, f"profile {profile}"


def dial_diagnostics(reliability: float, source: str, problem: PlanProblem, fc: LoadForecast,
                     startup_s: float) -> dict[str, Any]:
    """The dial's setting and source, and at the step nearest the longest cold start-up (the lead the
    forecaster's error is measured at): the median forecast and the load planned for (req/s, all
    classes), and the margin between them. Example: p50 30 req/s, p90 36, reliability 0.9 →
    planned 36.0, margin 6.0 (20 %)."""
    lead = np.asarray(fc.lead_s, dtype=float)
    k = int(np.argmin(np.abs(lead - startup_s))) if len(lead) else -1
    out: dict[str, Any] = {"value": reliability, "source": source, "startup_s": startup_s}
    if k < 0 or not problem.classes:
        return out
    median = sum(c.p50_rps[k] for c in problem.classes)
    planned = sum(c.p90_rps[k] for c in problem.classes)
    out.update(lead_s=round(float(lead[k]), 1), median_rps=round(float(median), 3),
               planned_rps=round(float(planned), 3), margin_rps=round(float(planned - median), 3),
               margin_frac=round(float(planned / median - 1.0), 4) if median > 0 else None)
    return out

