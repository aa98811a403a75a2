"""What an operator sees while the daemon runs: a live rich table, or JSON lines.

`LiveView` (a terminal) redraws per pool: replicas ready/desired, starting,
load, p95 TTFT against the SLO, hit rate, telemetry status and the last reason,
with the last decisions scrolling underneath. `JsonLines` (not a terminal, or
--headless) prints one JSON object per pool per tick on stdout.
"""

from __future__ import annotations

import json
import math
import sys
import threading
from collections import deque
from typing import Any, TextIO

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from controller.runtime.daemon import TickReport


def _num(v: float, fmt: str = "{:.2f}") -> str:
    return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else fmt.format(v)


def pool_rows(report: TickReport, slo_ttft_s: float) -> list[dict[str, Any]]:
    """Per pool: the figures both views show (JSON-ready; NaN → None)."""
    rows = []
    d = report.result.decision
    for name, p in report.observation.pools.items():
        reasons = [r for r in report.result.policy_reasons + report.result.guard_adjustments if r.pool == name]
        reason = reasons[-1] if reasons else None

        def val(r):
            return r.value if r.ok else None

        rows.append({
            "pool": name,
            "replicas_desired": d.pools[name].replicas if d and name in d.pools else None,
            "replicas_ready": int(p.replicas_ready.value) if p.replicas_ready.ok else None,
            "replicas_starting": int(p.replicas_starting.value) if p.replicas_starting.ok else None,
            "arrival_rps": val(p.arrival_rps),
            "ttft_p95_s": val(p.ttft_p95_s),
            "slo_ttft_s": slo_ttft_s,
            "hit_rate": val(p.hit_rate),
            "kv_usage_frac": val(p.kv_usage_frac),
            "gpu_mem_used_frac": val(p.gpu_mem_used_frac),  # memory headroom: DCGM FB of the fullest GPU
            "telemetry": report.result.telemetry.get(name, "missing"),
            "reason": reason.code if reason else "steady",
            "reason_text": reason.message if reason else "",
        })
    return rows


class JsonLines:
    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stdout
        self._lock = threading.Lock()

    def emit(self, event: dict[str, Any]) -> None:
        with self._lock:
            self.stream.write(json.dumps(event, default=_jsonable) + "\n")
            self.stream.flush()

    def on_tick(self, report: TickReport, slo_ttft_s: float) -> None:
        d = report.result.decision
        costs = report.costs.to_dict() if report.costs is not None else None
        for row in pool_rows(report, slo_ttft_s):
            self.emit({"event": "tick", "at_s": report.observation.at_s,
                       "decision_id": d.decision_id if d else None, "mode": report.result.mode.value,
                       "outcome": report.outcome.status if report.outcome is not None else "paused", **row,
                       **({"costs": costs} if costs is not None else {})})


def cost_line(c) -> str:
    """The live view's line on money: spend now and so far, tasks settled, cost per successful task."""
    rate = sum(c.spend_usd_per_hour.values())
    line = f"spend ${rate:.2f}/h · ${c.spend_usd:.4f} so far"
    if c.basis == "none":
        return line + " · tasks: no picker counts"
    share = c.success_share()
    unit = "task" if c.basis == "tasks" else "request"
    line += (f" · {c.count('completed'):.0f} of {c.count('started'):.0f} {unit}s completed"
             + (" (no task ids: each request a task)" if c.basis == "requests" else "")
             + (f" ({share:.0%} of settled)" if share is not None else ""))
    if c.cost_per_success_usd is not None:
        line += f" · ${c.cost_per_success_usd:.5f} per successful {unit}"
    return line


def _jsonable(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return str(v)


class LiveView:
    def __init__(self, title: str, console: Console | None = None, history: int = 8) -> None:
        self.title = title
        self.console = console or Console(markup=False)  # reasons may contain brackets
        self.decisions: deque[str] = deque(maxlen=history)
        self._live = Live(Text("waiting for the first tick…"), console=self.console, refresh_per_second=4,
                          transient=False)
        self._header = ""

    def __enter__(self) -> LiveView:
        self._live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._live.__exit__(*exc)

    def set_header(self, text: str) -> None:
        self._header = text

    def on_tick(self, report: TickReport, slo_ttft_s: float) -> None:
        table = Table(title=f"{self.title} · TTFT SLO {slo_ttft_s:g}s", expand=False)
        # One line per pool whatever the terminal width: the reason is cut, never wrapped.
        wide = self.console.width >= 110  # narrow terminals drop the KV and telemetry columns
        widths = {"pool": 12, "ready/want": 10, "rps": 5, "p95 TTFT": 8, "hit": 4}
        if wide:
            widths.update({"KV": 4, "data": 7})
        for col, width in widths.items():
            table.add_column(col, no_wrap=True, min_width=width)
        fixed = sum(widths.values()) + 3 * (len(widths) + 1) + 1
        table.add_column("last reason", no_wrap=True, overflow="ellipsis",
                         max_width=max(12, self.console.width - fixed))
        for row in pool_rows(report, slo_ttft_s):
            ttft = row["ttft_p95_s"]
            breach = ttft is not None and ttft > slo_ttft_s
            starting = row["replicas_starting"]
            cells = [
                row["pool"],
                f"{_num(row['replicas_ready'], '{}')}/{_num(row['replicas_desired'], '{}')}"
                + (f" +{starting}" if starting else ""),
                _num(row["arrival_rps"], "{:.1f}"),
                Text(_num(ttft, "{:.2f}s"), style="bold red" if breach else "green"),
                _num(row["hit_rate"], "{:.0%}"),
            ]
            if wide:
                cells += [_num(row["kv_usage_frac"], "{:.0%}"),
                          Text(row["telemetry"], style="green" if row["telemetry"] == "ok" else "yellow")]
            table.add_row(*cells, f"{row['reason']}: {row['reason_text']}")
        first = report.result.explanation.splitlines()[0] if report.result.explanation else ""
        outcome = report.outcome.status if report.outcome is not None else "paused"
        if report.result.changed or not self.decisions:
            self.decisions.appendleft(f"{first}  → {outcome}")
        money = [Text(cost_line(report.costs))] if report.costs is not None else []
        body = Group(Text(self._header, style="dim"), table, *money, Text("recent decisions:", style="bold"),
                     *[Text("  " + line) for line in self.decisions])
        self._live.update(body)
