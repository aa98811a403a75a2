"""`governor report`: the control-loop dashboard's key panels as one PNG, from a Prometheus URL.

For teams without Grafana and for incident write-ups: the same queries as the panels of the same
titles in grafana/governor-control-loop.json (a test keeps them equal), run as range queries over
[start, end] through `prometheus_api_client`, drawn with matplotlib (Agg, no display). Besides the
PNG it writes a sidecar JSON (`<out>.json`) naming every panel (its axes title), its queries and
the series drawn with their point counts, so a reader or a test can tell what the picture holds.

Grafana's variables are filled in: `$pool` by the pool regex, `$__rate_interval` by
max(4 × step, 4 × scrape interval), as Grafana does. This module reads Prometheus and writes
files; it must not reach the daemon or decide anything.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class PanelSpec:
    title: str  # the dashboard panel's title (its `$pool` left out of the axes title)
    exprs: tuple[str, ...]
    legends: tuple[str, ...]
    unit: str  # Grafana unit: short, s, reqps, percentunit


# The dashboard's key panels, in reading order: what was decided, what the policy saw, what happened.
KEY_PANELS: tuple[PanelSpec, ...] = (
    PanelSpec("Replicas — $pool", (
        'max by (pool) (governor_replicas_desired{pool=~"$pool"})',
        'max by (pool) (governor_replicas_ready{pool=~"$pool"})',
        'max by (pool) (governor_replicas_starting{pool=~"$pool"})'),
        ("{{pool}} desired", "{{pool}} ready", "{{pool}} starting"), "short"),
    PanelSpec("p95 TTFT vs SLO", (
        'max by (pool) (governor_pool_ttft_p95_seconds{pool=~"$pool"})', "max(governor_slo_ttft_seconds)"),
        ("{{pool}} p95 TTFT", "SLO"), "s"),
    PanelSpec("Arrival rate", ('max by (pool) (governor_pool_arrival_rps{pool=~"$pool"})',), ("{{pool}}",), "reqps"),
    PanelSpec("Prefix-cache hit rate", ('max by (pool) (governor_pool_hit_rate{pool=~"$pool"})',), ("{{pool}}",),
              "percentunit"),
    PanelSpec("Decisions by outcome", ("60 * sum by (outcome) (rate(governor_decisions_total[$__rate_interval]))",),
              ("{{outcome}}",), "short"),
    PanelSpec("Admission: shed fraction per class", ("max by (priority) (governor_admission_shed_fraction)",),
              ("{{priority}}",), "percentunit"),
    PanelSpec("Cost per successful task", (
        "sum(rate(governor_spend_usd_total[$__rate_interval])) / "
        'sum(rate(governor_picker_tasks_total{outcome="completed"}[$__rate_interval]))',
        "max by (basis) (governor_cost_per_successful_task_usd)"),
        ("over the window", "since start ({{basis}})"), "currencyUSD"),
    PanelSpec("Ticks by result", ("60 * sum by (result) (rate(governor_ticks_total[$__rate_interval]))",),
              ("{{result}}",), "short"),
    PanelSpec("Tick duration by phase (p95)", (
        "histogram_quantile(0.95, sum by (le, phase) "
        "(rate(governor_tick_duration_seconds_bucket[$__rate_interval])))",),
        ("{{phase}} p95",), "s"),
)

_UNIT_LABEL = {"short": "", "s": "seconds", "reqps": "requests/s", "percentunit": "fraction", "currencyUSD": "USD"}


class ReportError(ValueError):
    """Bad arguments or an unusable answer from Prometheus; the message says which."""


@dataclass
class SeriesDrawn:
    legend: str
    points: int
    last: float | None


@dataclass
class PanelDrawn:
    title: str  # the axes title in the PNG
    exprs: list[str]
    series: list[SeriesDrawn] = field(default_factory=list)


@dataclass
class Report:
    png: str
    sidecar: str
    prometheus: str
    start_s: float
    end_s: float
    step_s: float
    panels: list[PanelDrawn]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_time(value: str, now_s: float) -> float:
    """Unix seconds, ISO 8601 (UTC unless an offset is given), 'now', or 'now-1h' / '-30m' / '-90s'."""
    v = value.strip()
    m = re.fullmatch(r"(?:now)?(?:-(\d+(?:\.\d+)?)([smhd]))?", v)
    if m and v:
        if m.group(1) is None:
            return now_s
        return now_s - float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
    try:
        return float(v)
    except ValueError:
        pass
    try:
        t = datetime.fromisoformat(v)
    except ValueError:
        raise ReportError(f"time {value!r}: use unix seconds, ISO 8601 (2026-12-02T03:00:00Z), "
                          "'now' or a relative time like 'now-1h'") from None
    return (t if t.tzinfo else t.replace(tzinfo=UTC)).timestamp()


def fill(expr: str, pool_regex: str, rate_interval_s: float) -> str:
    return expr.replace("$pool", pool_regex).replace("$__rate_interval", f"{int(math.ceil(rate_interval_s))}s")


def _legend(template: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), template).strip() or "value"


def _query(prom: Any, expr: str, start_s: float, end_s: float, step_s: float) -> list[dict[str, Any]]:
    from prometheus_api_client import PrometheusApiClientException

    try:
        return list(prom.custom_query_range(expr, start_time=datetime.fromtimestamp(start_s, UTC),
                                            end_time=datetime.fromtimestamp(end_s, UTC), step=f"{step_s:g}s"))
    except PrometheusApiClientException as exc:
        raise ReportError(f"Prometheus refused {expr!r}: {exc}") from None
    except OSError as exc:
        raise ReportError(f"cannot reach Prometheus: {exc}") from None


def render_report(prometheus_url: str, start_s: float, end_s: float, out: str | Path, *, step_s: float | None = None,
                  pool_regex: str = ".*", scrape_interval_s: float = 15.0, panels: Sequence[PanelSpec] = KEY_PANELS,
                  timeout_s: float = 30.0) -> Report:
    """Query every panel over [start_s, end_s] and draw them into `out` (PNG); writes `out`.json too."""
    if not end_s > start_s:
        raise ReportError(f"the time range is empty: end ({end_s:.0f}) must be after start ({start_s:.0f})")
    step = step_s if step_s is not None else max(1.0, (end_s - start_s) / 300)  # ~300 points per series
    if step <= 0:
        raise ReportError(f"step must be > 0 s (got {step:g})")
    if (end_s - start_s) / step > 11_000:
        raise ReportError(f"{(end_s - start_s) / step:.0f} points per series: Prometheus answers at most 11000; "
                          "raise --step")
    rate_interval = max(4 * step, 4 * scrape_interval_s)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from prometheus_api_client import PrometheusConnect

    prom = PrometheusConnect(url=prometheus_url, disable_ssl=False, timeout=timeout_s)
    cols = 2
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(14, 3.2 * rows), squeeze=False)
    drawn: list[PanelDrawn] = []
    t0 = start_s
    span = end_s - start_s
    x_unit, x_div = ("seconds", 1.0) if span <= 600 else (("minutes", 60.0) if span <= 6 * 3600 else ("hours", 3600.0))
    for i, spec in enumerate(panels):
        ax = axes[i // cols][i % cols]
        title = spec.title.replace(" — $pool", "")
        pd = PanelDrawn(title=title, exprs=[fill(e, pool_regex, rate_interval) for e in spec.exprs])
        for expr, legend in zip(pd.exprs, spec.legends, strict=True):
            for r in _query(prom, expr, start_s, end_s, step):
                pts = [(float(ts), float(v)) for ts, v in r.get("values", [])]
                pts = [(ts, v) for ts, v in pts if math.isfinite(v)]
                name = _legend(legend, r.get("metric", {}))
                if pts:
                    xs = [(ts - t0) / x_div for ts, _ in pts]
                    ax.plot(xs, [v for _, v in pts], label=name, linewidth=1.2,
                            marker="." if len(pts) < 30 else None,  # a short series would not show as a line
                            drawstyle="steps-post" if spec.unit == "short" else "default")
                pd.series.append(SeriesDrawn(name, len(pts), pts[-1][1] if pts else None))
        ax.set_title(title)
        ax.set_xlim(0, span / x_div)
        ax.set_xlabel(f"{x_unit} after {datetime.fromtimestamp(t0, UTC):%Y-%m-%d %H:%M:%S} UTC")
        ax.set_ylabel(_UNIT_LABEL.get(spec.unit, spec.unit))
        ax.grid(True, alpha=0.3)
        if any(s.points for s in pd.series):
            ax.legend(fontsize="x-small", loc="upper left")
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="grey")
        drawn.append(pd)
    for j in range(len(panels), rows * cols):
        axes[j // cols][j % cols].set_visible(False)
    fig.suptitle(f"Governor control loop — {prometheus_url} — "
                 f"{datetime.fromtimestamp(start_s, UTC):%Y-%m-%d %H:%M} to "
                 f"{datetime.fromtimestamp(end_s, UTC):%Y-%m-%d %H:%M} UTC (step {step:g} s)")
    fig.tight_layout()
    out_path = Path(out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_path, format="png", dpi=100)
    plt.close(fig)
    sidecar = out_path.with_name(out_path.name + ".json")
    report = Report(str(out_path), str(sidecar), prometheus_url, start_s, end_s, step, drawn)
    sidecar.write_text(json.dumps(report.to_dict(), indent=2))
    return report


def cmd_report(args: Any) -> int:
    import sys

    now = time.time()
    try:
        start = parse_time(args.start, now)
        end = parse_time(args.end, now)
        rep = render_report(args.prometheus, start, end, args.out, step_s=args.step, pool_regex=args.pool,
                            scrape_interval_s=args.scrape_interval)
    except ReportError as exc:
        print(f"governor report: {exc}", file=sys.stderr)
        return 2
    empty = [p.title for p in rep.panels if not any(s.points for s in p.series)]
    print(f"wrote {rep.png} ({len(rep.panels)} panels) and {rep.sidecar}"
          + (f"; no data for: {', '.join(empty)}" if empty else ""))
    return 0
