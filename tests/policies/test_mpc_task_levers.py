"""The MPC's task levers through Controller.step: step-aware admission and tenant fair shares from the measured
task profile (controller/policies/mpc/task_levers.py), cleared without one, and the operator's overrides win.

The fleet: one pool of Llama-3-70B TP4 held at 2 replicas (max 2), 30 req/s arriving, far beyond what 2
replicas serve: every plan sheds. Two tenants, one sending 10× the other's tokens.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from controller.core.step import Controller, TickInput
from controller.core.workflow import fair_shares
from controller.policies.mpc import MpcPolicy
from controller.types import ClassObservation, FleetObservation, Override, Reading, StepProfile, TaskProfile
from tests.policies.builders import fleet, obs_row, spec
from tests.policies.test_mpc_policy import pool_signals

FL = fleet(spec("p", model="llama-3-70b", sku="h100-80gb", gpus_per_replica=4, usd_per_replica_hour=49.16,
                min_replicas=2, max_replicas=2, startup_warm_s=60.0, startup_cold_s=300.0))
GROWING = StepProfile(tasks=(0, 0, 0, 0, 1.0), tokens=(1000, 2000, 3000, 4000, 5000), count=400)
TENANTS = {"heavy": 100_000.0, "light": 10_000.0}
PROFILE = TaskProfile(classes=dict.fromkeys(("critical", "standard", "sheddable"), GROWING), tenant_tokens_rps=TENANTS)


def _obs(t: float, rps: float, waiting: float, shed: float = 0.0, held: float = 0.0) -> FleetObservation:
    classes = {c: ClassObservation(priority_class=c, arrival_rps=Reading(rps * s), retry_rps=Reading(0.0),
                                   shed_rps=Reading(shed if c == "standard" else 0.0), ttft_p95_s=Reading(4.0),
                                   tpot_p95_s=Reading(0.12), queue_depth=Reading(held if c == "standard" else 0.0))
               for c, s in (("critical", 0.2), ("standard", 0.6), ("sheddable", 0.2))}
    return FleetObservation(at_s=t, pools={"p": obs_row("p", **pool_signals(rps, 2, waiting=waiting))}, classes=classes)


def _runs(tasks: TaskProfile | None, rps: float = 30.0, ticks: int = 6, overrides: tuple[Override, ...] = (),
          waiting: float = 20.0, then: tuple[float, ...] = (), breaker: bool = True, shed: float = 0.0,
          held: float = 0.0) -> list:
    """`ticks` ticks at `rps` (engine queue `waiting`), then one tick at each rate of `then` (no queue)."""
    ctl = (Controller(FL, MpcPolicy(max_evaluations=300), seed=1) if breaker
           else Controller(FL, MpcPolicy(max_evaluations=300), seed=1, breaker=None))
    state = ctl.initial_state()
    out = []
    rates = [(rps, waiting)] * ticks + [(x, 0.0) for x in then]
    for k, (r, w) in enumerate(rates, start=1):
        t = 15.0 * k
        state, res = ctl.step(state, TickInput(now_s=t, observation=_obs(t, r, w, shed, held), tasks=tasks,
                                               overrides=overrides))
        assert res.decision is not None
        out.append(res)
    return out


def _run(tasks: TaskProfile | None, **kw):
    return _runs(tasks, **kw)[-1]


@pytest.fixture(scope="module")
def overloaded():
    return _runs(PROFILE)


def test_overload_with_a_step_profile_turns_step_aware_admission_on(overloaded):
    d = overloaded[-1].decision
    assert max(a.shed_frac for a in d.admission.values()) > 0  # the plan sheds
    assert d.step_aware is True
    assert overloaded[-1].diagnostics["tasks"]["task_loss"]["standard"] == pytest.approx(35 / 15)
    # said once, when it came on, in an operator's words
    said = [r for res in overloaded for r in res.policy_reasons if r.code == "step_admission"]
    assert len(said) == 1 and said[0].message.startswith("step-aware admission on: the plan drops")
    assert "requests' worth of work, its task's earlier steps with it" in said[0].message


def test_overload_holds_the_heavy_tenant_to_its_fair_share(overloaded):
    d = overloaded[-1].decision
    heavy, light = d.tenants["heavy"], d.tenants["light"]
    assert light.max_inflight == 0  # within its fair share: no limit (its bursts pass)
    assert heavy.max_inflight > 0
    # its share of the in-flight slots is its max-min fair share of the admitted tokens
    diag = overloaded[-1].diagnostics["tasks"]
    adm, slots = diag["admitted_frac"], diag["slots"]
    assert 0 < adm < 1
    fair = fair_shares(TENANTS, adm * sum(TENANTS.values()))
    assert heavy.max_inflight == int(np.ceil(slots * fair["heavy"] / (adm * sum(TENANTS.values()))))
    assert heavy.max_inflight < slots
    said = [r.message for res in overloaded for r in res.policy_reasons if r.code == "tenant_share"]
    assert any(m.startswith("tenant heavy held to") and "fair share" in m for m in said)
    status = dict(overloaded[-1].status.lines)["planner.tasks"]
    assert status.startswith("step-aware admission on; a lost request loses") and \
        f"tenant heavy held to {heavy.max_inflight} in flight" in status


def test_no_profile_leaves_both_levers_to_the_router():
    r = _run(None)
    assert max(a.shed_frac for a in r.decision.admission.values()) > 0
    assert r.decision.step_aware is None
    assert dict(r.decision.tenants) == {}
    assert dict(r.status.lines)["planner.tasks"].startswith("no task profile measured")


def test_no_overload_clears_the_tenant_limits():
    r = _run(PROFILE, rps=2.0, waiting=0.0)
    assert dict(r.decision.tenants) == {}
    assert r.decision.step_aware is None


def test_operator_overrides_win_over_the_plan():
    ov = (Override("o1", "tenant_max_inflight", value=7, text="heavy", author="op"),
          Override("o2", "step_admission", text="blind", author="op"))
    r = _run(PROFILE, overrides=ov)
    assert r.decision.tenants["heavy"].max_inflight == 7
    assert r.decision.tenants["light"].max_inflight == 0  # the plan's, untouched
    assert r.decision.step_aware is False
    assert {"guard_override_tenant", "guard_override_step_admission"} <= {g.code for g in r.guard_adjustments}


def test_single_tenant_or_unlabelled_tasks_set_nothing():
    r = _run(replace(PROFILE, tenant_tokens_rps={"only": 5000.0},
                     classes={c: StepProfile((1.0,), (900.0,)) for c in ("standard",)}))
    assert dict(r.decision.tenants) == {}
    assert r.decision.step_aware is None


def test_step_aware_holds_through_the_stabilisation_window_then_returns_to_the_router():
    """The overload ends at 90 s: step-aware admission stays on for the scale-down stabilisation window (120 s
    after the last plan that chose it), then goes back to the router's own setting, and says so. (No breaker: its
    shed floors would keep the plan shedding while it recovers, and step-aware with it.)"""
    runs = _runs(PROFILE, then=(2.0,) * 16, breaker=False)
    aware = [r.decision.step_aware for r in runs]
    assert aware[5] is True
    last_on = max(i for i, a in enumerate(aware) if a is True)
    assert aware[-1] is None and last_on < len(aware) - 1
    assert all(a is True for a in aware[5:last_on + 1])
    assert any(r.code == "step_admission" and "router's own setting" in r.message
               for r in runs[last_on + 1].policy_reasons)


def test_the_router_measured_shedding_turns_step_aware_on_before_the_plan_predicts_drops():
    """Light load, nothing planned to drop, but the router sheds 1.5 standard requests/s now: step-aware admission
    is on and the reason says so; requests merely held (a queue the fleet works off) do not turn it on; without a
    profile (nothing to protect) the same shedding leaves it to the router."""
    r = _runs(PROFILE, rps=2.0, waiting=0.0, shed=1.5)
    assert r[-1].decision.step_aware is True
    assert r[-1].diagnostics["predicted"]["step_aware"] is False  # the plan alone would not have
    said = [x.message for res in r for x in res.policy_reasons if x.code == "step_admission"]
    assert said and "the router sheds 1.5 standard requests/s now" in said[0]
    assert _run(PROFILE, rps=2.0, waiting=0.0, held=6.0).decision.step_aware is None
    assert _run(None, rps=2.0, waiting=0.0, shed=1.5).decision.step_aware is None
