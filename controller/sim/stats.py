"""Counters, gauges and histograms the simulated fleet keeps, with vLLM V1 semantics.

The engine, router and autoscaler write these; `exposition.py` serves them as
/metrics (vLLM, DCGM and llm-d router names), and in-process observers read them
directly. All counters are cumulative since the replica (or router) started,
exactly like the real exporters, so consumers compute rates from deltas.
Bucket boundaries are those of vLLM V1 (docs/TELEMETRY.md §1.2).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from controller.metrics.histogram import Histogram

TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                  20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                 40.0, 80.0)
REQUEST_LATENCY_BUCKETS_S = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                             120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")


def token_buckets(max_model_len: int) -> tuple[int, ...]:
    """vLLM's 1-2-5 series up to and including max_model_len: 1, 2, 5, 10, 20, 50, …"""
    out: list[int] = []
    mantissa, exp = (1, 2, 5), 0
    while True:
        for m in mantissa:
            v = m * 10**exp
            if v > max_model_len:
                return tuple(out)
            out.append(v)
        exp += 1


@dataclass
class ReplicaStats:
    """One engine (vLLM V1, engine "0") as its /metrics would show it."""

    replica_id: str
    pool: str
    model_name: str
    node_id: str
    gpu_indices: tuple[int, ...]
    num_gpu_blocks: int
    block_size: int
    gpu_memory_utilization: float
    max_model_len: int = 32768
    # gauges
    num_requests_running: int = 0
    num_requests_waiting: int = 0
    kv_cache_usage_perc: float = 0.0
    # counters (cumulative)
    prefix_cache_queries: float = 0.0  # tokens looked up
    prefix_cache_hits: float = 0.0  # tokens found
    num_preemptions: float = 0.0
    prompt_tokens: float = 0.0
    generation_tokens: float = 0.0
    request_success: dict[str, float] = field(default_factory=lambda: dict.fromkeys(FINISHED_REASONS, 0.0))
    busy_s: float = 0.0  # seconds the GPU spent executing steps (drives DCGM utilisation)
    # histograms
    ttft_s: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS_S))
    itl_s: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS_S))
    tpot_s: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS_S))  # request_time_per_output_token
    e2e_s: Histogram = field(default_factory=lambda: Histogram(REQUEST_LATENCY_BUCKETS_S))
    queue_time_s: Histogram = field(default_factory=lambda: Histogram(REQUEST_LATENCY_BUCKETS_S))
    prefill_time_s: Histogram = field(default_factory=lambda: Histogram(REQUEST_LATENCY_BUCKETS_S))
    decode_time_s: Histogram = field(default_factory=lambda: Histogram(REQUEST_LATENCY_BUCKETS_S))
    inference_time_s: Histogram = field(default_factory=lambda: Histogram(REQUEST_LATENCY_BUCKETS_S))
    iteration_tokens: Histogram = field(default_factory=lambda: Histogram(ITERATION_TOKENS_BUCKETS))
    # buckets depend on max_model_len, so built by __post_init__
    request_prompt_tokens: Histogram = field(init=False)
    request_generation_tokens: Histogram = field(init=False)

    def __post_init__(self) -> None:
        self.request_prompt_tokens = Histogram(token_buckets(self.max_model_len))
        self.request_generation_tokens = Histogram(token_buckets(self.max_model_len))


@dataclass
class NodeStats:
    """One GPU node as the DCGM exporter shows it (per GPU index)."""

    node_id: str
    sku: str  # a100-80gb | h100-80gb
    model_name_label: str  # DCGM modelName, e.g. "NVIDIA H100 80GB HBM3"
    gpus: int
    fb_total_mib: float
    pool: str = ""  # nodes belong to one pool (a node pool per SKU)
    # per GPU index: cumulative busy seconds and framebuffer used (MiB); updated by the fleet
    gpu_busy_s: list[float] = field(default_factory=list)
    fb_used_mib: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.gpu_busy_s:
            self.gpu_busy_s = [0.0] * self.gpus
        if not self.fb_used_mib:
            self.fb_used_mib = [0.0] * self.gpus


@dataclass
class ClassStepStats:
    """Router counters for one (priority class, workflow step index) cell."""

    arrivals: float = 0.0  # llm_d_epp_request_total
    admitted: float = 0.0
    shed: float = 0.0  # rejected with 429 (admission) or 503 (no endpoint within the queue budget)
    errors: dict[str, float] = field(default_factory=dict)  # error_code -> count (429, 503, 500, timeout)
    retries: float = 0.0
    ttft_s: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS_S))
    tpot_s: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS_S))
    e2e_s: Histogram = field(default_factory=lambda: Histogram(REQUEST_LATENCY_BUCKETS_S))
    queue_time_s: Histogram = field(default_factory=lambda: Histogram(REQUEST_LATENCY_BUCKETS_S))


@dataclass
class RouterStats:
    """The router (llm-d endpoint picker style) for the whole fleet."""

    model_name: str
    cells: dict[tuple[str, int], ClassStepStats] = field(default_factory=dict)  # (priority, step index)
    queue_size: dict[str, int] = field(default_factory=dict)  # per pool: requests held at the router
    # per priority class: requests held at the router (over every pool), the flow-control queue gauge
    queue_by_priority: dict[str, int] = field(default_factory=dict)
    ready_endpoints: dict[str, int] = field(default_factory=dict)  # per pool
    running: dict[str, int] = field(default_factory=dict)  # per pool: in flight on replicas

    def cell(self, priority: str, step: int) -> ClassStepStats:
        key = (priority, step)
        c = self.cells.get(key)
        if c is None:
            c = self.cells[key] = ClassStepStats()
        return c
