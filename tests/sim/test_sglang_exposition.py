"""A simulated SGLang fleet read through a real Prometheus gives the observations a vLLM fleet serving the
same load gives: two live fleets of one scenario and seed, one serving vLLM's /metrics and one SGLang's,
advanced in lockstep on virtual clocks while Prometheus scrapes both.

Prometheus samples each target at its own instants, so only what does not depend on those instants is
compared exactly: the gauges (read after the last step, both frozen), and every ratio of two increases
over a window that spans the whole run from the first, all-zero scrape (hit rate, latency quantiles,
framebuffer use). Rates (increase / time) differ by where each target's first and last samples fall,
within a scrape interval of a run of tens of seconds. SGLang exports no per-request TPOT histogram, so
that one reading is missing on the SGLang side, as on a real SGLang fleet."""

from __future__ import annotations

import math

import pytest

from controller.clock import VirtualClock
from controller.sim.live import LiveFleet
from controller.sim.scenario import load_scenario
from controller.telemetry.prometheus import PrometheusSource
from tests.fakes.live_scenario import write_scenario
from tests.fixtures.prometheus import wait_until

pytestmark = pytest.mark.e2e

SIM_S = 40  # simulated seconds of load
EXACT = ("replicas_ready", "running", "waiting", "kv_usage_frac", "hit_rate", "ttft_p50_s", "ttft_p95_s",
         "tpot_p50_s", "tpot_p95_s", "gpu_mem_used_frac")
RATES = ("arrival_rps", "prompt_tokens_rps", "generation_tokens_rps")


def _fleet(tmp, exposition: str):
    path = write_scenario(tmp, n=800, rps=12.0, replicas=1, max_replicas=2, name=f"twin-{exposition}")
    text = path.read_text().replace("name: small", f"name: twin-{exposition}").replace(
        "engine: {max_num_seqs: 64, max_num_batched_tokens: 4096}",
        f"engine: {{max_num_seqs: 64, max_num_batched_tokens: 4096, exposition: {exposition}}}")
    path.write_text(text)
    clock = VirtualClock(1_800_000_000.0)
    fleet = LiveFleet(load_scenario(path), speed=1.0, clock=clock)
    return fleet, clock, fleet.start()


def test_an_sglang_fleet_reads_as_the_vllm_fleet_serving_the_same_load(tmp_path, prometheus_factory):
    (tmp_path / "v").mkdir()
    (tmp_path / "s").mkdir()
    vllm, vclock, vinfo = _fleet(tmp_path / "v", "vllm")
    sglang, sclock, sinfo = _fleet(tmp_path / "s", "sglang")
    try:
        prom = prometheus_factory(http_sd_url=vinfo["discovery"], extra_jobs=[
            {"job_name": "sim-sglang", "http_sd_configs": [{"url": sinfo["discovery"], "refresh_interval": "1s"}]}])
        # the first samples of both engines: the all-zero state before any request
        prom.wait_for("vllm:num_requests_running", deadline_s=30)
        prom.wait_for("sglang:num_running_reqs", deadline_s=30)
        for _ in range(SIM_S):
            vclock.advance(1.0)
            sclock.advance(1.0)
            target = vclock.now_s() - 1_800_000_000.0
            wait_until(lambda t=target: vllm.now_s() >= t and sglang.now_s() >= t, deadline_s=20,
                       interval_s=0.01, what="both fleets at the same simulated time")
        t_end = float(prom.query("vector(time())")[0]["value"][0])

        def scraped_after_the_end():
            ts = prom.query('max by (pool) (timestamp(vllm:num_requests_running) '
                            'or timestamp(sglang:num_running_reqs))')
            return len(ts) == 2 and all(float(r["value"][1]) > t_end for r in ts)

        wait_until(scraped_after_the_end, deadline_s=20, interval_s=0.2, what="a scrape of both after the last step")
        with vllm.lock, sglang.lock:
            assert vllm.fleet.replica_stats()[0].generation_tokens > 1000  # the load was real
        src = PrometheusSource(["twin-vllm", "twin-sglang"], url=prom.url, window_s=600, stale_after_s=600)
        try:
            obs = src.read(t_end)
        finally:
            src.close()
        v, s = obs.pools["twin-vllm"], obs.pools["twin-sglang"]
        for field in EXACT:
            a, b = getattr(v, field), getattr(s, field)
            assert a.ok and b.ok, (field, a, b)
            assert b.value == pytest.approx(a.value, rel=1e-9, abs=1e-12), field
        for field in RATES:
            a, b = getattr(v, field), getattr(s, field)
            assert a.ok and b.ok and a.value > 0, (field, a, b)
            # one sample interval at each end of a run that lasts ~10-40 s of wall time (longer on a busy
            # machine, as the lockstep waits stretch): up to ~2 intervals of the span, i.e. 20-25 %
            assert b.value == pytest.approx(a.value, rel=0.25), field
        assert v.request_tpot_p95_s.ok and not s.request_tpot_p95_s.ok
        assert 0 < v.hit_rate.value < 1 and 0.5 < v.gpu_mem_used_frac.value <= 0.95
        assert not math.isnan(v.ttft_p95_s.value)
    finally:
        vllm.stop()
        sglang.stop()
