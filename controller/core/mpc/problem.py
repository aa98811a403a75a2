"""The planner's inputs and outputs: its configuration, the problem a tick poses, the plan it returns.

`MpcConfig` (horizon, budget, lever ranges), `PlanProblem` (the pools and priority classes as
the policy sees them this tick, with the objective's weights), `Plan` / `PoolPlan` (what the
search returns, per pool and per class) and `PlanResult` (the plan with its predicted terms),
plus the small rules the policy and the planner share: how many steps a plan is scored over,
which replicas serve in its first step and the router weights of an applied plan.

Must not: score or search plans (controller/core/mpc/score.py, search.py), do I/O, read the clock.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from controller.core.objective import ObjectiveWeights
from controller.core.workflow import StepLoss
from controller.levers import plan_groups

Timer = Callable[[], float]

# The levers besides replicas that `MpcConfig.fixed_levers` can hold at what is in force (the bench's
# lever ablation turns each off in turn; an operator can too): cache affinity (router prefix weight),
# the per-replica in-flight cap, the traffic split between the pools of a hop (held: every serving
# replica of the hop gets the same share, as a plain balancer gives), warm standby, engine batch caps,
# and admission (planned shedding; the breaker's and the feedback layer's shed floors, which are
# safety rules, still apply).
# The names come from the lever table (controller/levers.py, its `plan` column):
# ("affinity", "inflight_cap", "traffic_split", "standby", "batch_caps", "admission").
LEVERS = plan_groups()

# --------------------------------------------------------------------------- configuration


@dataclass(frozen=True)
class MpcConfig:
    horizon_steps: int = 10
    step_s: float = 30.0
    # Budget without a timer: candidate plans × pools scored per tick, sized so a 10-pool fleet
    # (400 plans) plans within a tick's CPU share on one core (`governor bench planner` measures it;
    # docs/decisions/0003-planner-time-budget.md); a single pool gets 4,000 plans, far more than its search needs.
    max_evaluations: int = 4000
    # With a timer: the whole tick (from `started_s`, see solve) ends within time_budget_s. A batch
    # is cut to the candidates that fit at what batches have cost so far (`BatchCost`); the search
    # leaves room for `settle`'s rows at that cost, and a reserve for what follows the search (the
    # chosen plan scored in detail, its terms, the policy's decision and reasons). That work grows with
    # the pools and differs by machine, so the policy measures it tick by tick and passes the reserve
    # to `solve` (controller/policies/mpc/reserve.py); `time_reserve_s` set fixes it instead, and
    # without either the search keeps `first_reserve_s` (a tenth of the budget).
    time_budget_s: float = 0.2
    time_reserve_s: float | None = None
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
    fixed_levers: tuple[str, ...] = ()  # levers (of LEVERS) held at what is in force, never searched
    # Fleets of at least `group_search_min_pools` pools in two route groups or more are searched group
    # by group, coordinated through what couples them (controller/core/mpc/groups.py): the complete
    # search's cost grows as the square of the pools (each candidate scores every pool), 105 ms of CPU
    # at 10 pools and over 200 ms, the daemon's default budget, from 12 (`governor bench planner`).
    # Below it, or with `group_search` off, one search over the whole fleet.
    group_search: bool = True
    group_search_min_pools: int = 12

    def __post_init__(self) -> None:
        if not (isinstance(self.horizon_steps, int) and 2 <= self.horizon_steps <= 40):
            raise ValueError(f"mpc.horizon_steps must be an integer in [2, 40] (got {self.horizon_steps!r})")
        for name in ("step_s", "time_budget_s", "cache_refill_s", "client_timeout_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"mpc.{name} must be a finite number > 0 (got {v!r})")
        if not isinstance(self.group_search, bool):
            raise ValueError(f"mpc.group_search must be true or false (got {self.group_search!r})")
        for name in ("max_evaluations", "ce_iterations", "ce_population", "group_search_min_pools"):
            v = getattr(self, name)
            if not (isinstance(v, int) and v >= 1):
                raise ValueError(f"mpc.{name} must be an integer >= 1 (got {v!r})")
        if self.time_reserve_s is not None and not (
                isinstance(self.time_reserve_s, (int, float)) and 0 <= self.time_reserve_s < self.time_budget_s):
            raise ValueError(f"mpc.time_reserve_s must be >= 0 and below time_budget_s = {self.time_budget_s!r} "
                             f"(got {self.time_reserve_s!r})")
        if self.max_evaluations < 50:
            raise ValueError(f"mpc.max_evaluations must be >= 50 (got {self.max_evaluations})")
        if not 0 < self.ce_elite_frac < 1:
            raise ValueError(f"mpc.ce_elite_frac must be in (0, 1) (got {self.ce_elite_frac!r})")
        bad = [x for x in self.fixed_levers if x not in LEVERS]
        if not isinstance(self.fixed_levers, tuple) or bad:
            raise ValueError(f"mpc.fixed_levers: unknown lever(s) {bad or self.fixed_levers!r}; valid: {list(LEVERS)}")
        lo, hi = self.prefix_weight_range
        if not 0 <= lo <= hi:
            raise ValueError(f"mpc.prefix_weight_range must be 0 <= lo <= hi (got {self.prefix_weight_range!r})")


# Share of the time budget kept after the search before anything is measured (the policy's first ticks
# on a fleet, or `solve` called without a reserve): what follows the search measured at most 2.5 ms of
# a 10-pool tick, 6 ms of a 40-pool one and 15 ms of a 100-pool one (CPU, `governor bench planner`,
# after_search_*), 1-1.5 % of the budgets those fleets need (200 ms, 400 ms, 1 s), so a tenth leaves a
# wide margin for a slower machine; it costs the search a tenth of its time on a few ticks, and each
# next tick warm-starts from the plan found.
FIRST_RESERVE_FRAC = 0.1


def first_reserve_s(cfg: MpcConfig) -> float:
    """The reserve after the search when nothing has been measured: `time_reserve_s` if set, else a
    tenth of the budget. Example: 1 s budget → 100 ms."""
    return cfg.time_reserve_s if cfg.time_reserve_s is not None else FIRST_RESERVE_FRAC * cfg.time_budget_s


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
    # memory ceiling on max_num_batched_tokens (framebuffer headroom; None = none): the batch-cap
    # lever may lower the caps freely but not raise them above it
    max_batched_tokens: int | None = None
    batch_review: bool = False  # may the slow batch-cap lever change this tick
    # tier rule: (class, share of that class's tasks this pool may serve) for the classes below 1;
    # empty: every class (controller/types.py PoolSpec.eligible; see traffic.py for the split)
    eligible: tuple[tuple[str, float], ...] = ()


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
    # requests' worth of work a late or shed request of the class loses, its task's sunk steps with it, step-blind
    # and step-aware, from the measured step profile (controller/core/workflow.py); None: the static weight
    task_loss: StepLoss | None = None


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


class _Routed(Protocol):
    @property
    def group(self) -> str: ...

    @property
    def role(self) -> str: ...


def hop(p: _Routed) -> tuple[str, bool]:
    """The route group and hop a pool serves: (group, is decode). Pools of one hop share its traffic
    by weight (prefill and mixed pools the first hop, decode pools the second)."""
    return p.group, p.role == "decode"


def applied_router_weights(problem: PlanProblem, plan: Plan, applied: Mapping[str, int],
                           step_s: float, tick_s: float | None = None) -> dict[str, float]:
    """The plan's router weights for the replica targets actually applied, as shares of each hop.

    The planner sets a pool's router weight to its weight per replica × the replicas its plan
    serves in the first step. When the policy applies another target (a scale-down held by
    stabilisation, a guard), those replicas serve too, and the next plan reads the weight per
    replica back by dividing by them: left as planned, a held pool's weight would shrink each tick
    while all its replicas are paid for. So the weight is scaled by serving
    (applied) / serving (planned) and the hop renormalised. Serving = the target, at most the
    replicas ready or due within half a step, at least 1. Pools alone on their hop keep theirs.
    Example: A100 planned 1, applied 2 (2 ready), H100 5 → A100's weight doubles before renormalising.

    The weights are in force until the next decision, one tick (`tick_s`, when shorter than a
    step): the applied side counts only the replicas ready or due within half a tick, so a pool
    whose start-ups land later in the step is not sent their share before they serve. Example:
    tick 3 s, step 30 s; H100 4 ready + 4 due in 8 s (planned 8), A100 2 ready (planned 2) →
    the H100 weight is halved before renormalising.
    """
    due = {p.name: serving_first_step(p, step_s) for p in problem.pools}
    now_s = tick_s if tick_s is not None and tick_s < step_s else step_s
    due_now = {p.name: serving_first_step(p, now_s) for p in problem.pools}
    hops: dict[tuple[str, bool], list[PoolInput]] = {}
    for p in problem.pools:
        hops.setdefault(hop(p), []).append(p)
    out = {name: pp.traffic_weight for name, pp in plan.pools.items()}
    for members in hops.values():
        if len(members) < 2:
            continue
        w = {}
        for p in members:
            planned = max(min(plan.pools[p.name].replicas[0], due[p.name]), 1)
            served = max(min(applied.get(p.name, plan.pools[p.name].replicas[0]), due_now[p.name]), 1)
            w[p.name] = max(plan.pools[p.name].traffic_weight, 0.0) * served / planned
        tot = sum(w.values())
        for name, x in w.items():
            out[name] = round(x / tot, 4) if tot > 0 else round(1.0 / len(w), 4)
    return out


# --------------------------------------------------------------------------- plans


@dataclass(frozen=True)
class PoolPlan:
    replicas: tuple[int, ...]  # per horizon step (the first is applied)
    warm_standby: int
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
    groups: tuple[tuple[str, ...], ...] = ()  # the pools of each part searched on its own; () = one search
    # with a timer, its readings: when the search had to stop (the budget less the reserve) and when it
    # did stop (before the chosen plan is scored in detail); None without a timer
    search_deadline_s: float | None = None
    search_ended_s: float | None = None
