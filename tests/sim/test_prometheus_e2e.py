"""End to end: `governor sim` as a subprocess, scraped by a real Prometheus through HTTP SD.

The PromQL of docs/TELEMETRY.md §9 must return sane values from the simulated fleet.
"""

from __future__ import annotations

import json
import math
import queue
import signal
import subprocess
import sys
import threading

import pytest

from controller.paths import PROJECT_ROOT
from tests.fakes.live_scenario import write_scenario

pytestmark = pytest.mark.e2e

# name → (PromQL, allowed [lo, hi]); every series must be finite and within range
QUERIES = {
    "p95 ttft per model": (
        "histogram_quantile(0.95, sum by (le, model_name) (rate(vllm:time_to_first_token_seconds_bucket[1m])))",
        (0.0, 2560.0)),
    "mean itl": ("sum(rate(vllm:inter_token_latency_seconds_sum[1m])) / "
                 "sum(rate(vllm:inter_token_latency_seconds_count[1m]))", (0.0, 80.0)),
    "queue depth per pod": ("sum by (model_name, pod) (vllm:num_requests_waiting)", (0.0, 1e6)),
    "kv pressure per pod": ("max by (pod) (vllm:kv_cache_usage_perc)", (0.0, 1.0)),
    "prefix hit ratio": ("sum(rate(vllm:prefix_cache_hits_total[5m])) / sum(rate(vllm:prefix_cache_queries_total[5m]))",
                         (1e-9, 1.0)),  # > 0: the trace shares prefixes
    "throughput": ("sum by (model_name) (rate(vllm:generation_tokens_total[1m]))", (1e-9, 1e7)),
    "preemptions": ("sum(rate(vllm:num_preemptions_total[5m]))", (0.0, 1e6)),
    "fb fraction": ("DCGM_FI_DEV_FB_USED / (DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE)", (0.0, 1.0)),
    "gpu util": ("DCGM_FI_DEV_GPU_UTIL", (0.0, 100.0)),
    "router arrivals": ("sum(rate(llm_d_epp_request_total[1m]))", (1e-9, 1e6)),
}


def _read_lines(proc: subprocess.Popen, out: queue.Queue) -> None:
    assert proc.stdout is not None  # started with stdout=PIPE
    for line in proc.stdout:
        out.put(line)
    out.put(None)


def test_prometheus_reads_the_simulated_fleet(tmp_path, prometheus_factory):
    scenario = write_scenario(tmp_path, n=3000, rps=10.0, replicas=2, name="e2e")
    proc = subprocess.Popen([sys.executable, "-m", "controller", "sim", str(scenario), "--speed", "10", "--for", "50",
                             "--seed", "5"], cwd=PROJECT_ROOT, stdout=subprocess.PIPE,
                            stderr=(tmp_path / "sim.log").open("w"), text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_read_lines, args=(proc, lines), daemon=True).start()
    try:
        first = lines.get(timeout=30)
        assert first, f"governor sim printed nothing; see {tmp_path / 'sim.log'}"
        listening = json.loads(first)
        assert listening["event"] == "listening" and len(listening["replicas"]) == 2
        assert list(listening) == ["event", "replicas", "nodes", "router_metrics", "router_control",
                                   "autoscaler_control", "discovery"]

        prom = prometheus_factory(http_sd_url=listening["discovery"])
        prom.wait_for('count(up{job="sim"} == 1) >= 4', deadline_s=20)  # 2 replicas + node(s) + router
        labels = {(r["metric"]["kind"], r["metric"].get("pool", "")) for r in prom.query('up{job="sim"}')}
        assert {("vllm", "small"), ("router", "")} <= labels and any(k == "dcgm" for k, _ in labels)

        for name, (promql, (lo, hi)) in QUERIES.items():
            res = prom.wait_for(promql, deadline_s=25)
            values = [float(r["value"][1]) for r in res]
            assert values and all(math.isfinite(v) and lo <= v <= hi for v in values), (name, values)
        pods = {r["metric"].get("pod") for r in prom.query("sum by (model_name, pod) (vllm:num_requests_waiting)")}
        assert len(pods) == 2 and None not in pods
        fb = prom.query("max(DCGM_FI_DEV_FB_USED / (DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE))")
        assert float(fb[0]["value"][1]) > 0.5  # GPUs hosting a replica hold weights and KV cache

        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0
        rest = []
        while (line := lines.get(timeout=5)) is not None:
            rest.append(line)
        summary = json.loads(rest[-1])
        assert summary["event"] == "summary" and summary["requests"] > 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
