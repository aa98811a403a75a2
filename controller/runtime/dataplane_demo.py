"""`governor run --demo --dataplane envoy`: the demo's traffic over a real data plane on loopback.

    replayer (the demo trace) → Envoy → governor picker (ext_proc) → simulated replicas (OpenAI API)

- the fleet is scenarios/dataplane/fleet.yaml in live mode (the demo's two Llama-3-8B pools,
  no traffic of their own): each replica serves the OpenAI API and /metrics;
- `governor picker` (a child process) finds the replicas through the simulator's HTTP service
  discovery (so it follows scale-ups and drains) and scrapes their /metrics;
- Envoy (a child process, deploy/envoy/loopback.yaml) asks the picker for every request;
- `governor replay` (a child process) sends the demo scenario's trace (Azure 2023 conversations,
  3x surge at 20 s, written to a JSONL file after the scenario's transforms) through Envoy,
  streaming. The picker and the replayer run in their own processes so that they do not compete
  with the simulated fleet for this process' GIL (with all in one process, the client-side TTFT
  measured mostly Python's queueing);
- Governor scrapes the engines (discovery) and the picker (as a router target), and actuates the
  picker over RouterControl and the simulated autoscaler over AutoscalerControl.

Must not: decide anything (the daemon does) or outlive `stop()` (every part it starts, it stops).
"""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from controller.config import Settings
from controller.config.sections import ScrapeTargetSettings
from controller.dataplane.child import GovernorChild
from controller.dataplane.envoy import EnvoyProcess
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
        self.picker: GovernorChild | None = None
        self.envoy: EnvoyProcess | None = None
        self.replayer: GovernorChild | None = None
        self.summary: dict | None = None
        self._dir = tempfile.TemporaryDirectory(prefix="governor-dataplane-")
        self.info: dict[str, Any] = {}

    def start(self) -> dict[str, Any]:
        try:
            listening = self.live.start()
            groups: dict[str, list[str]] = {}
            for p in self.scenario.pools:
                groups.setdefault(p.group, []).append(p.name)
            self.picker = GovernorChild(["picker", *[f"--pool={p.name}=" for p in self.scenario.pools],
                                         *[f"--group={g}={','.join(ps)}" for g, ps in groups.items()],
                                         "--discovery", listening["discovery"], "--scrape-interval", "0.5",
                                         "--hold-timeout", "20", "--extproc-port", "0", "--control-port", "0",
                                         "--metrics-port", "0"])
            host, port = self.picker.info["extproc"].rsplit(":", 1)
            self.envoy = EnvoyProcess(picker_address=host, picker_port=int(port), message_timeout_s=30.0)
            url = self.envoy.start()
            self.info = {**listening, "router_control": self.picker.info["router_control"],
                         "picker_metrics": self.picker.info["metrics"], "envoy": url,
                         "envoy_admin": self.envoy.admin_url}
            self._start_replay(url)
        except BaseException:
            self.stop()
            raise
        return self.info

    def _start_replay(self, url: str) -> None:
        spec = self.trace_scenario.trace
        trace = load_trace(spec, Path(self.trace_scenario.base_dir), np.random.default_rng(1))
        path = Path(self._dir.name) / "demo-trace.jsonl"
        with open(path, "w") as f:
            for i in range(len(trace)):
                if float(trace.arrival_s[i]) > self.duration_s:
                    break
                rec: dict[str, Any] = {"arrival_s": float(trace.arrival_s[i]),
                                       "prompt_tokens": int(trace.prompt_tokens[i]),
                                       "output_tokens": int(trace.output_tokens[i])}
                if trace.block_hashes is not None:
                    rec["hash_ids"] = [int(h) for h in trace.block_hashes[i]]
                f.write(json.dumps(rec) + "\n")
        self.replayer = GovernorChild(["replay", str(path), "--url", url, "--block-tokens",
                                       str(trace.hash_block_tokens), "--duration", f"{self.duration_s:g}",
                                       "--max-requests", "100000", "--max-output", str(self.max_output),
                                       "--concurrency", str(self.concurrency), "--seed", "1"], wait_listening=False)

    def settings(self, base: Settings) -> Settings:
        """The demo daemon's settings with the picker as its router (actuated, and scraped as a router target)."""
        actuators = base.actuators.model_copy(update={
            "router": base.actuators.router.model_copy(update={"address": self.info["router_control"]})})
        picker = ScrapeTargetSettings(url=self.info["picker_metrics"], kind="router")
        scrape = base.telemetry.scrape.model_copy(update={"targets": [*base.telemetry.scrape.targets, picker]})
        telemetry = base.telemetry.model_copy(update={"scrape": scrape})
        return base.model_copy(update={"actuators": actuators, "telemetry": telemetry})

    def stop(self) -> None:
        if self.replayer is not None:
            self.summary = self.replayer.last_json()
            self.replayer.stop()
            self.replayer = None
            if self.summary is not None:
                log.info("replay: %s", self.summary)
        if self.envoy is not None:
            self.envoy.stop()
            self.envoy = None
        if self.picker is not None:
            self.picker.stop()
            self.picker = None
        self.live.stop()
        self._dir.cleanup()
