"""End to end with real parts: a live simulated fleet, a real Prometheus scraping it, the daemon
reading through Prometheus and commanding the fleet over gRPC. Assertions are on the fleet's state."""

from __future__ import annotations

import logging

import pytest

from controller.clock import WallClock
from controller.config import Settings
from controller.runtime.main import build_services
from controller.sim.fleetspec import fleet_spec_from_scenario
from controller.sim.live import LiveFleet
from controller.sim.scenario import load_scenario
from tests.fakes.live_scenario import write_scenario
from tests.fixtures.prometheus import wait_until

pytestmark = pytest.mark.e2e


def settings_for(scenario, listening, prom_url, state_dir, *, source="prometheus", mode="active",
                 policy="slo-feedback", policy_params=None):
    spec = fleet_spec_from_scenario(scenario)
    pools = [{"name": p.name, "model": p.model, "sku": p.sku, "gpus_per_replica": p.gpus_per_replica,
              "usd_per_gpu_hour": p.usd_per_replica_hour / p.gpus_per_replica, "min_replicas": p.min_replicas,
              "max_replicas": p.max_replicas, "startup_warm_s": p.startup_warm_s, "startup_cold_s": p.startup_cold_s}
             for p in spec.pools]
    windows = {"window_s": 10, "stale_after_s": 30}
    telemetry = ({"source": "prometheus", "prometheus": {"url": prom_url, "timeout_s": 5}, **windows}
                 if source == "prometheus" else
                 {"source": "scrape", "scrape": {"discovery_url": listening["discovery"]}, **windows})
    return Settings(
        mode=mode, policy=policy, policy_params=policy_params or {}, tick_interval_s=1.0, state_dir=str(state_dir),
        telemetry=telemetry, pools=pools,
        actuators={"router": {"address": listening["router_control"]},
                   "autoscaler": {"address": listening["autoscaler_control"]}, "decision_validity_s": 60},
        api={"listen": "127.0.0.1:0"}, metrics={"listen": None}, log={"format": "text"},
        guards={"max_step_up": 4, "max_step_down": 1, "scale_down_stabilization_s": 30})


@pytest.fixture
def live(tmp_path):
    scenario = load_scenario(write_scenario(tmp_path, n=4000, rps=20.0, replicas=1, max_replicas=4, startup_s=4.0))
    fleet = LiveFleet(scenario, speed=2.0)
    info = fleet.start()
    yield scenario, fleet, info
    fleet.stop()


def test_daemon_reads_prometheus_and_commands_the_fleet(live, prometheus_factory, tmp_path):
    scenario, fleet, info = live
    prom = prometheus_factory(http_sd_url=info["discovery"])
    prom.wait_for('sum by (pool) (vllm:num_requests_running)', deadline_s=30)
    services = build_services(settings_for(scenario, info, prom.url, tmp_path / "state"), clock=WallClock(),
                              logger=logging.getLogger("test"))
    try:
        daemon = services.daemon

        def decided():
            rep = daemon.tick()
            pool = rep.observation.pools["small"]
            return rep if (rep.outcome.status == "applied" and pool.replicas_ready.ok) else None

        rep = wait_until(decided, deadline_s=40, interval_s=0.5, what="a tick applied from Prometheus data")
        assert rep.observation.source == "prometheus"
        assert rep.observation.pools["small"].replicas_ready.value == 1

        # The operator pins the pool to 3: the next tick sends it and the fleet starts two replicas.
        services.store.add_override("pin_replicas", ttl_s=600, author="e2e", now_s=WallClock().now_s(), value=3,
                                    pool="small", known_pools=["small"])
        rep = daemon.tick()
        assert rep.result.decision is not None
        assert rep.result.decision.pools["small"].replicas == 3
        assert rep.outcome.status == "applied"
        with fleet.lock:
            assert fleet.fleet.pool_states()["small"].target_replicas == 3

        def three_ready():
            with fleet.lock:
                return fleet.fleet.pool_states()["small"].ready == 3

        wait_until(three_ready, deadline_s=30, what="the fleet to have 3 ready replicas")
        # ...and Prometheus sees them through discovery, so the daemon does too.
        wait_until(lambda: daemon.tick().observation.pools["small"].replicas_ready.value == 3, deadline_s=40,
                   interval_s=0.5, what="the daemon to observe 3 ready replicas through Prometheus")
        rows = services.store.list_decisions(limit=5, since_s=0, pool="")
        assert rows and rows[0].outcome == "applied"
    finally:
        services.close()


def test_shadow_mode_sends_nothing(live, tmp_path):
    scenario, fleet, info = live
    services = build_services(settings_for(scenario, info, None, tmp_path / "state", source="scrape", mode="shadow"),
                              clock=WallClock(), logger=logging.getLogger("test"))
    try:
        services.store.add_override("pin_replicas", ttl_s=600, author="e2e", now_s=WallClock().now_s(), value=4,
                                    pool="small", known_pools=["small"])
        for _ in range(3):
            rep = services.daemon.tick()
        assert rep.result.decision is not None
        assert rep.result.decision.pools["small"].replicas == 4
        assert rep.outcome.status == "shadow"
        with fleet.lock:
            state = fleet.fleet.pool_states()["small"]
            assert state.target_replicas == 1
        assert fleet.plane.fleet_state().applied_generation == 0
    finally:
        services.close()


@pytest.mark.parametrize("planning_model, kind", [("prior", "QueueingPrior"), ("learned", "LearnedPlanModel")])
def test_mpc_plans_on_live_telemetry_within_its_wall_time_budget(live, tmp_path, planning_model, kind):
    # The daemon gives the MPC a wall clock (the bench counts evaluations instead): plans come from
    # live scraped telemetry, are applied, explained, and an operator pin is planned around; on the
    # queueing prior or on the learned models of the daemon's model slot.
    scenario, fleet, info = live
    services = build_services(settings_for(scenario, info, None, tmp_path / "state", source="scrape", policy="mpc",
                                           policy_params={"planning_model": planning_model}),
                              clock=WallClock(), logger=logging.getLogger("test"))
    try:
        daemon = services.daemon

        def planned():
            rep = daemon.tick()
            ok = rep.outcome.status == "applied" and rep.observation.pools["small"].arrival_rps.ok
            return rep if ok else None

        rep = wait_until(planned, deadline_s=40, interval_s=0.5, what="an MPC decision applied on live telemetry")
        diag = rep.result.diagnostics
        assert diag["policy"] == "mpc" and diag["evaluations"] > 0
        assert diag["model"]["kind"] == kind and "learned_unusable" not in diag["model"]
        # the search shows on the daemon's own metrics
        reg = services.metrics.registry
        assert reg.get_sample_value("governor_planner_candidates") == diag["evaluations"]
        cut = reg.get_sample_value("governor_planner_budget_cut_total")
        assert cut is not None and cut >= (1 if diag["budget_exhausted"] else 0)
        assert 1 <= rep.result.decision.pools["small"].replicas <= 4
        services.store.add_override("pin_replicas", ttl_s=600, author="e2e", now_s=WallClock().now_s(), value=2,
                                    pool="small", known_pools=["small"])
        rep = daemon.tick()
        assert rep.result.decision is not None
        assert rep.result.decision.pools["small"].replicas == 2
        assert any(r.code == "binding_pin" for r in rep.result.policy_reasons)
        with fleet.lock:
            assert fleet.fleet.pool_states()["small"].target_replicas == 2
        rows = services.store.list_decisions(limit=3, since_s=0, pool="")
        assert rows and rows[0].outcome == "applied"
    finally:
        services.close()
