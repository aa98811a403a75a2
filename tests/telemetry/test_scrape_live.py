"""ScrapeSource against the live simulated fleet: discovery via its /sd, vLLM/DCGM/router pages over HTTP."""

from __future__ import annotations

import pytest

from controller.sim.live import LiveFleet
from controller.telemetry.scrape import ScrapeSource
from controller.types import SignalStatus
from tests.fakes.live_scenario import write_scenario
from tests.fixtures.prometheus import wait_until


@pytest.mark.e2e
def test_scrape_source_reads_the_live_simulator(tmp_path):
    live = LiveFleet(write_scenario(tmp_path, n=400, rps=8.0, replicas=2), speed=10.0)
    info = live.start()
    src = ScrapeSource(["small"], discovery_url=info["discovery"], timeout_s=2.0, window_s=30, stale_after_s=30)
    try:
        # The daemon's clock for the window is the simulator's (bounded wait until requests have flowed).
        src.read(live.now_s())
        wait_until(lambda: live.now_s() >= 10.0, deadline_s=20, what="10 simulated seconds")
        obs = src.read(live.now_s())
        wait_until(lambda: live.now_s() >= 20.0, deadline_s=20, what="20 simulated seconds")
        obs = src.read(live.now_s())
    finally:
        src.close()
        live.stop()
    assert obs.errors == (), obs.errors
    p = obs.pools["small"]
    assert p.replicas_ready.value == 2
    for name in ("running", "waiting", "kv_usage_frac", "prompt_tokens_rps", "arrival_rps", "ttft_p95_s",
                 "gpu_util_frac"):
        assert getattr(p, name).status is SignalStatus.OK, (name, getattr(p, name))
    assert p.prompt_tokens_rps.value > 0 and p.arrival_rps.value > 0
    arrivals = sum(c.arrival_rps.value for c in obs.classes.values() if c.arrival_rps.ok)
    assert arrivals > 0
