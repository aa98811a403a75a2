"""`governor bench tasks --sim`: step-aware against step-blind admission inside the simulator, at the same fleet.

The agentic scenario (scenarios/agentic.yaml: tasks of 3-8 calls whose contexts grow step by step, lengths from
the shared Mooncake conversation trace) with its pools pinned at `--sim-replicas` replicas each (min = max:
nothing scales them, so the fleet and its cost are the same in both runs), its arrival rate multiplied by each
of `--sim-loads`, and the router's own admission settings as the live bench gives the picker (`--cap` requests
in flight per replica, a queue budget of `--budget` for standard and sheddable, `--hold-timeout`): the same
arrivals (same seed) once step-blind and once step-aware (`router.step_aware`, controller/sim/router.py). No
controller runs: the comparison is of the admission rule alone, beyond the fleet's capacity.

Counted per run, as `governor bench tasks --live` counts them (controller/bench/tasks_live.py):

- tasks: the tasks whose first step arrived; completed: every step completed (none failed or left unsent);
  failed: a step failed (shed 429/503 on its last attempt, a timeout, a hold that expired);
  successful: completed with every step within its class's TTFT and TPOT SLOs (the simulator's own figure);
- completed per $: completed tasks / the fleet's cost (GPU-hours × the catalogue's price);
- GPU-seconds on tasks that failed: the fleet's GPU-seconds × the share of the completed steps' tokens
  (prompt + output) that belong to tasks that then failed: what was spent on tasks that delivered nothing.

Ratios are step-aware ÷ step-blind within one (load, seed); the summary gives, per load, the ratio of the sums
over the seeds. Seeds draw the workload (task grouping, classes) and the router's draws.

With `--sim-mpc` (`run_sim_mpc`), the controller runs too: the MPC in the loop at the same pinned fleet (it plans
admission, in-flight caps and step admission; replicas cannot move), the router step-blind unless a decision says
otherwise, once planning on the step profile measured from the simulator's tasks (controller/bench/task_profile.py:
the planner scores step-aware admission against step-blind and turns it on where it predicts shedding,
controller/core/workflow.py) and once on the static steps-per-task weight (no profile: what the MPC did before, and
never touches step admission). Also counted: the share of decisions that turned step-aware admission on.

Must not: touch the network, or print anything but one JSON object on stdout with --json.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from controller.bench.runner import run_closed_loop
from controller.paths import PROJECT_ROOT
from controller.policies.registry import breaker_for, build_policy, estimator_for
from controller.sim.fleet import Fleet
from controller.sim.fleetspec import fleet_spec_from_scenario
from controller.sim.scenario import AdmissionSpec, Scenario, load_scenario
from controller.types import PolicyInput, PolicyOutput

DEFAULT_SCENARIO = "scenarios/agentic.yaml"
HELD_CLASSES = ("standard", "sheddable")  # critical passes the in-flight cap (controller/sim/router.py)


def overload_variant(base: Scenario, *, replicas: int, load: float, cap: int, budget: int, hold_s: float,
                     duration_s: float, step_aware: bool) -> Scenario:
    """`base` with its pools pinned at `replicas`, its rate × `load`, its trace cut to `duration_s` and the router's
    admission settings: the fleet both runs share."""
    pools = [p.model_copy(update={"replicas": replicas, "min_replicas": replicas, "max_replicas": replicas,
                                  "warm_standby": 0}) for p in base.pools]
    router = base.router.model_copy(update={
        "inflight_cap": cap, "hold_timeout_s": hold_s, "step_aware": step_aware,
        "admission": {**base.router.admission, **{c: AdmissionSpec(queue_budget=budget) for c in HELD_CLASSES}}})
    trace = base.trace.model_copy(update={"duration_s": duration_s, "rate_scale": base.trace.rate_scale * load})
    return base.model_copy(update={"pools": pools, "router": router, "trace": trace})


def task_outcomes(fleet: Fleet) -> dict[str, Any]:
    """A finished run's tasks, cost and GPU-seconds on failed tasks (the module's docstring says how)."""
    s = fleet.summary()
    rec = fleet.request_records()
    wl = fleet.workload
    tid = np.asarray(wl.task_id)
    status = rec["status"]
    n = wl.n_tasks
    failed = np.bincount(tid, weights=(status == 2).astype(np.float64), minlength=n) > 0
    not_done = np.bincount(tid, weights=(status != 1).astype(np.float64), minlength=n) > 0
    done = status == 1
    tokens = (np.asarray(wl.trace.prompt_tokens) + np.asarray(wl.trace.output_tokens)).astype(np.float64)
    spent = float(tokens[done].sum())
    wasted_share = float(tokens[done & failed[tid]].sum()) / spent if spent else 0.0
    gpu_s = s.gpu_hours * 3600.0
    completed = int((~not_done).sum())
    return {
        "tasks": int(n), "completed": completed, "failed": int(failed.sum()),
        "successful": int(s.successful_tasks), "cost_usd": s.cost_usd,
        "tasks_per_usd": completed / s.cost_usd if s.cost_usd else None,
        "gpu_s": gpu_s, "wasted_gpu_s": gpu_s * wasted_share, "shed": int(s.shed),
        "slo_attainment": dict(s.slo_attainment),
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _summary(points: list[dict[str, Any]], loads: Sequence[float], arms: tuple[str, str], *,
             shares: bool = False) -> list[dict[str, Any]]:
    """Per load, the arms' tasks, completions, successes and wasted GPU-seconds summed over the seeds, and the first
    arm's ratios to the second's (per dollar: summed completions over summed cost, not a mean of per-seed ratios);
    `shares`: the arms' mean share of decisions that turned step-aware admission on."""
    new, old = arms
    out = []
    for load in loads:
        at = [p for p in points if p["load"] == load]

        def total(arm: str, key: str, at: list[dict[str, Any]] = at) -> float:
            return float(sum(p[arm][key] for p in at))

        row: dict[str, Any] = {
            "load": load, "seeds": len(at), "tasks": int(total(old, "tasks")),
            "completed": {m: int(total(m, "completed")) for m in arms},
            "successful": {m: int(total(m, "successful")) for m in arms},
            "wasted_gpu_s": {m: total(m, "wasted_gpu_s") for m in arms},
        }
        if shares:
            row["step_aware_share"] = {m: total(m, "step_aware_share") / max(len(at), 1) for m in arms}
        row.update({
            "tasks_per_usd_ratio": _ratio(total(new, "completed") / total(new, "cost_usd"),
                                          total(old, "completed") / total(old, "cost_usd")),
            "successful_per_usd_ratio": _ratio(total(new, "successful") / total(new, "cost_usd"),
                                               total(old, "successful") / total(old, "cost_usd")),
            "wasted_gpu_s_ratio": _ratio(total(new, "wasted_gpu_s"), total(old, "wasted_gpu_s")),
        })
        out.append(row)
    return out


def run_sim(*, scenario: str = DEFAULT_SCENARIO, replicas: int = 2, loads: Sequence[float] = (0.6, 1.0, 1.5),
            seeds: Sequence[int] = (1, 2, 3), cap: int = 4, budget: int = 16, hold_s: float = 10.0,
            duration_s: float = 600.0) -> dict[str, Any]:
    path = PROJECT_ROOT / scenario if not scenario.startswith("/") else scenario
    base = load_scenario(path)
    points = []
    for load in loads:
        for seed in seeds:
            runs = {}
            for aware in (False, True):
                sc = overload_variant(base, replicas=replicas, load=load, cap=cap, budget=budget, hold_s=hold_s,
                                      duration_s=duration_s, step_aware=aware)
                fleet = Fleet(sc, seed=seed)
                fleet.run()
                runs["step_aware" if aware else "step_blind"] = task_outcomes(fleet)
            a, b = runs["step_aware"], runs["step_blind"]
            points.append({"load": load, "seed": seed, **runs,
                           "tasks_per_usd_ratio": _ratio(a["tasks_per_usd"], b["tasks_per_usd"]),
                           "wasted_gpu_s_ratio": _ratio(a["wasted_gpu_s"], b["wasted_gpu_s"])})
    summary = _summary(points, loads, ("step_aware", "step_blind"))
    return {"config": {"scenario": scenario, "replicas": replicas, "loads": list(loads), "seeds": list(seeds),
                       "cap": cap, "budget": budget, "hold_s": hold_s, "duration_s": duration_s,
                       "base_rate_scale": base.trace.rate_scale},
            "points": points, "summary": summary}


class _Counting:
    """A policy passed through, counting its decisions and those that turned step-aware admission on."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy
        self.name = policy.name
        self.decisions = 0
        self.aware = 0

    def initial_state(self) -> Any:
        return self.policy.initial_state()

    def estimator(self) -> Any:
        return self.policy.estimator()

    def decide(self, state: Any, inp: PolicyInput, rng: np.random.Generator) -> tuple[Any, PolicyOutput]:
        state, out = self.policy.decide(state, inp, rng)
        self.decisions += 1
        self.aware += int(out.step_aware is True)
        return state, out


ARMS = ("mpc_profile", "mpc_static")  # the measured step profile; the static steps-per-task weight (no profile)


def run_sim_mpc(*, scenario: str = DEFAULT_SCENARIO, replicas: int = 2, loads: Sequence[float] = (1.0, 1.5),
                seeds: Sequence[int] = (11, 12, 13), cap: int = 4, budget: int = 16, hold_s: float = 10.0,
                duration_s: float = 600.0, tick_s: float = 15.0) -> dict[str, Any]:
    """The MPC in the loop, planning on the measured step profile against the static weight (module docstring)."""
    path = PROJECT_ROOT / scenario if not scenario.startswith("/") else scenario
    base = load_scenario(path)
    points = []
    for load in loads:
        for seed in seeds:
            sc = overload_variant(base, replicas=replicas, load=load, cap=cap, budget=budget, hold_s=hold_s,
                                  duration_s=duration_s, step_aware=False)
            runs: dict[str, Any] = {}
            for arm in ARMS:
                pol = _Counting(build_policy("mpc", fleet_spec_from_scenario(sc), {}))
                res = run_closed_loop(sc, pol, seed=seed, tick_s=tick_s, label=arm, breaker=breaker_for("mpc", {}),
                                      estimator=estimator_for("mpc", {}), measure=task_outcomes,
                                      task_profile=arm == "mpc_profile")
                runs[arm] = {**{k: res.extra[k] for k in ("tasks", "completed", "failed", "successful", "cost_usd",
                                                         "tasks_per_usd", "gpu_s", "wasted_gpu_s", "shed")},
                             "decisions": pol.decisions,
                             "step_aware_share": pol.aware / pol.decisions if pol.decisions else 0.0}
            a, b = runs["mpc_profile"], runs["mpc_static"]
            points.append({"load": load, "seed": seed, **runs,
                           "tasks_per_usd_ratio": _ratio(a["tasks_per_usd"], b["tasks_per_usd"]),
                           "wasted_gpu_s_ratio": _ratio(a["wasted_gpu_s"], b["wasted_gpu_s"])})
    summary = _summary(points, loads, ARMS, shares=True)
    return {"config": {"scenario": scenario, "replicas": replicas, "loads": list(loads), "seeds": list(seeds),
                       "cap": cap, "budget": budget, "hold_s": hold_s, "duration_s": duration_s, "tick_s": tick_s,
                       "base_rate_scale": base.trace.rate_scale},
            "points": points, "summary": summary}
