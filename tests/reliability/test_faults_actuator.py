"""Actuator faults: the daemon's gRPC actuator (controller/actuation/grpc_actuator.py) against the simulator's
actuator side (controller/sim/control_plane.py: generations, replays, validity deadlines) over real loopback
gRPC, with faults injected in front of it: refusing, timing out after applying, hanging, answering out of
order, restarting with its state lost, and the controller disappearing.

Expected (issue 21): bounded retries within the tick's deadline, no duplicate effect (each generation
applied once), a later tick reconciles, and the validity deadline makes the actuator fall back to its
defaults on its own when no newer command comes.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from concurrent import futures

import grpc
import pytest

from controller.actuation.grpc_actuator import GrpcActuator
from controller.clock import VirtualClock
from controller.gen.governor.v1 import control_pb2_grpc as pb_grpc
from controller.sim.control_plane import ControlPlane
from controller.types import Decision, PoolDecision
from tests.fakes.fault_fleet import FaultFleet, Governed
from tests.fakes.live_fleet import FakeFleet

T0 = 1_800_000_000.0
CALL_TIMEOUT_S = 0.3  # short, so a hung target costs the test little real time
HANG_LIMIT_S = 10.0  # a held handler gives up after this even if the test never releases it


class FaultyControl(pb_grpc.RouterControlServicer, pb_grpc.AutoscalerControlServicer):
    """Both control services in front of a ControlPlane, with scripted faults per call:
    "refuse" (UNAVAILABLE before anything is applied), "late" (applies, then answers after the client's
    deadline), "hang" (holds the call unapplied until released, then applies it: a delayed, out-of-order
    command). `restart()` swaps in a fresh plane over a fresh fleet: the actuator lost its state."""

    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock
        self.lock = threading.RLock()
        self.fleet = FakeFleet()
        self.plane = ControlPlane(self.fleet, self.lock, clock)
        self.faults: deque[str] = deque()
        self.release = threading.Event()
        self.calls = 0
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        pb_grpc.add_RouterControlServicer_to_server(self, self._server)
        pb_grpc.add_AutoscalerControlServicer_to_server(self, self._server)
        self.address = f"127.0.0.1:{self._server.add_insecure_port('127.0.0.1:0')}"
        self._server.start()

    def restart(self) -> None:
        with self.lock:
            self.fleet = FakeFleet()
            self.plane = ControlPlane(self.fleet, self.lock, self.clock)

    def _serve(self, context, apply):
        with self.lock:
            self.calls += 1
            fault = self.faults.popleft() if self.faults else ""
        if fault == "refuse":
            context.abort(grpc.StatusCode.UNAVAILABLE, "injected: refusing")
        if fault == "hang":
            self.release.wait(HANG_LIMIT_S)
            return apply()
        ack = apply()
        if fault == "late":
            time.sleep(CALL_TIMEOUT_S * 2)  # the handler's own delay: the client's deadline fires first
        return ack

    def ApplyRoutingPolicy(self, request, context):  # noqa: N802 - gRPC method name
        return self._serve(context, lambda: self.plane.apply_routing(request))

    def GetRoutingPolicy(self, request, context):  # noqa: N802 - gRPC method name
        return self.plane.routing_policy()

    def ApplyScalingPlan(self, request, context):  # noqa: N802 - gRPC method name
        return self._serve(context, lambda: self.plane.apply_scaling(request))

    def GetFleetState(self, request, context):  # noqa: N802 - gRPC method name
        return self.plane.fleet_state()

    def close(self) -> None:
        self.release.set()
        self._server.stop(0).wait()


@pytest.fixture
def rig():
    clock = VirtualClock(T0)
    ctl = FaultyControl(clock)
    act = GrpcActuator(ctl.address, ctl.address, clock=clock, call_timeout_s=CALL_TIMEOUT_S, retries=2,
                       backoff_s=0.05, issuer="governor/test")
    yield clock, ctl, act
    act.close()
    ctl.close()


def decision(gen: int, big: int = 3, small: int = 5, valid_for_s: float = 60.0, at_s: float = T0) -> Decision:
    return Decision(decision_id=f"d-{gen:08d}", generation=gen, at_s=at_s, valid_until_s=at_s + valid_for_s,
                    pools={"big": PoolDecision(replicas=big), "small": PoolDecision(replicas=small)})


def applied_targets(ctl: FaultyControl) -> list[dict[str, int]]:
    """Each scaling plan the fleet applied, as {pool: replicas} (one entry per applied command)."""
    out: list[dict[str, int]] = []
    for c in ctl.fleet.target_calls():
        if not out or c[1] in out[-1]:
            out.append({})
        out[-1][c[1]] = c[2]["replicas"]
    return out


def test_a_refusing_actuator_gets_bounded_retries_then_the_next_tick_applies(rig):
    clock, ctl, act = rig
    ctl.faults.extend(["refuse"] * 6)  # both targets refuse all three attempts
    out = act.apply(decision(1), deadline_s=clock.monotonic_s() + 2.7)
    assert out.status == "failed" and out.attempts == 6
    assert {t.code for t in out.targets.values()} == {"UNAVAILABLE"}
    assert ctl.fleet.target_calls() == []  # nothing half-applied
    out = act.apply(decision(2))  # the next tick reconciles: the whole desired state, a newer generation
    assert out.status == "applied"
    assert ctl.fleet.targets == {"big": 3, "small": 5}
    assert ctl.plane.fleet_state().applied_generation == 2


def test_an_answer_lost_after_applying_is_retried_without_a_second_effect(rig):
    _clock, ctl, act = rig
    ctl.faults.extend(["late", "late"])  # both targets apply, then answer after the deadline
    out = act.apply(decision(1))
    assert out.status == "applied", out.detail
    assert all(t.attempts == 2 and "earlier attempt" in t.detail for t in out.targets.values())
    assert applied_targets(ctl) == [{"big": 3, "small": 5}]  # applied once: the retry was a replay


def test_a_hung_actuator_costs_at_most_the_tick_deadline(rig):
    clock, ctl, act = rig
    ctl.faults.extend(["hang"] * 6)
    t0 = time.monotonic()
    out = act.apply(decision(1), deadline_s=clock.monotonic_s() + 2.7)
    wall = time.monotonic() - t0
    # three attempts of 0.3 s side by side (0.9 s) plus 0.15 s of backoff, never the sum over targets
    assert out.status == "failed" and {t.code for t in out.targets.values()} == {"DEADLINE_EXCEEDED"}
    assert wall < 3 * CALL_TIMEOUT_S + 0.15 + 0.6, wall
    assert all(t.attempts == 3 for t in out.targets.values())


def test_a_delayed_older_command_never_overrides_a_newer_one(rig):
    """Out of order: generation 1 is held in the network while generation 2 is applied; when 1 finally
    lands it is refused as stale and the fleet keeps 2."""
    _clock, ctl, act = rig
    ctl.faults.extend(["hang", "hang"])
    first = threading.Thread(target=act.apply, args=(decision(1, big=7, small=9),), daemon=True)
    first.start()
    deadline = time.monotonic() + 5
    while ctl.calls < 2 and time.monotonic() < deadline:
        time.sleep(0.01)  # waits on a condition (both held calls arrived), bounded
    ctl.faults.clear()
    ctl.faults.extend(["", "", "", ""])  # the retries of generation 1 and the calls of 2 pass
    slow = GrpcActuator(ctl.address, ctl.address, clock=VirtualClock(T0), call_timeout_s=2.0, retries=0)
    try:
        out = slow.apply(decision(2, big=2, small=4))
    finally:
        slow.close()
    assert out.status in ("applied", "stale"), out.detail
    ctl.release.set()  # generation 1's held calls land now
    first.join(10)
    assert ctl.fleet.targets == {"big": 2, "small": 4}
    state = ctl.plane.fleet_state()
    assert state.applied_generation == 2


def test_an_actuator_that_restarts_and_loses_state_is_reconciled_by_the_next_tick(rig):
    _clock, ctl, act = rig
    assert act.apply(decision(5, big=4, small=6)).status == "applied"
    ctl.restart()  # its fleet is back to the scenario's defaults, generation 0
    assert ctl.fleet.targets == {"big": 2, "small": 3}
    out = act.apply(decision(6, big=4, small=6))  # the next tick re-sends the whole desired state
    assert out.status == "applied"
    assert ctl.fleet.targets == {"big": 4, "small": 6}
    assert ctl.plane.fleet_state().applied_generation == 6
    assert act.apply(decision(6, big=4, small=6)).status == "replay"  # a repeat changes nothing
    assert len(applied_targets(ctl)) == 1


def test_the_validity_deadline_makes_the_actuator_fall_back_when_the_controller_disappears(rig):
    clock, ctl, act = rig
    assert act.apply(decision(1, big=6, small=10, valid_for_s=30.0)).status == "applied"
    assert ctl.fleet.targets == {"big": 6, "small": 10}
    clock.advance(29.0)
    assert ctl.plane.check_deadlines() == [] and not ctl.plane.fleet_state().fallback_active
    clock.advance(1.0)  # the controller is gone: no newer command before the deadline
    state = ctl.plane.fleet_state()
    assert state.fallback_active and ctl.fleet.resets == 1
    assert ctl.fleet.targets == {"big": 2, "small": 3}  # the scenario's own defaults, on its own
    # the controller comes back: its next decision takes over again
    assert act.apply(decision(2, big=5, small=8, at_s=clock.now_s())).status == "applied"
    assert ctl.fleet.targets == {"big": 5, "small": 8} and not ctl.plane.fleet_state().fallback_active


def test_a_failed_actuation_is_visible_and_a_later_daemon_tick_reconciles(tmp_path):
    """Through the daemon: the autoscaler refuses a whole tick; status and metrics say so; the next tick's
    decision (a newer generation) is applied and the fleet runs what was decided."""
    with FaultFleet({"a": (3, 6.0)}, seed=2) as fleet:
        fleet.advance(3.0)
        with Governed(fleet, tmp_path / "state", tick_s=3.0) as g:
            g.tick()
            g.tick()
            fleet.control.autoscaler.gate.faults.extend(["unavailable"] * 2)  # both attempts
            rep = g.tick()
            assert rep.outcome.status == "failed"
            assert rep.outcome.targets["autoscaler"].attempts == 2
            assert g.metric("governor_decisions_total", {"outcome": "failed"}) == 1.0
            status = g.daemon.status()
            assert not next(c for c in status.components if c.name == "actuator:grpc").healthy
            rep = g.tick()
            assert rep.outcome.status == "applied"
            assert fleet.commanded() == {"a": rep.result.decision.pools["a"].replicas}
            gens = [c.meta.generation for c in fleet.control.autoscaler.calls]
            assert gens == sorted(gens)  # never a stale generation sent
