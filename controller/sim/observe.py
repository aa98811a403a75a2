"""In-process telemetry from a simulated fleet: the same numbers a scrape would give, without HTTP.

`SimObserver` renders the fleet's stats through the same collectors the live
mode serves (`exposition.py`) and feeds the families to the same window the
scrape source uses (`telemetry/window.py`), then adds the replica phases only
the autoscaler knows (starting, draining). The bench, the model trainer and the
tests read a simulated fleet through it; the daemon reads a live one through a
scrape or Prometheus — one code path for the numbers either way.
"""

from __future__ import annotations

from dataclasses import replace

from controller.sim.exposition import NodeCollector, ReplicaCollector, RouterCollector, collect_families
from controller.sim.fleet import Fleet
from controller.telemetry.source import ScrapeTarget
from controller.telemetry.window import FamiliesWindow
from controller.types import FleetObservation, Reading


class SimObserver:
    name = "sim"

    def __init__(self, fleet: Fleet, *, window_s: float = 60.0, stale_after_s: float = 120.0,
                 include_gpu: bool = True) -> None:
        self.fleet = fleet
        self.window = FamiliesWindow([p.name for p in fleet.scenario.pools], window_s, stale_after_s, source_name="sim")
        self.include_gpu = include_gpu
        self._nodes: dict[str, NodeCollector] = {}
        self._router = RouterCollector(fleet.router_stats)

    def _node(self, stats) -> NodeCollector:
        c = self._nodes.get(stats.node_id)
        if c is None:
            c = self._nodes[stats.node_id] = NodeCollector(stats, self.fleet.replica_stats, now_s=lambda: self.fleet.now_s)
        return c

    def read(self, now_s: float) -> FleetObservation:
        scraped = []
        for rs in self.fleet.replica_stats():
            scraped.append((ScrapeTarget(f"sim://{rs.replica_id}", rs.pool, "vllm"), collect_families(ReplicaCollector(rs))))
        if self.include_gpu:
            for ns in self.fleet.node_stats():
                scraped.append((ScrapeTarget(f"sim://{ns.node_id}", ns.pool, "dcgm"), collect_families(self._node(ns))))
        scraped.append((ScrapeTarget("sim://router", "", "router"), collect_families(self._router)))
        obs = self.window.update(now_s, scraped)
        pools = dict(obs.pools)
        for name, ps in self.fleet.pool_states().items():
            if name in pools:
                pools[name] = replace(pools[name], replicas_starting=Reading(float(ps.starting)),
                                      replicas_draining=Reading(float(ps.draining)))
        return replace(obs, pools=pools)

    def health(self) -> tuple[bool, str]:
        return True, f"simulated fleet at t={self.fleet.now_s:.0f}s"
