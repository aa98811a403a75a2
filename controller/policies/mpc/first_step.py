"""The MPC plan's first step → pool decisions: what the policy applies of the plan this tick.

The plan's replicas go out through the scale-down stabilisation window (the highest plan of the
last `scale_down_stabilization_s`, stretched towards `bursty_down_window_s` when the demand comes
in bursts: `down_window_s`; no scale-down at all before `min_history_s` of history), clamped to the
problem's bounds. A batch-cap change sets off a rolling restart the replica accounting then
expects (`rollout_left`). Router traffic weights go out as shares of each route group's hop
(summing to 1), written for the replica targets applied rather than those planned
(`applied_router_weights`: a held scale-down serves too).

Must not: do I/O or read a clock; plan (the solver did).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from controller.core.mpc import PlanProblem, PlanResult, PoolInput, applied_router_weights
from controller.policies.common import reason
from controller.policies.mpc.memory import MpcPoolMemory
from controller.types import Decision, FleetSpec, PoolDecision, PoolSpec, Reason

# Bursty demand: the roughness of the demand samples over the last BURST_WINDOW_S (mean absolute
# change from one tick to the next over the mean) stretches the scale-down stabilisation window
# from its base towards `bursty_down_window_s` between these two values. Azure code traffic
# (bursts of 15-60 s, silence between) reads 0.30-0.37; Azure chat traffic 0.03-0.05; a one-off
# level shift from 30 to 8 req/s over 40 samples 0.03. So chat and a falling load keep the base
# window, and code holds replicas between bursts it cannot see coming (a replica ordered at a
# burst arrives after it).
BURST_WINDOW_S = 600.0
BURST_ROUGHNESS_RANGE = (0.12, 0.25)

# (spec, the problem's pool, target in force, replicas applied, the plan's pool, decision in force)
Applied = tuple[PoolSpec, PoolInput, int, int, Any, PoolDecision | None]


def down_window_s(t_hist: tuple[float, ...], d_hist: tuple[float, ...], now: float, base_s: float,
                  bursty_s: float) -> float:
    """Scale-down stabilisation window: `base_s`, stretched towards `bursty_s` as the demand of the
    last BURST_WINDOW_S gets bursty (its roughness, mean |y[i] − y[i−1]| / mean y, from 0.12 to 0.25).

    Example: base 120 s, bursty 600 s; demand samples 2, 2, 30, 2, 2, 2 req/s (roughness 56/5/6.7
    = 1.7) → 600 s; samples 20, 22, 21, 19 (roughness 1.7/20.5 = 0.08) → 120 s; 30 × 8 samples then
    8 × 8 (a level shift, roughness 22/15/19 = 0.08) → 120 s.
    """
    if bursty_s <= base_s:
        return base_s
    ys = [d for t, d in zip(t_hist, d_hist, strict=True) if now - t < BURST_WINDOW_S]
    if len(ys) < 4:
        return base_s
    y = np.array(ys, dtype=float)
    mean = float(y.mean())
    if mean <= 0:
        return base_s
    rough = float(np.abs(np.diff(y)).mean()) / mean
    lo, hi = BURST_ROUGHNESS_RANGE
    frac = min(max((rough - lo) / (hi - lo), 0.0), 1.0)
    return base_s + frac * (bursty_s - base_s)


def first_step(fleet: FleetSpec, problem: PlanProblem, result: PlanResult, mem: Mapping[str, MpcPoolMemory],
               targets: Mapping[str, int], current: Decision | None, now: float, *, warming: bool,
               t_hist: tuple[float, ...], down_window: float, bursty_window_s: float, min_history_s: float,
               step_s: float, tick_s: float | None = None, floors: Mapping[str, int] | None = None
               ) -> tuple[dict[str, PoolDecision], dict[str, MpcPoolMemory], list[Reason], list[Applied]]:
    """(pool decisions, pool memory with the plans seen and the caps applied, scale_down_stabilised
    reasons, what was applied per pool for the explanation). `floors`: replicas a pool gets while the
    plan's first step sends it traffic (the redundancy floor of pools sharing a hop, plan_inputs.py)."""
    pools_out: dict[str, PoolDecision] = {}
    new_mem: dict[str, MpcPoolMemory] = {}
    reasons: list[Reason] = []
    explain: list[Applied] = []
    for spec, pin in zip(fleet.pools, problem.pools, strict=True):
        pp = result.plan.pools[spec.name]
        m = mem[spec.name]
        want = pp.replicas[0]
        cur = targets[spec.name]
        recs = tuple((t, n) for t, n in m.recs if now - t < bursty_window_s) + ((now, want),)
        final = want
        if want < cur and (warming or len(t_hist) < 2 or t_hist[-1] - t_hist[0] < min_history_s):
            final = cur
        elif want < cur:
            hold = max(n for t, n in recs if now - t < down_window)
            final = min(cur, max(want, hold))
            if final > want:
                reasons.append(reason("scale_down_stabilised", spec.name,
                                      f"plan wants {want}; holding {final}: highest plan of the last "
                                      f"{down_window:.0f} s", proposal=want, stabilised=final,
                                      window_s=round(down_window, 1)))
        floor = (floors or {}).get(spec.name)
        if floor is not None and pp.traffic_weight > 0 and not pin.frozen:
            final = max(final, floor)
        final = min(max(final, pin.lo), pin.hi)
        cur_pd = current.pools.get(spec.name) if current is not None else None
        caps = m.caps or (spec.max_num_seqs, spec.max_num_batched_tokens)
        new_caps = (pp.max_num_seqs, pp.max_num_batched_tokens)
        caps_changed_s = m.caps_changed_s
        if new_caps != caps:  # (the rolling restart it sets off is the core's estimator's: core/estimate.py)
            caps_changed_s = now
        pools_out[spec.name] = PoolDecision(
            replicas=int(final), warm_standby=int(pp.warm_standby), inflight_cap=int(pp.inflight_cap),
            traffic_weight=float(pp.traffic_weight), prefix_weight=float(pp.prefix_weight),
            queue_weight=cur_pd.queue_weight if cur_pd else 2.0, kv_weight=cur_pd.kv_weight if cur_pd else 2.0,
            max_num_seqs=int(new_caps[0]) if new_caps != (spec.max_num_seqs, spec.max_num_batched_tokens) else 0,
            max_num_batched_tokens=int(new_caps[1]) if new_caps != (spec.max_num_seqs,
                                                                    spec.max_num_batched_tokens) else 0)
        new_mem[spec.name] = replace(m, recs=recs, caps=new_caps, caps_changed_s=caps_changed_s)
        explain.append((spec, pin, cur, int(final), pp, cur_pd))
    # router weights for the targets applied (a held scale-down serves with its replicas too)
    weights_applied = applied_router_weights(problem, result.plan, {n: d.replicas for n, d in pools_out.items()},
                                             step_s, tick_s)
    pools_out = {n: replace(d, traffic_weight=float(weights_applied.get(n, d.traffic_weight)))
                 for n, d in pools_out.items()}
    return pools_out, new_mem, reasons, explain
