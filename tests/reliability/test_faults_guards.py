"""The guardrails the config now reaches (guards.max_concurrent_drains, guards.min_confidence), through a daemon
tick: the daemon is built from the config as `governor run` builds it, on the loopback fleet; the drains in
progress come from the autoscaler's GetFleetState, the confidence from the policy's output.

The policy is the scripted one (tests/fakes/core_policy.py) under the config's guards: it proposes a
scale-down every tick and reports the confidence it is given, so each test shows the guard deciding.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from controller.config import ConfigError, Settings
from controller.core.step import Controller
from controller.types import PolicyOutput
from tests.fakes.core_policy import ScriptedPolicy
from tests.fakes.fault_fleet import FaultFleet, Governed, fault_settings


@dataclass
class ConfidentPolicy(ScriptedPolicy):
    """The scripted policy, reporting a model confidence as the MPC does."""

    confidence: float = 1.0

    def decide(self, state, inp, rng):
        state, out = super().decide(state, inp, rng)
        return state, PolicyOutput(pools=out.pools, reasons=out.reasons, diagnostics=out.diagnostics,
                                   confidence=self.confidence)


def _governed(fleet, tmp_path, guards, policy) -> Governed:
    g = Governed(fleet, tmp_path / "state", tick_s=3.0, guards=guards)
    built = g.daemon.controller
    assert built.guards.max_concurrent_drains == guards.get("max_concurrent_drains")  # from the config
    assert built.guards.min_confidence == guards.get("min_confidence", 0.0)
    g.daemon.reload(Controller(built.fleet, policy, guards=built.guards, decision_validity_s=built.decision_validity_s,
                               tick_s=built.tick_s))
    return g


GUARDS = {"max_step_up": 4, "max_step_down": 4, "scale_down_stabilization_s": 0}


@pytest.mark.parametrize(("draining", "expected"), [(0, 6), (1, 7), (2, 8)])
def test_max_concurrent_drains_waits_for_the_drains_in_progress(tmp_path, draining, expected):
    """8 replicas, the policy wants 4, at most 2 may drain at once: with 0, 1 or 2 already draining the tick
    removes 2, 1 or none."""
    with FaultFleet({"a": (8, 4.0)}, seed=1) as fleet:
        fleet.advance(3.0)
        policy = ScriptedPolicy({"a": 8})
        with _governed(fleet, tmp_path, {**GUARDS, "max_concurrent_drains": 2}, policy) as g:
            g.tick()
            g.tick()  # in force: 8 (and the telemetry has its rates)
            policy.replicas = {"a": 4}
            fleet.control.autoscaler.draining = {"a": draining}
            rep = g.tick()
            assert rep.observation.pools["a"].replicas_draining.value == draining
            assert rep.result.decision.pools["a"].replicas == expected
            assert fleet.commanded()["a"] == expected  # on the wire
            codes = [a.code for a in rep.result.guard_adjustments]
            assert ("guard_drain_in_progress" in codes) == (expected != 4)
            assert g.metric("governor_guard_adjustments_total", {"code": "guard_drain_in_progress"}) == (
                1.0 if expected != 4 else None)


@pytest.mark.parametrize(("confidence", "held"), [(0.9, False), (0.3, True)])
def test_low_confidence_holds_the_scale_down(tmp_path, confidence, held):
    with FaultFleet({"a": (8, 4.0)}, seed=1) as fleet:
        fleet.advance(3.0)
        policy = ConfidentPolicy({"a": 8}, confidence=confidence)
        with _governed(fleet, tmp_path, {**GUARDS, "min_confidence": 0.5}, policy) as g:
            g.tick()
            g.tick()
            policy.replicas = {"a": 5}
            rep = g.tick()
            assert rep.result.decision.pools["a"].replicas == (8 if held else 5)
            assert ("guard_low_confidence_hold" in [a.code for a in rep.result.guard_adjustments]) == held
            policy.replicas = {"a": 9}  # a scale-up only adds protection: it passes either way (within the step)
            rep = g.tick()
            assert rep.result.decision.pools["a"].replicas == 9


def test_the_new_guard_keys_are_checked_by_the_config(tmp_path):
    with FaultFleet({"a": (1, 1.0)}) as fleet:
        ok = fault_settings(fleet, tmp_path, guards={"min_confidence": 0.4, "max_concurrent_drains": 3})
        assert ok.guards.min_confidence == 0.4 and ok.guards.max_concurrent_drains == 3
        data = ok.model_dump(mode="json")
        for bad, field in (({"min_confidence": 1.5}, "guards.min_confidence"),
                           ({"max_concurrent_drains": 0}, "guards.max_concurrent_drains")):
            with pytest.raises((ConfigError, ValueError), match=field.split(".")[1]):
                Settings(**{**data, "guards": {**data["guards"], **bad}})
