"""The planner's forecaster interface: the prior and the learned forecaster both implement it.

The prior forecaster's figures on a fixed history are pinned (they feed every MPC plan); the
learned one, behind its adapter, gives the fitted model's own quantiles.
"""

from __future__ import annotations

import numpy as np
import pytest

from controller.core.forecast import (
    DAY_S,
    Forecaster,
    LearnedForecaster,
    LoadForecast,
    PriorForecaster,
    fit_forecaster,
)

LEAD_S = (np.arange(10) + 0.5) * 30.0  # the MPC policy's leads: the middle of each 30 s step


def _learned() -> LearnedForecaster:
    rng = np.random.default_rng(0)
    t = np.arange(0.0, 2 * DAY_S, 60.0) + 30.0
    y = 10.0 * (2.0 + np.sin(2 * np.pi * t / DAY_S)) / 2.0 * np.exp(rng.normal(0, 0.05, len(t)))
    return LearnedForecaster(fit_forecaster({"arrival_rps": (t, y)}))


@pytest.mark.parametrize("label, make", [
    ("prior", PriorForecaster),
    ("learned", _learned),
])
def test_both_forecasters_satisfy_the_protocol(label, make):
    fc: Forecaster = make()
    assert isinstance(fc, Forecaster)
    t = np.arange(0.0, 900.0, 15.0)
    out = fc.forecast(t, np.full(len(t), 20.0), 900.0, LEAD_S)
    assert isinstance(out, LoadForecast)
    assert out.p50.shape == out.p90.shape == LEAD_S.shape
    np.testing.assert_array_equal(out.lead_s, LEAD_S)
    assert np.all(np.isfinite(out.p50)) and np.all(out.p90 >= out.p50) and np.all(out.p50 >= 0)
    assert out.level == pytest.approx(20.0)
    # no usable history: a forecast of nothing, not NaN
    empty = fc.forecast(np.empty(0), np.empty(0), 900.0, LEAD_S)
    np.testing.assert_array_equal(empty.p50, np.zeros(len(LEAD_S)))
    assert empty.level == 0.0


def test_prior_forecaster_values_on_a_fixed_history():
    """A rising, oscillating history: level, damped trend and empirical spread, pinned."""
    t = np.arange(0.0, 900.0, 15.0)
    y = 20.0 + 0.03 * t + 3.0 * np.sin(t / 50.0)
    fc = PriorForecaster().forecast(t, y, 900.0, LEAD_S)
    assert fc.method == "prior"
    assert fc.level == pytest.approx(44.17445609661083, rel=1e-12)
    assert fc.trend_per_s == pytest.approx(0.01207344819947977, rel=1e-12)
    want_p50 = [44.34679717219157, 44.643838764638076, 44.88703585131728, 45.086148785240525, 45.24916866757906,
                45.38263805861278, 45.491913553646675, 45.58138076198875, 45.65463031685043, 45.71460198006497]
    want_p90 = [46.77032824096107, 47.19866176842647, 48.96049464308759, 50.343725919735164, 51.19411492941417,
                51.41998867008751, 50.98454321079188, 50.35098316270374, 49.91694646363373, 49.57170997742606]
    np.testing.assert_allclose(fc.p50, want_p50, rtol=1e-12)
    np.testing.assert_allclose(fc.p90, want_p90, rtol=1e-12)


def test_prior_forecaster_level_trend_and_spread():
    fc = PriorForecaster()
    t = np.arange(0, 600, 15.0)
    flat = fc.forecast(t, np.full(len(t), 20.0), 600.0, np.array([30.0, 300.0]))
    assert flat.p50 == pytest.approx([20.0, 20.0]) and np.all(flat.p90 > flat.p50)
    rising = fc.forecast(t, 10.0 + 0.02 * t, 600.0, np.array([30.0, 300.0]))
    assert rising.p50[1] > rising.p50[0] > 20.0 and rising.trend_per_s > 0
    # a bursty series keeps capacity for its bursts (additive spread)
    tl = np.arange(0, 1800, 15.0)
    bursty = np.where((tl // 60) % 2 == 0, 30.0, 0.5)
    b = fc.forecast(tl, bursty, 1800.0, np.array([300.0]))
    assert b.p90[0] >= 20.0


def test_learned_forecaster_gives_the_fitted_models_quantiles():
    fc = _learned()
    t = np.arange(0.0, 3600.0, 60.0) + 2 * DAY_S
    y = np.full(len(t), 12.0)
    now = float(t[-1])
    out = fc.forecast(t, y, now, LEAD_S)
    want = fc.model.predict({"arrival_rps": (t, y)}, now, LEAD_S)
    np.testing.assert_array_equal(out.p50, want.p50["arrival_rps"])
    np.testing.assert_array_equal(out.p90, want.p90["arrival_rps"])
    assert out.method == "learned" and out.level == 12.0
    assert out.trend_per_s == pytest.approx((out.p50[-1] - out.p50[0]) / (LEAD_S[-1] - LEAD_S[0]))
