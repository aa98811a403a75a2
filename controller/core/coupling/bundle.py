"""The fitted model bundle and its prediction: `CouplingModels` (physics, calibration and
corrections of a fleet) predicts hit rate, latency quantiles, capacity and GPU busy fraction for
many rows at once (`Prediction`), and the sustainable rate under SLOs.

Immutable: a refit (controller/learning/fit.py) builds a new bundle and the edge swaps the reference.

Must not: fit, do I/O, read the clock or import the simulator.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np

from controller.core.coupling.cache_prior import CacheInputs, cache_prior
from controller.core.coupling.corrections import Correction
from controller.core.coupling.features import (
    LATENCY_FEATURE_NAMES,
    LATENCY_TARGETS,
    UPPER_TARGETS,
    cache_features,
    latency_shared_features,
)
from controller.core.coupling.latency_prior import LatencyInputs, LatencyPrior, latency_prior
from controller.core.coupling.numeric import as_rows, clamp, logit, sigmoid, stack_columns
from controller.core.coupling.physics import Calibration, PhysicsTable, PoolPhysics

# CouplingModels._latency_plan's stacked corrections (see its docstring)
_LatencyPlan = tuple[list[str], list[str], np.ndarray, np.ndarray, np.ndarray, np.ndarray, Any]

@dataclass(frozen=True)
class Prediction:
    """Bulk prediction for n rows (candidate plans × pools). Latencies in seconds."""

    hit_rate: np.ndarray
    ttft_p50_s: np.ndarray
    ttft_p95_s: np.ndarray
    tpot_p50_s: np.ndarray
    tpot_p95_s: np.ndarray
    ttft_p95_upper_s: np.ndarray  # upper band: the 0.9 quantile of the window p95 (for chance constraints)
    tpot_p95_upper_s: np.ndarray
    gpu_busy_frac: np.ndarray
    capacity_rps_per_replica: np.ndarray  # ρ = 1 arrival rate per replica at this mix (prior)
    router_wait_p95_s: np.ndarray  # queueing at the router behind an in-flight cap (add to TTFT for clients)
    utilisation: np.ndarray  # ρ: arrivals / capacity; ≥ 1 means saturated (latency predictions unreliable)
    confidence: np.ndarray  # 0 = prior only (little or no matching data) … 1 = well inside the training data

    @property
    def saturated(self) -> np.ndarray:
        return self.utilisation >= 1.0


@dataclass(frozen=True)
class CouplingModels:
    """The fitted cache, latency and busy-fraction models of a fleet, plus their physics.

    Immutable: a refit builds a new one and the edge swaps the reference.
    """

    physics: tuple[PoolPhysics, ...]
    corrections: Mapping[str, Correction]  # by target (and "<target>@upper")
    seed: int = 0
    n_train: int = 0
    train_window_s: tuple[float, float] = (0.0, 0.0)
    holdout_errors: Mapping[str, float] = field(default_factory=dict)
    calibration: Mapping[str, Calibration] = field(default_factory=dict)  # per physics key
    table: PhysicsTable = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "table", PhysicsTable(self.physics, self.calibration))

    # -- construction

    @staticmethod
    def prior_only(physics: Sequence[PoolPhysics]) -> CouplingModels:
        """No data: every correction is empty and confidence is 0."""
        return CouplingModels(physics=tuple(physics), corrections={})

    def physics_index(self, key: str) -> int:
        return self.table.index(key)

    # -- prediction

    def predict_hit_rate(self, x: CacheInputs) -> tuple[np.ndarray, np.ndarray]:
        """(hit rate, confidence) per row."""
        prior = cache_prior(self.table, x)
        corr = self.corrections.get("hit_rate")
        if corr is None or corr.data_weight <= 0.0:
            return prior.hit_rate, np.zeros(len(x))
        X = cache_features(prior, x)
        w = corr.weight(X)
        if corr.estimator is None:  # declined by cross-validation: the prior, with its confidence
            return prior.hit_rate, w
        z = logit(np.maximum(prior.hit_rate, 1e-4)) + w * corr.residual(X)
        hit = sigmoid(z)
        # a traffic without reuse has no hits whatever the correction says
        hit = np.where(prior.inf_hit < 1e-3, 0.0, np.minimum(hit, prior.inf_hit))
        return hit, w

    def _latency_plan(self) -> _LatencyPlan:
        """The latency corrections stacked for one matrix product (cached on the instance).

        Returns (column names, base target of each column, first-feature coefficients (m,),
        shared-feature coefficients (11, m), intercepts (m,), data weights (m,), the correction
        whose training ranges give the coverage). Columns without an estimator have zero
        coefficients, i.e. the prior.
        """
        cached: _LatencyPlan | None = self.__dict__.get("_plan")
        if cached is not None:
            return cached
        names: list[str] = []
        bases: list[str] = []
        c0, ct, ic, dw = [], [], [], []
        ref = None
        m = len(LATENCY_FEATURE_NAMES)
        for t in LATENCY_TARGETS + ("gpu_busy_frac",):
            main = self.corrections.get(t)
            for name in (t, t + "@upper") if t in UPPER_TARGETS else (t,):
                corr = self.corrections.get(name)
                if name.endswith("@upper") and (corr is None or corr.estimator is None):
                    continue  # no upper model: the holdout spread stands in (see predict_latency)
                names.append(name)
                bases.append(t)
                weight = main.data_weight if main is not None else 0.0
                if corr is not None and corr.estimator is not None and weight > 0.0:
                    coef = np.asarray(corr.estimator.coef_, dtype=float)
                    c0.append(coef[0])
                    ct.append(coef[1:])
                    ic.append(float(corr.estimator.intercept_))
                else:
                    c0.append(0.0)
                    ct.append(np.zeros(m - 1))
                    ic.append(0.0)
                dw.append(weight)
                if ref is None and main is not None and main.data_weight > 0.0:
                    ref = main
        plan = (names, bases, np.array(c0), np.array(ct).T, np.array(ic), np.array(dw), ref)
        object.__setattr__(self, "_plan", plan)
        return plan

    def predict_latency(self, x: LatencyInputs) -> tuple[dict[str, np.ndarray], LatencyPrior, np.ndarray]:
        """Latency/busy predictions by target (plus "<t>@upper"), the prior, and the min confidence.

        All corrections are applied at once: residuals R = log(prior)·c₀ + S·C + b for every
        column (one matrix product), each weighted by data_weight × coverage (one coverage for
        all latency targets: their shared features were trained on the same rows).
        """
        prior = latency_prior(self.table, x)
        names, bases, c0, ct, ic, dw, ref = self._latency_plan()
        n = len(x)
        out: dict[str, np.ndarray] = {}
        if ref is None:  # no data at all: the prior, confidence 0
            for t in LATENCY_TARGETS + ("gpu_busy_frac",):
                out[t] = getattr(prior, t)
            conf = np.zeros(n)
        else:
            S = latency_shared_features(prior, x)
            coverage = ref.coverage_tail(S)
            # columns without an estimator are the prior itself (their residual is 0): skip them
            act = [j for j in range(len(names)) if c0[j] != 0.0 or ic[j] != 0.0 or np.any(ct[:, j] != 0.0)]
            for j, name in enumerate(names):
                if j not in act:
                    out[name] = getattr(prior, bases[j])
            if act:
                B = stack_columns([getattr(prior, bases[j]) for j in act])
                R = np.log(np.maximum(B, 1e-4))
                R *= c0[act]
                R += S @ ct[:, act]
                R += ic[act]
                np.maximum(R, -ref.residual_clip, out=R)
                np.minimum(R, ref.residual_clip, out=R)
                W = coverage[:, None] * dw[act][None, :]
                R *= W
                np.exp(R, out=R)
                R *= B
                for jj, j in enumerate(act):
                    out[names[j]] = R[:, jj]
            main_w = [dw[j] for j, name in enumerate(names) if "@" not in name]
            conf = coverage * min(main_w) if main_w else np.zeros(n)
        for t in UPPER_TARGETS:
            # without an upper model: the holdout spread (log-space q90 of errors), else ×1.5
            spread = self.holdout_errors.get(t + "_log_q90", math.log(1.5))
            up = out.get(t + "@upper")
            out[t + "@upper"] = np.maximum(up if up is not None else out[t] * math.exp(spread), out[t])
        out["gpu_busy_frac"] = clamp(out["gpu_busy_frac"], 0.0, 1.0)
        return out, prior, conf

    def predict(self, cache: CacheInputs, latency: LatencyInputs | None = None) -> Prediction:
        """Hit rate from the cache model, then latency at that hit rate (the coupling).

        Large inputs are evaluated in blocks of PREDICT_BLOCK rows: the prior makes a few hundred
        temporary arrays, which the allocator then recycles within a bounded footprint.
        """
        n = len(cache)
        if latency is not None and len(latency) != n:
            raise ValueError(f"predict: cache has {n} rows, latency {len(latency)}")
        if n <= PREDICT_BLOCK:
            return self._predict(cache, latency)
        names = [f.name for f in fields(Prediction)]
        out = {name: np.empty(n) for name in names}
        for a in range(0, n, PREDICT_BLOCK):
            b = min(a + PREDICT_BLOCK, n)
            part = self._predict(_rows(cache, a, b), None if latency is None else _rows(latency, a, b))
            for name in names:
                out[name][a:b] = getattr(part, name)
        return Prediction(**out)

    def _predict(self, cache: CacheInputs, latency: LatencyInputs | None = None) -> Prediction:
        """Hit rate from the cache model, then latency at that hit rate (the coupling).

        `latency` carries the per-replica load and batching levers; its hit_rate is replaced by the
        cache model's prediction. When None, it is derived from `cache` (no in-flight cap, engine
        defaults).
        """
        hit, conf_c = self.predict_hit_rate(cache)
        n = len(cache)
        if latency is None:
            latency = LatencyInputs.build(
                n, physics_index=cache.physics_index,
                arrival_rps_per_replica=cache.arrival_rps / np.maximum(cache.replicas, 1.0),
                prompt_tokens=cache.prompt_tokens, output_tokens=cache.output_tokens)
        latency = LatencyInputs(**{**{f.name: getattr(latency, f.name) for f in fields(latency)}, "hit_rate": hit})
        lat, prior, conf_l = self.predict_latency(latency)
        return Prediction(
            hit_rate=hit, ttft_p50_s=lat["ttft_p50_s"], ttft_p95_s=lat["ttft_p95_s"], tpot_p50_s=lat["tpot_p50_s"],
            tpot_p95_s=lat["tpot_p95_s"], ttft_p95_upper_s=lat["ttft_p95_s@upper"],
            tpot_p95_upper_s=lat["tpot_p95_s@upper"], gpu_busy_frac=lat["gpu_busy_frac"],
            capacity_rps_per_replica=prior.capacity_rps, router_wait_p95_s=prior.router_wait_p95_s,
            utilisation=prior.rho,
            confidence=np.where(cache.reuse_hit_at[:, -1][cache.reuse_index] < 1e-3,
                                conf_l, np.minimum(conf_c, conf_l)),
        )

    def sustainable_rps(self, x: LatencyInputs, ttft_p95_slo_s: Any, tpot_p95_slo_s: Any, *,
                        upper: bool = False, iterations: int = 24) -> np.ndarray:
        """Capacity model: the largest arrival rate per replica whose predicted p95 TTFT and TPOT stay
        within the SLOs (bisection on λ, vectorised over rows; 0 if even an idle replica misses them).

        With upper=True the upper band (q = 0.9 of the window p95) must meet the SLO: a cautious
        capacity for chance constraints. Tokens/s at that rate: × prompt_tokens / output_tokens.
        """
        n = len(x)
        ttft_slo = as_rows(ttft_p95_slo_s, n, "ttft_p95_slo_s")
        tpot_slo = as_rows(tpot_p95_slo_s, n, "tpot_p95_slo_s")
        hi = latency_prior(self.table, x).capacity_rps * 1.0  # never beyond saturation
        lo = np.zeros(n)
        names = ("ttft_p95_s@upper", "tpot_p95_s@upper") if upper else ("ttft_p95_s", "tpot_p95_s")
        base = {f.name: getattr(x, f.name) for f in fields(x)}
        for _ in range(iterations):
            mid = 0.5 * (lo + hi)
            lat, _, _ = self.predict_latency(LatencyInputs(**{**base, "arrival_rps_per_replica": mid}))
            ok = (lat[names[0]] <= ttft_slo) & (lat[names[1]] <= tpot_slo)
            lo = np.where(ok, mid, lo)
            hi = np.where(ok, hi, mid)
        return lo


# Rows per block of a bulk predict: the prior's few hundred temporaries of a block stay within what
# the allocator keeps (see controller/runtime/allocator.py; 65,536 rows ≈ 30 MB of them), and a
# block is large enough that numpy's per-call overhead is small against its arithmetic.
PREDICT_BLOCK = 65536


def _rows(x: Any, a: int, b: int) -> Any:
    """Rows [a, b) of a LatencyInputs or CacheInputs (views; a CacheInputs keeps its profile table)."""
    return type(x)(**{f.name: (getattr(x, f.name) if f.name == "reuse_hit_at" else getattr(x, f.name)[a:b])
                      for f in fields(x)})


def with_physics(models: CouplingModels, physics: Sequence[PoolPhysics]) -> CouplingModels:
    """The same corrections over another set of pool physics (the corrections are physics-free:
    their features are dimensionless or logs of prior terms), e.g. a shipped model for a new fleet."""
    return replace(models, physics=tuple(physics))


# --------------------------------------------------------------------------- reuse profile from telemetry

# Shape of a reuse profile when only the hit rate is known (the Mooncake conversation trace's,
# normalised to h∞ = 1): most reuse within minutes, a tail to an hour.
DEFAULT_REUSE_SHAPE = np.array([0.14, 0.27, 0.38, 0.49, 0.59, 0.76, 0.86, 0.95, 0.98, 1.0])


def infer_reuse_profile(models: CouplingModels, x: CacheInputs, observed_hit: np.ndarray, *,
                        shape: np.ndarray = DEFAULT_REUSE_SHAPE, iterations: int = 30) -> np.ndarray:
    """Reuse profiles (rows × len(REUSE_TAU_S)) that make the cache model reproduce `observed_hit`
    under each row's current settings: h∞ × shape, h∞ found by bisection (the model is monotone
    in h∞). For a deployment whose router does not report prefix reuse: the planner calls this
    once per tick with the pools' current state, then asks "what if" with the returned profiles.
    Rows whose observed hit is NaN get no reuse (zeros).
    """
    n = len(x)
    obs = np.asarray(observed_hit, dtype=float)
    lo, hi = np.zeros(n), np.ones(n)
    shape = np.asarray(shape, dtype=float)
    base = {f.name: getattr(x, f.name) for f in fields(x)}
    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        prof = mid[:, None] * shape[None, :]
        probe = CacheInputs(**{**base, "reuse_hit_at": prof, "reuse_index": np.arange(n)})
        hit, _ = models.predict_hit_rate(probe)
        low = hit < obs
        lo = np.where(low, mid, lo)
        hi = np.where(low, hi, mid)
    h_inf = np.where(np.isfinite(obs), 0.5 * (lo + hi), 0.0)
    res: np.ndarray = h_inf[:, None] * shape[None, :]
    return res
