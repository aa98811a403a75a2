"""The plots docs/BENCHMARKS.md shows, drawn from the saved results (PNG, small: ~80 dpi).

Each entry of `CHARTS` is a file under docs/bench/ and the function that draws it from the results it
names. Matplotlib's Agg output is the same for the same results and version, but `--check` does not
compare the images (a font or library update would change bytes, not figures): it checks the tables,
and that every chart exists.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controller.bench.benchdoc.render import COST, PLANNER_SCALE, Results, scenario_order, shipped_rows
from controller.bench.report import meets_bar

DPI = 80


@dataclass(frozen=True)
class Chart:
    file: str  # under docs/bench/
    sources: tuple[str, ...]
    draw: Callable[[Results, Path], None]


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, metadata={"Software": None})
    _plt().close(fig)


def shippedshipped_rows(results: Results, path: Path) -> None:
    """Per scenario: the MPC's and the oracle's cost over the cheapest baseline at the bar (or the verified
    static fleet where no baseline reaches it); filled where the MPC meets the bar."""
    plt = _plt()
    rows = []
    for name, r in shipped_rows(results):
        pols = r["policies"]
        ref_name = r.get("best_baseline_at_slo") or "static"
        ref = pols.get(ref_name, {}).get(COST)
        mpc, ora = pols.get("mpc", {}), pols.get("oracle", {})
        if not ref or mpc.get(COST) is None:
            continue
        rows.append((name, mpc[COST] / ref, (ora.get(COST) or float("nan")) / ref, meets_bar(mpc),
                     ref_name if r.get("best_baseline_at_slo") else "static (none at the bar)"))
    rows.sort(key=lambda x: scenario_order(x[0]), reverse=True)
    fig, ax = plt.subplots(figsize=(8, 0.28 * len(rows) + 1.4), constrained_layout=True)
    y = range(len(rows))
    ax.barh(list(y), [r[1] for r in rows], color=["#2a7ab9" if r[3] else "white" for r in rows],
            edgecolor="#2a7ab9", label="MPC (filled: ≥ 99 % of critical and standard)")
    ax.plot([r[2] for r in rows], list(y), "k|", markersize=10, label="oracle")
    ax.axvline(1.0, color="grey", lw=1, ls="--")
    ax.set_yticks(list(y), [r[0] for r in rows], fontsize=8)
    ax.set_xlabel("cost per successful task ÷ the cheapest baseline at the bar (else the verified static fleet)",
                  fontsize=8)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.05), ncol=2, fontsize=8)
    ax.set_title("governor bench all: the MPC and the oracle against the best baseline at the bar", fontsize=9)
    _save(fig, path)


def robustness(results: Results, path: Path) -> None:
    """Per policy: the share of cases at or above each min(critical, standard) attainment."""
    plt = _plt()
    res = results["robustness-seed1"]["result"]
    fig, ax = plt.subplots(figsize=(8, 4.5), constrained_layout=True)
    for name in sorted(res["policies"]):
        vals = []
        for case in res["cases_detail"]:
            e = (case.get("policies") or {}).get(name)
            att = (e or {}).get("slo_attainment") or {}
            c, s = att.get("critical"), att.get("standard")
            if isinstance(c, (int, float)) and isinstance(s, (int, float)):
                vals.append(100 * min(c, s))
        if not vals:
            continue
        vals.sort(reverse=True)
        share = [100 * (i + 1) / len(vals) for i in range(len(vals))]
        ax.step(share, vals, where="post", label=name, lw=1.5 if name == "mpc" else 1)
    ax.axhline(99, color="grey", lw=1, ls="--")
    ax.set_ylim(80, 100.5)
    ax.set_xlabel("share of the cases (%)")
    ax.set_ylabel("min(critical, standard) attainment, % (cut at 80)")
    ax.legend(fontsize=8, loc="lower left")
    ax.set_title(f"governor bench robustness: {res['cases']} cases of seed {res['seed']}", fontsize=9)
    _save(fig, path)


def planner_scale(results: Results, path: Path) -> None:
    """Left: the planner's CPU per tick against the pools (the budgeted search p50 and p99, the complete
    search p50). Right: the daemon's tick per phase (p50) against pools and replicas."""
    plt = _plt()
    runs = [results[n]["result"] for n in PLANNER_SCALE]
    pools = [r["pools"] for r in runs]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(9, 3.6), constrained_layout=True)
    ax.plot(pools, [r["cpu_p50_ms"] for r in runs], "o-", color="#2a7ab9", label="planner p50 (budgeted)")
    ax.plot(pools, [r["cpu_p99_ms"] for r in runs], "o--", color="#2a7ab9", label="planner p99 (budgeted)")
    ax.plot(pools, [r["complete_cpu_p50_ms"] for r in runs], "s-", color="#c0392b", label="complete search p50")
    for r in runs:
        ax.annotate(f"budget {r['budget_ms']:g}", (r["pools"], r["cpu_p99_ms"]), fontsize=7,
                    textcoords="offset points", xytext=(4, -10))
    ax.set_yscale("log")
    ax.set_xlabel("pools (route groups of 1-3 pools)", fontsize=8)
    ax.set_ylabel("CPU ms per tick, one core", fontsize=8)
    ax.legend(fontsize=7)
    ax.set_title("governor bench planner", fontsize=9)
    ticks = [results[n]["result"] for n in ("tick-prometheus", "tick-mpc-100") if n in results]
    labels = [f"{r['pools']} pools\n{r['replicas']:,} replicas\n{r.get('policy', 'slo-feedback')}"
              + ("\n(thread CPU)" if r.get("thread_cpu_p50_ms") else "\n(wall)") for r in ticks]
    width = 0.25
    for i, (phase, colour) in enumerate((("read", "#7fb3d5"), ("step", "#2a7ab9"), ("actuate", "#f5b041"))):
        vals = [(r.get("thread_cpu_p50_ms") or r["phases_p50_ms"])[phase] for r in ticks]
        bx.bar([x + (i - 1) * width for x in range(len(ticks))], vals, width=width, color=colour, label=phase)
    bx.set_xticks(list(range(len(ticks))), labels)
    bx.set_yscale("log")
    bx.set_ylabel("ms per tick (p50), read through Prometheus", fontsize=8)
    bx.tick_params(labelsize=7)
    bx.legend(fontsize=7)
    bx.set_title("governor bench tick", fontsize=9)
    _save(fig, path)


def frontier(results: Results, path: Path) -> None:
    """SLO pass rate against median cost ratio, one curve per policy (the bench's own plot)."""
    from controller.bench.frontier import write_png

    write_png(path, results["frontier"]["result"], dpi=DPI)


CHARTS: tuple[Chart, ...] = (
    Chart("shipped-scenarios.png", ("all",), shippedshipped_rows),
    Chart("robustness-seed1.png", ("robustness-seed1",), robustness),
    Chart("planner-scale.png", (*PLANNER_SCALE, "tick-prometheus", "tick-mpc-100"), planner_scale),
    Chart("frontier.png", ("frontier",), frontier),
)


def draw_all(results: Mapping[str, Mapping[str, Any]], folder: Path) -> list[Path]:
    out = []
    for c in CHARTS:
        if all(s in results for s in c.sources):
            c.draw(results, folder / c.file)
            out.append(folder / c.file)
    return out
