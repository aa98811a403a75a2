"""The lever table (controller/levers.py) is the one declaration of a lever.

- it agrees with the decision types, the proto and the MPC's names for what it holds;
- a lever added through the table alone (and the decision field it names) is carried end to end:
  a policy decides it, the controller's guards keep it, the simulator's in-process control plane
  validates it against the table's bounds and sets it on the simulated router, the scenario's reset
  puts the table's default back, and the live control plane's view holds it too.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from controller import levers as lever_table
from controller.bench.observe import SimObserver
from controller.core.guards import GuardConfig
from controller.core.mpc.problem import LEVERS as MPC_FIXED_LEVERS
from controller.core.step import Controller, TickInput
from controller.gen.governor.v1 import control_pb2 as pb
from controller.levers import LEVERS, REPLICA_COMMANDS, Carrier, Lever, carried_by, lever
from controller.rpc import lever_wire
from controller.sim.control import apply_decision
from controller.sim.fleet import Fleet
from controller.sim.fleetspec import fleet_spec_from_scenario
from controller.types import ClassAdmission, PolicyInput, PolicyOutput, PoolDecision, TenantLimits
from tests.fakes.sim_fleet import pool, scenario, workload


def test_the_table_names_every_decision_field_once_with_its_default():
    for cls, scope in ((PoolDecision, "pool"), (ClassAdmission, "class"), (TenantLimits, "tenant")):
        names = {f.name for f in dataclasses.fields(cls)} - set(REPLICA_COMMANDS)  # per replica: not levers
        fields = {f.name: f.default for f in dataclasses.fields(cls)
                  if f.default is not dataclasses.MISSING and f.name in names}
        table = {lv.field: lv.default for lv in LEVERS if lv.scope == scope and lv.field in fields}
        assert {lv.field for lv in LEVERS if lv.scope == scope} == names
        assert table == fields, cls.__name__


def test_every_lever_on_the_wire_names_a_proto_field_of_its_kind():
    for lv in LEVERS:
        assert lv.proto is not None, lv.name
        desc = getattr(pb, lv.message).DESCRIPTOR
        for name in lv.path[:-1]:
            desc = desc.fields_by_name[name].message_type
        f = desc.fields_by_name[lv.path[-1]]
        assert (f.cpp_type == f.CPPTYPE_DOUBLE) == (lv.kind is float), lv.name


def test_the_mpc_holds_the_levers_the_table_plans_and_carriers_answer_by_component():
    assert MPC_FIXED_LEVERS == ("affinity", "inflight_cap", "traffic_split", "standby", "batch_caps", "admission")
    assert [lv.name for lv in carried_by([Carrier.KUBERNETES])] == [
        "replicas", "warm_standby", "max_num_seqs", "max_num_batched_tokens"]
    assert [lv.name for lv in carried_by(["keda"])] == ["replicas"]
    assert {lv.service for lv in carried_by([Carrier.PICKER])} == {"router"}


def test_a_lever_checks_its_bounds_and_says_what_its_unset_value_means():
    assert lever("inflight_cap").problem(-1) == "must be >= 0 (0 = no cap)"
    assert lever("inflight_cap").problem(2.5) == "must be >= 0 (0 = no cap)"  # an int lever takes ints only
    assert lever("queue_budget").problem(-1) is None
    assert lever("queue_budget").problem(-2) == "must be >= -1 (-1 = unlimited)"
    assert lever("shed_frac").problem(1.5) == "is outside [0, 1]"
    assert lever("prefix_weight").problem(float("nan")) == "must be a finite number >= 0"
    assert lever("tenant_weight").problem(0.0) == "must be a finite number > 0"
    assert lever("inflight_cap").show(0) == "none" and lever("inflight_cap").show(12) == "12"


def test_the_wire_mapping_round_trips_every_lever():
    pd = PoolDecision(replicas=3, warm_standby=1, inflight_cap=7, traffic_weight=0.4, prefix_weight=1.5,
                      queue_weight=0.5, kv_weight=0.25, max_num_seqs=64, max_num_batched_tokens=4096)
    for message in ("PoolRouting", "PoolScaling"):
        msg = lever_wire.build(message, {"pool": "a"}, pd)
        assert lever_wire.values(msg, message) == {lv.name: getattr(pd, lv.field)
                                                   for lv in LEVERS if lv.message == message}
    # a RoutingPolicy without scorer weights leaves those levers as they are
    assert set(lever_wire.values(pb.PoolRouting(pool="a", traffic_weight=1.0), "PoolRouting")) == {
        "traffic_weight", "inflight_cap"}


# --------------------------------------------------------------------------- a lever added through the table


DUMMY = Lever("dummy_weight", "pool", "dummy_weight", None, frozenset({Carrier.SIMULATOR}), float, 0.5, hi=4.0,
              label="dummy weight")


@dataclass(frozen=True, slots=True)
class DummyPoolDecision(PoolDecision):
    """The decision field the new lever names."""

    dummy_weight: float = 0.5


class DummyPolicy:
    """Turns the dummy lever through a schedule, holding replicas."""

    name = "dummy"

    def __init__(self, schedule: list[float]) -> None:
        self.schedule = schedule

    def initial_state(self) -> int:
        return 0

    def decide(self, state: int, inp: PolicyInput, rng: np.random.Generator) -> tuple[Any, PolicyOutput]:
        v = self.schedule[min(state, len(self.schedule) - 1)]
        pools = {p.name: DummyPoolDecision(replicas=1, dummy_weight=v) for p in inp.fleet.pools}
        return state + 1, PolicyOutput(pools=pools)


def _dummy(routes: dict[str, Any]) -> dict[str, float]:
    """The dummy lever's value on each pool's simulated router."""
    return {n: getattr(r, DUMMY.name) for n, r in routes.items()}


@pytest.fixture
def dummy_lever(monkeypatch: pytest.MonkeyPatch) -> Lever:
    monkeypatch.setattr(lever_table, "LEVERS", (*LEVERS, DUMMY))
    return DUMMY


def test_a_lever_added_to_the_table_alone_is_carried_end_to_end_in_the_simulator(dummy_lever: Lever):
    sc = scenario([pool("a", replicas=1), pool("b", replicas=1)])
    fleet = Fleet(sc, seed=1, workload=workload([float(t) for t in range(0, 120, 2)], 512, 32))
    routes = {name: p.route for name, p in fleet.pools.items()}
    assert _dummy(routes) == {"a": 0.5, "b": 0.5}  # the table's default

    schedule = [1.0, 2.5, 3.75]
    observer = SimObserver(fleet, window_s=30.0)
    ctl = Controller(fleet_spec_from_scenario(sc), DummyPolicy(schedule), guards=GuardConfig(), seed=1, tick_s=15.0)
    state = ctl.initial_state()
    seen = []
    for k in range(1, 4):
        t = 15.0 * k
        fleet.run_until(t)
        state, result = ctl.step(state, TickInput(now_s=t, observation=observer.read(t),
                                                  fleet_state=observer.fleet_state()))
        assert result.decision is not None
        apply_decision(fleet, result.decision)
        seen.append(_dummy(routes))
    assert seen == [{"a": v, "b": v} for v in schedule]

    # the table's bounds hold: nothing of an out-of-range decision is applied
    assert result.decision is not None
    bad = dataclasses.replace(result.decision, pools={"a": DummyPoolDecision(replicas=2, dummy_weight=9.0)})
    with pytest.raises(ValueError, match=r"dummy_weight = 9.0 is outside \[0, 4\]"):
        apply_decision(fleet, bad)
    assert _dummy(routes)["a"] == 3.75 and fleet.pools["a"].target == 1

    # a fallback to the scenario's controls restores the table's default
    fleet.reset_controls()
    assert _dummy(routes) == {"a": 0.5, "b": 0.5}


def test_the_live_control_plane_keeps_an_added_lever_in_its_view_and_off_the_wire(dummy_lever: Lever):
    import threading

    from controller.clock import VirtualClock
    from controller.sim.control_plane import ControlPlane

    fleet = Fleet(scenario([pool("a", replicas=1)]), seed=1, workload=workload([0.0], 64, 4))
    plane = ControlPlane(fleet, threading.RLock(), VirtualClock(0.0))
    assert plane.views.routing["a"]["dummy_weight"] == 0.5
    out = plane.routing_policy()
    assert [p.pool for p in out.pools] == ["a"] and out.pools[0].traffic_weight == 1.0  # no proto field: not sent
