"""The MPC's reliability dial in force this tick, and what it bought (pure).

The dial (controller/core/objective.py, `ObjectiveWeights.reliability`) is the probability that the
demand through the longest start-up the planner must wait for stays within what the plan provisions
for. Its setting is, first found: a live `reliability` override (PolicyService; `Controller.step`
hands the newest active one over as `PolicyInput.reliability`), the policy's `reliability`
parameter, the objective profile's own (balanced 0.6, latency 0.9). `dial_diagnostics` is what
`governor explain` and `governor status` show: the setting, where it came from, and the load it
plans for against the median forecast at the longest start-up.

What the dial can buy is bounded by what the fleet can reach (`reachable_rps`): a replica ordered now
serves only after its start-up, and no pool grows past its maximum. Planned for a load beyond that,
the chance constraint is broken by every plan alike (past capacity the late share saturates at 1),
so it stops telling plans apart, and the objective, cost per success × (1 + penalties), then prefers
the cheapest of the equally broken plans: on generated bursts a 70B pool at 0.99 held 7 of its 8
replicas with the quantile at 30 req/s while 8 carry 35, and a higher setting bought fewer passes than
a lower one (decision 0034). So the quantile planned for is held, step by step, at the load the
largest reachable fleet carries within the SLO, never below the median: past it, the most reliable
plan is the largest reachable fleet, which a quantile at that load asks for.

Must not: do I/O or read a clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
from scipy.special import ndtri

from controller.core.forecast import LoadForecast
from controller.core.mpc import PlanProblem, PoolInput, hop
from controller.core.mpc_model import LatencyQuery, PlanModel
from controller.core.objective import ObjectiveWeights, check_reliability

# a replica whose load the model puts at or past this utilisation carries no more (trajectories.py's need)
_MAX_UTILISATION = 0.97


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
    """The dial's setting and source, and at the first step from the longest cold start-up on (where a
    replica ordered now first serves; the last step if the horizon ends before): the median forecast
    and the load planned for (req/s, all classes), and the margin between them. A step before it would
    show the hold on what the replicas already there carry (`planned_quantile`), not what the dial buys.
    Example: p50 30 req/s, p90 36, reliability 0.9 → planned 36.0, margin 6.0 (20 %)."""
    lead = np.asarray(fc.lead_s, dtype=float)
    later = np.flatnonzero(lead >= startup_s)
    k = (int(later[0]) if len(later) else len(lead) - 1) if len(lead) else -1
    out: dict[str, Any] = {"value": reliability, "source": source, "startup_s": startup_s}
    if k < 0 or not problem.classes:
        return out
    median = sum(c.p50_rps[k] for c in problem.classes)
    planned = sum(c.p90_rps[k] for c in problem.classes)
    out.update(lead_s=round(float(lead[k]), 1), median_rps=round(float(median), 3),
               planned_rps=round(float(planned), 3), margin_rps=round(float(planned - median), 3),
               margin_frac=round(float(planned / median - 1.0), 4) if median > 0 else None)
    return out



def replica_capacity_rps(p: PoolInput, model: PlanModel) -> float:
    """What a replica of `p` carries (req/s) before its queue grows without bound: the planning model's
    fluid capacity at the pool's mix, hit rate and batch caps this tick, under the highest in-flight cap
    the plan may set (the stream guard's or the breaker's ceiling; none: uncapped), × 0.97, the
    utilisation past which the planner's `need` counts a replica as full (trajectories.py). Below it
    the late share a plan is scored on is graded; past it the backlog grows every step and the late
    share is 1 for every plan. Example: a 70B replica, 6.7 req/s uncapped, 4.4 under a ceiling of 64
    in flight → 4.3."""
    q = LatencyQuery(pool_index=np.array([p.model_index]), rps_per_replica=np.array([0.01]),
                     prompt_tokens=np.array([p.prompt_tokens]), output_tokens=np.array([p.output_tokens]),
                     hit_rate=np.array([p.hit_rate]), inflight_cap=np.array([float(p.max_inflight_cap or 0)]),
                     max_num_seqs=np.array([p.max_num_seqs]),
                     max_num_batched_tokens=np.array([p.max_num_batched_tokens]))
    cap = float(np.asarray(model.latency(q).capacity_rps, dtype=float).ravel()[0])
    return _MAX_UTILISATION * cap if np.isfinite(cap) and cap > 0 else 0.0


def reachable_replicas(p: PoolInput, lead_s: float) -> int:
    """Replicas of `p` that can serve `lead_s` from now: those ready, those starting that are up by then,
    its warm slots once a warm start-up has passed, and up to its maximum once a cold one has."""
    n = p.ready + sum(1 for e in p.starting_eta_s if e <= lead_s)
    if lead_s >= p.startup_warm_s:
        n += p.warm_slots
    if lead_s >= p.startup_cold_s:
        n = p.hi
    return int(min(max(n, 0), p.hi))


def reachable_rps(pools: Sequence[PoolInput], model: PlanModel, lead_s: np.ndarray,
                  group_share: Mapping[str, float]) -> np.ndarray:
    """Per step, the most fleet load (req/s, all classes) the reachable replicas carry (`replica_capacity_rps`):
    per route group, the smaller of its hops (prefill or mixed, then decode) summed over their pools;
    over groups, the load at which the first group is full at its measured share of the traffic (the
    sum of the groups' when no share is measured). Example: one pool, 5 ready of 8, 4.4 req/s a replica,
    a 285 s start-up → 22 req/s until 285 s ahead, 35 from then on."""
    lead = np.asarray(lead_s, dtype=float)
    per_hop: dict[tuple[str, bool], np.ndarray] = {}
    for p in pools:
        r = replica_capacity_rps(p, model)
        reach = np.array([reachable_replicas(p, float(t)) for t in lead], dtype=float)
        key = hop(p)
        per_hop[key] = per_hop.get(key, np.zeros(len(lead))) + reach * r
    groups: dict[str, np.ndarray] = {}
    for (g, _), c in per_hop.items():
        groups[g] = np.minimum(groups[g], c) if g in groups else c
    if not groups:
        return np.zeros(len(lead))
    shares = {g: group_share.get(g, 0.0) for g in groups}
    if sum(shares.values()) <= 0:
        return np.sum(list(groups.values()), axis=0)
    return np.min([c / s for g, c in groups.items() if (s := shares[g]) > 0], axis=0)


def planned_quantile(fc: LoadForecast, reliability: float, reachable: np.ndarray | None) -> np.ndarray:
    """The fleet load (req/s, per step) the chance constraint is checked at: the `reliability` quantile of
    the forecast, its p90 being the measured error's (forecasting.py) and its error normal, held at the
    reachable load (module docstring) and never below the median. Non-decreasing in `reliability`.
    Example: p50 30, p90 36: 0.75 plans for 33.2 (0.53 of the way to the p90), 0.99 for 40.9, or 38 where
    the reachable fleet carries 38."""
    z = float(ndtri(reliability)) / float(ndtri(0.9))
    q = fc.p50 + z * (fc.p90 - fc.p50)
    if reachable is None:
        return np.asarray(q, dtype=float)
    return np.maximum(np.asarray(fc.p50, dtype=float), np.minimum(q, reachable))
