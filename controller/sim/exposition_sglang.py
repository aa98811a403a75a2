"""The simulated replica's /metrics as an SGLang server (`--enable-metrics`) shows them, for pools whose
scenario says `engine: {exposition: sglang}`.

Names, types and labels are SGLang's own, checked against its source,
python/sglang/srt/metrics/collector.py (sgl-project/sglang; docs/TELEMETRY.md §2):
`SchedulerMetricsCollector` gauges `sglang:num_running_reqs`, `sglang:num_queue_reqs`,
`sglang:token_usage`, `sglang:num_used_tokens`, `sglang:max_total_num_tokens`, `sglang:cache_hit_rate`
and the counter `sglang:num_retracted_requests_total`; `TokenizerMetricsCollector` counters
`sglang:prompt_tokens_total`, `sglang:generation_tokens_total`, `sglang:cached_tokens_total`,
`sglang:num_requests_total` and histograms `sglang:time_to_first_token_seconds`,
`sglang:inter_token_latency_seconds`, `sglang:e2e_request_latency_seconds`,
`sglang:queue_time_seconds`; labels `model_name`, `engine_type`, `tp_rank`, `pp_rank`, `moe_ep_rank`.

What the simulator keeps as vLLM would, rendered under SGLang's names: retractions are the engine's
preemptions; `cached_tokens_total` and `prompt_tokens_total` are its prefix-cache hits and lookups
(SGLang counts both per finished request, the simulator at admission: the same tokens, earlier);
`cache_hit_rate` is the hit ratio since start (SGLang's covers its last logging interval: Governor
reads the counters when they are there). Histogram bucket bounds are the simulated vLLM's, not
SGLang's defaults, so the two expositions of one load give the same quantiles. SGLang exports no
per-request TPOT histogram: a pool in this mode leaves `request_tpot_p95_s` missing, as a real
SGLang fleet does. Reads the stats only (the caller holds the fleet's lock); keeps no state.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from controller.metrics.series import SGLANG, counter_base
from controller.sim.exposition import _add_histogram, _histogram_family
from controller.sim.stats import ReplicaStats

SGLANG_LABELS = ("model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank")

_HISTOGRAMS = (
    (SGLANG.ttft[0], "ttft_s", "Histogram of time to first token in seconds."),
    (SGLANG.itl[0], "itl_s", "Histogram of inter-token latency in seconds."),
    ("sglang:e2e_request_latency_seconds", "e2e_s", "Histogram of End-to-end request latency in seconds"),
    ("sglang:queue_time_seconds", "queue_time_s", "Histogram of queueing time in seconds."),
)


class SglangReplicaCollector:
    """One SGLang server (unified mode, TP rank 0) over the simulated replica's stats."""

    def __init__(self, stats: ReplicaStats, *, created_unix_s: float | None = None) -> None:
        self.stats = stats
        self.created_unix_s = created_unix_s

    def collect(self) -> Iterable[Metric]:
        s = self.stats
        base = [s.model_name, "unified", "0", "0", "0"]
        capacity = float(s.num_gpu_blocks * s.block_size)
        hit_rate = s.prefix_cache_hits / s.prefix_cache_queries if s.prefix_cache_queries > 0 else 0.0
        for name, value, doc in (
            (SGLANG.running[0], float(s.num_requests_running), "The number of running requests."),
            (SGLANG.waiting[0], float(s.num_requests_waiting), "The number of requests in the waiting queue."),
            (SGLANG.kv_usage[0], float(s.kv_cache_usage_perc), "The token usage."),
            ("sglang:num_used_tokens", round(s.kv_cache_usage_perc * capacity), "The number of used tokens."),
            ("sglang:max_total_num_tokens", capacity, "Maximum total number of tokens in the KV cache pool."),
            (SGLANG.hit_rate[0], hit_rate, "The prefix cache hit rate."),
        ):
            g = GaugeMetricFamily(name, doc, labels=SGLANG_LABELS)
            g.add_metric(base, value)
            yield g
        for name, value, doc in (
            (counter_base(SGLANG.prompt_tokens[0]), s.prefix_cache_queries, "Number of prefill tokens processed."),
            (counter_base(SGLANG.generation_tokens[0]), s.generation_tokens, "Number of generation tokens processed."),
            (counter_base(SGLANG.prefix_hits[0]), s.prefix_cache_hits, "Number of cached prompt tokens."),
            ("sglang:num_requests", sum(s.request_success.values()), "Number of requests processed."),
            (counter_base(SGLANG.preemptions[0]), s.num_preemptions, "Total number of retracted requests."),
        ):
            c = CounterMetricFamily(name, doc, labels=SGLANG_LABELS)
            c.add_metric(base, float(value), created=self.created_unix_s)
            yield c
        for name, attr, doc in _HISTOGRAMS:
            h = _histogram_family(name, doc, SGLANG_LABELS)
            _add_histogram(h, base, getattr(s, attr))
            yield h
