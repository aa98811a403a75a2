"""Step-aware admission in the simulated router (controller/sim/router.py), as `governor picker` does it: later steps
of tasks under way are protected from shedding, may borrow a second of the rate, have their own queue budget and
leave the hold queue first; off by default, switched by the scenario, a decision or RouterControl; and the bench
that compares it with step-blind admission at the same fleet."""

from __future__ import annotations

import numpy as np
import pytest

from controller.bench.tasks_sim import run_sim, run_sim_mpc
from controller.sim.control import apply_decision
from controller.sim.engine_records import Req
from controller.sim.fleet import Fleet
from controller.sim.router import ClassAdmissionState, PoolRoute, Router
from controller.types import Decision, PoolDecision
from tests.fakes.sim_fleet import pool, scenario, workload


def _req(i: int, step: int, prio: int = 1) -> Req:
    return Req(i, prio, i, step, 10, 1)


def test_step_blind_by_default_and_later_steps_only_when_step_aware():
    router = Router(np.random.default_rng(0))
    assert not router.later(_req(0, 3))
    router.step_aware = True
    assert router.later(_req(0, 3)) and not router.later(_req(1, 0))


def test_step_aware_sheds_first_steps_only():
    router = Router(np.random.default_rng(0))
    router.step_aware = True
    router.classes[1].shed_frac = 1.0
    assert router.admit(1, 0.0, router.later(_req(0, 0))) == 429
    assert router.admit(1, 0.0, router.later(_req(1, 2))) == 0


def test_step_aware_sheds_the_class_share_of_all_arrivals_from_first_steps():
    """Shed 0.25 with three later steps per first step: every arrival owes its share and the first steps pay it,
    so the class sheds a quarter of all arrivals (every first step), as the picker does; step-blind, a quarter of
    the draws."""
    router = Router(np.random.default_rng(0))
    router.step_aware = True
    router.classes[1].shed_frac = 0.25
    seq = [_req(4 * k + j, j) for k in range(40) for j in range(4)]  # tasks of 4 steps
    shed = [r.step for r in seq if router.admit(1, 0.0, router.later(r)) == 429]
    assert shed == [0] * len(shed) and len(shed) == pytest.approx(40, abs=1)
    # the debt is bounded: a run of later steps never sheds more than two first steps back to back
    router.classes[1].shed_acc = 0.0
    for k in range(50):
        router.admit(1, 0.0, router.later(_req(1000 + k, 1)))
    assert [router.admit(1, 0.0, router.later(_req(2000 + k, 0))) for k in range(3)] == [429, 429, 0]


def test_a_later_step_borrows_one_second_of_the_rate_and_first_steps_wait_for_the_debt():
    a = ClassAdmissionState(rate_limit_rps=2.0)
    a.reset_bucket(0.0)
    assert [a.take_token(0.0) for _ in range(2)] == [True, True]  # the bucket's second
    assert not a.take_token(0.0)  # a first step: empty
    assert [a.take_token(0.0, borrow=True) for _ in range(3)] == [True, True, False]  # down to minus one second
    assert not a.take_token(0.9)  # the debt is being paid back: still no whole token for a first step
    assert a.take_token(1.5)  # 1.5 s later: back to one token


def test_the_queue_budget_refuses_first_steps_before_later_steps():
    router = Router(np.random.default_rng(0))
    router.step_aware = True
    router.classes[1].queue_budget = 2
    firsts = [_req(i, 0) for i in range(2)]
    for r in firsts:
        assert router.can_hold(1, later=False)
        router.held_in(r, later=False)
    assert not router.can_hold(1, later=False)  # first steps count everything held
    assert router.can_hold(1, later=True)  # later steps count only later steps held
    later = [_req(10 + i, 1) for i in range(2)]
    for r in later:
        router.held_in(r, later=True)
    assert not router.can_hold(1, later=True)
    router.held_out(later[0])
    router.held_out(firsts[0])
    assert (router.classes[1].held, router.classes[1].held_later) == (2, 1)


def test_held_later_steps_leave_before_first_steps_of_their_class_and_after_higher_classes():
    route = PoolRoute("p", dict(traffic_weight=1.0, inflight_cap=0, prefix_weight=3, queue_weight=2, kv_weight=2))
    held = [(_req(0, 0, prio=1), False), (_req(1, 2, prio=1), True), (_req(2, 0, prio=0), False),
            (_req(3, 1, prio=2), True), (_req(4, 0, prio=2), False), (_req(5, 4, prio=1), True)]
    for r, later in held:
        route.hold(r, later)
    order = []
    while (nxt := route.pop_held()) is not None:
        order.append(nxt.idx)
    assert order == [2, 1, 5, 0, 3, 4]


def _fleet(**router) -> Fleet:
    sc = scenario([pool(replicas=1, min_replicas=1, max_replicas=1)], router=router)
    wl = workload([0.0, 1.0], 100, 10, task_id=[0, 0], step=[0, 1])
    return Fleet(sc, seed=1, workload=wl)


def test_the_scenario_a_decision_and_its_absence_set_step_awareness():
    fleet = _fleet()
    assert fleet.router.step_aware is False
    assert _fleet(step_aware=True).router.step_aware is True
    d = Decision("d-1", 1, 0.0, 60.0, pools={"p8": PoolDecision(replicas=1)}, step_aware=True)
    apply_decision(fleet, d)
    assert fleet.router.step_aware is True
    apply_decision(fleet, Decision("d-2", 2, 15.0, 75.0, pools={"p8": PoolDecision(replicas=1)}))
    assert fleet.router.step_aware is False  # the decision says nothing: the scenario's own
    fleet.set_step_aware(True)
    fleet.reset_controls()  # a fallback: the scenario's own
    assert fleet.router.step_aware is False


def test_the_bench_compares_both_rules_on_the_same_fleet_and_arrivals():
    res = run_sim(replicas=1, loads=(1.0,), seeds=(1,), duration_s=240.0)
    (p,) = res["points"]
    aware, blind = p["step_aware"], p["step_blind"]
    assert aware["tasks"] == blind["tasks"] > 0  # the same arrivals
    # the same fleet: one replica throughout, so the same GPU-seconds to within the last requests' drain
    assert aware["gpu_s"] == pytest.approx(blind["gpu_s"], rel=0.05)
    assert blind["failed"] > 0 and blind["wasted_gpu_s"] > 0  # beyond capacity: step-blind wastes GPU time
    assert aware["wasted_gpu_s"] < blind["wasted_gpu_s"]
    assert p["tasks_per_usd_ratio"] == pytest.approx(aware["tasks_per_usd"] / blind["tasks_per_usd"])
    assert 0 <= aware["completed"] <= aware["tasks"] and aware["completed"] + aware["failed"] <= aware["tasks"]
    (s,) = res["summary"]
    assert s["completed"] == {"step_aware": aware["completed"], "step_blind": blind["completed"]}


def test_the_mpc_in_the_loop_chooses_step_aware_admission_only_with_the_measured_profile():
    """The MPC at a pinned fleet beyond its capacity: planning on the simulator's step profile it turns step-aware
    admission on (and wastes less GPU time on tasks that fail); on the static weight it never touches it."""
    res = run_sim_mpc(replicas=1, loads=(1.5,), seeds=(11,), duration_s=240.0)
    (p,) = res["points"]
    prof, static = p["mpc_profile"], p["mpc_static"]
    assert prof["tasks"] == static["tasks"] > 0  # the same arrivals
    assert prof["decisions"] > 0 and static["decisions"] > 0
    assert prof["step_aware_share"] > 0.0
    assert static["step_aware_share"] == 0.0
    assert static["failed"] > 0 and prof["wasted_gpu_s"] < static["wasted_gpu_s"]
    (s,) = res["summary"]
    assert s["completed"] == {"mpc_profile": prof["completed"], "mpc_static": static["completed"]}
