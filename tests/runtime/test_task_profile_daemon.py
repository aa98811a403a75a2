"""The daemon hands the pickers' measured step profile to the planner: a real picker's /metrics page, read by the
daemon's cost tracker each tick (controller/obs/task_cost.py), reaches the MPC's next tick as `TickInput.tasks`
(controller/runtime/daemon.py `_task_profile`) and the explain record's `tasks` shows what it planned with."""

from __future__ import annotations

import logging

from prometheus_client import generate_latest

from controller.actuation.shadow import ShadowActuator
from controller.api.store import StateStore
from controller.clock import VirtualClock
from controller.config import Settings
from controller.dataplane.server import PickerConfig, PickerService
from controller.dataplane.task_book import Identity
from controller.obs.daemon_metrics import DaemonMetrics
from controller.obs.task_cost import CostTracker, PickerTasksReader
from controller.runtime.daemon import Daemon
from controller.runtime.learning import Learning
from controller.runtime.main import build_controller
from tests.runtime.test_memory_status import POOLS, _Fixed


def _agents(svc: PickerService, tasks: range) -> None:
    """Tasks of three steps whose contexts grow (1k, 2k, 3k tokens), through the real picker."""
    p, s = svc.picker, svc.settings()
    for t in tasks:
        for step in range(3):
            r = p.route("standard", "", s, 0.0, ident=Identity("acme", f"t{t}", step, 3), tokens=1000.0 * (step + 1))
            assert r.endpoint is not None
            p.finish(r.endpoint, s, r.ticket, ok=True)


def test_the_pickers_profile_reaches_the_next_tick(tmp_path):
    settings = Settings(policy="mpc", state_dir=str(tmp_path), pools=POOLS)
    clock = VirtualClock(1000.0)
    learning = Learning(settings.fleet_spec(), tmp_path, clock=clock, logger=logging.getLogger("test"))
    store = StateStore(tmp_path / "governor.db")
    svc = PickerService(PickerConfig(groups={"g": ["a"]}, endpoints={"a": ["10.0.0.1:8000"]}))
    tracker = CostTracker({p.name: 1.0 for p in settings.fleet_spec().pools},
                          PickerTasksReader(["picker"], lambda _u, _t: generate_latest(svc.registry).decode()))
    daemon = Daemon(controller=build_controller(settings, learning), source=_Fixed(0.5), actuator=None,
                    shadow=ShadowActuator(clock=clock), store=store, metrics=DaemonMetrics(), clock=clock,
                    logger=logging.getLogger("test"), mode=settings.mode, learning=learning, costs=tracker)
    try:
        seen = []
        for k in range(3):
            _agents(svc, range(10 * k, 10 * k + 10))
            clock.advance(15.0)
            seen.append(daemon.tick().result)
        # the tracker reads after each step: tick 2 plans with the increase between the readings of ticks 0 and 1
        assert seen[0].estimate.tasks is None and seen[1].estimate.tasks is None
        assert seen[2].estimate.tasks is not None
        prof = seen[2].diagnostics["tasks"]["profile"]
        assert prof["classes"]["standard"]["tasks"] == [0.0, 0.0, 1.0]
        assert prof["classes"]["standard"]["tokens"] == [1000.0, 2000.0, 3000.0]
        # 1 + (0 + 1k + 3k) / (1k + 2k + 3k): what a lost standard request takes with it
        assert seen[2].diagnostics["tasks"]["task_loss"]["standard"] == 1.0 + 4000.0 / 6000.0
    finally:
        store.close()
