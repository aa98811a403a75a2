"""ScrapeSource against real HTTP servers on loopback serving canned vLLM / DCGM / router /metrics."""

from __future__ import annotations

import re
from typing import Any

import pytest

from controller.config import parse_settings
from controller.telemetry import build_source
from controller.telemetry.prometheus import PrometheusSource
from controller.telemetry.scrape import ScrapeSource, parse_discovery
from controller.telemetry.source import ScrapeTarget, TelemetrySource
from controller.types import SignalStatus
from tests.fixtures.prometheus import free_port
from tests.telemetry.canned import CannedServer, ClassState, Gpu, VllmState, dcgm_text, router_text, sd_json, vllm_text

OK, MISSING = SignalStatus.OK, SignalStatus.MISSING


@pytest.fixture
def server():
    s = CannedServer()
    yield s
    s.stop()


def _fleet(server: CannedServer) -> dict:
    """Two vLLM replicas and a DCGM exporter in pool a, a router; states the test mutates between reads."""
    st: dict[str, Any] = {
          "a1": VllmState(running=4, waiting=1, kv_usage=0.5, prompt_tokens=5000, prefix_queries=1000, prefix_hits=200),
          "a2": VllmState(running=2, kv_usage=0.3, names="old"),
          "router": {"critical": ClassState(arrivals=10)},
          "gpus": [Gpu(80, 0.5, "a1"), Gpu(40, None, "a2"), Gpu(0), Gpu(0)]}
    server.routes["/a1/metrics"] = lambda: vllm_text(st["a1"])
    server.routes["/a2/metrics"] = lambda: vllm_text(st["a2"])
    server.routes["/gpu/metrics"] = lambda: dcgm_text("node-a", st["gpus"])
    server.routes["/router/metrics"] = lambda: router_text(st["router"])
    return st


def _advance(st: dict) -> None:
    """30 s later: a1 +3000 prompt tokens (100/s), +3000 queries / +900 hits; 100 TTFT observations;
    critical +60 requests (2/s); gauges change."""
    a1 = st["a1"]
    a1.running, a1.waiting, a1.kv_usage = 6, 2, 0.7
    a1.prompt_tokens += 3000
    a1.prefix_queries += 3000
    a1.prefix_hits += 900
    a1.ttft.add(0.25, 10)
    a1.ttft.add(0.5, 60)
    a1.ttft.add(0.75, 30)
    st["router"]["critical"].arrivals += 60


def test_scrape_reads_canned_endpoints_and_refused_target_is_missing(server):
    st = _fleet(server)
    refused = f"http://127.0.0.1:{free_port()}/metrics"
    targets = [ScrapeTarget(server.url("/a1/metrics"), "a", "vllm"),
               ScrapeTarget(server.url("/a2/metrics"), "a", "vllm"),
               ScrapeTarget(server.url("/gpu/metrics"), "a", "dcgm"),
               ScrapeTarget(server.url("/router/metrics"), "", "router"),
               ScrapeTarget(refused, "b", "vllm")]
    src = ScrapeSource(["a", "b"], targets=targets, timeout_s=2.0, window_s=60, stale_after_s=60)
    try:
        assert isinstance(src, TelemetrySource)
        first = src.read(1000.0)
        assert first.pools["a"].running.value == 6 and first.pools["a"].prompt_tokens_rps.status is MISSING
        _advance(st)
        obs = src.read(1030.0)
    finally:
        src.close()
    a, b = obs.pools["a"], obs.pools["b"]
    assert (a.replicas_ready.value, a.running.value, a.waiting.value) == (2, 8, 2)
    assert a.kv_usage_frac.value == pytest.approx(0.5)  # (0.7 + 0.3) / 2, a2 with pre-0.9 names
    assert a.prompt_tokens_rps.value == pytest.approx(100.0)
    assert a.hit_rate.value == pytest.approx(0.3)
    assert a.ttft_p95_s.value == pytest.approx(0.5 + 0.25 * 25 / 30)
    assert a.gpu_util_frac.value == pytest.approx(0.45)
    assert obs.classes["critical"].arrival_rps.value == pytest.approx(2.0)
    assert b.replicas_ready.status is MISSING and b.running.status is MISSING
    assert any(refused in e for e in obs.errors), obs.errors
    assert len(obs.errors) == 1
    healthy, detail = src.health()
    assert healthy and "4/5 targets answered" in detail


def test_only_refused_targets_give_missing_and_unhealthy():
    src = ScrapeSource(["a"], targets=[ScrapeTarget(f"http://127.0.0.1:{free_port()}/metrics", "a", "vllm")],
                       timeout_s=1.0)
    try:
        obs = src.read(5.0)
    finally:
        src.close()
    assert obs.pools["a"].replicas_ready.status is MISSING
    assert obs.all_stale
    assert "refused" in obs.errors[0].lower()
    assert src.health()[0] is False


def test_http_error_and_unparsable_body_are_missing(server):
    server.routes["/broken"] = lambda: None  # HTTP 500
    server.routes["/junk"] = lambda: "<html><body>login required</body></html>\n"
    src = ScrapeSource(["a", "b"], targets=[ScrapeTarget(server.url("/broken"), "a", "vllm"),
                                            ScrapeTarget(server.url("/junk"), "b", "vllm")], timeout_s=2.0)
    try:
        obs = src.read(0.0)
    finally:
        src.close()
    assert obs.pools["a"].running.status is MISSING and obs.pools["b"].running.status is MISSING
    text = "\n".join(obs.errors)
    assert "500" in text and "cannot parse" in text


def test_a_target_that_never_answers_is_cut_off(server):
    server.routes["/slow"] = lambda: vllm_text(VllmState())
    server.hold.add("/slow")
    server.routes["/fast"] = lambda: vllm_text(VllmState(running=3))
    src = ScrapeSource(["a", "b"], targets=[ScrapeTarget(server.url("/slow"), "a", "vllm"),
                                            ScrapeTarget(server.url("/fast"), "b", "vllm")], timeout_s=0.3)
    try:
        obs = src.read(0.0)
    finally:
        src.close()
    assert obs.pools["a"].running.status is MISSING
    assert obs.pools["b"].running.value == 3
    assert "timed out" in "\n".join(obs.errors).lower() or "no answer" in "\n".join(obs.errors)


def test_targets_from_http_service_discovery(server):
    st = _fleet(server)
    groups = [([server.address], {"kind": "vllm", "pool": "a", "replica": "a1", "__metrics_path__": "/a1/metrics"}),
              ([server.address], {"kind": "dcgm", "pool": "a", "node": "node-a", "__metrics_path__": "/gpu/metrics"}),
              ([server.address], {"kind": "router", "__metrics_path__": "/router/metrics"})]
    sd: dict[str, str | None] = {"body": sd_json(groups)}
    server.routes["/sd"] = lambda: sd["body"]
    src = ScrapeSource(["a", "b"], discovery_url=server.url("/sd"), timeout_s=2.0)
    try:
        src.read(0.0)
        _advance(st)
        obs = src.read(30.0)
        assert obs.errors == ()
        assert obs.pools["a"].replicas_ready.value == 1 and obs.pools["a"].running.value == 6
        assert obs.pools["a"].prompt_tokens_rps.value == pytest.approx(100.0)
        assert obs.pools["b"].replicas_ready.value == 0  # discovery lists nothing for b: scaled to zero
        assert obs.classes["critical"].arrival_rps.value == pytest.approx(2.0)
        labels = {t.labels.get("replica") for t in src.targets()}
        assert "a1" in labels

        sd["body"] = None  # discovery now fails (HTTP 500): the last list is kept, the failure reported
        obs = src.read(45.0)
        assert obs.pools["a"].running.value == 6
        assert obs.errors and obs.errors[0].startswith("discovery")
        assert src.health()[0] is False
    finally:
        src.close()


def test_discovery_that_never_worked_means_nothing_is_known(server):
    src = ScrapeSource(["a"], discovery_url=server.url("/no-such-path"), timeout_s=1.0)
    try:
        obs = src.read(0.0)
    finally:
        src.close()
    assert obs.pools["a"].replicas_ready.status is MISSING  # not "0 replicas"
    assert obs.all_stale and "404" in obs.errors[0]


@pytest.mark.parametrize("body, message", [
    ("{}", "expected a JSON list"),
    ("not json", "not JSON"),
    ('[{"labels": {}}]', "group 0 has no 'targets' list"),
    ('[{"targets": ["h:1"], "labels": {"kind": "tgi", "pool": "a"}}]', "kind 'tgi'"),
    ('[{"targets": ["h:1"], "labels": {"kind": "vllm"}}]', "needs a pool"),
    ('[{"targets": ["file:///etc/passwd"], "labels": {"pool": "a"}}]', "not an http(s) address"),
])
def test_parse_discovery_rejects_bad_documents(body, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_discovery(body)


def test_parse_discovery_builds_urls():
    targets = parse_discovery('[{"targets": ["10.0.0.1:8000", "10.0.0.2:8000"], "labels": {"pool": "a"}},'
                              ' {"targets": ["10.0.0.9:9090"], "labels": {"kind": "router", "pool": "x",'
                              ' "__scheme__": "https", "__metrics_path__": "/m"}}]')
    assert [(t.url, t.pool, t.kind) for t in targets] == [
        ("http://10.0.0.1:8000/metrics", "a", "vllm"), ("http://10.0.0.2:8000/metrics", "a", "vllm"),
        ("https://10.0.0.9:9090/m", "", "router")]


POOL_YAML = "pools:\n  - {name: a, model: llama-3-8b, sku: h100-80gb, usd_per_gpu_hour: 2}\n"


def test_build_source_picks_the_configured_source():
    from controller.clock import VirtualClock

    prom = build_source(parse_settings(POOL_YAML), VirtualClock())
    assert isinstance(prom, PrometheusSource) and prom.pools == ("a",)
    scrape = build_source(parse_settings(POOL_YAML + "telemetry:\n  source: scrape\n  scrape:\n    targets:\n"
                                         "      - {url: 'http://127.0.0.1:1/metrics', pool: a}\n"), VirtualClock())
    assert isinstance(scrape, ScrapeSource)
    try:
        assert [t.url for t in scrape.targets()] == ["http://127.0.0.1:1/metrics"]
    finally:
        scrape.close()
