"""Fleet faults on the simulator (controller/sim, seeded, virtual time): a crash at peak load, a whole pool
lost, a 5× surge within one minute, and a telemetry blackout during the surge. The figures these scenarios
give (SLO attainment, cost) belong to the MPC and planner benches; this checks that no fault makes Governor
take an unsafe action:

- no scale-down of a pool whose telemetry is not ok (missing, partial, stale);
- no streaming request cut by a drain (every replica retired as drained had nothing in flight);
- no stale generation applied: every decision goes through the simulator's actuator side
  (controller/sim/control_plane.py, the same messages the gRPC actuator sends) and is acked APPLIED; a
  replayed older decision afterwards is refused and changes nothing.

The loop is the bench's closed loop (controller/bench/runner.py) with the checks between its steps.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from controller.actuation.grpc_actuator import routing_policy_for, scaling_plan_for
from controller.bench.observe import SimObserver
from controller.clock import VirtualClock
from controller.core.guards import GuardConfig
from controller.core.step import Controller, TickInput
from controller.gen.governor.v1 import control_pb2 as pb
from controller.policies.registry import build_policy
from controller.sim.control_plane import ControlPlane
from controller.sim.fleet import Fleet
from controller.sim.fleetspec import fleet_spec_from_scenario
from controller.types import FleetObservation, PoolObservation
from tests.fakes.sim_fleet import pool, scenario, workload

TICK_S = 15.0
BASE_RPS = 4.0
END_S = 480.0
PEAK_S = 200.0  # the surge (and the crash) come here


def _arrivals(seed: int, surge: bool) -> list[float]:
    """Poisson arrivals at BASE_RPS; with `surge`, the rate rises to 5× within 60 s of PEAK_S and holds 2 min."""
    rng = np.random.default_rng(seed)
    out, t = [], 0.0
    while t < END_S - 60:
        rate = BASE_RPS
        if surge and t >= PEAK_S:
            rate = BASE_RPS * (1 + 4 * min(1.0, (t - PEAK_S) / 60.0)) if t < PEAK_S + 180 else BASE_RPS
        t += float(rng.exponential(1.0 / rate))
        out.append(t)
    return out


CASES: dict[str, dict[str, Any]] = {
    "crash-at-peak": dict(surge=True, faults=[{"kind": "crash", "pool": "a", "at_s": PEAK_S + 60, "count": 2}]),
    "pool-lost": dict(surge=False, faults=[{"kind": "preempt", "pool": "b", "at_s": PEAK_S, "count": 2}]),
    "surge-5x": dict(surge=True, faults=[]),
    "surge-5x-telemetry-blackout": dict(surge=True, faults=[], blackout=(PEAK_S + 120, PEAK_S + 180)),
}


def _blind(obs: FleetObservation) -> FleetObservation:
    """What a dead Prometheus gives: every pool and class missing, an error."""
    return FleetObservation(at_s=obs.at_s, pools={p: PoolObservation(pool=p) for p in obs.pools},
                            source=obs.source, errors=("telemetry: connection refused",))


@pytest.mark.parametrize("case", list(CASES))
def test_no_fleet_fault_makes_governor_act_unsafely(case):
    spec = CASES[case]
    sc = scenario([pool("a", replicas=3, min_replicas=1, max_replicas=12),
                   pool("b", replicas=2, min_replicas=0, max_replicas=12)], faults=spec["faults"])
    fleet = Fleet(sc, seed=3, workload=workload(_arrivals(3, spec["surge"]), 1000, 120))
    retired: list[tuple[str, int, bool]] = []
    retire = fleet._retire

    def recording_retire(inst, why):  # what each replica had in flight when it went
        eng = inst.engine
        retired.append((why, eng.inflight if eng is not None else 0, bool(eng is not None and eng.seg_kind != 0)))
        retire(inst, why)

    fleet._retire = recording_retire  # type: ignore[method-assign]
    observer = SimObserver(fleet, window_s=60.0)
    fspec = fleet_spec_from_scenario(sc)
    controller = Controller(fspec, build_policy("slo-feedback", fspec, {}),
                            guards=GuardConfig(max_step_up=4, max_step_down=1, scale_down_stabilization_s=60.0),
                            decision_validity_s=60.0, seed=3, tick_s=TICK_S)
    clock = VirtualClock(0.0)
    plane = ControlPlane(fleet, threading.RLock(), clock)
    state = controller.initial_state()
    prev = None
    checked_not_ok = 0
    acks: list[int] = []
    for k in range(1, int(END_S // TICK_S)):
        t = k * TICK_S
        fleet.run_until(t)
        clock.advance(t - clock.now_s())
        obs = observer.read(t)
        blackout = spec.get("blackout")
        if blackout and blackout[0] <= t < blackout[1]:
            obs = _blind(obs)
        state, result = controller.step(state, TickInput(now_s=t, observation=obs,
                                                         fleet_state=observer.fleet_state()))
        d = result.decision
        assert d is not None
        if prev is not None:
            for p, status in result.telemetry.items():
                if status != "ok" and p in prev.pools:
                    checked_not_ok += 1
                    assert d.pools[p].replicas >= prev.pools[p].replicas, (case, t, p, status)
        for ack in (plane.apply_scaling(scaling_plan_for(d, "governor")),
                    plane.apply_routing(routing_policy_for(d, "governor"))):
            assert ack.status == pb.ACK_STATUS_APPLIED, (case, t, ack.message)
            acks.append(d.generation)
        prev = d
    fleet.run_until(END_S)

    drained = [r for r in retired if r[0] == "drained"]
    assert drained, case  # the loop did scale down, so the drain check below checked something
    assert all(inflight == 0 and not busy for _, inflight, busy in drained), (case, drained)
    assert acks == sorted(acks)
    # a late copy of an older decision (a deposed controller, a delayed packet) is refused and changes nothing
    assert prev is not None
    before = {n: s.target_replicas for n, s in fleet.pool_states().items()}
    stale = replace(prev, generation=prev.generation - 1, decision_id="d-old",
                    pools={p: replace(pd, replicas=pd.replicas + 3) for p, pd in prev.pools.items()})
    ack = plane.apply_scaling(scaling_plan_for(stale, "governor"))
    assert ack.status == pb.ACK_STATUS_STALE_GENERATION
    assert {n: s.target_replicas for n, s in fleet.pool_states().items()} == before
    if case == "surge-5x-telemetry-blackout":
        assert checked_not_ok >= 2 * len(fspec.pools)  # the blackout ticks were checked
    summary = fleet.summary().to_dict()
    if not spec["faults"]:
        assert summary["failed"] == 0, summary  # nothing crashed, so nothing may fail: no drain cut a stream
    if case == "pool-lost":
        assert any(r[0] == "preempt" for r in retired)
