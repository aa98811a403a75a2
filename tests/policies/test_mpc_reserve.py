"""The reserve the MPC's search keeps for the work after it: measured tick by tick (reserve.py), on a fake
clock on which only scoring and the injected slow step take time (no timed test)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import controller.policies.mpc.policy as policy_module
from controller.core.mpc import MpcConfig
from controller.core.mpc.score import Evaluator
from controller.policies.mpc import MpcPolicy
from controller.policies.mpc.reserve import CANTELLI_K, MIN_SPILLS, WINDOW, Spills, reserve
from controller.types import Decision
from tests.policies.builders import inp

CFG = MpcConfig(time_budget_s=0.2)


def test_first_ticks_keep_a_tenth_of_the_budget():
    r = reserve(None, 10, CFG)
    assert r.basis == "first" and r.seconds == pytest.approx(0.02) and r.spills == 0
    # a few spills, all small: still the first tick's bound until MIN_SPILLS are in
    few = Spills(10, (0.004,) * (MIN_SPILLS - 1))
    assert reserve(few, 10, CFG).basis == "first"


def test_steady_spills_give_mean_plus_cantelli_spread():
    xs = (0.015, 0.016, 0.017, 0.016, 0.016)
    r = reserve(Spills(100, xs), 100, MpcConfig(time_budget_s=1.0))
    mean, sd = float(np.mean(xs)), float(np.std(xs, ddof=1))
    assert r.basis == "measured" and r.spills == 5
    assert r.seconds == pytest.approx(mean + CANTELLI_K * sd) and r.seconds == pytest.approx(0.0230, abs=1e-4)
    assert math.isclose(CANTELLI_K, math.sqrt(99))  # P(spill > reserve) <= 1 % for any distribution


def test_a_slow_spill_grows_the_reserve_and_the_cap_holds():
    steady = Spills(100, (0.016,) * 10)
    base = reserve(steady, 100, MpcConfig(time_budget_s=1.0)).seconds
    assert base == pytest.approx(0.016)
    slow = steady.add(100, 0.060)
    grown = reserve(slow, 100, MpcConfig(time_budget_s=1.0))
    assert grown.seconds > 0.060 > base and not grown.capped
    # far beyond what a budget holds: the search keeps half of it, and the diagnostics say so
    tight = reserve(slow, 100, MpcConfig(time_budget_s=0.2))
    assert tight.capped and tight.seconds == pytest.approx(0.1)


def test_window_and_fleet_size():
    s = Spills(10)
    for k in range(WINDOW + 5):
        s = s.add(10, 0.001 * k)
    assert len(s.seconds) == WINDOW and s.seconds[0] == pytest.approx(0.005)
    # another fleet size: the work after the search is another; start over
    assert s.add(12, 0.003).seconds == (0.003,)
    assert reserve(s, 12, CFG).basis == "first"


def test_a_fixed_time_reserve_is_kept():
    r = reserve(Spills(10, (0.05,) * 20), 10, MpcConfig(time_budget_s=0.2, time_reserve_s=0.015))
    assert r.basis == "fixed" and r.seconds == 0.015


class _Clock:
    """Scoring n candidates takes 2 ms + 0.4 ms × n; the work after the search (`first_step`) takes
    `after` seconds; nothing else takes time."""

    def __init__(self) -> None:
        self.now, self.after = 0.0, 0.0

    def __call__(self) -> float:
        return self.now


def _ticks(monkeypatch, clock: _Clock, afters: list[float]) -> list[dict]:
    real_score, real_first = Evaluator.score, policy_module.first_step

    def score(self, cand, detail=False):
        clock.now += 0.002 + 0.0004 * cand.n
        return real_score(self, cand, detail)

    def first_step(*a, **kw):
        clock.now += clock.after
        return real_first(*a, **kw)

    monkeypatch.setattr(Evaluator, "score", score)
    monkeypatch.setattr(policy_module, "first_step", first_step)
    pol = MpcPolicy(timer=clock, time_budget_s=0.2)
    state, current, out = pol.initial_state(), None, []
    for k, after in enumerate(afters):
        clock.after = after
        t = 15.0 * (k + 1)
        i = inp(t, {"p": dict(ready=4, rps=20.0, prompt=22000.0, gen=4200.0, hit_rate=0.3, ttft=0.5, tpot=0.06,
                              waiting=0.0, running=40.0, kv=0.3)}, current=current or {"p": 4})
        state, o = pol.decide(state, i, np.random.default_rng(k))
        out.append(dict(o.diagnostics["timing"]))
        current = Decision(f"d{k}", k, t, t + 120, pools=dict(o.pools))
    return out


def test_the_reserve_follows_slow_work_after_the_search(monkeypatch):
    """After-search work of 5 ms (plus the chosen plan's detailed score, 2.4 ms on this clock), then 60 ms
    from the 9th tick: the first ticks keep a tenth of the budget (20 ms); the measured reserve then
    settles at what follows the search and the search uses the time; the first slow tick runs over (by
    what no past tick foretold), and from the next one the reserve covers it (capped at half the budget:
    one slow spill among steady ones is a wide spread) and the whole tick is back within its budget."""
    clock = _Clock()
    t = _ticks(monkeypatch, clock, [0.005] * 8 + [0.060] * 4)
    assert [x["reserve_basis"] for x in t[:MIN_SPILLS]] == ["first"] * MIN_SPILLS
    assert t[0]["reserve_ms"] == pytest.approx(20.0)
    steady = t[MIN_SPILLS]
    assert steady["reserve_basis"] == "measured" and steady["reserve_ms"] == pytest.approx(t[0]["spill_ms"])
    assert steady["search_ms"] > t[0]["search_ms"]  # the time the first ticks kept back goes to the search
    assert all(x["tick_ms"] <= 200.0 for x in t[:8])
    assert t[8]["after_search_ms"] - t[7]["after_search_ms"] == pytest.approx(55.0)
    assert t[8]["tick_ms"] > 200.0  # unforeseen
    assert t[9]["reserve_ms"] > t[8]["spill_ms"] and t[9]["reserve_capped"]
    assert all(x["tick_ms"] <= 200.0 for x in t[9:])
