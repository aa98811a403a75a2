"""The MPC's feedback layer (policies/mpc/feedback.py) and its online forecast validation (forecasting.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from controller.core.forecast import LoadForecast, PriorForecaster
from controller.policies.mpc import MpcPolicy
from controller.policies.mpc.feedback import BACKLOG_DRAIN_S, measure
from controller.policies.mpc.forecasting import (
    MIN_SCORED,
    Scoreboard,
    forecast,
    pinball,
    settle,
    widen_to_error,
)
from controller.policies.mpc.memory import MpcPoolMemory
from controller.types import FleetObservation
from tests.policies.builders import codes, fleet, inp, obs_row, spec

FL = fleet(spec("p", max_replicas=32, startup_cold_s=20.0))
SHARES = {"critical": 0.2, "standard": 0.6, "sheddable": 0.2}


def observe(**pool: float) -> FleetObservation:
    return FleetObservation(at_s=0.0, pools={"p": obs_row("p", **pool)})


def test_backlog_floor_follows_the_docstring_example():
    # 2 ready, 15 req/s, 141 waiting (22 a tick ago), p95 TTFT 6 s > the standard SLO's 5 s
    obs = observe(ready=2, rps=15.0, waiting=141, ttft=6.0)
    fb = measure(obs, FL, {"p": MpcPoolMemory(serving=2)}, {"p": 22.0}, 15.0, SHARES, 15.0)
    b = fb.breaches["p"]
    served = 15.0 - (141 - 22) / 15.0
    assert b.served_rps == pytest.approx(served)
    backlog = 141 + (15.0 - served) * 20.0
    need = (15.0 + backlog / BACKLOG_DRAIN_S) / (served / 2)
    assert fb.floors["p"] == min(math.ceil(need), max(4, 2 + 4)) == 6
    # the deficit goes to the sheddable class: 7.9 req/s of its 3 req/s → all of it
    assert fb.min_shed["sheddable"] == pytest.approx(1.0)
    assert "critical" not in fb.min_shed and "standard" not in fb.min_shed
    assert fb.waiting == {"p": 141.0}


def test_floor_is_capped_per_tick_like_the_hpa():
    obs = observe(ready=4, rps=100.0, waiting=2000, ttft=30.0)
    fb = measure(obs, FL, {"p": MpcPoolMemory(serving=4)}, {"p": 0.0}, 15.0, SHARES, 100.0)
    assert fb.floors["p"] == 8  # max(2 × 4, 4 + 4)


@pytest.mark.parametrize("label, pool", [
    ("queue within one per replica", dict(ready=4, rps=20.0, waiting=4, ttft=9.0)),
    ("queue but latency within the standard SLO", dict(ready=4, rps=20.0, waiting=40, ttft=3.0)),
    ("no ready replica", dict(ready=0, rps=20.0, waiting=40, ttft=9.0)),
    ("waiting unknown", dict(ready=4, rps=20.0, waiting=None, ttft=9.0)),
])
def test_no_breach_no_floor(label, pool):
    fb = measure(observe(**pool), FL, {"p": MpcPoolMemory(serving=4)}, {}, 15.0, SHARES, 20.0)
    assert fb.floors == {} and fb.min_shed == {}, label


def test_tpot_breach_with_a_queue_counts_too():
    obs = observe(ready=2, rps=15.0, waiting=30, ttft=1.0, request_tpot_p95_s=0.4)
    fb = measure(obs, FL, {"p": MpcPoolMemory(serving=2)}, {"p": 30.0}, 15.0, SHARES, 15.0)
    assert "p" in fb.breaches


def test_a_burst_that_fills_the_queue_in_one_tick_is_not_read_as_a_collapse():
    # 900 requests more in one tick would read as negative service; it is held at 25 % of arrivals
    obs = observe(ready=4, rps=20.0, waiting=1000, ttft=9.0)
    fb = measure(obs, FL, {"p": MpcPoolMemory(serving=4)}, {"p": 100.0}, 15.0, SHARES, 20.0)
    assert fb.breaches["p"].served_rps == pytest.approx(5.0)


def test_policy_raises_the_floor_within_one_tick_and_says_why():
    pol = MpcPolicy(max_evaluations=300)
    state = pol.initial_state()
    base = dict(prompt=15 * 1100.0, gen=15 * 150.0, running=100, kv=0.5)
    # a calm tick, then a standing queue with TTFT past every protected SLO
    state, _ = pol.decide(state, inp(15.0, {"p": dict(ready=2, rps=15.0, waiting=0, ttft=0.4, **base)}, fl=FL,
                                     current={"p": 2}), np.random.default_rng(0))
    state, out = pol.decide(state, inp(30.0, {"p": dict(ready=2, rps=15.0, waiting=120, ttft=7.0, **base)}, fl=FL,
                                       current={"p": 2}), np.random.default_rng(0))
    assert "backlog_floor" in codes(out)
    floor = next(r for r in out.reasons if r.code == "backlog_floor").data["floor"]
    assert out.pools["p"].replicas >= floor > 2
    assert out.admission["sheddable"].shed_frac > 0
    assert state.waiting == {"p": 120.0}


# ------------------------------------------------------------------ forecast validation


def test_pinball_loss():
    assert pinball(0.9, 10.0, 12.0) == pytest.approx(1.8)  # under-forecast costs q per unit
    assert pinball(0.9, 10.0, 8.0) == pytest.approx(0.2)  # over-forecast costs 1 − q per unit
    assert pinball(0.5, 10.0, 8.0) == pytest.approx(1.0)


def test_settle_scores_only_what_is_due():
    board = Scoreboard(pending=((10.0, 5.0, 6.0, 4.0, 8.0), (20.0, 5.0, 6.0, math.nan, math.nan)))
    b = settle(board, 15.0, 5.0)
    assert len(b.pending) == 1 and b.pending[0][:3] == (20.0, 5.0, 6.0)  # the one not yet due stays
    assert b.prior_scored == 1 and b.scored == 1
    assert b.prior_ae == pytest.approx(0.0) and b.learned_ae == pytest.approx(1.0)
    b2 = settle(b, 25.0, 7.0)
    assert b2.prior_scored == 2 and b2.scored == 1  # the learned forecast was missing then
    assert settle(b2, 30.0, None) is b2  # no reading: nothing scored


class Constant:
    """A forecaster that always says `level` (p90 = level too)."""

    def __init__(self, level: float) -> None:
        self.level = level

    def forecast(self, t_s, y, now_s, lead_s) -> LoadForecast:
        z = np.full(len(lead_s), self.level)
        return LoadForecast(np.asarray(lead_s, dtype=float), z, z, self.level, 0.0)


def _run(learned, truth, ticks: int):
    board = Scoreboard()
    lead = np.array([15.0, 45.0, 75.0])
    t_hist: list[float] = []
    d_hist: list[float] = []
    methods = []
    for k in range(ticks):
        now = 15.0 * (k + 1)
        y = truth(now)
        t_hist.append(now)
        d_hist.append(y)
        fc, board, method = forecast(PriorForecaster(), learned, board, np.array(t_hist), np.array(d_hist), now,
                                     lead, 45.0, y)
        methods.append(method)
    return fc, board, methods


def test_the_learned_forecaster_is_used_only_once_it_scores_better():
    def truth(t: float) -> float:
        return 20.0 + 10.0 * math.sin(t / 120.0)

    # a learned forecaster that knows the curve 45 s ahead beats the last-value prior, after MIN_SCORED scores
    class Oracle:
        def forecast(self, t_s, y, now_s, lead_s) -> LoadForecast:
            v = np.array([truth(now_s + L) for L in lead_s])
            return LoadForecast(np.asarray(lead_s, dtype=float), v, v, float(v[0]), 0.0)

    _, board, methods = _run(Oracle(), truth, 60)
    assert methods[0] == "prior"
    assert methods[-1] == "learned" and board.learned_wins()
    first = methods.index("learned")
    assert first >= MIN_SCORED // 2  # two scores a tick (first step and the validation lead)
    # a learned forecaster that is far off is never planned on
    _, board, methods = _run(Constant(80.0), truth, 60)
    assert set(methods) == {"prior"} and not board.learned_wins()


def test_p90_widens_to_the_measured_error():
    lead = np.array([15.0, 60.0, 240.0])
    fc = LoadForecast(lead, np.array([10.0, 10.0, 10.0]), np.array([10.5, 10.5, 10.5]), 10.0, 0.0)
    w = widen_to_error(fc, mae=2.0, validation_lead_s=60.0)
    gap = 1.2816 / 0.7979 * 2.0
    assert w.p90[1] == pytest.approx(10.0 + gap)
    assert w.p90[0] == pytest.approx(10.0 + gap * math.sqrt(15.0 / 60.0))
    assert w.p90[2] == pytest.approx(10.0 + gap)  # held beyond the validation lead
    assert np.array_equal(w.p50, fc.p50)
    assert widen_to_error(fc, None, 60.0) is fc
    wide = LoadForecast(lead, fc.p50, np.array([30.0, 30.0, 30.0]), 10.0, 0.0)
    assert np.array_equal(widen_to_error(wide, 2.0, 60.0).p90, wide.p90)  # never narrows
