"""Canned /metrics text for vLLM V1, DCGM and the llm-d router, and a loopback HTTP server for it.

The text is written here by hand (not with the simulator's collectors) using the
exact names, labels and bucket bounds of docs/TELEMETRY.md, so the telemetry
tests check our readers against the real exporters' format, not against our own
exposition code. Histogram state is kept as per-bucket counts and rendered
cumulatively, as the exporters do.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client.parser import text_string_to_metric_families

# docs/TELEMETRY.md §1.2
TTFT_BOUNDS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BOUNDS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0)
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def _go(x: float) -> str:
    """Bounds as Go/Python exporters print them: 1 → 1.0, 2560 → 2560.0."""
    return repr(float(x))


@dataclass
class Hist:
    """Per-bucket (non-cumulative) counts; the last entry is the +Inf bucket."""

    bounds: tuple[float, ...]
    counts: list[float] = field(default_factory=list)
    total_sum: float = 0.0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0.0] * (len(self.bounds) + 1)

    def add(self, upper_bound: float, n: float, mean_value: float | None = None) -> None:
        """Add n observations to the bucket whose upper bound is `upper_bound` (inf = the +Inf bucket)."""
        i = len(self.bounds) if upper_bound == float("inf") else self.bounds.index(upper_bound)
        self.counts[i] += n
        self.total_sum += n * (mean_value if mean_value is not None else upper_bound)

    def render(self, name: str, labels: str) -> list[str]:
        out, running = [], 0.0
        for b, c in zip(self.bounds, self.counts[:-1], strict=True):  # the last count is +Inf, below
            running += c
            out.append(f'{name}_bucket{{{labels},le="{_go(b)}"}} {running}')
        running += self.counts[-1]
        out.append(f'{name}_bucket{{{labels},le="+Inf"}} {running}')
        out.append(f"{name}_sum{{{labels}}} {self.total_sum}")
        out.append(f"{name}_count{{{labels}}} {running}")
        return out

    @property
    def count(self) -> float:
        return sum(self.counts)


@dataclass
class VllmState:
    """What one vLLM V1 server's /metrics shows (counters cumulative)."""

    running: float = 0.0
    waiting: float = 0.0
    kv_usage: float = 0.0
    prefix_queries: float = 0.0
    prefix_hits: float = 0.0
    preemptions: float = 0.0
    prompt_tokens: float = 0.0
    generation_tokens: float = 0.0
    ttft: Hist = field(default_factory=lambda: Hist(TTFT_BOUNDS_S))
    itl: Hist = field(default_factory=lambda: Hist(ITL_BOUNDS_S))
    req_tpot: Hist = field(default_factory=lambda: Hist(ITL_BOUNDS_S))  # one mean TPOT per finished request
    names: str = "current"  # current | old (pre-0.9 names only) | both (a 0.9-0.10 build exporting both)
    timestamp_ms: int | None = None  # explicit sample timestamps (makes Prometheus see old samples)


def vllm_text(s: VllmState, engine: str = "0") -> str:
    lab = f'engine="{engine}",model_name="{MODEL}"'
    ts = f" {s.timestamp_ms}" if s.timestamp_ms is not None else ""
    cur, old = s.names in ("current", "both"), s.names in ("old", "both")
    lines: list[str] = []

    def gauge(name: str, value: float, doc: str) -> None:
        lines.extend([f"# HELP {name} {doc}", f"# TYPE {name} gauge", f"{name}{{{lab}}} {value}{ts}"])

    def counter(name: str, value: float, doc: str) -> None:
        lines.extend([f"# HELP {name}_total {doc}", f"# TYPE {name}_total counter",
                      f"{name}_total{{{lab}}} {value}{ts}",
                      f"# HELP {name}_created {doc}", f"# TYPE {name}_created gauge",
                      f"{name}_created{{{lab}}} 1.7e+09{ts}"])

    def hist(name: str, h: Hist, doc: str) -> None:
        lines.extend([f"# HELP {name} {doc}", f"# TYPE {name} histogram"])
        lines.extend(line + ts for line in h.render(name, lab))

    gauge("vllm:num_requests_running", s.running, "Number of requests in model execution batches.")
    gauge("vllm:num_requests_waiting", s.waiting, "Number of requests waiting to be processed.")
    if cur:
        gauge("vllm:kv_cache_usage_perc", s.kv_usage, "KV-cache usage. 1 means 100 percent usage.")
        counter("vllm:prefix_cache_queries", s.prefix_queries,
                "Prefix cache queries, in terms of number of queried tokens.")
        counter("vllm:prefix_cache_hits", s.prefix_hits, "Prefix cache hits, in terms of number of cached tokens.")
    if old:
        gauge("vllm:gpu_cache_usage_perc", s.kv_usage, "GPU KV-cache usage. 1 means 100 percent usage.")
        counter("vllm:gpu_prefix_cache_queries", s.prefix_queries, "GPU prefix cache queries.")
        counter("vllm:gpu_prefix_cache_hits", s.prefix_hits, "GPU prefix cache hits.")
    counter("vllm:num_preemptions", s.preemptions, "Cumulative number of preemption from the engine.")
    counter("vllm:prompt_tokens", s.prompt_tokens, "Number of prefill tokens processed.")
    counter("vllm:generation_tokens", s.generation_tokens, "Number of generation tokens processed.")
    lines.extend(["# HELP vllm:request_success_total Count of successfully processed requests.",
                  "# TYPE vllm:request_success_total counter"])
    for reason in ("stop", "length", "abort", "error", "repetition"):
        lines.append(f'vllm:request_success_total{{{lab},finished_reason="{reason}"}} 0.0{ts}')
    hist("vllm:time_to_first_token_seconds", s.ttft, "Histogram of time to first token in seconds.")
    if cur:
        hist("vllm:inter_token_latency_seconds", s.itl, "Histogram of inter-token latency in seconds.")
        hist("vllm:request_time_per_output_token_seconds", s.req_tpot,
             "Histogram of time_per_output_token_seconds per request.")
    if old:
        hist("vllm:time_per_output_token_seconds", s.itl, "Histogram of time per output token in seconds.")
    lines.extend(["# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
                  "# TYPE vllm:cache_config_info gauge",
                  f'vllm:cache_config_info{{block_size="16",cache_dtype="auto",enable_prefix_caching="True",'
                  f'engine="{engine}",gpu_memory_utilization="0.9",num_gpu_blocks="27000"}} 1.0{ts}'])
    return "\n".join(lines) + "\n"


@dataclass
class Gpu:
    util_pct: float  # DCGM_FI_DEV_GPU_UTIL, 0..100
    active: float | None = None  # DCGM_FI_PROF_GR_ENGINE_ACTIVE, 0..1 (None: profiling metrics off)
    pod: str = ""  # Kubernetes mapping: the pod using this GPU ("" = idle / mapping off)


def dcgm_text(host: str, gpus: Sequence[Gpu], host_label: str = "Hostname") -> str:
    """A DCGM exporter page for one node (`host_label`: "Hostname" in releases, "hostname" on main)."""
    lines: list[str] = []
    for name, doc, value in (
        ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", lambda g: g.util_pct),
        ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", lambda g: 70000.0),
        ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "Ratio of time the graphics engine is active.", lambda g: g.active),
    ):
        rows = [(i, g) for i, g in enumerate(gpus) if value(g) is not None]
        if not rows:
            continue
        lines.extend([f"# HELP {name} {doc}", f"# TYPE {name} gauge"])
        for i, g in rows:
            pod = f',pod="{g.pod}",namespace="inference",container="vllm"' if g.pod else ""
            lines.append(f'{name}{{gpu="{i}",UUID="GPU-{host}-{i:04d}",pci_bus_id="00000000:{0x18 + i:02X}:00.0",'
                         f'device="nvidia{i}",modelName="NVIDIA H100 80GB HBM3",{host_label}="{host}",'
                         f'DCGM_FI_DRIVER_VERSION="550.54.15"{pod}}} {value(g)}')
    return "\n".join(lines) + "\n"


@dataclass
class ClassState:
    arrivals: float = 0.0
    shed: float = 0.0  # Governor extension counter
    retries: float = 0.0
    errors_429: float = 0.0
    ttft: Hist = field(default_factory=lambda: Hist(TTFT_BOUNDS_S))


def router_text(classes: Mapping[str, ClassState], governor_extensions: bool = True) -> str:
    """The llm-d EPP's request metrics (docs/TELEMETRY.md §5.2), labelled by priority."""
    lines: list[str] = []

    def lab(c: str) -> str:
        return f'model_name="{MODEL}",priority="{c}",target_model_name="{MODEL}"'

    lines += ["# HELP llm_d_epp_request_total Counter of inference model requests broken out for each model and "
              "target model.", "# TYPE llm_d_epp_request_total counter"]
    lines += [f"llm_d_epp_request_total{{{lab(c)}}} {s.arrivals}" for c, s in classes.items()]
    lines += ["# HELP llm_d_epp_request_error_total Counter of inference model requests errors.",
              "# TYPE llm_d_epp_request_error_total counter"]
    lines += [f'llm_d_epp_request_error_total{{{lab(c)},error_code="429"}} {s.errors_429}' for c, s in classes.items()]
    if governor_extensions:
        for name, attr in (("llm_d_epp_governor_shed_total", "shed"), ("llm_d_epp_governor_retries_total", "retries")):
            lines += [f"# TYPE {name} counter"]
            lines += [f"{name}{{{lab(c)}}} {getattr(s, attr)}" for c, s in classes.items()]
    lines += ["# HELP llm_d_epp_request_ttft_seconds Time to first token.",
              "# TYPE llm_d_epp_request_ttft_seconds histogram"]
    for c, s in classes.items():
        lines += s.ttft.render("llm_d_epp_request_ttft_seconds", lab(c) + ',streaming="true"')
    return "\n".join(lines) + "\n"


def families(text: str) -> list:
    """Parse exposition text the way ScrapeSource does."""
    return list(text_string_to_metric_families(text))


class CannedServer:
    """A real HTTP server on a free loopback port; each path serves what its callable returns.

    A route returning None answers 500; `hold` blocks a path until the server
    stops (a target that never answers, to exercise timeouts without sleeping).
    """

    def __init__(self, routes: Mapping[str, Callable[[], str | None]] | None = None) -> None:
        self.routes: dict[str, Callable[[], str | None]] = dict(routes or {})
        self.hold: set[str] = set()
        self.hits: dict[str, int] = {}
        self._released = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.hits[self.path] = server.hits.get(self.path, 0) + 1
                if self.path in server.hold:
                    server._released.wait(30)
                    return
                route = server.routes.get(self.path)
                body = route() if route is not None else None
                if body is None:
                    self.send_error(404 if route is None else 500)
                    return
                data = body.encode()
                ctype = "application/json" if body.lstrip().startswith("[") else "text/plain; version=0.0.4"
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, fmt: str, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.address = f"127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def url(self, path: str) -> str:
        return f"http://{self.address}{path}"

    def stop(self) -> None:
        self._released.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def sd_json(groups: Sequence[tuple[Sequence[str], Mapping[str, str]]]) -> str:
    return json.dumps([{"targets": list(t), "labels": dict(labels)} for t, labels in groups])


class LinearFleet:
    """Canned endpoints (one loopback server each, at /metrics) whose counters grow linearly with wall time.

    Pool a: a1 (current vLLM names) and a2 (pre-0.9 names) and a DCGM node. Per second, a1 processes 100
    prompt tokens and 100 prefix-cache query tokens of which 30 hit; TTFT: 1 in (0.1, 0.25], 6 in
    (0.25, 0.5], 3 in (0.5, 0.75]; ITL: 10 in (0.025, 0.05]. a2: 50 query tokens per second, no hits.
    Pool b: one replica whose samples carry a timestamp 120 s in the past (Prometheus keeps them: stale).
    Router: critical 2 requests/s; standard 5/s with 1/s shed.
    """

    def __init__(self) -> None:
        self.t0 = time.time()
        self.old_ms = int((self.t0 - 120) * 1000)
        self.servers = {name: CannedServer({"/metrics": fn}) for name, fn in
                        (("a1", self.a1), ("a2", self.a2), ("b1", self.b1), ("gpu", self.gpu), ("router", self.router))}

    def e(self) -> float:
        return time.time() - self.t0

    def a1(self) -> str:
        e = self.e()
        s = VllmState(running=4, waiting=1, kv_usage=0.7, prompt_tokens=100 * e, prefix_queries=100 * e,
                      prefix_hits=30 * e)
        s.ttft.counts[s.ttft.bounds.index(0.25)] = 1 * e
        s.ttft.counts[s.ttft.bounds.index(0.5)] = 6 * e
        s.ttft.counts[s.ttft.bounds.index(0.75)] = 3 * e
        s.itl.counts[s.itl.bounds.index(0.05)] = 10 * e
        return vllm_text(s)

    def a2(self) -> str:
        return vllm_text(VllmState(running=2, kv_usage=0.3, prefix_queries=50 * self.e(), names="old"))

    def b1(self) -> str:
        return vllm_text(VllmState(running=9, waiting=3, timestamp_ms=self.old_ms))

    def gpu(self) -> str:
        return dcgm_text("node-a", [Gpu(90, 0.8, "a1"), Gpu(50, 0.4, "a2"), Gpu(0), Gpu(0)])

    def router(self) -> str:
        e = self.e()
        return router_text({"critical": ClassState(arrivals=2 * e), "standard": ClassState(arrivals=5 * e, shed=e)})

    def static_targets(self) -> dict[str, list[str]]:
        a = {k: s.address for k, s in self.servers.items()}
        return {"a": [a["a1"], a["a2"], a["gpu"]], "b": [a["b1"]], "router": [a["router"]]}

    def stop(self) -> None:
        for s in self.servers.values():
            s.stop()
