"""`solve`: one tick of the planner, from a PlanProblem to the best plan found and its predicted terms.

The plan in force (and a warm start, the previous plan shifted) is scored first, so a plan is
always returned; then the search's moves run in a fixed order (search.py; route group by route
group on a large fleet, groups.py) and the best
candidate is turned into a `Plan` with its terms (cost, successes, risk, per-pool figures).

Must not: do I/O, read the clock other than through the injected timer, or draw randomness
other than from the Generator passed in.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from controller.core.mpc.candidates import Candidates
from controller.core.mpc.groups import plan_groups, search_groups
from controller.core.mpc.problem import MpcConfig, Plan, PlanProblem, PlanResult, PoolPlan, Timer
from controller.core.mpc.score import Evaluator
from controller.core.mpc.search import (
    Search,
    batch_caps,
    cross_entropy,
    delay_sweep,
    settle,
    sweep_replicas,
    transfer_replicas,
)
from controller.core.mpc.trajectories import need_per_step
from controller.core.mpc_model import PlanModel


def _to_plan(ev: Evaluator, c: Candidates) -> Plan:
    ready, _, _ = ev.dynamics.run(c.repl, c.standby)
    # router weights: weight per replica × replicas serving in the first step, as shares of the hop
    absolute = c.tw[0] * np.maximum(ready[0, :, 0], 1.0)
    for _, m in ev.traffic.hop_masks:
        tot = absolute[m].sum()
        absolute[m] = absolute[m] / tot if tot > 0 else 1.0 / m.sum()
    pools = {}
    for j, p in enumerate(ev.prob.pools):
        cap = int(round(c.cap[0, j]))
        pools[p.name] = PoolPlan(
            replicas=tuple(int(x) for x in c.repl[0, j]), warm_standby=int(c.standby[0, j]),
            prefix_weight=float(round(c.pw[0, j], 3)), inflight_cap=0 if cap >= p.max_num_seqs else cap,
            traffic_weight=float(round(absolute[j], 4)) if ev.traffic.hop_size[j] > 1 else p.traffic_weight,
            max_num_seqs=int(c.mns[0, j]),
            max_num_batched_tokens=int(c.mbt[0, j]))
    active = bool(ev.traffic.shed_active(ready, ev.need)[0, 0])
    expected = ev.traffic.expected[0]  # a class the median expects no request of in the first step: nothing to shed
    shed = {cl.name: float(round(min(max(c.shed[0, k] if active and expected[k] else cl.min_shed, 0.0), 1.0), 4))
            for k, cl in enumerate(ev.prob.classes)}
    return Plan(pools=pools, shed=shed)


def _from_plan(ev: Evaluator, plan: Plan, shift: int) -> Candidates | None:
    """A previous plan as a candidate, shifted `shift` steps forward (its tail repeats its last step)."""
    c = ev.cur.tile(1)
    if any(p.name not in plan.pools or len(plan.pools[p.name].replicas) == 0 for p in ev.prob.pools):
        return None
    tw = ev.traffic.per_replica_weights(np.array([[plan.pools[p.name].traffic_weight for p in ev.prob.pools]]))[0]
    for j, p in enumerate(ev.prob.pools):
        pp = plan.pools[p.name]
        r = list(pp.replicas[shift:]) or [pp.replicas[-1]]
        r = (r + [r[-1]] * ev.H)[: ev.H]
        c.repl[0, j] = np.clip(r, p.lo, p.hi)
        if p.frozen:
            continue
        c.standby[0, j] = pp.warm_standby
        if not p.levers_fixed:
            c.pw[0, j] = (min(pp.prefix_weight, p.max_prefix_weight) if p.max_prefix_weight is not None
                          else pp.prefix_weight)
            cap = float(pp.inflight_cap if pp.inflight_cap > 0 else p.max_num_seqs)
            c.cap[0, j] = min(cap, float(p.max_inflight_cap)) if p.max_inflight_cap else cap
            c.tw[0, j] = tw[j]
    for k, cl in enumerate(ev.prob.classes):
        c.shed[0, k] = min(max(plan.shed.get(cl.name, 0.0), cl.min_shed), cl.max_shed)
    return c


def solve(problem: PlanProblem, model: PlanModel, config: MpcConfig, rng: np.random.Generator, *,
          warm: Plan | None = None, warm_shift: int = 0, timer: Timer | None = None,
          started_s: float | None = None, reserve_s: float | None = None) -> PlanResult:
    """Find the best plan within the budget (see the module docstring). Never returns nothing:
    the plan in force (clipped to the bounds) is always scored first. With a `timer`, the time
    budget counts from `started_s` (a reading of the same timer, e.g. when the tick began; default
    now), and the search stops `reserve_s` before its end for what follows it (the caller's measure
    of that work; default `first_reserve_s`). The result carries when the search had to stop and when
    it did, so the caller can measure what followed."""
    ev = Evaluator(problem, model, config)
    s = Search(ev, config, rng, timer, started_s, reserve_s)
    cur = ev.cur.tile(1)
    for j, p in enumerate(problem.pools):
        cur.repl[0, j] = np.clip(cur.repl[0, j], p.lo, p.hi)
    for k, cl in enumerate(problem.classes):
        cur.shed[0, k] = min(max(cur.shed[0, k], cl.min_shed), cl.max_shed)
    for j, p in enumerate(problem.pools):
        if p.levers_fixed:
            cur.pw[0, j] = min(cur.pw[0, j], p.max_prefix_weight if p.max_prefix_weight is not None else math.inf)
            if p.max_inflight_cap:
                cur.cap[0, j] = min(cur.cap[0, j], p.max_inflight_cap)
    starts = [cur]
    if warm is not None:
        w = _from_plan(ev, warm, warm_shift)
        if w is not None:
            for j, p in enumerate(problem.pools):
                if p.levers_fixed:
                    w.pw[0, j], w.cap[0, j] = cur.pw[0, j], cur.cap[0, j]
            starts.append(w)
    J0 = s.score(Candidates.concat(starts))
    incumbent_J = float(J0[0])
    k = int(np.argmin(J0))
    s.best, s.best_J = Candidates.concat(starts).take(np.array([k])), float(J0[k])
    # replica sweeps, levers, replica sweep again, batch caps
    order = sorted(range(len(problem.pools)), key=lambda j: -problem.pools[j].usd_per_hour)
    needs = [need_per_step(ev, s.best, j) for j in range(len(problem.pools))]
    ev.need = np.array(needs, dtype=float)
    s.best_J = float(s.score(s.best)[0])  # rescore: shedding now releases once capacity is ready
    groups = plan_groups(problem, config)
    part_evaluations = 0
    if groups:  # a large fleet of several route groups: the same moves, group by group (groups.py)
        part_evaluations = search_groups(s, needs, groups)
    else:
        delay_sweep(s)
        sweep_replicas(s, needs, order)
        transfer_replicas(s)
        delay_sweep(s)
        cross_entropy(s)
        sweep_replicas(s, needs, order)
        transfer_replicas(s)
        delay_sweep(s)
        batch_caps(s, needs)
        settle(s)
    assert s.best is not None
    ended = timer() if timer is not None else None
    J, info = ev.score(s.best, detail=True)
    assert info is not None
    plan = _to_plan(ev, s.best)
    terms = _terms(ev, info, needs)
    return PlanResult(plan=plan, objective=float(J[0]), terms=terms, evaluations=ev.evaluations + part_evaluations,
                      budget_exhausted=s.exhausted, incumbent_objective=incumbent_J,
                      groups=tuple(tuple(problem.pools[j].name for j in g) for g in groups),
                      search_deadline_s=s.deadline_s() if timer is not None else None, search_ended_s=ended)


def _terms(ev: Evaluator, info: Mapping[str, Any], needs: list[np.ndarray]) -> dict[str, Any]:
    prob = ev.prob
    cls = [c.name for c in prob.classes]

    def rows(a: np.ndarray, nd: int) -> list[list[float]]:
        """(P,H) → per pool, its steps rounded to nd decimals (Python floats first: one conversion per
        array rather than per element, the same values as rounding each element)."""
        return [[round(x, nd) for x in r] for r in np.asarray(a, dtype=float).tolist()]

    ready = rows(info["ready"][0], 2)
    util = rows(info["utilisation"][0, 1].T, 3)
    ttft = rows(info["ttft_p95"][0, 1].T, 3)
    tpot = rows(info["tpot_p95"][0, 1].T, 4)
    hit = rows(info["hit"][0, 0].T, 3)
    bound = (None if info["tpot_max"] is None else
             [[round(x, 4) if math.isfinite(x) else None for x in r]
              for r in np.asarray(info["tpot_max"][0, 1].T, dtype=float).tolist()])
    pools = {}
    for j, p in enumerate(prob.pools):
        pools[p.name] = {
            "ready_by_step": ready[j],
            "need_by_step_p90": [int(x) for x in np.asarray(needs[j]).tolist()],
            "utilisation_p90": util[j],
            "ttft_p95_s_p90": ttft[j],
            "tpot_p95_s_p90": tpot[j],
            # the longest TPOT a request can have (a full prefill chunk every step); null = unbounded
            "tpot_bound_s_p90": None if bound is None else bound[j],
            "hit_rate": hit[j],
        }
    return {
        "cost_usd": float(info["cost_usd"][0]),
        "expected_successes": float(info["successes"][0]),
        "cost_per_success_usd": float(info["cost_per_success_usd"][0]),
        "late_frac_p50": {c: float(info["late_frac_p50"][0, k]) for k, c in enumerate(cls)},
        "late_or_shed_frac_p90": {c: float(info["late_or_shed_frac_p90"][0, k]) for k, c in enumerate(cls)},
        "shed_frac": {c: float(info["shed_frac_final"][0, k]) for k, c in enumerate(cls)},
        "risk_excess": {c: float(info["risk_excess"][0, k]) for k, c in enumerate(cls)},
        "penalty_factor": float(info["penalty_factor"][0]),
        # step-aware admission: the plan sheds and the measured profile says later steps carry sunk work (score.py)
        "step_aware": bool(info["step_aware"][0]),
        "task_loss": {c.name: c.task_loss.blind for c in prob.classes if c.task_loss is not None},
        "risk_term": float(info["risk_term"][0]),
        "pools": pools,
    }
