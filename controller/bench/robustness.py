"""`governor bench robustness`: every policy on N generated cases, and how often each holds its SLOs.

Each case comes from `controller.bench.generator` (a pure function of the seed and the case index)
and is benchmarked exactly as `governor bench policies` benchmarks a shipped scenario
(`policies.run_bench`: the case's own profile, the verified static fleet, every policy's replay
and the hindsight oracle, its bisection bounded like `bench all`'s). Cases run in `--workers`
processes; a case's figures do not depend on the worker count or order, only the wall time does.

Per policy the report gives:

- slo_pass_rate: the share of cases in which the policy kept >= 99 % of critical AND of standard
  tasks within their SLOs (the task attainment the bench table reports, `report.meets_bar`);
- slo_pass_rate_feasible: the same over the feasible cases, those where the verified static fleet,
  the oracle or the capacity ceiling (every pool at max_replicas from the first tick, the sheddable
  class shed; controller/bench/ceiling.py) met that bar (a case no known fleet passes says more about
  the fleet than the policy); static and the ceiling are always run, the oracle when listed;
- critical_min / standard_min: its lowest attainment over the cases;
- cost_ratio_vs_static_{median,p90}: its cost per successful task divided by the verified static
  fleet's on the same case (static is always run: it is the reference), median and p90 over the
  cases; cost_ratio_vs_oracle_{median,p90} likewise against the oracle (None without it);
- worst_case: the case with its lowest min(critical, standard) attainment (ties: the dearer);
- failed_by_shape, failed_by_fleet, failed_by_mix, failed_by_fault: how many of its failed cases
  had each traffic shape, fleet, length mix and fault.

Outputs in --out (default bench-out/robustness): robustness-seedS.json (the report with one row
per case in `cases_detail`), robustness-seedS.png (cost ratio vs attainment, one point per case and
policy), and cases/ (each case's YAML and trace, replayable alone with `governor bench policies
--scenario`). `--json` prints the report as exactly one JSON object on stdout; progress goes to
stderr. Exit codes: 0 done, 1 some case failed to run (its row carries the error), 2 bad input.
Wall and CPU seconds (machine measures) are top-level fields only: the per-case rows of two runs
into the same --out compare equal. Must not: write anywhere but --out.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import numpy as np

from controller.clock import WallClock

DEFAULT_OUT = "bench-out/robustness"
TICK_S = 15.0
WORKERS = 2
MAX_CASES = 5000
ORACLE_MAX_REPLAYS = 3  # as `bench all`: the nominal schedule, the dearest, one bisection step (+ repairs)
STATIC = "static"
ORACLE = "oracle"
CEILING = "ceiling"  # controller/bench/ceiling.py: which cases replica counts and admission can serve at all
FAILED_BY = ("shape", "fleet", "mix", "fault")  # failed cases are counted by each of these


def default_labels() -> list[str]:
    """Every registered policy (the MPC when it builds) and the oracle, without the bench variants."""
    from controller.bench.generator import shipped_fleets
    from controller.bench.side_by_side import VARIANTS, default_policies

    scenario = shipped_fleets()[0].scenario
    return [p for p in default_policies(scenario) if p not in VARIANTS]


def parse_labels(text: str | None) -> list[str]:
    """--policies → labels, static first and the ceiling last (the cost reference and the feasibility
    reference are always run); BenchError if unknown."""
    from controller.bench.generator import shipped_fleets
    from controller.bench.side_by_side import parse_policies

    labels = default_labels() if text is None else parse_policies(text, shipped_fleets()[0].scenario)
    return [STATIC] + [x for x in labels if x not in (STATIC, CEILING)] + [CEILING]


def _ratio(a: Any, b: Any) -> float | None:
    ok = all(isinstance(x, (int, float)) and math.isfinite(x) for x in (a, b))
    return float(a) / float(b) if ok and b > 0 else None


COST = "cost_per_successful_task_usd"


def case_fields(case: Any) -> dict[str, Any]:
    """What a case row says of the generated case (`generator.Case`): its draws and its file."""
    spec = case.spec
    return {"shape": spec.shape, "fleet": spec.fleet, "mix": spec.mix, "classes": spec.classes,
            "fault": spec.fault, "beyond_max": spec.beyond_max, "scenario_file": str(case.scenario_path),
            "case": spec.to_dict()}


def case_entry(e: Mapping[str, Any], static_cost: Any, oracle_cost: Any) -> dict[str, Any]:
    """One policy's figures on one case (from `report.policy_entry`): attainment, pass (`meets_bar`), cost
    per successful task and its ratios to the verified static fleet's and the oracle's."""
    from controller.bench.report import meets_bar

    att = e.get("slo_attainment") or {}
    return {
        "slo_attainment": dict(att), "pass": meets_bar(e), COST: e.get(COST),
        "cost_ratio_vs_static": _ratio(e.get(COST), static_cost),
        "cost_ratio_vs_oracle": _ratio(e.get(COST), oracle_cost),
        "successful_tasks": e.get("successful_tasks"), "tasks": e.get("tasks"), "shed": e.get("shed"),
        "failed": e.get("failed"), "gpu_hours": e.get("gpu_hours"), "scaling_actions": e.get("scaling_actions"),
    }


def run_case(seed: int, k: int, labels: Sequence[str], out_dir: str, tick_s: float = TICK_S) -> dict[str, Any]:
    """Generate case k of `seed`, benchmark every label on it, return its row (JSON-ready, no wall times)."""
    from controller.bench.generator import GeneratorError, generate_case
    from controller.bench.harness import BenchError
    from controller.bench.profile import ProfileError
    from controller.bench.side_by_side import run_bench
    from controller.sim.scenario import ScenarioError

    out = Path(out_dir)
    row: dict[str, Any] = {"index": k}
    try:
        case = generate_case(seed, k, work_dir=out / "cases", cache_dir=out / ".cache")
    except (GeneratorError, ProfileError, ScenarioError) as exc:
        return {**row, "error": f"generating the case: {exc}"}
    spec = case.spec
    row.update(case_fields(case))
    try:
        report, _, _ = run_bench(case.scenario, list(labels), seed=spec.sim_seed, tick_s=tick_s,
                                 cache_dir=out / ".cache", scenario_file=str(case.scenario_path),
                                 oracle_max_replays=ORACLE_MAX_REPLAYS)
    except (BenchError, ProfileError, ScenarioError) as exc:
        return {**row, "error": str(exc)}
    pols = report["policies"]
    static_cost = pols.get(STATIC, {}).get(COST)
    oracle_cost = pols.get(ORACLE, {}).get(COST)
    entries = {name: case_entry(e, static_cost, oracle_cost) for name, e in pols.items()}
    # Feasible: some fleet the bench knows (the verified static one, the oracle's schedule, or the
    # capacity ceiling: every pool at its maximum with the sheddable class shed) met the bar, so a
    # policy that misses it could have done better; an infeasible case (one whose engines miss the
    # TPOT SLO at any size within bounds, even with the sheddable class refused) says more about the
    # fleet than about the policy.
    feasible = any(entries[n]["pass"] for n in (STATIC, ORACLE, CEILING) if n in entries)
    row.update({"static_replicas": report["static_replicas"], "static_slo_met": pols.get(STATIC, {}).get("slo_met"),
                "oracle_slo_met": pols.get(ORACLE, {}).get("slo_met"), "feasible": feasible, "policies": entries})
    return row


CaseFn = Callable[[int, int, Sequence[Any], str, float], dict[str, Any]]


def _timed_case(seed: int, k: int, labels: Sequence[Any], out_dir: str, tick_s: float,
                case_fn: CaseFn = run_case) -> tuple[dict[str, Any], float, float]:
    """`case_fn` (`run_case`), its wall seconds and its CPU seconds (kept out of the row, which must not
    depend on the machine; on a shared machine the CPU seconds say more about the cost than the wall time)."""
    clock = WallClock()
    t0, c0 = clock.monotonic_s(), time.process_time()
    row = case_fn(seed, k, labels, out_dir, tick_s)
    return row, round(clock.monotonic_s() - t0, 2), round(time.process_time() - c0, 2)


def _quantile(xs: Sequence[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(xs, dtype=np.float64), q)) if xs else None


def _low(e: Mapping[str, Any]) -> float:
    att = e.get("slo_attainment") or {}
    vals = [att.get(c) for c in ("critical", "standard")]
    return min((v if isinstance(v, (int, float)) else 0.0) for v in vals)


def summarise(rows: Sequence[Mapping[str, Any]], labels: Sequence[str]) -> dict[str, Any]:
    """Per policy: pass rate, lowest attainment, cost ratios (median, p90) and the worst case."""
    ok = [r for r in rows if "error" not in r]
    out: dict[str, Any] = {}
    for label in labels:
        mine = [(r, r["policies"][label]) for r in ok if label in r["policies"]]
        if not mine:
            out[label] = {"cases": 0, "slo_pass_rate": None, "worst_case": None}
            continue
        vs_static = [e["cost_ratio_vs_static"] for _, e in mine if e["cost_ratio_vs_static"] is not None]
        vs_oracle = [e["cost_ratio_vs_oracle"] for _, e in mine if e["cost_ratio_vs_oracle"] is not None]
        worst_r, worst_e = min(mine, key=lambda re: (_low(re[1]), -(re[1]["cost_ratio_vs_static"] or 0.0),
                                                     re[0]["index"]))
        failed: dict[str, dict[str, int]] = {k: {} for k in FAILED_BY}
        for r, e in mine:
            if not e["pass"]:
                for k in FAILED_BY:
                    failed[k][str(r[k])] = failed[k].get(str(r[k]), 0) + 1
        crit = [e["slo_attainment"].get("critical") for _, e in mine]
        std = [e["slo_attainment"].get("standard") for _, e in mine]
        feasible = [e for r, e in mine if r.get("feasible")]
        out[label] = {
            "cases": len(mine),
            "slo_pass_rate": sum(1 for _, e in mine if e["pass"]) / len(mine),
            "slo_pass_rate_feasible": sum(1 for e in feasible if e["pass"]) / len(feasible) if feasible else None,
            "critical_min": min((c for c in crit if c is not None), default=None),
            "standard_min": min((s for s in std if s is not None), default=None),
            "cost_ratio_vs_static_median": _quantile(vs_static, 50),
            "cost_ratio_vs_static_p90": _quantile(vs_static, 90),
            "cost_ratio_vs_oracle_median": _quantile(vs_oracle, 50),
            "cost_ratio_vs_oracle_p90": _quantile(vs_oracle, 90),
            "worst_case": {"index": worst_r["index"], "shape": worst_r["shape"], "fleet": worst_r["fleet"],
                           "mix": worst_r["mix"], "fault": worst_r["fault"], "beyond_max": worst_r["beyond_max"],
                           "slo_attainment": worst_e["slo_attainment"],
                           "cost_ratio_vs_static": worst_e["cost_ratio_vs_static"],
                           "scenario_file": worst_r["scenario_file"]},
            **{f"failed_by_{k}": dict(sorted(v.items())) for k, v in failed.items()},
        }
    return out


def build_report(seed: int, tick_s: float, rows: Sequence[Mapping[str, Any]], labels: Sequence[str]) -> dict[str, Any]:
    from controller.bench.runner import _jsonable

    by_shape: dict[str, int] = {}
    for r in rows:
        if "shape" in r:
            by_shape[r["shape"]] = by_shape.get(r["shape"], 0) + 1
    return _jsonable({
        "seed": int(seed), "tick_s": float(tick_s), "cases": len(rows),
        "cases_ok": sum(1 for r in rows if "error" not in r),
        "errors": [{"index": r["index"], "error": r["error"]} for r in rows if "error" in r],
        "shapes": dict(sorted(by_shape.items())),
        "beyond_max_cases": sum(1 for r in rows if r.get("beyond_max")),
        "feasible_cases": sum(1 for r in rows if r.get("feasible")),
        "policies": summarise(rows, labels),
        "cases_detail": list(rows),
    })


# --------------------------------------------------------------------------- outputs


def _pct(v: Any) -> str:
    return "–" if not isinstance(v, (int, float)) else f"{100 * v:.1f}%"


def _x(v: Any) -> str:
    return "–" if not isinstance(v, (int, float)) else f"{v:.2f}"


def render_table(report: Mapping[str, Any]):
    """A rich Table, one row per policy, sorted by pass rate then median cost ratio."""
    from rich.table import Table

    t = Table(title=f"governor bench robustness: {report['cases']} cases ({report['feasible_cases']} feasible, "
                    f"{report['beyond_max_cases']} beyond max), seed {report['seed']}, tick {report['tick_s']:g} s")
    for c in ("policy", "SLO pass", "pass (feasible)", "crit min", "std min", "× static p50", "× static p90",
              "× oracle p50", "× oracle p90", "worst case", "failed by shape"):
        t.add_column(c, justify="left" if c in ("policy", "worst case", "failed by shape") else "right")
    pols = report["policies"]
    order = sorted(pols, key=lambda n: (-(pols[n].get("slo_pass_rate") or 0.0),
                                        pols[n].get("cost_ratio_vs_static_median") or math.inf, n))
    for n in order:
        e = pols[n]
        w = e.get("worst_case") or {}
        att = w.get("slo_attainment") or {}
        worst = (f"#{w['index']} {w['shape']} / {w['fleet']} ({_pct(att.get('critical'))} / "
                 f"{_pct(att.get('standard'))})") if w else "–"
        fails = ", ".join(f"{s} {c}" for s, c in (e.get("failed_by_shape") or {}).items()) or "–"
        t.add_row(n, _pct(e.get("slo_pass_rate")), _pct(e.get("slo_pass_rate_feasible")),
                  _pct(e.get("critical_min")), _pct(e.get("standard_min")),
                  _x(e.get("cost_ratio_vs_static_median")), _x(e.get("cost_ratio_vs_static_p90")),
                  _x(e.get("cost_ratio_vs_oracle_median")), _x(e.get("cost_ratio_vs_oracle_p90")), worst, fails)
    t.caption = ("SLO pass = share of cases keeping ≥ 99 % of critical and standard tasks within their SLOs "
                 "(feasible: of the cases where the verified static fleet, the oracle or the capacity ceiling does); "
                 "× static / × oracle = cost per successful task over the verified static fleet's / the oracle's "
                 "on the same case (median, p90 over cases); worst case = lowest min(critical, standard).")
    return t


ZOOM_FROM_PCT = 95.0  # the right panel: the cases near the bar, where the policies that matter sit


def write_png(path: Path, report: Mapping[str, Any]) -> Path:
    """Cost ratio vs the static fleet against min(critical, standard) attainment, one point per case and
    policy: every case on the left, the cases at or above ZOOM_FROM_PCT on the right."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import ScalarFormatter

    fig, axes = plt.subplots(1, 2, figsize=(15, 7), constrained_layout=True)
    cmap = plt.get_cmap("tab10")
    for i, name in enumerate(report["policies"]):
        xs, ys = [], []
        for r in report["cases_detail"]:
            e = (r.get("policies") or {}).get(name)
            if e and e.get("cost_ratio_vs_static") is not None:
                xs.append(100.0 * _low(e))
                ys.append(e["cost_ratio_vs_static"])
        style = {"marker": "x", "color": "black"} if name == ORACLE else {"marker": "o", "color": cmap(i % 10)}
        for ax, lo in zip(axes, (0.0, ZOOM_FROM_PCT), strict=True):
            keep = [j for j, x in enumerate(xs) if x >= lo]
            ax.scatter([xs[j] for j in keep], [ys[j] for j in keep], s=18, alpha=0.7, label=name, **style)
    for ax, title in zip(axes, ("every case", f"cases at >= {ZOOM_FROM_PCT:g} %"), strict=True):
        ax.axvline(99.0, color="red", linestyle=":", linewidth=1.2, label="99 % bar")
        ax.axhline(1.0, color="grey", linestyle="--", linewidth=1.0)
        ax.set_xlabel("min(critical, standard) task SLO attainment, % (per case)")
        ax.set_ylabel("cost per successful task / verified static fleet's")
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(ScalarFormatter())
        ax.grid(True, alpha=0.3, which="both")
        ax.set_title(title)
    axes[1].set_xlim(ZOOM_FROM_PCT - 0.1, 100.1)
    axes[0].legend(fontsize=8, ncol=2)
    fig.suptitle(f"bench robustness: {report['cases']} cases, seed {report['seed']}")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------- CLI


def run_cases(seed: int, indices: Sequence[int], labels: Sequence[Any], out_dir: Path, *, workers: int,
              tick_s: float = TICK_S, quiet: bool = False,
              wall_s: dict[int, float] | None = None,
              cpu_s: dict[int, float] | None = None, case_fn: CaseFn = run_case) -> list[dict[str, Any]]:
    """Run `indices` in `workers` processes (1: in this one); rows in index order. `wall_s` and
    `cpu_s`, when given, receive each case's wall and CPU seconds. `case_fn(seed, k, labels, out_dir,
    tick_s)` makes one case's row (default `run_case`; `bench frontier` passes its own, a module-level
    function or a partial of one, so the worker processes can receive it)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    rows: dict[int, dict[str, Any]] = {}
    console = Console(stderr=True)
    with Progress(TextColumn("cases"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.fields[last]}"), console=console, disable=quiet) as bar:
        task = bar.add_task("cases", total=len(indices), last="")

        def done(k: int, row: dict[str, Any], wall: float, cpu: float) -> None:
            rows[k] = row
            if wall_s is not None:
                wall_s[k] = wall
            if cpu_s is not None:
                cpu_s[k] = cpu
            what = "error" if "error" in row else f"{row['shape']} / {row['fleet']}"
            bar.update(task, advance=1, last=f"#{k} {what}")

        if workers <= 1:
            for k in indices:
                done(k, *_timed_case(seed, k, labels, str(out_dir), tick_s, case_fn))
        else:
            with ProcessPoolExecutor(max_workers=workers) as pool:
                futures = {pool.submit(_timed_case, seed, k, list(labels), str(out_dir), tick_s, case_fn): k
                           for k in indices}
                for f in as_completed(futures):
                    k = futures[f]
                    try:
                        row, wall, cpu = f.result()
                    except Exception as exc:  # noqa: BLE001 - one broken case must not hide the others
                        row, wall, cpu = {"index": k, "error": f"{type(exc).__name__}: {exc}"}, 0.0, 0.0
                    done(k, row, wall, cpu)
    return [rows[k] for k in sorted(rows)]


def _positive_int(text: str, option: str, lo: int, hi: int) -> int:
    from controller.bench.harness import BenchError

    try:
        v = int(text)
    except (TypeError, ValueError):
        raise BenchError(f"--{option}: {text!r} is not an integer") from None
    if not lo <= v <= hi:
        raise BenchError(f"--{option}: {v} is outside [{lo}, {hi}]")
    return v


def case_options(args: argparse.Namespace) -> tuple[int, int, float, list[int]]:
    """The options every bench over generated cases shares (robustness, frontier): --seed, --workers,
    --tick and --case / --cases, checked; BenchError names the bad one."""
    from controller.bench.harness import BenchError

    seed = _positive_int(str(args.seed), "seed", 0, 2**31 - 1)
    workers = _positive_int(str(args.workers), "workers", 1, 64)
    tick_s = float(args.tick_s) if getattr(args, "tick_s", None) is not None else TICK_S
    if not (math.isfinite(tick_s) and 1.0 <= tick_s <= 600.0):
        raise BenchError(f"--tick must be between 1 and 600 simulated seconds (got {tick_s:g})")
    if getattr(args, "case", None) is not None:
        indices = [_positive_int(str(args.case), "case", 0, MAX_CASES - 1)]
    else:
        indices = list(range(_positive_int(str(args.cases), "cases", 1, MAX_CASES)))
    return seed, workers, tick_s, indices


def cmd_bench_robustness(args: argparse.Namespace) -> int:
    from controller.bench.generator import GeneratorError
    from controller.bench.harness import BenchError

    prog = "governor bench robustness"
    clock = WallClock()
    t0 = clock.monotonic_s()
    try:
        seed, workers, tick_s, indices = case_options(args)
        labels = parse_labels(getattr(args, "policies", None))
    except (BenchError, GeneratorError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    out_dir = Path(args.out or DEFAULT_OUT)
    out_dir.mkdir(parents=True, exist_ok=True)
    workers = max(1, min(workers, len(indices)))
    case_wall: dict[int, float] = {}
    case_cpu: dict[int, float] = {}
    rows = run_cases(seed, indices, labels, out_dir, workers=workers, tick_s=tick_s,
                     quiet=getattr(args, "quiet", False), wall_s=case_wall, cpu_s=case_cpu)
    report = build_report(seed, tick_s, rows, labels)
    # The only machine-dependent fields, top level (`cases_detail` compares equal across runs).
    report["wall_s"] = round(clock.monotonic_s() - t0, 1)
    report["workers"] = workers
    report["case_wall_s"] = {str(k): v for k, v in sorted(case_wall.items())}
    report["case_cpu_s"] = {str(k): v for k, v in sorted(case_cpu.items())}
    report["cpu_s_total"] = round(sum(case_cpu.values()), 1)
    stem = f"robustness-seed{seed}" + (f"-case{indices[0]}" if getattr(args, "case", None) is not None else "")
    json_path = out_dir / f"{stem}.json"
    json_path.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    png_path = write_png(out_dir / f"{stem}.png", report)
    wall = clock.monotonic_s() - t0
    if args.json:
        print(json.dumps(report, sort_keys=True))
    else:
        from rich.console import Console

        console = Console()
        if not console.is_terminal:
            console = Console(width=220)
        console.print(render_table(report))
    print(f"{prog}: {len(indices)} case(s) in {wall:.0f} s wall ({workers} worker(s), {report['cpu_s_total']:.0f} "
          f"CPU s in the cases); wrote {json_path} and {png_path}", file=sys.stderr)
    return 1 if report["errors"] else 0


__all__ = ["build_report", "case_entry", "case_fields", "cmd_bench_robustness", "default_labels", "parse_labels",
           "render_table", "run_case", "run_cases", "summarise", "write_png"]
