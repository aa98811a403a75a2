"""The simulator's /metrics text: vLLM, DCGM and llm-d router names, types, labels and buckets.

Everything is rendered with prometheus_client's `generate_latest` on a private
registry and parsed back with its text parser, exactly as a scraper would.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from controller.sim.exposition import NodeCollector, ReplicaCollector, RouterCollector, collect_families, gpu_uuid
from controller.sim.stats import (
    ITERATION_TOKENS_BUCKETS,
    ITL_BUCKETS_S,
    REQUEST_LATENCY_BUCKETS_S,
    TTFT_BUCKETS_S,
    NodeStats,
    ReplicaStats,
    RouterStats,
    token_buckets,
)


def render(collector) -> tuple[dict[str, Metric], str]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    text = generate_latest(registry).decode()
    return {f.name: f for f in text_string_to_metric_families(text)}, text


def replica(**kw) -> ReplicaStats:
    base: dict[str, Any] = dict(replica_id="small-r0", pool="small", model_name="meta-llama/Meta-Llama-3-8B",
                                node_id="small-n0", gpu_indices=(2,), num_gpu_blocks=28000, block_size=16,
                                gpu_memory_utilization=0.9, max_model_len=8192)
    base.update(kw)
    return ReplicaStats(**base)


# family name as parsed (counters lose `_total`) → (type, extra labels beyond model_name/engine, buckets or None)
VLLM_TABLE = {
    "vllm:num_requests_running": ("gauge", set(), None),
    "vllm:num_requests_waiting": ("gauge", set(), None),
    "vllm:num_requests_waiting_by_reason": ("gauge", {"reason"}, None),
    "vllm:kv_cache_usage_perc": ("gauge", set(), None),
    "vllm:prefix_cache_queries": ("counter", set(), None),
    "vllm:prefix_cache_hits": ("counter", set(), None),
    "vllm:num_preemptions": ("counter", set(), None),
    "vllm:prompt_tokens": ("counter", set(), None),
    "vllm:generation_tokens": ("counter", set(), None),
    "vllm:request_success": ("counter", {"finished_reason"}, None),
    "vllm:time_to_first_token_seconds": ("histogram", set(), TTFT_BUCKETS_S),
    "vllm:inter_token_latency_seconds": ("histogram", set(), ITL_BUCKETS_S),
    "vllm:request_time_per_output_token_seconds": ("histogram", set(), ITL_BUCKETS_S),
    "vllm:e2e_request_latency_seconds": ("histogram", set(), REQUEST_LATENCY_BUCKETS_S),
    "vllm:request_queue_time_seconds": ("histogram", set(), REQUEST_LATENCY_BUCKETS_S),
    "vllm:request_prefill_time_seconds": ("histogram", set(), REQUEST_LATENCY_BUCKETS_S),
    "vllm:request_decode_time_seconds": ("histogram", set(), REQUEST_LATENCY_BUCKETS_S),
    "vllm:request_inference_time_seconds": ("histogram", set(), REQUEST_LATENCY_BUCKETS_S),
    "vllm:request_prompt_tokens": ("histogram", set(), token_buckets(8192)),
    "vllm:request_generation_tokens": ("histogram", set(), token_buckets(8192)),
    "vllm:iteration_tokens_total": ("histogram", set(), ITERATION_TOKENS_BUCKETS),
    "vllm:cache_config_info": ("gauge", {"block_size", "num_gpu_blocks", "gpu_memory_utilization",
                                         "enable_prefix_caching", "cache_dtype"}, None),
}

DEPRECATED = ("vllm:gpu_cache_usage_perc", "vllm:gpu_prefix_cache_queries", "vllm:gpu_prefix_cache_hits",
              "vllm:time_per_output_token_seconds", "vllm:num_requests_swapped", "vllm:cpu_cache_usage_perc",
              "vllm:avg_prompt_throughput_toks_per_s", "vllm:avg_generation_throughput_toks_per_s",
              "vllm:time_in_queue_requests")


def bucket_bounds(family) -> list[float]:
    first = next(iter(family.samples)).labels
    key = {k: v for k, v in first.items() if k != "le"}
    les = [s.labels["le"] for s in family.samples
           if s.name.endswith("_bucket") and {k: v for k, v in s.labels.items() if k != "le"} == key]
    assert les[-1] == "+Inf"
    return [float(x) for x in les[:-1]]


def test_vllm_names_types_labels_buckets():
    fams, text = render(ReplicaCollector(replica()))
    assert set(VLLM_TABLE) <= set(fams), sorted(set(VLLM_TABLE) - set(fams))
    for name, (typ, extra, buckets) in VLLM_TABLE.items():
        fam = fams[name]
        assert fam.type == typ, name
        for s in fam.samples:
            if name == "vllm:cache_config_info":
                assert extra | {"engine"} <= set(s.labels), name
                continue
            assert s.labels["model_name"] == "meta-llama/Meta-Llama-3-8B" and s.labels["engine"] == "0", name
            assert set(s.labels) - {"model_name", "engine", "le"} == extra, (name, s.labels)
        if buckets is not None:
            assert bucket_bounds(fam) == [float(b) for b in buckets], name
    for old in DEPRECATED:
        assert old not in text
    assert "vllm:iteration_tokens_total_bucket" in text  # a histogram named …_total, as vLLM has it
    assert 'le="1.0"' in text  # bounds printed the Go way, like the real exporter


def test_vllm_values_track_the_stats():
    s = replica()
    collector = ReplicaCollector(s, enable_prefix_caching=False)
    s.num_requests_running, s.num_requests_waiting, s.kv_cache_usage_perc = 7, 3, 0.42
    s.prefix_cache_queries, s.prefix_cache_hits = 1000.0, 250.0
    s.prompt_tokens, s.generation_tokens, s.num_preemptions = 5000.0, 800.0, 2.0
    s.request_success["stop"] = 4.0
    s.request_success["length"] = 1.0
    for v in (0.03, 0.3, 0.3, 3.0):
        s.ttft_s.observe(v)
    s.itl_s.observe(0.02, n=10)
    fams, _ = render(collector)

    def value(name, sample_name=None, **labels):
        for smp in fams[name].samples:
            if smp.name == (sample_name or name) and all(smp.labels.get(k) == v for k, v in labels.items()):
                return smp.value
        raise KeyError((name, labels))

    assert value("vllm:num_requests_running") == 7
    assert value("vllm:num_requests_waiting") == 3
    assert value("vllm:num_requests_waiting_by_reason", reason="capacity") == 3
    assert value("vllm:kv_cache_usage_perc") == pytest.approx(0.42)
    assert value("vllm:prefix_cache_hits", "vllm:prefix_cache_hits_total") == 250
    assert value("vllm:prefix_cache_queries", "vllm:prefix_cache_queries_total") == 1000
    assert value("vllm:request_success", "vllm:request_success_total", finished_reason="stop") == 4
    assert value("vllm:request_success", "vllm:request_success_total", finished_reason="length") == 1
    ttft = "vllm:time_to_first_token_seconds"
    assert value(ttft, ttft + "_count") == 4
    assert value(ttft, ttft + "_sum") == pytest.approx(3.63)
    assert value(ttft, ttft + "_bucket", le="0.04") == 1
    assert value(ttft, ttft + "_bucket", le="0.5") == 3
    assert value(ttft, ttft + "_bucket", le="+Inf") == 4
    itl = "vllm:inter_token_latency_seconds"
    assert value(itl, itl + "_bucket", le="0.025") == 10
    info = fams["vllm:cache_config_info"].samples[0]
    assert info.value == 1
    assert info.labels == {"block_size": "16", "num_gpu_blocks": "28000", "gpu_memory_utilization": "0.9",
                               "enable_prefix_caching": "False", "cache_dtype": "auto", "engine": "0"}

    s.num_requests_running = 2  # the same collector re-reads the live stats
    s.prefix_cache_hits = 300.0
    fams, _ = render(collector)
    assert value("vllm:num_requests_running") == 2
    assert value("vllm:prefix_cache_hits", "vllm:prefix_cache_hits_total") == 300


def test_prefill_kv_computed_tokens_rendered_when_the_stats_carry_it():
    from controller.metrics.histogram import Histogram

    s = replica()
    fams, _ = render(ReplicaCollector(s))
    has_it = getattr(s, "request_prefill_kv_computed_tokens", None) is not None
    assert ("vllm:request_prefill_kv_computed_tokens" in fams) == has_it
    hist = Histogram(token_buckets(s.max_model_len))
    hist.observe(300)
    # an optional stat: the exporter reads it by name, ReplicaStats does not declare it
    s.request_prefill_kv_computed_tokens = hist  # type: ignore[attr-defined]
    fams, _ = render(ReplicaCollector(s))
    fam = fams["vllm:request_prefill_kv_computed_tokens"]
    assert fam.type == "histogram" and bucket_bounds(fam) == [float(b) for b in token_buckets(8192)]


def test_created_series_when_asked():
    fams, text = render(ReplicaCollector(replica(), created_unix_s=1_700_000_000.0))
    assert "vllm:prompt_tokens_created" in fams
    assert fams["vllm:prompt_tokens_created"].samples[0].value == 1_700_000_000.0


# ----------------------------------------------------------------------------- DCGM

DCGM_TABLE = {
    "DCGM_FI_DEV_GPU_UTIL": "gauge",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "gauge",
    "DCGM_FI_DEV_FB_USED": "gauge",
    "DCGM_FI_DEV_FB_FREE": "gauge",
    "DCGM_FI_DEV_POWER_USAGE": "gauge",
}
DCGM_LABELS = {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION"}


class SimTime:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def node() -> NodeStats:
    return NodeStats(node_id="big-n0", sku="h100-80gb", model_name_label="NVIDIA H100 80GB HBM3", gpus=8,
                     fb_total_mib=81559.0)


def test_dcgm_names_labels_and_pod_mapping():
    n = node()
    n.fb_used_mib = [70000.0] * 4 + [0.0] * 4
    owner = replica(replica_id="big-r0", pool="big", node_id="big-n0", gpu_indices=(0, 1, 2, 3))
    stranger = replica(replica_id="other-r0", node_id="other-n0", gpu_indices=(4,))
    fams, _ = render(NodeCollector(n, [owner, stranger], now_s=SimTime()))
    for name, typ in DCGM_TABLE.items():
        fam = fams[name]
        assert fam.type == typ
        assert len(fam.samples) == 8
        for smp in fam.samples:
            g = int(smp.labels["gpu"])
            assert set(smp.labels) >= DCGM_LABELS
            assert smp.labels["Hostname"] == "big-n0" and smp.labels["modelName"] == "NVIDIA H100 80GB HBM3"
            assert smp.labels["device"] == f"nvidia{g}" and smp.labels["UUID"] == gpu_uuid("big-n0", g)
            if g < 4:
                assert (smp.labels["pod"], smp.labels["namespace"], smp.labels["container"]) == \
                    ("big-r0", "governor-sim", "vllm")
            else:
                assert not {"pod", "namespace", "container"} & set(smp.labels)  # idle GPU: no pod labels
    uuids = {s.labels["UUID"] for s in fams["DCGM_FI_DEV_FB_USED"].samples}
    assert len(uuids) == 8
    used = {s.labels["gpu"]: s.value for s in fams["DCGM_FI_DEV_FB_USED"].samples}
    free = {s.labels["gpu"]: s.value for s in fams["DCGM_FI_DEV_FB_FREE"].samples}
    assert used["0"] == 70000 and free["0"] == 81559 - 70000 and used["7"] == 0 and free["7"] == 81559


def test_dcgm_utilisation_over_the_scrape_interval():
    n = node()
    clock = SimTime()
    collector = NodeCollector(n, (), now_s=clock)

    def util() -> dict[str, tuple[float, float, float]]:
        fams = {f.name: f for f in collect_families(collector)}
        gr = {s.labels["gpu"]: s.value for s in fams["DCGM_FI_PROF_GR_ENGINE_ACTIVE"].samples}
        power = {s.labels["gpu"]: s.value for s in fams["DCGM_FI_DEV_POWER_USAGE"].samples}
        return {s.labels["gpu"]: (s.value, gr[s.labels["gpu"]], power[s.labels["gpu"]])
                for s in fams["DCGM_FI_DEV_GPU_UTIL"].samples}

    # 10 s pass; GPU 0 busy 7.5 s (75 %), GPU 1 busy 10 s (100 %), others idle
    clock.t += 10.0
    n.gpu_busy_s[0] += 7.5
    n.gpu_busy_s[1] += 10.0
    u = util()
    assert u["0"][:2] == (75.0, pytest.approx(0.75))
    assert u["1"][:2] == (100.0, pytest.approx(1.0))
    assert u["2"][:2] == (0.0, 0.0)
    assert u["1"][2] == pytest.approx(700.0) and u["2"][2] == pytest.approx(100.0)  # H100: idle → TDP
    # a second scrape at the same instant keeps the value; the next interval is measured on its own
    assert util()["0"][0] == 75.0
    clock.t += 4.0
    n.gpu_busy_s[0] += 1.0
    assert util()["0"][0] == 25.0
    assert util()["1"][0] == 0.0  # GPU 1 was idle over those 4 s
    for pct, frac, watts in util().values():
        assert 0 <= pct <= 100 and 0 <= frac <= 1 and math.isfinite(watts)


# ----------------------------------------------------------------------------- router

ROUTER_TABLE = {
    # parsed family name → (type, labels beyond the request labels, or None for pool gauges)
    "llm_d_epp_request": ("counter", set()),
    "llm_d_epp_request_error": ("counter", {"error_code"}),
    "llm_d_epp_governor_shed": ("counter", set()),
    "llm_d_epp_governor_admitted": ("counter", set()),
    "llm_d_epp_governor_retries": ("counter", set()),
    "llm_d_epp_request_duration_seconds": ("histogram", set()),
    "llm_d_epp_request_ttft_seconds": ("histogram", {"streaming"}),
    "llm_d_epp_request_streaming_tpot_seconds": ("histogram", set()),
    "llm_d_epp_flow_control_request_queue_duration_seconds": ("histogram", set()),
}
REQUEST_LABELS = {"model_name", "target_model_name", "priority", "workflow_step"}


def test_router_names_labels_and_values():
    r = RouterStats(model_name="meta-llama/Meta-Llama-3-8B")
    c = r.cell("critical", 0)
    c.arrivals, c.admitted, c.retries = 10.0, 9.0, 1.0
    c.ttft_s.observe(0.3)
    c.e2e_s.observe(4.0)
    s = r.cell("sheddable", 2)
    s.arrivals, s.shed = 5.0, 3.0
    s.errors["429"] = 3.0
    r.queue_size["small"], r.ready_endpoints["small"], r.running["small"] = 4, 2, 11
    r.queue_by_priority = {"critical": 0, "standard": 3, "sheddable": 1}
    fams, text = render(RouterCollector(r))
    for name, (typ, extra) in ROUTER_TABLE.items():
        fam = fams[name]
        assert fam.type == typ, name
        assert fam.samples, name
        for smp in fam.samples:
            assert set(smp.labels) - {"le"} == REQUEST_LABELS | extra, (name, smp.labels)
    for name in ("llm_d_epp_average_queue_size", "llm_d_epp_ready_endpoints", "llm_d_epp_request_running"):
        assert fams[name].type == "gauge" and fams[name].samples[0].labels["name"] == "small"
    arrivals = {(smp.labels["priority"], smp.labels["workflow_step"]): smp.value
                for smp in fams["llm_d_epp_request"].samples if smp.name == "llm_d_epp_request_total"}
    assert arrivals == {("critical", "0"): 10.0, ("sheddable", "2"): 5.0}
    err = [smp for smp in fams["llm_d_epp_request_error"].samples if smp.name.endswith("_total")]
    assert [(e.labels["priority"], e.labels["error_code"], e.value) for e in err] == [("sheddable", "429", 3.0)]
    shed = {smp.labels["priority"]: smp.value for smp in fams["llm_d_epp_governor_shed"].samples
            if smp.name.endswith("_total")}
    assert shed == {"critical": 0.0, "sheddable": 3.0}
    assert fams["llm_d_epp_average_queue_size"].samples[0].value == 4
    # the same held requests per class, as the EPP's flow-control queue gauge (what the telemetry reads)
    fc = fams["llm_d_epp_flow_control_queue_size"]
    assert fc.type == "gauge"
    assert {smp.labels["priority"]: smp.value for smp in fc.samples} == {"critical": 0.0, "standard": 3.0,
                                                                         "sheddable": 1.0}
    assert fams["llm_d_epp_ready_endpoints"].samples[0].value == 2
    assert fams["llm_d_epp_request_running"].samples[0].value == 11
    assert bucket_bounds(fams["llm_d_epp_request_ttft_seconds"]) == [float(b) for b in TTFT_BUCKETS_S]
    assert 'target_model_name="meta-llama/Meta-Llama-3-8B"' in text


def test_collect_families_matches_the_http_text():
    s = replica()
    s.prompt_tokens = 12.0
    fams = collect_families(ReplicaCollector(s))
    parsed, _ = render(ReplicaCollector(s))
    assert [f.name for f in fams] == list(parsed)
    by_name = {f.name: f for f in fams}
    assert by_name["vllm:prompt_tokens"].samples[0].value == 12.0
