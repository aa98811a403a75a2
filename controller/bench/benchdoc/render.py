"""What each generated region of the docs says, computed from the saved results alone.

`REGIONS` maps a region name (the `NAME` of `<!-- bench:NAME begin -->`) to the results it reads
(controller/bench/benchdoc/sources.py) and a function of those results that returns the region's
Markdown: a table with the command and commit that made it, or, for an inline region, a figure
inside a sentence. Nothing here runs a bench or reads a clock: the same results give the same text,
which is what `governor bench report --check` compares.

To add a table: a `Source` for the command's JSON, a function here that renders it, an entry in
`REGIONS`, and the markers where the doc wants it (CONTRIBUTING.md, "Adding a benchmark table").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

from controller.bench.report import meets_bar

Results = Mapping[str, Mapping[str, Any]]  # source name → saved envelope


@dataclass(frozen=True)
class Renderer:
    sources: tuple[str, ...]
    render: Callable[[Results], str]


# --------------------------------------------------------------------------- formatting


def _finite(x: Any) -> TypeGuard[float]:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def pct(x: Any, digits: int = 1) -> str:
    return f"{100 * x:.{digits}f} %" if _finite(x) else "–"


def num(x: Any, digits: int = 1) -> str:
    return f"{x:,.{digits}f}" if _finite(x) else "–"


def per_k(cost: Any) -> str:
    """$ per successful task → $ per 1,000 successful tasks, 3 decimals."""
    return f"{1000 * cost:.3f}" if _finite(cost) else "–"


def ratio(a: Any, b: Any) -> str:
    return f"{a / b:.2f}" if _finite(a) and _finite(b) and b > 0 else "–"


def short(commit: str) -> str:
    return commit[:7] if commit and commit != "unknown" else "unknown"


def provenance(env: Mapping[str, Any]) -> str:
    """One line: the command, the commit, when, on what, how long."""
    commit = f"`{short(str(env.get('commit')))}`" + (" (with local changes)" if env.get("dirty") else "")
    m = env.get("machine") or {}
    bits = []
    if m.get("cpus"):
        bits.append(f"{m['cpus']} CPUs" + (f", {m['cpu_model']}" if m.get("cpu_model") else ""))
    if _finite(m.get("load_average_1m")):
        bits.append(f"load average {m['load_average_1m']:.1f} at the start")
    if _finite(env.get("wall_s")):
        bits.append(f"{env['wall_s']:,.0f} s wall")
    how = f" ({'; '.join(bits)})" if bits else ""
    if env.get("recorded"):  # figures measured once and transcribed, not a saved output
        note = f" {env['note']}" if env.get("note") else ""
        return (f"`{env['command']}` at {commit}, {env.get('recorded_on', '?')}{how}: measured then and "
                f"transcribed, not rerun by `make benchmarks-doc`.{note}")
    return f"`{env['command']}` at {commit}, {env.get('recorded_on', '?')}{how}."


def table(head: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool] | None = None) -> str:
    right = right or [False] + [True] * (len(head) - 1)
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---:" if r else "---" for r in right) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


# --------------------------------------------------------------------------- bench all


FAMILIES = ("azure-conv", "azure-code", "mooncake-conv", "servegen-diurnal", "demo", "tiers", "mixed-sku",
            "pd-split", "agentic", "multi-tenant")
VARIANTS = ("", "-crash", "-surge")
POLICY_ORDER = ("static", "hpa", "kpa", "sla-planner", "scorer-kpa", "llm-d-stack", "aibrix-stack", "dynamo-stack",
                "slo-feedback", "mpc", "oracle", "oracle-joint", "oracle-lag")
COST = "cost_per_successful_task_usd"


def scenario_order(name: str) -> tuple[int, int, str]:
    for i, fam in enumerate(FAMILIES):
        for j, v in enumerate(VARIANTS):
            if name == fam + v:
                return (i, j, name)
    return (len(FAMILIES), 0, name)


def shipped_rows(results: Results) -> list[tuple[str, Mapping[str, Any]]]:
    rows = results["all"]["result"]["scenarios"]
    return sorted(((n, r) for n, r in rows.items() if "error" not in r), key=lambda nr: scenario_order(nr[0]))


def _att(e: Mapping[str, Any] | None, digits: int = 1) -> str:
    att = (e or {}).get("slo_attainment") or {}
    c, s = att.get("critical"), att.get("standard")
    if not (_finite(c) and _finite(s)):
        return "–"
    return f"{100 * c:.{digits}f} / {100 * s:.{digits}f}"


def _policies_present(results: Results) -> list[str]:
    seen = {p for _, r in shipped_rows(results) for p in r.get("policies", {})}
    return [p for p in POLICY_ORDER if p in seen] + sorted(seen - set(POLICY_ORDER))


def all_mpc(results: Results) -> str:
    """The MPC per shipped scenario against the cheapest baseline at the bar, static and the oracle."""
    env = results["all"]
    rows = []
    for name, r in shipped_rows(results):
        pols = r["policies"]
        mpc = pols.get("mpc", {})
        at_slo = r.get("best_baseline_at_slo")
        best = pols.get(at_slo, {}) if at_slo else {}
        ora = pols.get("oracle", {})
        stat = pols.get("static", {})
        rows.append([
            name,
            f"{per_k(mpc.get(COST))} ({_att(mpc, 2)})" + (" ✓" if meets_bar(mpc) else ""),
            f"{at_slo} {per_k(best.get(COST))}" if at_slo else "none",
            ratio(mpc.get(COST), best.get(COST)) if at_slo else "–",
            f"{per_k(stat.get(COST))} ({_att(stat)})",
            f"{per_k(ora.get(COST))} ({_att(ora)})",
            ratio(mpc.get(COST), ora.get(COST)),
        ])
    head = ["scenario", "MPC: $ / 1,000 tasks (critical / standard %)", "cheapest baseline at the bar †",
            "MPC ÷ †", "verified static (crit / std %)", "oracle (crit / std %)", "MPC ÷ oracle"]
    return provenance(env) + "\n\n" + table(head, rows, [False, False, False, True, False, False, True])


def all_matrix(results: Results) -> str:
    """Every policy's cost per 1,000 successful tasks on every scenario; bold where it meets the bar."""
    env = results["all"]
    names = _policies_present(results)
    rows = []
    for name, r in shipped_rows(results):
        pols = r["policies"]
        at_slo = r.get("best_baseline_at_slo")
        cells = [name]
        for p in names:
            e = pols.get(p)
            if not e or not _finite(e.get(COST)):
                cells.append("")
                continue
            v = per_k(e[COST])
            v = f"**{v}**" if meets_bar(e) else v
            cells.append(v + (" †" if p == at_slo else ""))
        rows.append(cells)
    ran = {p: [r["policies"][p] for _, r in shipped_rows(results) if p in r["policies"]] for p in names}
    rows.append(["at the bar (of those run)"] + [f"{sum(1 for e in ran[p] if meets_bar(e))} of {len(ran[p])}"
                                                  for p in names])
    return provenance(env) + "\n\n" + table(["scenario", *names], rows)


def _recovery(e: Mapping[str, Any] | None) -> str:
    rec = (e or {}).get("crash_recovery")
    if not isinstance(rec, Mapping):
        return ""
    s = rec.get("recovery_s")
    late = rec.get("critical_late_frac_10min")
    return (f"{s:.0f} s" if _finite(s) else "never") + (f" ({pct(late)})" if _finite(late) else "")


def all_crash(results: Results) -> str:
    """Crash recovery per crash scenario and policy."""
    env = results["all"]
    crashes = [(n, r) for n, r in shipped_rows(results) if n.endswith("-crash")]
    names = [p for p in _policies_present(results) if any(_recovery(r["policies"].get(p)) for _, r in crashes)]
    rows = [[n] + [_recovery(r["policies"].get(p)) for p in names] for n, r in crashes]
    return provenance(env) + "\n\n" + table(["scenario", *names], rows)


def _mpc_passes(results: Results) -> tuple[int, int]:
    rows = shipped_rows(results)
    return sum(1 for _, r in rows if meets_bar(r["policies"].get("mpc", {}))), len(rows)


def all_mpc_pass(results: Results) -> str:
    n, total = _mpc_passes(results)
    return f"{n} of the {total}"


def all_mpc_cheapest(results: Results) -> str:
    """On how many scenarios the MPC meets the bar and costs less than every baseline that does."""
    n = 0
    for _, r in shipped_rows(results):
        mpc = r["policies"].get("mpc", {})
        at_slo = r.get("best_baseline_at_slo")
        best = r["policies"].get(at_slo, {}).get(COST) if at_slo else None
        if meets_bar(mpc) and (best is None or (_finite(mpc.get(COST)) and mpc[COST] < best)):
            n += 1
    return str(n)


def all_wall(results: Results) -> str:
    res = results["all"]["result"]
    return f"{res['wall_s']:,.0f} s on {res['workers']} worker processes"


# --------------------------------------------------------------------------- robustness


def _rob(results: Results) -> Mapping[str, Any]:
    return results["robustness-seed1"]["result"]


def _rob_order(res: Mapping[str, Any]) -> list[str]:
    pols = res["policies"]
    return sorted(pols, key=lambda n: (-(pols[n].get("slo_pass_rate") or 0.0),
                                       pols[n].get("cost_ratio_vs_static_median") or math.inf, n))


def _crit_at_least(res: Mapping[str, Any], policy: str, bar: float = 0.97) -> tuple[int, int]:
    cases = [c for c in res.get("cases_detail", []) if policy in (c.get("policies") or {})]
    ok = sum(1 for c in cases if _finite((c["policies"][policy].get("slo_attainment") or {}).get("critical"))
             and c["policies"][policy]["slo_attainment"]["critical"] >= bar)
    return ok, len(cases)


def robustness(results: Results) -> str:
    env = results["robustness-seed1"]
    res = env["result"]
    rows = []
    for n in _rob_order(res):
        e = res["policies"][n]
        w = e.get("worst_case") or {}
        watt = w.get("slo_attainment") or {}
        worst = (f"#{w['index']} {w['shape']}, {w['fleet']}, {w['mix']}"
                 + (f", {w['fault']}" if w.get("fault") not in (None, "none") else "")
                 + f" ({pct(watt.get('critical'))} / {pct(watt.get('standard'))})") if w else "–"
        c97, ncases = _crit_at_least(res, n)
        rows.append([n, pct(e.get("slo_pass_rate")), pct(e.get("slo_pass_rate_feasible")),
                     pct(e.get("critical_min")), pct(e.get("standard_min")), f"{c97} of {ncases}",
                     f"{num(e.get('cost_ratio_vs_static_median'), 2)} / {num(e.get('cost_ratio_vs_static_p90'), 2)}",
                     num(e.get("cost_ratio_vs_oracle_median"), 2), worst])
    head = ["policy", "SLO pass", "pass (feasible)", "critical min", "standard min", "critical ≥ 97 %",
            "× static p50 / p90", "× oracle p50", "worst case (critical / standard)"]
    intro = (f"{res['cases']} cases of seed {res['seed']}, tick {res['tick_s']:g} s: {res['feasible_cases']} feasible "
             f"(the verified static fleet, the oracle or the capacity ceiling passes them), "
             f"{res['beyond_max_cases']} whose busiest minute is beyond max_replicas"
             + (f"; {len(res['errors'])} failed to run" if res.get("errors") else "") + ".")
    return provenance(env) + " " + intro + "\n\n" + table(head, rows, [False] + [True] * 7 + [False])


def _counts(d: Mapping[str, int] | None) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted((d or {}).items(), key=lambda kv: (-kv[1], kv[0]))) or "–"


def robustness_failures(results: Results) -> str:
    res = _rob(results)
    rows = []
    for n in _rob_order(res):
        e = res["policies"][n]
        failed = e.get("cases", 0) - round((e.get("slo_pass_rate") or 0.0) * e.get("cases", 0))
        rows.append([n, str(failed), _counts(e.get("failed_by_shape")), _counts(e.get("failed_by_fleet")),
                     _counts(e.get("failed_by_fault"))])
    return table(["policy", "failed", "by traffic shape", "by fleet", "by fault"], rows,
                 [False, True, False, False, False])


def _rob_pass(policy: str) -> Callable[[Results], str]:
    def render(results: Results) -> str:
        return pct(_rob(results)["policies"][policy]["slo_pass_rate"])
    return render


def _rob_cost(policy: str) -> Callable[[Results], str]:
    def render(results: Results) -> str:
        return f"{num(_rob(results)['policies'][policy]['cost_ratio_vs_static_median'], 2)}×"
    return render


def robustness_mpc_crit97(results: Results) -> str:
    ok, n = _crit_at_least(_rob(results), "mpc")
    return f"{ok} of the {n}"


# --------------------------------------------------------------------------- frontier


def _frontier_row(name: str, setting: str, e: Mapping[str, Any], mpc: str) -> list[str]:
    return [name, setting, f"{pct(e.get('slo_pass_rate'))} ({e.get('passes')} of {e.get('cases')})",
            pct(e.get("slo_pass_rate_feasible")),
            f"{num(e.get('cost_ratio_vs_static_median'), 2)} / {num(e.get('cost_ratio_vs_static_p90'), 2)}",
            num(e.get("good_requests_per_gpu_s"), 3), mpc]


def frontier(results: Results) -> str:
    env = results["frontier"]
    res = env["result"]
    dom = res.get("dominance") or {}
    mpc_knob = (res["policies"].get("mpc") or {}).get("knob", "")
    rows = []
    order = sorted(res["policies"], key=lambda n: (POLICY_ORDER.index(n) if n in POLICY_ORDER else 99, n))
    for name in order:
        pol = res["policies"][name]
        by_setting = {d["setting"]: d for d in dom.get(name, [])}
        for p in pol["points"]:
            d = by_setting.get(p["setting"])
            mpc = ""
            if d is not None:
                m = d.get("mpc_at_least_less_one")
                mpc = "none" if m is None else (f"{mpc_knob} {m['setting']} ({m['passes']}, "
                                                f"{num(m['cost_ratio_vs_static_median'], 2)}×)"
                                                + (", no dearer" if d["dominated"] else ", dearer"))
            rows.append(_frontier_row(name, f"{pol['knob']} {p['setting']}" + (" (shipped)" if p["default"] else ""),
                                      p, mpc))
    for n, e in res["references"].items():
        rows.append(_frontier_row(n, "(reference)", e, ""))
    head = ["policy", "setting", "SLO pass", "pass (feasible)", "× static p50 / p90", "good requests / GPU-s",
            "cheapest MPC setting passing as many less one"]
    fams: dict[str, int] = {}
    for r in res.get("cases_detail") or []:
        fams[r.get("family")] = fams.get(r.get("family"), 0) + 1
    intro = (f"{res['cases']} cases of seed {res['seed']} (" + ", ".join(f"{v} {k}" for k, v in sorted(fams.items()))
             + f"), tick {res['tick_s']:g} s: {res['feasible_cases']} feasible (the verified static fleet or the "
             f"capacity ceiling passes them), the ceiling passes {res['ceiling_passes']}"
             + (f"; {len(res['errors'])} failed to run" if res.get("errors") else "")
             + f"; {res.get('replays', 0):,} replays, {num(res.get('cpu_s_per_replay'), 2)} CPU s each on average.")
    return provenance(env) + " " + intro + "\n\n" + table(head, rows, [False, False] + [True] * 4 + [False])


def frontier_dominance(results: Results) -> str:
    s = results["frontier"]["result"]["dominance_summary"]
    return f"{s['dominated']} of the {s['considered']}"


# --------------------------------------------------------------------------- planner, tick


def planner(results: Results) -> str:
    rows = []
    for name, label in (("planner-budget", "wall budget 200 ms (the daemon's)"),
                        ("planner-count", "by count, 4,000 candidate rows (the bench replays')")):
        r = results[name]["result"]
        rows.append([label, f"{num(r['cpu_p50_ms'])} / **{num(r['cpu_p99_ms'])}**", f"**{num(r['wall_p99_ms'])}**",
                     f"{r['candidates_per_tick_median']:,} ({r['candidates_per_tick_min']:,}-"
                     f"{r['candidates_per_tick_max']:,})",
                     f"{pct(r['objective_gap_median'], 2)} / **{pct(r['objective_gap_p90'], 2)}** / "
                     f"{pct(r['objective_gap_max'], 2)}",
                     f"{num(r['complete_cpu_p99_ms'])} ({r['complete_candidates_per_tick_median']:,})",
                     num(r.get("load_average_1m"))])
    head = ["search (10 pools, 60 ticks, one core)", "CPU per tick p50 / p99 ms", "wall p99 ms",
            "candidates per tick median (min-max)", "objective gap median / p90 / max",
            "complete search CPU p99 ms (candidates)", "load average"]
    prov = "<br>".join(provenance(results[n]) for n in ("planner-budget", "planner-count"))
    return prov + "\n\n" + table(head, rows, [False] + [True] * 6)


PLANNER_SCALE = ("planner-scale-10", "planner-scale-40", "planner-scale-100")


def planner_scale(results: Results) -> str:
    """Per pool count: the budgeted search's CPU and wall time per tick, its gap to the complete search
    (sampled where that takes seconds), what the complete search costs, and the grouping."""
    rows = []
    for name in PLANNER_SCALE:
        r = results[name]["result"]
        ref = r.get("reference") or {}
        sizes = r.get("search_group_sizes") or []
        grouping = (f"{len(sizes)} route groups of {min(sizes)}-{max(sizes)} pools" if sizes
                    else f"one search ({r.get('route_groups', '–')} route groups)")
        sample = (f"every {ref['every']}th tick ({ref['ticks']})" if ref.get("sampled")
                  else f"every tick ({ref.get('ticks', r['ticks'])})")
        after = (f"{num(r['after_search_p99_ms'])} / {num(r['reserve_p50_ms'])}" if "after_search_p99_ms" in r
                 else "–")
        rows.append([f"{r['pools']} pools, {num(r['budget_ms'], 0)} ms {r['budget']}",
                     f"{num(r['cpu_p50_ms'])} / **{num(r['cpu_p99_ms'])}**",
                     f"{num(r['wall_p50_ms'])} / {num(r['wall_p99_ms'])}",
                     f"{pct(r['objective_gap_median'], 2)} / **{pct(r['objective_gap_p90'], 2)}**", after,
                     sample, f"{num(r['complete_cpu_p50_ms'], 0)}", grouping, num(r.get("load_average_1m"))])
    head = ["fleet, budget (one core, 40 ticks)", "CPU per tick p50 / p99 ms", "wall p50 / p99 ms",
            "objective gap median / p90", "after the search p99 / reserve p50 ms", "complete search run",
            "complete search CPU p50 ms", "searched as", "load average"]
    prov = "<br>".join(provenance(results[n]) for n in PLANNER_SCALE)
    return prov + "\n\n" + table(head, rows, [False] + [True] * 6 + [False, True])


def tick(results: Results) -> str:
    rows = []
    for name, label in (("tick-prometheus", "Prometheus, recording rules (1 query)"),
                        ("tick-scrape", "direct scrape (201 pages, filtered to the families read)")):
        r = results[name]["result"]
        p50, p99 = r["phases_p50_ms"], r["phases_p99_ms"]
        rows.append([label, num(r["tick_p50_ms"]), f"**{num(r['tick_p99_ms'])}**",
                     *(f"{num(p50[k])} / {num(p99[k])}" for k in ("read", "step", "actuate")),
                     num(r["rss_mb"], 0), str(r.get("actuation_failures", "–"))])
    head = ["read via", "tick p50 ms", "tick p99 ms", "read p50 / p99", "step p50 / p99", "actuate p50 / p99",
            "RSS MB", "actuation failures"]
    prov = "<br>".join(provenance(results[n]) for n in ("tick-prometheus", "tick-scrape"))
    return prov + "\n\n" + table(head, rows)


def tick_mpc(results: Results) -> str:
    """The daemon's whole tick at 100 pools and 2,000 replicas under the MPC, per phase."""
    env = results["tick-mpc-100"]
    r = env["result"]
    p50, p99 = r["phases_p50_ms"], r["phases_p99_ms"]
    c50, c99 = r.get("thread_cpu_p50_ms") or {}, r.get("thread_cpu_p99_ms") or {}
    row = [f"{r['pools']} pools, {r['replicas']:,} replicas, mpc ({num(r.get('budget_ms'), 0)} ms "
           f"{r.get('budget_clock', 'wall')} budget)", f"{num(c50.get('tick'))} / **{num(c99.get('tick'))}**",
           f"{num(c50.get('step'))} / {num(c99.get('step'))}", f"{num(r['tick_p50_ms'])} / {num(r['tick_p99_ms'])}",
           *(f"{num(p50[k])} / {num(p99[k])}" for k in ("read", "step", "actuate")), num(r["rss_mb"], 0),
           str(r.get("actuation_failures", "–"))]
    head = ["fleet, policy", "tick CPU p50 / p99 ms", "step CPU p50 / p99", "tick wall p50 / p99",
            "read wall p50 / p99", "step wall p50 / p99", "actuate wall p50 / p99", "RSS MB", "actuation failures"]
    return provenance(env) + "\n\n" + table(head, [row])


# --------------------------------------------------------------------------- models


TRACE_LABELS = {"azure-conv": "Azure chat (70B H100)", "servegen": "ServeGen day 3 (70B H100)",
                "mooncake": "Mooncake (8B H100 TP2)", "azure-code": "Azure code (8B A100)"}


def _mtriple(s: Mapping[str, Any]) -> str:
    hit = s.get("hit_rate_mae")
    return f"{pct(s.get('ttft_p95_mape'))} / {pct(s.get('tpot_p95_mape'))} / " + (num(hit, 3) if _finite(hit) else "–")


def models_headline(results: Results) -> str:
    env = results["models"]
    r = env["result"]
    c = r["coupling"]["global"]
    f = r["forecast_ratios"]
    t = r["timing"]
    rows = [
        ["`ttft_p95_mape` (all test windows)", f"**{pct(r['ttft_p95_mape'])}** ({c['latency_windows']} windows)",
         "≤ 15 %"],
        ["`tpot_p95_mape`", f"**{pct(r['tpot_p95_mape'])}**", "≤ 15 %"],
        ["`hit_rate_mae`", f"**{num(r['hit_rate_mae'], 3)}**", "≤ 0.05"],
        ["`forecast_mae_ratio_vs_seasonal_naive` (worst ServeGen tier)",
         f"**{num(r['forecast_mae_ratio_vs_seasonal_naive'], 2)}**", "≤ 0.8"],
        ["forecast ratio, Azure chat / Azure code",
         f"{num(f.get('azure2023_conv'), 2)} / {num(f.get('azure2023_code'), 2)}", "≤ 1"],
        [f"`fit_seconds` ({t['fit_rows']:,} rows, CPU)", f"**{num(r['fit_seconds'], 2)}**", "≤ 10 s"],
        ["`predict_ms_10k` (10,000 plans × 10 pools, best of 9, CPU)",
         f"**{num(r['predict_ms_10k'])}** (median wall {num(t['predict_ms_10k_median_wall'])})", "≤ 50 ms"],
    ]
    extra = (f"p50s (global): TTFT {pct(c.get('ttft_p50_mape'))}, TPOT {pct(c.get('tpot_p50_mape'))}. Under the "
             f"utilisation rule alone ({r['coupling']['global_utilisation_rule_only']['latency_windows']} windows): "
             f"TTFT p95 {pct(r['coupling']['global_utilisation_rule_only']['ttft_p95_mape'])}, TPOT p95 "
             f"{pct(r['coupling']['global_utilisation_rule_only']['tpot_p95_mape'])}.")
    return (provenance(env) + f" Seed {r['seed']}.\n\n" + table(["field", "value", "target"], rows, [False] * 3)
            + "\n\n" + extra)


def models_per_trace(results: Results) -> str:
    r = results["models"]["result"]["coupling"]
    rows = []
    for tr, row in r["per_trace_detail"].items():
        rows.append([TRACE_LABELS.get(tr, tr), _mtriple(row["global"]), _mtriple(row["per_trace"]),
                     _mtriple(row["prior"]), str(row["global"]["latency_windows"])])
    rows.append(["all", _mtriple(r["global"]), _mtriple(r["per_trace"]), _mtriple(r["prior"]),
                 str(r["global"]["latency_windows"])])
    return table(["trace", "global", "per_trace", "prior", "windows"], rows, [False] * 4 + [True])


FORECAST_LABELS = {
    "servegen-shape-m-large": "ServeGen 14-day shape m-large (600 s windows)",
    "servegen-shape-m-mid": "ServeGen 14-day shape m-mid",
    "servegen-shape-m-small": "ServeGen 14-day shape m-small",
    "servegen-arrivals-m-small": "ServeGen m-small arrivals drawn from the shape (60 s bins, 14 days)",
    "azure2023_conv": "Azure 2023 chat (60 s bins)",
    "azure2023_code": "Azure 2023 code (60 s bins)",
}


def models_forecast(results: Results) -> str:
    f = results["models"]["result"]["forecast"]
    rows = [[FORECAST_LABELS.get(k, k), num(v.get("ratio"), 3), pct(v.get("coverage_p90")), num(v.get("n"), 0)]
            for k, v in f.items()]
    return table(["series", "MAE ÷ seasonal-naive MAE", "p90 coverage", "points"], rows)


# --------------------------------------------------------------------------- data plane, API


def dataplane(results: Results) -> str:
    env = results["dataplane"]
    r = env["result"]
    req, obs = r.get("share_requested", {}), r.get("share_observed", {})
    shares = ", ".join(f"{p} {req[p]:.2f} → {obs.get(p, 0):.4f}" for p in req)
    rows = [[str(r["errors"]), num(r["share_error_max"], 4), shares,
             f"{num(r['pick_latency_p50_ms'], 3)} / **{num(r['pick_latency_p99_ms'], 3)}**",
             f"{num(r['added_latency_p50_ms'])} / {num(r['added_latency_p99_ms'])}",
             f"{num(r['direct_p50_ms'])} / {num(r['direct_p99_ms'])}",
             f"{num(r['envoy_p50_ms'])} / {num(r['envoy_p99_ms'])}", num(r["rps"])]]
    head = ["errors", "share_error_max", "shares asked → counted", "pick p50 / p99 ms", "added p50 / p99 ms",
            "direct p50 / p99 ms", "via Envoy p50 / p99 ms", "req/s"]
    return provenance(env) + "\n\n" + table(head, rows, [True, True, False] + [True] * 5)


def tasks_hostile(results: Results) -> str:
    env = results["tasks-hostile"]
    h = env["result"]["hostile"]
    d = h["decide_us"]
    rss = h["rss_mib"]
    full = next((k for k, n in enumerate(h.get("book_at_checkpoints") or []) if n >= h["max_tasks"]), None)
    mem = (f"{rss[full][1]:,.1f} → {rss[-1][1]:,.1f} (+{h['rss_growth_after_full_mib']:,.1f})"
           if full is not None else "–")
    rows = [[f"{h['requests']:,}", f"{h['refused_bad_header']:,}", f"{h['book_size']:,} of {h['max_tasks']:,}",
             f"{h['tasks_evicted']:,}", f"{h['tenants_named']} of {h['tenant_ids']:,}",
             f"{num(d['p50'])} / **{num(d['p99'])}** / {num(d['p999'])} / {d['max']:,.0f}", mem,
             f"{h['requests_per_s']:,.0f}"]]
    head = ["requests (new task id each)", "refused (bad header)", "book", "evicted", "tenants named",
            "decide µs p50 / p99 / p99.9 / max", "RSS MiB: book full → end", "req/s"]
    return provenance(env) + "\n\n" + table(head, rows)


def _ratio(x: Any) -> str:
    return f"{x:.2f}" if _finite(x) else "–"


def tasks_live(results: Results) -> str:
    env = results["tasks-live"]
    live = env["result"]["live"]
    c = live["config"]
    runs = [("step-aware", live["step_aware"]), ("step-blind", live["step_blind"])]
    if "tenants_fair" in live:
        runs += [("two tenants, fairness id", live["tenants_fair"]),
                 ("two tenants, one queue", live["tenants_one_queue"])]
    rows = []
    for name, r in runs:
        tenants = ", ".join(f"{t} {v['completed']}/{v['tasks']}" for t, v in r["by_tenant"].items())
        b, d = r.get("bench_cost_per_success_usd"), r.get("daemon_cost_per_success_usd")
        agree = (f"{b * 1000:.2f} / {d * 1000:.2f} ({(d - b) / b:+.1%})" if _finite(b) and _finite(d) else "–")
        rows.append([name, str(r["tasks"]), str(r["completed"]), str(r["failed"]), num(r["tasks_per_usd"]),
                     num(r["wasted_gpu_s"]), str(r["refused"]),
                     f"{r['requests_client']:,} / {r['requests_served_replicas']:,.0f}", agree, tenants])
    head = ["run", "tasks", "completed", "failed", "completed per $", "GPU-s on tasks that failed",
            "steps refused", "requests: client / replicas", "m$ per successful task: bench / daemon /metrics",
            "completed on time per tenant"]
    setup = (f"Fleet: scenarios/dataplane/fleet.yaml's four replicas, nothing scaling them; in-flight cap {c['cap']} "
             f"per replica, standard queue budget {c['budget']}, hold timeout {c['hold_s']:g} s; {c['task_rate']:g} "
             f"tasks/s for {c['duration_s']:g} s (light tenant {c.get('light_rate', 0.5):g}/s, heavy 5x its tasks "
             f"at 2x the length), think {c['think_s']:g} s, TTFT bound {c['slo_ttft_s']:g} s, seed {c['seed']}.")
    ratios = (f"Step-aware ÷ step-blind: completed tasks per dollar **{_ratio(live['tasks_per_usd_ratio'])}**, "
              f"GPU-seconds on tasks that later failed **{_ratio(live['wasted_gpu_s_ratio'])}**.")
    return provenance(env) + " " + setup + "\n\n" + table(head, rows, [False] + [True] * 8 + [False]) + \
        "\n\n" + ratios


def tasks_sim(results: Results) -> str:
    env = results["tasks-sim"]
    sim = env["result"]["sim"]
    c = sim["config"]
    rows = []
    for x in sim["summary"]:
        w = x["wasted_gpu_s"]
        rows.append([f"{x['load']:g}x", str(x["tasks"]),
                     f"{x['completed']['step_aware']} / {x['completed']['step_blind']}",
                     f"{x['successful']['step_aware']} / {x['successful']['step_blind']}",
                     f"**{_ratio(x['tasks_per_usd_ratio'])}**", _ratio(x["successful_per_usd_ratio"]),
                     f"{num(w['step_aware'], 0)} / {num(w['step_blind'], 0)}",
                     f"**{_ratio(x['wasted_gpu_s_ratio'])}**"])
    per_seed = ", ".join(f"{p['load']:g}x seed {p['seed']}: {_ratio(p['tasks_per_usd_ratio'])}" for p in sim["points"])
    head = ["load", "tasks", "completed: aware / blind", "successful (SLO): aware / blind", "completed per $ ratio",
            "successful per $ ratio", "GPU-s on tasks that failed: aware / blind", "wasted ratio"]
    setup = (f"Fleet: {c['scenario']}'s pool pinned at {c['replicas']} replicas (min = max, nothing scaling it); "
             f"in-flight cap {c['cap']} per replica, standard and sheddable queue budget {c['budget']}, hold "
             f"timeout {c['hold_s']:g} s; the first {c['duration_s']:g} s of the trace at the scenario's rate "
             f"({c['base_rate_scale']:g}x) times the load; seeds {', '.join(str(s) for s in c['seeds'])} summed per "
             "load; no controller (the admission rule alone).")
    return provenance(env) + " " + setup + "\n\n" + table(head, rows, [False] + [True] * 7) + \
        f"\n\nCompleted per $, step-aware ÷ step-blind, per run: {per_seed}."


def tasks_sim_mpc(results: Results) -> str:
    env = results["tasks-sim-mpc"]
    sim = env["result"]["sim_mpc"]
    c = sim["config"]
    rows = []
    for x in sim["summary"]:
        w, a = x["wasted_gpu_s"], x["step_aware_share"]
        rows.append([f"{x['load']:g}x", str(x["tasks"]),
                     f"{x['completed']['mpc_profile']} / {x['completed']['mpc_static']}",
                     f"{x['successful']['mpc_profile']} / {x['successful']['mpc_static']}",
                     f"**{_ratio(x['tasks_per_usd_ratio'])}**", _ratio(x["successful_per_usd_ratio"]),
                     f"{num(w['mpc_profile'], 0)} / {num(w['mpc_static'], 0)}",
                     f"**{_ratio(x['wasted_gpu_s_ratio'])}**", f"{a['mpc_profile']:.0%} / {a['mpc_static']:.0%}"])
    head = ["load", "tasks", "completed: profile / static", "successful (SLO): profile / static",
            "completed per $ ratio", "successful per $ ratio", "GPU-s on tasks that failed: profile / static",
            "wasted ratio", "decisions step-aware: profile / static"]
    setup = (f"Fleet: {c['scenario']}'s pool pinned at {c['replicas']} replicas (min = max); the router's own "
             f"settings as in the row above (cap {c['cap']}, budget {c['budget']}, hold {c['hold_s']:g} s), "
             f"step-blind unless a decision says otherwise; the first {c['duration_s']:g} s of the trace at the "
             f"scenario's rate ({c['base_rate_scale']:g}x) times the load; the MPC ticking every {c['tick_s']:g} s, "
             "once planning on the step profile measured from the simulator's tasks (profile) and once on the static "
             f"steps-per-task weight (static); held-out seeds {', '.join(str(s) for s in c['seeds'])} summed per load.")
    return provenance(env) + " " + setup + "\n\n" + table(head, rows, [False] + [True] * 7 + [False])


def api_load(results: Results) -> str:
    env = results["api-load"]
    r = env["result"]
    pk = r.get("picker") or {}
    reads = [v for k, v in (r.get("rpcs") or {}).items() if k.startswith(("Get", "List"))]
    p50 = [v.get("p50_ms") for v in reads if _finite(v.get("p50_ms"))]
    p99 = [v.get("p99_ms") for v in reads if _finite(v.get("p99_ms"))]
    lat = (f"{num(min(p50))}-{num(max(p50))} / {num(min(p99))}-{num(max(p99))}" if p50 and p99 else "–")
    picker = (f"{num(pk.get('errors'), 0)} of {num(pk.get('requests'), 0)}" if pk else "no picker")
    pick = (f"{num(pk.get('pick_latency_p50_ms'), 3)} / {num(pk.get('pick_latency_p99_ms'), 2)}" if pk else "–")
    rows = [[f"{r['target_rps']:,.0f} + {r['target_write_rps']:,.0f}", num(r["read_rps"]), f"{r['not_sent']:,}",
             str(r["errors"]), lat, f"{r['ticks']} / {r['tick_overruns']} / {r['skipped_ticks']}", picker, pick]]
    head = ["asked (reads + changes /s)", "reads/s answered", "not sent", "errors", "read p50 / p99 ms",
            "ticks / overruns / skipped", "picker errors", "pick p50 / p99 ms"]
    return provenance(env) + "\n\n" + table(head, rows)


def aiperf(results: Results) -> str:
    env = results["aiperf"]
    r = env["result"]
    rows = [[str(x["run"]), x["endpoint"], str(x["concurrency"]), f"{x['requests']:,}", str(x["errors"]),
             num(x["rps"]), f"{x['out_tok_s']:,}", *(f"{num(a)} / {num(b)}" for a, b in
                                                     (x["ttft_ms"], x["itl_ms"], x["inter_chunk_ms"])),
             f"{x['latency_ms'][0]:,.0f} / {x['latency_ms'][1]:,.0f}"] for x in r["runs"]]
    head = ["run", "endpoint", "concurrency", "requests", "errors", "req/s", "out tok/s", "TTFT p50 / p99 ms",
            "ITL p50 / p99 ms", "inter-chunk p50 / p99 ms", "latency p50 / p99 ms"]
    return f"{provenance(env)} {r['note']}\n\n" + table(head, rows, [False, False] + [True] * 9)


def aiperf_governor(results: Results) -> str:
    """What Governor's side counted in the same aiperf runs (`with_dataplane.py`'s output)."""
    rows = []
    for x in results["aiperf"]["result"]["governor_side"]:
        pools = " / ".join(f"{v:,}" for v in x["served_by_pool"].values())
        rows.append([str(x["run"]), f"{x['served']:,} ({pools})", " / ".join(f"{v:,}" for v in x["envoy"]),
                     " / ".join(f"{v:,}" for v in x["picker"]),
                     f"{x['prompt_tokens']:,} / {x['generation_tokens']:,}",
                     *(f"{num(a)} / {num(b)}" for a, b in (x["engine_ttft_ms"], x["engine_itl_ms"])),
                     f"{num(x['pick_ms'][0], 2)} / {num(x['pick_ms'][1], 2)}"])
    head = ["run", "served at replicas (a100 / h100 pool)", "Envoy 2xx / 4xx / 5xx", "picker arrivals / held / "
            "rejected", "prompt / generation tokens", "engine TTFT p50 / p99 ms", "engine ITL p50 / p99 ms",
            "pick p50 / p99 ms"]
    return table(head, rows)


# --------------------------------------------------------------------------- simulator, roofline, demo


def sim_speed(results: Results) -> str:
    rows = []
    provs = []
    for name, label in (("sim-speed-azure-conv-rate1", "azure-conv at the trace's rate (70B TP4 H100)"),
                        ("sim-speed-mooncake-conv", "mooncake-conv, prefix caching, sessions (8B TP2 H100)"),
                        ("sim-speed-azure-conv", "azure-conv as shipped (rate ×4.5)")):
        env = results[name]
        r = env["result"]
        provs.append(provenance(env))
        rows.append([label, f"{r['requests']:,}", num(r["sim_seconds"], 0), num(r["wall_seconds"], 2),
                     f"{r['speedup']:,.0f}×", num(r["peak_rss_mb"], 0)])
    head = ["scenario (16 replicas)", "requests", "simulated s", "wall s", "speed-up", "peak RSS MB"]
    return "<br>".join(provs) + "\n\n" + table(head, rows)


def roofline(results: Results) -> str:
    env = results["roofline"]
    rows = [[r["engine"], f"{r['workload']} ({r['prompt_tokens']}/{r['output_tokens']})", num(r["calibrated_rps"], 2),
             num(r["roofline_rps"], 2), f"{100 * r['error']:+.1f} %", num(r["generic_rps"], 2),
             f"{100 * r['generic_error']:+.1f} %"] for r in env["result"]["rows"]]
    head = ["engine", "workload (in/out tokens)", "calibrated req/s", "roofline req/s", "vs calibrated",
            "roofline, generic host terms", "vs calibrated"]
    return provenance(env) + "\n\n" + table(head, rows, [False, False] + [True] * 5)


def demo_live(results: Results) -> str:
    """The live demo: the runs transcribed when the MPC became its policy, and today's runs."""
    rec = results["demo-live-recorded"]
    rows = []
    for x in rec["result"]["runs"]:
        att = x["slo_attainment"]
        rows.append([f"{x['policy']}, at `{short(rec['commit'])}` (transcribed)", pct(att.get("critical")),
                     pct(att.get("standard")), "–", f"{x['usd_per_1k_successful_tasks']:.3f}", "–",
                     f"{x['failed']:,}", f"{x['shed']:,}"])
    provs = [provenance(rec)]
    for name, label in (("demo-live-mpc", "mpc"), ("demo-live-slo-feedback", "slo-feedback")):
        env = results[name]
        r = env["result"]
        provs.append(provenance(env))
        att = r.get("slo_attainment") or {}
        load = (env.get("machine") or {}).get("load_average_1m")
        rows.append([f"{label}, at `{short(env['commit'])}`" + (f", load average {load:.0f}" if _finite(load) else ""),
                     pct(att.get("critical")), pct(att.get("standard")), pct(att.get("sheddable")),
                     per_k(r.get(COST)), f"{r.get('tasks_resolved', 0):,}", f"{r.get('failed', 0):,}",
                     f"{r.get('shed', 0):,}"])
    head = ["run", "critical", "standard", "sheddable", "$ / 1,000 successful tasks", "tasks resolved", "failed",
            "shed"]
    return "<br>".join(provs) + "\n\n" + table(head, rows)


def demo_live_inline(results: Results) -> str:
    """README's sentence: the transcribed runs (today's, on a loaded machine, are in the table)."""
    m, s = results["demo-live-recorded"]["result"]["runs"]
    ma, sa = m["slo_attainment"], s["slo_attainment"]
    return (f"{pct(ma.get('critical'))} of critical and {pct(ma.get('standard'))} of standard tasks within their "
            f"SLOs under the MPC, {pct(sa.get('critical'))} and {pct(sa.get('standard'))} under slo-feedback, at "
            f"{ratio(m['usd_per_1k_successful_tasks'], s['usd_per_1k_successful_tasks'])}× its cost per successful "
            f"task (at `{short(results['demo-live-recorded']['commit'])}`)")


def tick_inline(results: Results) -> str:
    """The tick's p99 through Prometheus with the rules, and the load it was measured under."""
    env = results["tick-prometheus"]
    load = (env.get("machine") or {}).get("load_average_1m")
    cpus = (env.get("machine") or {}).get("cpus")
    under = f" at load average {load:.1f} on {cpus} CPUs" if _finite(load) and cpus else ""
    return f"{num(env['result']['tick_p99_ms'])} ms p99{under}"


REGIONS: dict[str, Renderer] = {
    "all-mpc": Renderer(("all",), all_mpc),
    "all-matrix": Renderer(("all",), all_matrix),
    "all-crash": Renderer(("all",), all_crash),
    "all-mpc-pass": Renderer(("all",), all_mpc_pass),
    "all-mpc-cheapest": Renderer(("all",), all_mpc_cheapest),
    "all-wall": Renderer(("all",), all_wall),
    "robustness": Renderer(("robustness-seed1",), robustness),
    "robustness-failures": Renderer(("robustness-seed1",), robustness_failures),
    "robustness-mpc-pass": Renderer(("robustness-seed1",), _rob_pass("mpc")),
    "robustness-static-pass": Renderer(("robustness-seed1",), _rob_pass("static")),
    "robustness-hpa-pass": Renderer(("robustness-seed1",), _rob_pass("hpa")),
    "robustness-hpa-cost": Renderer(("robustness-seed1",), _rob_cost("hpa")),
    "robustness-mpc-crit97": Renderer(("robustness-seed1",), robustness_mpc_crit97),
    "frontier": Renderer(("frontier",), frontier),
    "frontier-dominated": Renderer(("frontier",), frontier_dominance),
    "planner": Renderer(("planner-budget", "planner-count"), planner),
    "tick": Renderer(("tick-prometheus", "tick-scrape"), tick),
    "planner-scale": Renderer(PLANNER_SCALE, planner_scale),
    "tick-mpc": Renderer(("tick-mpc-100",), tick_mpc),
    "tick-p99": Renderer(("tick-prometheus",), tick_inline),
    "models-headline": Renderer(("models",), models_headline),
    "models-per-trace": Renderer(("models",), models_per_trace),
    "models-forecast": Renderer(("models",), models_forecast),
    "dataplane": Renderer(("dataplane",), dataplane),
    "api-load": Renderer(("api-load",), api_load),
    "tasks-hostile": Renderer(("tasks-hostile",), tasks_hostile),
    "tasks-live": Renderer(("tasks-live",), tasks_live),
    "tasks-sim": Renderer(("tasks-sim",), tasks_sim),
    "tasks-sim-mpc": Renderer(("tasks-sim-mpc",), tasks_sim_mpc),
    "aiperf": Renderer(("aiperf",), aiperf),
    "aiperf-governor": Renderer(("aiperf",), aiperf_governor),
    "sim-speed": Renderer(("sim-speed-azure-conv-rate1", "sim-speed-mooncake-conv", "sim-speed-azure-conv"),
                          sim_speed),
    "roofline": Renderer(("roofline",), roofline),
    "demo-live": Renderer(("demo-live-recorded", "demo-live-mpc", "demo-live-slo-feedback"), demo_live),
    "demo-live-figures": Renderer(("demo-live-recorded",), demo_live_inline),
}

