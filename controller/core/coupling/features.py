"""What the learned corrections predict and from what: the targets, and the correction features
built from the priors' own intermediate terms (all dimensionless or logs, so a correction carries
over to other pool physics).

(Observations → model inputs is controller/core/observations.py; this module starts from a prior.)

Must not: fit anything or do I/O.
"""

from __future__ import annotations

import numpy as np

from controller.core.coupling.cache_prior import CacheInputs, CachePrior
from controller.core.coupling.latency_prior import RHO_CLIP, LatencyInputs, LatencyPrior
from controller.core.coupling.numeric import clamp, logit, stack_columns

LATENCY_TARGETS = ("ttft_p50_s", "ttft_p95_s", "tpot_p50_s", "tpot_p95_s")
UPPER_TARGETS = ("ttft_p95_s", "tpot_p95_s")  # these also get an upper-band (q=0.9) correction
ALL_TARGETS = ("hit_rate",) + LATENCY_TARGETS + ("gpu_busy_frac",)


def latency_features(prior: LatencyPrior, x: LatencyInputs, target: str) -> np.ndarray:
    """Features of the latency/busy correction for one target: log of the target's prior, then the
    shared prior terms (all dimensionless or logs)."""
    return np.column_stack([np.log(np.maximum(getattr(prior, target), 1e-4)), latency_shared_features(prior, x)])


def latency_shared_features(prior: LatencyPrior, x: LatencyInputs) -> np.ndarray:
    """The target-independent columns of latency_features (computed once per bulk predict)."""
    rho_c = np.minimum(prior.rho_engine, RHO_CLIP)
    return stack_columns([
        rho_c,
        rho_c / (1.0 - rho_c),
        np.minimum(prior.rho_prefill, 2.0),
        prior.prefill_frac,
        np.log(prior.prefill_step_frac),
        np.log1p(prior.batch),
        np.log(np.maximum(prior.uncached_prompt_tokens, 1.0)),
        np.log(np.maximum(x.output_tokens, 1.0)),
        np.log(np.maximum(prior.decode_step_s, 1e-4)),
        clamp(x.hit_rate, 0.0, 1.0),
        np.log(clamp(x.arrival_dispersion, 0.5, 100.0)),
    ])


LATENCY_FEATURE_NAMES = ("log_prior", "rho", "rho_over_slack", "rho_prefill", "prefill_frac", "log_prefill_step_frac",
                         "log1p_batch", "log_uncached_prompt", "log_output", "log_decode_step", "hit_rate",
                         "log_dispersion")


def cache_features(prior: CachePrior, x: CacheInputs) -> np.ndarray:
    return stack_columns([
        logit(prior.hit_rate),
        prior.affinity,
        1.0 / np.maximum(x.replicas, 1.0),
        np.log(np.maximum(prior.retention_s, 1e-2)),
        prior.inf_hit,
        logit(np.maximum(prior.temporal_hit, 1e-4)),
        np.log1p(np.maximum(x.arrival_rps, 0.0) / np.maximum(x.replicas, 1.0)),
    ])


CACHE_FEATURE_NAMES = ("logit_prior", "affinity", "inv_replicas", "log_retention", "inf_hit", "logit_temporal",
                       "log1p_rps_per_replica")
