"""Governor's MPC policy: the Policy adapter around the planner in controller/core/mpc/.

Each tick it turns telemetry and its own memory into a `PlanProblem`, runs the planner
(`controller.core.mpc.solve`), and turns the plan's first step into pool decisions and
class admission, with reasons a human can follow. The concerns live beside this class:

- memory.py: what it keeps between ticks (all in the frozen `MpcState`, never in the object):
  demand history and class mix, per pool the replicas on their way, warm slots, traffic mix
  and reuse; the previous plan (the solver's warm start) and the replicas its first step
  needed (the breaker's "does the fleet carry its load");
- corrections.py: the online correction factors for the model's p95 TTFT and TPOT, which
  also give the model's confidence (`PolicyOutput.confidence`);
- plan_inputs.py: the `PlanProblem` (bounds, levers, breaker constraints, scale from zero, the
  redundancy floor: a pool with traffic keeps `min_serving_replicas`, default 2, so that one
  replica's crash or slowdown does not take the pool's traffic down, 1 turns it off; and the
  stream guard: a standing ceiling on each pool's in-flight cap at the batch its engine runs within
  the tightest protected TPOT SLO, so a surge faster than a tick waits at the router in priority
  order instead of slowing every stream, `stream_guard`, default true);
- first_step.py: the plan's first step → decisions (scale-down stabilisation, router weights);
- task_levers.py: the delay quadrant's task levers from the plan: step-aware admission where the plan sheds and
  the measured step profile (`FleetEstimate.tasks`) says later steps carry sunk work, each tenant's fair share of
  the admitted capacity under predicted overload;
- reasons.py: reasons and diagnostics.

Slow replicas (controller/core/outliers.py) are detected, ejected and replaced by `Controller.step`
too, configured on the Controller like the breaker (the `outliers` entry of the MPC's parameters, on
by default, decision 0035; false turns it off, a mapping of OutlierConfig fields tunes it:
policies/registry.py outliers_for). The plan is made without the ejected replicas (`PolicyInput` is
the Controller's `planning_view`: the pool less them), and their slots go back on the target after it.

The cascading-failure breaker (controller/core/breaker.py) runs in `Controller.step`, configured on the
Controller (the `breaker` entry of the MPC's parameters, see policies/registry.py); it reads the core's
estimate (the crash replacements the replica accounting saw, and whether the fleet carries the load
the policy said it needs: `PolicyOutput.needs`), and the plan is made within the constraints it hands
over in `PolicyInput.breaker` (replica floors, affinity ceiling, the SLO-safe in-flight cap, shed floors).

Profiles: the objective's weights come from `PolicyInput.profile` (cost / balanced /
latency / throughput, changeable at run time through PolicyService) merged with the
explicit `weights` parameter. The reliability dial (controller/core/objective.py: the probability
that demand through the longest start-up stays within what the plan provisions for) is, first
found: a live `reliability` override (`PolicyInput.reliability`), the `reliability` parameter,
the profile's own setting (dial.py); diagnostics["reliability"] says which, and what it bought.
Engine figures come from `engine_figures` (per pool) or the
built-in profiled table; `capacity` (per-pool ReplicaCapacity, as the bench profiles it for
the SLA planner) only seeds the correction factors. `timer` is a monotonic clock for a wall-time
budget; without a timer the budget is a count of scored candidates.

What the planner predicts with (`planning_model`): "prior" (default) = the queueing prior
(`QueueingPrior`) with the policy's online correction factors; "learned" = the learned coupling
models (controller/core/coupling/) through `LearnedPlanModel`, read each tick from
`coupling_source` — a callable returning the current `CouplingModels` (the daemon passes its
model slot, so a refit that passed the validation gate is planned on from the next tick; the
bench passes the shipped models/). If the models have no physics for a pool, the tick plans on
the prior and diagnostics["model"]["learned_unusable"] says why. `models` injects any other
PlanModel (tests) and wins over both.

Pure: no I/O, no clock (time is PolicyInput.now_s; a timer only if injected); does not
import telemetry/actuation/api/runtime/gen, grpc or prometheus clients.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from controller.core.estimate import EstimatorConfig, account_fleet, decided_caps
from controller.core.forecast import LearnedForecaster, PriorForecaster
from controller.core.mpc import MpcConfig, plan_steps, solve
from controller.core.mpc_model import LearnedPlanModel, PlanModel, QueueingPrior
from controller.core.objective import check_reliability, resolve_weights
from controller.names import PROFILES
from controller.perf.engine_figures import EngineFigures
from controller.perf.replica_capacity import ReplicaCapacity
from controller.policies.common import check_positive, reason
from controller.policies.mpc.corrections import confidence, learn, seed_from_capacity
from controller.policies.mpc.dial import dial_diagnostics, dial_in_force
from controller.policies.mpc.feedback import measure
from controller.policies.mpc.first_step import down_window_s, first_step
from controller.policies.mpc.forecasting import forecast
from controller.policies.mpc.memory import MpcState, accounted
from controller.policies.mpc.plan_inputs import (
    build_problem,
    memory_headrooms,
    pool_inputs_for_steps,
    redundancy_floors,
    split_floors,
    stream_guards,
)
from controller.policies.mpc.reasons import (
    backlog_reasons,
    class_reasons,
    diagnostics,
    guard_reasons,
    memory_reasons,
    pin_cause,
    planner_status,
    pool_reasons,
    redundancy_reasons,
    task_diagnostics,
    task_reasons,
)
from controller.policies.mpc.reserve import Spills, reserve, spill_s, timing
from controller.policies.mpc.task_levers import step_admission, tenant_limits
from controller.types import (
    PRIORITY_CLASSES,
    ClassAdmission,
    FleetEstimate,
    FleetSpec,
    PolicyInput,
    PolicyOutput,
    Reason,
)

# what the planner predicts with: the queueing prior (+ online corrections) or the learned coupling models
PLANNING_MODELS = ("prior", "learned")


class MpcPolicy:
    """Model-predictive control of every lever (see the module docstring). The class composes the
    concerns of its package; it holds configuration and model caches, never tick state."""

    name = "mpc"

    def __init__(self, *, horizon_steps: int = 10, step_s: float = 30.0, max_evaluations: int = 4000,
                 time_budget_s: float = 0.2, weights: Mapping[str, Any] | None = None,
                 engine_figures: Mapping[str, Any] | None = None,
                 capacity: Mapping[str, ReplicaCapacity | Mapping[str, Any]] | None = None,
                 scale_down_stabilization_s: float = 120.0, bursty_down_window_s: float = 600.0,
                 warm_node_ttl_s: float = 600.0, batch_review_s: float = 1200.0,
                 correction_alpha: float = 0.15, client_retries: int = 2, standby_cost_frac: float = 1.0,
                 warmup_s: float = 60.0, min_history_s: float = 300.0, planner: Mapping[str, Any] | None = None,
                 protect_streams: bool = True, stream_guard: bool = True, min_serving_replicas: int = 2,
                 reliability: float | None = None,
                 planning_model: str = "prior", coupling_source: Callable[[], Any] | None = None,
                 forecast_source: Callable[[], Any] | None = None,
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
        self.reliability = None if reliability is None else check_reliability(reliability, "mpc.reliability")
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
        if not isinstance(stream_guard, bool):
            raise ValueError(f"mpc.stream_guard must be true or false (got {stream_guard!r})")
        self.stream_guard = stream_guard
        if isinstance(min_serving_replicas, bool) or not isinstance(min_serving_replicas, int) \
                or min_serving_replicas < 1:
            raise ValueError(f"mpc.min_serving_replicas must be an integer >= 1 (got {min_serving_replicas!r})")
        self.min_serving = min_serving_replicas
        if self.alpha > 1:
            raise ValueError(f"mpc.correction_alpha must be in (0, 1] (got {correction_alpha!r})")
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
        self.forecast_source = forecast_source
        self._learned_fc: tuple[int, LearnedForecaster] | None = None
        self._model_cache: dict[tuple[str, ...], QueueingPrior] = {}

    def initial_state(self) -> MpcState:
        return MpcState()

    # ------------------------------------------------------------------ models

    @staticmethod
    def _fleet_key(fleet: FleetSpec) -> tuple[str, ...]:
        """What the models built for a fleet depend on: each pool's name, engine and role."""
        return tuple(f"{p.name}:{p.model}:{p.sku}:{p.gpus_per_replica}:{p.role}" for p in fleet.pools)

    def _prior(self, fleet: FleetSpec) -> QueueingPrior:
        key = self._fleet_key(fleet)
        m = self._model_cache.get(key)
        if m is None:
            m = QueueingPrior.for_pools(fleet.pools, self.engine_figures)
            m = seed_from_capacity(m, fleet, self.capacity)
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

    def _learned_forecaster(self) -> LearnedForecaster | None:
        """The learned forecaster of this tick (the source's current model), or None."""
        model = self.forecast_source() if self.forecast_source is not None else None
        if model is None:
            return None
        if self._learned_fc is None or self._learned_fc[0] != id(model):
            self._learned_fc = (id(model), LearnedForecaster(model))
        return self._learned_fc[1]

    def estimator(self) -> EstimatorConfig:
        """How the core's replica accounting reads the fleet under this policy's parameters."""
        return EstimatorConfig(warm_node_ttl_s=self.warm_ttl_s, step_s=self.config.step_s, warmup_s=self.warmup_s)

    def _estimate(self, state: MpcState, inp: PolicyInput) -> FleetEstimate:
        """The core's estimate of this tick: the Controller's (`inp.estimate`), or, driven without one
        (tests), the same estimator advanced here from the last one the policy kept."""
        if inp.estimate is not None:
            return inp.estimate
        return account_fleet(FleetEstimate(at_s=inp.now_s, observation=inp.observation), state.estimate,
                             inp.fleet, inp.current, self.estimator())

    # ------------------------------------------------------------------ the tick

    def decide(self, state: MpcState, inp: PolicyInput, rng: np.random.Generator) -> tuple[MpcState, PolicyOutput]:
        started = self.timer() if self.timer is not None else None  # the wall budget covers the whole tick
        now = inp.now_s
        fleet = inp.fleet
        cfg = self.config
        profile = inp.profile if inp.profile in PROFILES else "balanced"
        weights, dial_source = dial_in_force(resolve_weights(profile, self.weights), profile, self.reliability,
                                             inp.reliability)
        prior = self._prior(fleet)
        reasons: list[Reason] = []

        # --- demand history, class mix, forecast
        est = self._estimate(state, inp)  # the core's: replica accounting and demand history
        t_hist, d_hist, warming, class_share = est.t_hist, est.demand_hist, est.warming, dict(est.class_share)
        lead = (np.arange(plan_steps(cfg, pool_inputs_for_steps(fleet))) + 0.5) * cfg.step_s
        startup = max((p.startup_cold_s for p in fleet.pools), default=0.0)
        fc, board, fc_method = forecast(self.forecaster, self._learned_forecaster(), state.forecast_board,
                                        np.array(t_hist), np.array(d_hist), now, lead, startup,
                                        est.demand_rps)

        # --- per pool: replicas on the way, warm slots, mix (the core's estimate), reuse, corrections
        mem, targets = accounted(state, inp, est, prior)
        j_of = {p.name: j for j, p in enumerate(fleet.pools)}
        settled = len(t_hist) > 1 and t_hist[-1] - t_hist[0] >= self.min_history_s
        base_model, learned_unusable = self._plan_model(fleet, prior)
        mem, corr_diag = learn(mem, inp, base_model, j_of, settled, alpha=self.alpha)
        model: PlanModel = base_model.with_corrections(
            [math.exp(mem[p.name].log_k_ttft) for p in fleet.pools],
            [math.exp(mem[p.name].log_k_tpot) for p in fleet.pools],
            confidence(mem), burst=[mem[p.name].burst for p in fleet.pools])

        action = inp.breaker  # the breaker's constraints (Controller.step runs it: core/breaker.py)
        # a measured backlog sets floors within this tick, whatever the model predicts (feedback.py)
        dt = now - state.last_s if state.last_s is not None else None
        fb = measure(inp.observation, fleet, mem, state.waiting, dt, class_share, est.demand_rps)

        # --- the problem
        history_s = t_hist[-1] - t_hist[0] if len(t_hist) > 1 else 0.0
        headroom = memory_headrooms(inp, mem)  # framebuffer: may the batch caps rise (plan_inputs.py)
        # no pool with traffic on one replica (plan_inputs.py): a bound of the plan, or of the decision for a shared hop
        redundant = redundancy_floors(fleet, inp.observation.pools, self.min_serving)
        plan_floors, decision_floors = split_floors(fleet, redundant)
        # the engines never run a batch that breaks the tightest protected TPOT: the excess waits at the router
        guards = (stream_guards(prior, fleet, mem, inp.observation.pools, cfg.min_inflight_cap)
                  if self.stream_guard else {})
        problem = build_problem(inp, fleet, mem, targets, class_share, fc, weights, action, model, now, history_s,
                                min_history_s=self.min_history_s, batch_review_s=self.batch_review_s,
                                protect_streams=self.protect_streams, feedback=fb, headroom=headroom,
                                redundancy=plan_floors, guards=guards)
        warm_shift = 0
        if state.plan is not None and state.plan_at_s is not None:
            warm_shift = int(round((now - state.plan_at_s) / cfg.step_s))
        # with a timer, the search stops early by what recent ticks spent after it (reserve.py)
        kept_back = reserve(state.spills, len(fleet.pools), cfg) if self.timer is not None else None
        result = solve(problem, model, cfg, rng, warm=state.plan, warm_shift=warm_shift, timer=self.timer,
                       started_s=started, reserve_s=None if kept_back is None else kept_back.seconds)

        # --- the first step → decisions (with scale-down stabilisation, longer when demand is bursty)
        down_window = down_window_s(t_hist, d_hist, now, self.down_window_s, self.bursty_window_s)
        pools_out, new_mem, held, applied = first_step(
            fleet, problem, result, mem, targets, inp.current, now, warming=warming, t_hist=t_hist,
            down_window=down_window, bursty_window_s=self.bursty_window_s, min_history_s=self.min_history_s,
            step_s=cfg.step_s, tick_s=inp.tick_s, floors=decision_floors)
        reasons.extend(held)
        for spec, pin, cur, final, pp, cur_pd in applied:
            pp = replace(pp, traffic_weight=pools_out[spec.name].traffic_weight)
            reasons.extend(pool_reasons(spec, pin, cur, final, pp, cur_pd, result, cfg.step_s,
                                        pinned_by=pin_cause(spec, pin, inp, action, fb, plan_floors)))
        admission: dict[str, ClassAdmission] = {}
        for c in PRIORITY_CLASSES:
            s = result.plan.shed.get(c, 0.0)
            if s > 0.005:
                admission[c] = ClassAdmission(shed_frac=round(s, 3))
        reasons.extend(class_reasons(state.shed_in_force, result.plan.shed, result, action, fb))
        # the delay quadrant's task levers: step-aware admission and tenant limits, from the plan (task_levers.py)
        steps = step_admission(result, inp.observation, now, state.step_aware_until_s, self.down_window_s)
        step_aware = steps.on
        tenants = tenant_limits(problem, result, pools_out, est.tasks, class_share)
        reasons.extend(task_reasons(inp.current, steps, tenants, result, self.down_window_s))
        reasons.extend(backlog_reasons(fb, targets))
        reasons.extend(redundancy_reasons(problem, pools_out, redundant))
        reasons.extend(guard_reasons(problem, pools_out, guards, inp.observation))
        reasons.extend(memory_reasons(problem, headroom, cfg.batch_token_options))
        conf = confidence(new_mem)
        if conf < 0.2:
            reasons.append(reason("low_confidence", None, f"model confidence {conf:.2f}: predictions are uncertain",
                                  confidence=conf))
        diag = diagnostics(result, fc, class_share, model, corr_diag, problem, headroom)
        diag["reliability"] = dial_diagnostics(weights.reliability, dial_source, problem, fc, startup)
        diag["model"]["planning_model"] = self.planning_model
        diag["stream_guard"] = dict(guards)
        diag["tasks"] = task_diagnostics(est.tasks, step_aware, tenants, result)
        diag["forecast"]["validation"] = board.to_dict(fc_method)
        if learned_unusable:
            diag["model"]["learned_unusable"] = learned_unusable
        need_now = {n: int(pt["need_by_step_p90"][0]) for n, pt in result.terms["pools"].items()
                    if pt.get("need_by_step_p90")}
        kept = (None if inp.estimate is not None
                else replace(est, decided_caps=decided_caps(fleet, pools_out), needs=need_now))
        status = planner_status(diag, guards, headroom, result)
        spills = state.spills
        if self.timer is not None and started is not None and kept_back is not None:
            end = self.timer()  # the tick's work is done: what remains is building the output
            spill = spill_s(result, end)
            if spill is not None:
                spills = (spills or Spills(len(fleet.pools))).add(len(fleet.pools), spill)
                diag["timing"] = timing(result, started, end, spill, kept_back)
        new_state = MpcState(pools=new_mem, plan=result.plan, plan_at_s=now, last_s=now,
                             shed_in_force={c: a.shed_frac for c, a in admission.items()}, need_now=need_now,
                             waiting=dict(fb.waiting), forecast_board=board, estimate=kept,
                             step_aware_until_s=steps.until_s, spills=spills)
        return new_state, PolicyOutput(pools=pools_out, admission=admission, reasons=tuple(reasons), diagnostics=diag,
                                       confidence=conf, status=status, needs=need_now, tenants=tenants.limits,
                                       step_aware=step_aware)
