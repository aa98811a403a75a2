"""Prometheus exposition of the simulated fleet: vLLM, DCGM-exporter and llm-d router views.

Three `prometheus_client` custom collectors render the live stats objects of
`controller.sim.stats` with the names, types, labels and bucket bounds of the
real exporters (docs/TELEMETRY.md §1, §4, §5.2), so a Prometheus
server or a direct scraper cannot tell them from a vLLM fleet:

- `ReplicaCollector`: one vLLM V1 engine (engine "0"); current names only (no deprecated ones).
- `NodeCollector`: one GPU node as the DCGM exporter shows it, with the Kubernetes pod mapping on.
- `RouterCollector`: the llm-d endpoint picker (EPP), plus Governor extensions for shed and
  retried requests (`llm_d_epp_governor_*`; a real EPP does not export these).

The collectors hold no registry of their own and never touch the global default
registry: each HTTP server registers its collector on its own `CollectorRegistry`,
and in-process readers call `collect_families`. They only read the stats; the
caller must hold whatever lock guards the stats while collecting (the live fleet
does). The only state kept here is the DCGM utilisation window (previous busy
seconds per GPU), because DCGM reports utilisation over an interval.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Iterable, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from controller.metrics.histogram import Histogram
from controller.metrics.series import DCGM, ROUTER, VLLM, counter_base
from controller.sim.stats import ClassStepStats, NodeStats, ReplicaStats, RouterStats

ENGINE_LABELS = ("model_name", "engine")
ENGINE_INDEX = "0"  # one engine core per replica (no data parallelism in the simulator)

# (metric name as exposed, ReplicaStats attribute, HELP text); what Governor reads is named by the series
# table (controller/metrics/series.py), the rest as vLLM names it
_VLLM_HISTOGRAMS: tuple[tuple[str, str, str], ...] = (
    (VLLM.ttft[0], "ttft_s", "Time to first token in seconds, from arrival."),
    (VLLM.itl[0], "itl_s", "Gap between successive output tokens in seconds."),
    (VLLM.request_tpot[0], "tpot_s", "Mean time per output token of each finished request."),
    ("vllm:e2e_request_latency_seconds", "e2e_s", "Arrival to final token, in seconds."),
    ("vllm:request_queue_time_seconds", "queue_time_s", "Seconds spent waiting before being scheduled."),
    ("vllm:request_prefill_time_seconds", "prefill_time_s", "Seconds from scheduling to the first token."),
    ("vllm:request_decode_time_seconds", "decode_time_s", "Seconds from the first token to the last."),
    ("vllm:request_inference_time_seconds", "inference_time_s", "Seconds in the running state (prefill and decode)."),
    ("vllm:request_prompt_tokens", "request_prompt_tokens", "Prompt length of each finished request, in tokens."),
    ("vllm:request_generation_tokens", "request_generation_tokens",
     "Output length of each finished request, in tokens."),
    ("vllm:iteration_tokens_total", "iteration_tokens", "Tokens per engine step (a histogram despite the name)."),
    # Only rendered when the engine keeps it (prompt tokens minus prefix-cache hits, per request).
    ("vllm:request_prefill_kv_computed_tokens", "request_prefill_kv_computed_tokens",
     "Prompt tokens actually computed in prefill (prompt minus cached tokens), per request."),
)

# (metric name without _total, ReplicaStats attribute, HELP text)
_VLLM_COUNTERS: tuple[tuple[str, str, str], ...] = (
    (counter_base(VLLM.prefix_queries[0]), "prefix_cache_queries", "Tokens looked up in the prefix cache."),
    (counter_base(VLLM.prefix_hits[0]), "prefix_cache_hits", "Tokens found in the prefix cache."),
    (counter_base(VLLM.preemptions[0]), "num_preemptions", "Requests preempted since the engine started."),
    (counter_base(VLLM.prompt_tokens[0]), "prompt_tokens", "Prefill tokens processed."),
    (counter_base(VLLM.generation_tokens[0]), "generation_tokens", "Tokens generated."),
)


def _histogram_family(name: str, doc: str, labelnames: Sequence[str]) -> HistogramMetricFamily:
    return HistogramMetricFamily(name, doc, labels=list(labelnames))


def _add_histogram(family: HistogramMetricFamily, labels: Sequence[str], hist: Histogram) -> None:
    """Cumulative buckets with `le` printed as the real exporters do (Go float format: 1 → "1.0")."""
    running = 0.0
    buckets: list[tuple[str, float]] = []
    for bound, n in zip(hist.bounds, hist.counts, strict=False):  # counts has one more: +Inf
        running += n
        buckets.append((floatToGoString(bound), running))
    buckets.append(("+Inf", float(hist.count)))
    family.add_metric(list(labels), buckets, sum_value=float(hist.sum))


def collect_families(collector) -> list[Metric]:
    """The metric families a collector exposes, for in-process readers (no HTTP, no registry)."""
    return list(collector.collect())


# --------------------------------------------------------------------------- vLLM


class ReplicaCollector:
    """One vLLM V1 engine's /metrics.

    `created_unix_s`, when given, adds the `_created` series prometheus_client
    exports for counters (the wall time the engine came up).
    """

    def __init__(self, stats: ReplicaStats, *, enable_prefix_caching: bool = True, cache_dtype: str = "auto",
                 created_unix_s: float | None = None) -> None:
        self.stats = stats
        self.enable_prefix_caching = enable_prefix_caching
        self.cache_dtype = cache_dtype
        self.created_unix_s = created_unix_s

    def collect(self) -> Iterable[Metric]:
        s = self.stats
        base = [s.model_name, ENGINE_INDEX]

        for name, attr, doc in (
            (VLLM.running[0], "num_requests_running", "Requests in the running batch."),
            (VLLM.waiting[0], "num_requests_waiting", "Requests queued, waiting to be scheduled."),
            (VLLM.kv_usage[0], "kv_cache_usage_perc", "Fraction of KV-cache blocks in use (1 = 100 %)."),
        ):
            g = GaugeMetricFamily(name, doc, labels=ENGINE_LABELS)
            g.add_metric(base, float(getattr(s, attr)))
            yield g

        # The simulated engine waits only for capacity; nothing is deferred (no LoRA, no KV connector).
        g = GaugeMetricFamily("vllm:num_requests_waiting_by_reason", "Waiting requests by cause.",
                              labels=(*ENGINE_LABELS, "reason"))
        g.add_metric([*base, "capacity"], float(s.num_requests_waiting))
        g.add_metric([*base, "deferred"], 0.0)
        yield g

        for name, attr, doc in _VLLM_COUNTERS:
            c = CounterMetricFamily(name, doc, labels=ENGINE_LABELS)
            c.add_metric(base, float(getattr(s, attr)), created=self.created_unix_s)
            yield c

        c = CounterMetricFamily("vllm:request_success", "Finished requests by finish reason.",
                                labels=(*ENGINE_LABELS, "finished_reason"))
        for reason, n in s.request_success.items():
            c.add_metric([*base, reason], float(n), created=self.created_unix_s)
        yield c

        for name, attr, doc in _VLLM_HISTOGRAMS:
            hist = getattr(s, attr, None)
            if hist is None:
                continue
            h = _histogram_family(name, doc, ENGINE_LABELS)
            _add_histogram(h, base, hist)
            yield h

        # Info-style gauge (always 1); vLLM renders the config values with Python's str().
        info_labels = ("block_size", "cache_dtype", "enable_prefix_caching", "gpu_memory_utilization",
                       "num_gpu_blocks", "engine")
        g = GaugeMetricFamily("vllm:cache_config_info", "Information of the KV-cache config.", labels=info_labels)
        g.add_metric([str(s.block_size), self.cache_dtype, str(bool(self.enable_prefix_caching)),
                      str(s.gpu_memory_utilization), str(s.num_gpu_blocks), ENGINE_INDEX], 1.0)
        yield g


# --------------------------------------------------------------------------- DCGM

# Board power (W) at idle and at full load, per SKU: A100-80GB SXM has a 400 W TDP and
# H100 SXM 700 W; idle draw is roughly 15 % of TDP on both. Power is modelled as
# idle + utilisation × (TDP − idle): an H100 at 50 % draws 100 + 0.5 × 600 = 400 W.
_POWER_W: dict[str, tuple[float, float]] = {"a100-80gb": (60.0, 400.0), "h100-80gb": (100.0, 700.0)}
_DEFAULT_POWER_W = (60.0, 400.0)
DCGM_DRIVER_VERSION = "550.54.15"  # a plausible datacenter driver; DCGM attaches it as a label
K8S_NAMESPACE = "governor-sim"
K8S_CONTAINER = "vllm"

_K8S_LABELS = ("pod", "namespace", "container")
DCGM_LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION",
               "pod", "namespace", "container")


def gpu_uuid(node_id: str, gpu: int) -> str:
    """A stable GPU UUID (same node and index → same UUID), shaped like NVIDIA's GPU-xxxxxxxx-xxxx-…"""
    h = hashlib.sha1(f"{node_id}/{gpu}".encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


class NodeCollector:
    """One node's DCGM exporter /metrics, per GPU index.

    `replicas_on_node` (a sequence, or a callable returning one, re-read at every
    collect) names the replica owning each GPU, which becomes the `pod` label
    (empty, hence absent in Prometheus, for an idle GPU). `now_s` returns the
    current (simulated) time: GPU utilisation is Δbusy / Δt since the previous
    collect, e.g. 7.5 busy seconds over a 10 s interval → 75 %.
    """

    def __init__(self, stats: NodeStats,
                 replicas_on_node: Sequence[ReplicaStats] | Callable[[], Iterable[ReplicaStats]] = (),
                 *, now_s: Callable[[], float], namespace: str = K8S_NAMESPACE) -> None:
        self.stats = stats
        self._replicas = replicas_on_node
        self._now_s = now_s
        self.namespace = namespace
        self._lock = threading.Lock()  # two scrapers may collect at once
        t0 = float(now_s())
        self._prev: list[tuple[float, float]] = [(t0, float(b)) for b in stats.gpu_busy_s]
        self._util_frac: list[float] = [0.0] * stats.gpus

    def _owners(self) -> dict[int, str]:
        replicas = self._replicas() if callable(self._replicas) else self._replicas
        owners: dict[int, str] = {}
        for r in replicas:
            if r.node_id == self.stats.node_id:
                for g in r.gpu_indices:
                    owners[g] = r.replica_id
        return owners

    def _utilisation(self) -> list[float]:
        t = float(self._now_s())
        with self._lock:
            busy = self.stats.gpu_busy_s
            while len(self._prev) < len(busy):  # a node grown after construction
                self._prev.append((t, float(busy[len(self._prev)])))
                self._util_frac.append(0.0)
            for g, b in enumerate(busy):
                t_prev, b_prev = self._prev[g]
                if t > t_prev:  # same instant (two scrapes in one step): keep the last value
                    self._util_frac[g] = min(1.0, max(0.0, (float(b) - b_prev) / (t - t_prev)))
                    self._prev[g] = (t, float(b))
            return list(self._util_frac[: len(busy)])

    def collect(self) -> Iterable[Metric]:
        s = self.stats
        owners = self._owners()
        util = self._utilisation()
        idle_w, max_w = _POWER_W.get(s.sku, _DEFAULT_POWER_W)
        rows = []
        for g in range(len(s.gpu_busy_s)):
            pod = owners.get(g, "")
            labels = [str(g), gpu_uuid(s.node_id, g), f"00000000:{0x18 + 0x10 * g:02X}:00.0", f"nvidia{g}",
                      s.model_name_label, s.node_id, DCGM_DRIVER_VERSION,
                      pod, self.namespace if pod else "", K8S_CONTAINER if pod else ""]
            used = max(0.0, min(float(s.fb_used_mib[g]), float(s.fb_total_mib)))
            rows.append((labels, util[g], used, float(s.fb_total_mib) - used))

        specs: tuple[tuple[str, str, Callable[[tuple], float]], ...] = (
            (DCGM.gpu_util, "GPU utilization (in %).", lambda r: round(100.0 * r[1])),
            (DCGM.engine_active, "Ratio of time the graphics engine is active.", lambda r: r[1]),
            (DCGM.fb_used, "Framebuffer memory used (in MiB).", lambda r: round(r[2])),
            (DCGM.fb_free, "Framebuffer memory free (in MiB).", lambda r: round(r[3])),
            ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", lambda r: idle_w + r[1] * (max_w - idle_w)),
        )
        for name, doc, value in specs:
            fam = GaugeMetricFamily(name, doc, labels=DCGM_LABELS)
            for r in rows:
                # like dcgm-exporter, an idle GPU has no pod/namespace/container labels at all
                shown = {k: v for k, v in zip(DCGM_LABELS, r[0], strict=True) if v or k not in _K8S_LABELS}
                fam.samples.append(Sample(name, shown, float(value(r))))
            yield fam


# --------------------------------------------------------------------------- llm-d router (EPP)

REQUEST_LABELS = ("model_name", "target_model_name", "priority", "workflow_step")


class RouterCollector:
    """The llm-d router's /metrics (EPP names, docs/TELEMETRY.md §5.2).

    Request metrics carry `model_name`, `target_model_name`, `priority` and an
    extra `workflow_step` label (the step index within its task). Pool gauges
    carry the pool as `name`. `llm_d_epp_average_queue_size{name}` is the number
    of requests the router holds for the pool (the simulated router queues
    centrally), and `llm_d_epp_flow_control_queue_size{priority}` the same
    requests counted per priority class, as the EPP's flow-control layer
    exports its queue (what Governor's telemetry reads as a class's queue depth).
    Governor extensions, not exported by a real EPP:
    `llm_d_epp_governor_shed_total` (rejected with 429/503 by admission or the
    queue budget), `llm_d_epp_governor_admitted_total` and
    `llm_d_epp_governor_retries_total` (client retries), per priority and step.
    """

    def __init__(self, stats: RouterStats, *, created_unix_s: float | None = None) -> None:
        self.stats = stats
        self.created_unix_s = created_unix_s

    def _cells(self) -> list[tuple[list[str], ClassStepStats]]:
        m = self.stats.model_name
        return [([m, m, priority, str(step)], cell) for (priority, step), cell in sorted(self.stats.cells.items())]

    def collect(self) -> Iterable[Metric]:
        cells = self._cells()
        created = self.created_unix_s

        for name, attr, doc in (
            (ROUTER.requests[0], "arrivals", "Requests received by the router."),
            (ROUTER.admitted[0], "admitted", "Governor extension: requests admitted."),
            (ROUTER.shed[0], "shed", "Governor extension: requests shed (429 or 503)."),
            (ROUTER.retries[0], "retries", "Governor extension: client retries received."),
        ):
            c = CounterMetricFamily(name, doc, labels=REQUEST_LABELS)
            for labels, cell in cells:
                c.add_metric(labels, float(getattr(cell, attr)), created=created)
            yield c

        c = CounterMetricFamily(ROUTER.errors[0], "Requests that ended in an error, by code.",
                                labels=(*REQUEST_LABELS, "error_code"))
        for labels, cell in cells:
            for code, n in sorted(cell.errors.items()):
                c.add_metric([*labels, str(code)], float(n), created=created)
        yield c

        h = _histogram_family("llm_d_epp_request_duration_seconds", "End-to-end request latency.", REQUEST_LABELS)
        for labels, cell in cells:
            _add_histogram(h, labels, cell.e2e_s)
        yield h
        h = _histogram_family(ROUTER.ttft[0], "Time to first token seen by the router.",
                              (*REQUEST_LABELS, "streaming"))
        for labels, cell in cells:
            _add_histogram(h, [*labels, "true"], cell.ttft_s)
        yield h
        h = _histogram_family(ROUTER.tpot[0],
                              "Mean time per output token after the first, per streamed request.", REQUEST_LABELS)
        for labels, cell in cells:
            _add_histogram(h, labels, cell.tpot_s)
        yield h
        h = _histogram_family("llm_d_epp_flow_control_request_queue_duration_seconds",
                              "Seconds a request was held in the router's queue before dispatch.", REQUEST_LABELS)
        for labels, cell in cells:
            _add_histogram(h, labels, cell.queue_time_s)
        yield h

        g = GaugeMetricFamily(ROUTER.queue[0], "Requests held in the router's flow-control "
                              "queue, per priority.", labels=("priority",))
        for priority, n in sorted(self.stats.queue_by_priority.items()):
            g.add_metric([priority], float(n))
        yield g
        m = self.stats.model_name
        g = GaugeMetricFamily("llm_d_epp_average_queue_size", "Requests held at the router for the pool.",
                              labels=("name",))
        for pool, n in sorted(self.stats.queue_size.items()):
            g.add_metric([pool], float(n))
        yield g
        g = GaugeMetricFamily("llm_d_epp_ready_endpoints", "Ready endpoints in the pool.", labels=("name",))
        for pool, n in sorted(self.stats.ready_endpoints.items()):
            g.add_metric([pool], float(n))
        yield g
        g = GaugeMetricFamily("llm_d_epp_request_running", "Requests in flight on the pool's endpoints.",
                              labels=("model_name", "name"))
        for pool, n in sorted(self.stats.running.items()):
            g.add_metric([m, pool], float(n))
        yield g

