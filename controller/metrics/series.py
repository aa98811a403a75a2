"""The series Governor reads, per exporter, by what they mean: one table for each engine kind, DCGM and the
llm-d router.

Every reader takes its names from here: the default PromQL (`promql.py`, and through it the recording
rules of controller/telemetry/rules.py), the direct-scrape window (controller/telemetry/window.py),
the picker's scrape (controller/dataplane/scrape.py) and the simulator's exposition
(controller/sim/exposition.py, exposition_sglang.py), so an engine's renamed metric or a new engine
is one edit. Each entry is a tuple of names: the current one first, then those older builds exported
(read as fallbacks, in this order; an exporter writes only the first). Counters are named as
Prometheus stores them (with `_total`); histograms by their base name (`_bucket`, `_count` appended
by the reader). The facts behind each name are in docs/TELEMETRY.md (§1 vLLM, §2 SGLang, §4 DCGM,
§5 the router).

A leaf: names only; no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from types import MappingProxyType


@dataclass(frozen=True, slots=True)
class EngineSeries:
    """What one inference engine exports that Governor reads."""

    running: tuple[str, ...]  # gauge: requests in the running batch
    waiting: tuple[str, ...]  # gauge: requests queued in the engine
    kv_usage: tuple[str, ...]  # gauge: KV-cache usage, 0..1
    prefix_hits: tuple[str, ...]  # counter: prompt tokens found in the prefix cache
    prefix_queries: tuple[str, ...]  # counter: prompt tokens looked up in it
    hit_rate: tuple[str, ...]  # gauge: the engine's own hit rate, 0..1 (when it exports one)
    prompt_tokens: tuple[str, ...]  # counter: prefill tokens
    generation_tokens: tuple[str, ...]  # counter: generated tokens
    preemptions: tuple[str, ...]  # counter: requests preempted (vLLM) or retracted (SGLang)
    ttft: tuple[str, ...]  # histogram: time to first token, s
    itl: tuple[str, ...]  # histogram: inter-token latency, s
    request_tpot: tuple[str, ...]  # histogram: each finished request's mean time per output token, s


VLLM = EngineSeries(
    running=("vllm:num_requests_running",),
    waiting=("vllm:num_requests_waiting",),
    kv_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    prefix_hits=("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
    prefix_queries=("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
    hit_rate=(),
    prompt_tokens=("vllm:prompt_tokens_total",),
    generation_tokens=("vllm:generation_tokens_total",),
    preemptions=("vllm:num_preemptions_total",),
    ttft=("vllm:time_to_first_token_seconds",),
    itl=("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    request_tpot=("vllm:request_time_per_output_token_seconds",),
)

# SGLang counts cache hits as cached prompt tokens out of all prompt tokens, and exports its own hit rate
# over its last logging interval too; it has no per-request TPOT histogram (the reading stays missing).
SGLANG = EngineSeries(
    running=("sglang:num_running_reqs",),
    waiting=("sglang:num_queue_reqs",),
    kv_usage=("sglang:token_usage",),
    prefix_hits=("sglang:cached_tokens_total",),
    prefix_queries=("sglang:prompt_tokens_total",),
    hit_rate=("sglang:cache_hit_rate",),
    prompt_tokens=("sglang:prompt_tokens_total",),
    generation_tokens=("sglang:generation_tokens_total",),
    preemptions=("sglang:num_retracted_requests_total",),
    ttft=("sglang:time_to_first_token_seconds",),
    itl=("sglang:inter_token_latency_seconds",),
    request_tpot=(),
)

ENGINES: Mapping[str, EngineSeries] = MappingProxyType({"vllm": VLLM, "sglang": SGLANG})
"""One entry per engine kind of controller/names.py, in its order (tests/test_names.py checks it)."""

ENGINE_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(EngineSeries))


def every_engine(meaning: str) -> tuple[str, ...]:
    """The names of one meaning across every engine, engine by engine in ENGINE_KINDS' order, each
    engine's current name first: every_engine("running") → ("vllm:num_requests_running",
    "sglang:num_running_reqs")."""
    if meaning not in ENGINE_FIELDS:
        raise KeyError(f"{meaning!r} is not an engine series; known: {list(ENGINE_FIELDS)}")
    return tuple(n for e in ENGINES.values() for n in getattr(e, meaning))


@dataclass(frozen=True, slots=True)
class DcgmSeries:
    """What the DCGM exporter exports that Governor reads (per GPU)."""

    engine_active: str  # gauge: graphics engine active, ratio 0..1 (needs profiling metrics)
    gpu_util: str  # gauge: GPU utilisation, percent 0..100 (always collected)
    fb_used: str  # gauge: framebuffer used, MiB
    fb_free: str  # gauge: framebuffer free, MiB


DCGM = DcgmSeries(engine_active="DCGM_FI_PROF_GR_ENGINE_ACTIVE", gpu_util="DCGM_FI_DEV_GPU_UTIL",
                  fb_used="DCGM_FI_DEV_FB_USED", fb_free="DCGM_FI_DEV_FB_FREE")


@dataclass(frozen=True, slots=True)
class RouterSeries:
    """What the llm-d router (its endpoint picker, EPP) exports that Governor reads, per priority class.
    The second names are the Gateway API Inference Extension's, which llm-d's replaced."""

    requests: tuple[str, ...]  # counter: requests received
    errors: tuple[str, ...]  # counter: requests that ended in an error, by error_code
    queue: tuple[str, ...]  # gauge: requests held in the flow-control queues
    ttft: tuple[str, ...]  # histogram: time to first token seen by the router, s
    tpot: tuple[str, ...]  # histogram: streaming TPOT, else the normalized TPOT, s
    # Governor's extensions, which a router adapter may export (the simulator's router does; a stock EPP does not)
    shed: tuple[str, ...]  # counter: requests rejected by admission (429) or the queue budget (503)
    admitted: tuple[str, ...]  # counter: requests admitted
    retries: tuple[str, ...]  # counter: client retries received


ROUTER = RouterSeries(
    requests=("llm_d_epp_request_total", "inference_objective_request_total"),
    errors=("llm_d_epp_request_error_total", "inference_objective_request_error_total"),
    queue=("llm_d_epp_flow_control_queue_size", "inference_extension_flow_control_queue_size"),
    ttft=("llm_d_epp_request_ttft_seconds",),
    tpot=("llm_d_epp_request_streaming_tpot_seconds", "llm_d_epp_request_ntpot_seconds",
          "inference_objective_normalized_time_per_output_token_seconds"),
    shed=("llm_d_epp_governor_shed_total",),
    admitted=("llm_d_epp_governor_admitted_total",),
    retries=("llm_d_epp_governor_retries_total",),
)


def counter_base(counter: str) -> str:
    """A counter's name as an exporter's client library declares it (it appends `_total` itself):
    counter_base("vllm:prompt_tokens_total") → "vllm:prompt_tokens"."""
    return counter.removesuffix("_total")
