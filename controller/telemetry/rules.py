"""Prometheus recording rules that pre-compute every default query of `promql.py`.

Why: through a plain Prometheus, one read runs ~25 instant queries, several of
them `histogram_quantile` over the buckets of every replica (200 replicas × ~20
buckets × 3 engine histograms: TTFT, ITL, per-request TPOT); Prometheus evaluates them on every read. Recording
rules evaluate the same expressions once per `evaluation_interval` and store one
series per pool or class, so a read becomes ONE instant query that selects the
recorded series by name (`{__name__=~"governor:pool_running:sum|..."}`).

Names follow Prometheus' `level:metric:operations` convention, with `governor`
as the level (all series are Governor's view, by pool or by priority class):
`governor:pool_<field>:<ops>` for pool queries, `governor:class_<field>:<ops>`
for class queries, `governor:<pool|gpu|class>_sample_time:max_timestamp` for the
freshness queries. `ops` carries the rate window of windowed queries, so rules
generated for another `telemetry.window_s` have other names and cannot be read
by mistake. Example: the 60 s window of `ttft_p95_s` gives
`governor:pool_ttft_p95_s:histogram_quantile_rate1m`.

The expressions are the default templates rendered with the pool label and the
window, so a recorded value equals what the raw query returned at the rule's
evaluation time. `deploy/prometheus/governor-rules.yml` is the output for the
defaults (label `pool`, window 60 s); a test checks that it has not drifted.
Regenerate for other settings with
`python -m controller.telemetry.rules --pool-label inference_pool --window-s 30 > rules.yml`.

This module only builds strings and dicts: no I/O besides `main()` printing.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Mapping

import yaml

from controller.metrics import promql

GROUP_NAME = "governor"
RECORD_PREFIX = "governor:"
_NAME_RE = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")


def duration_tag(window_s: float) -> str:
    """The window as Prometheus writes short durations: 60 → "1m", 300 → "5m", 30 → "30s", 2.5 → "2500ms"."""
    text = promql.format_window(window_s)  # validates: positive, finite
    if text.endswith("ms"):
        return text
    seconds = int(window_s)
    if seconds % 3600 == 0:
        return f"{seconds // 3600}h"
    if seconds % 60 == 0:
        return f"{seconds // 60}m"
    return f"{seconds}s"


def _metric(spec: promql.QuerySpec) -> str:
    if spec.group == promql.FRESHNESS or spec.name.startswith("class_"):
        return spec.name
    return f"pool_{spec.name}"


def _operations(spec: promql.QuerySpec, window_s: float) -> str:
    text = spec.template
    tag = duration_tag(window_s)
    if "histogram_quantile" in text:
        return f"histogram_quantile_rate{tag}"
    if "timestamp(" in text:
        return "max_timestamp"
    if "rate(" in text:
        return f"rate{tag}"
    return text.split("(", 1)[0].split()[0]  # the outer aggregation: sum, avg, count


def record_name(query_name: str, window_s: float = 60.0) -> str:
    """The recorded series of a default query: record_name("running") → "governor:pool_running:sum"."""
    spec = promql.QUERIES[query_name]
    name = f"{RECORD_PREFIX}{_metric(spec)}:{_operations(spec, window_s)}"
    if not _NAME_RE.match(name):  # cannot happen with the shipped table; guards future edits
        raise ValueError(f"record name {name!r} is not a valid metric name")
    return name


def record_names(window_s: float = 60.0, only: Mapping[str, object] | None = None) -> dict[str, str]:
    """Record name → query name, for every default query (or those in `only`)."""
    names = promql.QUERY_NAMES if only is None else tuple(n for n in promql.QUERY_NAMES if n in only)
    return {record_name(n, window_s): n for n in names}


def selector(names: Mapping[str, str] | list[str]) -> str:
    """One instant-vector selector for all the recorded series: {__name__=~"a|b|c"}.

    The exact alternation (not `governor:.+`) so that no other rule of the same
    Prometheus is read by mistake; the names need no escaping ([a-z0-9_:] only).
    """
    return '{__name__=~"' + "|".join(sorted(names)) + '"}'


def recording_rules(pool_label: str = promql.POOL, window_s: float = 60.0) -> dict:
    """The rules-file document (`groups:` → one group `governor`), one rule per default query."""
    rules = [{"record": record_name(name, window_s), "expr": promql.render(spec.template, pool_label, window_s)}
             for name, spec in promql.QUERIES.items()]
    return {"groups": [{"name": GROUP_NAME, "rules": rules}]}


def render_rules_yaml(pool_label: str = promql.POOL, window_s: float = 60.0) -> str:
    """The rules file as text, with a header saying how it was made and how to install it."""
    header = (
        "# Governor's recording rules: every default query of controller/metrics/promql.py, evaluated by\n"
        "# Prometheus once per evaluation_interval, so that Governor reads all of them with one instant query\n"
        "# (telemetry.prometheus.recording_rules: true). Generated by\n"
        f"#   python -m controller.telemetry.rules --pool-label {pool_label} --window-s {window_s:g}\n"
        "# for telemetry.prometheus.pool_label and telemetry.window_s; regenerate if you change either (the\n"
        "# rate window is part of the record names, so a mismatch reads as missing, never as wrong numbers).\n"
        "# Install: list this file under rule_files: in prometheus.yml (see deploy/prometheus/prometheus.yml),\n"
        "# or apply deploy/kubernetes/prometheusrule.yaml with prometheus-operator.\n"
        "# Check: promtool check rules governor-rules.yml\n"
    )
    return header + yaml.safe_dump(recording_rules(pool_label, window_s), sort_keys=False, width=1000)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m controller.telemetry.rules",
                                description="Print Governor's Prometheus recording rules (YAML).")
    p.add_argument("--pool-label", default=promql.POOL, help="telemetry.prometheus.pool_label (default: pool)")
    p.add_argument("--window-s", type=float, default=60.0, help="telemetry.window_s in seconds (default: 60)")
    args = p.parse_args(argv)
    if not re.match(r"^[a-zA-Z_][a-zA-Z0-9_]*$", args.pool_label):
        print(f"--pool-label: {args.pool_label!r} is not a Prometheus label name", file=sys.stderr)
        return 2
    if not (args.window_s > 0 and math.isfinite(args.window_s)):
        print(f"--window-s: {args.window_s} must be a positive number of seconds", file=sys.stderr)
        return 2
    sys.stdout.write(render_rules_yaml(args.pool_label, args.window_s))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
