"""Governor's MPC policy: the Policy adapter around the planner in controller/core/mpc.py.

Each tick it turns telemetry and its own memory into a `PlanProblem`, runs the planner
(`controller.core.mpc.solve`), and turns the plan's first step into pool decisions and
class admission, with reasons a human can follow. What it keeps between ticks (all in the
frozen `MpcState`, never in the object):

- the fleet's demand history (router arrivals minus client retries, per class) for the
  forecaster, and the class mix;
- per pool: when each starting replica should be ready (from the targets actually applied:
  warm while a slot kept its weights — a drained replica's slot stays warm `warm_node_ttl_s`
  — else cold; replacements the fleet starts after a crash are taken as cold), the warm
  slots, the prompt/output mix, the traffic's reuse estimate (what an infinite cache would
  hit, and the working set the observed hit implies), and correction factors for the
  model's p95 TTFT and TPOT (observed / predicted, learned as an EWMA in log space while the
  pool runs below saturation with no standing queue: a backlog's wait is the planner's own
  term), which also give the model's confidence;
- the previous plan (the solver's warm start), the scale-down stabilisation window (the
  highest plan of the last `scale_down_stabilization_s`, stretched towards
  `bursty_down_window_s` when the demand comes in bursts, see `down_window_s`), and the
  replicas the last plan's first step needed (the breaker's "does the fleet carry its load").

The cascading-failure breaker (controller/core/breaker.py) runs in `Controller.step`, configured
by the `breaker` parameter (`breaker_config`): `breaker_signals` tells it the crash replacements
the replica accounting saw and whether the fleet carries its load, and the plan is made within
the constraints it hands over in `PolicyInput.breaker` (replica floors, affinity ceiling, the
SLO-safe in-flight cap, shed floors).

Router traffic weights go out as shares of each route group's hop (summing to 1), written for
the replica targets applied rather than those planned (`applied_router_weights`: a held
scale-down serves too).

Profiles: the objective's weights come from `PolicyInput.profile` (cost / balanced /
latency / throughput, changeable at run time through PolicyService) merged with the
explicit `weights` parameter. Engine figures come from `engine_figures` (per pool) or the
built-in profiled table; `capacity` (per-pool ReplicaCapacity, as the bench profiles it for
the SLA planner) only seeds the correction factors. `timer` is a monotonic clock for a wall-time
budget; without a timer the budget is a count of scored candidates.

What the planner predicts with (`planning_model`): "prior" (default) = the queueing prior
(`QueueingPrior`) with the policy's online correction factors; "learned" = the learned coupling
models (controller/core/coupling.py) through `LearnedPlanModel`, read each tick from
`coupling_source` — a callable returning the current `CouplingModels` (the daemon passes its
model slot, so a refit that passed the validation gate is planned on from the next tick; the
bench passes the shipped models/). If the models have no physics for a pool, the tick plans on
the prior and diagnostics["model"]["learned_unusable"] says why. `models` injects any other
PlanModel (tests) and wins over both.

Reason codes (Reason.code): mpc_scale_up, mpc_scale_up_early (the forecast needs more
replicas within the start-up delay), mpc_scale_down, scale_down_stabilised, mpc_hold,
lever_avoid (cache-affinity weight), lever_share (in-flight cap, engine batch caps),
lever_move (traffic split between pools), lever_delay (shedding a class), lever_standby,
binding_max_replicas, binding_pin, low_confidence, missing_data_hold (the breaker's own,
breaker_open / breaker_recovering / breaker_closed, come from Controller.step).

Pure: no I/O, no clock (time is PolicyInput.now_s; a timer only if injected); does not
import telemetry/actuation/api/runtime/gen, grpc or prometheus clients.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from scipy.special import ndtri

from controller.core.breaker import BreakerConfig
from controller.core.forecast import PriorForecaster
from controller.core.mpc import (
    ClassInput,
    MpcConfig,
    Plan,
    PlanProblem,
    PlanResult,
    PoolInput,
    applied_router_weights,
    plan_steps,
    solve,
)
from controller.core.mpc_model import (
    EngineFigures,
    LatencyQuery,
    LearnedPlanModel,
    PlanModel,
    QueueingPrior,
    affinity,
)
from controller.core.objective import resolve_weights
from controller.policies.common import check_positive, current_target, reason, value
from controller.policies.sla_planner import ReplicaCapacity
from controller.types import (
    PRIORITY_CLASSES,
    BreakerAction,
    BreakerSignals,
    ClassAdmission,
    FleetObservation,
    FleetSpec,
    PolicyInput,
    PolicyOutput,
    PoolDecision,
    PoolObservation,
    PoolSpec,
    Reason,
)

HISTORY_KEEP_S = 1800.0
# what the planner predicts with: the queueing prior (+ online corrections) or the learned coupling models
PLANNING_MODELS = ("prior", "learned")
CORRECTION_BOUNDS = (0.4, 10.0)
# a rolling restart's next surge replica starts when the previous one is ready; this long past a
# cold start-up without one, the restart is taken as over
ROLLOUT_GAP_S = 120.0
BURST_EVIDENCE = 2.0  # p95 TPOT this far above the smooth-arrival model is taken as bursts
BURST_DECAY = 0.97  # per tick: a burst regime seen once is remembered for ~5 minutes (15 s ticks)
WARM_BINS = 8
# Bursty demand: the roughness of the demand samples over the last BURST_WINDOW_S (mean absolute
# change from one tick to the next over the mean) stretches the scale-down stabilisation window
# from its base towards `bursty_down_window_s` between these two values. Azure code traffic
# (bursts of 15-60 s, silence between) reads 0.30-0.37; Azure chat traffic 0.03-0.05; a one-off
# level shift from 30 to 8 req/s over 40 samples 0.03. So chat and a falling load keep the base
# window, and code holds replicas between bursts it cannot see coming (a replica ordered at a
# burst arrives after it).
BURST_WINDOW_S = 600.0
BURST_ROUGHNESS_RANGE = (0.12, 0.25)


@dataclass(frozen=True)
class MpcPoolMemory:
    etas: tuple[float, ...] = ()  # absolute times the starting replicas should be ready
    warm: tuple[float, ...] = ()  # times replicas were drained (their slots stay warm for a while)
    serving: int | None = None  # ready + starting after the last accounting
    target: int | None = None  # target in force at the last accounting
    log_k_ttft: float = 0.0
    log_k_tpot: float = 0.0
    err: float = 0.7  # EWMA of |log(observed / predicted)| with corrections (0.7 ≈ a factor of 2)
    burst: float = 0.0  # burst length, s (learned from p95 TPOT above what smooth arrivals explain)
    samples: int = 0
    inf_hit: float = 0.0
    prompt_tokens: float | None = None
    output_tokens: float | None = None
    recs: tuple[tuple[float, int], ...] = ()  # (t, desired replicas) for scale-down stabilisation
    caps: tuple[int, int] | None = None  # engine (max_num_seqs, max_num_batched_tokens) in force
    caps_changed_s: float = -math.inf
    unordered: int = 0  # replicas the fleet started this tick that nobody ordered (crash replacements)
    # old-cap replicas still to be replaced by the rolling restart a batch-cap change set off: the
    # fleet starts their surge replicas itself (one at a time, warm), and those are not losses
    rollout_left: int = 0
    rollout_seen_s: float = -math.inf  # the caps change or the latest surge replica seen


@dataclass(frozen=True)
class MpcState:
    t_hist: tuple[float, ...] = ()
    demand_hist: tuple[float, ...] = ()
    class_share: Mapping[str, float] = field(default_factory=dict)
    pools: Mapping[str, MpcPoolMemory] = field(default_factory=dict)
    plan: Plan | None = None
    plan_at_s: float | None = None
    last_s: float | None = None
    first_s: float | None = None
    shed_in_force: Mapping[str, float] = field(default_factory=dict)
    need_now: Mapping[str, int] = field(default_factory=dict)  # replicas the last plan's first step needed


def _step(log_k: float, log_r: float, alpha: float, clip: float = 0.7) -> float:
    """EWMA of a log correction with each sample clipped to ±clip around the current value, so
    one window that caught a burst's backlog moves the factor by at most α × clip (×1.1)."""
    return log_k + alpha * min(max(log_r - log_k, -clip), clip)


def _standing_queue(waiting: float | None, ready: float) -> bool:
    """More than one request waiting per ready replica in the engines: a backlog, not arrivals. vLLM
    queues only what it cannot schedule, so at most one per replica is the step in between."""
    return (waiting or 0.0) > ready


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
    ys = [d for t, d in zip(t_hist, d_hist) if now - t < BURST_WINDOW_S]
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


def _activate(pools: list[PoolInput], arrivals: Mapping[str, float], demand: bool) -> list[PoolInput]:
    """Scale from zero: a route group that serves nothing (no replica ready or starting) while traffic
    for it is seen gets one replica on the cheapest pool of each of its hops (lo raised to 1).

    Traffic for a group is its pools' arrivals, or, in a fleet with one route group, `demand`: any
    demand at the router or requests it holds (a pool at zero has no engine to count arrivals; the
    router holds them while the first replica starts). The planner alone may rather lose those requests than pay
    for a replica that serves nothing through a long cold start (a 300 s start is ten of its twenty
    steps), and would leave the pool at zero for good. Pinned or frozen pools are left alone.
    Example: one group, pool at 0, 3 req/s at the router → the pool's minimum becomes 1 this tick.
    """
    single = len({p.group for p in pools}) == 1
    out = list(pools)
    for g in {p.group for p in pools}:
        members = [j for j, p in enumerate(pools) if p.group == g]
        if any(pools[j].ready + len(pools[j].starting_eta_s) > 0 for j in members):
            continue
        if not (arrivals.get(g, 0.0) > 0 or (single and demand)):
            continue
        for decode in (False, True):
            hop = [j for j in members if (pools[j].role == "decode") == decode and pools[j].hi >= 1
                   and not pools[j].frozen and pools[j].lo < pools[j].hi]
            if hop:
                j = min(hop, key=lambda i: (pools[i].usd_per_hour, pools[i].name))
                out[j] = replace(pools[j], lo=max(pools[j].lo, 1))
    return out


def _ewma(old: float | None, new: float, alpha: float) -> float:
    return new if old is None else (1 - alpha) * old + alpha * new


class MpcPolicy:
    """Model-predictive control of every lever (see the module docstring)."""

    name = "mpc"

    def __init__(self, *, horizon_steps: int = 10, step_s: float = 30.0, max_evaluations: int = 4000,
                 time_budget_s: float = 0.2, weights: Mapping[str, Any] | None = None,
                 engine_figures: Mapping[str, Any] | None = None,
                 capacity: Mapping[str, ReplicaCapacity | Mapping[str, Any]] | None = None,
                 scale_down_stabilization_s: float = 120.0, bursty_down_window_s: float = 600.0,
                 warm_node_ttl_s: float = 600.0,
                 breaker: bool | Mapping[str, Any] = True, batch_review_s: float = 1200.0,
                 correction_alpha: float = 0.15, client_retries: int = 2, standby_cost_frac: float = 1.0,
                 warmup_s: float = 60.0, min_history_s: float = 300.0, planner: Mapping[str, Any] | None = None,
                 protect_streams: bool = True,
                 planning_model: str = "prior", coupling_source: Callable[[], Any] | None = None,
                 models: PlanModel | None = None, timer: Callable[[], float] | None = None) -> None:
        extra = dict(planner or {})
        known = set(MpcConfig.__dataclass_fields__)
        bad = sorted(set(extra) - known)
        if bad:
            raise ValueError(f"mpc.planner: unknown field(s) {bad}; valid: {sorted(known)}")
        for k, v in list(extra.items()):
            if isinstance(v, list):
                extra[k] = tuple(v)
        self.config = MpcConfig(**{"horizon_steps": horizon_steps, "step_s": float(step_s),
                                   "max_evaluations": max_evaluations, "time_budget_s": float(time_budget_s),
                                   "client_retries": int(client_retries), "standby_cost_frac": float(standby_cost_frac),
                                   **extra})
        resolve_weights("balanced", weights)  # validate now: a bad weight fails at build time
        self.weights = dict(weights or {})
        self.engine_figures = {k: EngineFigures.of(v) for k, v in (engine_figures or {}).items()}
        self.capacity = {str(k): ReplicaCapacity.of(v) for k, v in (capacity or {}).items()}
        self.down_window_s = check_positive("mpc.scale_down_stabilization_s", scale_down_stabilization_s,
                                            allow_zero=True)
        self.bursty_window_s = max(check_positive("mpc.bursty_down_window_s", bursty_down_window_s, allow_zero=True),
                                   self.down_window_s)
        self.warm_ttl_s = check_positive("mpc.warm_node_ttl_s", warm_node_ttl_s, allow_zero=True)
        self.batch_review_s = check_positive("mpc.batch_review_s", batch_review_s, allow_zero=True)
        self.alpha = check_positive("mpc.correction_alpha", correction_alpha)
        self.warmup_s = check_positive("mpc.warmup_s", warmup_s, allow_zero=True)
        self.min_history_s = check_positive("mpc.min_history_s", min_history_s, allow_zero=True)
        self.protect_streams = bool(protect_streams)
        if self.alpha > 1:
            raise ValueError(f"mpc.correction_alpha must be in (0, 1] (got {correction_alpha!r})")
        if isinstance(breaker, Mapping):
            self.breaker_config = BreakerConfig(**dict(breaker))
        elif isinstance(breaker, bool):
            self.breaker_config = BreakerConfig(enabled=breaker)
        else:
            raise ValueError(f"mpc.breaker must be true/false or a mapping of BreakerConfig fields (got {breaker!r})")
        if planning_model not in PLANNING_MODELS:
            raise ValueError(f"mpc.planning_model must be one of {', '.join(PLANNING_MODELS)} (got {planning_model!r})")
        if planning_model == "learned" and coupling_source is None:
            raise ValueError("mpc.planning_model 'learned' needs the learned coupling models (coupling_source): "
                             "the daemon and `governor bench` supply them; a direct build must pass one")
        self.planning_model = planning_model
        self.coupling_source = coupling_source if planning_model == "learned" else None
        self._learned: tuple[int, tuple[str, ...], LearnedPlanModel | None, str | None] | None = None
        self.models = models
        self.timer = timer
        self.forecaster = PriorForecaster()
        self._model_cache: dict[tuple[str, ...], QueueingPrior] = {}

    # ------------------------------------------------------------------ plumbing

    def initial_state(self) -> MpcState:
        return MpcState()

    @staticmethod
    def _fleet_key(fleet: FleetSpec) -> tuple[str, ...]:
        """What the models built for a fleet depend on: each pool's name, engine and role."""
        return tuple(f"{p.name}:{p.model}:{p.sku}:{p.gpus_per_replica}:{p.role}" for p in fleet.pools)

    def _prior(self, fleet: FleetSpec) -> QueueingPrior:
        key = self._fleet_key(fleet)
        m = self._model_cache.get(key)
        if m is None:
            m = QueueingPrior.for_pools(fleet.pools, self.engine_figures)
            m = self._seed_from_capacity(m, fleet)
            self._model_cache[key] = m
        return m

    def _plan_model(self, fleet: FleetSpec, prior: QueueingPrior) -> tuple[PlanModel, str | None]:
        """The model this tick plans with, and why the learned models were not usable (or None)."""
        if self.models is not None:
            return self.models, None
        if self.coupling_source is None:
            return prior, None
        coupling = self.coupling_source()
        if coupling is None:
            return prior, "no learned models loaded"
        key = self._fleet_key(fleet)
        cached = self._learned
        if cached is None or cached[0] != id(coupling) or cached[1] != key:
            try:  # the fallback carries the policy's seeded prior (its cache model, burst term, corrections)
                cached = (id(coupling), key, LearnedPlanModel.for_pools(coupling, fleet.pools, fallback=prior), None)
            except KeyError as e:
                cached = (id(coupling), key, None, str(e).strip("'\""))
            self._learned = cached
        return (cached[2], None) if cached[2] is not None else (prior, cached[3])

    def _seed_from_capacity(self, m: QueueingPrior, fleet: FleetSpec) -> QueueingPrior:
        """Correction factors from a bench/operator load profile (p95 at known loads), if given."""
        if not self.capacity:
            return m
        kt, kp = list(m.ttft_correction), list(m.tpot_correction)
        for j, p in enumerate(fleet.pools):
            cap = self.capacity.get(p.name)
            if cap is None or not cap.profile_rps or cap.rps <= 0:
                continue
            prompt = cap.prompt_tokens_per_s / cap.rps if cap.prompt_tokens_per_s > 0 else 1000.0
            out = cap.generation_tokens_per_s / cap.rps if cap.generation_tokens_per_s > 0 else 200.0
            lam = np.array(cap.profile_rps)
            n = len(lam)
            ans = m.latency(LatencyQuery(pool_index=np.full(n, j), rps_per_replica=lam, prompt_tokens=np.full(n, prompt),
                                         output_tokens=np.full(n, out), hit_rate=np.zeros(n),
                                         inflight_cap=np.zeros(n), max_num_seqs=np.full(n, float(p.max_num_seqs)),
                                         max_num_batched_tokens=np.full(n, float(p.max_num_batched_tokens))))
            ok = ans.utilisation < 0.9
            if cap.profile_ttft_s and ok.any():
                r = np.array(cap.profile_ttft_s)[ok] / np.maximum(ans.ttft_p95_s[ok], 1e-9)
                kt[j] = float(np.clip(np.exp(np.median(np.log(np.maximum(r, 1e-9)))), *CORRECTION_BOUNDS))
            if cap.profile_tpot_s and ok.any():
                r = np.array(cap.profile_tpot_s)[ok] / np.maximum(ans.tpot_p95_s[ok], 1e-9)
                kp[j] = float(np.clip(np.exp(np.median(np.log(np.maximum(r, 1e-9)))), *CORRECTION_BOUNDS))
        return m.with_corrections(kt, kp, m.base_confidence)

    # ------------------------------------------------------------------ the tick

    def _accounted(self, state: MpcState, inp: PolicyInput,
                   prior: QueueingPrior) -> tuple[dict[str, MpcPoolMemory], dict[str, int]]:
        """Per pool: the memory brought up to date with this tick's telemetry, and the target in force."""
        fleet, now = inp.fleet, inp.now_s
        mem: dict[str, MpcPoolMemory] = {}
        targets: dict[str, int] = {}
        for spec in fleet.pools:
            m0 = state.pools.get(spec.name)
            if m0 is None:  # first sight: corrections start from the seeded prior (1 without a profile)
                j = [p.name for p in fleet.pools].index(spec.name)
                m0 = MpcPoolMemory(caps=(spec.max_num_seqs, spec.max_num_batched_tokens),
                                   log_k_ttft=math.log(prior.ttft_correction[j]),
                                   log_k_tpot=math.log(prior.tpot_correction[j]))
            po = inp.observation.pools.get(spec.name)
            target, _ = current_target(inp, spec)
            targets[spec.name] = target
            mem[spec.name] = self._account(m0, spec, po, target, now, state.last_s)
        return mem, targets

    def breaker_signals(self, state: MpcState, inp: PolicyInput) -> BreakerSignals:
        """For the breaker (run by Controller.step before `decide`): the replacements the fleet started
        this tick that nobody ordered, and whether the fleet carries its load (`_carried`)."""
        mem, _ = self._accounted(state, inp, self._prior(inp.fleet))
        return BreakerSignals(lost={p: m.unordered for p, m in mem.items()},
                              carried=self._carried(inp.observation, inp.fleet, state.need_now))

    def decide(self, state: MpcState, inp: PolicyInput, rng: np.random.Generator) -> tuple[MpcState, PolicyOutput]:
        started = self.timer() if self.timer is not None else None  # the wall budget covers the whole tick
        now = inp.now_s
        fleet = inp.fleet
        cfg = self.config
        weights = resolve_weights(inp.profile if inp.profile in ("cost", "balanced", "latency", "throughput")
                                  else "balanced", self.weights)
        prior = self._prior(fleet)
        reasons: list[Reason] = []
        obs = inp.observation

        # --- demand history and class mix
        demand, shares = self._demand(inp, state)
        t_hist, d_hist = state.t_hist, state.demand_hist
        first_s = state.first_s if state.first_s is not None else now
        # While warming the telemetry windows cover only the time since the first tick, so a reading
        # may read low: the history holds one reading, the highest so far, and starts for real once
        # warm. Holding the *first* reading hid a surge in the first minute: on the demo (3x surge
        # at 20 s) the forecast stayed at the 34 req/s read at 30 s until 75 s while 63 req/s arrived.
        warming = now - first_s < self.warmup_s
        if demand is not None and (not warming or not t_hist or demand > d_hist[-1]):
            keep = [(t, d) for t, d in zip(t_hist, d_hist) if now - t < HISTORY_KEEP_S and t < now]
            if warming:
                keep = []
            t_hist = tuple(t for t, _ in keep) + (now,)
            d_hist = tuple(d for _, d in keep) + (demand,)
        class_share = dict(state.class_share)
        for c, s in shares.items():
            class_share[c] = _ewma(class_share.get(c), s, 0.3)
        if not class_share:
            class_share = {c: 1.0 / len(fleet.slos) for c in fleet.slos} if fleet.slos else {"standard": 1.0}
        lead = (np.arange(plan_steps(cfg, self._pool_inputs_for_steps(fleet))) + 0.5) * cfg.step_s
        fc = self.forecaster.forecast(np.array(t_hist), np.array(d_hist), now, lead)

        # --- per pool: replicas on the way, warm slots, mix, reuse, corrections
        mem, targets = self._accounted(state, inp, prior)
        j_of = {p.name: j for j, p in enumerate(fleet.pools)}
        settled = len(t_hist) > 1 and t_hist[-1] - t_hist[0] >= self.min_history_s
        base_model, learned_unusable = self._plan_model(fleet, prior)
        mem, corr_diag = self._learn(mem, inp, base_model, j_of, settled)
        model: PlanModel = base_model.with_corrections(
            [math.exp(mem[p.name].log_k_ttft) for p in fleet.pools],
            [math.exp(mem[p.name].log_k_tpot) for p in fleet.pools],
            self._confidence(mem), burst=[mem[p.name].burst for p in fleet.pools])

        action = inp.breaker  # the breaker's constraints (Controller.step runs it: core/breaker.py)

        # --- the problem
        history_s = t_hist[-1] - t_hist[0] if len(t_hist) > 1 else 0.0
        problem = self._problem(inp, fleet, mem, targets, class_share, fc, weights, action, model, now, history_s)
        warm_shift = 0
        if state.plan is not None and state.plan_at_s is not None:
            warm_shift = int(round((now - state.plan_at_s) / cfg.step_s))
        result = solve(problem, model, cfg, rng, warm=state.plan, warm_shift=warm_shift, timer=self.timer,
                       started_s=started)

        # --- the first step → decisions (with scale-down stabilisation, longer when demand is bursty)
        down_window = down_window_s(t_hist, d_hist, now, self.down_window_s, self.bursty_window_s)
        pools_out: dict[str, PoolDecision] = {}
        new_mem: dict[str, MpcPoolMemory] = {}
        explain: list[tuple[PoolSpec, PoolInput, int, int, Any, PoolDecision | None]] = []
        for j, (spec, pin) in enumerate(zip(fleet.pools, problem.pools)):
            pp = result.plan.pools[spec.name]
            m = mem[spec.name]
            want = pp.replicas[0]
            cur = targets[spec.name]
            recs = tuple((t, n) for t, n in m.recs if now - t < self.bursty_window_s) + ((now, want),)
            final = want
            if want < cur and (warming or len(t_hist) < 2 or t_hist[-1] - t_hist[0] < self.min_history_s):
                final = cur
            elif want < cur:
                hold = max(n for t, n in recs if now - t < down_window)
                final = min(cur, max(want, hold))
                if final > want:
                    reasons.append(reason("scale_down_stabilised", spec.name,
                                          f"plan wants {want}; holding {final}: highest plan of the last "
                                          f"{down_window:.0f} s", proposal=want, stabilised=final,
                                          window_s=round(down_window, 1)))
            final = min(max(final, pin.lo), pin.hi)
            cur_pd = inp.current.pools.get(spec.name) if inp.current is not None else None
            caps = m.caps or (spec.max_num_seqs, spec.max_num_batched_tokens)
            new_caps = (pp.max_num_seqs, pp.max_num_batched_tokens)
            caps_changed_s = m.caps_changed_s
            rollout_left, rollout_seen_s = m.rollout_left, m.rollout_seen_s
            if new_caps != caps:
                caps_changed_s = now
                # every replica serving now restarts with the new caps (the fleet rolls them)
                rollout_left = m.serving if m.serving is not None else int(final)
                rollout_seen_s = now
            pools_out[spec.name] = PoolDecision(
                replicas=int(final), warm_standby=int(pp.standby), inflight_cap=int(pp.inflight_cap),
                traffic_weight=float(pp.traffic_weight), prefix_weight=float(pp.prefix_weight),
                queue_weight=cur_pd.queue_weight if cur_pd else 2.0, kv_weight=cur_pd.kv_weight if cur_pd else 2.0,
                max_num_seqs=int(new_caps[0]) if new_caps != (spec.max_num_seqs, spec.max_num_batched_tokens) else 0,
                max_num_batched_tokens=int(new_caps[1]) if new_caps != (spec.max_num_seqs,
                                                                        spec.max_num_batched_tokens) else 0)
            new_mem[spec.name] = replace(m, recs=recs, caps=new_caps, caps_changed_s=caps_changed_s,
                                        rollout_left=rollout_left, rollout_seen_s=rollout_seen_s)
            explain.append((spec, pin, cur, int(final), pp, cur_pd))
        # router weights for the targets applied (a held scale-down serves with its replicas too)
        weights_applied = applied_router_weights(problem, result.plan, {n: d.replicas for n, d in pools_out.items()},
                                                 cfg.step_s)
        pools_out = {n: replace(d, traffic_weight=float(weights_applied.get(n, d.traffic_weight)))
                     for n, d in pools_out.items()}
        for spec, pin, cur, final, pp, cur_pd in explain:
            pp = replace(pp, traffic_weight=pools_out[spec.name].traffic_weight)
            reasons.extend(self._pool_reasons(spec, pin, cur, final, pp, cur_pd, result, problem, now))
        admission: dict[str, ClassAdmission] = {}
        for c in PRIORITY_CLASSES:
            s = result.plan.shed.get(c, 0.0)
            if s > 0.005:
                admission[c] = ClassAdmission(shed_frac=round(s, 3))
        reasons.extend(self._class_reasons(state.shed_in_force, result.plan.shed, result, action))
        conf = self._confidence(new_mem)
        if conf < 0.2:
            reasons.append(reason("low_confidence", None, f"model confidence {conf:.2f}: predictions are uncertain",
                                  confidence=conf))
        diag = self._diagnostics(result, fc, class_share, model, corr_diag, problem)
        diag["model"]["planning_model"] = self.planning_model
        if learned_unusable:
            diag["model"]["learned_unusable"] = learned_unusable
        new_state = MpcState(t_hist=t_hist, demand_hist=d_hist, class_share=class_share, pools=new_mem,
                             plan=result.plan, plan_at_s=now, last_s=now, first_s=first_s,
                             shed_in_force={c: a.shed_frac for c, a in admission.items()},
                             need_now={n: int(pt["need_by_step_p90"][0]) for n, pt in result.terms["pools"].items()
                                       if pt.get("need_by_step_p90")})
        return new_state, PolicyOutput(pools=pools_out, admission=admission, reasons=tuple(reasons), diagnostics=diag,
                                       confidence=conf)

    @staticmethod
    def _carried(obs: FleetObservation, fleet: FleetSpec, need_now: Mapping[str, int]) -> bool | None:
        """Does the fleet carry the load it admits, now? Every pool has the replicas the last plan said
        its first step needs ready, and no queue stands anywhere (engines: at most one waiting request
        per ready replica; router: nothing held). None when a reading is missing. The breaker then
        reads a p95 over its SLO as the past's (a 60 s window still holds the backlog drained)."""
        if not need_now:
            return None
        for spec in fleet.pools:
            po = obs.pools.get(spec.name)
            ready = value(po.replicas_ready) if po is not None else None
            waiting = value(po.waiting) if po is not None else None
            if ready is None or waiting is None or spec.name not in need_now:
                return None
            if ready < need_now[spec.name] or _standing_queue(waiting, ready):
                return False
        for co in obs.classes.values():
            if (value(co.queue_depth) or 0.0) > 0.0:
                return False
        return True

    # ------------------------------------------------------------------ inputs

    @staticmethod
    def _pool_inputs_for_steps(fleet: FleetSpec) -> list[PoolInput]:
        return [PoolInput(name=p.name, model_index=j, group=p.group, role=p.role, usd_per_hour=0.0, lo=0, hi=0,
                          target=0, ready=0, startup_cold_s=p.startup_cold_s) for j, p in enumerate(fleet.pools)]

    def _demand(self, inp: PolicyInput, state: MpcState) -> tuple[float | None, dict[str, float]]:
        """Fleet demand (req/s, retries excluded) and the class mix; pool arrivals if the router is silent."""
        per: dict[str, float] = {}
        for c, co in inp.observation.classes.items():
            a = value(co.arrival_rps)
            if a is None:
                continue
            # arrivals count every attempt; a shed request comes back as retries. What was
            # admitted is a floor (an admitted retry counts once there).
            per[c] = max(a - (value(co.retry_rps) or 0.0), value(co.admitted_rps) or 0.0, 0.0)
        total = sum(per.values())
        if per and total > 0:
            return total, {c: v / total for c, v in per.items()}
        if per:
            return 0.0, {}
        served = [value(p.arrival_rps) for p in inp.observation.pools.values()]
        served = [s for s in served if s is not None]
        if served:
            return float(sum(served)), {}
        return None, {}

    def _account(self, m: MpcPoolMemory, spec: PoolSpec, po: PoolObservation | None, target: int, now: float,
                 last_s: float | None) -> MpcPoolMemory:
        """Bring the starting-replica ETAs and warm slots up to date with the target in force and telemetry."""
        ttl = self.warm_ttl_s
        warm = [t for t in m.warm if now - t < ttl]
        etas = sorted(m.etas)
        unordered = 0
        t_order = last_s if last_s is not None else now
        ready = value(po.replicas_ready) if po is not None else None
        starting = value(po.replicas_starting) if po is not None else None
        serving = m.serving
        if serving is None:
            serving = int(round((ready or 0) + (starting or 0))) if ready is not None else target
        if m.target is not None and target != m.target:
            if target > serving:  # replicas we ordered last tick: warm while warm slots last
                for _ in range(target - serving):
                    if warm:
                        warm.pop()
                        etas.append(t_order + spec.startup_warm_s)
                    else:
                        etas.append(t_order + spec.startup_cold_s)
            elif target < serving:  # starting ones are cancelled first (latest first), then ready ones drain
                cut = serving - target
                while cut and etas:
                    etas.pop()
                    cut -= 1
                warm.extend([t_order] * cut)
        rollout_left, rollout_seen_s = m.rollout_left, m.rollout_seen_s
        if ready is not None:  # scale-downs drain old-cap replicas first: never more left than serve
            rollout_left = min(rollout_left, int(round(ready)))
        if rollout_left and now - rollout_seen_s > spec.startup_cold_s + ROLLOUT_GAP_S:
            # no surge for longer than a start-up takes: the restart is over or never happened (the
            # decision was not applied: shadow mode, a freeze); later starts are crash replacements
            rollout_left = 0
        if starting is not None:
            n = int(round(starting))
            etas.sort()
            while len(etas) > n:  # the earliest became ready
                etas.pop(0)
            while len(etas) < n:
                if rollout_left > 0:
                    # the rolling restart's surge replica (maxSurge 1): new caps, weights on the node.
                    # Counting it as a crash replacement tripped the breaker on mooncake-conv (one
                    # surge among 3 replicas reads as a 33 % loss) and bought 6 replicas for nothing.
                    etas.append(now + spec.startup_warm_s)
                    rollout_left -= 1
                    rollout_seen_s = now
                else:  # started by the fleet itself (a crash replacement): cold
                    etas.append(now + spec.startup_cold_s)
                    unordered += 1
        fixed = []
        for e in etas:
            if e <= now:  # overdue: it was a cold start after all
                e2 = e - spec.startup_warm_s + spec.startup_cold_s
                fixed.append(e2 if e2 > now else now + 0.5 * self.config.step_s)
            else:
                fixed.append(e)
        etas = sorted(fixed)
        serving_now = int(round(ready)) + len(etas) if ready is not None else target
        # the traffic mix (EWMA of windowed token rates per request)
        prompt, out = m.prompt_tokens, m.output_tokens
        if po is not None:
            arr, ptok, gtok = value(po.arrival_rps), value(po.prompt_tokens_rps), value(po.generation_tokens_rps)
            if arr is not None and arr > 0.05:
                if ptok is not None and ptok > 0:
                    prompt = _ewma(prompt, ptok / arr, 0.3)
                if gtok is not None and gtok > 0:
                    out = _ewma(out, max(gtok / arr, 1.0), 0.3)
        return replace(m, etas=tuple(etas), warm=tuple(warm[-64:]), serving=serving_now, target=target,
                       prompt_tokens=prompt, output_tokens=out, unordered=unordered if m.serving is not None else 0,
                       rollout_left=rollout_left, rollout_seen_s=rollout_seen_s)

    def _learn(self, mem: dict[str, MpcPoolMemory], inp: PolicyInput, prior: PlanModel,
               j_of: Mapping[str, int], settled: bool = True) -> tuple[dict[str, MpcPoolMemory], dict[str, Any]]:
        """Update reuse estimates and the p95 correction factors from what was observed this tick."""
        fleet, obs = inp.fleet, inp.observation
        out = dict(mem)
        diag: dict[str, Any] = {}
        first_hop = [p for p in fleet.pools if p.role != "decode"]
        single = len(first_hop) == 1 and len({p.group for p in fleet.pools}) == 1
        cls_ttft = [value(c.ttft_p95_s) for c in obs.classes.values()]
        cls_tpot = [value(c.tpot_p95_s) for c in obs.classes.values()]
        cls_ttft = max((x for x in cls_ttft if x is not None), default=None)
        cls_tpot = max((x for x in cls_tpot if x is not None), default=None)
        for spec in fleet.pools:
            m = mem[spec.name]
            po = obs.pools.get(spec.name)
            if po is None:
                continue
            j = j_of[spec.name]
            ready, arr, hit = value(po.replicas_ready), value(po.arrival_rps), value(po.hit_rate)
            pd = inp.current.pools.get(spec.name) if inp.current is not None else None
            inf_hit = m.inf_hit
            if hit is not None:
                inf_hit = max(inf_hit * 0.999, min(0.99, hit * 1.02))
            m = replace(m, inf_hit=inf_hit)
            if not (ready and ready >= 1 and arr is not None and arr > 0.05 and m.prompt_tokens and m.output_tokens):
                out[spec.name] = m
                continue
            caps = m.caps or (spec.max_num_seqs, spec.max_num_batched_tokens)
            q = LatencyQuery(pool_index=np.array([j]), rps_per_replica=np.array([arr / ready]),
                             prompt_tokens=np.array([m.prompt_tokens]), output_tokens=np.array([m.output_tokens]),
                             hit_rate=np.array([hit if hit is not None else 0.0]),
                             inflight_cap=np.array([float(pd.inflight_cap) if pd else 0.0]),
                             max_num_seqs=np.array([float(caps[0])]), max_num_batched_tokens=np.array([float(caps[1])]))
            bursts = [mem[p.name].burst for p in fleet.pools]
            ones = [1.0] * len(bursts)
            a0 = prior.with_corrections(ones, ones, 0.0, [0.0] * len(bursts)).latency(q)  # smooth arrivals
            a = prior.with_corrections(ones, ones, 0.0, bursts).latency(q)  # with today's burst depth
            util = float(a0.utilisation[0])
            # The pool's own p95 TTFT is what the model predicts (all classes together); the worst
            # class's p95 carries the priority queue's wait of the least protected class (on
            # mooncake-conv sheddable read 14 s while critical read 1 s), and calibrating on it
            # bought replicas for critical that only sheddable's place in the queue explained.
            pool_ttft = value(po.ttft_p95_s)
            o_ttft = pool_ttft if pool_ttft is not None else (cls_ttft if single else None)
            # TPOT: the router's per-class p95 when one pool serves everything; else the pool's own
            # per-request TPOT p95 (vllm:request_time_per_output_token_seconds, what the model predicts
            # and the SLO judges); an engine without it: its per-token ITL p95, scaled down (chunked-
            # prefill steps put the per-token p95 above the per-request one)
            req_tpot, itl = value(po.request_tpot_p95_s), value(po.tpot_p95_s)
            o_tpot = cls_tpot if single else (req_tpot if req_tpot is not None else (itl * 0.8 if itl is not None else None))
            lk_t, lk_p, err, n, burst = m.log_k_ttft, m.log_k_tpot, m.err, m.samples, m.burst
            d: dict[str, Any] = {"util": round(util, 3)}
            if util < 0.9:
                errs = []
                queue_free = not _standing_queue(value(po.waiting), ready)
                if o_tpot is not None and o_tpot > 0:
                    fluid = max(float(a0.tpot_p95_s[0]), 1e-9)
                    pred = float(a.tpot_p95_s[0]) * math.exp(lk_p)
                    errs.append(abs(math.log(o_tpot / max(pred, 1e-9))))
                    calm = util < 0.7 and queue_free and settled  # arrivals themselves, not a backlog
                    if o_tpot > BURST_EVIDENCE * fluid and calm:
                        # above what smooth arrivals explain: prompts come in bursts (chunk-bound
                        # steps); what a full chunk per step cannot explain goes to the factor
                        full_d = float(caps[1]) / max(float(q.prompt_tokens[0]) * (1 - float(q.hit_rate[0]))
                                                      * float(q.rps_per_replica[0]), 1e-6)
                        full = float(prior.with_corrections(ones, ones, 0.0, [full_d if k == j else 0.0
                                                                               for k in range(len(bursts))])
                                     .latency(q).tpot_p95_s[0])
                        target = prior.burst_for(q, o_tpot, hi=full_d) if o_tpot < full else full_d
                        # a decaying maximum, not a mean: the p95 is set by the bursty windows
                        burst = max(burst * BURST_DECAY, min(target, 2 * burst + 0.5))
                        lk_p = _step(lk_p, math.log(max(o_tpot / max(full, 1e-9), 1.0)), self.alpha)
                    elif o_tpot <= BURST_EVIDENCE * fluid:
                        burst = burst * BURST_DECAY
                        # while a burst is remembered the prediction is max(smooth, burst term) × k:
                        # k carries only what that does not explain (as in the branch above), else a
                        # factor learned against the smooth model multiplies the burst term too.
                        # Example (mooncake-conv, 630 s): smooth 0.024 s, burst term 0.057 s,
                        # observed 0.045 s: k → 1 (not 1.9), predicted 0.057 s (not 0.11 s).
                        ref = max(float(a.tpot_p95_s[0]), 1e-9) if burst > 0 else fluid
                        r = o_tpot / ref
                        lk_p = _step(lk_p, math.log(max(r, 1.0) if burst > 0 else r), self.alpha)
                    d["tpot_obs_over_smooth"] = round(o_tpot / fluid, 3)
                # TTFT: learned only from windows without a standing queue. A backlog's wait is the
                # planner's own fluid term (added at plan time); a window that carries one, folded
                # into the factor too, counts it twice for every later plan (on mooncake-conv the
                # factor swung between ×1.1 and ×2.2 with such windows, ×0.9-1.7 without them, and
                # kept a replica too many in quiet stretches: 0.0093 → 0.0083 $ per successful task
                # with the rule, critical and standard still ≥ 99.8 %).
                if o_ttft is not None and o_ttft > 0 and queue_free:
                    r = math.log(o_ttft / max(float(a.ttft_p95_s[0]), 1e-9))
                    errs.append(abs(r - lk_t))
                    lk_t = _step(lk_t, r, self.alpha)
                    d["ttft_obs_over_prior"] = round(math.exp(r), 3)
                if errs:
                    err = (1 - self.alpha) * err + self.alpha * max(errs)
                    n += 1
            lo, hi = (math.log(x) for x in CORRECTION_BOUNDS)
            lk_t, lk_p = min(max(lk_t, lo), hi), min(max(lk_p, lo), hi)
            d.update(k_ttft=round(math.exp(lk_t), 3), k_tpot=round(math.exp(lk_p), 3), burst=round(burst, 2))
            diag[spec.name] = d
            out[spec.name] = replace(m, log_k_ttft=lk_t, log_k_tpot=lk_p, err=err, samples=n, burst=burst)
        return out, diag

    @staticmethod
    def _confidence(mem: Mapping[str, MpcPoolMemory]) -> float:
        """exp(−error) of the worst pool's recent corrected predictions; low until it has seen data."""
        if not mem:
            return 0.3
        vals = []
        for m in mem.values():
            seen = min(1.0, m.samples / 8.0)
            vals.append((0.3 * (1 - seen) + seen * math.exp(-m.err)))
        return float(min(vals))

    def _reuse(self, spec: PoolSpec, m: MpcPoolMemory, po: PoolObservation | None, pd: PoolDecision | None,
               prior: PlanModel, j: int, ready: float) -> tuple[float, float]:
        """(inf_hit, working set tokens) consistent with today's hit at today's affinity and replicas."""
        hit = value(po.hit_rate) if po is not None else None
        if m.inf_hit <= 0.01 or hit is None:
            return m.inf_hit, 0.0
        kv = float(prior.kv_tokens()[j])
        aff = float(affinity(np.array(pd.prefix_weight if pd else 3.0),
                             np.array((pd.queue_weight + pd.kv_weight) if pd else 4.0)))
        k_eff = kv * 0.8 * (aff * max(ready, 1.0) + 1.0 - aff)
        cover = (min(hit, m.inf_hit) / m.inf_hit) ** 2
        ws = k_eff * 0.5 if cover >= 0.97 else k_eff / max(cover, 0.02)
        return m.inf_hit, ws

    def _safe_batch(self, model: PlanModel, j: int, m: MpcPoolMemory, spec: PoolSpec, tpot_slo: float,
                    hit: float) -> int:
        """In-flight cap per replica at which predicted p95 TPOT stays within 90 % of the tightest SLO."""
        lam = np.linspace(0.02, 1.0, 60) * 40.0
        n = len(lam)
        caps = m.caps or (spec.max_num_seqs, spec.max_num_batched_tokens)
        a = model.latency(LatencyQuery(pool_index=np.full(n, j), rps_per_replica=lam,
                                       prompt_tokens=np.full(n, m.prompt_tokens or 1000.0),
                                       output_tokens=np.full(n, m.output_tokens or 200.0), hit_rate=np.full(n, hit),
                                       inflight_cap=np.zeros(n), max_num_seqs=np.full(n, float(caps[0])),
                                       max_num_batched_tokens=np.full(n, float(caps[1]))))
        ok = (a.tpot_p95_s <= 0.9 * tpot_slo) & (a.utilisation < 1.0)
        if not ok.any():
            return 8
        return int(max(8, math.ceil(float(a.batch[ok].max()))))

    def _problem(self, inp: PolicyInput, fleet: FleetSpec, mem: Mapping[str, MpcPoolMemory],
                 targets: Mapping[str, int], class_share: Mapping[str, float], fc, weights,
                 action: BreakerAction, model: PlanModel, now: float, history_s: float) -> PlanProblem:
        obs = inp.observation
        pools: list[PoolInput] = []
        tpot_slo = min((s.tpot_s for s in fleet.slos.values()), default=math.inf)
        # the slow lever is reviewed only in steady state: enough history, a trusted model, no breaker
        steady = history_s >= self.min_history_s
        groups: dict[str, float] = {}
        for j, spec in enumerate(fleet.pools):
            m = mem[spec.name]
            po = obs.pools.get(spec.name)
            pd = inp.current.pools.get(spec.name) if inp.current is not None else None
            lo, hi = spec.min_replicas, spec.max_replicas
            frozen = False
            for o in inp.overrides:
                if o.pool != spec.name or not o.active(now):
                    continue
                v = int(round(o.value))
                if o.kind == "pin_replicas":
                    lo = hi = min(max(v, spec.min_replicas), spec.max_replicas)
                elif o.kind == "min_replicas":
                    lo = max(lo, min(v, hi))
                elif o.kind == "max_replicas":
                    hi = max(min(hi, v), lo)
                elif o.kind == "freeze":
                    frozen = True
            target = targets[spec.name]
            floor = action.min_replicas.get(spec.name)
            if floor is not None and lo < hi:
                lo = min(max(lo, floor), hi)
            if frozen:
                lo = hi = target
            ready = value(po.replicas_ready) if po is not None else None
            ready_n = int(round(ready)) if ready is not None else max(target - len(m.etas), 0)
            waiting = (value(po.waiting) or 0.0) if po is not None else 0.0
            arr = value(po.arrival_rps) if po is not None else None
            if arr is not None:
                groups[spec.group] = groups.get(spec.group, 0.0) + arr
            hit = (value(po.hit_rate) if po is not None else None) or 0.0
            inf_hit, ws = self._reuse(spec, m, po, pd, model, j, ready_n)
            caps = m.caps or (spec.max_num_seqs, spec.max_num_batched_tokens)
            max_cap = None
            if action.protect_streams and spec.name in action.pools and self.protect_streams:
                # Cap at the SLO-safe batch. A router cap must not lock critical requests out of a
                # priority-ordered engine queue that is still deep with older work (more than one
                # queued request per replica): then never below what the replicas already hold (it
                # bites as the backlog drains). With a shallow queue the streams already running are
                # what the cap protects, so it bites at once: on azure-conv-crash a floor at the 98
                # streams per replica the survivors held kept TPOT at 0.16 s for a minute
                # (critical 0.984 → 0.989, standard 0.916 → 0.922 without it).
                held = ((value(po.running) or 0.0) + waiting) / max(ready_n, 1) if po is not None else 0.0
                deep = _standing_queue(waiting, ready_n)
                max_cap = max(self._safe_batch(model, j, m, spec, tpot_slo, hit), int(math.ceil(held)) if deep else 0)
            pools.append(PoolInput(
                name=spec.name, model_index=j, group=spec.group, role=spec.role,
                usd_per_hour=spec.usd_per_replica_hour, lo=lo, hi=hi, target=min(max(target, lo), hi) if not frozen
                else target, ready=ready_n, starting_eta_s=tuple(max(e - now, 0.0) for e in m.etas),
                warm_slots=len(m.warm), startup_warm_s=spec.startup_warm_s, startup_cold_s=spec.startup_cold_s,
                standby=pd.warm_standby if pd else 0, prefix_weight=pd.prefix_weight if pd else 3.0,
                load_weight=(pd.queue_weight + pd.kv_weight) if pd else 4.0,
                inflight_cap=pd.inflight_cap if pd else 0,
                traffic_weight=pd.traffic_weight if pd else 1.0,
                max_num_seqs=int(caps[0]), max_num_batched_tokens=int(caps[1]),
                prompt_tokens=m.prompt_tokens or 1000.0, output_tokens=m.output_tokens or 200.0, hit_rate=hit,
                reuse_inf_hit=inf_hit, reuse_working_set=ws, backlog=waiting, frozen=frozen,
                max_prefix_weight=action.max_prefix_weight.get(spec.name), max_inflight_cap=max_cap,
                batch_review=self.batch_review_s > 0 and now - m.caps_changed_s >= self.batch_review_s
                and ready_n > 0 and steady and m.burst >= 0.2))
        classes: list[ClassInput] = []
        z = float(ndtri(weights.plan_quantile)) / float(ndtri(0.9))  # 0.75 → 0.53 of the way to p90
        plan_q = fc.p50 + z * (fc.p90 - fc.p50)
        for c in PRIORITY_CLASSES:
            if c not in fleet.slos:
                continue
            s = fleet.slos[c]
            share = class_share.get(c, 0.0)
            co = obs.classes.get(c)
            shed_now = 0.0
            cur_adm = inp.current.admission.get(c) if inp.current is not None else None
            if cur_adm is not None:
                shed_now = cur_adm.shed_frac
            classes.append(ClassInput(
                name=c, ttft_slo_s=s.ttft_s, tpot_slo_s=s.tpot_s,
                p50_rps=tuple(float(x) * share for x in fc.p50), p90_rps=tuple(float(x) * share for x in plan_q),
                shed_now=shed_now, min_shed=float(action.min_shed.get(c, 0.0)), max_shed=1.0,
                backlog=(value(co.queue_depth) or 0.0) if co is not None else 0.0))
        total = sum(groups.values())
        gshare = {g: v / total for g, v in groups.items()} if total > 0 else {}
        held = sum((value(co.queue_depth) or 0.0) for co in obs.classes.values())
        pools = _activate(pools, groups, fc.level > 0 or held > 0)
        return PlanProblem(pools=tuple(pools), classes=tuple(classes), weights=weights, group_share=gshare)

    # ------------------------------------------------------------------ explanation

    def _pool_reasons(self, spec: PoolSpec, pin: PoolInput, cur: int, final: int, pp, cur_pd: PoolDecision | None,
                      result: PlanResult, problem: PlanProblem, now: float) -> list[Reason]:
        out: list[Reason] = []
        t = result.terms["pools"][spec.name]
        need = t["need_by_step_p90"]
        late = result.terms.get("late_or_shed_frac_p90", {})
        worst = max(late, key=lambda c: late[c]) if late else None
        tail = (f"; the p95s fit {max(need)}, the plan keeps {final} for the tail (predicted late-or-shed share "
                f"at p90 load: {worst} {late[worst]:.1%})" if worst is not None else "")
        if final > cur:
            soon = need[0] > cur
            when = next((k for k, n in enumerate(need) if n > cur), None)
            if when is None:
                # no step's p95 needs more than the current count: a floor (breaker replacements, an
                # override) or the chance constraint (requests beyond the p95) bought it; say which,
                # not "needs 3" next to a scale-up to 5
                code = "mpc_scale_up"
                msg = (f"{cur}→{final}: held at the floor {pin.lo} (breaker replacements or an override)"
                       if final <= pin.lo else f"{cur}→{final}{tail}")
            else:
                code = "mpc_scale_up" if soon else "mpc_scale_up_early"
                msg = (f"{cur}→{final}: p90 load needs {max(need[: when + 1])} now" if soon else
                       f"{cur}→{final}: forecast p90 needs {max(need)} by +{(when + 0.5) * self.config.step_s:.0f} s; "
                       f"start-up takes {spec.startup_warm_s:g}-{spec.startup_cold_s:g} s")
                if final > max(need):
                    msg += tail
            out.append(reason(code, spec.name, msg, before=cur, after=final, need_by_step=need))
        elif final < cur:
            kept = (f" (keeps {final} for the tail: predicted late-or-shed share at p90 load {worst} "
                    f"{late[worst]:.1%})" if worst is not None and final > max(need) else "")
            out.append(reason("mpc_scale_down", spec.name,
                              f"{cur}→{final}: p90 load over the horizon needs at most {max(need)}{kept}; "
                              f"saves ${(cur - final) * spec.usd_per_replica_hour:.2f}/h",
                              before=cur, after=final, need_by_step=need))
        if final >= spec.max_replicas and max(need) > spec.max_replicas:
            out.append(reason("binding_max_replicas", spec.name,
                              f"at the pool maximum {spec.max_replicas}; the p90 load needs {max(need)}",
                              need=max(need)))
        if pin.lo == pin.hi and not pin.frozen and pin.lo != spec.min_replicas:
            out.append(reason("binding_pin", spec.name, f"pinned to {pin.lo} by an override: planning around it"))
        if cur_pd is not None:
            if abs(pp.prefix_weight - cur_pd.prefix_weight) > 0.25:
                out.append(reason("lever_avoid", spec.name,
                                  f"cache-affinity weight {cur_pd.prefix_weight:g}→{pp.prefix_weight:g}"
                                  f" (predicted hit rate {t['hit_rate'][min(2, len(t['hit_rate']) - 1)]:.2f})",
                                  before=cur_pd.prefix_weight, after=pp.prefix_weight))
            if pp.inflight_cap != cur_pd.inflight_cap:
                out.append(reason("lever_share", spec.name,
                                  f"in-flight cap per replica {cur_pd.inflight_cap or 'none'}→{pp.inflight_cap or 'none'}",
                                  before=cur_pd.inflight_cap, after=pp.inflight_cap))
            if abs(pp.traffic_weight - cur_pd.traffic_weight) > 0.02:
                out.append(reason("lever_move", spec.name,
                                  f"traffic weight {cur_pd.traffic_weight:g}→{pp.traffic_weight:g}",
                                  before=cur_pd.traffic_weight, after=pp.traffic_weight))
            if pp.standby != cur_pd.warm_standby:
                out.append(reason("lever_standby", spec.name, f"warm standby {cur_pd.warm_standby}→{pp.standby}"))
        if (pp.max_num_seqs, pp.max_num_batched_tokens) != (pin.max_num_seqs, pin.max_num_batched_tokens):
            out.append(reason("lever_share", spec.name,
                              f"engine batch caps → max_num_seqs {pp.max_num_seqs}, max_num_batched_tokens "
                              f"{pp.max_num_batched_tokens} (rolling restart)",
                              max_num_seqs=pp.max_num_seqs, max_num_batched_tokens=pp.max_num_batched_tokens))
        return out

    @staticmethod
    def _class_reasons(before: Mapping[str, float], after: Mapping[str, float], result: PlanResult,
                       action: BreakerAction) -> list[Reason]:
        out = []
        for c in PRIORITY_CLASSES:
            a, b = before.get(c, 0.0), after.get(c, 0.0)
            if abs(a - b) > 0.005:
                why = ("breaker floor" if action.min_shed.get(c, 0.0) >= b - 1e-9 and action.min_shed.get(c) else
                       f"predicted late-or-shed share at p90 load {result.terms['late_or_shed_frac_p90'].get(c, 0.0):.1%}")
                out.append(reason("lever_delay", None, f"{c} shed fraction {a:.2f}→{b:.2f} ({why})",
                                  priority_class=c, before=a, after=b))
        return out

    def _diagnostics(self, result: PlanResult, fc, class_share, model: PlanModel, corr: Mapping[str, Any],
                     problem: PlanProblem) -> dict[str, Any]:
        binding = []
        for p in problem.pools:
            need = result.terms["pools"][p.name]["need_by_step_p90"]
            if max(need) >= p.hi and p.hi < 10**6:
                binding.append(f"{p.name}: max replicas {p.hi}")
            if p.lo == p.hi:
                binding.append(f"{p.name}: pinned at {p.lo}")
        for c, x in result.terms["risk_excess"].items():
            if x > 0:
                binding.append(f"{c}: SLO risk above tolerance by {x:.2%}")
        return {
            "forecast": {"lead_s": [float(x) for x in fc.lead_s], "p50_rps": [round(float(x), 3) for x in fc.p50],
                         "p90_rps": [round(float(x), 3) for x in fc.p90], "level_rps": round(fc.level, 3),
                         "trend_rps_per_s": round(fc.trend_per_s, 5), "class_share": dict(class_share)},
            "plan": {p: {"replicas": list(pp.replicas), "standby": pp.standby, "prefix_weight": pp.prefix_weight,
                         "inflight_cap": pp.inflight_cap, "traffic_weight": pp.traffic_weight,
                         "max_num_seqs": pp.max_num_seqs, "max_num_batched_tokens": pp.max_num_batched_tokens}
                     for p, pp in result.plan.pools.items()},
            "shed": dict(result.plan.shed),
            "predicted": {k: v for k, v in result.terms.items() if k != "pools"},
            "pools": result.terms["pools"],
            "binding_constraints": binding,
            "objective": result.objective, "objective_plan_in_force": result.incumbent_objective,
            "evaluations": result.evaluations, "budget_exhausted": result.budget_exhausted,
            "model": {"corrections": dict(corr), "kind": type(model).__name__},
        }
