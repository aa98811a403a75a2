"""The coupling models: priors, confidence, bulk predict, state round trip (controller/core/coupling/),
and their fitting at the learning edge (controller/learning/fit.py).

Physics come from a small hand-written table (no simulator): decode steps that grow with the
batch, prefill steps that grow with the tokens, Llama-3-8B-like magnitudes.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import controller.core.coupling as coupling
import controller.core.coupling.bundle as coupling_models
import controller.learning.fit as learning_fit
from controller.core.coupling import (
    REUSE_TAU_S,
    TOKEN_GRID,
    CacheInputs,
    Calibration,
    CouplingModels,
    LatencyInputs,
    PoolPhysics,
    cache_prior,
    coupling_from_state,
    coupling_to_state,
    latency_prior,
)
from controller.core.coupling.buckets import bucket_quantile
from controller.learning.evaluate import evaluate
from controller.learning.fit import CorrectionConfig, fit_coupling
from controller.learning.training_data import TrainingData, engine_not_saturated


def physics(key: str = "toy/gpu/tp1", speed: float = 1.0) -> PoolPhysics:
    n = TOKEN_GRID
    decode = tuple((0.010 + 0.00035 * n) / speed)  # 10 ms + 0.35 ms per sequence
    prefill = tuple((0.025 + 0.00007 * np.maximum(n - 64, 0)) / speed)  # flat, then 70 µs per token
    return PoolPhysics(key=key, decode_step_s=decode, prefill_step_s=prefill, decode_ctx_s_per_token=9e-8 / speed,
                       prefill_attn_s_per_work=3.4e-9 / speed, kv_capacity_tokens=450_000, mixed_seq_s=3e-4 / speed)


PROFILE_SESSIONS = np.array([0.05, 0.10, 0.14, 0.18, 0.22, 0.28, 0.32, 0.35, 0.36, 0.37])  # Mooncake-like


def lat(n=1, **kw):
    base = dict(physics_index=0, arrival_rps_per_replica=2.0, prompt_tokens=1000, output_tokens=200)
    base.update(kw)
    return LatencyInputs.build(n, **base)


# --------------------------------------------------------------------------- priors


def test_latency_prior_rises_with_load_until_saturation():
    table = coupling.PhysicsTable([physics()])
    loads = np.array([0.2, 1.0, 2.0, 4.0, 6.0])
    p = latency_prior(table, lat(5, arrival_rps_per_replica=loads))
    assert np.all(np.diff(p.rho) > 0)
    assert np.all(np.diff(p.ttft_p95_s) > 0) and np.all(np.diff(p.tpot_p95_s) >= 0)
    assert np.all(p.ttft_p95_s > p.ttft_p50_s) and np.all(p.tpot_p95_s >= p.tpot_p50_s)
    assert np.all(np.isfinite(p.capacity_rps)) and np.all(p.capacity_rps > 0)
    # the capacity is a property of the mix, not of the load
    assert np.allclose(p.capacity_rps, p.capacity_rps[0])


@pytest.mark.parametrize("label, change, field, direction", [
    ("less cache hit → more prefill → higher TTFT", {"hit_rate": 0.0}, "ttft_p95_s", +1),
    ("longer prompts → higher TTFT", {"prompt_tokens": 4000}, "ttft_p95_s", +1),
    ("in-flight cap → lower capacity", {"inflight_cap": 8}, "capacity_rps", -1),
    ("faster GPU → lower TPOT", {"physics_index": 1}, "tpot_p50_s", -1),
])
def test_latency_prior_directions(label, change, field, direction):
    table = coupling.PhysicsTable([physics(), physics("fast/gpu/tp1", speed=2.0)])
    base = latency_prior(table, lat(1, hit_rate=0.5))
    changed = latency_prior(table, lat(1, **{"hit_rate": 0.5, **change}))
    assert direction * (getattr(changed, field)[0] - getattr(base, field)[0]) > 0, label


def cache_rows(n=1, **kw):
    base = dict(physics_index=0, replicas=4, arrival_rps=8.0, prompt_tokens=4000, output_tokens=200,
                reuse_hit_at=PROFILE_SESSIONS, prefix_weight=3.0)
    base.update(kw)
    return CacheInputs.build(n, **base)


def test_cache_prior_couplings():
    table = coupling.PhysicsTable([physics()])
    # no affinity: doubling replicas spreads each conversation over more caches → fewer hits
    r = cache_prior(table, cache_rows(2, replicas=np.array([4, 8]), prefix_weight=0.0)).hit_rate
    assert r[1] < r[0]
    # affinity keeps conversations on their replica: more hits than random routing
    a = cache_prior(table, cache_rows(2, prefix_weight=np.array([0.0, 8.0]))).hit_rate
    assert a[1] > a[0]
    # never above what an infinite cache would hit, zero without reuse
    h = cache_prior(table, cache_rows(1, reuse_hit_at=np.zeros(len(REUSE_TAU_S)))).hit_rate
    assert h[0] == 0.0
    full = cache_prior(table, cache_rows(1, prefix_weight=100.0, arrival_rps=0.1)).hit_rate
    assert 0 < full[0] <= PROFILE_SESSIONS[-1] + 1e-9


@pytest.mark.parametrize("kw, message", [
    ({"arrival_rps_per_replica": np.ones(3)}, "arrival_rps_per_replica: expected shape (2,)"),
    ({"prompt_tokens": np.ones((2, 2))}, "prompt_tokens"),
])
def test_inputs_reject_bad_shapes(kw, message):
    with pytest.raises(ValueError, match=message.split(":")[0]):
        lat(2, **kw)


def test_cache_inputs_check_profile_index():
    with pytest.raises(ValueError, match="reuse_index"):
        cache_rows(2, reuse_index=np.array([0, 3]))


# --------------------------------------------------------------------------- fitting


def synthetic_data(rng: np.random.Generator, n: int) -> TrainingData:
    """A 'true' fleet the prior does not know: 40 % slower steps, half the queueing, and TTFTs
    stretched by (1 + hit rate), with 5 % noise. What calibration and correction have to learn."""
    table = coupling.PhysicsTable([physics()])
    truth = coupling.PhysicsTable([physics()], {physics().key: Calibration(1.4, 0.5)})
    x = lat(n, arrival_rps_per_replica=rng.uniform(0.2, 3.0, n), prompt_tokens=rng.uniform(300, 3000, n),
            output_tokens=rng.uniform(50, 400, n), hit_rate=rng.uniform(0, 0.6, n))
    p = latency_prior(truth, x)
    noise = np.exp(rng.normal(0, 0.05, n))
    targets = {t: getattr(p, t) * noise * ((1.0 + x.hit_rate) if t.startswith("ttft") else 1.0)
               for t in coupling.LATENCY_TARGETS}
    targets["gpu_busy_frac"] = np.clip(p.gpu_busy_frac * noise, 0, 1)
    cache = cache_rows(n, replicas=rng.integers(1, 9, n), arrival_rps=rng.uniform(1, 20, n),
                       prefix_weight=rng.choice([0.0, 1.0, 3.0, 8.0], n))
    hit = cache_prior(table, cache).hit_rate
    targets["hit_rate"] = np.clip(hit * 1.3 + rng.normal(0, 0.01, n), 0, 1)
    return TrainingData(latency=x, cache=cache, targets=targets, t_s=np.arange(n) * 15.0,
                        steady=np.ones(n, dtype=bool), aux={"requests_in_window": np.full(n, 100.0)})


def test_fit_learns_a_distortion_the_prior_misses():
    rng = np.random.default_rng(7)
    train, test = synthetic_data(rng, 400), synthetic_data(rng, 200)
    prior = evaluate(CouplingModels.prior_only([physics()]), test)
    fitted = fit_coupling(train, [physics()], np.random.default_rng(1))
    err = evaluate(fitted, test)
    assert prior.mape["ttft_p95_s"] > 0.3  # the prior alone is far off…
    assert err.mape["ttft_p95_s"] < 0.15 and err.mape["tpot_p95_s"] < 0.15  # …the fitted model is not
    assert err.hit_rate_mae < prior.hit_rate_mae


def test_fit_is_deterministic_for_a_seed():
    data = synthetic_data(np.random.default_rng(3), 300)
    a = fit_coupling(data, [physics()], np.random.default_rng(11), CorrectionConfig(max_fit_rows=200))
    b = fit_coupling(data, [physics()], np.random.default_rng(11), CorrectionConfig(max_fit_rows=200))
    for name, ca in a.corrections.items():
        cb = b.corrections[name]
        if ca.estimator is None:
            assert cb.estimator is None
        else:
            assert np.array_equal(ca.estimator.coef_, cb.estimator.coef_), name
    assert a.calibration == b.calibration


def test_little_data_falls_back_to_the_prior_and_says_so():
    data = synthetic_data(np.random.default_rng(5), 12)  # fewer than min_rows
    models = fit_coupling(data, [physics()], np.random.default_rng(0))
    assert all(c.estimator is None and c.data_weight == 0.0 for c in models.corrections.values())
    assert models.calibration == {}
    x = lat(3, arrival_rps_per_replica=np.array([0.5, 1.0, 2.0]))
    pred, prior, conf = models.predict_latency(x)
    assert np.array_equal(pred["ttft_p95_s"], prior.ttft_p95_s)
    assert np.all(conf == 0.0)


def test_confidence_falls_outside_the_training_data():
    data = synthetic_data(np.random.default_rng(9), 300)  # loads 0.2-4 rps, prompts 300-3000
    models = fit_coupling(data, [physics()], np.random.default_rng(0))
    inside = lat(1, arrival_rps_per_replica=1.5, prompt_tokens=1200, output_tokens=200, hit_rate=0.3)
    outside = lat(1, arrival_rps_per_replica=0.01, prompt_tokens=60000, output_tokens=4000, hit_rate=0.95)
    c_in = models.predict_latency(inside)[2][0]
    c_out = models.predict_latency(outside)[2][0]
    assert c_in > 0.7 and c_out < 0.1 * c_in


def test_bulk_predict_blocks_give_the_same_answer(monkeypatch):
    data = synthetic_data(np.random.default_rng(2), 200)
    models = fit_coupling(data, [physics()], np.random.default_rng(0))
    rng = np.random.default_rng(4)
    n = 1000
    cache = cache_rows(n, replicas=rng.integers(1, 12, n), arrival_rps=rng.uniform(1, 30, n))
    latency = lat(n, arrival_rps_per_replica=cache.arrival_rps / cache.replicas, inflight_cap=rng.choice([0, 16], n))
    whole = models.predict(cache, latency)
    monkeypatch.setattr(coupling_models, "PREDICT_BLOCK", 128)
    blocked = models.predict(cache, latency)
    for name in whole.__dataclass_fields__:
        assert np.allclose(getattr(whole, name), getattr(blocked, name), equal_nan=True), name
    assert np.all((whole.hit_rate >= 0) & (whole.hit_rate <= 1))
    assert np.all(whole.ttft_p95_upper_s >= whole.ttft_p95_s)
    assert np.all((whole.confidence >= 0) & (whole.confidence <= 1))


def test_predict_uses_the_cache_model_hit_rate():
    """The coupling: more replicas without affinity → lower hit → higher TTFT at the same per-replica load."""
    models = CouplingModels.prior_only([physics()])
    cache = cache_rows(2, replicas=np.array([2, 8]), arrival_rps=np.array([2.0, 8.0]), prefix_weight=0.0)
    p = models.predict(cache)
    assert p.hit_rate[1] < p.hit_rate[0]
    assert p.ttft_p95_s[1] > p.ttft_p95_s[0]


def test_sustainable_rps_meets_the_slo():
    models = CouplingModels.prior_only([physics()])
    x = lat(2, hit_rate=0.3)
    cap = models.sustainable_rps(x, ttft_p95_slo_s=np.array([1.0, 3.0]), tpot_p95_slo_s=0.2)
    assert 0 < cap[0] < cap[1]  # a looser SLO sustains more
    at = models.predict_latency(lat(2, hit_rate=0.3, arrival_rps_per_replica=cap))[0]
    assert np.all(at["ttft_p95_s"] <= np.array([1.0, 3.0]) + 1e-6)


def test_state_round_trip_and_validation():
    data = synthetic_data(np.random.default_rng(1), 200)
    models = fit_coupling(data, [physics()], np.random.default_rng(0))
    again = coupling_from_state(coupling_to_state(models))
    x = lat(5, arrival_rps_per_replica=np.linspace(0.5, 3, 5))
    assert np.array_equal(models.predict_latency(x)[0]["ttft_p95_s"], again.predict_latency(x)[0]["ttft_p95_s"])
    bad = coupling_to_state(models)
    bad["format"] = "something-else/1"
    with pytest.raises(ValueError, match="not a coupling-model state"):
        coupling_from_state(bad)
    bad = coupling_to_state(models)
    bad["corrections"]["bogus"] = bad["corrections"]["ttft_p95_s"]
    with pytest.raises(ValueError, match="unknown target"):
        coupling_from_state(bad)


def test_calibration_bounds():
    with pytest.raises(ValueError, match="time_scale"):
        Calibration(time_scale=0.0)
    assert math.isclose(Calibration().wait_scale, 1.0)


def test_infer_reuse_profile_reproduces_the_observed_hit_rate():
    models = CouplingModels.prior_only([physics()])
    x = cache_rows(3, replicas=np.array([2, 4, 8]))
    observed = np.array([0.05, 0.2, np.nan])
    prof = coupling.infer_reuse_profile(models, x, observed)
    again = CacheInputs.build(3, physics_index=0, replicas=x.replicas, arrival_rps=x.arrival_rps,
                              prompt_tokens=x.prompt_tokens, output_tokens=x.output_tokens, reuse_hit_at=prof,
                              reuse_index=np.arange(3), prefix_weight=x.prefix_weight)
    hit, _ = models.predict_hit_rate(again)
    assert np.allclose(hit[:2], observed[:2], atol=2e-3)
    assert np.all(prof[2] == 0.0)


# --------------------------------------------------------------------------- telemetry's own statistic


@pytest.mark.parametrize("median_s, log_sd, q", [
    (0.3, 0.8, 0.95), (0.3, 0.8, 0.5), (4.0, 1.2, 0.95), (0.02, 0.1, 0.95), (0.012, 0.3, 0.5),
])
def test_bucket_quantile_equals_histogram_quantile_of_the_same_distribution(median_s, log_sd, q):
    """The prior reads its distributions through vLLM's buckets exactly as histogram_quantile does."""
    from scipy.special import ndtr

    from controller.metrics.histogram import histogram_quantile

    bounds = coupling.TTFT_BUCKETS_S

    def cdf(log_b, rows):
        return ndtr((log_b - math.log(median_s)) / log_sd)  # the normal CDF in log space: a lognormal

    cumulative = [float(cdf(np.log(np.array([b])), None)[0]) for b in bounds] + [1.0]
    want = histogram_quantile(q, list(bounds), cumulative)
    true_q = median_s * math.exp(log_sd * {0.5: 0.0, 0.95: 1.645}[q])
    # a poor first guess (the bucket two above the truth) is corrected
    for guess in (true_q, true_q * 6.0):
        got = bucket_quantile(q, bounds, np.array([guess]), cdf)[0]
        assert got == pytest.approx(want, rel=1e-6)


def test_bucketed_itl_prior_reads_a_decode_only_pool_as_the_telemetry_does():
    """All ITLs inside (10, 25] ms: histogram_quantile says p95 ≈ 24.25 ms, p50 ≈ 17.5 ms, whatever
    the true quantiles; the raw prior says ~17 ms for both."""
    ph = physics(speed=0.6)  # decode steps ≈ 17 ms
    x = LatencyInputs.build(1, physics_index=0, arrival_rps_per_replica=0.02, prompt_tokens=300.0, output_tokens=300.0)
    raw = latency_prior(coupling.PhysicsTable([ph]), x, bucketed=False)
    seen = latency_prior(coupling.PhysicsTable([ph]), x)
    assert 0.01 < raw.tpot_p95_s[0] < 0.025
    assert seen.tpot_p95_s[0] == pytest.approx(0.01 + 0.015 * 0.95, rel=0.03)
    assert seen.tpot_p50_s[0] == pytest.approx(0.0175, rel=0.03)
    assert raw.rho_engine[0] == seen.rho_engine[0]


def test_engine_queue_marks_saturated_rows():
    n = 4
    x = LatencyInputs.build(n, physics_index=0, arrival_rps_per_replica=1.0, prompt_tokens=500.0, output_tokens=100.0)
    cache = CacheInputs.build(n, physics_index=0, replicas=2.0, arrival_rps=2.0, prompt_tokens=500.0,
                              output_tokens=100.0, reuse_hit_at=np.zeros(len(REUSE_TAU_S)))
    data = TrainingData(x, cache, {t: np.ones(n) for t in coupling.ALL_TARGETS}, np.arange(n, dtype=float),
                        np.ones(n, dtype=bool), {"waiting_per_replica": np.array([0.0, 0.9, 1.0, np.nan])})
    assert engine_not_saturated(data).tolist() == [True, True, False, True]


def test_calibration_tail_width_round_trips_and_old_states_load():
    ph = physics()
    models = CouplingModels(physics=(ph,), corrections={}, calibration={ph.key: Calibration(1.2, 0.8, 1.3)})
    state = coupling_to_state(models)
    assert coupling_from_state(state).calibration[ph.key] == Calibration(1.2, 0.8, 1.3)
    state["calibration"] = {ph.key: [1.2, 0.8]}  # written before the tail width existed
    assert coupling_from_state(state).calibration[ph.key] == Calibration(1.2, 0.8, 1.0)
    with pytest.raises(ValueError, match="ttft_tail_width"):
        Calibration(ttft_tail_width=3.0)


def test_wider_ttft_tail_raises_the_p95_not_the_median():
    ph = physics()
    x = lat(arrival_rps_per_replica=1.0)
    base = latency_prior(coupling.PhysicsTable([ph]), x)
    wide = latency_prior(coupling.PhysicsTable([ph], {ph.key: Calibration(ttft_tail_width=1.5)}), x)
    assert wide.ttft_p95_s[0] > base.ttft_p95_s[0]
    assert wide.ttft_p50_s[0] == base.ttft_p50_s[0]


@pytest.mark.parametrize("cv_loss", ["ape", "pinball"])
def test_correction_gate_keeps_signal_and_drops_noise(cv_loss):
    rng = np.random.default_rng(3)
    n = 240
    X = rng.normal(size=(n, 3))
    t = np.arange(n, dtype=float)
    cfg = CorrectionConfig(cv_loss=cv_loss)
    signal = 0.6 * X[:, 0] + 0.02 * rng.normal(size=n)
    kept = learning_fit._fit_correction("ttft_p95_s", X, signal, 0.5, cfg, np.random.default_rng(0), t)
    assert kept.estimator is not None
    noise = 0.3 * rng.standard_t(2, size=n)
    dropped = learning_fit._fit_correction("ttft_p95_s", X, noise, 0.5, cfg, np.random.default_rng(0), t)
    assert dropped.estimator is None


def test_ape_gate_refuses_a_correction_that_pays_in_log_space_but_overshoots():
    """Two thirds of the rows sit 2× above the prior, one third at it. Shifting the prior up by
    log 2 halves the pinball loss of the log residual (kept by a log-space gate), but in
    percentage terms it trades a 50 % under-prediction on two thirds for a 100 % over-prediction
    on one third: 1/3 against 1/3, no gain, so the acceptance-metric gate declines it."""
    n = 300
    X = np.column_stack([np.ones(n), np.arange(n) % 2]).astype(float)
    r = np.where(np.arange(n) % 3 == 2, 0.0, math.log(2.0))
    t = np.arange(n, dtype=float)
    pin = learning_fit._fit_correction("x", X, r, 0.5, CorrectionConfig(cv_loss="pinball"), np.random.default_rng(0), t)
    ape = learning_fit._fit_correction("x", X, r, 0.5, CorrectionConfig(cv_loss="ape"), np.random.default_rng(0), t)
    assert pin.estimator is not None
    assert ape.estimator is None


def test_cv_folds_leave_whole_runs_out_else_time_blocks():
    t = np.arange(12, dtype=float)
    runs = np.repeat([0.0, 1.0, 2.0, 3.0], 3)
    folds = learning_fit._cv_folds(t, runs, 3)
    assert sorted(np.concatenate(folds).tolist()) == list(range(12))
    for f in folds:  # no run is split between a fold and its training part
        assert set(np.unique(runs[f])).isdisjoint(set(runs) - set(np.unique(runs[f])))
    in_order = [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert [f.tolist() for f in learning_fit._cv_folds(t, None, 3)] == in_order
    assert [f.tolist() for f in learning_fit._cv_folds(t, np.zeros(12), 3)] == in_order


@pytest.mark.parametrize(("label", "prefix_w", "load_w", "expected"), [
    ("the router's defaults (3, 2 + 2)", 3.0, 4.0, 1.0 - math.exp(-1.5)),
    ("no prefix weight: no affinity", 0.0, 4.0, 0.0),
    ("only the ratio counts (1.5, 1 + 1)", 1.5, 2.0, 1.0 - math.exp(-1.5)),
    ("prefix weight dominating: near 1", 20.0, 4.0, 1.0 - math.exp(-10.0)),
    ("no load weight: floored, not a division by zero", 1.0, 0.0, 1.0 - math.exp(-10.0)),
])
def test_router_affinity_table(label: str, prefix_w: float, load_w: float, expected: float) -> None:
    from controller.core.coupling import router_affinity

    got = float(router_affinity(np.array(prefix_w), np.array(load_w)))
    assert got == pytest.approx(expected, rel=1e-12), label
