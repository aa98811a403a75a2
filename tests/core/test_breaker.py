"""The cascading-failure breaker on hand-built telemetry sequences (loss, symptoms, escalation, relaxation)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from controller.core.breaker import BreakerConfig, BreakerState, apply_breaker, update_breaker
from controller.types import (
    BreakerAction,
    ClassAdmission,
    ClassObservation,
    FleetObservation,
    FleetSpec,
    Override,
    PoolDecision,
    PoolObservation,
    PoolSpec,
    Reading,
    SloSpec,
)

FLEET = FleetSpec(pools=(PoolSpec("a", "llama-3-70b", "h100-80gb", gpus_per_replica=4, max_replicas=16),),
                  slos={"critical": SloSpec(2.5, 0.1), "standard": SloSpec(5.0, 0.15), "sheddable": SloSpec(10.0, 0.3)})
CFG = BreakerConfig()


def obs(t: float, ready: float, *, starting: float = 0.0, hit: float = 0.3, ttft: float = 0.5, tpot: float = 0.07,
        retry: float = 0.0, waiting: float = 0.0, running: float = 200.0, draining: float = 0.0) -> FleetObservation:
    p = PoolObservation(pool="a", replicas_ready=Reading(ready), replicas_starting=Reading(starting),
                        replicas_draining=Reading(draining), hit_rate=Reading(hit), waiting=Reading(waiting),
                        running=Reading(running), arrival_rps=Reading(25.0))
    classes = {c: ClassObservation(priority_class=c, ttft_p95_s=Reading(ttft), tpot_p95_s=Reading(tpot),
                                   retry_rps=Reading(retry), shed_rps=Reading(0.0), arrival_rps=Reading(5.0))
               for c in ("critical", "standard", "sheddable")}
    return FleetObservation(at_s=t, pools={"a": p}, classes=classes)


def step(state, t, o, target=8, lost=None, cfg=CFG):
    return update_breaker(state, cfg, now_s=t, observation=o, fleet=FLEET, targets={"a": target},
                          lost=None if lost is None else {"a": lost})


def healthy(n=8, until=300.0):
    s = BreakerState()
    t = 0.0
    while t < until:
        t += 15.0
        s, a, _ = step(s, t, obs(t, n), lost=0)
    return s, t


def test_healthy_fleet_stays_closed():
    s, t = healthy()
    assert s.phase == "closed" and s.stage == 0 and s.trips == 0


def test_crash_pattern_trips_and_responds_as_a_unit():
    s, t = healthy()
    # 3 replicas crash: the fleet starts 3 replacements nobody ordered; hit rate and latency follow
    s, a, notes = step(s, t + 15, obs(t + 15, 5, starting=3, hit=0.15, ttft=3.0, tpot=0.14), lost=3)
    assert s.phase == "open" and s.stage == 2 and any("tripped" in n for n in notes)
    assert a.min_replicas == {"a": 8}  # replacements at once, never traded for cost
    assert a.max_prefix_weight["a"] <= 1.0  # moved prefixes spread by load, not piled up
    assert a.protect_streams and a.pools == ("a",)  # in-flight cap at the SLO-safe batch
    assert a.min_shed == {"sheddable": 0.5}  # sheddable before standard
    assert s.status().replica_floors == {"a": 8} and "replica loss" in s.status().trigger


def test_escalates_when_critical_stays_late_then_relaxes_in_steps():
    s, t = healthy()
    s, a, _ = step(s, t + 15, obs(t + 15, 5, starting=3, hit=0.1, ttft=3.0), lost=3)
    t += 15
    for _ in range(3):  # critical still late for 45 s → stage 3: shed all sheddable, some standard
        t += 15
        s, a, _ = step(s, t, obs(t, 5, starting=3, ttft=3.0), lost=0)
    assert s.stage == 3 and a.min_shed["sheddable"] == 1.0 and a.min_shed.get("standard", 0) > 0
    stages = []
    for _ in range(20):  # replacements up, latency back under the SLO: one stage per stable period
        t += 15
        s, a, _ = step(s, t, obs(t, 8, ttft=0.6, tpot=0.07), lost=0)
        stages.append(s.stage)
    assert stages[0] == 3 and stages[-1] == 0
    assert sorted(set(stages), reverse=True) == [3, 2, 1, 0]  # 3 → 2 → 1 (ramp) → closed
    assert not a.active


def test_planned_scale_down_is_not_a_loss():
    s, t = healthy()
    s, a, _ = step(s, t + 15, obs(t + 15, 5, ttft=3.0, draining=3), target=5, lost=0)
    assert s.phase == "closed"


def test_small_loss_without_symptoms_does_not_trip_but_a_big_one_does():
    s, t = healthy(n=10)
    s1, _, _ = step(s, t + 15, obs(t + 15, 8, starting=2), target=10, lost=2)
    assert s1.phase == "closed"  # 20 % lost, no symptom yet
    s2, _, _ = step(s, t + 15, obs(t + 15, 6, starting=4), target=10, lost=4)
    assert s2.phase == "open"  # 40 % lost: a trip by itself


def test_loss_inferred_from_ready_when_starting_is_unknown():
    s, t = healthy()
    o = obs(t + 15, 5, hit=0.1, ttft=3.0)
    o = FleetObservation(at_s=o.at_s, pools={"a": PoolObservation(**{**{f: getattr(o.pools["a"], f) for f in
                                                                       o.pools["a"].__dataclass_fields__},
                                                                    "replicas_starting": Reading.missing()})},
                         classes=o.classes)
    s, a, _ = step(s, t + 15, o, lost=None)
    assert s.phase == "open"


def test_overload_without_loss_trips_after_two_ticks():
    s, t = healthy()
    s, _, _ = step(s, t + 15, obs(t + 15, 8, ttft=4.0, waiting=100), lost=0)
    assert s.phase == "closed"
    s, a, notes = step(s, t + 30, obs(t + 30, 8, ttft=4.0, waiting=100), lost=0)
    assert s.phase == "open" and s.trigger.startswith("overload")
    assert a.protect_streams and not a.max_prefix_weight  # no cache was lost: affinity left alone
    assert a.min_replicas == {"a": 8}


def test_disabled_breaker_does_nothing():
    s, t = healthy()
    s2, a, notes = step(s, t + 15, obs(t + 15, 2, starting=6, ttft=9.0), lost=6, cfg=BreakerConfig(enabled=False))
    assert s2 == s and not a.active and notes == []


def test_config_validation():
    for bad in (dict(loss_frac=1.5), dict(stable_s=-1.0), dict(loss_min=0), dict(stable_s=math.inf)):
        try:
            BreakerConfig(**bad)
        except ValueError:
            continue
        raise AssertionError(f"{bad} accepted")


def test_two_pools_are_watched_separately():
    fl = FleetSpec(pools=(FLEET.pools[0], PoolSpec("b", "llama-3-8b", "a100-80gb")), slos=FLEET.slos)
    s = BreakerState()
    for t in (15.0, 30.0):
        o = obs(t, 8)
        o = FleetObservation(at_s=t, pools={"a": o.pools["a"], "b": replace(o.pools["a"], pool="b")}, classes=o.classes)
        s, a, _ = update_breaker(s, CFG, now_s=t, observation=o, fleet=fl, targets={"a": 8, "b": 8},
                                 lost={"a": 0, "b": 0})
    o = obs(45.0, 8)
    crash_b = replace(o.pools["a"], pool="b", replicas_ready=Reading(4.0), replicas_starting=Reading(4.0))
    o = FleetObservation(at_s=45.0, pools={"a": o.pools["a"], "b": crash_b}, classes=o.classes)
    s, a, _ = update_breaker(s, CFG, now_s=45.0, observation=o, fleet=fl, targets={"a": 8, "b": 8},
                             lost={"a": 0, "b": 4})
    assert s.phase == "open" and s.pools_hit == ("b",) and a.min_replicas == {"b": 8}


def test_big_loss_is_measured_against_the_replicas_serving_while_scaling_up():
    """7 serving, target raised to 11: losing 3 (43 % of what served, 27 % of the target) trips at once,
    without waiting for a symptom (the planner's own shedding may hide the symptoms)."""
    s, t = healthy(n=7)
    s, a, notes = step(s, t + 15, obs(t + 15, 4, starting=7), target=11, lost=3)
    assert s.phase == "open", notes
    assert "large replica loss" in s.status().trigger


def test_open_breaker_holds_until_the_lost_replicas_are_back():
    """Calm telemetry while 3 of 8 replicas are still starting is the shedding's doing: stay open (stage 2,
    sheddable floor kept); relax once the pool serves at its pre-loss size again."""
    s, t = healthy()
    s, a, _ = step(s, t + 15, obs(t + 15, 5, starting=3, hit=0.15, ttft=3.0, tpot=0.14), lost=3)
    t += 15
    phases = []
    for _ in range(12):  # 3 minutes of calm, replacements still starting
        t += 15
        s, a, _ = step(s, t, obs(t, 5, starting=3), lost=0)
        phases.append((s.phase, s.stage))
    assert set(phases) == {("open", 2)} and a.min_shed.get("sheddable", 0.0) >= 0.5
    for _ in range(16):  # replacements ready: relaxes in steps, then closes
        t += 15
        s, a, _ = step(s, t, obs(t, 8), lost=0)
    assert s.phase == "closed"


def test_lagging_p95_does_not_hold_the_shedding_once_the_fleet_carries_its_load():
    """After a surge the 60 s window still holds the drained backlog's TTFTs: critical reads 7 s with no
    queue left and every replica back. Told the fleet carries its load (the caller's model: the
    replicas the load needs are ready, no queue stands), the breaker stops the standard shedding at
    once and relaxes in steps; told nothing (None), the stale reading keeps stage 3 and the standard
    floor; told it does not carry it (False), likewise."""
    def run(carried):
        s, t = healthy()
        s, a, _ = step(s, t + 15, obs(t + 15, 5, starting=3, hit=0.1, ttft=3.0), lost=3)
        t += 15
        for _ in range(3):
            t += 15
            s, a, _ = step(s, t, obs(t, 5, starting=3, ttft=3.0), lost=0)
        assert s.stage == 3 and a.min_shed.get("standard", 0.0) > 0
        out = []
        for _ in range(8):  # two minutes: replicas back, queues empty, the window still reads 7 s
            t += 15
            s, a, _ = update_breaker(s, CFG, now_s=t, observation=obs(t, 8, ttft=7.0, waiting=0.0), fleet=FLEET,
                                     targets={"a": 8}, lost={"a": 0}, carried=carried)
            out.append((s.stage, a.min_shed.get("standard", 0.0)))
        return out

    carried = run(True)
    assert carried[0][1] == 0.0  # no standard floor from the first tick the fleet carries its load
    assert carried[-1][0] < 3 and [st for st, _ in carried] == sorted([st for st, _ in carried], reverse=True)
    for told in (None, False):
        assert all(st == 3 and std > 0 for st, std in run(told)), told


def test_an_overload_trip_is_not_relaxed_by_the_carried_judgement():
    """After an overload trip the calm may be the shedding's doing: the need the caller compares with
    counts only the admitted load. So a stale p95 still counts there, told carried or not (relaxing
    an overload trip early admits the next burst's sheddable traffic)."""
    s, t = healthy()
    for _ in range(2):
        t += 15
        s, _, _ = step(s, t, obs(t, 8, ttft=4.0, waiting=100), lost=0)
    assert s.phase == "open" and s.trigger.startswith("overload")
    for _ in range(6):
        t += 15
        s, a, _ = update_breaker(s, CFG, now_s=t, observation=obs(t, 8, ttft=4.0, waiting=0.0), fleet=FLEET,
                                 targets={"a": 8}, lost={"a": 0}, carried=True)
    assert s.phase == "open" and s.stage >= 2 and a.min_shed.get("sheddable", 0.0) >= 0.5



# --------------------------------------------------------------------------- applying the constraints

_OPEN = BreakerAction(min_replicas={"a": 8}, max_prefix_weight={"a": 1.0}, protect_streams=True, pools=("a",),
                      min_shed={"sheddable": 0.5})


@pytest.mark.parametrize("label, proposal, admission, overrides, want, shed, codes", [
    ("below the floor: raised; affinity capped; sheddable shed", PoolDecision(5, prefix_weight=3.0), {}, (),
     (8, 1.0), 0.5, {"guard_breaker_floor", "guard_breaker_spread", "guard_breaker_shed"}),
    ("within the constraints: unchanged (the MPC's case)", PoolDecision(9, prefix_weight=1.0),
     {"sheddable": ClassAdmission(shed_frac=0.5)}, (), (9, 1.0), 0.5, set()),
    ("a pin wins over the floor", PoolDecision(5, prefix_weight=1.0), {"sheddable": ClassAdmission(shed_frac=0.6)},
     (Override("o1", "pin_replicas", 5.0, pool="a"),), (5, 1.0), 0.6, set()),
    ("an operator ceiling bounds the floor", PoolDecision(5, prefix_weight=1.0), {},
     (Override("o1", "max_replicas", 6.0, pool="a"),), (6, 1.0), 0.5, {"guard_breaker_floor", "guard_breaker_shed"}),
    ("a frozen pool is left alone", PoolDecision(5, prefix_weight=1.0), {},
     (Override("o1", "freeze", pool="a"),), (5, 1.0), 0.5, {"guard_breaker_shed"}),
])
def test_apply_breaker_holds_a_proposal_to_the_constraints(label, proposal, admission, overrides, want, shed, codes):
    pools, adm, notes = apply_breaker(_OPEN, fleet=FLEET, pools={"a": proposal}, admission=admission,
                                      overrides=overrides, now_s=10.0)
    assert (pools["a"].replicas, pools["a"].prefix_weight) == want, label
    assert adm["sheddable"].shed_frac == shed, label
    assert {r.code for r in notes} == codes, label


def test_closed_breaker_changes_nothing():
    prop = {"a": PoolDecision(2, prefix_weight=5.0)}
    kept = apply_breaker(BreakerAction(), fleet=FLEET, pools=prop, admission={}, overrides=(), now_s=0.0)
    assert kept == (prop, {}, ())
