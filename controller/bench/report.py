"""The bench's outputs: the JSON report, the rich table and the PNG of the control loop over time.

Pure formatting of `RunResult`s: no simulation here. The JSON is the interface
other work relies on (`governor bench policies --json`):

    {"scenario", "seed", "tick_s", "best_baseline", "best_baseline_at_slo", "profiles", "static_replicas",
     "policies": {NAME: {"cost_per_successful_task_usd", "successful_tasks", "tasks",
                         "slo_attainment": {"critical", "standard", "sheddable"},
                         "gpu_hours", "ttft_p95_s", "tpot_p95_s", "hit_rate", "shed",
                         "failed", ...}}}

with one entry per policy run plus "oracle" (and "oracle-joint" and "oracle-lag", with
"ratio_to_oracle_joint" / "ratio_to_oracle_lag" in every entry, where a route group has several
pools). "best_baseline" is the cheapest baseline per successful task whatever its attainment;
"best_baseline_at_slo" the cheapest one that keeps at least `SLO_BAR` (99 %) of critical and of
standard tasks (None if none does), and each entry's "ratio_to_best_baseline_at_slo" compares
with it. Nothing time-of-day or wall-clock dependent goes in it, so two runs with the same seed
give identical JSON.
Must not: run policies, or write anywhere but the paths it is given.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeGuard

from controller.bench.runner import RunResult, _jsonable
from controller.names import GOVERNOR_POLICIES, POLICY_NAMES
from controller.types import PRIORITY_CLASSES

if TYPE_CHECKING:
    from rich.console import JustifyMethod

# Base policies that count as baselines for "ratio to the best baseline" (not Governor's own policies).
BASELINE_BASES = tuple(n for n in POLICY_NAMES if n not in GOVERNOR_POLICIES)

# The references, listed after the policies: the oracle (replicas per pool, the scenario's routing), the
# joint oracle (replicas and each route group's split, controller/bench/oracle_joint.py), the lagged
# reference (controller/bench/oracle_lag.py: `replay_lagged`) and the capacity ceiling
# (controller/bench/ceiling.py: every pool at its maximum, the sheddable class shed).
REFERENCES = ("oracle", "oracle-joint", "oracle-lag", "ceiling")

# The attainment bar for "best baseline at the SLO": the MPC's acceptance (critical and standard).
SLO_BAR = 0.99
SLO_BAR_CLASSES = ("critical", "standard")

SUMMARY_FIELDS = ("cost_per_successful_task_usd", "successful_tasks", "tasks", "cost_usd", "gpu_hours",
                  "ttft_p50_s", "ttft_p95_s", "tpot_p50_s", "tpot_p95_s", "hit_rate", "shed", "failed", "retried",
                  "timed_out", "preemptions", "requests", "completed", "duration_s")


def policy_entry(run: RunResult) -> dict[str, Any]:
    s = run.summary
    out: dict[str, Any] = {f: s.get(f) for f in SUMMARY_FIELDS}
    att = s.get("slo_attainment") or {}
    out["slo_attainment"] = {c: att.get(c) for c in PRIORITY_CLASSES}
    out["request_slo_attainment"] = {c: run.request_slo_attainment.get(c) for c in PRIORITY_CLASSES}
    out["scaling_actions"] = run.scaling_actions
    out["decisions"] = run.decisions
    out["changed_decisions"] = run.changed_decisions
    out["replicas_peak"] = {p: v.get("replicas_peak") for p, v in (s.get("per_pool") or {}).items()}
    if s.get("per_tenant"):  # scenarios with tenants: attainment, quota sheds and cost share per tenant
        out["per_tenant"] = s["per_tenant"]
    if run.params:
        out["params"] = _jsonable(run.params)
    if run.extra:
        out.update({k: _jsonable(v) for k, v in run.extra.items()})
    return out


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else 1000.0 * seconds


def _finite(x: Any) -> TypeGuard[float]:
    return isinstance(x, (int, float)) and math.isfinite(x)


def base_name(label: str) -> str:
    for b in sorted(BASELINE_BASES, key=len, reverse=True):
        if label == b or label.startswith(b + "-"):
            return b
    return label


def meets_bar(e: Mapping[str, Any], bar: float = SLO_BAR) -> bool:
    """True when the entry keeps at least `bar` of critical and of standard tasks."""
    att = e.get("slo_attainment") or {}
    return all(_finite(att.get(c)) and att[c] >= bar for c in SLO_BAR_CLASSES)


def best_baseline_at_slo(entries: Mapping[str, Mapping[str, Any]], bar: float = SLO_BAR) -> str | None:
    """The cheapest baseline per successful task among those that meet the attainment bar.

    Example: static 0.0044 at 99.5 %/100 %, kpa 0.0041 at 84 %/96 % → "static".
    """
    key = "cost_per_successful_task_usd"
    ok = {n: e[key] for n, e in entries.items()
          if base_name(n) in BASELINE_BASES and _finite(e.get(key)) and meets_bar(e, bar)}
    return min(ok, key=lambda n: (ok[n], n)) if ok else None


def add_ratios(entries: dict[str, dict[str, Any]]) -> str | None:
    """Add ratio_to_best_baseline, ratio_to_best_baseline_at_slo and ratio_to_oracle; return the best baseline."""
    key = "cost_per_successful_task_usd"
    baselines = {n: e[key] for n, e in entries.items() if base_name(n) in BASELINE_BASES and _finite(e.get(key))}
    best = min(baselines, key=lambda n: (baselines[n], n)) if baselines else None
    at_slo = best_baseline_at_slo(entries)
    oracle = entries.get("oracle", {}).get(key)
    joint = entries.get("oracle-joint", {}).get(key)
    lag = entries.get("oracle-lag", {}).get(key)
    for e in entries.values():
        v = e.get(key)
        e["ratio_to_best_baseline"] = v / baselines[best] if best and _finite(v) else None
        e["ratio_to_best_baseline_at_slo"] = v / entries[at_slo][key] if at_slo and _finite(v) else None
        e["ratio_to_oracle"] = v / oracle if _finite(oracle) and oracle > 0 and _finite(v) else None
        if "oracle-joint" in entries:
            e["ratio_to_oracle_joint"] = v / joint if _finite(joint) and joint > 0 and _finite(v) else None
        if "oracle-lag" in entries:
            e["ratio_to_oracle_lag"] = v / lag if _finite(lag) and lag > 0 and _finite(v) else None
    return best


def build_report(scenario_name: str, seed: int, tick_s: float, runs: Sequence[RunResult],
                 profiles: Mapping[str, Any], static_replicas: Mapping[str, int],
                 scenario_file: str = "") -> dict[str, Any]:
    entries = {r.policy: policy_entry(r) for r in runs}
    best = add_ratios(entries)
    return _jsonable({
        "scenario": scenario_name,
        "scenario_file": scenario_file,
        "seed": int(seed),
        "tick_s": float(tick_s),
        "best_baseline": best,
        "best_baseline_at_slo": best_baseline_at_slo(entries),
        "profiles": dict(profiles),
        "static_replicas": dict(static_replicas),
        "policies": entries,
    })


# --------------------------------------------------------------------------- table


def _fmt(v: Any, spec: str = ".3g", pct: bool = False) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    if pct:
        return f"{100 * v:.1f}%"
    if isinstance(v, int):
        return f"{v:,}"
    return format(v, spec)


def _oracle_suffix(e: Mapping[str, Any]) -> str:
    """" (×1.15, 2 repairs)", " (static)" or " (×1, SLO missed)": how the oracle's schedule was found."""
    parts = ["static" if e.get("fallback_static") else f"×{e['margin']:g}"]
    if e.get("repaired"):
        parts.append(f"{e['repaired']} repair{'s' if e['repaired'] > 1 else ''}")
    if not e.get("slo_met"):
        parts.append("SLO missed")
    return " (" + ", ".join(parts) + ")"


def _profile_note(report: Mapping[str, Any]) -> str:
    """", profile cost" for a table title when the replays ran under another than the default profile."""
    prof = report.get("objective_profile", "balanced")
    return f", profile {prof}" if prof != "balanced" else ""


def render_table(report: Mapping[str, Any]):
    """A rich Table with one row per policy (sorted by cost per successful task, oracle last)."""
    from rich.table import Table

    t = Table(title=f"{report['scenario']} (seed {report['seed']}, tick {report['tick_s']:g} s{_profile_note(report)})",
              show_lines=False)
    cols: list[tuple[str, JustifyMethod]] = [
            ("policy", "left"), ("$/succ. task", "right"), ("× best base", "right"), ("× best at SLO", "right"),
            ("× oracle", "right"),
            ("succ. tasks", "right"), ("SLO crit/std/shed", "right"), ("TTFT p50/p95 s", "right"),
            ("TPOT p50/p95 ms", "right"), ("GPU-h", "right"), ("hit", "right"), ("shed/fail/retry", "right"),
            ("scale acts", "right")]
    for name, just in cols:
        t.add_column(name, justify=just, no_wrap=True)
    pols = report["policies"]
    order = sorted((n for n in pols if n not in REFERENCES),
                   key=lambda n: (pols[n].get("cost_per_successful_task_usd") is None,
                                  pols[n].get("cost_per_successful_task_usd") or 0.0, n))
    order += [n for n in REFERENCES if n in pols]
    for n in order:
        e = pols[n]
        att = e["slo_attainment"]
        label = n + (" *" if n == report.get("best_baseline") else "")
        label += " †" if n == report.get("best_baseline_at_slo") else ""
        if n in REFERENCES and e.get("margin") is not None:
            label += _oracle_suffix(e)
        t.add_row(
            label,
            _fmt(e["cost_per_successful_task_usd"], ".4f"),
            _fmt(e.get("ratio_to_best_baseline"), ".2f"),
            _fmt(e.get("ratio_to_best_baseline_at_slo"), ".2f"),
            _fmt(e.get("ratio_to_oracle"), ".2f"),
            f"{_fmt(e['successful_tasks'])}/{_fmt(e['tasks'])}",
            "/".join(_fmt(att.get(c), pct=True) for c in PRIORITY_CLASSES),
            f"{_fmt(e['ttft_p50_s'], '.2f')}/{_fmt(e['ttft_p95_s'], '.2f')}",
            f"{_fmt(_ms(e['tpot_p50_s']), '.0f')}/{_fmt(_ms(e['tpot_p95_s']), '.0f')}",
            _fmt(e["gpu_hours"], ".1f"),
            _fmt(e["hit_rate"], pct=True),
            f"{_fmt(e['shed'])}/{_fmt(e['failed'])}/{_fmt(e['retried'])}",
            _fmt(e["scaling_actions"]),
        )
    t.caption = ("* cheapest baseline; † cheapest baseline with ≥ 99 % of critical and standard tasks. "
                 "SLO = share of tasks meeting their class's TTFT and TPOT SLOs. "
                 "Oracle: hindsight replica schedule (×margin on profiled capacity).")
    return t


def table_markdown(report: Mapping[str, Any]) -> str:
    """The same table as GitHub markdown (for docs/BENCHMARKS.md)."""
    pols = report["policies"]
    order = sorted((n for n in pols if n not in REFERENCES),
                   key=lambda n: (pols[n].get("cost_per_successful_task_usd") is None,
                                  pols[n].get("cost_per_successful_task_usd") or 0.0, n))
    order += [n for n in REFERENCES if n in pols]
    head = ("| policy | $/succ. task | × best baseline | × best at SLO | × oracle | succ. tasks | "
            "SLO crit / std / shed | TTFT p50 / p95 s | TPOT p50 / p95 ms | GPU-h | hit rate | "
            "shed / failed / retried | scaling actions |")
    lines = [head, "|" + "---|" * 13]
    for n in order:
        e = pols[n]
        att = e["slo_attainment"]
        label = f"**{n}**" if n == report.get("best_baseline") else n
        if n == report.get("best_baseline_at_slo"):
            label += " †"
        if n in REFERENCES and e.get("margin") is not None:
            label += _oracle_suffix(e)
        tp50 = None if e["tpot_p50_s"] is None else 1000 * e["tpot_p50_s"]
        tp95 = None if e["tpot_p95_s"] is None else 1000 * e["tpot_p95_s"]
        lines.append(
            f"| {label} | {_fmt(e['cost_per_successful_task_usd'], '.4f')} | "
            f"{_fmt(e.get('ratio_to_best_baseline'), '.2f')} | "
            f"{_fmt(e.get('ratio_to_best_baseline_at_slo'), '.2f')} | {_fmt(e.get('ratio_to_oracle'), '.2f')} | "
            f"{_fmt(e['successful_tasks'])} / {_fmt(e['tasks'])} | "
            + " / ".join(_fmt(att.get(c), pct=True) for c in PRIORITY_CLASSES)
            + f" | {_fmt(e['ttft_p50_s'], '.2f')} / {_fmt(e['ttft_p95_s'], '.2f')} | "
            f"{_fmt(tp50, '.0f')} / {_fmt(tp95, '.0f')} | "
            f"{_fmt(e['gpu_hours'], '.1f')} | {_fmt(e['hit_rate'], pct=True)} | "
            f"{_fmt(e['shed'])} / {_fmt(e['failed'])} / {_fmt(e['retried'])} | {_fmt(e['scaling_actions'])} |")
    return "\n".join(lines)


# --------------------------------------------------------------------------- several seeds


def _spread(values: Sequence[Any]) -> dict[str, float] | None:
    xs = [float(v) for v in values if _finite(v)]
    if not xs:
        return None
    return {"mean": sum(xs) / len(xs), "min": min(xs), "max": max(xs)}


def summarise_seeds(reports: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One scenario replayed under several seeds: per policy, how its figures spread across them.

    Per policy: mean/min/max of the cost per successful task, of each class's attainment and of
    the ratios to the oracle and to the best baseline at the SLO; `seeds_at_slo`, the seeds on
    which it kept ≥ 99 % of critical and of standard tasks; `seeds_beating_baselines`, the seeds
    on which it did that *and* cost less per successful task than every baseline that did too
    (a policy compared with the other baselines only); the worst crash recovery when the
    scenario has a crash (None = not within the horizon on some seed). Example: MPC at 0.0041,
    0.0043, 0.0042 with critical 99.4 %, 99.1 %, 98.9 % → cost mean 0.0042, critical min
    0.989, seeds_at_slo 2.
    """
    key = "cost_per_successful_task_usd"
    labels: list[str] = []
    for r in reports:
        labels.extend(n for n in r["policies"] if n not in labels)
    out: dict[str, Any] = {}
    for n in labels:
        es = [r["policies"][n] for r in reports if n in r["policies"]]
        at_slo = beats = 0
        for r in reports:
            e = r["policies"].get(n)
            if e is None or not meets_bar(e) or not _finite(e.get(key)):
                continue
            at_slo += 1
            rivals = [o[key] for m, o in r["policies"].items()
                      if m != n and base_name(m) in BASELINE_BASES and meets_bar(o) and _finite(o.get(key))]
            beats += int(n not in REFERENCES and all(e[key] < v for v in rivals))
        entry: dict[str, Any] = {
            "seeds": len(es),
            key: _spread([e.get(key) for e in es]),
            "slo_attainment": {c: _spread([(e.get("slo_attainment") or {}).get(c) for e in es])
                               for c in PRIORITY_CLASSES},
            "ratio_to_oracle": _spread([e.get("ratio_to_oracle") for e in es]),
            "ratio_to_best_baseline_at_slo": _spread([e.get("ratio_to_best_baseline_at_slo") for e in es]),
            "seeds_at_slo": at_slo,
            "seeds_beating_baselines": beats,
        }
        crashes = [e.get("crash_recovery") for e in es if e.get("crash_recovery")]
        if crashes:
            rec = [c.get("recovery_s") for c in crashes]
            entry["crash_recovery_s_max"] = None if any(v is None for v in rec) else max(rec)
        out[n] = entry
    first = reports[0] if reports else {}
    return _jsonable({"scenario": first.get("scenario"), "scenario_file": first.get("scenario_file", ""),
                      "tick_s": first.get("tick_s"), "objective_profile": first.get("objective_profile", "balanced"),
                      "seeds": [int(r["seed"]) for r in reports], "policies": out,
                      "per_seed": {str(r["seed"]): r for r in reports}})


def render_seeds_table(summary: Mapping[str, Any]):
    """A rich Table of `summarise_seeds`: one row per policy, sorted by mean cost (oracle last)."""
    from rich.markup import escape
    from rich.table import Table

    seeds = summary["seeds"]
    t = Table(title=f"{summary['scenario']} (seeds {', '.join(str(s) for s in seeds)}, tick {summary['tick_s']:g} s"
                    f"{_profile_note(summary)})")

    for name in ("policy", "$/succ. task mean [min–max]", "crit mean / min", "std mean / min", "shed mean",
                 "× oracle mean [max]", "at SLO", "beats baselines", "recovery s (worst)"):
        t.add_column(escape(name), justify="left" if name == "policy" else "right", no_wrap=True)
    pols = summary["policies"]
    key = "cost_per_successful_task_usd"

    def mean_cost(n: str) -> float:
        c = pols[n][key]
        return c["mean"] if c else math.inf

    order = sorted((n for n in pols if n not in REFERENCES), key=lambda n: (mean_cost(n), n))
    order += [n for n in REFERENCES if n in pols]
    for n in order:
        e = pols[n]
        c, att, ro = e[key], e["slo_attainment"], e["ratio_to_oracle"]

        def pct(d: Mapping[str, float] | None, k: str) -> str:
            return "–" if d is None else f"{100 * d[k]:.2f}%"

        t.add_row(
            escape(n),
            "–" if c is None else escape(f"{c['mean']:.4f} [{c['min']:.4f}–{c['max']:.4f}]"),
            f"{pct(att['critical'], 'mean')} / {pct(att['critical'], 'min')}",
            f"{pct(att['standard'], 'mean')} / {pct(att['standard'], 'min')}",
            pct(att["sheddable"], "mean"),
            "–" if ro is None or n in REFERENCES else escape(f"{ro['mean']:.2f} [{ro['max']:.2f}]"),
            f"{e['seeds_at_slo']}/{e['seeds']}",
            "–" if n in REFERENCES else f"{e['seeds_beating_baselines']}/{e['seeds']}",
            "–" if "crash_recovery_s_max" not in e else
            "never" if e["crash_recovery_s_max"] is None else f"{e['crash_recovery_s_max']:.0f}",
        )
    t.caption = ("at SLO: seeds with ≥ 99 % of critical and of standard tasks; beats baselines: seeds at SLO on which "
                 "the policy costs less per successful task than every baseline at SLO.")
    return t


# --------------------------------------------------------------------------- PNG


def _series(run: RunResult, what: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for p in run.timeline:
        pools = p["pools"].values()
        if what == "replicas":
            y = float(sum(pp["replicas_ready"] or 0 for pp in pools))
        elif what == "load":
            y = float(sum(pp["arrival_rps"] or 0.0 for pp in pools))
        elif what == "ttft":
            vals = [pp["ttft_p95_s"] for pp in pools if pp["ttft_p95_s"] is not None]
            y = max(vals) if vals else math.nan
        else:  # hit rate, arrival-weighted over pools
            num = sum((pp["hit_rate"] or 0.0) * (pp["arrival_rps"] or 0.0)
                      for pp in pools if pp["hit_rate"] is not None)
            den = sum((pp["arrival_rps"] or 0.0) for pp in pools if pp["hit_rate"] is not None)
            y = num / den if den > 0 else math.nan
        xs.append(p["t_s"] / 60.0)
        ys.append(y)
    return xs, ys


def write_png(path: Path | str, report: Mapping[str, Any], runs: Sequence[RunResult],
              slo_ttft_s: Mapping[str, float]) -> Path:
    """Replicas, load, p95 TTFT vs SLO and hit rate over time, one line per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    fig, axes = plt.subplots(4, 1, figsize=(11, 12), sharex=True, constrained_layout=True)
    panels = (("replicas", "ready replicas"), ("load", "arrivals (req/s)"), ("ttft", "p95 TTFT (s, log)"),
              ("hit", "prefix-cache hit rate"))
    cmap = plt.get_cmap("tab10")
    for i, run in enumerate(runs):
        style = {"color": "black", "linewidth": 2.0, "linestyle": "--"} if run.policy in REFERENCES else \
                {"color": cmap(i % 10), "linewidth": 1.2}
        for ax, (what, _) in zip(axes, panels, strict=True):
            xs, ys = _series(run, what)
            ax.plot(xs, ys, label=run.policy, **style)
    for ax, (_, label) in zip(axes, panels, strict=True):
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
    for j, (cls, v) in enumerate(sorted(slo_ttft_s.items(), key=lambda kv: kv[1])):
        axes[2].axhline(v, color="red", alpha=0.6 - 0.15 * j, linestyle=":", linewidth=1.2, label=f"SLO {cls} {v:g} s")
    axes[2].set_yscale("log")
    axes[3].set_ylim(0, 1)
    axes[-1].set_xlabel("simulated minutes")
    axes[0].legend(loc="upper left", fontsize=8, ncol=3)
    axes[2].legend(loc="upper left", fontsize=7, ncol=3)
    fig.suptitle(f"{report['scenario']} — seed {report['seed']}, tick {report['tick_s']:g} s")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
