"""`governor run --demo --dataplane envoy`: the demo's traffic over a real data plane on loopback.

    replayer (the demo trace) → Envoy → governor picker (ext_proc) → simulated replicas (OpenAI API)

- the fleet is scenarios/dataplane/fleet.yaml in live mode (the demo's two Llama-3-8B pools,
  no traffic of their own): each replica serves the OpenAI API and /metrics;
- the picker finds the replicas through the simulator's HTTP service discovery (so it follows
  scale-ups and drains) and scrapes their /metrics;
- Envoy (a child process, deploy/envoy/loopback.yaml) asks the picker for every request;
- the replayer (controller/dataplane/replay.py) sends the demo scenario's trace (Azure 2023
  conversations, 3x surge at 20 s) through Envoy, streaming, on a background thread;
- Governor scrapes the engines (discovery) and the picker (as a router target), and actuates the
  picker over RouterControl and the simulated autoscaler over AutoscalerControl.

Must not: decide anything (the daemon does) or outlive `stop()` (every part it starts, it stops).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path
from typing import Any

import numpy as np

from controller.config import ScrapeTargetSettings, Settings
from controller.dataplane.envoy import EnvoyProcess
from controller.dataplane.replay import Summary, build_requests, replay
from controller.dataplane.server import PickerConfig, PickerThread
from controller.paths import PROJECT_ROOT
from controller.sim.live import LiveFleet
from controller.sim.scenario import Scenario, load_scenario
from controller.sim.traces import load_trace

log = logging.getLogger(__name__)

FLEET_SCENARIO = PROJECT_ROOT / "scenarios" / "dataplane" / "fleet.yaml"
TRACE_SCENARIO = PROJECT_ROOT / "scenarios" / "demo.yaml"


class DataplaneDemo:
    """Start with `start()` (returns the fleet's listening info plus the data plane's addresses), stop with `stop()`."""

    def __init__(self, *, duration_s: float = 300.0, max_output: int = 128, concurrency: int = 256) -> None:
        self.scenario: Scenario = load_scenario(FLEET_SCENARIO)
        self.trace_scenario = load_scenario(TRACE_SCENARIO)
        self.duration_s = duration_s
        self.max_output = max_output
        self.concurrency = concurrency
        self.live = LiveFleet(self.scenario, step_wall_s=0.01)
        self.picker: PickerThread | None = None
        self.envoy: EnvoyProcess | None = None
        self.summary: Summary | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self._thread: threading.Thread | None = None
        self.info: dict[str, Any] = {}

    def start(self) -> dict[str, Any]:
        try:
            listening = self.live.start()
            groups: dict[str, list[str]] = {}
            for p in self.scenario.pools:
                groups.setdefault(p.group, []).append(p.name)
            self.picker = PickerThread(PickerConfig(groups=groups, discovery_url=listening["discovery"],
                                                    scrape_interval_s=0.5, hold_timeout_s=20.0))
            running = self.picker.start()
            host, port = running.extproc_address.rsplit(":", 1)
            self.envoy = EnvoyProcess(picker_address=host, picker_port=int(port), message_timeout_s=30.0)
            url = self.envoy.start()
            self.info = {**listening, "router_control": running.control_address, "picker_metrics": running.metrics_url,
                         "envoy": url, "envoy_admin": self.envoy.admin_url}
            self._start_replay(url)
        except BaseException:
            self.stop()
            raise
        return self.info

    def _start_replay(self, url: str) -> None:
        spec = self.trace_scenario.trace
        trace = load_trace(spec, Path(self.trace_scenario.base_dir), np.random.default_rng(1))
        reqs = build_requests(trace, chat=False, model="", max_requests=100_000, time_scale=1.0, start_s=0.0,
                              class_mix=(0.2, 0.6, 0.2), max_output=self.max_output, seed=1,
                              until_s=self.duration_s)
        self._loop = asyncio.new_event_loop()

        def run() -> None:
            assert self._loop is not None
            asyncio.set_event_loop(self._loop)
            self._task = self._loop.create_task(replay(url, reqs, chat=False, concurrency=self.concurrency,
                                                       duration_s=self.duration_s, timeout_s=120.0))
            try:
                self.summary = self._loop.run_until_complete(self._task)
                log.info("replay finished: %s", self.summary.to_dict())
            except asyncio.CancelledError:
                pass

        self._thread = threading.Thread(target=run, name="replay", daemon=True)
        self._thread.start()

    def settings(self, base: Settings) -> Settings:
        """The demo daemon's settings with the picker as its router (actuated, and scraped as a router target)."""
        actuators = base.actuators.model_copy(update={
            "router": base.actuators.router.model_copy(update={"address": self.info["router_control"]})})
        picker = ScrapeTargetSettings(url=self.info["picker_metrics"], kind="router")
        scrape = base.telemetry.scrape.model_copy(update={"targets": [*base.telemetry.scrape.targets, picker]})
        telemetry = base.telemetry.model_copy(update={"scrape": scrape})
        return base.model_copy(update={"actuators": actuators, "telemetry": telemetry})

    def stop(self) -> None:
        if self._loop is not None and self._task is not None and not self._task.done():
            self._loop.call_soon_threadsafe(self._task.cancel)
        if self._thread is not None:
            self._thread.join(10.0)
        if self.envoy is not None:
            self.envoy.stop()
            self.envoy = None
        if self.picker is not None:
            self.picker.stop()
            self.picker = None
        self.live.stop()
