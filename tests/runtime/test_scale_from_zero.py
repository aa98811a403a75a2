"""A fleet scaled to zero has no engine series. The daemon must not read that as all telemetry stale
(it froze at zero): the autoscaler's fleet state says the pool has no replicas, and the router still
counts the traffic it holds; the MPC then starts a replica. A broken engine scrape is not mistaken
for zero, and a source that reports nothing at all still freezes."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest

from controller.actuation.outcome import FleetStateView, PoolStateView
from controller.actuation.shadow import ShadowActuator
from controller.api.store import StateStore
from controller.clock import VirtualClock
from controller.config import Settings
from controller.obs.daemon_metrics import DaemonMetrics
from controller.runtime.daemon import Daemon
from controller.runtime.main import build_controller
from controller.types import (
    ClassObservation,
    Decision,
    FleetObservation,
    Mode,
    PoolDecision,
    PoolObservation,
    Reading,
)

POOLS = [{"name": "chat", "model": "llama-3-8b", "sku": "a100-80gb", "gpus_per_replica": 1, "usd_per_gpu_hour": 4.1,
          "min_replicas": 0, "max_replicas": 8, "startup_warm_s": 20, "startup_cold_s": 90}]


class _NoEngines:
    """Prometheus' answer for a pool with no engine series: every pool reading missing; the router
    (when `router`) still counts arrivals and the requests it holds."""

    name = "prometheus"

    def __init__(self, router: bool = True) -> None:
        self.router = router

    def read(self, now_s: float) -> FleetObservation:
        classes = {c: ClassObservation(priority_class=c, arrival_rps=Reading(1.0), admitted_rps=Reading(1.0),
                                       queue_depth=Reading(4.0)) for c in ("critical", "standard", "sheddable")}
        return FleetObservation(at_s=now_s, pools={"chat": PoolObservation(pool="chat")},
                                classes=classes if self.router else {})

    def health(self):
        return True, "ok"


class _Autoscaler:
    """The autoscaler's view of the fleet (what GetFleetState answers)."""

    def __init__(self, ready: int) -> None:
        self.ready = ready

    def fleet_state(self) -> FleetStateView:
        return FleetStateView(applied_generation=0, pools={"chat": PoolStateView(
            pool="chat", target_replicas=self.ready, ready=self.ready, starting=0, draining=0, standby=0)})

    def health(self):
        return True, "ok"


@pytest.mark.parametrize("label, in_force, autoscaler, router, ready_reads, frozen, decided", [
    ("scaled to zero, the autoscaler says so: it comes back", 0, 0, True, 0.0, False, 1),
    ("scaled to zero, no autoscaler state (KEDA): the router's traffic brings it back", 0, None, True, None, False, 1),
    ("replicas up, no engine series: a broken scrape, the pool is held", 2, 2, True, None, False, 2),
    ("nothing reports at all: frozen at the last decision", 2, None, False, None, True, 2),
])
def test_a_fleet_at_zero_is_not_read_as_stale(tmp_path, label, in_force, autoscaler, router, ready_reads, frozen,
                                              decided):
    settings = Settings(policy="mpc", state_dir=str(tmp_path), pools=POOLS)
    clock = VirtualClock(1000.0)
    store = StateStore(tmp_path / "governor.db")
    try:
        daemon = Daemon(controller=build_controller(settings), source=_NoEngines(router),
                        actuator=_Autoscaler(autoscaler) if autoscaler is not None else None,
                        shadow=ShadowActuator(clock=clock), store=store, metrics=DaemonMetrics(), clock=clock,
                        logger=logging.getLogger("test"), mode=Mode.SHADOW)
        # the decision in force (for the first two: the one that scaled the pool to zero)
        daemon.state = replace(daemon.state, current=Decision(
            decision_id="d-0", generation=0, at_s=900.0, valid_until_s=1200.0,
            pools={"chat": PoolDecision(replicas=in_force)}))
        rep = daemon.tick()
        assert rep.result.frozen is frozen, label
        ready = rep.observation.pools["chat"].replicas_ready
        assert (ready.value if ready.ok else None) == ready_reads, label
        assert rep.result.decision is not None, label
        assert rep.result.decision.pools["chat"].replicas == decided, label
    finally:
        store.close()
