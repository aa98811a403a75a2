"""The default PromQL queries, one named query per observation field.

This is the only place that spells out PromQL. Each query is a template with two
placeholders, `$pool` (the label that names a pool, `pool` by default) and
`$window` (the rate window, e.g. `60s`). Pool queries return one series per pool
(`... by ($pool)`); class queries return one series per priority class
(`... by (priority)`, the label the llm-d router puts on its request metrics).

Naming follows docs/TELEMETRY.md: the current vLLM V1 names first, the renamed
ones as an `or` fallback (`vllm:kv_cache_usage_perc or vllm:gpu_cache_usage_perc`),
then the SGLang equivalent, so one query serves a fleet of mixed versions. `or`
keeps the left side and adds right-side series only for label sets the left side
lacks, so an old build that exports both names is not counted twice. DCGM series
are de-duplicated per GPU by `(Hostname, hostname, gpu)`: the exporter renamed
`Hostname` to `hostname`, and grouping by both works with either.

Each QuerySpec's `fills` names the PoolObservation/ClassObservation field it
fills. The three `*_sample_time` queries fill no field: they return the newest
sample time per pool (engines, DCGM) or class (router), from which a source
decides STALE. Example of the maths the queries do: with 30 hit tokens/s out of
150 looked-up tokens/s, `hit_rate` = 30 / 150 = 0.2.

This module only builds strings: it must not import a Prometheus client or do I/O. It sits outside
`telemetry/` so that `controller.config` can check query overrides by name without importing an edge;
`telemetry/` renders and runs the queries.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from string import Template
from types import MappingProxyType

from controller.metrics.series import DCGM, ENGINES, ROUTER, every_engine

POOL = "pool"
CLASS = "class"
FRESHNESS = "freshness"

CLASS_LABEL = "priority"
"""Label of the router's request metrics that names the priority class."""


@dataclass(frozen=True, slots=True)
class QuerySpec:
    """One named query: its template and what it fills."""

    name: str
    template: str
    group: str  # POOL | CLASS | FRESHNESS
    fills: str  # "PoolObservation.ttft_p95_s", or what a freshness query is used for
    freshness: str = ""  # name of the freshness query whose sample times decide STALE for this one
    doc: str = ""


def _q(name: str, template: str, group: str, fills: str, freshness: str = "", doc: str = "") -> QuerySpec:
    return QuerySpec(name, " ".join(template.split()), group, fills, freshness, doc)


def _quantile(q: float, bucket_names: tuple[str, ...], by: str) -> str:
    rates = " or ".join(f"rate({n}_bucket[$window])" for n in bucket_names)
    return f"histogram_quantile({q}, sum by (le, {by}) ({rates}))"


def _rate_sum(counter_names: tuple[str, ...], by: str, selector: str = "") -> str:
    rates = " or ".join(f"rate({n}{selector}[$window])" for n in counter_names)
    return f"sum by ({by}) ({rates})"


def _or(names: tuple[str, ...], wrap: str = "{}") -> str:
    return " or ".join(wrap.format(n) for n in names)


def _hit_rate() -> str:
    """Per engine that counts hits: rate(hits) / rate(queries), each over its names; then the engines'
    own hit-rate gauges."""
    parts = [f"(sum by ($pool) ({_or(e.prefix_hits, 'rate({}[$window])')})"
             f" / sum by ($pool) ({_or(e.prefix_queries, 'rate({}[$window])')}))"
             for e in ENGINES.values() if e.prefix_hits]
    gauges = every_engine("hit_rate")
    if gauges:
        parts.append(f"avg by ($pool) ({_or(gauges)})")
    return " or ".join(parts)


_RUNNING = _or(every_engine("running"))
_TTFT = every_engine("ttft")
_ITL = every_engine("itl")
_REQ_TPOT = every_engine("request_tpot")  # vLLM; an engine without it leaves the reading missing
_EPP_TTFT = ROUTER.ttft
_EPP_TPOT = ROUTER.tpot
_EPP_REQUESTS = ROUTER.requests
_EPP_ERRORS = ROUTER.errors
# Governor extensions a router adapter may export (the simulator's router does); a stock EPP does not.
_GOV_SHED = ROUTER.shed
_GOV_ADMITTED = ROUTER.admitted
_GOV_RETRIES = ROUTER.retries
_ASSIGNED = '{pod!=""}'
_GPU_BUSY = (f"max by ($pool, Hostname, hostname, gpu) ({DCGM.engine_active}{{sel}}"
             f" or {DCGM.gpu_util}{{sel}} / 100)")

_FB_FRAC = f"{DCGM.fb_used}{{sel}} / ({DCGM.fb_used}{{sel}} + {DCGM.fb_free}{{sel}})"

SHED_ERROR_CODES = ("429", "503")
"""Router error codes that mean "rejected by admission/shedding" (TELEMETRY.md §8: 429 shed, 503 no endpoint)."""
_SHED_SELECTOR = '{error_code=~"' + "|".join(SHED_ERROR_CODES) + '"}'

_SPECS: tuple[QuerySpec, ...] = (
    # ---------------------------------------------------------------- freshness (sample times)
    _q("pool_sample_time",
       f"max by ($pool) ({_or(every_engine('running'), 'timestamp({})')})",
       FRESHNESS, "STALE check of the engine fields of PoolObservation",
       doc="Newest engine sample time per pool; the engine readings of a pool are STALE when it is older than "
           "stale_after_s (timestamp() of a plain selector returns the sample's own time)."),
    _q("gpu_sample_time", f"max by ($pool) (timestamp({DCGM.gpu_util}))",
       FRESHNESS, "STALE check of PoolObservation.gpu_util_frac"),
    _q("class_sample_time", f"max by (priority) ({_or(ROUTER.requests, 'timestamp({})')})",
       FRESHNESS, "STALE check of ClassObservation fields"),
    # ---------------------------------------------------------------- pools: engines
    _q("replicas_ready", f"count by ($pool) (count by ($pool, instance) ({_RUNNING}))",
       POOL, "PoolObservation.replicas_ready", "pool_sample_time",
       doc="Engine endpoints exporting metrics (one per scrape target, however many DP engines it has)."),
    _q("running", f"sum by ($pool) ({_RUNNING})", POOL, "PoolObservation.running", "pool_sample_time"),
    _q("waiting", f"sum by ($pool) ({_or(every_engine('waiting'))})",
       POOL, "PoolObservation.waiting", "pool_sample_time"),
    _q("kv_usage_frac", f"avg by ($pool) ({_or(every_engine('kv_usage'))})",
       POOL, "PoolObservation.kv_usage_frac", "pool_sample_time", doc="Mean KV-cache usage over engines, 0..1."),
    _q("hit_rate", _hit_rate(),
       POOL, "PoolObservation.hit_rate", "pool_sample_time",
       doc="Token-weighted prefix-cache hit rate: rate(hits) / rate(queries); on SGLang rate(cached prompt tokens) / "
           "rate(prompt tokens), else its cache_hit_rate gauge (its last logging interval). NaN when nothing was "
           "looked up in the window."),
    _q("ttft_p50_s", _quantile(0.5, _TTFT, "$pool"), POOL, "PoolObservation.ttft_p50_s", "pool_sample_time"),
    _q("ttft_p95_s", _quantile(0.95, _TTFT, "$pool"), POOL, "PoolObservation.ttft_p95_s", "pool_sample_time"),
    _q("tpot_p50_s", _quantile(0.5, _ITL, "$pool"), POOL, "PoolObservation.tpot_p50_s", "pool_sample_time",
       doc="From the inter-token latency histogram (time_per_output_token_seconds on old vLLM builds)."),
    _q("tpot_p95_s", _quantile(0.95, _ITL, "$pool"), POOL, "PoolObservation.tpot_p95_s", "pool_sample_time"),
    _q("request_tpot_p95_s", _quantile(0.95, _REQ_TPOT, "$pool"), POOL, "PoolObservation.request_tpot_p95_s",
       "pool_sample_time",
       doc="p95 of each finished request's mean time per output token (one observation per request): the "
           "statistic a TPOT SLO judges; the ITL above is per token and higher under chunked prefill."),
    _q("arrival_rps", _rate_sum(tuple(f"{n}_count" for n in _TTFT), "$pool"),
       POOL, "PoolObservation.arrival_rps", "pool_sample_time",
       doc="Requests reaching their first token per second. Engines export no arrival counter; this lags arrivals "
           "by the queueing time and caps at capacity under overload (the router's per-class rate does not)."),
    _q("prompt_tokens_rps", _rate_sum(every_engine("prompt_tokens"), "$pool"),
       POOL, "PoolObservation.prompt_tokens_rps", "pool_sample_time"),
    _q("generation_tokens_rps", _rate_sum(every_engine("generation_tokens"), "$pool"),
       POOL, "PoolObservation.generation_tokens_rps", "pool_sample_time"),
    _q("preemptions_rps", _rate_sum(every_engine("preemptions"), "$pool"),
       POOL, "PoolObservation.preemptions_rps", "pool_sample_time",
       doc="vLLM preemptions or SGLang retractions per second."),
    # ---------------------------------------------------------------- pools: DCGM
    _q("gpu_util_frac",
       f"avg by ($pool) ({_GPU_BUSY.format(sel=_ASSIGNED)}) or avg by ($pool) ({_GPU_BUSY.format(sel='')})",
       POOL, "PoolObservation.gpu_util_frac", "gpu_sample_time",
       doc="Mean over the pool's GPUs of the graphics-engine-active ratio when profiling metrics are on, else "
           "DCGM_FI_DEV_GPU_UTIL (percent) / 100. Only GPUs mapped to a pod count when the exporter's Kubernetes "
           "mapping is on (idle GPUs of a node would dilute the mean); all GPUs otherwise."),
    _q("gpu_mem_used_frac",
       f"max by ($pool) ({_FB_FRAC.format(sel=_ASSIGNED)}) or max by ($pool) ({_FB_FRAC.format(sel='')})",
       POOL, "PoolObservation.gpu_mem_used_frac", "gpu_sample_time",
       doc="Memory headroom: framebuffer used / (used + free) of the pool's fullest GPU (DCGM_FI_DEV_FB_USED and "
           "DCGM_FI_DEV_FB_FREE, MiB). vLLM claims gpu_memory_utilization of it at start, so above that share "
           "something else holds the GPU's memory (another process, a leak, fragmentation)."),
    # ---------------------------------------------------------------- classes: llm-d router (EPP)
    _q("class_arrival_rps", _rate_sum(_EPP_REQUESTS, CLASS_LABEL), CLASS, "ClassObservation.arrival_rps",
       "class_sample_time", doc="Requests received by the router per second (legacy GIE name as fallback)."),
    _q("class_shed_rps",
       f"{_rate_sum(_GOV_SHED, CLASS_LABEL)} or {_rate_sum(_EPP_ERRORS, CLASS_LABEL, _SHED_SELECTOR)}",
       CLASS, "ClassObservation.shed_rps", "class_sample_time",
       doc="Requests rejected by the router per second: Governor's shed counter when the router exports it, else "
           "the EPP's errors with code 429 (shed) or 503 (no endpoint)."),
    _q("class_admitted_rps",
       f"{_rate_sum(_GOV_ADMITTED, CLASS_LABEL)} or ({_rate_sum(_EPP_REQUESTS, CLASS_LABEL)}"
       f" - ({_rate_sum(_GOV_SHED, CLASS_LABEL)} or {_rate_sum(_EPP_ERRORS, CLASS_LABEL, _SHED_SELECTOR)}"
       f" or {_rate_sum(_EPP_REQUESTS, CLASS_LABEL)} * 0))",
       CLASS, "ClassObservation.admitted_rps", "class_sample_time",
       doc="Requests admitted per second: Governor's admitted counter, else received minus rejected (a class "
           "with no rejections has everything it received admitted)."),
    _q("class_queue_depth", f"sum by (priority) ({_or(ROUTER.queue)})",
       CLASS, "ClassObservation.queue_depth", "class_sample_time",
       doc="Requests held in the router's flow-control queues (present only when flow control is on)."),
    _q("class_ttft_p95_s", _quantile(0.95, _EPP_TTFT, CLASS_LABEL), CLASS, "ClassObservation.ttft_p95_s",
       "class_sample_time"),
    _q("class_tpot_p95_s", _quantile(0.95, _EPP_TPOT, CLASS_LABEL), CLASS, "ClassObservation.tpot_p95_s",
       "class_sample_time", doc="Streaming TPOT, falling back to the normalized TPOT (NTPOT) histogram."),
    _q("class_retry_rps", _rate_sum(_GOV_RETRIES, CLASS_LABEL), CLASS, "ClassObservation.retry_rps",
       "class_sample_time",
       doc="Client retries seen by the router per second. Not an upstream llm-d metric: only routers exporting "
           "Governor's extension llm_d_epp_governor_retries_total (the simulator does) fill it."),
)

QUERIES: Mapping[str, QuerySpec] = MappingProxyType({s.name: s for s in _SPECS})
QUERY_NAMES: tuple[str, ...] = tuple(QUERIES)
PLACEHOLDERS: tuple[str, ...] = ("pool", "window")


def format_window(window_s: float) -> str:
    """A Prometheus duration for a window in seconds: 60 → "60s", 2.5 → "2500ms"."""
    if not window_s > 0 or math.isinf(window_s):
        raise ValueError(f"window_s: {window_s} must be a positive finite number of seconds")
    if float(window_s).is_integer():
        return f"{int(window_s)}s"
    return f"{max(1, round(window_s * 1000))}ms"


def template_problem(text: str) -> str | None:
    """Why `text` is not a usable query template (unknown placeholder, stray `$`), or None."""
    if not text.strip():
        return "is empty"
    try:
        Template(text).substitute(pool=POOL, window="1m")
    except KeyError as exc:
        return f"uses unknown placeholder ${exc.args[0]} (allowed: ${', $'.join(PLACEHOLDERS)})"
    except ValueError as exc:
        return f"is not a valid template ({exc}); write a literal $ as $$"
    return None


def render(template: str, pool_label: str = POOL, window_s: float = 60.0) -> str:
    """Fill a template: render("sum by ($pool) (x)", "pool") → "sum by (pool) (x)"."""
    return Template(template).substitute(pool=pool_label, window=format_window(window_s))


def render_all(pool_label: str = POOL, window_s: float = 60.0,
               overrides: Mapping[str, str] | None = None) -> dict[str, str]:
    """Every named query, rendered; `overrides` replaces templates by name (unknown names raise KeyError)."""
    overrides = dict(overrides or {})
    unknown = sorted(set(overrides) - set(QUERIES))
    if unknown:
        raise KeyError(f"unknown query name(s) {unknown}; known: {list(QUERY_NAMES)}")
    return {name: render(overrides.get(name, spec.template), pool_label, window_s) for name, spec in QUERIES.items()}
