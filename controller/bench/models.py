"""`governor bench models`: accuracy, fit time and bulk-predict time of the learned models.

What it does (seeded, virtual clock, ~3 minutes on 2 cores):

1. Records the default suite (controller/bench/recordings.py): per shared trace two training runs
   (the first part of the trace, fleet sizes A, 60 s telemetry windows) and one test run (a later
   part of the trace — ServeGen: another day — other fleet sizes and seed, 450 s fixed-setting
   segments). Telemetry windows are 60 s everywhere (the daemon's default).
2. Coupling accuracy on the test windows, for three models: the prior alone, the per-trace model
   (fitted on that trace's training runs: what a daemon's refit learns from its own fleet) and the
   global model (fitted on all training runs: the shipped model; the headline). p95 TTFT/TPOT MAPE over test
   windows below saturation (prior utilisation of the engine < 0.9, fewer than 1 request waiting
   per replica in the engines at the window's end, at least 30 requests in the window; the
   `*_utilisation_rule_only` figures drop the queue rule), hit-rate MAE over test windows with
   prefix reuse. The truth is what the telemetry says: histogram_quantile over vLLM's buckets.
3. Forecast accuracy at a 10-minute horizon, walk-forward, against seasonal-naive: the ServeGen
   14-day rate shape (600 s windows, per tier), ServeGen arrivals drawn from it (60 s bins), and
   the Azure 2023 traces (60 s bins; shorter than a day, so seasonal-naive is the last value).
4. Fit time of the default models on one hour of 15 s observations × 10 pools (2,400 rows), and
   predict time for 10,000 candidate plans × 10 pools (100,000 rows), on one core.

`--json` prints one JSON object on stdout (progress goes to stderr). Set GOVERNOR_RECORDING_CACHE
to a directory to keep the simulated recordings between runs (JSON lines, keyed by label and
seed; `governor fit --defaults` reads the same cache).

Must not: be imported by the daemon.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from typing import Any

import numpy as np

from controller.core.coupling import (
    CacheInputs,
    CouplingModels,
    LatencyInputs,
    PhysicsTable,
    latency_prior,
    with_physics,
)
from controller.core.forecast import ForecastConfig, fit_forecaster, rolling_backtest
from controller.learning.fit import fit_coupling
from controller.learning.training_data import (
    TrainingData,
    build_training_data,
    concat_training_data,
    engine_not_saturated,
    valid_cache_rows,
    valid_latency_rows,
)

MAX_RHO = 0.9
CACHE_ENV = "GOVERNOR_RECORDING_CACHE"


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- data


def _recordings(seed: int):
    from controller.bench.recordings import default_suite, record_cached

    train_specs, test_specs = default_suite(seed)
    recs = record_cached(list(train_specs) + list(test_specs), os.environ.get(CACHE_ENV), progress=_progress)
    return recs[: len(train_specs)], recs[len(train_specs):]


def _data(recs):
    return concat_training_data([build_training_data(r.records, r.physics, window_s=r.window_s) for r in recs])


# --------------------------------------------------------------------------- coupling accuracy


def _errors(models: CouplingModels, data: TrainingData, physics, *, queue_rule: bool = True) -> dict[str, np.ndarray]:
    """Per-row absolute (percentage) errors on the test rows that count.

    Below saturation = the uncalibrated prior's engine utilisation < MAX_RHO (the same rows for
    every model compared) and, with queue_rule, no standing engine queue in the telemetry
    (engine_not_saturated: fewer than 1 waiting request per replica at the window's end)."""
    m = with_physics(models, physics)
    pred, _, _ = m.predict_latency(data.latency)
    below = latency_prior(PhysicsTable(physics), data.latency).rho_engine < MAX_RHO
    if queue_rule:
        below &= engine_not_saturated(data)
    out: dict[str, np.ndarray] = {}
    for t in ("ttft_p50_s", "ttft_p95_s", "tpot_p50_s", "tpot_p95_s"):
        ok = valid_latency_rows(data, t) & below
        y = data.targets[t][ok]
        out[t] = np.abs(pred[t][ok] - y) / y
    ok = valid_latency_rows(data, "gpu_busy_frac") & below
    out["gpu_busy_frac"] = np.abs(pred["gpu_busy_frac"][ok] - data.targets["gpu_busy_frac"][ok])
    ok = valid_cache_rows(data)
    hit, _ = m.predict_hit_rate(data.subset(ok).cache)
    out["hit_rate"] = np.abs(hit - data.targets["hit_rate"][ok])
    return out


def _summ(errs: dict[str, np.ndarray]) -> dict[str, float | int]:
    def mean(a):
        return float(np.mean(a)) if len(a) else math.nan

    return {"ttft_p95_mape": mean(errs["ttft_p95_s"]), "tpot_p95_mape": mean(errs["tpot_p95_s"]),
            "ttft_p50_mape": mean(errs["ttft_p50_s"]), "tpot_p50_mape": mean(errs["tpot_p50_s"]),
            "hit_rate_mae": mean(errs["hit_rate"]), "gpu_busy_frac_mae": mean(errs["gpu_busy_frac"]),
            "latency_windows": int(len(errs["ttft_p95_s"])),
            "hit_windows": int(len(errs["hit_rate"]))}


def coupling_figures(train_recs, test_recs, seed: int) -> dict:
    from controller.bench.recordings import trace_of

    traces = sorted({trace_of(r.label) for r in test_recs})
    global_data, global_phys = _data(train_recs)
    global_model = fit_coupling(global_data, global_phys, np.random.default_rng(seed), seed=seed)
    pooled: dict[str, list[dict[str, np.ndarray]]] = {"prior": [], "per_trace": [], "global": []}
    # the same models judged by the utilisation rule alone
    rho_only: dict[str, list[dict[str, np.ndarray]]] = {"prior": [], "global": []}
    per_trace: dict[str, dict] = {}
    for tr in traces:
        tr_train = [r for r in train_recs if trace_of(r.label) == tr]
        tr_test = [r for r in test_recs if trace_of(r.label) == tr]
        d_train, p_train = _data(tr_train)
        d_test, p_test = _data(tr_test)
        local = fit_coupling(d_train, p_train, np.random.default_rng(seed), seed=seed)
        row: dict[str, Any] = {}
        for name, model in (("prior", CouplingModels.prior_only(p_test)), ("per_trace", local),
                            ("global", global_model)):
            e = _errors(model, d_test, p_test)
            pooled[name].append(e)
            row[name] = _summ(e)
            if name in rho_only:
                e2 = _errors(model, d_test, p_test, queue_rule=False)
                rho_only[name].append(e2)
                row[name + "_utilisation_rule_only"] = _summ(e2)
        row["training_windows"] = int(d_train.steady.sum())
        per_trace[tr] = row
    out: dict[str, Any] = {}
    for name, parts in pooled.items():
        merged = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        out[name] = _summ(merged)
    for name, parts in rho_only.items():
        merged = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        out[name + "_utilisation_rule_only"] = _summ(merged)
    out["per_trace_detail"] = per_trace
    return out


# --------------------------------------------------------------------------- forecasts


def forecast_figures(seed: int) -> dict:
    from controller.paths import shared_data_dir
    from controller.sim.scenario import ServeGenSpec
    from controller.sim.trace_servegen import read_servegen_rates, servegen_arrivals
    from controller.sim.traces import read_trace_file

    d = shared_data_dir() / "traces"
    out: dict[str, dict] = {}
    rates = read_servegen_rates(d / "servegen_14day_rates.csv")
    for tier in ("m-large", "m-mid", "m-small"):
        t = rates.window_start_s + 300.0
        r = rolling_backtest(t, rates.rate_rps[tier], config=ForecastConfig(step_s=600.0, slot_s=600.0),
                             horizon_s=600.0, start_s=86_400.0, history_for_predict_s=6 * 3600.0)
        out[f"servegen-shape-{tier}"] = r
        _progress(f"forecast servegen shape {tier}: ratio {r['ratio']:.3f}")
    tr = servegen_arrivals(rates, ServeGenSpec(tier="m-small", mean_rps=2.0, days=14.0, start_day=0.0),
                           np.random.default_rng(seed))
    edges = np.arange(0.0, 14 * 86_400.0 + 60.0, 60.0)
    counts = np.histogram(tr.arrival_s, bins=edges)[0] / 60.0
    out["servegen-arrivals-m-small"] = rolling_backtest(edges[:-1] + 30.0, counts, config=ForecastConfig(step_s=60.0),
                                                        horizon_s=600.0, start_s=86_400.0)
    _progress(f"forecast servegen arrivals: ratio {out['servegen-arrivals-m-small']['ratio']:.3f}")
    for name in ("azure2023_conv", "azure2023_code"):
        tr = read_trace_file(d / f"{name}.csv", "azure")
        edges = np.arange(0.0, tr.arrival_s[-1] + 60.0, 60.0)
        counts = np.histogram(tr.arrival_s, bins=edges)[0] / 60.0
        out[name] = rolling_backtest(edges[:-1] + 30.0, counts, config=ForecastConfig(step_s=60.0), horizon_s=600.0,
                                     start_s=900.0)
        _progress(f"forecast {name}: ratio {out[name]['ratio']:.3f}")
    return out


# --------------------------------------------------------------------------- timing


def timing_figures(train_recs, seed: int) -> dict:
    """Fit on one hour × 10 pools (2,400 rows built from real training windows) and predict 100k rows."""
    data, phys = _data(train_recs)
    reps = int(math.ceil(2400 / max(len(data), 1)))
    big, big_phys = concat_training_data([(data, phys)] * reps)
    big = big.subset(np.arange(len(big)) < 2400)
    series = {f"arrival_rps:{c}": (np.arange(240) * 15.0, 5.0 + np.sin(np.arange(240) / 20.0))
              for c in ("critical", "standard", "sheddable")}
    series["prompt_tokens_per_request"] = (np.arange(240) * 15.0, 1000.0 + 50 * np.cos(np.arange(240) / 30.0))
    series["output_tokens_per_request"] = (np.arange(240) * 15.0, 200.0 + 10 * np.cos(np.arange(240) / 25.0))
    t0 = time.process_time()
    models = fit_coupling(big, big_phys, np.random.default_rng(seed), seed=seed)
    fit_forecaster(series)
    fit_s = time.process_time() - t0

    rng = np.random.default_rng(seed)
    rows = 100_000
    k = len(models.physics)
    pool = np.arange(rows) % 10
    phys_idx = pool % k
    cache = CacheInputs.build(
        rows, physics_index=phys_idx, replicas=rng.integers(1, 17, rows), arrival_rps=rng.uniform(1, 40, rows),
        prompt_tokens=rng.uniform(200, 8000, rows), output_tokens=rng.uniform(20, 500, rows),
        reuse_hit_at=np.tile(np.linspace(0.05, 0.4, 10), (10, 1)), reuse_index=pool,
        prefix_weight=rng.choice([0.0, 1.0, 3.0, 8.0], rows))
    latency = LatencyInputs.build(
        rows, physics_index=phys_idx, arrival_rps_per_replica=cache.arrival_rps / cache.replicas,
        prompt_tokens=cache.prompt_tokens, output_tokens=cache.output_tokens,
        inflight_cap=rng.choice([0, 16, 64], rows), arrival_dispersion=rng.uniform(1, 10, rows))
    models.predict(cache, latency)  # warm-up
    cpu, wall = [], []
    for _ in range(9):
        t0, c0 = time.perf_counter(), time.process_time()
        models.predict(cache, latency)
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - t0)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else math.nan
    # predict_ms_10k: the best of 9 runs in CPU time of this (single-threaded) process — what one
    # core does; the median wall time shows what sharing the machine added
    return {"fit_seconds": fit_s, "fit_rows": len(big), "predict_ms_10k": 1000.0 * float(min(cpu)),
            "predict_ms_10k_median_wall": 1000.0 * float(np.median(wall)), "predict_rows": rows,
            "load_average_1m": load, "cpus": os.cpu_count()}


# --------------------------------------------------------------------------- command


def _single_thread() -> None:
    # one core: keep BLAS/OpenMP pools to one thread before numpy work starts
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    try:
        from threadpoolctl import threadpool_limits

        threadpool_limits(1)
    except Exception:  # noqa: BLE001 - best effort: without threadpoolctl the env variables above still apply
        pass


def cmd_bench_models(args) -> int:
    _single_thread()
    seed = int(args.seed)
    t0 = time.perf_counter()
    train, test = _recordings(seed)
    _progress(f"bench models: {len(train)} training and {len(test)} test recordings ready")
    coupling = coupling_figures(train, test, seed)
    forecast = forecast_figures(seed)
    timing = timing_figures(train, seed)
    sg = [forecast[f"servegen-shape-{t}"]["ratio"] for t in ("m-large", "m-mid", "m-small")]
    head = coupling["global"]
    result = {
        "seed": seed,
        "ttft_p95_mape": head["ttft_p95_mape"],
        "tpot_p95_mape": head["tpot_p95_mape"],
        "hit_rate_mae": head["hit_rate_mae"],
        "forecast_mae_ratio_vs_seasonal_naive": float(max(sg)),
        "forecast_ratios": {k: v["ratio"] for k, v in forecast.items()},
        "fit_seconds": timing["fit_seconds"],
        "predict_ms_10k": timing["predict_ms_10k"],
        "coupling": coupling,
        "forecast": forecast,
        "timing": timing,
        "definitions": {
            "coupling_models": "global = fitted on all training runs (the shipped models; headline); per_trace = "
                               "fitted on that trace's training runs only; prior = uncalibrated, no correction",
            "test_windows": "60 s telemetry windows, steady part of 450 s fixed-setting segments of test runs "
                            "(later trace segments / another ServeGen day, other fleet sizes and seeds)",
            "below_saturation": f"prior engine utilisation < {MAX_RHO}, fewer than 1 request waiting per replica in "
                                "the engines at the window's end (vllm:num_requests_waiting: vLLM queues only what it "
                                "cannot schedule), at least 30 requests in the window; *_utilisation_rule_only: "
                                "the same without the queue rule",
            "forecast_headline": "worst ServeGen tier (14-day rate shape, 600 s windows, 10-minute horizon) of "
                                 "MAE / seasonal-naive MAE (period one day)",
        },
        "bench_seconds": time.perf_counter() - t0,
    }
    if args.json:
        from controller.learning.store import clean_json

        print(json.dumps(clean_json(result)))
        return 0
    _print_table(result)
    return 0


def _print_table(r: dict) -> None:
    def f(v, pct=False):
        if v is None or (isinstance(v, float) and not math.isfinite(v)):
            return "—"
        return f"{100 * v:.1f}%" if pct else f"{v:.3f}"

    print("Coupling models on test windows (below saturation):")
    print(f"  {'model':<10} {'trace':<12} {'TTFT p95':>9} {'TPOT p95':>9} {'TTFT p50':>9} {'TPOT p50':>9} "
          f"{'hit MAE':>8} {'windows':>8}")
    for name in ("global", "per_trace", "prior"):
        s = r["coupling"][name]
        print(f"  {name:<10} {'all':<12} {f(s['ttft_p95_mape'], 1):>9} {f(s['tpot_p95_mape'], 1):>9} "
              f"{f(s['ttft_p50_mape'], 1):>9} {f(s['tpot_p50_mape'], 1):>9} {f(s['hit_rate_mae']):>8} "
              f"{s['latency_windows']:>8}")
        for tr, row in r["coupling"]["per_trace_detail"].items():
            s = row[name]
            print(f"  {'':<10} {tr:<12} {f(s['ttft_p95_mape'], 1):>9} {f(s['tpot_p95_mape'], 1):>9} "
                  f"{f(s['ttft_p50_mape'], 1):>9} {f(s['tpot_p50_mape'], 1):>9} {f(s['hit_rate_mae']):>8} "
                  f"{s['latency_windows']:>8}")
    for name in ("global_utilisation_rule_only", "prior_utilisation_rule_only"):
        s = r["coupling"][name]
        print(f"  {name} (no queue rule): TTFT p95 {f(s['ttft_p95_mape'], 1)}, TPOT p95 {f(s['tpot_p95_mape'], 1)}, "
              f"{s['latency_windows']} windows")
    print("Forecast, 10-minute horizon, MAE / seasonal-naive MAE (below 1 is better):")
    for k, v in r["forecast"].items():
        print(f"  {k:<28} {f(v['ratio'])}   (MAE {f(v['mae'])}, naive {f(v['naive_mae'])}, p90 coverage "
              f"{f(v['coverage_p90'], 1)}, n {v['n']})")
    t = r["timing"]
    print(f"Fit (1 h × 10 pools, {t['fit_rows']} rows): {r['fit_seconds']:.2f} s CPU   "
          f"Predict 10,000 plans × 10 pools: {r['predict_ms_10k']:.1f} ms CPU (best of 9; median wall "
          f"{t['predict_ms_10k_median_wall']:.1f} ms; load average {t['load_average_1m']:.1f} on {t['cpus']} CPUs)")
