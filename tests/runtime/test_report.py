"""`governor report`: the key panels agree with the Grafana dashboard, and a report rendered from a live
run (a simulated fleet governed by a daemon, both scraped by a real Prometheus) has every panel, with
data where the run produced some."""

from __future__ import annotations

import json
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from controller.obs.report import KEY_PANELS, ReportError, fill, parse_time, render_report

ROOT = Path(__file__).resolve().parents[2]
# Event-only panels: their series exist once something happened (a skipped tick, a shed decision). Cost per
# successful task counts the tasks `governor picker` saw completed; the live run below routes through the simulated
# fleet's own router, which is not a picker, so the daemon reports basis "none" and the panel has nothing to divide
# by (tests/runtime/test_task_cost.py checks the figure against a picker's counters).
MAY_BE_EMPTY = {"Admission: shed fraction per class", "Cost per successful task"}


def _dashboard_panels() -> dict[str, dict]:
    board = json.loads((ROOT / "grafana" / "governor-control-loop.json").read_text())
    out = {}

    def walk(panels):
        for p in panels:
            if p.get("type") == "row":
                walk(p.get("panels", []))
            else:
                out[p["title"]] = p
    walk(board["panels"])
    return out


def test_key_panels_are_the_dashboards_panels():
    board = _dashboard_panels()
    for spec in KEY_PANELS:
        assert spec.title in board, f"{spec.title!r} is not a panel of grafana/governor-control-loop.json"
        p = board[spec.title]
        assert tuple(t["expr"] for t in p["targets"]) == spec.exprs, spec.title
        assert tuple(t["legendFormat"] for t in p["targets"]) == spec.legends, spec.title
        assert p["fieldConfig"]["defaults"]["unit"] == spec.unit, spec.title


def test_times_and_variables():
    now = 1_800_000_000.0
    assert parse_time("now", now) == now and parse_time("now-1h", now) == now - 3600
    assert parse_time("-90s", now) == now - 90 and parse_time("1700000000", now) == 1.7e9
    assert parse_time("2026-12-02T03:00:00Z", now) == parse_time("2026-12-02T03:00:00+00:00", now)
    with pytest.raises(ReportError, match="time 'yesterday'"):
        parse_time("yesterday", now)
    assert fill('rate(x{pool=~"$pool"}[$__rate_interval])', "chat.*", 59.2) == 'rate(x{pool=~"chat.*"}[60s])'
    with pytest.raises(ReportError, match="the time range is empty"):
        render_report("http://127.0.0.1:9", now, now - 1, "/tmp/never.png")


class _Discovery:
    """HTTP service discovery: the simulator's targets plus the daemon's /metrics (no labels, so the
    daemon's own `pool` labels survive the scrape)."""

    def __init__(self, sim_sd_url: str, governor_target: str) -> None:
        import urllib.request

        def groups() -> bytes:
            with urllib.request.urlopen(sim_sd_url, timeout=2) as r:
                sim = json.load(r)
            return json.dumps(sim + [{"targets": [governor_target], "labels": {"kind": "governor"}}]).encode()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                body = groups()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/sd"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.e2e
def test_report_from_a_live_run_has_every_panel(prometheus_factory, tmp_path):
    from controller.clock import WallClock
    from controller.config import Settings
    from controller.runtime.main import build_services
    from controller.sim.fleetspec import fleet_spec_from_scenario
    from controller.sim.live import LiveFleet
    from controller.sim.scenario import load_scenario
    from tests.fakes.live_scenario import write_scenario
    from tests.fixtures.prometheus import wait_until

    scenario = load_scenario(write_scenario(tmp_path, n=4000, rps=20.0, replicas=2, max_replicas=4, startup_s=4.0))
    spec = fleet_spec_from_scenario(scenario)
    fleet = LiveFleet(scenario, speed=2.0)
    info = fleet.start()
    services = discovery = None
    try:
        pools = [{"name": p.name, "model": p.model, "sku": p.sku, "gpus_per_replica": p.gpus_per_replica,
                  "usd_per_gpu_hour": p.usd_per_replica_hour / p.gpus_per_replica, "min_replicas": p.min_replicas,
                  "max_replicas": p.max_replicas} for p in spec.pools]
        settings = Settings(
            mode="active", tick_interval_s=1.0, state_dir=str(tmp_path / "state"), pools=pools,
            telemetry={"source": "scrape", "scrape": {"discovery_url": info["discovery"]}, "window_s": 10,
                       "stale_after_s": 30},
            actuators={"router": {"address": info["router_control"]},
                       "autoscaler": {"address": info["autoscaler_control"]}},
            api={"listen": "127.0.0.1:0"}, metrics={"listen": "127.0.0.1:0"}, log={"format": "text"})
        services = build_services(settings, clock=WallClock(), logger=logging.getLogger("test-report"))
        assert services.metrics_url is not None
        discovery = _Discovery(info["discovery"], services.metrics_url.split("/")[2])
        prom = prometheus_factory(http_sd_url=discovery.url)
        start = time.time()

        def enough() -> bool:
            services.daemon.tick()
            # rates need a few scrapes of a counter: wait for the decision rate to show
            return bool(prom.query("sum(rate(governor_decisions_total[4s])) > 0")) and bool(
                prom.query("governor_pool_ttft_p95_seconds"))

        wait_until(enough, deadline_s=60, interval_s=0.5, what="the daemon's series in Prometheus")
        services.daemon.tick()
        end = time.time() + 1
        out = tmp_path / "report" / "governor.png"
        rep = render_report(prom.url, start, end, out, step_s=1.0, scrape_interval_s=1.0)
    finally:
        if discovery is not None:
            discovery.close()
        if services is not None:
            services.close()
        fleet.stop()

    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 20_000
    side = json.loads(Path(rep.sidecar).read_text())
    titles = [p["title"] for p in side["panels"]]
    assert titles == [s.title.replace(" — $pool", "") for s in KEY_PANELS]
    by_title = {p["title"]: p for p in side["panels"]}
    for title, panel in by_title.items():
        if title not in MAY_BE_EMPTY:
            assert any(s["points"] > 0 for s in panel["series"]), f"panel {title!r} drew no data"
    legends = {s["legend"] for s in by_title["Replicas"]["series"] if s["points"]}
    assert {f"{p.name} desired" for p in spec.pools} <= legends and any(s.endswith(" ready") for s in legends)
    assert "SLO" in {s["legend"] for s in by_title["p95 TTFT vs SLO"]["series"]}
    assert any(s["legend"] == "decided" for s in by_title["Ticks by result"]["series"])
    assert {s["legend"] for s in by_title["Tick duration by phase (p95)"]["series"]} >= {"read p95", "step p95"}
