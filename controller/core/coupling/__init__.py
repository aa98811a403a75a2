"""Learned coupling models: prefix-cache hit rate, latency quantiles, capacity and GPU busy fraction.

Grey-box (DESIGN.md §6). Each model is a physical or queueing *prior*, computed in closed form
from the pool's step-time physics, then two learned layers fitted on observed steady windows.
The prior predicts the statistic the telemetry reports: the p95s are read from the prior's TTFT
and ITL distributions through vLLM's histogram buckets, as histogram_quantile does (a decode-only
pool whose ITLs all fall in (10, 25] ms reads p95 = 24.25 ms, whatever its true p95).

1. calibration: physical knobs of the prior per replica type (all step times × time_scale,
   queueing stretch × wait_scale by robust least squares; the TTFT tail width by a grid search),
   kept only if it beats the uncalibrated prior on time-blocked cross-validation;
2. correction: a scikit-learn QuantileRegressor (median; q = 0.9 for the p95 upper bands) on
   features derived from the prior's own intermediate terms (utilisation, batch size, prefill
   share...), in log space (latency, busy fraction) or logit space (hit rate):

       log ŷ = log prior_cal + w · r̂(x)        logit ŷ = logit prior + w · r̂(x)

   kept only if it beats the calibrated prior on time-blocked cross-validation, judged by the
   acceptance metric (absolute percentage error for latency, absolute error for the hit rate:
   an over-prediction costs without bound, an under-prediction at most 100 %).

w ∈ [0, 1] is the *confidence*: how much data the model saw (`data_weight`) times how close the
query is to that data (`coverage`). With little data, or far outside it, w → 0 and the prior
alone answers — and says so, through the returned `confidence`.

Every predict function takes flat numpy arrays (one row per candidate plan × pool) and is
vectorised: 10,000 plans × 10 pools is one call (see `governor bench models`).

This package holds what the planner and the daemon need to *predict*:

    physics.py        PoolPhysics, Calibration, PhysicsTable (step-time tables)
    latency_prior.py  LatencyInputs → LatencyPrior (queueing prior of TTFT/TPOT, capacity, busy)
    cache_prior.py    CacheInputs → CachePrior (LRU retention prior of the hit rate)
    buckets.py        histogram_quantile over vLLM's buckets (what the telemetry's p95 reads)
    features.py       targets and the corrections' features
    corrections.py    Correction (a fitted residual and its confidence)
    models.py         CouplingModels (the bundle) and Prediction
    state.py          CouplingModels ⇄ plain dict (for the store)

Fitting, calibration and evaluation are at the learning edge (controller/learning/fit.py,
controller/learning/evaluate.py, training rows in controller/learning/training_data.py).

Must not: do I/O, read the clock, use global randomness, or import the simulator. The pool
physics arrive as `PoolPhysics` values, built at the edge (controller/learning/physics.py).
"""

from controller.core.coupling.buckets import ITL_BUCKETS_S, TTFT_BUCKETS_S
from controller.core.coupling.bundle import (
    DEFAULT_REUSE_SHAPE,
    PREDICT_BLOCK,
    CouplingModels,
    Prediction,
    infer_reuse_profile,
    with_physics,
)
from controller.core.coupling.cache_prior import REUSE_TAU_S, CacheInputs, CachePrior, cache_prior, router_affinity
from controller.core.coupling.corrections import Correction
from controller.core.coupling.features import (
    ALL_TARGETS,
    CACHE_FEATURE_NAMES,
    LATENCY_FEATURE_NAMES,
    LATENCY_TARGETS,
    UPPER_TARGETS,
    cache_features,
    latency_features,
    latency_shared_features,
)
from controller.core.coupling.latency_prior import LatencyInputs, LatencyPrior, latency_prior
from controller.core.coupling.physics import TOKEN_GRID, Calibration, PhysicsTable, PoolPhysics
from controller.core.coupling.state import STATE_FORMAT, coupling_from_state, coupling_to_state

__all__ = [
    "ALL_TARGETS", "CACHE_FEATURE_NAMES", "DEFAULT_REUSE_SHAPE", "ITL_BUCKETS_S", "LATENCY_FEATURE_NAMES",
    "LATENCY_TARGETS", "PREDICT_BLOCK", "REUSE_TAU_S", "STATE_FORMAT", "TOKEN_GRID",
    "TTFT_BUCKETS_S", "UPPER_TARGETS", "CacheInputs", "CachePrior", "Calibration", "Correction", "CouplingModels",
    "LatencyInputs", "LatencyPrior", "PhysicsTable", "PoolPhysics", "Prediction", "cache_features",
    "cache_prior", "coupling_from_state", "coupling_to_state", "infer_reuse_profile", "latency_features",
    "latency_prior", "latency_shared_features", "router_affinity", "with_physics",
]
