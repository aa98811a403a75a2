"""The measured step profile in the planner: what a lost request loses, and step-aware admission as a lever.

Rows: the profile's values (controller/core/workflow.py) on hand-computed cases; then the planner (hand-built
problems as in test_mpc.py) chooses step-aware admission when it predicts shedding and the profile says later
steps carry sunk work, and not otherwise; without a profile its plan and objective are exactly those of the
static weight.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from controller.core.mpc import PlanProblem, plan_steps, solve
from controller.core.mpc_model import QueueingPrior
from controller.core.objective import resolve_weights
from controller.core.workflow import (
    StepLoss,
    fair_shares,
    mean_steps,
    request_shares,
    step_loss,
    sunk_tokens,
    task_loss,
)
from controller.types import StepProfile
from tests.core.test_mpc import CFG, SPEC, classes, pool

GROWING = StepProfile(tasks=(0, 0, 0, 0, 1.0), tokens=(1000, 2000, 3000, 4000, 5000), count=500)  # 5 steps, growing
SINGLE = StepProfile(tasks=(1.0,), tokens=(1200,), count=500)


@pytest.mark.parametrize("label, prof, loss", [
    ("single steps: a request loses itself", SINGLE, 1.0),
    ("two equal steps for every task: (1 + 2) / 2", StepProfile((0, 1.0), (500, 500)), 1.5),
    ("five equal steps: the static (1 + 5) / 2", StepProfile((0, 0, 0, 0, 1.0), (7, 7, 7, 7, 7)), 3.0),
    ("two steps of 1k then 3k tokens: (1k + 4k) / (1k + 3k)", StepProfile((0, 1.0), (1000, 3000)), 1.25),
    # 5 growing steps: own Σ 1..5 = 15, sunk+own Σ s(s+1)/2 = 1+3+6+10+15 = 35 → 35/15
    ("five growing steps", GROWING, 35 / 15),
    ("no tokens measured: own work only", StepProfile((0.5, 0.5), (0, 0)), 1.0),
])
def test_task_loss_rows(label, prof, loss):
    assert task_loss(prof) == pytest.approx(loss), label


def test_profile_shares_and_sunk_tokens():
    p = StepProfile(tasks=(0.5, 0.5), tokens=(1000, 3000))
    assert request_shares(p) == pytest.approx([2 / 3, 1 / 3])
    assert sunk_tokens(p) == pytest.approx([0, 1000])
    assert mean_steps(p) == pytest.approx(1.5)
    # measured arrivals win over the tasks' own shares (shedding first steps leaves fewer later steps arriving)
    assert request_shares(StepProfile((0.5, 0.5), (1000, 3000), requests=(3.0, 1.0))) == pytest.approx([0.75, 0.25])


@pytest.mark.parametrize("label, prof, want", [
    # two steps of 1k then 3k: blind 1.25; first steps half the arrivals; a later step 1 + 1000/2000 / 0.5
    ("two growing steps", StepProfile((0, 1.0), (1000, 3000)), StepLoss(1.25, 0.5, 1.5)),
    ("single steps: nothing later", StepProfile((1.0,), (500,)), StepLoss(1.0, 1.0, 1.0)),
    # measured: first steps 3/4 of arrivals: blind 1 + (0.25 × 1000) / (0.75 × 1000 + 0.25 × 3000) = 1 + 1/6
    ("measured arrivals", StepProfile((0, 1.0), (1000, 3000), requests=(3.0, 1.0)), StepLoss(7 / 6, 0.75, 5 / 3)),
])
def test_step_loss_rows(label, prof, want):
    got = step_loss(prof)
    assert (got.blind, got.first_share, got.later) == pytest.approx((want.blind, want.first_share, want.later)), label
    # blind is the mix of the two step-aware values
    assert got.blind == pytest.approx(got.first_share + (1 - got.first_share) * got.later)


@pytest.mark.parametrize("bad", [dict(tasks=(), tokens=()), dict(tasks=(1.0,), tokens=(1.0, 2.0)),
                                 dict(tasks=(0.0,), tokens=(1.0,)), dict(tasks=(1.0,), tokens=(float("nan"),)),
                                 dict(tasks=(-1.0, 2.0), tokens=(1.0, 1.0))])
def test_profile_refuses_bad_values(bad):
    with pytest.raises(ValueError, match="StepProfile"):
        StepProfile(**bad)


@pytest.mark.parametrize("demand, cap, want", [
    ({"a": 100.0, "b": 10.0}, 60.0, {"a": 50.0, "b": 10.0}),
    ({"a": 100.0, "b": 10.0}, 200.0, {"a": 100.0, "b": 10.0}),
    ({"a": 30.0, "b": 30.0, "c": 1.0}, 31.0, {"a": 15.0, "b": 15.0, "c": 1.0}),
    ({"a": 5.0}, 0.0, {"a": 0.0}),
])
def test_fair_shares_are_max_min(demand, cap, want):
    got = fair_shares(demand, cap)
    assert got == pytest.approx(want)
    assert sum(got.values()) <= cap + 1e-9


# --------------------------------------------------------------------------- the planner


def _solve(total: float, loss: StepLoss | None, pools=None):
    pools = pools or [pool("a", 0, lo=4, hi=4), pool("b", 1, lo=2, hi=2, target=2, ready=2)]
    H = plan_steps(CFG, pools)
    cls = tuple(replace(c, task_loss=loss) for c in classes(np.full(H, total)))
    prob = PlanProblem(pools=tuple(pools), classes=cls, weights=resolve_weights("balanced"))
    return solve(prob, QueueingPrior.for_pools([SPEC] * len(pools)), CFG, np.random.default_rng(0))


def test_step_aware_chosen_when_the_plan_sheds_and_later_steps_carry_sunk_work():
    """Two pools at their maximum, 45 req/s beyond them: the plan sheds; with tasks of 5 growing steps a shed
    later step would lose 2.3 requests' worth, a shed first step 1: step-aware."""
    r = _solve(45.0, step_loss(GROWING))
    assert max(r.terms["shed_frac"].values()) > 0.0
    assert r.terms["step_aware"] is True
    assert r.terms["task_loss"]["standard"] == pytest.approx(35 / 15)


@pytest.mark.parametrize("label, total, loss", [
    ("no profile: the static weight, nothing to choose", 45.0, None),
    ("single-step tasks: nothing sunk to protect", 45.0, step_loss(SINGLE)),
    ("capacity to spare: nothing shed", 3.0, step_loss(GROWING)),
])
def test_step_aware_not_chosen(label, total, loss):
    r = _solve(total, loss)
    assert r.terms["step_aware"] is False, label


def test_no_profile_plans_exactly_as_the_static_weight():
    """task_loss None is the static steps_per_task weight: the same objective and plan, to the bit."""
    a = _solve(45.0, None)
    b = _solve(45.0, step_loss(SINGLE))  # a measured profile of single steps weighs as the default steps_per_task = 1
    assert a.objective == b.objective
    assert a.plan == b.plan
