"""`governor bench oracle-lag`: how much of the hindsight oracle's lead is foresight.

The oracle (controller/bench/oracle.py) orders every replica a start-up ahead of the minute
that needs it: it knows when the load comes. An online controller learns of a rise only from
telemetry, a tick after the rise began at the earliest, and its replica then needs a start-up.
This study replays the oracle's own schedule with every change made `lag_s` later, hedged the
two ways a controller that reacts late can hedge: each level held `hold_windows` more windows
(against the next burst of a bursty load) and `extra` replicas on top of every window (against
a ramp it follows a step behind). It reports what each variant costs and which SLOs it keeps.

Reading the result: where a lag of one tick already breaks the SLO, the oracle's cost rests on
knowing the load before any telemetry shows it, and no online policy can be expected to come
near it; where a lag of a minute costs little, the gap between an online policy and the oracle
is the policy's own to close. The lagged schedules still know each burst's size and length,
so the cheapest one that keeps the SLO is an optimistic reference for what reacting late costs,
not a bound any online policy reaches.

Definitions (as in `governor bench policies`): cost per successful task over the whole run;
task SLO attainment per class over every task (the tables' figure); `meets_bar` = at least
99 % of critical and of standard tasks within their SLOs (the MPC issue's bar);
`meets_oracle_targets` = the oracle's own acceptance (`oracle.task_slo_ok`: 99 / 99 / 95 %,
tasks started after the first cold start-up could serve).

`--json` prints one JSON object: scenario, seed, tick_s, window_s, oracle (the unlagged
schedule's replay), rows (one per lag × hold × extra) and cheapest_meeting_bar (per lag, the
cheapest hedge that meets the bar, or null). Exit codes: 0 done; 2 bad arguments or scenario. Must not:
write anywhere but --out (and its .cache).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from controller.bench.harness import (
    DEFAULT_OUT,
    DEFAULT_TICK_S,
    BenchError,
    ProgressBar,
    emit,
    parse_list,
    prepare,
    scenario_seed,
    verify_static,
)
from controller.bench.oracle import (
    TASK_SLO_TARGETS,
    WINDOW_S,
    OracleResult,
    SchedulePolicy,
    run_oracle,
    schedule_routing,
    schedule_targets,
    slo_check_from_s,
    task_slo_ok,
)
from controller.bench.oracle_joint import share_points
from controller.bench.profile import ProfileError
from controller.bench.report import _fmt
from controller.bench.runner import Progress, RunResult, run_closed_loop
from controller.clock import WallClock
from controller.sim.scenario import PoolSpecModel, Scenario, ScenarioError, load_scenario
from controller.sim.workload import Workload
from controller.types import PRIORITY_CLASSES

if TYPE_CHECKING:
    from rich.console import JustifyMethod

DEFAULT_LAGS_S = (0.0, 15.0, 30.0, 60.0)
DEFAULT_HOLDS = (0, 2, 4)
DEFAULT_EXTRAS = (0, 1)
MAX_LAG_S = 600.0
MAX_HOLD_WINDOWS = 30
MAX_EXTRA = 16
MAX_VALUES = 8
BAR_CLASSES = ("critical", "standard")
BAR_FRAC = 0.99


def hedged_levels(replicas: Sequence[int], hold_windows: int, extra: int = 0,
                  max_replicas: int | None = None) -> list[int]:
    """Each window's replicas raised to the highest of the `hold_windows` windows before it and itself,
    plus `extra`, at most `max_replicas`.

    Example: (1, 5, 1, 1, 2) held 2 windows → (1, 5, 5, 5, 2); with extra 1 and at most 5 → (2, 5, 5, 5, 3).
    """
    if hold_windows < 0:
        raise ValueError(f"hold_windows must be >= 0 (got {hold_windows})")
    if extra < 0:
        raise ValueError(f"extra must be >= 0 (got {extra})")
    m = [int(x) for x in replicas]
    out = [max(m[max(0, k - hold_windows):k + 1]) + int(extra) for k in range(len(m))]
    return out if max_replicas is None else [min(x, int(max_replicas)) for x in out]


def lagged_targets(spec: PoolSpecModel, points: Sequence[tuple[float, int]],
                   lag_s: float) -> tuple[tuple[float, int], ...]:
    """Change points of a schedule, each made `lag_s` later; until the first lands the pool keeps
    the replicas the scenario starts with. Example: ((0, 3), (120, 5)) lagged 30 s from 4 replicas
    → ((0, 4), (30, 3), (150, 5))."""
    if not (math.isfinite(lag_s) and lag_s >= 0):
        raise ValueError(f"lag_s must be a finite number >= 0 (got {lag_s!r})")
    if lag_s == 0:
        return tuple((float(t), int(n)) for t, n in points)
    out = [(0.0, int(spec.replicas))]
    for t, n in points:
        if out[-1][1] != int(n):
            out.append((float(t) + lag_s, int(n)))
    return tuple(out)


def lagged_weights(points: Sequence[tuple[float, float]], lag_s: float,
                   initial: float = 1.0) -> tuple[tuple[float, float], ...]:
    """(time, traffic weight) change points made `lag_s` later; until the first lands, `initial`.
    Example: ((0, 0.5), (120, 1.0)) lagged 30 s → ((0, 1.0), (30, 0.5), (150, 1.0))."""
    if not (math.isfinite(lag_s) and lag_s >= 0):
        raise ValueError(f"lag_s must be a finite number >= 0 (got {lag_s!r})")
    if lag_s == 0:
        return tuple((float(t), float(w)) for t, w in points)
    out = [(0.0, float(initial))]
    for t, w in points:
        if abs(out[-1][1] - float(w)) > 1e-12:
            out.append((float(t) + lag_s, float(w)))
    return tuple(out)


def reference_lag_s(scenario: Scenario, tick_s: float) -> float:
    """The lag of the reachable reference: one tick (an online controller sees a change in the next
    window of telemetry at the earliest) plus the longest warm start-up of the scenario's pools (its
    replica then still has to start, from a warm node at best: the oracle ordered it a cold start-up
    ahead). Example: tick 15 s, warm start-ups 30 s and 60 s → 75 s."""
    return float(tick_s) + max((p.startup_warm_s for p in scenario.pools), default=0.0)


def replay_lagged(scenario: Scenario, oracle: OracleResult, *, seed: int, tick_s: float, lag_s: float,
                  workload: Workload | None = None, label: str = "oracle-lagged",
                  progress: Progress | None = None) -> RunResult:
    """The oracle's schedule (replicas and, for the joint oracle, the split) with every change made
    `lag_s` later, replayed through the same loop. The scenario's split (weight 1) holds until the
    first lagged split lands."""
    targets, weights = {}, {}
    for p in scenario.pools:
        plan = oracle.candidate.plans[p.name]
        targets[p.name] = lagged_targets(p, schedule_targets(p, plan.replicas, window_s=WINDOW_S, tick_s=tick_s),
                                         lag_s)
        if plan.shares:
            weights[p.name] = lagged_weights(share_points(plan.weights or plan.shares, window_s=WINDOW_S), lag_s)
    policy = SchedulePolicy(targets, schedule_routing(scenario), weights)
    policy.name = label
    run = run_closed_loop(scenario, policy, seed=seed, tick_s=tick_s, workload=workload, label=label, breaker=None,
                          slo_check_from_s=slo_check_from_s(scenario, tick_s), progress=progress)
    extra = {k: v for k, v in run.extra.items() if k != "late_requests"}  # raw arrays: the oracle's repair input
    return replace(run, extra={**extra, "lag_s": float(lag_s), "lagged": oracle.run.policy})


def _entry(run: RunResult) -> dict[str, Any]:
    s = run.summary
    att = {c: (s.get("slo_attainment") or {}).get(c) for c in PRIORITY_CLASSES}
    ok, _ = task_slo_ok(run, TASK_SLO_TARGETS)
    return {"cost_per_successful_task_usd": s.get("cost_per_successful_task_usd"), "gpu_hours": s.get("gpu_hours"),
            "successful_tasks": s.get("successful_tasks"), "tasks": s.get("tasks"), "task_slo_attainment": att,
            "meets_bar": all((a := att.get(c)) is not None and a >= BAR_FRAC for c in BAR_CLASSES),
            "meets_oracle_targets": bool(ok)}


def run_lag_study(scenario: Scenario, *, seed: int, lags_s: Sequence[float] = DEFAULT_LAGS_S,
                  holds: Sequence[int] = DEFAULT_HOLDS, extras: Sequence[int] = DEFAULT_EXTRAS,
                  tick_s: float = DEFAULT_TICK_S,
                  cache_dir: Path | str | None = None,
                  progress: Callable[[str], Progress | None] | None = None) -> dict[str, Any]:
    """Find the oracle's schedule, then replay it lagged and held; the report `--json` prints."""
    ctx = prepare(scenario, seed=seed, cache_dir=cache_dir)
    verified, _, _ = verify_static(ctx, tick_s=tick_s, progress=progress)
    oracle = run_oracle(scenario, workload=ctx.workload, profiles=ctx.profiles, demands=ctx.demands, seed=seed,
                        tick_s=tick_s, static=verified, progress=progress)
    schedule = {n: list(p.replicas) for n, p in oracle.candidate.plans.items()}
    routing = schedule_routing(scenario)
    check_from_s = slo_check_from_s(scenario, tick_s)
    base = _entry(oracle.run)
    base_cps = base["cost_per_successful_task_usd"]
    rows: list[dict[str, Any]] = []
    for lag in lags_s:
        for hold in holds:
            for extra in extras:
                targets = {}
                for p in scenario.pools:
                    levels = hedged_levels(schedule[p.name], hold, extra, p.max_replicas)
                    targets[p.name] = lagged_targets(p, schedule_targets(p, levels, window_s=WINDOW_S, tick_s=tick_s),
                                                     lag)
                label = f"lag {lag:g} s, hold {hold}, +{extra}"
                run = run_closed_loop(scenario, SchedulePolicy(targets, routing), seed=seed, tick_s=tick_s,
                                      breaker=None, workload=ctx.workload, label="oracle-lagged",
                                      slo_check_from_s=check_from_s,
                                      progress=progress(label) if progress else None)
                e = _entry(run)
                cps = e["cost_per_successful_task_usd"]
                e.update({"lag_s": float(lag), "hold_windows": int(hold), "extra_replicas": int(extra),
                          "ratio_to_oracle": cps / base_cps if cps and base_cps else None})
                rows.append(e)
    cheapest: dict[str, Any] = {}
    for lag in lags_s:
        ok = [r for r in rows if r["lag_s"] == float(lag) and r["meets_bar"]]
        best = min(ok, key=lambda r: r["cost_per_successful_task_usd"]) if ok else None
        cheapest[f"{lag:g}"] = None if best is None else {"hold_windows": best["hold_windows"],
                                                          "extra_replicas": best["extra_replicas"],
                                                          "ratio_to_oracle": best["ratio_to_oracle"]}
    return {"scenario": scenario.name, "seed": int(seed), "tick_s": float(tick_s), "window_s": WINDOW_S,
            "oracle": {**base, "schedule": schedule, "slo_met": oracle.slo_met}, "rows": rows,
            "cheapest_meeting_bar": cheapest}


def render_lag_table(report: Mapping[str, Any]):
    from rich.table import Table

    o = report["oracle"]
    t = Table(title=f"{report['scenario']} (seed {report['seed']}, tick {report['tick_s']:g} s): "
                    f"the oracle's schedule, made late — oracle "
                    f"{_fmt(o['cost_per_successful_task_usd'], '.4f')} $/succ. task")
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("lag s", "right"), ("hold win", "right"), ("extra", "right"), ("$/succ. task", "right"),
        ("× oracle", "right"), ("GPU-h", "right"), ("tasks crit/std/shed", "right"), ("≥ 99 % crit+std", "center"),
        ("oracle targets", "center"))
    for name, just in columns:
        t.add_column(name, justify=just, no_wrap=True)
    for r in report["rows"]:
        att = r["task_slo_attainment"]
        t.add_row(f"{r['lag_s']:g}", str(r["hold_windows"]), f"+{r['extra_replicas']}",
                  _fmt(r["cost_per_successful_task_usd"], ".4f"),
                  _fmt(r["ratio_to_oracle"], ".2f"), _fmt(r["gpu_hours"], ".2f"),
                  "/".join(_fmt(att.get(c), pct=True) for c in PRIORITY_CLASSES),
                  "yes" if r["meets_bar"] else "no", "yes" if r["meets_oracle_targets"] else "no")
    t.caption = ("lag: every change of the oracle's schedule made this much later; hold: each level kept this "
                 "many more 60 s windows; extra: replicas added to every window. The lagged schedules still know "
                 "every burst's size.")
    return t


def cmd_bench_oracle_lag(args: argparse.Namespace) -> int:
    prog = "governor bench oracle-lag"
    try:
        scenario = load_scenario(args.scenario)
        lags = parse_list(args.lags, "lags", float, 0.0, MAX_LAG_S, MAX_VALUES)
        holds = parse_list(args.holds, "holds", int, 0, MAX_HOLD_WINDOWS, MAX_VALUES)
        extras = parse_list(args.extras, "extras", int, 0, MAX_EXTRA, MAX_VALUES)
    except (ScenarioError, BenchError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    seed = scenario_seed(scenario, args.seed)
    out_dir = Path(args.out or DEFAULT_OUT)
    clock = WallClock()
    t0 = clock.monotonic_s()
    try:
        with ProgressBar() as bar:
            report = run_lag_study(scenario, seed=seed, lags_s=lags, holds=holds, extras=extras,
                                   cache_dir=out_dir / ".cache",
                                   progress=bar.task)
    except (BenchError, ProfileError, ScenarioError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    out_dir.mkdir(parents=True, exist_ok=True)
    path = emit(out_dir / f"{scenario.name}-oracle-lag.json", report, args.json, render_lag_table)
    print(f"wrote {path} ({clock.monotonic_s() - t0:.0f} s wall)", file=sys.stderr)
    return 0


__all__ = ["cmd_bench_oracle_lag", "hedged_levels", "lagged_targets", "render_lag_table", "run_lag_study"]
