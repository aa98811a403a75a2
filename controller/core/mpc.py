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
evaluated candidate × pool rows (`max_evaluations`; see MpcConfig), or wall time through an
injected monotonic `timer`, counted from the tick's start (the core reads no clock itself).

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
    # Budget without a timer: candidate plans × pools scored per tick. 4,000 was set at ≈ 200 ms of CPU
    # on one core for 10 pools (400 plans) on the machine of the first measurements; the same plans
    # later took ≈ 90 ms there and take ≈ 230 ms on a 2-core AVX2 EPYC (`governor bench planner`,
    # docs/BENCHMARKS.md). For 10 pools that is about 40 % of the whole search; a single pool gets
    # 4,000 plans, far more than its search needs.
    max_evaluations: int = 4000
    # With a timer: the whole tick (from `started_s`, see solve) ends within time_budget_s. A batch
    # is cut to the candidates that fit at what batches have cost so far (`_BatchCost`); the search
    # leaves room for `_settle`'s rows at that cost, and time_reserve_s for what follows the solver
    # (the chosen plan scored in detail, its terms, the policy's decision and reasons: 7-10 ms of a
    # 10-pool tick on a 2-core AVX2 EPYC).
    time_budget_s: float = 0.2
    time_reserve_s: float = 0.015
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
        if not (isinstance(self.time_reserve_s, (int, float)) and 0 <= self.time_reserve_s < self.time_budget_s):
            raise ValueError(f"mpc.time_reserve_s must be >= 0 and below time_budget_s = {self.time_budget_s!r} "
                             f"(got {self.time_reserve_s!r})")
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


def serving_first_step(p: PoolInput, step_s: float) -> int:
    """Replicas of a pool serving in a plan's first step: ready now, plus the starting ones due
    within half a step (the planner puts a start in the step its ETA rounds to)."""
    return p.ready + sum(1 for eta in p.starting_eta_s if eta <= 0.5 * step_s)


def applied_router_weights(problem: PlanProblem, plan: Plan, applied: Mapping[str, int],
                           step_s: float) -> dict[str, float]:
    """The plan's router weights for the replica targets actually applied, as shares of each hop.

    The planner sets a pool's router weight to its weight per replica × the replicas its plan
    serves in the first step. When the policy applies another target (a scale-down held by
    stabilisation, a guard), those replicas serve too, and the next plan reads the weight per
    replica back by dividing by them: left as planned, a held pool's weight shrank each tick
    (the demo's A100 pool, planned at 1 replica and held at 2, went 0.30 → 0.00 of the traffic
    in eight ticks while both its replicas were paid for). So the weight is scaled by serving
    (applied) / serving (planned) and the hop renormalised. Serving = the target, at most the
    replicas ready or due within half a step, at least 1. Pools alone on their hop keep theirs.
    Example: A100 planned 1, applied 2 (2 ready), H100 5 → A100's weight doubles before renormalising.
    """
    due = {p.name: serving_first_step(p, step_s) for p in problem.pools}
    hops: dict[tuple[str, bool], list[PoolInput]] = {}
    for p in problem.pools:
        hops.setdefault((p.group, p.role == "decode"), []).append(p)
    out = {name: pp.traffic_weight for name, pp in plan.pools.items()}
    for members in hops.values():
        if len(members) < 2:
            continue
        w = {}
        for p in members:
            planned = max(min(plan.pools[p.name].replicas[0], due[p.name]), 1)
            served = max(min(applied.get(p.name, plan.pools[p.name].replicas[0]), due[p.name]), 1)
            w[p.name] = max(plan.pools[p.name].traffic_weight, 0.0) * served / planned
        tot = sum(w.values())
        for name, x in w.items():
            out[name] = round(x / tot, 4) if tot > 0 else round(1.0 / len(w), 4)
    return out


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
    # (the same operations as the formula reads, done in place on scratch arrays: the planner
    # scores this twice per batch on ~60k rows, where allocation costs as much as arithmetic)
    if min(np.ndim(p50), np.ndim(p95)) == 0:  # a scalar: no scratch arrays to reuse
        return _lognormal_exceed_ref(p50, p95, bound, tail_sigma)
    m = np.maximum(p50, 1e-6)
    sigma = np.maximum(p95, m * 1.0001)
    sigma /= m
    np.log(sigma, out=sigma)
    sigma /= 1.6449
    np.maximum(sigma, 0.05, out=sigma)  # σ = max(ln(max(p95, 1.0001 p50) / p50) / 1.6449, 0.05)
    z = np.divide(np.maximum(bound, 1e-9), m)
    np.log(z, out=z)
    in_place = z.shape == np.broadcast_shapes(z.shape, sigma.shape)
    z = np.divide(z, sigma, out=z if in_place else None)  # z = ln(bound / p50) / σ
    if tail_sigma is not None and float(sigma.max(initial=0.0)) > tail_sigma:
        # beyond the p95 (z > 1.6449) stretch z by σ / σ_tail where the fit is wider than the tail:
        # z = 1.6449 + ln(bound / p95) / σ_tail, written on the fitted z (no second log). Only when
        # some row needs it: the planner scores this twice per batch (~0.5 ms each on 58k rows).
        stretch = sigma * (1.0 / tail_sigma)
        stretch -= 1.0
        np.maximum(stretch, 0.0, out=stretch)
        over = z - 1.6449
        np.maximum(over, 0.0, out=over)
        over *= stretch
        z += over
    return _upper_tail(z)


# |z| beyond which 1 − Φ(z) is exactly 0 (z > 0) or exactly 1 (z < 0) in double precision: Φ(9)
# misses 1 by 1e-19, under half an ulp of 1 (checked on a grid of z from 9 to 1e300, and ±inf).
_TAIL_SATURATED_Z = 9.0


def _upper_tail(z: np.ndarray) -> np.ndarray:
    """1 − Φ(z), overwriting z (an array). ndtr costs ~13 ns a value, several times any other step
    of the score, and about half the planner's z lie beyond ±9 (a class far inside or far past its
    SLO), where the answer is exactly 0 or 1: those are set directly, the same values ndtr gives."""
    sat = np.abs(z) > _TAIL_SATURATED_Z  # NaN is not saturated: it goes through ndtr and stays NaN
    n_sat = int(np.count_nonzero(sat))
    if n_sat < z.size // 8:  # few saturated: masking would cost more than it saves
        out = ndtr(z, out=z)
        return np.subtract(1.0, out, out=out)
    mid = ~sat
    zm = z[mid]
    low = z < 0.0
    z[...] = 0.0
    z[low] = 1.0
    z[mid] = 1.0 - ndtr(zm)
    return z


def _lognormal_exceed_ref(p50: np.ndarray, p95: np.ndarray, bound: np.ndarray,
                          tail_sigma: float | None = None) -> np.ndarray:
    """_lognormal_exceed as the formula reads, without scratch arrays (scalars; the test's reference)."""
    m = np.maximum(p50, 1e-6)
    sigma = np.maximum(np.log(np.maximum(p95, m * 1.0001) / m) / 1.6449, 0.05)
    z = np.log(np.maximum(bound, 1e-9) / m) / sigma
    if tail_sigma is not None and float(np.max(sigma, initial=0.0)) > tail_sigma:
        z = z + np.maximum(z - 1.6449, 0.0) * np.maximum(sigma * (1.0 / tail_sigma) - 1.0, 0.0)
    return 1.0 - ndtr(z)


def _lognormal_exceed_into(p50: np.ndarray, p95: np.ndarray, bound: np.ndarray, tail_sigma: float, *,
                           z: np.ndarray, scratch: np.ndarray, own: bool = False) -> np.ndarray:
    """_lognormal_exceed written into `z` (an array of the broadcast shape), with `scratch` (same
    shape) for temporaries; with `own`, p50 and p95 are of that shape too and may be overwritten
    (z may then be p50). The same operations in the same order, so the same values."""
    if own:
        m = np.maximum(p50, 1e-6, out=p50)
        sigma = np.maximum(p95, np.multiply(m, 1.0001, out=scratch), out=p95)
    else:
        m = np.maximum(p50, 1e-6)
        sigma = np.maximum(p95, m * 1.0001)
    sigma /= m
    np.log(sigma, out=sigma)
    sigma /= 1.6449
    np.maximum(sigma, 0.05, out=sigma)
    np.divide(np.maximum(bound, 1e-9), m, out=z)
    np.log(z, out=z)
    z /= sigma
    if float(sigma.max(initial=0.0)) > tail_sigma:  # see _lognormal_exceed
        stretch = np.multiply(sigma, 1.0 / tail_sigma, out=sigma if own else None)
        stretch -= 1.0
        np.maximum(stretch, 0.0, out=stretch)
        over = np.subtract(z, 1.6449, out=scratch)
        np.maximum(over, 0.0, out=over)
        over *= stretch
        z += over
    return _upper_tail(z)


def _sum_pools(x: np.ndarray) -> np.ndarray:
    """Σ over the pool axis of (K, …, P) rows, in the order numpy sums the pool axis of the same
    rows laid out (…, P, K): one pool after another for K ≥ 2 (the pool axis is not the inner
    one there), numpy's own pairwise sum for K = 1 (the two layouts coincide in memory). So the
    planner's figures do not depend on the layout it computes in (floating-point sums do depend
    on their order)."""
    K, P = x.shape[0], x.shape[-1]
    if K == 1 or P == 0:
        return np.moveaxis(np.moveaxis(x, 0, -1).sum(axis=-2), -1, 0)
    out = x[..., 0].copy()
    for j in range(1, P):
        out += x[..., j]
    return out


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
        self.ready_step0 = np.maximum(np.array([serving_first_step(p, dt) for p in pools], dtype=float), 1.0)
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
        # route-group × hop masks of `shares` (the groups with pools on that hop)
        self.hop_masks = [(g, m) for g in range(len(groups)) for hop in (self.first_hop, self.decode_hop)
                          for m in [(gidx == g) & hop] if m.any()]
        self.cpr_min = self._cheapest_cost_per_request()
        self.cur = self._current_cand()
        # each pool's share of its hop's traffic under the weights in force (what a lever change moves)
        self.share_now = self.shares(self.cur.tw * self.ready_step0)[0]
        self.evaluations = 0
        self._scratch: dict[str, np.ndarray] = {}  # reused work arrays of `score` (see _buf)
        self.need: np.ndarray | None = None  # (P, H) replicas each step's p90 load needs (set by solve)
        # Per-tick constants of `score` (hoisted: they do not depend on the candidate).
        self.floor = np.array([c.min_shed for c in cls])
        self.prefill_pool = np.array([r == "prefill" for r in roles])
        self.ready_int = np.array([p.ready for p in pools])
        self.cols = np.arange(P)
        t_mid = (np.arange(H) + 0.5) * dt
        self.relax = np.exp(-t_mid / cfg.cache_refill_s)[None, None, :, None]
        self.q0_cum = np.cumsum(self.q0, axis=1)
        self.slo_ttft_k = self.slo_ttft.reshape(K, 1, 1, 1, 1)  # per class, against (K,C,2,H,P) rows
        self.slo_tpot_k = self.slo_tpot.reshape(K, 1, 1, 1, 1)
        self.req = (self.lam * self.step_weight[None, :, None]).sum(axis=1) * dt  # (2,K) requests offered
        self.group_masks = [gidx == g for g in range(len(groups))]

    def _buf(self, key: str, shape: tuple[int, ...]) -> np.ndarray:
        """A work array of `shape` (contents undefined), reused from one `score` call to the next.
        The large per-class arrays are ~0.5 MB; fresh ones cost page faults (~17 % of a tick),
        reused ones do not. Nothing `score` returns may be one of these."""
        n = math.prod(shape)
        flat = self._scratch.get(key)
        if flat is None or flat.size < n:
            flat = np.empty(n)
            self._scratch[key] = flat
        return flat[:n].reshape(shape)

    # -- the plan in force, as a candidate

    def _cheapest_cost_per_request(self) -> float:
        """USD per request of the pool that serves one cheapest: price / (3,600 × the rate one replica
        sustains at its concurrency limit, at today's mix, hit rate and batch caps). Example: $4.10
        an hour and 6 req/s → $0.00019. 0 when no pool has a price and a capacity."""
        P = self.P
        if P == 0:
            return 0.0
        pools = self.prob.pools
        lat = self.model.latency(LatencyQuery(
            pool_index=self.idx, rps_per_replica=np.full(P, 0.01), prompt_tokens=self.P_tok, output_tokens=self.O_tok,
            hit_rate=self.hit0, inflight_cap=np.zeros(P),
            max_num_seqs=np.array([float(p.max_num_seqs) for p in pools]),
            max_num_batched_tokens=np.array([float(p.max_num_batched_tokens) for p in pools])))
        cap = np.asarray(lat.capacity_rps, dtype=float)
        ok = (cap > 0) & np.isfinite(cap) & (self.price > 0)
        return float((self.price[ok] / 3600.0 / cap[ok]).min()) if ok.any() else 0.0

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
            tw=self.per_replica_weights(np.array([[p.traffic_weight for p in pools]])),
            mbt=np.array([[p.max_num_batched_tokens for p in pools]], dtype=float),
            mns=np.array([[p.max_num_seqs for p in pools]], dtype=float),
            shed=np.array([[c.shed_now for c in self.prob.classes]]))

    def per_replica_weights(self, absolute: np.ndarray) -> np.ndarray:
        """(C, P) router weights → the search's weights per serving replica, the largest of each hop 1.

        Only the ratios within a hop route traffic; fixing the scale keeps the search box [0, 1]
        meaningful and a plan's weights from drifting towards 0 tick after tick (the router
        splits evenly when a hop's weights are all 0). Example: A100 0.06 on 2 replicas, H100
        0.94 on 5 → 0.16 and 1.0 per replica."""
        out = np.maximum(absolute, 0.0) / self.ready_step0[None, :]
        for _, m in self.hop_masks:
            if m.sum() > 1:
                top = out[:, m].max(axis=1, keepdims=True)
                out[:, m] = np.where(top > 0, out[:, m] / np.maximum(top, 1e-12), 1.0)
        return out

    # -- replica dynamics

    def dynamics(self, repl: np.ndarray, standby: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ready during each step, billed replicas per step, share of ready replicas started in the plan)."""
        C, P, H = repl.shape
        if C == 1:
            return self._dynamics(repl, standby, self.cols)
        # Pools are simulated independently, and a batch mostly varies one pool's replicas (a
        # replica sweep) or none (lever sweeps, cross-entropy): a pool whose replica plan is the
        # same in every candidate is simulated once, as one row, and copied.
        same = (repl == repl[:1]).all(axis=(0, 2)) & (standby == standby[:1]).all(axis=0)
        if not same.any():
            return self._dynamics(repl, standby, self.cols)
        const, var = np.flatnonzero(same), np.flatnonzero(~same)
        nc, nv = len(const), len(var)
        units = np.concatenate([const, np.tile(var, C)])
        u_repl = np.concatenate([repl[0, const], repl[:, var].reshape(C * nv, H)])[None]
        u_standby = np.concatenate([standby[0, const], standby[:, var].reshape(C * nv)])[None]
        outs = []
        for x in self._dynamics(u_repl, u_standby, units):
            full = np.empty((C, P, H))
            full[:, const] = x[0, :nc][None]
            full[:, var] = x[0, nc:].reshape(C, nv, H)
            outs.append(full)
        return outs[0], outs[1], outs[2]

    def _dynamics(self, repl: np.ndarray, standby: np.ndarray,
                  pool: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`dynamics` of (C, N, H) replica plans; column n is a plan of pool `pool[n]`."""
        # Replica counts are whole numbers (targets, slots and start-ups are counts), so the sums
        # below are exact in floating point whatever their order: the running total of starting
        # replicas (`pend_tot`) equals a fresh sum over the ready-time bins.
        C, P, H = repl.shape
        ready = np.broadcast_to(self.ready0[pool], (C, P)).copy()
        pend = np.broadcast_to(self.pend0[pool], (C, P, H + 1)).copy()
        pend_tot = pend.sum(axis=2)
        warm = np.broadcast_to(self.warm0[pool], (C, P)).copy() + standby
        bin_warm, bin_cold = self.bin_warm[pool], self.bin_cold[pool]
        new_ready = np.zeros((C, P))
        new_pend = np.zeros((C, P, H + 1))
        ready_mid = np.empty((C, P, H))
        billed = np.empty((C, P, H))
        fresh_n = np.zeros((C, P, H))
        cols = np.arange(P)
        started = False  # any replica ordered in the plan yet (until then new_ready/new_pend stay 0)
        # (bins before the current step are never read again, so they are not cleared)
        for h in range(H):
            if h > 0:  # replicas whose ready time passed before this step starts
                landed = pend[:, :, h - 1]
                ready += landed
                pend_tot -= landed
                if started:
                    new_ready += new_pend[:, :, h - 1]
            serving = ready + pend_tot
            gap = repl[:, :, h] - serving  # target − serving: > 0 orders replicas, < 0 removes them
            if gap.max() > 0.0:
                add = np.maximum(gap, 0.0)
                n_w = np.minimum(add, warm)
                warm -= n_w
                n_c = add - n_w
                bw = np.minimum(h + bin_warm, H)
                bc = np.minimum(h + bin_cold, H)
                pend[:, cols, bw] += n_w  # one bin per pool: no repeated index within a statement
                pend[:, cols, bc] += n_c
                new_pend[:, cols, bw] += n_w
                new_pend[:, cols, bc] += n_c
                pend_tot += add
                started = True
            if gap.min() < 0.0:
                cut = np.maximum(-gap, 0.0)  # serving − target (negation is exact)
                # starting replicas go first, the latest first: bin b gives min(its count, what
                # the later bins did not cover); later = Σ of the bins after b
                seg = pend[:, :, h:]
                later = np.cumsum(seg[:, :, ::-1], axis=2)[:, :, ::-1] - seg
                take = np.minimum(seg, np.maximum(cut[:, :, None] - later, 0.0))
                seg -= take
                if started:
                    new_pend[:, :, h:] -= np.minimum(new_pend[:, :, h:], take)
                taken = take.sum(axis=2)
                pend_tot -= taken
                cut = cut - taken
                drained = np.minimum(cut, ready)
                ready -= drained
                new_ready = np.minimum(new_ready, ready)
                warm += drained  # a drained replica leaves its weights on the node
            ready_mid[:, :, h] = ready + pend[:, :, h]
            if started:
                fresh_n[:, :, h] = new_ready + new_pend[:, :, h]
            billed[:, :, h] = ready + pend_tot
        fresh = fresh_n / np.maximum(ready_mid, 1e-9)
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
        for m in self.group_masks:
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
        for g, m in self.hop_masks:
            sub = tw[:, m]
            tot = sub.sum(axis=1, keepdims=True)
            split = sub / np.maximum(tot, 1e-12)
            if not (tot > 0).all():
                split = np.where(tot > 0, split, 1.0 / m.sum())
            share[:, m] = split * self.gshare[g]
        return share.reshape(lead + (self.P,))

    # -- scoring

    def score(self, cand: _Cand, detail: bool = False) -> tuple[np.ndarray, dict[str, Any] | None]:
        cfg, prob = self.cfg, self.prob
        C, P, H, K = cand.n, self.P, self.H, self.K
        dt = self.dt
        self.evaluations += C
        ready, billed, fresh = self.dynamics(cand.repl, cand.standby)
        ready_hp = np.transpose(ready, (0, 2, 1))  # (C,H,P)
        eff = cand.tw[:, None, :] * np.maximum(ready_hp, 1e-3)  # (C,H,P)
        share = self.shares(eff)  # (C,H,P)
        active = self.shed_active(ready)  # (C,H): shedding holds until the capacity the load needs is ready
        floor = self.floor
        shed = np.where(active[:, :, None], np.clip(cand.shed, 0.0, 1.0)[:, None, :], floor[None, None, :])
        rejected = shed ** (1 + cfg.client_retries)  # (C,H,K)
        adm = self.lam[None] * (1.0 - rejected)[:, None, :, :]  # (C,2,H,K)
        # Per pool and class, the class axis leads: (K,C,2,H,P). The per-pool arrays (C,2,H,P) then
        # broadcast over whole contiguous blocks instead of an inner axis of K = 3 elements, which
        # numpy runs several times slower; every element is computed as before.
        kshape = (K, C, 2, H, P)
        pool_k = np.multiply(share[None, :, None, :, :], np.moveaxis(adm, 3, 0)[..., None],
                             out=self._buf("a", kshape))  # (K,C,2,H,P)
        # Fluid backlog per pool, served in priority order (cumulative over classes); the last
        # cumulative row is the pool's total (the same left-to-right sum as summing pool_k over K).
        cum_in = np.cumsum(pool_k, axis=0, out=pool_k)  # (K,C,2,H,P)
        pool_rps = cum_in[-1].copy()  # (C,2,H,P)
        ready_t = ready_hp[:, None]  # (C,1,H,P)
        fresh_t = np.transpose(fresh, (0, 2, 1))[:, None]
        lam_rep = pool_rps / np.maximum(ready_t, 1e-9)
        # Hit rate: steady state at the plan's affinity and replicas, approached from today's. It
        # does not depend on the load scenario, so it is computed once for both (C,1,H,P).
        hit_ss = self.model.hit_rate(self.idx, ready_t, cand.pw[:, None, None, :], self.load_w, self.inf_hit,
                                     self.ws, np.zeros(P))
        relax = self.relax
        # a batch-cap change is a rolling restart: every replica comes back with an empty cache, so
        # the hit rate refills from zero (on mooncake-conv, 2,048 → 1,024 tokens took it from 0.43
        # to 0.05, and the change lost money the restart's GPU cost alone did not show)
        restart = (cand.mbt != self.cur.mbt) | (cand.mns != self.cur.mns)  # (C,P)
        if restart.any():
            hit_from = np.where(restart, 0.0, self.hit0[None, :])[:, None, None, :]
            hit = hit_ss + (hit_from - hit_ss) * relax
        else:
            hit = hit_ss + (self.hit0 - hit_ss) * relax
        hit = hit * (1.0 - fresh_t * relax * 0.5)  # new replicas start cold (same time constant)
        shape = lam_rep.shape
        # per-pool constants as (P,), levers as (C,1,1,P): the model broadcasts (see LatencyQuery)
        q = LatencyQuery(
            pool_index=self.idx, rps_per_replica=lam_rep, prompt_tokens=self.P_tok, output_tokens=self.O_tok,
            hit_rate=hit, inflight_cap=cand.cap[:, None, None, :], max_num_seqs=cand.mns[:, None, None, :],
            max_num_batched_tokens=cand.mbt[:, None, None, :])
        lat = self.model.latency(q)
        cap_rps = np.reshape(lat.capacity_rps, shape) * ready_t  # pool rps it sustains
        ttft50, ttft95 = np.reshape(lat.ttft_p50_s, shape), np.reshape(lat.ttft_p95_s, shape)
        tpot50, tpot95 = np.reshape(lat.tpot_p50_s, shape), np.reshape(lat.tpot_p95_s, shape)
        # Backlog per step: q_h+1 = max(q_h + (in_h − m_h)·dt, 0), waited ½(q_h + q_h+1) / max(m_h, 1e-9).
        # Only the max is sequential: the increments before the loop, the waits after it, over all steps.
        m_all = np.maximum(cap_rps, 1e-9)
        wait = np.subtract(cum_in, cap_rps, out=self._buf("b", kshape))
        wait *= dt  # the increments (in − m)·dt, then the waits in place
        qs = self._buf("d", (K, C, 2, H + 1, P))  # backlog at each step's start, and after the last
        qs[:, :, :, 0, :] = self.q0_cum.T[:, None, None, :]
        for h in range(H):
            q_next = qs[:, :, :, h + 1, :]
            np.add(qs[:, :, :, h, :], wait[:, :, :, h, :], out=q_next)
            np.maximum(q_next, 0.0, out=q_next)
        np.add(qs[:, :, :, :-1, :], qs[:, :, :, 1:, :], out=wait)
        wait *= 0.5
        wait /= m_all
        np.minimum(wait, 10 * cfg.client_timeout_s, out=wait)
        timed_out = wait > cfg.client_timeout_s
        wait_detail = np.ascontiguousarray(np.moveaxis(wait, 0, -1)) if detail else None
        # Waiting for a batch slot is served by priority (router holds and the engine queue both
        # go critical first): Cobham's factor for non-preemptive priority, class k waits
        # W × (1 − ρ) / ((1 − σ_{k−1})(1 − σ_k)), σ_k the utilisation of classes up to k.
        # Example: ρ = 0.95 with critical 20 % of the load → critical waits 0.05/0.81 = 0.06 W;
        # sheddable (the last 20 %) waits 0.05/(0.24 × 0.05) = 4.2 W.
        # (Computed in place in the work arrays: "a" holds cum_in → frac → σ_k → the factor → t95,
        # "c" t50; "b" holds the wait, then scratch.)
        if lat.slot_wait_p95_s is not None:
            sw50 = np.reshape(lat.slot_wait_p50_s, shape)
            sw95 = np.reshape(lat.slot_wait_p95_s, shape)
            rho = np.minimum(pool_rps / m_all, 0.98)
            frac = np.divide(cum_in, np.maximum(pool_rps, 1e-9), out=cum_in)
            one_m = np.multiply(rho, frac, out=frac)  # σ_k
            np.subtract(1.0, one_m, out=one_m)  # 1 − σ_k
            for k in range(K - 1, 0, -1):  # × (1 − σ_{k−1}), taken before row k−1 is itself multiplied
                one_m[k] *= one_m[k - 1]
            # (row 0: × (1 − 0), exact; a NaN ρ makes σ_0 NaN as it made σ_{−1} = ρ × 0 NaN before)
            np.maximum(one_m, 1e-3, out=one_m)
            idle = 1.0 - rho
            cob = np.divide(idle, one_m, out=one_m)
            np.minimum(cob, 1.0 / np.maximum(idle, 0.02), out=cob)
            cob -= 1.0  # the slot wait is re-weighed: t + sw × (cob − 1), plus the backlog's wait
            t50 = np.multiply(sw50, cob, out=self._buf("c", kshape))
            t50 += ttft50
            t95 = np.multiply(sw95, cob, out=cob)
            t95 += ttft95
            t50 += wait
            t95 += wait
        else:
            t50 = np.add(ttft50, wait, out=self._buf("c", kshape))
            t95 = np.add(ttft95, wait, out=cum_in)
        scratch = wait  # the wait is spent (timed_out and the detail copy hold what is still needed)
        pf = _lognormal_exceed_into(t50, t95, self.slo_ttft_k, TTFT_TAIL_SIGMA, z=t50, scratch=scratch, own=True)
        pt = _lognormal_exceed_into(tpot50, tpot95, self.slo_tpot_k, TPOT_TAIL_SIGMA, z=t95, scratch=scratch)
        if lat.tpot_max_s is not None:
            # No request's TPOT exceeds the full-chunk bound c (see mpc_model): the log-normal is
            # truncated there, P(T > s | T ≤ c) = (P(T > s) − P(T > c)) / (1 − P(T > c)), which falls
            # to 0 as s reaches c. Example: p50 0.03 s, p95 0.098 s, SLO 0.1 s: untruncated 4.6 %;
            # c = 0.12 s → 2.6 %, c = 0.1 s → 0. (An unbounded pool, c = inf, is read as c = 1e6 s.)
            c_max = np.minimum(np.reshape(lat.tpot_max_s, shape), 1e6)
            p_c = _lognormal_exceed(tpot50, tpot95, c_max, TPOT_TAIL_SIGMA)
            pt -= p_c[None]
            pt /= np.maximum(1.0 - p_c, 1e-12)[None]
            np.clip(pt, 0.0, 1.0, out=pt)
        if timed_out.any():
            pf[timed_out] = 1.0
        # Per class: combine the hops of each group, weighted by traffic share.
        w_share = share[None, :, None, :, :]
        prod = np.multiply(pf, pt, out=scratch)
        mixed_v = np.add(pf, pt, out=pt)
        mixed_v -= prod  # 1 − (1 − pf)(1 − pt)
        # mixed/prefill pools: TTFT (and TPOT for mixed); decode pools: TPOT and their first step
        first_v = np.where(self.prefill_pool, pf, mixed_v) if self.prefill_pool.any() else mixed_v
        # Without decode pools every pool is a first hop (× 1 is exact) and the decode hop adds
        # nothing: (1 − v_first) × (1 − 0) is (1 − v_first) exactly (a NaN row is NaN in v_first too).
        if self.decode_hop.any():
            v_first = _sum_pools(w_share * self.first_hop * first_v)
            v_dec = _sum_pools(w_share * self.decode_hop * mixed_v)
            v = 1.0 - (1.0 - v_first) * (1.0 - v_dec)
        else:
            v = 1.0 - (1.0 - _sum_pools(np.multiply(w_share, first_v, out=scratch)))
        v = np.ascontiguousarray(np.moveaxis(v, 0, -1))  # (C,2,H,K)
        v = np.clip(v, 0.0, 1.0)  # (C,2,H,K) late share of admitted requests
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
        retried = self.lam[None] * (shed - rejected)[:, None, :, :]
        late = (np.minimum(adm * v + 0.5 * retried, self.lam[None] - self.lam[None] * rejected[:, None])
                * wt[None, None, :, None]).sum(axis=2) * dt
        shed_n = req[None] - adm_n
        cost = (billed * self.price[None, :, None] * wt[None, None, :]).sum(axis=(1, 2)) * dt / 3600.0  # (C,)
        succ = np.maximum(adm_n[:, 0].sum(axis=1) - late[:, 0].sum(axis=1), 1e-6)
        total = max(float(req[0].sum()), 1e-6)
        # Penalties are priced in cost per success; a plan that buys (next to) nothing would price
        # them at (next to) nothing and win with every request lost (a pool at zero replicas never
        # came back). Floored at the cheapest any pool can serve a request, which no plan that
        # serves its successes can go below, the floor only binds for such plans.
        cpr = np.maximum(cost / succ, self.cpr_min)
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
                 + (np.abs(self.shares(cand.tw * self.ready_step0) - self.share_now) > 0.02)
                 + (cand.standby != cur.standby))
        change += prob.weights.lever_change_weight * (lever * step_price).sum(axis=1)
        # a rolling restart (`restart`, from the hit-rate dynamics above) runs one surge replica per
        # replica for its warm start; counted twice, as a margin for what the model does not see (the
        # drain overlap, the new engines' first minutes). The empty caches it leaves are in the hit rate.
        restart_usd = (restart * self.ready_int * self.price * self.d_warm / 3600.0).sum(axis=1)
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
            "wait": wait_detail, "utilisation": (pool_rps / np.maximum(cap_rps, 1e-9)), "hit": hit,
            "penalty_factor": pen, "risk_term": risk, "change_usd": change,
            "tpot_max": None if lat.tpot_max_s is None else np.reshape(lat.tpot_max_s, shape),
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
    def __init__(self, ev: _Evaluator, cfg: MpcConfig, rng: np.random.Generator, timer: Timer | None,
                 started_s: float | None = None) -> None:
        self.ev, self.cfg, self.rng, self.timer = ev, cfg, rng, timer
        self.t0 = (started_s if started_s is not None else timer()) if timer is not None else 0.0
        self.best: _Cand | None = None
        self.best_J = math.inf
        self.exhausted = False
        self.cost = _BatchCost()  # with a timer: what a batch of n candidates has cost
        self.last_end_s: float | None = None

    def deadline_s(self) -> float:
        """With a timer: when the search must stop (the budget less the reserve)."""
        return self.t0 + self.cfg.time_budget_s - self.cfg.time_reserve_s

    def left(self) -> int:
        """Candidates the budget still allows: by count, or with a timer by the time left before the
        reserve at what batches have cost so far (unlimited until one has been timed), keeping room
        for `_settle` (two batches of at most one row per lever and pool, plus three). A search
        the budget stops is marked `exhausted`."""
        if self.timer is not None:
            remaining = self.deadline_s() - self.timer()
            room = 0
            if remaining > 0:
                if not self.cost.known():
                    return 10**9
                if self.cost.identified():  # until then per-candidate costs carry the fixed one: too dear
                    remaining -= self.cost.seconds(len(_SETTLE_FIELDS) * self.ev.P + 2) + self.cost.seconds(1)
                room = self.cost.fits(remaining)
        else:
            room = (self.cfg.max_evaluations - self.ev.evaluations * self.ev.P) // self.ev.P
        if room <= 0:
            self.exhausted = True
        return room

    def score(self, cands: _Cand) -> np.ndarray:
        """Score candidates regardless of the budget, and (with a timer) learn what a batch costs: from
        the end of the previous one, so building the candidates counts too."""
        if self.timer is None:
            return self.ev.score(cands)[0]
        if self.last_end_s is None:
            self.last_end_s = self.timer()
        J, _ = self.ev.score(cands)
        end = self.timer()
        self.cost.add(cands.n, end - self.last_end_s)
        self.last_end_s = end
        return J

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
        J = self.score(cands)
        k = int(np.argmin(J))
        if J[k] < self.best_J:
            self.best_J = float(J[k])
            self.best = cands.take(np.array([k]))
        if len(J) < n:
            J = np.concatenate([J, np.full(n - len(J), np.inf)])
        return J


class _BatchCost:
    """Seconds a search batch of n candidates costs, a + b·n, least squares over the batches timed so
    far (a: the fixed cost of a score call and of building its candidates; b: per candidate). Example:
    batches of 7 and 78 candidates at 3.5 and 18.6 ms → a = 2.0 ms, b = 0.21 ms; 60 ms left → 276
    candidates. With one batch size only, b = its mean cost per candidate and a = 0 (dear for large
    batches: the first one is then cut to what fits at that price, and the next fit has two sizes)."""

    def __init__(self) -> None:
        self.k = 0
        self.sn = self.st = self.snn = self.snt = 0.0

    def add(self, n: int, dt: float) -> None:
        self.k += 1
        self.sn += n
        self.st += dt
        self.snn += n * n
        self.snt += n * dt

    def known(self) -> bool:
        return self.k > 0 and self.st > 0

    def identified(self) -> bool:
        """Both terms fitted (batches of two sizes or more, a sane fit)."""
        return self._fit() is not None

    def _fit(self) -> tuple[float, float] | None:
        if self.k < 2:
            return None
        var = self.snn - self.sn * self.sn / self.k
        if var <= 1e-9:
            return None
        b = (self.snt - self.sn * self.st / self.k) / var
        a = (self.st - b * self.sn) / self.k
        return (a, b) if b > 0 and a >= 0 else None

    def _ab(self) -> tuple[float, float]:
        return self._fit() or (0.0, self.st / max(self.sn, 1.0))

    def seconds(self, n: int) -> float:
        a, b = self._ab()
        return a + b * n

    def fits(self, seconds: float) -> int:
        a, b = self._ab()
        return max(int((seconds - a) / b), 0) if b > 0 else 10**9


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


_SETTLE_FIELDS = ("pw", "cap", "tw", "standby")  # the continuous levers `_settle` puts back one by one


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
        for field_ in _SETTLE_FIELDS:
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
    # router weights: weight per replica × replicas serving in the first step, as shares of the hop
    absolute = c.tw[0] * np.maximum(ready[0, :, 0], 1.0)
    for _, m in ev.hop_masks:
        tot = absolute[m].sum()
        absolute[m] = absolute[m] / tot if tot > 0 else 1.0 / m.sum()
    pools = {}
    for j, p in enumerate(ev.prob.pools):
        cap = int(round(c.cap[0, j]))
        pools[p.name] = PoolPlan(
            replicas=tuple(int(x) for x in c.repl[0, j]), standby=int(c.standby[0, j]),
            prefix_weight=float(round(c.pw[0, j], 3)), inflight_cap=0 if cap >= p.max_num_seqs else cap,
            traffic_weight=float(round(absolute[j], 4)) if ev.hop_size[j] > 1 else p.traffic_weight,
            max_num_seqs=int(c.mns[0, j]),
            max_num_batched_tokens=int(c.mbt[0, j]))
    active = bool(ev.shed_active(ready)[0, 0])
    shed = {cl.name: float(round(min(max(c.shed[0, k] if active else cl.min_shed, 0.0), 1.0), 4))
            for k, cl in enumerate(ev.prob.classes)}
    return Plan(pools=pools, shed=shed)


def _from_plan(ev: _Evaluator, plan: Plan, shift: int) -> _Cand | None:
    """A previous plan as a candidate, shifted `shift` steps forward (its tail repeats its last step)."""
    c = ev.cur.tile(1)
    if any(p.name not in plan.pools or len(plan.pools[p.name].replicas) == 0 for p in ev.prob.pools):
        return None
    tw = ev.per_replica_weights(np.array([[plan.pools[p.name].traffic_weight for p in ev.prob.pools]]))[0]
    for j, p in enumerate(ev.prob.pools):
        pp = plan.pools[p.name]
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
            c.tw[0, j] = tw[j]
    for k, cl in enumerate(ev.prob.classes):
        c.shed[0, k] = min(max(plan.shed.get(cl.name, 0.0), cl.min_shed), cl.max_shed)
    return c


def solve(problem: PlanProblem, model: PlanModel, config: MpcConfig, rng: np.random.Generator, *,
          warm: Plan | None = None, warm_shift: int = 0, timer: Timer | None = None,
          started_s: float | None = None) -> PlanResult:
    """Find the best plan within the budget (see the module docstring). Never returns nothing:
    the plan in force (clipped to the bounds) is always scored first. With a `timer`, the time
    budget counts from `started_s` (a reading of the same timer, e.g. when the tick began; default
    now)."""
    ev = _Evaluator(problem, model, config)
    s = _Search(ev, config, rng, timer, started_s)
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
    J0 = s.score(_Cand.concat(starts))
    incumbent_J = float(J0[0])
    k = int(np.argmin(J0))
    s.best, s.best_J = _Cand.concat(starts).take(np.array([k])), float(J0[k])
    # replica sweeps, levers, replica sweep again, batch caps
    order = sorted(range(len(problem.pools)), key=lambda j: -problem.pools[j].usd_per_hour)
    needs = [_need_per_step(ev, s.best, j) for j in range(len(problem.pools))]
    ev.need = np.array(needs, dtype=float)
    s.best_J = float(s.score(s.best)[0])  # rescore: shedding now releases once capacity is ready
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
            # the longest TPOT a request can have (a full prefill chunk every step); null = unbounded
            "tpot_bound_s_p90": (None if info["tpot_max"] is None else
                                 [round(float(x), 4) if np.isfinite(x) else None for x in info["tpot_max"][0, 1, :, j]]),
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
