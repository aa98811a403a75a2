"""The MPC planner: every lever of every pool chosen together over a horizon, first step applied.

`solve(problem, model, config, rng, warm=None, timer=None) -> PlanResult` searches plans for
the next `horizon_steps` × `step_s` seconds (default 10 × 30 s) and returns the best one
found, never nothing. A plan holds, per pool, a replica target for every step and, for the
first step, the warm-standby count, routing cache-affinity (prefix) weight, per-replica
in-flight cap, traffic weight within its route group and engine batch caps; per priority
class, a shed fraction. The policy applies the first step and re-plans next tick.

How a candidate plan is scored (`evaluate`, vectorised over candidates × steps × pools ×
classes × two load scenarios, the forecast's p50 and p90):

1. Replica dynamics: a target above what is serving orders new replicas at that step; they
   serve only after their start-up delay — warm (`startup_warm_s`) while a warm slot or a
   standby replica is available, cold (`startup_cold_s`) after; replicas already starting
   keep their expected ready times. A lower target removes starting replicas first (latest
   first), then drains ready ones, whose caches are lost (their slots become warm). Every
   replica that is starting, ready or on standby is billed.
2. Traffic: per class the forecast arrival rate × the share its route group receives ×
   (1 − shed^(1+retries)) (a shed request is retried by its client, so only shed^(1+R) is
   finally rejected); within a group, first-hop pools share by traffic weight (decode pools
   of a disaggregated group share the decode hop).
3. Hit rate: the cache model's steady state at the plan's affinity and replicas, approached
   from today's hit rate with time constant `cache_refill_s` (new replicas start cold).
4. Latency per pool and step from the PlanModel (load per ready replica, mix, hit rate,
   in-flight cap, batch caps); above the pool's sustainable rate a fluid backlog builds,
   served in priority order (critical first), and its wait is added to TTFT.
5. Violation probability per class: P(TTFT > SLO) and P(TPOT > SLO) from a log-normal
   through the predicted p50 and p95, whose spread beyond the p95 is bounded (TTFT by the
   prompt-length spread, TPOT by a request's averaging over its life; see _lognormal_exceed).
6. Objective (see controller/core/objective.py): cost / expected successes × (1 +
   weighted late and shed shares), + the chance-constraint penalty on the p90 scenario,
   + change penalties.

Search (deterministic for a given rng): structured enumeration of replica trajectories per
pool (constant levels, hold-then-change templates and a "need-ahead" trajectory around
anchors computed from the model), pool by pool with the others at the incumbent; then
cross-entropy refinement of the continuous levers (affinity, in-flight cap, traffic
weights, shed fractions) around the warm start; then another replica sweep with the new
levers; then the slow batch-cap options when a review is due. The budget is a count of
evaluated candidate × pool rows (`max_evaluations`, calibrated to ~200 ms for 10 pools on one core),
or wall time through an injected monotonic `timer` (the core reads no clock itself).

Must not: do I/O, read the clock, draw randomness other than from the Generator passed in,
or import the simulator.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.special import ndtr

from controller.core.mpc_model import PROMPT_LOG_SIGMA, LatencyQuery, PlanModel
from controller.core.objective import ObjectiveWeights

Timer = Callable[[], float]
# log-spread of TTFT beyond its p95: the prompt-length spread (see _lognormal_exceed)
TTFT_TAIL_SIGMA = PROMPT_LOG_SIGMA
# log-spread of a request's TPOT beyond its p95: a request's TPOT averages the steps of its whole
# life, so its tail is thin whatever widens the p50→p95 (bursts, corrections). Simulated runs,
# P(TPOT > 2 × p95): mooncake-conv 0.12 %, azure-conv 0.014 %, servegen-diurnal 0.0015 %, which
# σ = 0.5, 0.35, 0.27 from the p95 reproduce; 0.5 is the widest of them.
TPOT_TAIL_SIGMA = 0.5


# --------------------------------------------------------------------------- configuration


@dataclass(frozen=True)
class MpcConfig:
    horizon_steps: int = 10
    step_s: float = 30.0
    # Budget without a timer: candidate plans × pools scored per tick. 4,000 ≈ 200 ms of CPU on one
    # core for 10 pools (400 plans) on the reference machine (see /work/notes/mpc-results.md); a
    # single pool gets 4,000 plans, far more than its search needs.
    max_evaluations: int = 4000
    time_budget_s: float = 0.2  # with a timer: stop starting new batches after this
    ce_iterations: int = 4
    ce_population: int = 48
    ce_elite_frac: float = 0.2
    replica_span: int = 2  # constant-level candidates within ±span of the anchors
    cache_refill_s: float = 90.0  # time constant of a cache refilling after routing/replica changes
    client_retries: int = 2  # retries a client makes after a 429/503 (shed^(1+R) is finally rejected)
    client_timeout_s: float = 120.0
    prefix_weight_range: tuple[float, float] = (0.0, 8.0)
    min_inflight_cap: int = 8
    standby_cost_frac: float = 1.0  # a warm-standby replica costs this share of a serving one
    batch_token_options: tuple[int, ...] = (1024, 2048, 4096, 8192)
    batch_cap_gain: float = 0.1  # a batch-cap change must improve the objective by this share
    terminal_steps: float = 5.0  # extra weight of the last step (the state left behind the horizon)

    def __post_init__(self) -> None:
        if not (isinstance(self.horizon_steps, int) and 2 <= self.horizon_steps <= 40):
            raise ValueError(f"mpc.horizon_steps must be an integer in [2, 40] (got {self.horizon_steps!r})")
        for name in ("step_s", "time_budget_s", "cache_refill_s", "client_timeout_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"mpc.{name} must be a finite number > 0 (got {v!r})")
        for name in ("max_evaluations", "ce_iterations", "ce_population"):
            v = getattr(self, name)
            if not (isinstance(v, int) and v >= 1):
                raise ValueError(f"mpc.{name} must be an integer >= 1 (got {v!r})")
        if self.max_evaluations < 50:
            raise ValueError(f"mpc.max_evaluations must be >= 50 (got {self.max_evaluations})")
        if not 0 < self.ce_elite_frac < 1:
            raise ValueError(f"mpc.ce_elite_frac must be in (0, 1) (got {self.ce_elite_frac!r})")
        lo, hi = self.prefix_weight_range
        if not 0 <= lo <= hi:
            raise ValueError(f"mpc.prefix_weight_range must be 0 <= lo <= hi (got {self.prefix_weight_range!r})")


# --------------------------------------------------------------------------- the problem


@dataclass(frozen=True)
class PoolInput:
    """One pool as the planner sees it this tick (the policy builds it from telemetry and state)."""

    name: str
    model_index: int  # row of this pool in the PlanModel
    group: str
    role: str  # mixed | prefill | decode
    usd_per_hour: float  # per replica
    lo: int  # replica bounds after overrides (a pin sets lo = hi)
    hi: int
    target: int  # replica target in force
    ready: int
    starting_eta_s: tuple[float, ...] = ()  # seconds until each starting replica is ready
    warm_slots: int = 0  # replicas that can start warm now
    startup_warm_s: float = 30.0
    startup_cold_s: float = 180.0
    standby: int = 0
    prefix_weight: float = 3.0
    load_weight: float = 4.0  # queue + kv weights (what affinity competes with)
    inflight_cap: int = 0
    traffic_weight: float = 1.0
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    prompt_tokens: float = 1000.0
    output_tokens: float = 200.0
    hit_rate: float = 0.0
    reuse_inf_hit: float = 0.0
    reuse_working_set: float = 0.0
    backlog: float = 0.0  # requests waiting now (engine queues + router holds)
    frozen: bool = False  # operator freeze: nothing of this pool may change
    levers_fixed: bool = False  # breaker or operator: routing levers are given, not searched
    max_prefix_weight: float | None = None  # breaker ceiling on affinity
    max_inflight_cap: int | None = None  # breaker ceiling on the in-flight cap (0 = no ceiling)
    batch_review: bool = False  # may the slow batch-cap lever change this tick


@dataclass(frozen=True)
class ClassInput:
    name: str
    ttft_slo_s: float
    tpot_slo_s: float
    p50_rps: tuple[float, ...]  # forecast arrival rate per step (whole fleet)
    p90_rps: tuple[float, ...]  # the quantile planned for (ObjectiveWeights.plan_quantile), per step
    shed_now: float = 0.0
    min_shed: float = 0.0  # breaker floor
    max_shed: float = 1.0
    backlog: float = 0.0


@dataclass(frozen=True)
class PlanProblem:
    pools: tuple[PoolInput, ...]
    classes: tuple[ClassInput, ...]  # most protected first
    weights: ObjectiveWeights
    group_share: Mapping[str, float] = field(default_factory=dict)  # share of class traffic per route group

    def __post_init__(self) -> None:
        if not self.pools:
            raise ValueError("PlanProblem: no pools")
        for p in self.pools:
            if not 0 <= p.lo <= p.hi:
                raise ValueError(f"PlanProblem: pool {p.name} bounds lo={p.lo} hi={p.hi} are not 0 <= lo <= hi")


def plan_steps(cfg: MpcConfig, pools: Sequence[PoolInput]) -> int:
    """Steps the plan is scored over: the configured horizon *after* the longest cold start
    (capped at 40), so a replica ordered now is valued over a full horizon once it serves
    rather than looking like pure cost. Example: 10 × 30 s with a 300 s cold start → 20 steps;
    with a 90 s cold start → 13.
    """
    longest = max((p.startup_cold_s for p in pools), default=0.0)
    return int(min(40, cfg.horizon_steps + math.ceil(longest / cfg.step_s)))


# --------------------------------------------------------------------------- plans


@dataclass(frozen=True)
class PoolPlan:
    replicas: tuple[int, ...]  # per horizon step (the first is applied)
    standby: int
    prefix_weight: float
    inflight_cap: int  # 0 = none
    traffic_weight: float  # absolute router weight now (weight per replica × replicas serving in the first step)
    max_num_seqs: int
    max_num_batched_tokens: int


@dataclass(frozen=True)
class Plan:
    pools: Mapping[str, PoolPlan]
    shed: Mapping[str, float]  # per class, first step


@dataclass(frozen=True)
class PlanResult:
    plan: Plan
    objective: float
    terms: Mapping[str, Any]  # predicted cost, successes, per-class risk, binding constraints
    evaluations: int
    budget_exhausted: bool
    incumbent_objective: float  # the plan in force (held), for comparison


# --------------------------------------------------------------------------- candidates (arrays)


@dataclass
class _Cand:
    """C candidate plans as arrays (mutable scratch, never leaves this module)."""

    repl: np.ndarray  # (C, P, H) int
    standby: np.ndarray  # (C, P) int
    pw: np.ndarray  # (C, P) prefix weight
    cap: np.ndarray  # (C, P) in-flight cap (>= max_num_seqs means none)
    tw: np.ndarray  # (C, P) traffic weight
    mbt: np.ndarray  # (C, P) max_num_batched_tokens
    mns: np.ndarray  # (C, P) max_num_seqs
    shed: np.ndarray  # (C, K)

    @property
    def n(self) -> int:
        return self.repl.shape[0]

    def take(self, idx: np.ndarray) -> _Cand:
        return _Cand(*(getattr(self, f)[idx] for f in ("repl", "standby", "pw", "cap", "tw", "mbt", "mns", "shed")))

    def tile(self, n: int) -> _Cand:
        return self.take(np.zeros(n, dtype=np.intp))

    @staticmethod
    def concat(parts: Sequence[_Cand]) -> _Cand:
        return _Cand(*(np.concatenate([getattr(p, f) for p in parts])
                       for f in ("repl", "standby", "pw", "cap", "tw", "mbt", "mns", "shed")))


def _lognormal_exceed(p50: np.ndarray, p95: np.ndarray, bound: np.ndarray,
                      tail_sigma: float | None = None) -> np.ndarray:
    """P(X > bound) for a log-normal through (p50, p95). p50 2 s, p95 4 s, bound 4 s → 0.05.

    `tail_sigma` bounds the log-spread beyond the p95 (the tail continues from the p95 with
    σ = min(fitted σ, tail_sigma)); below the p95 the fitted curve stands, so the two meet
    there. Why, for TTFT: a wide p50→p95 ratio comes from mixing cache hits and short prompts
    with long uncached ones; beyond the p95 what is left is the request's own prefill of a long
    prompt, whose length spreads with σ ≈ 1 (PROMPT_LOG_SIGMA) and is capped by the context.
    Example (mooncake-conv, 3 replicas, simulated): TTFT p50 0.32 s, p95 3.43 s → fitted σ 1.44
    puts 0.80 % beyond 3 × p95; the run had 0.22 %, and σ = 1 from the p95 gives 0.30 %.
    """
    m = np.maximum(p50, 1e-6)
    sigma = np.maximum(np.log(np.maximum(p95, m * 1.0001) / m) / 1.6449, 0.05)
    z = np.log(np.maximum(bound, 1e-9) / m) / sigma
    if tail_sigma is not None and float(sigma.max(initial=0.0)) > tail_sigma:
        # beyond the p95 (z > 1.6449) stretch z by σ / σ_tail where the fit is wider than the tail:
        # z = 1.6449 + ln(bound / p95) / σ_tail, written on the fitted z (no second log). Only when
        # some row needs it: the planner scores this twice per batch (~0.5 ms each on 58k rows).
        z = z + np.maximum(z - 1.6449, 0.0) * np.maximum(sigma * (1.0 / tail_sigma) - 1.0, 0.0)
    return 1.0 - ndtr(z)


class _Evaluator:
    """Scores batches of candidates for one problem (precomputes what does not depend on the plan)."""

    def __init__(self, prob: PlanProblem, model: PlanModel, cfg: MpcConfig) -> None:
        self.prob, self.model, self.cfg = prob, model, cfg
        P, K = len(prob.pools), len(prob.classes)
        H = plan_steps(cfg, prob.pools)
        self.P, self.K, self.H = P, K, H
        dt = cfg.step_s
        self.dt = dt
        pools = prob.pools
        self.idx = np.array([p.model_index for p in pools], dtype=np.intp)
        self.price = np.array([p.usd_per_hour for p in pools])
        self.ready0 = np.array([p.ready for p in pools], dtype=float)
        self.warm0 = np.array([p.warm_slots for p in pools], dtype=float)
        self.d_warm = np.array([p.startup_warm_s for p in pools])
        self.d_cold = np.array([p.startup_cold_s for p in pools])
        self.bin_warm = np.minimum(np.ceil(self.d_warm / dt - 0.5), H).astype(np.intp)
        self.bin_cold = np.minimum(np.ceil(self.d_cold / dt - 0.5), H).astype(np.intp)
        pend = np.zeros((P, H + 1))
        for j, p in enumerate(pools):
            for eta in p.starting_eta_s:
                pend[j, int(min(max(math.ceil(eta / dt - 0.5), 0), H))] += 1
        self.pend0 = pend
        # Replicas serving in the first step (ready now + starting ones due within it). The router
        # splits a group's traffic by the absolute pool weights until the next decision, while the
        # model splits it by weight per replica × replicas ready: the absolute weight is per replica
        # × this count, so the first step is scored with the split the router will apply. Per
        # replica × replicas ready *now* gave a pool whose replicas were landing this step too little
        # traffic and its neighbour too much: on the demo, after an H100 crash (1 ready, 4 landing)
        # the A100 pool got 50 % of a surge the plan gave it 16 % of, and its queue went 150 → 440.
        self.ready_step0 = np.maximum(self.ready0 + pend[:, 0], 1.0)
        self.P_tok = np.array([p.prompt_tokens for p in pools])
        self.O_tok = np.array([p.output_tokens for p in pools])
        self.hit0 = np.array([p.hit_rate for p in pools])
        self.inf_hit = np.array([p.reuse_inf_hit for p in pools])
        self.ws = np.array([p.reuse_working_set for p in pools])
        self.load_w = np.array([p.load_weight for p in pools])
        self.backlog0 = np.array([p.backlog for p in pools])
        roles = [p.role for p in pools]
        self.first_hop = np.array([r != "decode" for r in roles])
        self.decode_hop = np.array([r == "decode" for r in roles])
        groups = sorted({p.group for p in pools})
        self.groups = groups
        gidx = np.array([groups.index(p.group) for p in pools], dtype=np.intp)
        self.gidx = gidx
        share = np.array([float(prob.group_share.get(g, 1.0 / len(groups))) for g in groups])
        share = share / share.sum() if share.sum() > 0 else np.full(len(groups), 1.0 / len(groups))
        self.gshare = share
        self.has_decode_group = np.array([self.decode_hop[gidx == g].any() for g in range(len(groups))])
        self.hop_size = np.array([int(((gidx == gidx[j]) & (self.decode_hop == self.decode_hop[j])).sum())
                                  for j in range(P)])
        cls = prob.classes
        self.lam = np.stack([np.array([c.p50_rps for c in cls]).T, np.array([c.p90_rps for c in cls]).T])  # (2,H,K)
        if self.lam.shape[1] != H:
            raise ValueError(f"PlanProblem: forecasts have {self.lam.shape[1]} steps, the plan has {H} "
                             f"(see plan_steps)")
        w = prob.weights
        margin = w.slo_margin
        self.slo_ttft = np.array([c.ttft_slo_s for c in cls]) * margin
        self.slo_tpot = np.array([c.tpot_slo_s for c in cls]) * margin
        self.wv = np.array([w.cls("violation_weight", c.name) * (1 + w.cls("steps_per_task", c.name)) / 2 for c in cls])
        self.ws_shed = np.array([w.cls("shed_weight", c.name) * (1 + w.cls("steps_per_task", c.name)) / 2 for c in cls])
        self.tol = np.array([w.cls("risk_tolerance", c.name) for c in cls])
        self.risk_prio = np.array([w.cls("risk_priority", c.name) for c in cls])
        # Backlog per pool and class at t=0: the pool's waiting requests split by class demand.
        demand_now = self.lam[0, 0]
        share_k = demand_now / demand_now.sum() if K and demand_now.sum() > 0 else np.full(K, 1.0 / max(K, 1))
        self.q0 = self.backlog0[:, None] * share_k[None, :]
        self.step_weight = np.ones(H)
        self.step_weight[-1] += cfg.terminal_steps
        self.cur = self._current_cand()
        self.evaluations = 0
        self.need: np.ndarray | None = None  # (P, H) replicas each step's p90 load needs (set by solve)

    # -- the plan in force, as a candidate

    def _current_cand(self) -> _Cand:
        pools, H = self.prob.pools, self.H
        repl = np.array([[p.target] * H for p in pools], dtype=float)[None]
        def cap_of(p: PoolInput) -> float:
            cap = float(p.inflight_cap if p.inflight_cap > 0 else p.max_num_seqs)
            return min(cap, float(p.max_inflight_cap)) if p.max_inflight_cap else cap

        def pw_of(p: PoolInput) -> float:
            return min(p.prefix_weight, p.max_prefix_weight) if p.max_prefix_weight is not None else p.prefix_weight

        return _Cand(
            repl=repl, standby=np.array([[p.standby for p in pools]], dtype=float),
            pw=np.array([[pw_of(p) for p in pools]]),
            cap=np.array([[cap_of(p) for p in pools]], dtype=float),
            tw=np.array([[p.traffic_weight / n for p, n in zip(pools, self.ready_step0)]]),  # weight per replica
            mbt=np.array([[p.max_num_batched_tokens for p in pools]], dtype=float),
            mns=np.array([[p.max_num_seqs for p in pools]], dtype=float),
            shed=np.array([[c.shed_now for c in self.prob.classes]]))

    # -- replica dynamics

    def dynamics(self, repl: np.ndarray, standby: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ready during each step, billed replicas per step, share of ready replicas started in the plan)."""
        C, P, H = repl.shape
        ready = np.broadcast_to(self.ready0, (C, P)).copy()
        pend = np.broadcast_to(self.pend0, (C, P, H + 1)).copy()
        warm = np.broadcast_to(self.warm0, (C, P)).copy() + standby
        new_ready = np.zeros((C, P))
        new_pend = np.zeros((C, P, H + 1))
        ready_mid = np.empty((C, P, H))
        billed = np.empty((C, P, H))
        fresh = np.empty((C, P, H))
        rows = np.arange(C)[:, None]
        cols = np.arange(P)[None, :]
        for h in range(H):
            if h > 0:  # replicas whose ready time passed before this step starts
                ready += pend[:, :, h - 1]
                new_ready += new_pend[:, :, h - 1]
                pend[:, :, h - 1] = 0.0
                new_pend[:, :, h - 1] = 0.0
            serving = ready + pend.sum(axis=2)
            tgt = repl[:, :, h]
            add = np.maximum(tgt - serving, 0.0)
            if add.any():
                n_w = np.minimum(add, warm)
                warm -= n_w
                n_c = add - n_w
                bw = np.minimum(h + self.bin_warm, H)[None, :].repeat(C, 0)
                bc = np.minimum(h + self.bin_cold, H)[None, :].repeat(C, 0)
                np.add.at(pend, (rows.repeat(P, 1), cols.repeat(C, 0), bw), n_w)
                np.add.at(pend, (rows.repeat(P, 1), cols.repeat(C, 0), bc), n_c)
                np.add.at(new_pend, (rows.repeat(P, 1), cols.repeat(C, 0), bw), n_w)
                np.add.at(new_pend, (rows.repeat(P, 1), cols.repeat(C, 0), bc), n_c)
            cut = np.maximum(serving - tgt, 0.0)
            if cut.any():
                for b in range(H, h - 1, -1):  # starting replicas go first, the latest first
                    take = np.minimum(pend[:, :, b], cut)
                    pend[:, :, b] -= take
                    new_take = np.minimum(new_pend[:, :, b], take)
                    new_pend[:, :, b] -= new_take
                    cut = cut - take
                drained = np.minimum(cut, ready)
                ready -= drained
                new_ready = np.minimum(new_ready, ready)
                warm += drained  # a drained replica leaves its weights on the node
            ready_mid[:, :, h] = ready + pend[:, :, h]
            fresh[:, :, h] = (new_ready + new_pend[:, :, h]) / np.maximum(ready_mid[:, :, h], 1e-9)
            billed[:, :, h] = ready + pend.sum(axis=2)
        billed += standby[:, :, None] * self.cfg.standby_cost_frac
        return ready_mid, billed, np.clip(fresh, 0.0, 1.0)

    def shed_active(self, ready: np.ndarray) -> np.ndarray:
        """(C, H) bool: the plan's shed fractions apply in the steps where some route group has fewer
        replicas ready than its planned-for load needs (elsewhere only the breaker's floors stay):
        shedding delays work while capacity is short or on its way, it is not a way to run small."""
        C, P, H = ready.shape
        if self.need is None:
            return np.ones((C, H), dtype=bool)
        # per route group: traffic can move between its pools, so what counts is the group's total
        short = np.zeros((C, H), dtype=bool)
        for g in range(len(self.groups)):
            m = self.gidx == g
            short |= ready[:, m, :].sum(axis=1) < self.need[m].sum(axis=0)[None, :] - 1e-9
        return short

    def shares(self, tw: np.ndarray) -> np.ndarray:
        """(…, P): each pool's share of the fleet's class traffic (group share × weight within its hop).

        `tw` is the effective weight of each pool (the plan's weight per ready replica × the
        replicas ready), so traffic follows capacity as it arrives unless the plan says otherwise.
        """
        tw = np.maximum(tw, 0.0)
        lead = tw.shape[:-1]
        tw = tw.reshape(-1, self.P)
        C = tw.shape[0]
        share = np.zeros((C, self.P))
        for g in range(len(self.groups)):
            for hop in (self.first_hop, self.decode_hop):
                m = (self.gidx == g) & hop
                if not m.any():
                    continue
                tot = tw[:, m].sum(axis=1, keepdims=True)
                equal = np.full((C, int(m.sum())), 1.0 / m.sum())
                share[:, m] = np.where(tot > 0, tw[:, m] / np.maximum(tot, 1e-12), equal) * self.gshare[g]
        return share.reshape(lead + (self.P,))

    # -- scoring

    def score(self, cand: _Cand, detail: bool = False) -> tuple[np.ndarray, dict[str, Any] | None]:
        cfg, prob = self.cfg, self.prob
        C, P, H, K = cand.n, self.P, self.H, self.K
        dt = self.dt
        self.evaluations += C
        ready, billed, fresh = self.dynamics(cand.repl, cand.standby)
        eff = cand.tw[:, None, :] * np.maximum(np.transpose(ready, (0, 2, 1)), 1e-3)  # (C,H,P)
        share = self.shares(eff)  # (C,H,P)
        active = self.shed_active(ready)  # (C,H): shedding holds until the capacity the load needs is ready
        floor = np.array([c.min_shed for c in prob.classes])
        shed = np.where(active[:, :, None], np.clip(cand.shed, 0.0, 1.0)[:, None, :], floor[None, None, :])
        rejected = shed ** (1 + cfg.client_retries)  # (C,H,K)
        adm = self.lam[None] * (1.0 - rejected)[:, None, :, :]  # (C,2,H,K)
        pool_k = share[:, None, :, :, None] * adm[:, :, :, None, :]  # (C,2,H,P,K)
        pool_rps = pool_k.sum(axis=4)  # (C,2,H,P)
        ready_t = np.transpose(ready, (0, 2, 1))[:, None]  # (C,1,H,P)
        fresh_t = np.transpose(fresh, (0, 2, 1))[:, None]
        lam_rep = pool_rps / np.maximum(ready_t, 1e-9)
        # Hit rate: steady state at the plan's affinity and replicas, approached from today's.
        batch_tok = np.zeros_like(lam_rep)
        hit_ss = self.model.hit_rate(
            np.broadcast_to(self.idx, lam_rep.shape), np.broadcast_to(ready_t, lam_rep.shape),
            np.broadcast_to(cand.pw[:, None, None, :], lam_rep.shape),
            np.broadcast_to(self.load_w, lam_rep.shape), np.broadcast_to(self.inf_hit, lam_rep.shape),
            np.broadcast_to(self.ws, lam_rep.shape), batch_tok)
        t_mid = (np.arange(H) + 0.5) * dt
        relax = np.exp(-t_mid / cfg.cache_refill_s)[None, None, :, None]
        # a batch-cap change is a rolling restart: every replica comes back with an empty cache, so
        # the hit rate refills from zero (on mooncake-conv, 2,048 → 1,024 tokens took it from 0.43
        # to 0.05, and the change lost money the restart's GPU cost alone did not show)
        restart = (cand.mbt != self.cur.mbt) | (cand.mns != self.cur.mns)  # (C,P)
        hit_from = np.where(restart, 0.0, self.hit0[None, :])[:, None, None, :]
        hit = hit_ss + (hit_from - hit_ss) * relax
        hit = hit * (1.0 - fresh_t * relax * 0.5)  # new replicas start cold (same time constant)
        shape = lam_rep.shape
        q = LatencyQuery(
            pool_index=np.broadcast_to(self.idx, shape).ravel(), rps_per_replica=lam_rep.ravel(),
            prompt_tokens=np.broadcast_to(self.P_tok, shape).ravel(),
            output_tokens=np.broadcast_to(self.O_tok, shape).ravel(), hit_rate=hit.ravel(),
            inflight_cap=np.broadcast_to(cand.cap[:, None, None, :], shape).ravel(),
            max_num_seqs=np.broadcast_to(cand.mns[:, None, None, :], shape).ravel(),
            max_num_batched_tokens=np.broadcast_to(cand.mbt[:, None, None, :], shape).ravel())
        lat = self.model.latency(q)
        cap_rps = lat.capacity_rps.reshape(shape) * ready_t  # pool rps it sustains
        ttft50, ttft95 = lat.ttft_p50_s.reshape(shape), lat.ttft_p95_s.reshape(shape)
        tpot50, tpot95 = lat.tpot_p50_s.reshape(shape), lat.tpot_p95_s.reshape(shape)
        # Fluid backlog per pool, served in priority order (cumulative over classes).
        cum_in = np.cumsum(pool_k, axis=4)  # (C,2,H,P,K)
        q_cum = np.broadcast_to(np.cumsum(self.q0, axis=1)[None, None], (C, 2, P, K)).copy()
        wait = np.empty_like(cum_in)
        for h in range(H):
            m = cap_rps[:, :, h, :, None]
            q_next = np.maximum(q_cum + (cum_in[:, :, h] - m) * dt, 0.0)
            wait[:, :, h] = 0.5 * (q_cum + q_next) / np.maximum(m, 1e-9)
            q_cum = q_next
        wait = np.minimum(wait, 10 * cfg.client_timeout_s)
        # Waiting for a batch slot is served by priority (router holds and the engine queue both
        # go critical first): Cobham's factor for non-preemptive priority, class k waits
        # W × (1 − ρ) / ((1 − σ_{k−1})(1 − σ_k)), σ_k the utilisation of classes up to k.
        # Example: ρ = 0.95 with critical 20 % of the load → critical waits 0.05/0.81 = 0.06 W;
        # sheddable (the last 20 %) waits 0.05/(0.24 × 0.05) = 4.2 W.
        if lat.slot_wait_p95_s is not None:
            sw50 = lat.slot_wait_p50_s.reshape(shape)
            sw95 = lat.slot_wait_p95_s.reshape(shape)
            rho = np.minimum(pool_rps / np.maximum(cap_rps, 1e-9), 0.98)[..., None]
            frac = cum_in / np.maximum(pool_rps[..., None], 1e-9)
            sig_k = rho * frac
            sig_prev = rho * np.concatenate([np.zeros_like(frac[..., :1]), frac[..., :-1]], axis=-1)
            cob = (1.0 - rho) / np.maximum((1.0 - sig_prev) * (1.0 - sig_k), 1e-3)
            cob = np.minimum(cob, 1.0 / np.maximum(1.0 - rho, 0.02))
            cob -= 1.0  # the slot wait is re-weighed: t + sw × (cob − 1), plus the backlog's wait
            t50 = ttft50[..., None] + sw50[..., None] * cob
            t95 = ttft95[..., None] + sw95[..., None] * cob
            t50 += wait
            t95 += wait
        else:
            t50, t95 = ttft50[..., None] + wait, ttft95[..., None] + wait
        pf = _lognormal_exceed(t50, t95, self.slo_ttft, tail_sigma=TTFT_TAIL_SIGMA)
        pt = _lognormal_exceed(tpot50[..., None], tpot95[..., None], self.slo_tpot, tail_sigma=TPOT_TAIL_SIGMA)
        pf = np.where(wait > cfg.client_timeout_s, 1.0, pf)
        # Per class: combine the hops of each group, weighted by traffic share.
        v_first = np.zeros((C, 2, H, K))
        v_dec = np.zeros((C, 2, H, K))
        w_share = share[:, None, :, :, None]
        fh = self.first_hop[None, None, None, :, None]
        dh = self.decode_hop[None, None, None, :, None]
        mixed_v = pf + pt
        mixed_v -= pf * pt  # 1 − (1 − pf)(1 − pt)
        # mixed/prefill pools: TTFT (and TPOT for mixed); decode pools: TPOT and their first step
        first_v = np.where(np.array([r == "prefill" for r in (p.role for p in prob.pools)])[None, None, None, :, None],
                           pf, mixed_v)
        v_first = (w_share * fh * first_v).sum(axis=3)
        v_dec = (w_share * dh * mixed_v).sum(axis=3)
        v = 1.0 - (1.0 - v_first) * (1.0 - v_dec)
        v = np.clip(v, 0.0, 1.0)  # (C,2,H,K) late share of admitted requests
        # Aggregates over the horizon.
        # Terminal weight: the last step stands for the state the plan leaves behind, which lasts
        # beyond the horizon (a replica ordered now keeps serving after it): it counts
        # `terminal_steps` extra steps, so capacity arriving late in the horizon is not judged
        # on a few steps of benefit against the whole horizon's cost.
        wt = self.step_weight  # (H,)
        req = (self.lam * wt[None, :, None]).sum(axis=1) * dt  # (2,K) requests offered
        adm_n = (adm * wt[None, None, :, None]).sum(axis=2) * dt  # (C,2,K)
        # a shed attempt that is retried and admitted arrives at least one backoff late: count
        # half of those as late (partial shedding delays; it is not free)
        retried = self.lam[None] * (shed - rejected)[:, None, :, :]
        late = (np.minimum(adm * v + 0.5 * retried, self.lam[None] - self.lam[None] * rejected[:, None])
                * wt[None, None, :, None]).sum(axis=2) * dt
        shed_n = req[None] - adm_n
        cost = (billed * self.price[None, :, None] * wt[None, None, :]).sum(axis=(1, 2)) * dt / 3600.0  # (C,)
        succ = np.maximum(adm_n[:, 0].sum(axis=1) - late[:, 0].sum(axis=1), 1e-6)
        total = max(float(req[0].sum()), 1e-6)
        cpr = cost / succ
        pen = 1.0 + (late[:, 0] * self.wv).sum(axis=1) / total + (shed_n[:, 0] * self.ws_shed).sum(axis=1) / total
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
        lever = ((np.abs(cand.pw - cur.pw) > 0.25).astype(float) + (np.abs(cand.cap - cur.cap) > 0.5)
                 + (np.abs(cand.tw - cur.tw) > 0.02) + (cand.standby != cur.standby))
        change += prob.weights.lever_change_weight * (lever * step_price).sum(axis=1)
        restart = (cand.mbt != cur.mbt) | (cand.mns != cur.mns)
        # a rolling restart runs one surge replica per replica for its warm start; counted twice, as a
        # margin for what the model does not see (the drain overlap, the new engines' first minutes).
        # The empty caches it leaves are in the hit-rate dynamics above.
        restart_usd = (restart * np.array([p.ready for p in prob.pools]) * self.price * self.d_warm / 3600.0).sum(axis=1)
        change += restart_usd * 2.0
        J = cpr * (pen + risk) + change / succ
        J = np.where(np.isfinite(J), J, np.inf)
        if not detail:
            return J, None
        info = {
            "cost_usd": cost, "successes": succ, "cost_per_success_usd": cpr,
            "late_frac_p50": late[:, 0] / np.maximum(adm_n[:, 0], 1e-9), "late_or_shed_frac_p90": v90,
            "shed_frac_final": shed_n[:, 0] / np.maximum(req[0][None], 1e-9),
            "risk_excess": excess, "ready": ready, "billed": billed, "ttft_p95": ttft95, "tpot_p95": tpot95,
            "wait": wait, "utilisation": (pool_rps / np.maximum(cap_rps, 1e-9)), "hit": hit,
            "penalty_factor": pen, "risk_term": risk, "change_usd": change,
        }
        return J, info


# --------------------------------------------------------------------------- search


def _need_per_step(ev: _Evaluator, base: _Cand, j: int) -> np.ndarray:
    """Smallest replica count of pool j per step that meets the tightest SLO under the p90 load.

    Replicas are taken as ready at once (what the load needs, not what is reachable) with the
    incumbent levers and today's hit rate; a pool whose p90 load is 0 needs its minimum.
    Example: 30 req/s at p90 and a replica sustaining 4.2 req/s within the SLO → 8.
    """
    p = ev.prob.pools[j]
    levels = np.arange(max(p.lo, 1), max(p.hi, 1) + 1, dtype=float)
    share = ev.shares(base.tw[0] * np.maximum(ev.ready0 + ev.pend0.sum(axis=1), 1.0))[j]
    floor = np.array([c.min_shed for c in ev.prob.classes])
    rejected = np.clip(floor, 0.0, 1.0) ** (1 + ev.cfg.client_retries)  # only what must be shed
    demand = (ev.lam[1] * (1.0 - rejected)[None, :]).sum(axis=1) * share  # (H,)
    active = ev.lam[1].sum(axis=0) > 0
    ttft_slo = float(ev.slo_ttft[active].min()) if active.any() else math.inf
    tpot_slo = float(ev.slo_tpot[active].min()) if active.any() else math.inf
    H = ev.H
    lam = demand[None, :] / levels[:, None]
    shape = lam.shape
    q = LatencyQuery(
        pool_index=np.full(lam.size, ev.idx[j]), rps_per_replica=lam.ravel(),
        prompt_tokens=np.full(lam.size, ev.P_tok[j]), output_tokens=np.full(lam.size, ev.O_tok[j]),
        hit_rate=np.full(lam.size, ev.hit0[j]), inflight_cap=np.full(lam.size, base.cap[0, j]),
        max_num_seqs=np.full(lam.size, base.mns[0, j]), max_num_batched_tokens=np.full(lam.size, base.mbt[0, j]))
    lat = ev.model.latency(q)
    ok = ((lat.ttft_p95_s.reshape(shape) <= ttft_slo) & (lat.tpot_p95_s.reshape(shape) <= tpot_slo)
          & (lat.utilisation.reshape(shape) < 0.97))
    need = np.full(H, p.hi + 1)  # hi + 1: even the pool's maximum is short this step
    for h in range(H):
        if demand[h] <= 0:
            need[h] = p.lo
            continue
        idx = np.flatnonzero(ok[:, h])
        if len(idx):
            need[h] = int(levels[idx[0]])
    return np.clip(need, p.lo, p.hi + 1)


def _templates(ev: _Evaluator, base: _Cand, j: int, need: np.ndarray, span: int) -> np.ndarray:
    """Replica trajectories (L, H) for pool j: constant levels, hold-then-change, need-ahead."""
    p = ev.prob.pools[j]
    H = ev.H
    lo, hi = p.lo, p.hi
    if p.frozen or lo == hi:
        return np.full((1, H), min(max(p.target, lo), hi) if p.frozen else lo)
    cur = int(base.repl[0, j, 0])
    serving = p.ready + len(p.starting_eta_s)
    need = np.minimum(need, hi)
    centres = {cur, p.target, serving, int(need[0]), int(need.max()), int(need[: max(1, H // 3)].max())}
    levels: set[int] = set()
    for c in centres:
        for d in range(-span, span + 1):
            levels.add(min(max(c + d, lo), hi))
    levels_l = sorted(levels)
    rows = [np.full(H, lv) for lv in levels_l]
    # need-ahead: at each step, what the next start-up window will need (warm delay ahead)
    ahead = max(1, int(math.ceil(p.startup_warm_s / ev.dt)))
    na = np.array([need[h: min(H, h + ahead + 1)].max() for h in range(H)])
    rows.append(np.clip(na, lo, hi))
    cold_ahead = max(1, int(math.ceil(p.startup_cold_s / ev.dt)))
    nc = np.array([need[h: min(H, h + cold_ahead + 1)].max() for h in range(H)])
    rows.append(np.clip(nc, lo, hi))
    # hold today's target, then move to a level at step s
    for s in (2, 5):
        if s >= H:
            continue
        for lv in levels_l:
            if lv == cur:
                continue
            r = np.full(H, cur)
            r[s:] = lv
            rows.append(r)
    # change now, then settle at another level later (e.g. surge now, relax after it)
    for s in (4,):
        if s >= H:
            continue
        for lv in (int(need[0]), int(need.max())):
            for lv2 in (int(need[s:].max()), cur):
                r = np.full(H, min(max(lv, lo), hi))
                r[s:] = min(max(lv2, lo), hi)
                rows.append(r)
    arr = np.unique(np.array(rows, dtype=float), axis=0)
    return arr


class _Search:
    def __init__(self, ev: _Evaluator, cfg: MpcConfig, rng: np.random.Generator, timer: Timer | None) -> None:
        self.ev, self.cfg, self.rng, self.timer = ev, cfg, rng, timer
        self.t0 = timer() if timer is not None else 0.0
        self.best: _Cand | None = None
        self.best_J = math.inf
        self.exhausted = False

    def left(self) -> int:
        if self.timer is not None:
            if self.timer() - self.t0 >= self.cfg.time_budget_s:
                return 0
            return 10**9
        return (self.cfg.max_evaluations - self.ev.evaluations * self.ev.P) // self.ev.P

    def run(self, cands: _Cand) -> np.ndarray:
        """Score a batch (truncated to the budget); keep the best; return the scores (inf where skipped)."""
        n = cands.n
        room = self.left()
        if room <= 0:
            self.exhausted = True
            return np.full(n, np.inf)
        if room < n:
            self.exhausted = True
            cands = cands.take(np.arange(room))
        J, _ = self.ev.score(cands)
        k = int(np.argmin(J))
        if J[k] < self.best_J:
            self.best_J = float(J[k])
            self.best = cands.take(np.array([k]))
        if len(J) < n:
            J = np.concatenate([J, np.full(n - len(J), np.inf)])
        return J


def _sweep_replicas(s: _Search, needs: list[np.ndarray], order: list[int]) -> None:
    ev = s.ev
    for j in order:
        if s.left() <= 0:
            return
        base = s.best
        assert base is not None
        tpl = _templates(ev, base, j, needs[j], s.cfg.replica_span)
        c = base.tile(len(tpl))
        c.repl = c.repl.copy()
        c.repl[:, j, :] = tpl
        # standby options ride along on the constant-level rows of this pool
        p = ev.prob.pools[j]
        if not p.frozen and p.hi > 0 and s.cfg.standby_cost_frac < 1.0:
            extra = base.tile(len(tpl))
            extra.repl = c.repl.copy()
            extra.standby = extra.standby.copy()
            extra.standby[:, j] = 1.0 if p.standby == 0 else 0.0
            c = _Cand.concat([c, extra])
        s.run(c)


def _continuous_bounds(ev: _Evaluator) -> tuple[np.ndarray, np.ndarray, list[tuple[str, int]]]:
    """Flat vector of continuous levers: (lower, upper, names)."""
    cfg, prob = ev.cfg, ev.prob
    lo: list[float] = []
    hi: list[float] = []
    names: list[tuple[str, int]] = []
    group_first = {}
    for j, p in enumerate(prob.pools):
        if p.frozen or p.levers_fixed:
            continue
        top_pw = cfg.prefix_weight_range[1] if p.max_prefix_weight is None else min(cfg.prefix_weight_range[1],
                                                                                 p.max_prefix_weight)
        lo.append(cfg.prefix_weight_range[0])
        hi.append(max(top_pw, cfg.prefix_weight_range[0]))
        names.append(("pw", j))
        top_cap = float(p.max_num_seqs)
        if p.max_inflight_cap:
            top_cap = min(top_cap, float(p.max_inflight_cap))
        lo.append(float(min(cfg.min_inflight_cap, top_cap)))
        hi.append(top_cap)
        names.append(("cap", j))
        key = (p.group, p.role == "decode")
        group_first.setdefault(key, []).append(j)
    for members in group_first.values():
        if len(members) > 1:
            for j in members:
                lo.append(0.0)
                hi.append(1.0)
                names.append(("tw", j))
    if prob.classes:
        lo.append(0.0)
        hi.append(float(len(prob.classes)))
        names.append(("delay", 0))
    return np.array(lo), np.array(hi), names


def delay_ladder(level: np.ndarray, classes: Sequence[ClassInput]) -> np.ndarray:
    """Shed fractions (…, K) from a delay level on the lever ladder (classes most protected first):
    level 0..1 sheds the least protected class, 1..2 the next one (the first staying fully shed),
    and so on; the breaker's floors and each class's ceiling still apply.
    Example with (critical, standard, sheddable): 0.5 → (0, 0, 0.5); 1.3 → (0, 0.3, 1); 2.0 → (0, 1, 1)."""
    level = np.asarray(level, dtype=float)
    K = len(classes)
    out = np.empty(level.shape + (K,))
    for k in range(K):
        rank = K - 1 - k  # 0 for the least protected class
        out[..., k] = np.clip(level - rank, 0.0, 1.0)
    floor = np.array([c.min_shed for c in classes])
    ceil = np.array([max(c.max_shed, c.min_shed) for c in classes])
    return np.minimum(np.maximum(out, floor), ceil)


def ladder_level(shed: np.ndarray) -> float:
    """The delay level of shed fractions (inverse of delay_ladder, for the lever order's shape)."""
    K = len(shed)
    return float(sum(min(max(float(shed[k]), 0.0), 1.0) for k in range(K)))


def _lever_order(shed: np.ndarray) -> np.ndarray:
    """Delay in the order the issue fixes: a class is never shed more than any less protected one
    (classes are ordered most protected first): sheddable ≥ standard ≥ critical.
    Example: (0.2, 0.5, 0.1) → (0.2, 0.5, 0.5)."""
    return np.maximum.accumulate(shed, axis=1)


def _apply_vec(base: _Cand, X: np.ndarray, names: list[tuple[str, int]], classes: Sequence[ClassInput]) -> _Cand:
    c = base.tile(X.shape[0])
    c.pw, c.cap, c.tw, c.shed = c.pw.copy(), c.cap.copy(), c.tw.copy(), c.shed.copy()
    for col, (kind, j) in enumerate(names):
        if kind == "pw":
            c.pw[:, j] = X[:, col]
        elif kind == "cap":
            c.cap[:, j] = np.round(X[:, col])
        elif kind == "tw":
            c.tw[:, j] = X[:, col]
        else:
            c.shed = delay_ladder(X[:, col], classes)
    c.shed = _lever_order(c.shed)
    return c


def _to_vec(c: _Cand, names: list[tuple[str, int]]) -> np.ndarray:
    out = np.empty(len(names))
    for col, (kind, j) in enumerate(names):
        out[col] = ladder_level(c.shed[0]) if kind == "delay" else {"pw": c.pw, "cap": c.cap, "tw": c.tw}[kind][0, j]
    return out


def _cross_entropy(s: _Search) -> None:
    ev, cfg, rng = s.ev, s.cfg, s.rng
    lo, hi, names = _continuous_bounds(ev)
    if not names:
        return
    span = np.maximum(hi - lo, 1e-9)
    assert s.best is not None
    mean = np.clip(_to_vec(s.best, names), lo, hi)
    std = 0.35 * span
    n = cfg.ce_population
    n_elite = max(2, int(round(cfg.ce_elite_frac * n)))
    for _ in range(cfg.ce_iterations):
        if s.left() <= 0:
            return
        base = s.best
        X = mean[None] + std[None] * rng.standard_normal((n, len(names)))
        # structured probes: each lever alone at its bounds (the quadrant moves a human would try)
        X = np.clip(X, lo, hi)
        X[0] = mean
        J = s.run(_apply_vec(base, X, names, ev.prob.classes))
        order = np.argsort(J, kind="stable")[:n_elite]
        elite = X[order]
        if not np.isfinite(J[order]).all():
            break
        mean = elite.mean(axis=0)
        std = np.maximum(elite.std(axis=0), 0.02 * span)
    # coordinate probes from the best: each lever at its bounds and middle
    if s.left() > 0 and s.best is not None:
        b = _to_vec(s.best, names)
        probes = []
        for col, (kind, _) in enumerate(names):
            for v in (lo[col], hi[col], 0.5 * (lo[col] + hi[col])):
                x = b.copy()
                x[col] = v
                probes.append(x)
        s.run(_apply_vec(s.best, np.array(probes), names, ev.prob.classes))


def _delay_sweep(s: _Search) -> None:
    """Structured enumeration of the share and delay levers together: the delay ladder at quarter
    steps × a few in-flight caps applied to every pool (none, 128 … 32 per replica), on the best
    plan. Capping the batch (share) and queueing/shedding (delay) substitute for each other under
    pressure, so they are searched jointly; the cross-entropy step then refines per pool."""
    if s.best is None or s.left() <= 0 or not s.ev.prob.classes:
        return
    levels = np.arange(0.0, len(s.ev.prob.classes) + 1e-9, 0.25)
    caps = [None, 128.0, 96.0, 64.0, 48.0, 32.0]
    parts = []
    for cap in caps:
        c = s.best.tile(len(levels))
        c.shed = _lever_order(delay_ladder(levels, s.ev.prob.classes))
        if cap is not None:
            c.cap = c.cap.copy()
            for j, p in enumerate(s.ev.prob.pools):
                if p.frozen or p.levers_fixed:
                    continue
                top = float(p.max_inflight_cap) if p.max_inflight_cap else float(p.max_num_seqs)
                c.cap[:, j] = min(cap, top)
        parts.append(c)
    s.run(_Cand.concat(parts))


def _batch_caps(s: _Search, needs: list[np.ndarray] | None = None) -> None:
    """The slow lever: engine batch caps, tried on the best plan; adopted only for a clear gain
    (`batch_cap_gain`), since each change is a rolling restart and the model is not exact.
    Once a pool's caps change, its replicas are swept again under them: the replicas the best
    plan bought under the old caps are not what the new caps need (on mooncake-conv 2,048 →
    1,024 tokens came with 5 → 8 replicas in one plan, where 4 served the next tick)."""
    ev = s.ev
    for j, p in enumerate(ev.prob.pools):
        if not p.batch_review or p.frozen or s.left() <= 0 or s.best is None:
            continue
        opts = [o for o in s.cfg.batch_token_options if o >= p.max_num_seqs and o != p.max_num_batched_tokens]
        if not opts:
            continue
        c = s.best.tile(len(opts))
        c.mbt = c.mbt.copy()
        c.mbt[:, j] = np.array(opts, dtype=float)
        J, _ = ev.score(c)
        k = int(np.argmin(J))
        if J[k] < s.best_J * (1.0 - s.cfg.batch_cap_gain):
            s.best_J = float(J[k])
            s.best = c.take(np.array([k]))
            if needs is not None:  # a few dozen rows for one pool: not budgeted, like _settle
                tpl = _templates(ev, s.best, j, needs[j], s.cfg.replica_span)
                c2 = s.best.tile(len(tpl))
                c2.repl = c2.repl.copy()
                c2.repl[:, j, :] = tpl
                J2, _ = ev.score(c2)
                k2 = int(np.argmin(J2))
                if J2[k2] < s.best_J:
                    s.best_J, s.best = float(J2[k2]), c2.take(np.array([k2]))


def _settle(s: _Search, tolerance: float = 0.003) -> None:
    """Put back every lever whose change does not pay: each continuous lever of the best plan is
    reset to the value in force (shedding: to what is in force, or to none) if that alone costs
    less than `tolerance` of the objective; the accepted resets are then checked together (one
    batch of single resets + one row for their combination). Levers thus move only when they
    matter, and the explanation names only levers pulled for a reason. Not budgeted (a few rows)."""
    ev = s.ev
    if s.best is None:
        return
    cur, best = ev.cur, s.best
    trials: list[_Cand] = []
    for j, p in enumerate(ev.prob.pools):
        if p.frozen:
            continue
        for field_ in ("pw", "cap", "tw", "standby"):
            b = float(getattr(cur, field_)[0, j])
            if field_ == "cap" and p.max_inflight_cap:
                b = min(b, float(p.max_inflight_cap))
            if field_ == "pw" and p.max_prefix_weight is not None:
                b = min(b, float(p.max_prefix_weight))
            if getattr(best, field_)[0, j] == b:
                continue
            c = best.tile(1)
            arr = getattr(c, field_).copy()
            arr[0, j] = b
            setattr(c, field_, arr)
            trials.append(c)
    lo = np.array([c.min_shed for c in ev.prob.classes])
    hi = np.array([max(c.max_shed, c.min_shed) for c in ev.prob.classes])
    for back in (_lever_order(np.clip(cur.shed, lo, hi)), _lever_order(lo[None, :].copy())):
        if not np.allclose(back, best.shed):
            c = best.tile(1)
            c.shed = back.copy()
            trials.append(c)
    if not trials:
        return
    J, _ = ev.score(_Cand.concat(trials))
    ok = [t for t, v in zip(trials, J) if v <= s.best_J * (1.0 + tolerance)]
    if not ok:
        return
    combo = best.tile(1)
    for t in ok:  # merge every accepted reset into one plan
        for field_ in ("pw", "cap", "tw", "standby", "shed"):
            diff = getattr(t, field_) != getattr(best, field_)
            arr = getattr(combo, field_).copy()
            arr[diff] = getattr(t, field_)[diff]
            setattr(combo, field_, arr)
    combo.shed = _lever_order(combo.shed)
    Jc, _ = ev.score(combo)
    if Jc[0] <= s.best_J * (1.0 + tolerance):
        s.best, s.best_J = combo, min(float(Jc[0]), s.best_J)
    else:
        k = int(np.argmin(J))
        if J[k] <= s.best_J * (1.0 + tolerance):
            s.best, s.best_J = trials[k], min(float(J[k]), s.best_J)


def _to_plan(ev: _Evaluator, c: _Cand) -> Plan:
    ready, _, _ = ev.dynamics(c.repl, c.standby)
    pools = {}
    for j, p in enumerate(ev.prob.pools):
        cap = int(round(c.cap[0, j]))
        pools[p.name] = PoolPlan(
            replicas=tuple(int(x) for x in c.repl[0, j]), standby=int(c.standby[0, j]),
            prefix_weight=float(round(c.pw[0, j], 3)), inflight_cap=0 if cap >= p.max_num_seqs else cap,
            traffic_weight=(float(round(c.tw[0, j] * max(float(ready[0, j, 0]), 1.0), 4)) if ev.hop_size[j] > 1
                            else p.traffic_weight),
            max_num_seqs=int(c.mns[0, j]),
            max_num_batched_tokens=int(c.mbt[0, j]))
    active = bool(ev.shed_active(ready)[0, 0])
    shed = {cl.name: float(round(min(max(c.shed[0, k] if active else cl.min_shed, 0.0), 1.0), 4))
            for k, cl in enumerate(ev.prob.classes)}
    return Plan(pools=pools, shed=shed)


def _from_plan(ev: _Evaluator, plan: Plan, shift: int) -> _Cand | None:
    """A previous plan as a candidate, shifted `shift` steps forward (its tail repeats its last step)."""
    c = ev.cur.tile(1)
    for j, p in enumerate(ev.prob.pools):
        pp = plan.pools.get(p.name)
        if pp is None or len(pp.replicas) == 0:
            return None
        r = list(pp.replicas[shift:]) or [pp.replicas[-1]]
        r = (r + [r[-1]] * ev.H)[: ev.H]
        c.repl[0, j] = np.clip(r, p.lo, p.hi)
        if p.frozen:
            continue
        c.standby[0, j] = pp.standby
        if not p.levers_fixed:
            c.pw[0, j] = min(pp.prefix_weight, p.max_prefix_weight) if p.max_prefix_weight is not None else pp.prefix_weight
            cap = float(pp.inflight_cap if pp.inflight_cap > 0 else p.max_num_seqs)
            c.cap[0, j] = min(cap, float(p.max_inflight_cap)) if p.max_inflight_cap else cap
            c.tw[0, j] = pp.traffic_weight / ev.ready_step0[j]
    for k, cl in enumerate(ev.prob.classes):
        c.shed[0, k] = min(max(plan.shed.get(cl.name, 0.0), cl.min_shed), cl.max_shed)
    return c


def solve(problem: PlanProblem, model: PlanModel, config: MpcConfig, rng: np.random.Generator, *,
          warm: Plan | None = None, warm_shift: int = 0, timer: Timer | None = None) -> PlanResult:
    """Find the best plan within the budget (see the module docstring). Never returns nothing:
    the plan in force (clipped to the bounds) is always scored first."""
    ev = _Evaluator(problem, model, config)
    s = _Search(ev, config, rng, timer)
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
    J0 = ev.score(_Cand.concat(starts))[0]
    incumbent_J = float(J0[0])
    k = int(np.argmin(J0))
    s.best, s.best_J = _Cand.concat(starts).take(np.array([k])), float(J0[k])
    # replica sweeps, levers, replica sweep again, batch caps
    order = sorted(range(len(problem.pools)), key=lambda j: -problem.pools[j].usd_per_hour)
    needs = [_need_per_step(ev, s.best, j) for j in range(len(problem.pools))]
    ev.need = np.array(needs, dtype=float)
    s.best_J = float(ev.score(s.best)[0][0])  # rescore: shedding now releases once capacity is ready
    _delay_sweep(s)
    _sweep_replicas(s, needs, order)
    _delay_sweep(s)
    _cross_entropy(s)
    _sweep_replicas(s, needs, order)
    _delay_sweep(s)
    _batch_caps(s, needs)
    _settle(s)
    assert s.best is not None
    J, info = ev.score(s.best, detail=True)
    assert info is not None
    plan = _to_plan(ev, s.best)
    terms = _terms(ev, info, needs)
    return PlanResult(plan=plan, objective=float(J[0]), terms=terms, evaluations=ev.evaluations,
                      budget_exhausted=s.exhausted, incumbent_objective=incumbent_J)


def _terms(ev: _Evaluator, info: Mapping[str, Any], needs: list[np.ndarray]) -> dict[str, Any]:
    prob = ev.prob
    cls = [c.name for c in prob.classes]
    pools = {}
    for j, p in enumerate(prob.pools):
        pools[p.name] = {
            "ready_by_step": [round(float(x), 2) for x in info["ready"][0, j]],
            "need_by_step_p90": [int(x) for x in needs[j]],
            "utilisation_p90": [round(float(x), 3) for x in info["utilisation"][0, 1, :, j]],
            "ttft_p95_s_p90": [round(float(x), 3) for x in info["ttft_p95"][0, 1, :, j]],
            "tpot_p95_s_p90": [round(float(x), 4) for x in info["tpot_p95"][0, 1, :, j]],
            "hit_rate": [round(float(x), 3) for x in info["hit"][0, 0, :, j]],
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
        "risk_term": float(info["risk_term"][0]),
        "pools": pools,
    }
