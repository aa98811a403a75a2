"""SimObserver: the fast path (samples built straight from the stats) observes exactly what the reference
path (every family through the exposition collectors) and the pre-optimisation code observed."""

from __future__ import annotations

import json

import pytest

from controller.bench.observe import SimObserver, _Labels
from controller.sim.exposition import ReplicaCollector, RouterCollector, collect_families
from controller.sim.fleet import Fleet
from controller.sim.stats import ReplicaStats, RouterStats
from controller.telemetry.window import read_sample_names
from tests.fakes.sim_fleet import pool, scenario, workload
from tests.sim import observe_golden


@pytest.fixture(scope="module")
def fast_run() -> tuple[str, list[dict]]:
    return observe_golden.run_with_fingerprint(fast=True)


def test_fast_path_matches_the_golden_recorded_before_the_optimisation(fast_run) -> None:
    """tests/sim/golden/observe_demo_seed3.json was written by the collector-based observer and the
    snapshot-per-scrape window (commit 48221d9), on the demo scenario (surge, then a replica crash)."""
    doc = json.loads(observe_golden.GOLDEN.read_text())
    fingerprint, fast_run = fast_run
    if fingerprint != doc["fleet_fingerprint"]:
        pytest.skip("the simulated fleet itself changed since the golden was recorded (simulator or demo "
                    "scenario): re-record it with `python -m tests.sim.observe_golden` once the fast and "
                    "reference paths agree (the other tests here)")
    golden = doc["ticks"]
    assert len(fast_run) == len(golden) == observe_golden.TICKS
    for k, (got, want) in enumerate(zip(fast_run, golden, strict=True)):
        assert got == want, f"tick {k + 1} (t = {(k + 1) * observe_golden.TICK_S:g} s) differs"
    # the comparison is not vacuous: rates, quantiles and classes were observed, and the crash shows
    h100_ready = [t["pools"]["llama8b-h100"]["replicas_ready"][0] for t in golden]
    assert len(set(h100_ready)) > 1
    assert any(t["classes"]["critical"]["ttft_p95_s"][1] == "OK" for t in golden)
    assert any(t["pools"]["llama8b-a100"]["hit_rate"][1] == "OK" for t in golden)


def test_fast_and_reference_paths_agree_without_gpus() -> None:
    fast = observe_golden.run(fast=True, include_gpu=False, ticks=30)
    slow = observe_golden.run(fast=False, include_gpu=False, ticks=30)
    assert fast == slow


def test_reference_path_matches_the_fast_path_with_gpus(fast_run) -> None:
    assert observe_golden.run(fast=False) == fast_run[1]


def test_fast_path_builds_every_read_series_the_collectors_export() -> None:
    """If the window starts reading a series the collectors export, the fast path must build it too."""
    rs = ReplicaStats(replica_id="r0", pool="p", model_name="m", node_id="n", gpu_indices=(0,), num_gpu_blocks=10,
                      block_size=16, gpu_memory_utilization=0.9)
    router = RouterStats(model_name="m")
    router.cell("critical", 0).errors["429"] = 1.0
    router.queue_by_priority = {"critical": 1, "standard": 2, "sheddable": 0}
    fleet_like = type("F", (), {"router_stats": router})()
    obs = SimObserver.__new__(SimObserver)  # only the sample builders are exercised: no fleet needed
    obs.fleet = fleet_like
    obs._labels = _Labels()
    for kind, built, families in (("vllm", obs._replica_samples(rs), collect_families(ReplicaCollector(rs))),
                                  ("router", obs._router_samples(), collect_families(RouterCollector(router)))):
        exported = {s.name for f in families for s in f.samples}
        assert set(built) == exported & read_sample_names(kind), kind
        by_name: dict[str, list[tuple[dict[str, str], float]]] = {}
        for f in families:
            for s in f.samples:
                by_name.setdefault(s.name, []).append((s.labels, s.value))
        for name, samples in built.items():  # same label sets and values, in the same order
            assert [(s.labels, s.value) for s in samples] == by_name[name], name


def test_requests_held_at_the_router_are_each_class_s_queue_depth() -> None:
    """The simulated router's held requests reach `ClassObservation.queue_depth` per class (the EPP's
    flow-control queue gauge), on both paths: an in-flight cap of 1 on one replica holds the later
    standard and sheddable requests; a critical one passes the cap."""
    sc = scenario([pool(replicas=1)], router=dict(inflight_cap=1))
    wl = workload([0.0, 0.0, 0.0, 0.01, 0.02, 0.02], 2000, 100, priority=[1, 1, 1, 0, 2, 2])
    for fast in (True, False):
        fleet = Fleet(sc, workload=wl)
        obs = SimObserver(fleet, include_gpu=False, fast=fast)
        fleet.run_until(0.05)
        view = obs.read(0.05).classes
        assert {c: view[c].queue_depth.value for c in ("critical", "standard", "sheddable")} == {
            "critical": 0.0, "standard": 2.0, "sheddable": 2.0}, fast
        assert view["standard"].queue_depth.ok
