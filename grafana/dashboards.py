"""Grafana dashboards as code: Governor's control loop and the fleet it governs.

`python grafana/dashboards.py` writes `governor-control-loop.json` and `fleet.json`
next to this file (`--check` only compares and exits 1 when a committed file is out
of date; `--out DIR` writes elsewhere). The dashboards are built with Grafana's
Foundation SDK (PyPI `grafana-foundation-sdk`, an 11.x build) and serialised with
sorted keys and fixed panel ids, so the same code always gives byte-identical JSON
and `tests/test_grafana.py` can require the committed files to match.

- Control loop: the daemon's own `governor_*` series (controller/obs/daemon_metrics.py,
  docs/OPERATING.md §7): replicas desired/ready/starting per pool, p95 TTFT against
  the SLO, the signals the policy reads, telemetry status, decisions, guardrails,
  reason codes, tick phases and admission.
- Fleet: what the engines (vLLM V1 `vllm:*`), DCGM (`DCGM_FI_*`) and the llm-d router
  (`llm_d_epp_*`, plus Governor's `llm_d_epp_governor_*` extensions) export, as
  docs/TELEMETRY.md names them and controller/sim/exposition.py serves them. Engine
  and DCGM series are expected to carry a `pool` target label (deploy/ shows the
  relabelling); the router's pool gauges name the pool in `name`.

Both dashboards take a `datasource` variable (any Prometheus data source) and a
`pool` variable (multi-value, "All" by default). This module only builds JSON: it
must not talk to Grafana or Prometheus, and it keeps no state between builds.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

try:
    from grafana_foundation_sdk.builders import common as common_b
    from grafana_foundation_sdk.builders import prometheus, stat, statetimeline, timeseries
    from grafana_foundation_sdk.builders.dashboard import (
        AnnotationQuery,
        Dashboard,
        DatasourceVariable,
        QueryVariable,
        Row,
        ThresholdsConfig,
    )
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models import common
    from grafana_foundation_sdk.models.dashboard import (
        DashboardCursorSync,
        DataSourceRef,
        DynamicConfigValue,
        Threshold,
        ThresholdsMode,
        ValueMap,
        ValueMappingResult,
        VariableOption,
        VariableRefresh,
        VariableSort,
    )
except ImportError as exc:  # pragma: no cover - exercised only without the SDK
    raise ImportError(
        "grafana/dashboards.py needs the Grafana Foundation SDK: "
        "pip install 'grafana-foundation-sdk==1769699379!11.6.0' (it is in the dev extras)"
    ) from exc

HERE = Path(__file__).resolve().parent
TAGS = ("governor", "llm-inference")
DATASOURCE_VAR = "datasource"
POOL_VAR = "pool"
POOL_SEL = 'pool=~"$pool"'
RATE = "$__rate_interval"  # Grafana's rate window: at least 4 scrape intervals of the data source

# Grafana's 24-column grid: full, half, third and quarter widths.
FULL, HALF, THIRD, QUARTER = 24, 12, 8, 6


# --------------------------------------------------------------------------- small builders


def _ds() -> DataSourceRef:
    """The data source every panel and query uses: whatever the `datasource` variable selects."""
    return DataSourceRef(type_val="prometheus", uid="${" + DATASOURCE_VAR + "}")


def _query(expr: str, legend: str, ref: str, *, instant: bool = False) -> prometheus.Dataquery:
    q = prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref).datasource(_ds())
    return q.instant() if instant else q.range()


def _targets(panel, queries: Sequence[tuple[str, str]], *, instant: bool = False):
    """Add (expr, legend) pairs as queries A, B, C, ..."""
    for i, (expr, legend) in enumerate(queries):
        panel = panel.with_target(_query(expr, legend, chr(ord("A") + i), instant=instant))
    return panel


def _legend() -> common_b.VizLegendOptions:
    return (common_b.VizLegendOptions().show_legend(True).display_mode(common.LegendDisplayMode.LIST)
            .placement(common.LegendPlacement.BOTTOM).calcs([]))


def _tooltip() -> common_b.VizTooltipOptions:
    return common_b.VizTooltipOptions().mode(common.TooltipDisplayMode.MULTI).sort(common.SortOrder.DESCENDING)


def ts(title: str, description: str, queries: Sequence[tuple[str, str]], *, unit: str = "short",
       w: int = HALF, h: int = 8, min_: float | None = None, max_: float | None = None,
       stacked: bool = False, bars: bool = False) -> timeseries.Panel:
    """A time-series panel over Prometheus range queries."""
    p = (timeseries.Panel().title(title).description(description).datasource(_ds()).unit(unit).span(w).height(h)
         .legend(_legend())
         .tooltip(_tooltip()).line_width(1).fill_opacity(10 if not bars else 80)
         .span_nulls(False).show_points(common.VisibilityMode.NEVER))
    if min_ is not None:
        p = p.min(min_)
    if max_ is not None:
        p = p.max(max_)
    if bars:
        p = p.draw_style(common.GraphDrawStyle.BARS)
    if stacked:
        p = p.stacking(common_b.StackingConfig().mode(common.StackingMode.NORMAL).group("A"))
    return _targets(p, queries)


def single(title: str, description: str, expr: str, legend: str = "", *, unit: str = "short",
           w: int = QUARTER, h: int = 4, mappings: Sequence[tuple[str, str, str]] = (),
           steps: Sequence[tuple[float | None, str]] = ((None, "blue"),),
           text_mode: common.BigValueTextMode = common.BigValueTextMode.AUTO) -> stat.Panel:
    """A stat panel over one instant query; `mappings` are (value, text, colour), `steps` thresholds."""
    p = (stat.Panel().title(title).description(description).datasource(_ds()).unit(unit).span(w).height(h)
         .graph_mode(common.BigValueGraphMode.NONE).color_mode(common.BigValueColorMode.BACKGROUND)
         .text_mode(text_mode)
         .reduce_options(common_b.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
         .thresholds(ThresholdsConfig().mode(ThresholdsMode.ABSOLUTE)
                     .steps([Threshold(value=v, color=c) for v, c in steps])))
    if mappings:
        p = p.mappings([ValueMap(options={v: ValueMappingResult(text=t, color=c, index=i)
                                          for i, (v, t, c) in enumerate(mappings)})])
    return _targets(p, [(expr, legend)], instant=True)


def timeline(title: str, description: str, queries: Sequence[tuple[str, str]],
             mappings: Sequence[tuple[str, str, str]], *, w: int = HALF, h: int = 8) -> statetimeline.Panel:
    """A state timeline: each series' value mapped to a named, coloured state."""
    p = (statetimeline.Panel().title(title).description(description).datasource(_ds()).span(w).height(h)
         .show_value(common.VisibilityMode.NEVER).merge_values(True).row_height(0.8).fill_opacity(80)
         .legend(_legend()).tooltip(_tooltip())
         .mappings([ValueMap(options={v: ValueMappingResult(text=t, color=c, index=i)
                                      for i, (v, t, c) in enumerate(mappings)})]))
    return _targets(p, queries)


def _quantiles(metric: str, by: str, label: str, selector: str = POOL_SEL,
               qs: Sequence[float] = (0.5, 0.95, 0.99)) -> list[tuple[str, str]]:
    """histogram_quantile over a rate of buckets, keeping `le` in the by-clause (TELEMETRY.md §9)."""
    sel = f"{{{selector}}}" if selector else ""
    return [(f"histogram_quantile({q}, sum by (le, {by}) (rate({metric}_bucket{sel}[{RATE}])))",
             f"{label} p{round(q * 100)}") for q in qs]


def _datasource_var() -> DatasourceVariable:
    return DatasourceVariable(DATASOURCE_VAR).label("Data source").type("prometheus")


def _pool_var(metric: str, label: str = "pool") -> QueryVariable:
    return (QueryVariable(POOL_VAR).label("Pool").datasource(_ds())
            .query(f"label_values({metric}, {label})")
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED).sort(VariableSort.ALPHABETICAL_ASC)
            .multi(True).include_all(True).all_value(".*")
            .current(VariableOption(selected=True, text=["All"], value=["$__all"])))


def _builtin_annotations() -> AnnotationQuery:
    return (AnnotationQuery().name("Annotations & Alerts").built_in(1).enable(True).hide(True)
            .icon_color("rgba(0, 211, 255, 1)").type("dashboard")
            .datasource(DataSourceRef(type_val="grafana", uid="-- Grafana --")))


def _dashboard(uid: str, title: str, description: str, pool_metric: str) -> Dashboard:
    return (Dashboard(title).uid(uid).description(description).tags(list(TAGS)).editable()
            .time("now-3h", "now").refresh("30s").timezone("browser")
            .tooltip(DashboardCursorSync.CROSSHAIR)
            .annotation(_builtin_annotations())
            .with_variable(_datasource_var()).with_variable(_pool_var(pool_metric)))


def _to_json(builder: Dashboard) -> dict:
    """Build, give every panel a fixed id in layout order (Grafana would otherwise assign them), and
    round-trip through JSON so the result is plain dicts and lists."""
    model = builder.build()
    for i, panel in enumerate(model.panels or [], start=1):
        panel.id_val = i
    return json.loads(json.dumps(model, cls=JSONEncoder))


def render(dashboard: dict) -> str:
    """The committed form: 2-space indent, sorted keys, trailing newline."""
    return json.dumps(dashboard, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


# --------------------------------------------------------------------------- the control loop


def control_loop() -> dict:
    """Governor's own view: what it saw, what it decided, what changed the decision, how long it took."""
    d = _dashboard("governor-control-loop", "Governor — control loop",
                   "Governor's decisions and the signals it decided from (the daemon's governor_* metrics).",
                   "governor_replicas_desired")

    d = d.with_row(Row("State"))
    d = (d.with_panel(single(
            "Mode", "The daemon's mode: active sends decisions, shadow only records them, paused decides nothing.",
            "max by (mode) (governor_mode) == 1", "{{mode}}", text_mode=common.BigValueTextMode.NAME,
            w=4, steps=((None, "blue"),)))
         .with_panel(single(
            "Telemetry", "1 when every pool's telemetry is stale and the last safe decision is held (frozen).",
            "max(governor_telemetry_frozen)", w=4,
            mappings=(("0", "live", "green"), ("1", "FROZEN", "red")), steps=((None, "green"), (1, "red"))))
         .with_panel(single(
            "Generation", "Generation of the last decision; it only ever increases (persisted in the state "
            "directory). Flat while active means no new decisions.", "max(governor_generation)", w=4))
         .with_panel(single(
            "Overrides active", "Operator overrides in force (governor override list).",
            "max(governor_overrides_active)", w=4, steps=((None, "green"), (1, "orange"))))
         .with_panel(single(
            "Skipped ticks", "Ticks skipped because the previous one was still running, over the dashboard's "
            "time range. Non-zero: a tick takes longer than tick_interval_s.",
            'sum(increase(governor_ticks_total{result="skipped"}[$__range]))', w=4,
            steps=((None, "green"), (1, "orange"))))
         .with_panel(single(
            "Tick errors", "Ticks that raised an error over the time range (the log line says why).",
            'sum(increase(governor_ticks_total{result="error"}[$__range]))', w=4,
            steps=((None, "green"), (1, "red")))))

    d = d.with_row(Row("Replicas"))
    d = d.with_panel(ts(
        "Replicas — $pool", "The replica target Governor decided against what the fleet runs: ready and still "
        "starting. Desired above ready+starting in active mode means the actuator has not caught up.",
        [(f"max by (pool) (governor_replicas_desired{{{POOL_SEL}}})", "{{pool}} desired"),
         (f"max by (pool) (governor_replicas_ready{{{POOL_SEL}}})", "{{pool}} ready"),
         (f"max by (pool) (governor_replicas_starting{{{POOL_SEL}}})", "{{pool}} starting")],
        min_=0, w=FULL).repeat(POOL_VAR).repeat_direction("h").max_per_row(3))

    d = d.with_row(Row("Signals the policy reads"))
    d = (d.with_panel(ts(
            "p95 TTFT vs SLO", "Observed p95 time to first token per pool (over telemetry.window_s) and the TTFT "
            "SLO of the tightest class.",
            [(f"max by (pool) (governor_pool_ttft_p95_seconds{{{POOL_SEL}}})", "{{pool}} p95 TTFT"),
             ("max(governor_slo_ttft_seconds)", "SLO")], unit="s", min_=0)
            .override_by_name("SLO", [DynamicConfigValue(id_val="custom.lineStyle",
                                                         value={"dash": [10, 10], "fill": "dash"}),
                                      DynamicConfigValue(id_val="color",
                                                         value={"fixedColor": "red", "mode": "fixed"})]))
         .with_panel(ts(
            "Arrival rate", "Requests per second per pool as Governor observed them.",
            [(f"max by (pool) (governor_pool_arrival_rps{{{POOL_SEL}}})", "{{pool}}")], unit="reqps", min_=0))
         .with_panel(ts(
            "Prefix-cache hit rate", "Token-weighted prefix-cache hit rate per pool.",
            [(f"max by (pool) (governor_pool_hit_rate{{{POOL_SEL}}})", "{{pool}}")],
            unit="percentunit", min_=0, max_=1))
         .with_panel(ts(
            "KV-cache usage", "Mean KV-cache usage over a pool's engines.",
            [(f"max by (pool) (governor_pool_kv_usage{{{POOL_SEL}}})", "{{pool}}")],
            unit="percentunit", min_=0, max_=1)))

    d = d.with_row(Row("Telemetry"))
    status = " + ".join(
        f"{k} * max by (pool) (governor_telemetry_status{{{POOL_SEL}, status=\"{s}\"}})"
        for k, s in ((1, "partial"), (2, "missing"), (3, "stale")))
    d = (d.with_panel(timeline(
            "Telemetry status per pool", "ok, partial, missing or stale per pool. Governor never scales a pool "
            "down on partial or missing data.",
            [(f"0 * max by (pool) (governor_telemetry_status{{{POOL_SEL}, status=\"ok\"}}) + {status}", "{{pool}}")],
            (("0", "ok", "green"), ("1", "partial", "yellow"), ("2", "missing", "orange"), ("3", "stale", "red")),
            w=HALF))
         .with_panel(timeline(
            "Frozen", "Frozen: all telemetry stale, the last safe decision held.",
            [("max(governor_telemetry_frozen)", "frozen")],
            (("0", "live", "green"), ("1", "frozen", "red")), w=QUARTER))
         .with_panel(ts(
            "Telemetry read errors", "Telemetry read problems per minute (unreachable Prometheus, failed "
            "scrapes).", [(f"60 * sum(rate(governor_telemetry_errors_total[{RATE}]))", "errors")],
            unit="short", min_=0, w=QUARTER)))

    d = d.with_row(Row("Decisions"))
    d = (d.with_panel(ts(
            "Decisions by outcome", "Decisions per minute by actuation outcome (applied, replay, stale, invalid, "
            "failed, shadow, skipped, paused).",
            [(f"60 * sum by (outcome) (rate(governor_decisions_total[{RATE}]))", "{{outcome}}")],
            unit="short", min_=0, stacked=True, bars=True))
         .with_panel(ts(
            "Actuation calls", "Calls per minute per actuation target and result.",
            [(f"60 * sum by (target, status) (rate(governor_actuation_calls_total[{RATE}]))",
              "{{target}} {{status}}")], unit="short", min_=0))
         .with_panel(ts(
            "Guardrail adjustments by code", "Guardrails that changed the policy's proposal, per minute by code "
            "(e.g. guard_max_step_up, guard_override_pin).",
            [(f"60 * sum by (code) (rate(governor_guard_adjustments_total[{RATE}]))", "{{code}}")],
            unit="short", min_=0, stacked=True, bars=True))
         .with_panel(ts(
            "Policy reasons by code", "The policy's reason codes per minute (e.g. slo_breach, "
            "scale_down_stabilised, missing_data_hold).",
            [(f"60 * sum by (code) (rate(governor_decision_reasons_total[{RATE}]))", "{{code}}")],
            unit="short", min_=0, stacked=True, bars=True))
         .with_panel(ts(
            "Slow replicas: ejected and replaced", "Replicas of each pool ejected as slow now (their step time "
            "over what their own load explains, against the pool's median: the router sends them no new "
            "requests; reason slow_replica), and replacements asked of the autoscaler per hour "
            "(slow_replica_replace; docs/OPERATING.md §4).",
            [('max by (pool) (governor_replicas_ejected{pool=~"$pool"})', "{{pool}} ejected"),
             (f'3600 * sum by (pool) (rate(governor_replica_replacements_total{{pool=~"$pool"}}[{RATE}]))',
              "{{pool}} replaced / h")], unit="short", min_=0))
         .with_panel(ts(
            "Admission: shed fraction per class", "Fraction of each priority class's traffic Governor decided "
            "to shed.", [("max by (priority) (governor_admission_shed_fraction)", "{{priority}}")],
            unit="percentunit", min_=0, max_=1))
         .with_panel(ts(
            "Ticks by result", "Ticks per minute: decided, paused, skipped (the previous tick was still running) "
            "and error.", [(f"60 * sum by (result) (rate(governor_ticks_total[{RATE}]))", "{{result}}")],
            unit="short", min_=0, stacked=True)))

    d = d.with_row(Row("Cost per successful task"))
    d = (d.with_panel(ts(
            "Spend per pool", "What each pool's ready and starting replicas cost per hour (the config's price per "
            "GPU-hour × GPUs per replica × replicas).",
            [('max by (pool) (governor_spend_usd_per_hour{pool=~"$pool"})', "{{pool}}")], unit="currencyUSD",
            min_=0, stacked=True))
         .with_panel(ts(
            "Cost per successful task", "Spend over tasks completed: over the rate window (the daemon's spend and "
            "the pickers' governor_picker_tasks_total), and since the daemon started (basis=requests when no "
            "request carried x-governor-task-id: each request is then a task).",
            [(f"sum(rate(governor_spend_usd_total[{RATE}])) / "
              f"sum(rate(governor_picker_tasks_total{{outcome=\"completed\"}}[{RATE}]))", "over the window"),
             ("max by (basis) (governor_cost_per_successful_task_usd)", "since start ({{basis}})")],
            unit="currencyUSD", min_=0))
         .with_panel(ts(
            "Tasks by outcome", "Tasks per minute the pickers settled: started, completed, failed (a step failed "
            "or a later step was refused), abandoned, evicted.",
            [(f"60 * sum by (outcome) (rate(governor_picker_tasks_total[{RATE}]))", "{{outcome}}")],
            unit="short", min_=0))
         .with_panel(ts(
            "Steps refused or failed", "Steps per minute by kind (first: a new task's; later: a task under way's) "
            "and outcome; step-aware admission refuses first steps before later ones.",
            [(f"60 * sum by (kind, outcome) (rate(governor_picker_steps_total{{outcome!=\"ok\"}}[{RATE}]))",
              "{{kind}} {{outcome}}")], unit="short", min_=0)))

    d = d.with_row(Row("Tick timing"))
    d = (d.with_panel(ts(
            "Tick duration by phase (p95)", "Time per tick phase: read (telemetry), step (decide), actuate.",
            _quantiles("governor_tick_duration_seconds", "phase", "{{phase}}", selector="", qs=(0.95,)),
            unit="s", min_=0))
         .with_panel(ts(
            "Tick duration by phase (mean)", "Mean time per tick phase.",
            [(f"sum by (phase) (rate(governor_tick_duration_seconds_sum[{RATE}])) / "
              f"sum by (phase) (rate(governor_tick_duration_seconds_count[{RATE}]))", "{{phase}}")],
            unit="s", min_=0))
         .with_panel(ts(
            "MPC search: candidates and budget cuts", "Candidate plans the MPC scored in its last tick, and the "
            "share of ticks whose search its time budget cut short (MPC policy only; if most are cut, raise "
            "time_budget_s).",
            [("governor_planner_candidates", "candidates scored"),
             (f"sum(rate(governor_planner_budget_cut_total[{RATE}])) / "
              f"sum(rate(governor_ticks_total{{result=\"decided\"}}[{RATE}]))", "share of ticks cut")],
            unit="short", min_=0)))

    d = d.with_row(Row("Leadership"))
    d = (d.with_panel(ts(
            "Leader per lease", "1 for the replica that holds the shard's Lease and actuates (leader election, "
            "docs/OPERATING.md §10); empty without leader election.",
            [("max by (lease, instance) (governor_leader)", "{{lease}} {{instance}}")], unit="short", min_=0,
            max_=1))
         .with_panel(ts(
            "Leadership changes", "Times a replica became or stopped being a Lease's leader, per hour "
            "(a handover counts on both replicas; alert GovernorLeaderFlapping).",
            [(f"3600 * sum by (lease) (rate(governor_leader_transitions_total[{RATE}]))", "{{lease}}")],
            unit="short", min_=0)))
    return _to_json(d)


# --------------------------------------------------------------------------- the fleet


def fleet() -> dict:
    """The governed fleet as its engines, GPUs and router report it."""
    d = _dashboard("governor-fleet", "Governor — fleet",
                   "The inference fleet Governor governs: vLLM engines, DCGM GPUs and the llm-d router.",
                   "vllm:num_requests_running")

    d = d.with_row(Row("Load per pool"))
    d = (d.with_panel(ts(
            "Running requests", "Requests in the engines' running batches, per pool.",
            [(f"sum by (pool) (vllm:num_requests_running{{{POOL_SEL}}})", "{{pool}}")], min_=0))
         .with_panel(ts(
            "Waiting requests", "Requests queued in the engines, and held at the router, per pool.",
            [(f"sum by (pool) (vllm:num_requests_waiting{{{POOL_SEL}}})", "{{pool}} engines"),
             ('sum by (name) (llm_d_epp_average_queue_size{name=~"$pool"})', "{{name}} router")], min_=0))
         .with_panel(ts(
            "KV-cache usage", "Mean and worst engine KV-cache usage per pool.",
            [(f"avg by (pool) (vllm:kv_cache_usage_perc{{{POOL_SEL}}})", "{{pool}} mean"),
             (f"max by (pool) (vllm:kv_cache_usage_perc{{{POOL_SEL}}})", "{{pool}} max")],
            unit="percentunit", min_=0, max_=1))
         .with_panel(ts(
            "Prefix-cache hit ratio", "Token-weighted: rate(hits) / rate(queries), e.g. 30 hit tokens/s out of "
            "150 looked up = 0.2.",
            [(f"sum by (pool) (rate(vllm:prefix_cache_hits_total{{{POOL_SEL}}}[{RATE}])) / "
              f"sum by (pool) (rate(vllm:prefix_cache_queries_total{{{POOL_SEL}}}[{RATE}]))", "{{pool}}")],
            unit="percentunit", min_=0, max_=1)))

    d = d.with_row(Row("Latency"))
    d = (d.with_panel(ts(
            "TTFT quantiles", "Time to first token per pool (engine histogram; linear interpolation inside a "
            "bucket, so values between bucket bounds are estimates).",
            _quantiles("vllm:time_to_first_token_seconds", "pool", "{{pool}}"), unit="s", min_=0))
         .with_panel(ts(
            "ITL quantiles", "Inter-token latency per pool.",
            _quantiles("vllm:inter_token_latency_seconds", "pool", "{{pool}}"), unit="s", min_=0))
         .with_panel(ts(
            "Per-request TPOT quantiles", "Each finished request's mean time per output token, per pool: what a "
            "TPOT SLO judges. Below the ITL quantiles when chunked prefill stretches single steps.",
            _quantiles("vllm:request_time_per_output_token_seconds", "pool", "{{pool}}", qs=(0.5, 0.95)),
            unit="s", min_=0))
         .with_panel(ts(
            "Queue time quantiles", "Time requests waited in the engine before being scheduled.",
            _quantiles("vllm:request_queue_time_seconds", "pool", "{{pool}}", qs=(0.5, 0.95)), unit="s", min_=0))
         .with_panel(ts(
            "End-to-end latency quantiles", "Arrival to final token, per pool.",
            _quantiles("vllm:e2e_request_latency_seconds", "pool", "{{pool}}", qs=(0.5, 0.95)), unit="s", min_=0)))

    d = d.with_row(Row("Throughput"))
    d = (d.with_panel(ts(
            "Tokens per second", "Generated and prompt (prefill) tokens per second, per pool.",
            [(f"sum by (pool) (rate(vllm:generation_tokens_total{{{POOL_SEL}}}[{RATE}]))", "{{pool}} generated"),
             (f"sum by (pool) (rate(vllm:prompt_tokens_total{{{POOL_SEL}}}[{RATE}]))", "{{pool}} prompt")],
            unit="suffix: tok/s", min_=0, w=THIRD))
         .with_panel(ts(
            "Preemptions", "Requests preempted per minute (KV-cache pressure), per pool.",
            [(f"60 * sum by (pool) (rate(vllm:num_preemptions_total{{{POOL_SEL}}}[{RATE}]))", "{{pool}}")],
            min_=0, w=THIRD))
         .with_panel(ts(
            "Finished requests by reason", "Finished requests per second by finish reason.",
            [(f"sum by (pool, finished_reason) (rate(vllm:request_success_total{{{POOL_SEL}}}[{RATE}]))",
              "{{pool}} {{finished_reason}}")], unit="reqps", min_=0, w=THIRD)))

    d = d.with_row(Row("GPUs (DCGM)"))
    d = (d.with_panel(ts(
            "GPU utilisation", "DCGM_FI_DEV_GPU_UTIL (share of time any kernel ran), mean and min over the "
            "pool's GPUs.",
            [(f"avg by (pool) (DCGM_FI_DEV_GPU_UTIL{{{POOL_SEL}}})", "{{pool}} mean"),
             (f"min by (pool) (DCGM_FI_DEV_GPU_UTIL{{{POOL_SEL}}})", "{{pool}} min")],
            unit="percent", min_=0, max_=100, w=THIRD))
         .with_panel(ts(
            "Framebuffer used", "HBM in use per pool (MiB summed over GPUs) and as a fraction of the total.",
            [(f"sum by (pool) (DCGM_FI_DEV_FB_USED{{{POOL_SEL}}})", "{{pool}}")], unit="mbytes", min_=0, w=THIRD))
         .with_panel(ts(
            "Framebuffer used (fraction)", "FB_USED / (FB_USED + FB_FREE), per pool.",
            [(f"sum by (pool) (DCGM_FI_DEV_FB_USED{{{POOL_SEL}}}) / (sum by (pool) "
              f"(DCGM_FI_DEV_FB_USED{{{POOL_SEL}}}) + sum by (pool) (DCGM_FI_DEV_FB_FREE{{{POOL_SEL}}}))",
              "{{pool}}")], unit="percentunit", min_=0, max_=1, w=THIRD))
         .with_panel(ts(
            "Power draw", "Board power per pool, summed over GPUs.",
            [(f"sum by (pool) (DCGM_FI_DEV_POWER_USAGE{{{POOL_SEL}}})", "{{pool}}")], unit="watt", min_=0,
            w=FULL, h=6)))

    d = d.with_row(Row("Router (llm-d)"))
    by_priority = "sum by (priority) (rate({m}[" + RATE + "]))"
    by_step = "sum by (workflow_step) (rate({m}[" + RATE + "]))"
    d = (d.with_panel(ts(
            "Arrivals per priority", "Requests received by the router per second, per priority class.",
            [(by_priority.format(m="llm_d_epp_request_total"), "{{priority}}")], unit="reqps", min_=0, w=THIRD))
         .with_panel(ts(
            "Shed per priority", "Requests shed (429 or 503) per second, per priority class. "
            "llm_d_epp_governor_shed_total is a Governor extension, not exported by a stock EPP.",
            [(by_priority.format(m="llm_d_epp_governor_shed_total"), "{{priority}}")],
            unit="reqps", min_=0, w=THIRD))
         .with_panel(ts(
            "Retries per priority", "Client retries per second, per priority class (Governor extension).",
            [(by_priority.format(m="llm_d_epp_governor_retries_total"), "{{priority}}")],
            unit="reqps", min_=0, w=THIRD))
         .with_panel(ts(
            "Arrivals, shed and retries per workflow step", "Per step index within a multi-step task: how far "
            "tasks get, and where they are shed or retried.",
            [(by_step.format(m="llm_d_epp_request_total"), "step {{workflow_step}} arrivals"),
             (by_step.format(m="llm_d_epp_governor_shed_total"), "step {{workflow_step}} shed"),
             (by_step.format(m="llm_d_epp_governor_retries_total"), "step {{workflow_step}} retries")],
            unit="reqps", min_=0, w=HALF))
         .with_panel(ts(
            "Router errors by code", "Requests that ended in an error per second (429 shed, 503 no endpoint, "
            "500, timeout).",
            [(f"sum by (error_code) (rate(llm_d_epp_request_error_total[{RATE}]))", "{{error_code}}")],
            unit="reqps", min_=0, w=HALF))
         .with_panel(ts(
            "Router TTFT p95 per priority", "Time to first token as the router saw it, per priority class.",
            _quantiles("llm_d_epp_request_ttft_seconds", "priority", "{{priority}}", selector="", qs=(0.95,)),
            unit="s", min_=0, w=THIRD))
         .with_panel(ts(
            "Ready endpoints", "Ready endpoints per pool as the router counts them.",
            [('max by (name) (llm_d_epp_ready_endpoints{name=~"$pool"})', "{{name}}")], min_=0, w=THIRD))
         .with_panel(ts(
            "In flight per pool", "Requests in flight on each pool's endpoints (router view).",
            [('sum by (name) (llm_d_epp_request_running{name=~"$pool"})', "{{name}}")], min_=0, w=THIRD)))
    return _to_json(d)


# --------------------------------------------------------------------------- files

DASHBOARDS: tuple[tuple[str, Callable[[], dict]], ...] = (
    ("governor-control-loop.json", control_loop),
    ("fleet.json", fleet),
)


def rendered() -> dict[str, str]:
    """File name → committed text, for every dashboard."""
    return {name: render(build()) for name, build in DASHBOARDS}


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Write (or check) the Grafana dashboards built from this file.")
    ap.add_argument("--out", type=Path, default=HERE, help="directory to write to (default: grafana/)")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file differs from the code")
    args = ap.parse_args(argv)
    stale = []
    for name, text in rendered().items():
        path = args.out / name
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path))
            continue
        path.write_text(text)
        print(f"wrote {path}")
    if stale:
        print("out of date (run `make dashboards`): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
