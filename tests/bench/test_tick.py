"""`governor bench tick` end to end on a small fleet: real HTTP scrape, the core, real gRPC actuation."""

from __future__ import annotations

import json

from controller.bench.tick import canned_template, measure, render_canned
from controller.cli import main


def test_canned_text_grows_counters_not_gauges() -> None:
    text = ("# TYPE vllm:num_requests_running gauge\n"
            'vllm:num_requests_running{engine="0"} 7.0\n'
            'vllm:prompt_tokens_total{engine="0"} 100.0\n'
            'vllm:time_to_first_token_seconds_bucket{engine="0",le="0.5"} 3.0\n')
    body = render_canned(canned_template(text), 4).decode()
    assert 'vllm:num_requests_running{engine="0"} 7.0' in body
    assert 'vllm:prompt_tokens_total{engine="0"} 400.0' in body
    assert 'le="0.5"} 12.0' in body
    assert body.startswith("# TYPE")


def test_measure_small_fleet() -> None:
    out = measure(pools=2, replicas=6, ticks=4)
    assert out["pools_observed"] == 2
    assert out["replicas_observed"] == 6
    assert out["actuation_failures"] == 0
    for key in ("tick_p50_ms", "tick_p99_ms", "rss_mb"):
        assert out[key] > 0
    assert set(out["phases_p99_ms"]) == {"read", "step", "actuate"}
    assert out["tick_p99_ms"] >= out["tick_p50_ms"]


def test_cli_json_and_bad_arguments(capsys) -> None:
    assert main(["bench", "tick", "--pools", "1", "--replicas", "2", "--ticks", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"tick_p50_ms", "tick_p99_ms", "rss_mb", "phases_p99_ms"} <= set(out)
    assert main(["bench", "tick", "--pools", "3", "--replicas", "2", "--ticks", "2"]) == 2
    assert "replicas >= pools" in capsys.readouterr().err


def test_measure_through_prometheus_with_recording_rules() -> None:
    """A real Prometheus loading Governor's rules; the read is one query of the recorded series."""
    out = measure(pools=2, replicas=4, ticks=3, source_kind="prometheus", scrape_interval_s=1.0)
    assert out["recording_rules"] is True and out["queries_per_read"] == 1 and out["scrape_interval_s"] == 1.0
    assert out["read_errors"] == []
    assert out["pools_observed"] == 2 and out["replicas_observed"] == 4
    assert out["actuation_failures"] == 0


def test_cli_rejects_a_silly_scrape_interval(capsys) -> None:
    assert main(["bench", "tick", "--source", "prometheus", "--scrape-interval", "0.1", "--ticks", "1"]) == 2
    assert "scrape interval" in capsys.readouterr().err
