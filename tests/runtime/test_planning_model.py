"""The daemon's composition root hands the MPC its model slot when `planning_model: learned`."""

from __future__ import annotations

import logging

from controller.clock import WallClock
from controller.config import Settings
from controller.core.coupling import CouplingModels
from controller.core.mpc_model import LearnedPlanModel
from controller.learning.physics import physics_for_pool_spec
from controller.policies.mpc import MpcPolicy
from controller.runtime.learning import Learning
from controller.runtime.main import build_controller
from tests.policies.builders import decide, inp

POOLS = [{"name": "chat", "model": "llama-3-8b", "sku": "a100-80gb", "gpus_per_replica": 1, "usd_per_gpu_hour": 4.1,
          "min_replicas": 1, "max_replicas": 8, "startup_warm_s": 20, "startup_cold_s": 90}]


def test_learned_planning_reads_the_daemons_model_slot(tmp_path):
    settings = Settings(policy="mpc", policy_params={"planning_model": "learned"}, state_dir=str(tmp_path),
                        pools=POOLS)
    fleet = settings.fleet_spec()
    learning = Learning(fleet, tmp_path, clock=WallClock(), logger=logging.getLogger("test"))
    policy = build_controller(settings, learning).policy
    assert isinstance(policy, MpcPolicy) and policy.coupling_source is not None
    assert learning.slot.get().source == "shipped"
    assert policy.coupling_source() is learning.slot.get().coupling
    # the shipped models know the pool's engine: the planner plans on them, not the prior
    model, unusable = policy._plan_model(fleet, policy._prior(fleet))
    assert unusable is None and type(model).__name__ == "LearnedPlanModel"
    out = None
    state = policy.initial_state()
    for k in range(1, 4):  # a few ticks of a busy pool, planned on the shipped models
        state, out = decide(policy, state, inp(15.0 * k, {"chat": dict(ready=2, rps=12.0, prompt=12.0 * 1100,
                                                                        gen=12.0 * 210, hit_rate=0.3, tpot=0.04,
                                                                        ttft=0.4, waiting=0.0, running=40, kv=0.3)},
                                                fl=fleet, current={"chat": 2}))
    assert out is not None
    assert out.diagnostics["model"]["kind"] == "LearnedPlanModel"
    model = out.diagnostics["model"]
    assert model["planning_model"] == "learned" and "learned_unusable" not in model
    # a refit swapped in is what the next tick reads
    refit = CouplingModels.prior_only([physics_for_pool_spec(p) for p in fleet.pools])
    learning.slot.swap(coupling=refit)
    assert policy.coupling_source() is refit
    swapped = policy._plan_model(fleet, policy._prior(fleet))[0]
    assert isinstance(swapped, LearnedPlanModel) and swapped.models is refit


def test_the_default_planning_model_is_the_prior(tmp_path):
    settings = Settings(policy="mpc", state_dir=str(tmp_path), pools=POOLS)
    learning = Learning(settings.fleet_spec(), tmp_path, clock=WallClock(), logger=logging.getLogger("test"))
    policy = build_controller(settings, learning).policy
    assert isinstance(policy, MpcPolicy)
    assert policy.planning_model == "prior" and policy.coupling_source is None


class _OneReading:
    """A telemetry source that always reads the same busy pool (the daemon's source contract)."""

    name = "fixed"

    def read(self, now_s: float):
        from controller.types import FleetObservation
        from tests.policies.builders import obs_row

        row = obs_row("chat", ready=2, rps=12.0, prompt=12.0 * 1100, gen=12.0 * 210, hit_rate=0.3, tpot=0.04,
                      ttft=0.4, waiting=0.0, running=40, kv=0.3)
        return FleetObservation(at_s=now_s, pools={"chat": row})

    def health(self):
        return True, "ok"


def test_status_names_the_model_the_planner_used(tmp_path):
    """`governor status` shows what the MPC planned its last tick with, and its stream guard."""
    from controller.actuation.shadow import ShadowActuator
    from controller.api.store import StateStore
    from controller.clock import VirtualClock
    from controller.obs.daemon_metrics import DaemonMetrics
    from controller.runtime.daemon import Daemon
    from controller.types import Mode

    settings = Settings(policy="mpc", policy_params={"planning_model": "learned"}, state_dir=str(tmp_path),
                        pools=POOLS)
    clock = VirtualClock(1000.0)
    learning = Learning(settings.fleet_spec(), tmp_path, clock=clock, logger=logging.getLogger("test"))
    store = StateStore(tmp_path / "governor.db")
    try:
        daemon = Daemon(controller=build_controller(settings, learning), source=_OneReading(), actuator=None,
                        shadow=ShadowActuator(clock=clock), store=store, metrics=DaemonMetrics(), clock=clock,
                        logger=logging.getLogger("test"), mode=Mode.SHADOW, learning=learning)
        daemon.tick()
        details = dict(daemon.status().details)
        assert details["planner.model"] == "learned: LearnedPlanModel"
        assert details["models.source"] == "shipped"
        # the stream guard's standing ceiling on the in-flight cap, per pool
        assert details["planner.stream_guard.chat"].startswith("in-flight cap at most ")
    finally:
        store.close()
