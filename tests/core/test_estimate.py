"""The estimate stage: the autoscaler's replica phases join the telemetry, one rule for every driver."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from controller.core.estimate import estimate, target_in_force
from controller.core.step import Controller, TickInput
from controller.types import Decision, FleetObservation, FleetSpec, PoolDecision, PoolObservation, PoolSpec, Reading
from tests.fakes.core_policy import ScriptedPolicy


@dataclass(frozen=True)
class _Phases:
    ready: int
    starting: int
    draining: int


def _obs(**pools: PoolObservation) -> FleetObservation:
    return FleetObservation(at_s=10.0, pools=pools)


@pytest.mark.parametrize("label, reading, phases, want_ready, zero", [
    ("scaled to zero: missing ready reads 0", PoolObservation("a"), _Phases(0, 0, 0), 0.0, ("a",)),
    ("replicas up: a missing reading stays missing", PoolObservation("a"), _Phases(2, 0, 0), None, ()),
    ("starting only: still missing (an engine is on its way)", PoolObservation("a"), _Phases(0, 1, 0), None, ()),
    ("draining only: still missing", PoolObservation("a"), _Phases(0, 0, 1), None, ()),
    ("a reading is kept as read", PoolObservation("a", replicas_ready=Reading(3.0)), _Phases(0, 0, 0), 3.0, ()),
])
def test_fleet_state_merge(label, reading, phases, want_ready, zero):
    est = estimate(None, _obs(a=reading), {"a": phases}, 10.0)
    p = est.observation.pools["a"]
    assert (p.replicas_ready.value if p.replicas_ready.ok else None) == want_ready, label
    assert (p.replicas_starting.value, p.replicas_draining.value) == (phases.starting, phases.draining), label
    assert est.scaled_to_zero == zero, label


def test_no_fleet_state_leaves_the_observation_as_read_and_unknown_pools_are_added():
    obs = _obs(a=PoolObservation("a"))
    assert estimate(None, obs, None, 10.0).observation is obs
    assert estimate(None, obs, {}, 10.0).observation is obs
    est = estimate(None, obs, {"b": _Phases(1, 0, 0)}, 10.0)
    assert set(est.observation.pools) == {"a", "b"}
    assert not est.observation.pools["a"].replicas_starting.ok  # not reported: unknown


def test_target_in_force_prefers_the_decision_then_the_fleet_then_the_minimum():
    spec = PoolSpec("a", "llama-3-8b", "a100-80gb", min_replicas=2)
    seen = _obs(a=PoolObservation("a", replicas_ready=Reading(3.0), replicas_starting=Reading(1.0)))
    d = Decision("d", 1, 0.0, 60.0, pools={"a": PoolDecision(5)})
    assert target_in_force(d, seen, spec) == (5, "decision")
    assert target_in_force(None, seen, spec) == (4, "observed")
    assert target_in_force(None, _obs(), spec) == (2, "pool_min")


def test_step_hands_the_policy_the_estimate():
    fleet = FleetSpec(pools=(PoolSpec("a", "llama-3-8b", "a100-80gb", min_replicas=0),), slos={})
    pol = ScriptedPolicy({"a": 1})
    c = Controller(fleet, pol)
    _, res = c.step(c.initial_state(), TickInput(now_s=10.0, observation=_obs(a=PoolObservation("a")),
                                                  fleet_state={"a": _Phases(0, 0, 0)}))
    assert res.estimate.scaled_to_zero == ("a",)
    assert res.estimate.observation.pools["a"].replicas_ready.value == 0.0
    assert res.telemetry["a"] != "missing"
    assert pol.seen[-1].observation.pools["a"].replicas_ready.value == 0.0  # what the policy saw
