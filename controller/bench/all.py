"""`governor bench all`: every shipped scenario — simulator speed and every policy side by side.

Each scenario in the repository's `scenarios/` folder is one job: the simulator's
speed on it (`controller.bench.sim_speed.measure` on its 16-replica static variant,
when that module is present) and `bench policies` with every registered policy (not
the bench variants sla-planner-60s and hpa-queue) and the oracle, its bisection limited
to ORACLE_MAX_REPLAYS replays (its repair rounds are bounded on their own), with the
scenario file's seed, at the daemon's and `bench policies`' 15 s tick (the in-process
observer feeds the telemetry window without rendering text, so a tick costs little next
to simulating it; at the first version's 30 s the demo's 20 s surge and 60 s crash fell
between ticks).
Jobs run in `workers` processes (2 by default, as the reference machine has 2 vCPUs),
longest first; each writes its JSON and PNG to --out as `bench policies` does, and
this command prints one summary table (or, with --json, one JSON object on stdout).
Per-scenario results do not depend on the number of workers or their order; only the
wall times do.

Budget: the whole run must fit in 20 minutes on a 2-core machine (`make bench`); the
wall time is printed. Must not: write anywhere but --out.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from types import ModuleType
from typing import Any

from controller.clock import WallClock

DEFAULT_OUT = "bench-out"
TICK_S = 15.0  # the daemon's default and bench policies' (see docstring)
WORKERS = 2
ORACLE_MAX_REPLAYS = 3  # bisection: the nominal schedule, the dearest, one step (repairs add up to
# oracle.REPAIR_ROUNDS more, and one for the dearest DP schedule when nothing met)
# Rough relative cost of each scenario (sessions and bursty prompts replay slower): longest first.
_COST_HINT = {"mooncake": 3.0, "azure-conv": 2.0, "servegen": 2.0, "azure-code": 1.0,
              # heterogeneous fleets (30 minutes of trace, several pools: profiles per pool)
              "tiers": 2.0, "pd-split": 2.0, "mixed-sku": 1.5, "agentic": 1.5, "multi-tenant": 1.0}


def scenarios_dir() -> Path:
    return Path(__file__).resolve().parents[2] / "scenarios"


def shipped_scenarios(folder: Path | None = None) -> list[Path]:
    folder = folder or scenarios_dir()
    return sorted(folder.glob("*.yaml"))


def _hint(path: Path) -> float:
    base = next((v for k, v in _COST_HINT.items() if path.stem.startswith(k)), 0.5)
    return base + (0.5 if path.stem.endswith("-surge") else 0.0)


def run_one(path: str, out_dir: str, tick_s: float = TICK_S) -> dict[str, Any]:
    """One scenario: sim speed, then every policy. Returns the summary row (and writes the files)."""
    from controller.bench.harness import BenchError
    from controller.bench.profile import ProfileError
    from controller.bench.report import write_png
    from controller.bench.side_by_side import VARIANTS, default_policies, run_bench
    from controller.sim.fleetspec import fleet_spec_from_scenario
    from controller.sim.scenario import ScenarioError, load_scenario

    clock = WallClock()
    t0 = clock.monotonic_s()
    row: dict[str, Any] = {"file": path}
    try:
        scenario = load_scenario(path)
    except ScenarioError as exc:
        return {**row, "error": str(exc)}
    row["scenario"] = scenario.name
    sim_speed: ModuleType | None
    try:  # it reads peak memory with `resource`, which only POSIX systems have
        from controller.bench import sim_speed
    except ImportError:
        sim_speed = None
    if sim_speed is not None:
        try:
            row["sim_speed"] = sim_speed.measure(sim_speed.sixteen_replica_variant(scenario), seed=scenario.seed)
        except (ValueError, FileNotFoundError) as exc:
            row["sim_speed"] = {"error": str(exc)}
    t1 = clock.monotonic_s()
    try:
        labels = [p for p in default_policies(scenario) if p not in VARIANTS]
        timings: dict[str, float] = {}
        report, runs, _ = run_bench(scenario, labels, seed=scenario.seed, tick_s=tick_s,
                                    cache_dir=Path(out_dir) / ".cache", scenario_file=path, timings=timings,
                                    oracle_max_replays=ORACLE_MAX_REPLAYS)
    except (BenchError, ProfileError, ScenarioError) as exc:
        return {**row, "error": str(exc)}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{scenario.name}.json").write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    write_png(out / f"{scenario.name}.png", report, runs,
              {c: s.ttft_s for c, s in fleet_spec_from_scenario(scenario).slos.items()})
    t2 = clock.monotonic_s()
    row.update({"seed": report["seed"], "best_baseline": report["best_baseline"],
                "best_baseline_at_slo": report.get("best_baseline_at_slo"), "policies": report["policies"],
                "timings_s": timings, "sim_speed_wall_s": round(t1 - t0, 1), "policies_wall_s": round(t2 - t1, 1),
                "wall_s": round(t2 - t0, 1)})
    return row


def _cell(e: dict[str, Any] | None) -> str:
    if not e or e.get("cost_per_successful_task_usd") is None:
        return "–"
    att = e.get("slo_attainment") or {}
    crit = att.get("critical")
    return f"{e['cost_per_successful_task_usd']:.4f}" + (f" ({100 * crit:.0f}%)" if crit is not None else "")


def summary_table(rows: list[dict[str, Any]], wall_s: float, workers: int):
    from rich.table import Table

    t = Table(title=f"governor bench all: {len(rows)} scenarios, {wall_s:.0f} s wall on {workers} worker(s)")
    for c in ("scenario", "best baseline", "$/task (crit. SLO)", "best at SLO", "$/task (crit. SLO) ", "slo-feedback",
              "mpc", "oracle", "× oracle (best)", "sim speed", "wall s"):
        t.add_column(c, justify="left" if c in ("scenario", "best baseline", "best at SLO") else "right", no_wrap=True)
    for r in rows:
        if "error" in r:
            t.add_row(r.get("scenario", r["file"]), f"[red]error: {r['error'][:60]}", *([""] * 9))
            continue
        pols = r["policies"]
        best = r.get("best_baseline")
        ora = pols.get("oracle", {})
        ratio = pols.get(best, {}).get("ratio_to_oracle") if best else None
        speed = (r.get("sim_speed") or {}).get("speedup")
        at_slo = r.get("best_baseline_at_slo")
        t.add_row(r["scenario"], best or "–", _cell(pols.get(best)), at_slo or "–", _cell(pols.get(at_slo)),
                  _cell(pols.get("slo-feedback")),
                  _cell(pols.get("mpc")),
                  _cell(ora) + ("" if ora.get("slo_met", True) else " ✗"),
                  f"{ratio:.2f}" if ratio is not None else "–",
                  f"{speed:g}×" if speed is not None else "–", f"{r.get('wall_s', 0):.0f}")
    t.caption = ("cost per successful task in USD (critical-class task SLO attainment); best at SLO = the cheapest "
                 "baseline keeping ≥ 99 % of critical and standard tasks; ✗ = the oracle missed its SLO target")
    return t


def cmd_bench_all(args: argparse.Namespace) -> int:
    out_dir = Path(getattr(args, "out", None) or DEFAULT_OUT)
    paths = shipped_scenarios()
    if not paths:
        print(f"governor bench all: no scenarios found in {scenarios_dir()}", file=sys.stderr)
        return 2
    workers = max(1, min(WORKERS, os.cpu_count() or 1, len(paths)))
    clock = WallClock()
    t0 = clock.monotonic_s()
    rows: dict[str, dict[str, Any]] = {}
    ordered = sorted(paths, key=lambda p: (-_hint(p), p.name))
    from rich.console import Console

    err = Console(stderr=True)
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(run_one, str(p), str(out_dir)): p for p in ordered}
        for f in as_completed(futures):
            p = futures[f]
            try:
                row = f.result()
            except Exception as exc:  # noqa: BLE001 - one broken scenario must not hide the others
                # The worker's traceback travels as the text of __cause__: keep its last lines.
                where = str(exc.__cause__ or "").strip().splitlines()[-4:-1]
                context = f" [{' | '.join(x.strip() for x in where)}]" if where else ""
                row = {"file": str(p), "scenario": p.stem, "error": f"{type(exc).__name__}: {exc}{context}"}
            rows[str(p)] = row
            status = "error" if "error" in row else f"{row.get('wall_s', 0):.0f} s"
            err.print(f"[{len(rows)}/{len(paths)}] {p.stem}: {status} ({clock.monotonic_s() - t0:.0f} s elapsed)")
    wall = clock.monotonic_s() - t0
    result = [rows[str(p)] for p in paths]
    if getattr(args, "json", False):
        print(json.dumps({"wall_s": round(wall, 1), "workers": workers, "tick_s": TICK_S,
                          "scenarios": {r.get("scenario", r["file"]): r for r in result}}, sort_keys=True))
    else:
        console = Console()
        if not console.is_terminal:
            console = Console(width=200)
        console.print(summary_table(result, wall, workers))
    print(f"governor bench all: {len(paths)} scenarios in {wall:.0f} s wall ({workers} workers); results in {out_dir}",
          file=sys.stderr)
    return 1 if any("error" in r for r in result) else 0
