"""What the bench commands that replay a scenario share: its context, the verified static fleet, the CLI pieces.

`prepare` derives from a scenario, once, everything every replay shares (`BenchContext`: the
workload the fleet builds for the seed, each pool's profiled capacity at the SLO, the demand per
pool, the static fleet sized for the peak); `verify_static` raises that static fleet until a replay
meets the task targets. `ProgressBar` (rich, on stderr), `emit` (the JSON file, and stdout as one
JSON object or a table), `scenario_seed` and `parse_list` are the commands' shared command line.
Used by `governor bench policies` (side_by_side.py), `bench oracle-lag` (oracle_lag.py) and the
commands built on them. Must not: write anywhere but the paths it is given.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import Any

from controller.bench.oracle import (
    TASK_SLO_TARGETS,
    PoolDemand,
    pool_demands,
    slo_check_from_s,
    static_replicas,
    task_slo_ok,
)
from controller.bench.profile import PoolProfile, pool_model, profile_scenario, request_work_s
from controller.bench.runner import Progress, RunResult, run_closed_loop
from controller.policies.registry import build_policy
from controller.sim.fleet import Fleet
from controller.sim.fleetspec import fleet_spec_from_scenario
from controller.sim.scenario import Scenario
from controller.sim.workload import Workload

DEFAULT_OUT = "bench-out"
DEFAULT_TICK_S = 15.0
STATIC = "static"
STATIC_VERIFY_ROUNDS = 6  # extra static replays, one more replica per pool each, before giving up


class BenchError(ValueError):
    """Bad bench input (unknown policy, bad scenario); the message is what the user sees."""


@dataclass(frozen=True)
class BenchContext:
    """Everything derived from the scenario once and shared by every policy's replay."""

    scenario: Scenario
    seed: int
    workload: Workload
    profiles: Mapping[str, PoolProfile]
    demands: Mapping[str, PoolDemand]
    static_replicas: Mapping[str, int]


def prepare(scenario: Scenario, *, seed: int, cache_dir: Path | str | None) -> BenchContext:
    # The workload the fleet itself builds for this seed (same SeedSequence split), built once.
    workload = Fleet(scenario, seed=seed, record_requests=False).workload
    work_s = {p.name: request_work_s(pool_model(p), workload.trace.prompt_tokens, workload.trace.output_tokens,
                                     max_num_batched_tokens=p.engine.max_num_batched_tokens) for p in scenario.pools}
    profiles = profile_scenario(scenario, workload=workload, seed=seed, cache_dir=cache_dir, work_s=work_s)
    demands = pool_demands(scenario, workload, profiles, work_s)
    return BenchContext(scenario, seed, workload, profiles, demands, static_replicas(scenario, demands, profiles))


def verify_static(ctx: BenchContext, *, tick_s: float, progress: Callable[[str], Progress | None] | None = None,
                  rounds: int = STATIC_VERIFY_ROUNDS,
                  measure: Callable[[Fleet], Mapping[str, Any]] | None = None,
                  ) -> tuple[dict[str, int], RunResult, bool]:
    """(replicas, the replay at them, met): static provisioning raised until it meets the task targets.

    Starts at the profiled peak size and adds one replica to every pool not yet at its
    max per round, judged like the oracle (`task_slo_ok`, tasks started after the longest
    cold start-up + one tick). Example: 6 replicas keep 97.5 % of standard tasks against a
    99 % target, 7 keep 99.2 % → 7. Scheduled faults count: a fleet sized for the peak
    that a crash at the peak takes below the SLO is not yet what the peak needs.
    `measure`: as `runner.run_closed_loop`'s, on every round's replay.
    """
    scenario = ctx.scenario
    reps = dict(ctx.static_replicas)
    check_from_s = slo_check_from_s(scenario, tick_s)
    for i in range(rounds + 1):
        label = STATIC if i == 0 else f"{STATIC} +{i}"
        try:
            policy = build_policy(STATIC, fleet_spec_from_scenario(scenario), {"replicas": reps})
        except ValueError as exc:  # e.g. a profiled size outside a pool's min/max: name the step that failed
            raise BenchError(f"static (verifying the profiled size {reps}): {exc}") from None
        run = run_closed_loop(scenario, policy, seed=ctx.seed, tick_s=tick_s, workload=ctx.workload, label=STATIC,
                              params={"replicas": dict(reps)}, slo_check_from_s=check_from_s,
                              progress=progress(label) if progress else None, measure=measure)
        ok, _ = task_slo_ok(run, TASK_SLO_TARGETS)
        grow = {p.name: min(reps[p.name] + 1, p.max_replicas) for p in scenario.pools}
        if ok or grow == reps or i == rounds:
            extra = {k: v for k, v in run.extra.items() if k != "late_requests"}
            extra.update({"profiled_replicas": dict(ctx.static_replicas), "verify_rounds": i, "slo_met": ok})
            return reps, replace(run, extra=extra), ok
        reps = grow
    raise AssertionError("unreachable")


# --------------------------------------------------------------------------- CLI


class ProgressBar:
    """A rich progress bar on stderr: one task per replay, advanced in simulated seconds."""

    def __init__(self, enabled: bool = True) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.console = Console(stderr=True)
        self.progress = Progress(TextColumn("{task.description:<22}"), BarColumn(), TextColumn("{task.fields[sim]}"),
                                 TimeElapsedColumn(), console=self.console, disable=not enabled, transient=False)

    def __enter__(self) -> ProgressBar:
        self.progress.__enter__()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.progress.__exit__(exc_type, exc, tb)

    def task(self, label: str) -> Progress:
        task_id = self.progress.add_task(label, total=1.0, sim="")

        def update(done_s: float, total_s: float) -> None:
            total = max(total_s, done_s, 1.0)
            self.progress.update(task_id, total=total, completed=min(done_s, total),
                                 sim=f"{done_s / 60:.0f}/{total / 60:.0f} sim-min")

        return update


def emit(path: Path, obj: Mapping[str, Any], as_json: bool, render: Callable[[Mapping[str, Any]], Any]) -> Path:
    """Write `obj` as JSON to `path`; print it on stdout as one JSON object, or as `render`'s table."""
    path.write_text(json.dumps(obj, indent=1, sort_keys=True) + "\n")
    if as_json:
        print(json.dumps(obj, sort_keys=True))
    else:
        from rich.console import Console

        console = Console()
        if not console.is_terminal:
            console = Console(width=220)  # a pipe or file gets the whole table, not an 80-column squeeze
        console.print(render(obj))
    return path


def scenario_seed(scenario: Scenario, seed: int | None) -> int:
    return int(scenario.seed if seed is None else seed)


def parse_list(text: str, option: str, kind: type, lo: float, hi: float, most: int) -> list:
    """"1,2,3" → [1, 2, 3]: distinct values of `kind` within [lo, hi], 1 to `most` of them, else a
    BenchError naming --option and the problem (the bench CLIs' comma-separated lists)."""
    vals: list = []
    for part in (x.strip() for x in text.split(",")):
        if not part:
            continue
        try:
            v = kind(part)
        except ValueError:
            what = "an integer" if kind is int else "a number"
            raise BenchError(f"--{option}: {part!r} is not {what} (expected e.g. 1,2,3)") from None
        if not (lo <= v <= hi):  # a NaN fails too
            bound = f"must be >= {lo:g} (got {part})" if hi == math.inf else f"{part} is outside [{lo:g}, {hi:g}]"
            raise BenchError(f"--{option}: {bound}")
        if v in vals:
            raise BenchError(f"--{option}: {part} is listed twice")
        vals.append(v)
    if not 1 <= len(vals) <= most:
        raise BenchError(f"--{option}: give 1 to {most} values (got {len(vals)})")
    return vals
