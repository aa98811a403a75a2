"""In-process telemetry from a simulated fleet: the same numbers a scrape would give, without HTTP.

`SimObserver` feeds the fleet's stats to the same window the scrape source uses
(`telemetry/window.py`). The replica phases only the autoscaler knows (starting,
draining) are not merged here: `fleet_state()` hands them over raw, as the
daemon's actuator does, and `Controller.step` merges them (core/estimate.py).
The bench, the model trainer and the tests read a simulated fleet through it;
the daemon reads a live one through a scrape or Prometheus — one code path for
the numbers either way.

Two ways to the window, same observation to the last bit (tests/sim/test_observe.py):
- `fast=True` (default): the samples the window reads (`read_sample_names`) are
  built straight from the stats — the names, label sets and values the
  collectors of `exposition.py` would render, with label dicts and `le` strings
  cached — and handed over as a sample map. The ~80 % of each replica's and the
  router's series no reader uses (request-size histograms, e2e, queue time, …)
  are never built. DCGM nodes still go through their collector (it keeps the
  utilisation window, and there are few nodes).
- `fast=False`: every family through the collectors (`collect_families`), the
  reference the fast path is checked against.

It sits with the drivers (bench/), not in the simulator: it reads the fleet the way the
controller's telemetry does (it imports telemetry/), and the simulator never reaches the
controller's side.

Must not: mutate the fleet or its stats; keep anything but caches of labels.
"""

from __future__ import annotations

from typing import NamedTuple

from prometheus_client.utils import floatToGoString

from controller.sim.exposition import (
    ENGINE_INDEX,
    ENGINE_LABELS,
    REQUEST_LABELS,
    NodeCollector,
    ReplicaCollector,
    RouterCollector,
    collect_families,
)
from controller.sim.fleet import Fleet
from controller.sim.fleet_accounting import PoolState
from controller.telemetry.source import ScrapeTarget
from controller.telemetry.window import FamiliesWindow
from controller.types import FleetObservation


class _Sample(NamedTuple):
    """What the window reads of a sample: its labels and value (prometheus_client's Sample has more)."""

    labels: dict[str, str]
    value: float


# (sample name, ReplicaStats attribute) of the engine gauges and counters the window reads
_ENGINE_GAUGES = (("vllm:num_requests_running", "num_requests_running"),
                  ("vllm:num_requests_waiting", "num_requests_waiting"),
                  ("vllm:kv_cache_usage_perc", "kv_cache_usage_perc"))
_ENGINE_COUNTERS = (("vllm:prefix_cache_queries_total", "prefix_cache_queries"),
                    ("vllm:prefix_cache_hits_total", "prefix_cache_hits"),
                    ("vllm:num_preemptions_total", "num_preemptions"),
                    ("vllm:prompt_tokens_total", "prompt_tokens"),
                    ("vllm:generation_tokens_total", "generation_tokens"))
_ENGINE_HISTOGRAMS = (("vllm:time_to_first_token_seconds", "ttft_s"),
                      ("vllm:inter_token_latency_seconds", "itl_s"),
                      ("vllm:request_time_per_output_token_seconds", "tpot_s"))
_ENGINE_COUNTS = (("vllm:time_to_first_token_seconds_count", "ttft_s"),
                  ("vllm:inter_token_latency_seconds_count", "itl_s"))
_ENGINE_SUMS = (("vllm:inter_token_latency_seconds_sum", "itl_s"),)
_ROUTER_COUNTERS = (("llm_d_epp_request_total", "arrivals"), ("llm_d_epp_governor_admitted_total", "admitted"),
                    ("llm_d_epp_governor_shed_total", "shed"), ("llm_d_epp_governor_retries_total", "retries"))


class _Labels:
    """Label dicts shared across reads (the window only reads them): one per label set, not per sample."""

    def __init__(self) -> None:
        self._plain: dict[tuple, dict[str, str]] = {}
        self._buckets: dict[tuple, list[dict[str, str]]] = {}
        self._le: dict[tuple[float, ...], list[str]] = {}

    def plain(self, names: tuple[str, ...], values: tuple[str, ...]) -> dict[str, str]:
        key = (names, values)
        d = self._plain.get(key)
        if d is None:
            d = self._plain[key] = dict(zip(names, values, strict=False))
        return d

    def buckets(self, names: tuple[str, ...], values: tuple[str, ...], bounds: tuple[float, ...]) -> list[dict]:
        """One dict per bucket, `le` printed as the collectors print it (Go float format, then "+Inf")."""
        key = (names, values, bounds)
        got = self._buckets.get(key)
        if got is None:
            les = self._le.get(bounds)
            if les is None:
                les = self._le[bounds] = [floatToGoString(b) for b in bounds] + ["+Inf"]
            got = self._buckets[key] = [dict([*zip(names, values, strict=False), ("le", le)]) for le in les]
        return got


def _add_buckets(out: list, labels: list[dict], hist) -> None:
    """Cumulative bucket samples exactly as `exposition._add_histogram` computes them."""
    running = 0.0
    for lab, n in zip(labels[:-1], hist.counts, strict=False):  # the finite buckets
        running += n
        out.append(_Sample(lab, running))
    out.append(_Sample(labels[-1], float(hist.count)))  # +Inf: the collector uses the total count


class SimObserver:
    name = "sim"

    def __init__(self, fleet: Fleet, *, window_s: float = 60.0, stale_after_s: float = 120.0,
                 include_gpu: bool = True, fast: bool = True) -> None:
        self.fleet = fleet
        self.window = FamiliesWindow([p.name for p in fleet.scenario.pools], window_s, stale_after_s, source_name="sim")
        self.include_gpu = include_gpu
        self.fast = fast
        self._nodes: dict[str, NodeCollector] = {}
        self._router = RouterCollector(fleet.router_stats)
        self._labels = _Labels()

    def _node(self, stats) -> NodeCollector:
        c = self._nodes.get(stats.node_id)
        if c is None:
            c = self._nodes[stats.node_id] = NodeCollector(stats, self.fleet.replica_stats,
                                                           now_s=lambda: self.fleet.now_s)
        return c

    # ------------------------------------------------------------------ the fast path

    def _replica_samples(self, rs) -> dict[str, list[_Sample]]:
        labels = self._labels
        base = labels.plain(ENGINE_LABELS, (rs.model_name, ENGINE_INDEX))
        out: dict[str, list[_Sample]] = {}
        for name, attr in _ENGINE_GAUGES:
            out[name] = [_Sample(base, float(getattr(rs, attr)))]
        for name, attr in _ENGINE_COUNTERS:
            out[name] = [_Sample(base, float(getattr(rs, attr)))]
        for name, attr in _ENGINE_HISTOGRAMS:
            hist = getattr(rs, attr)
            samples: list[_Sample] = []
            _add_buckets(samples, labels.buckets(ENGINE_LABELS, (rs.model_name, ENGINE_INDEX), hist.bounds), hist)
            out[f"{name}_bucket"] = samples
        for name, attr in _ENGINE_COUNTS:
            out[name] = [_Sample(base, float(getattr(rs, attr).count))]
        for name, attr in _ENGINE_SUMS:
            out[name] = [_Sample(base, float(getattr(rs, attr).sum))]
        return out

    def _router_samples(self) -> dict[str, list[_Sample]]:
        rstats = self.fleet.router_stats
        m = rstats.model_name
        labels = self._labels
        cells = [((m, m, priority, str(step)), cell) for (priority, step), cell in sorted(rstats.cells.items())]
        out: dict[str, list[_Sample]] = {}
        for name, attr in _ROUTER_COUNTERS:
            out[name] = [_Sample(labels.plain(REQUEST_LABELS, values), float(getattr(cell, attr)))
                         for values, cell in cells]
        err_names = (*REQUEST_LABELS, "error_code")
        out["llm_d_epp_request_error_total"] = [
            _Sample(labels.plain(err_names, (*values, str(code))), float(n))
            for values, cell in cells for code, n in sorted(cell.errors.items())]
        ttft: list[_Sample] = []
        tpot: list[_Sample] = []
        ttft_names = (*REQUEST_LABELS, "streaming")
        for values, cell in cells:
            _add_buckets(ttft, labels.buckets(ttft_names, (*values, "true"), cell.ttft_s.bounds), cell.ttft_s)
            _add_buckets(tpot, labels.buckets(REQUEST_LABELS, values, cell.tpot_s.bounds), cell.tpot_s)
        out["llm_d_epp_request_ttft_seconds_bucket"] = ttft
        out["llm_d_epp_request_streaming_tpot_seconds_bucket"] = tpot
        if rstats.queue_by_priority:  # as the collector: a gauge family without samples exports nothing
            out["llm_d_epp_flow_control_queue_size"] = [
                _Sample(labels.plain(("priority",), (priority,)), float(n))
                for priority, n in sorted(rstats.queue_by_priority.items())]
        return out

    # ------------------------------------------------------------------ read

    def read(self, now_s: float) -> FleetObservation:
        scraped: list = []
        fast = self.fast
        for rs in self.fleet.replica_stats():
            target = ScrapeTarget(f"sim://{rs.replica_id}", rs.pool, "vllm", {"replica": rs.replica_id})
            scraped.append((target, self._replica_samples(rs) if fast else collect_families(ReplicaCollector(rs))))
        if self.include_gpu:
            for ns in self.fleet.node_stats():
                scraped.append((ScrapeTarget(f"sim://{ns.node_id}", ns.pool, "dcgm"), collect_families(self._node(ns))))
        router = ScrapeTarget("sim://router", "", "router")
        scraped.append((router, self._router_samples() if fast else collect_families(self._router)))
        return self.window.update(now_s, scraped)

    def fleet_state(self) -> dict[str, PoolState]:
        """Replicas per phase per pool, as an autoscaler would report them (for `TickInput.fleet_state`)."""
        return self.fleet.pool_states()

    def health(self) -> tuple[bool, str]:
        return True, f"simulated fleet at t={self.fleet.now_s:.0f}s"
