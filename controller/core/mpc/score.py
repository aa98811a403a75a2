"""The planner's scorer: the stages composed, and the objective of each candidate plan.

`Evaluator.score(cand)` runs, vectorised over candidates × steps × pools × classes × two load
scenarios (the forecast's p50 and p90):

1. replica dynamics (dynamics.py): replicas ready and billed per step;
2. traffic (traffic.py): the requests each pool receives after shedding;
3. latency (latency.py): hit rate, the PlanModel's latencies and the backlog's wait;
4. risk (risk.py): each class's late share;
5. the objective (here; see controller/core/objective.py): cost / expected successes × (1 +
   weighted late and shed shares, a request timed out in a backlog counting as both), + the
   chance-constraint penalty on the p90 scenario, + change penalties.

Must not: choose candidates (search.py), do I/O, read the clock or draw randomness.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from controller.core.mpc.candidates import Candidates, WorkArrays, incumbent
from controller.core.mpc.dynamics import ReplicaDynamics
from controller.core.mpc.latency import Latency, PoolLatencies
from controller.core.mpc.problem import MpcConfig, PlanProblem, plan_steps
from controller.core.mpc.risk import Risk
from controller.core.mpc.traffic import Flow, Traffic
from controller.core.mpc_model import PlanModel
from controller.core.workflow import static_loss
from controller.levers import LEVERS, Lever, plan_groups

# the candidate arrays each lever of `MpcConfig.fixed_levers` owns (the lever table's `plan` and `array` columns)
_LEVER_FIELDS = {g: tuple(lv.array for lv in LEVERS if lv.plan == g and lv.array) for g in plan_groups()}
# the levers whose moves the change penalty counts, in table order (a move: beyond the lever's threshold)
_PRICED = tuple(lv for lv in LEVERS if lv.scope == "pool" and lv.threshold is not None and lv.array)
# step-aware admission is chosen where the plan drops (sheds, or lets time out) more than this share of a class's
# requests: one in a thousand, below which the prediction is the fluid model's rounding, not an overload
AWARE_MIN_DROP = 1e-3


@dataclass(frozen=True)
class Others:
    """The rest of the fleet when an evaluator scores a part of it (a route group, see groups.py), at
    the rest's best plan: what the objective sums over pools, summed over theirs."""

    cost_usd: float  # billed over the horizon (terminal-weighted, as `_objective` sums it)
    change_usd: float  # change penalties and rolling restarts
    late_first: np.ndarray  # (2,H,K) Σ share × late probability over their first-hop pools
    late_decode: np.ndarray  # (2,H,K) the same over their decode pools
    short: np.ndarray  # (H,) bool: some route group of theirs has fewer replicas ready than it needs
    lost_first: np.ndarray | None = None  # (2,H,K) Σ share × timed out over their first-hop pools (None: 0)
    lost_decode: np.ndarray | None = None  # the same over their decode pools


class Evaluator:
    """Scores batches of candidates for one problem (each stage precomputes what does not depend on
    the plan when the evaluator is built). `steps` overrides the horizon (a part of a fleet is scored
    over the fleet's)."""

    def __init__(self, prob: PlanProblem, model: PlanModel, cfg: MpcConfig, compiled: bool = True,
                 steps: int | None = None) -> None:
        self.prob, self.model, self.cfg = prob, model, cfg
        P, K = len(prob.pools), len(prob.classes)
        H = plan_steps(cfg, prob.pools) if steps is None else steps
        self.P, self.K, self.H = P, K, H
        dt = cfg.step_s
        self.dt = dt
        pools = prob.pools
        cls = prob.classes
        self.dynamics = ReplicaDynamics(pools, H, dt, cfg.standby_cost_frac, compiled=compiled)
        self.traffic = Traffic(prob, H, dt, cfg.client_retries)
        tr = self.traffic
        # the plan in force, as a candidate
        self.cur = incumbent(prob, H, tr.per_replica_weights(np.array([[p.traffic_weight for p in pools]])))
        # compiled: the replica dynamics, the backlog stage and the risk stage's combination as compiled
        # loops where numba is installed (the same values; see controller/core/mpc_kernel.py)
        self.latency = Latency(prob, model, cfg, H, tr.lam, self.cur, compiled=compiled)
        self.risk = Risk(prob, tr, compiled=compiled)
        # Per-tick constants of the objective (they do not depend on the candidate).
        self.price = np.array([p.usd_per_hour for p in pools])
        self.ready_int = np.array([p.ready for p in pools])
        w = prob.weights
        # what a late or shed request loses, in requests' worth: its task's sunk steps too (controller/core/workflow.py)
        loss = np.array([c.task_loss.blind if c.task_loss is not None
                         else static_loss(w.cls("steps_per_task", c.name)) for c in cls])
        shed_w = np.array([w.cls("shed_weight", c.name) for c in cls])
        self.wv = np.array([w.cls("violation_weight", c.name) for c in cls]) * loss
        self.ws_shed = shed_w * loss
        # step-aware admission: what it drops falls on first steps (1 request's worth, nothing sunk) up to their
        # share of arrivals, beyond on later steps (`later`). Only a measured profile says what later steps carry;
        # with the static weight there is nothing to choose (first share 1 at the blind weight).
        self.first_share = np.array([c.task_loss.first_share if c.task_loss is not None else 1.0 for c in cls])
        self.ws_first = np.where([c.task_loss is not None for c in cls], shed_w, self.ws_shed)
        self.ws_later = np.array([shed_w[k] * c.task_loss.later if c.task_loss is not None else self.ws_shed[k]
                                  for k, c in enumerate(cls)])
        self.aware_gain = self.ws_shed - self.ws_first  # (K,) >= 0 where later steps carry sunk work
        self.tol = np.array([w.cls("risk_tolerance", c.name) for c in cls])
        # the chance constraint prices each late or shed request past the tolerance; it loses its task's sunk work
        # too, so it is weighed alike: without it a profile would scale the ratio's penalties and not this one,
        # and the attainment targets would bind less the longer the tasks (the static weight leaves it as it was)
        self.risk_prio = np.array([w.cls("risk_priority", c.name) * (c.task_loss.blind if c.task_loss else 1.0)
                                   for c in cls])
        self.step_weight = np.ones(H)
        self.step_weight[-1] += cfg.terminal_steps
        self.req = (tr.lam * self.step_weight[None, :, None]).sum(axis=1) * dt  # (2,K) requests offered
        self.cpr_min = self._cheapest_cost_per_request()
        # each pool's share of its hop's traffic under the weights in force (what a lever change moves)
        self.share_now = tr.shares(self.cur.tw * tr.ready_step0)[0]
        self.evaluations = 0
        self.work = WorkArrays()  # reused work arrays of `score`
        self.need: np.ndarray | None = None  # (P, H) replicas each step's p90 load needs (set by solve)
        self.others: Others | None = None  # scoring a part of the fleet: the rest's sums (groups.py)
        self.last_cost_change: tuple[np.ndarray, np.ndarray] | None = None

    def _cheapest_cost_per_request(self) -> float:
        """USD per request of the pool that serves one cheapest: price / (3,600 × the rate one replica
        sustains at its concurrency limit, at today's mix, hit rate and batch caps). Example: $4.10
        an hour and 6 req/s → $0.00019. 0 when no pool has a price and a capacity."""
        if self.P == 0:
            return 0.0
        cap = self.latency.capacity_now()
        ok = (cap > 0) & np.isfinite(cap) & (self.price > 0)
        return float((self.price[ok] / 3600.0 / cap[ok]).min()) if ok.any() else 0.0

    def score(self, cand: Candidates, detail: bool = False) -> tuple[np.ndarray, dict[str, Any] | None]:
        """Objective per candidate (inf where not finite); with `detail`, the terms behind it."""
        self.evaluations += cand.n
        if self.cfg.fixed_levers:
            self._hold_fixed(cand)
        ready, billed, fresh = self.dynamics.run(cand.repl, cand.standby)
        flow = self.traffic.admit(cand, ready, self.need, self.work)
        pl = self.latency.predict(cand, flow, fresh, self.work, detail)
        lost = self.risk.lost_share(pl, flow.share)  # before late_share, which reuses the latency arrays
        v = self.risk.late_share(pl, flow.share)
        return self._objective(cand, ready, billed, flow, pl, v, lost, detail)

    def _hold_fixed(self, cand: Candidates) -> None:
        """Put the levers `cfg.fixed_levers` names back to what is in force, in place, on every row
        scored: whatever a search step proposes, a held lever cannot move (admission: no shedding
        beyond the classes' floors)."""
        cur = self.cur
        for lever in self.cfg.fixed_levers:
            if lever == "admission":
                cand.shed[:] = np.array([c.min_shed for c in self.prob.classes])[None, :]
            elif lever == "traffic_split":
                # every serving replica of a hop gets the same share: a plain balancer over the hop's
                # replicas (pool weights follow the replicas ready, see Traffic.per_replica_weights)
                cand.tw[:] = 1.0
            else:
                for f in _LEVER_FIELDS[lever]:
                    getattr(cand, f)[:] = getattr(cur, f)[0][None, :]

    def _moved(self, cand: Candidates, lv: Lever) -> np.ndarray:
        """(C, P): where the candidate moves the lever beyond its threshold from what is in force. The
        traffic split is judged on each pool's share of its hop (what a weight change moves), not the weight."""
        name, thr = str(lv.array), float(lv.threshold or 0.0)
        if name == "tw":
            now, was = self.traffic.shares(cand.tw * self.traffic.ready_step0), self.share_now
        else:
            now, was = getattr(cand, name), getattr(self.cur, name)
        moved: np.ndarray = np.abs(now - was) > thr
        return moved

    def _objective(self, cand: Candidates, ready: np.ndarray, billed: np.ndarray, flow: Flow, pl: PoolLatencies,
                   v: np.ndarray, lost: np.ndarray | None,
                   detail: bool) -> tuple[np.ndarray, dict[str, Any] | None]:
        prob, dt = self.prob, self.dt
        lam = self.traffic.lam
        adm, shed, rejected = flow.adm, flow.shed, flow.rejected
        # Aggregates over the horizon.
        # Terminal weight: the last step stands for the state the plan leaves behind, which lasts
        # beyond the horizon (a replica ordered now keeps serving after it): it counts
        # `terminal_steps` extra steps, so capacity arriving late in the horizon is not judged
        # on a few steps of benefit against the whole horizon's cost.
        wt = self.step_weight  # (H,)
        req = self.req  # (2,K) requests offered
        adm_n = (adm * wt[None, None, :, None]).sum(axis=2) * dt  # (C,2,K)
        # a shed attempt that is retried and admitted arrives at least one backoff late: count
        # half of those as late (partial shedding delays; it is not free)
        retried = lam[None] * (shed - rejected)[:, None, :, :]
        late = (np.minimum(adm * v + 0.5 * retried, lam[None] - lam[None] * rejected[:, None])
                * wt[None, None, :, None]).sum(axis=2) * dt
        shed_n = req[None] - adm_n
        cost = (billed * self.price[None, :, None] * wt[None, None, :]).sum(axis=(1, 2)) * dt / 3600.0  # (C,)
        if self.others is not None:  # a part of the fleet: the objective is the fleet's
            cost = cost + self.others.cost_usd
        succ = np.maximum(adm_n[:, 0].sum(axis=1) - late[:, 0].sum(axis=1), 1e-6)
        total = max(float(req[0].sum()), 1e-6)
        # Penalties are priced in cost per success; a plan that buys (next to) nothing would price
        # them at (next to) nothing and win with every request lost (a pool at zero replicas never
        # came back). Floored at the cheapest any pool can serve a request, which no plan that
        # serves its successes can go below, the floor only binds for such plans.
        cpr = np.maximum(cost / succ, self.cpr_min)
        pen = 1.0 + (late[:, 0] * self.wv).sum(axis=1) / total + (shed_n[:, 0] * self.ws_shed).sum(axis=1) / total
        # A request that times out in a backlog is lost as well as late: its client waited for nothing,
        # as a rejected one's did not. Priced like a rejected request on top of its lateness (it is in
        # `late` already), so admitting what will only time out never looks cheaper than shedding it:
        # far past capacity a queue that only grows is worse than the fast 429 of the shed ladder.
        # Example (balanced): a sheddable request that would time out costs 3 (late) + 3 (lost) against
        # 3 for shedding it; a standard one 15 + 40 against 40.
        lost_n = None
        if lost is not None:
            lost_n = (adm * lost * wt[None, None, :, None]).sum(axis=2) * dt  # (C,2,K)
            pen = pen + (lost_n[:, 0] * self.ws_shed).sum(axis=1) / total
        # step-aware admission (a lever of the delay quadrant): the router sheds first steps only and holds later
        # steps ahead of first ones (the stream guard keeps the backlog at the router), so what it sheds or lets
        # time out falls on tasks not yet started and costs only its own work. Chosen where the plan predicts
        # shedding or timeouts in either load scenario beyond AWARE_MIN_DROP of a class whose later steps carry work.
        aware = None
        if (self.aware_gain > 0).any():
            dropped = np.maximum(shed_n, 0.0) + (lost_n if lost_n is not None else 0.0)  # (C,2,K)
            firsts = np.minimum(dropped, (self.first_share * req)[None])  # the first steps there are to drop
            saved = np.maximum(dropped * self.ws_shed - firsts * self.ws_first - (dropped - firsts) * self.ws_later,
                               0.0)
            share = dropped / np.maximum(req[None], 1e-9) * (self.aware_gain > 0)[None, None, :]
            aware = (share.max(axis=(1, 2)) > AWARE_MIN_DROP) & (saved.sum(axis=2).max(axis=1) > 0)
            pen = pen - saved[:, 0].sum(axis=1) / total
        q_i = 1  # the second load scenario is the planned-for quantile (see ClassInput.p90_rps)
        # chance constraint: late or shed, as a share of the class's offered requests (p90 load)
        v90 = (late[:, q_i] + shed_n[:, q_i]) / np.maximum(req[q_i][None], 1e-9)  # (C,K)
        excess = np.maximum(v90 - self.tol[None], 0.0)
        # per class, not weighted by traffic share: each class has its own attainment target
        risk = prob.weights.risk_weight * (excess * self.risk_prio).sum(axis=1)
        # Change penalties, in units of "one replica-step at this pool's price" per success.
        step_price = self.price * dt / 3600.0
        cur = self.cur
        d_repl = np.abs(cand.repl[:, :, 0] - cur.repl[:, :, 0])
        change = prob.weights.change_weight * (d_repl * step_price).sum(axis=1)
        lever = sum((self._moved(cand, lv) for lv in _PRICED[1:]), self._moved(cand, _PRICED[0]).astype(float))
        change += prob.weights.lever_change_weight * (lever * step_price).sum(axis=1)
        # a rolling restart (`restart`, from the latency stage's hit rate) runs one surge replica per
        # replica for its warm start; counted twice, as a margin for what the model does not see (the
        # drain overlap, the new engines' first minutes). The empty caches it leaves are in the hit rate.
        restart_usd = (pl.restart * self.ready_int * self.price * self.dynamics.d_warm / 3600.0).sum(axis=1)
        change += restart_usd * 2.0
        if self.others is not None:
            change = change + self.others.change_usd
            self.last_cost_change = (cost, change)  # what the part adds to the fleet's sums (groups.py)
        J = cpr * (pen + risk) + change / succ
        J = np.where(np.isfinite(J), J, np.inf)
        if not detail:
            return J, None
        lat = pl.lat
        info = {
            "cost_usd": cost, "successes": succ, "cost_per_success_usd": cpr,
            "late_frac_p50": late[:, 0] / np.maximum(adm_n[:, 0], 1e-9), "late_or_shed_frac_p90": v90,
            "shed_frac_final": shed_n[:, 0] / np.maximum(req[0][None], 1e-9),
            "timed_out_frac_p50": (np.zeros_like(shed_n[:, 0]) if lost_n is None
                                   else lost_n[:, 0] / np.maximum(adm_n[:, 0], 1e-9)),
            "risk_excess": excess, "ready": ready, "billed": billed, "ttft_p95": pl.ttft95, "tpot_p95": pl.tpot95,
            "wait": pl.wait_detail, "utilisation": (flow.pool_rps / np.maximum(pl.cap_rps, 1e-9)), "hit": pl.hit,
            "penalty_factor": pen, "risk_term": risk, "change_usd": change,
            "step_aware": np.zeros(cand.n, dtype=bool) if aware is None else aware,
            "tpot_max": None if lat.tpot_max_s is None else np.reshape(lat.tpot_max_s, pl.shape),
        }
        return J, info
