"""The cache prior: a pool's prefix-cache token hit rate from LRU retention, the router's cache
affinity and the traffic's reuse profile, per row (candidate plan × pool), vectorised.

`CacheInputs` are the rows (with the reuse profiles on `REUSE_TAU_S`); `cache_prior` returns a
`CachePrior` holding the hit rate and the terms the learned correction uses as features.

Must not: fit anything, do I/O or import the simulator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from controller.core.coupling.numeric import as_rows, clamp
from controller.core.coupling.physics import TOKEN_GRID, PhysicsTable

# Reuse-time grid of a ReuseProfile: hit_at[k] = fraction of prompt tokens whose block was last
# referenced less than REUSE_TAU_S[k] seconds earlier. The last entry (inf) is what an infinite
# cache would hit.
REUSE_TAU_S = np.array([5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, math.inf])


@dataclass(frozen=True)
class CacheInputs:
    """One row per (candidate plan, pool). All arrays shape (n,); reuse_hit_at shape (n, len(REUSE_TAU_S))
    or (n_profiles, len(REUSE_TAU_S)) with reuse_index selecting a row per input row."""

    physics_index: np.ndarray
    replicas: np.ndarray  # serving replicas in the pool
    arrival_rps: np.ndarray  # requests/s into the pool (all replicas)
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    prefix_weight: np.ndarray  # router scorer weights; cache affinity is prefix_weight
    queue_weight: np.ndarray
    kv_weight: np.ndarray
    reuse_hit_at: np.ndarray  # (n_profiles, K): the traffic's reuse profile (ReuseProfile.hit_at)
    reuse_index: np.ndarray  # (n,) int: which profile row applies

    @staticmethod
    def build(n: int, *, physics_index: Any, replicas: Any, arrival_rps: Any, prompt_tokens: Any, output_tokens: Any,
              reuse_hit_at: Any, reuse_index: Any = 0, prefix_weight: Any = 3.0, queue_weight: Any = 2.0,
              kv_weight: Any = 2.0) -> CacheInputs:
        prof = np.asarray(reuse_hit_at, dtype=float)
        if prof.ndim == 1:
            prof = prof[None, :]
        if prof.ndim != 2 or prof.shape[1] != len(REUSE_TAU_S):
            raise ValueError(f"reuse_hit_at: expected shape (profiles, {len(REUSE_TAU_S)}), got {prof.shape}")
        idx = as_rows(reuse_index, n, "reuse_index").astype(np.intp)
        if n and (idx.min() < 0 or idx.max() >= len(prof)):
            raise ValueError(f"reuse_index: values must be in [0, {len(prof) - 1}]")
        return CacheInputs(
            physics_index=as_rows(physics_index, n, "physics_index").astype(np.intp),
            replicas=as_rows(replicas, n, "replicas"), arrival_rps=as_rows(arrival_rps, n, "arrival_rps"),
            prompt_tokens=as_rows(prompt_tokens, n, "prompt_tokens"),
            output_tokens=as_rows(output_tokens, n, "output_tokens"),
            prefix_weight=as_rows(prefix_weight, n, "prefix_weight"),
            queue_weight=as_rows(queue_weight, n, "queue_weight"),
            kv_weight=as_rows(kv_weight, n, "kv_weight"), reuse_hit_at=prof, reuse_index=idx,
        )

    def __len__(self) -> int:
        return len(self.replicas)


@dataclass(frozen=True)
class CachePrior:
    hit_rate: np.ndarray
    affinity: np.ndarray  # effective cache affinity of the router, 0..1
    retention_s: np.ndarray  # how long an unreferenced block survives in one replica's cache
    inf_hit: np.ndarray  # what an infinite cache would hit
    temporal_hit: np.ndarray  # hit of one infinite-affinity cache with this retention


def router_affinity(prefix_weight: np.ndarray, load_weight: np.ndarray) -> np.ndarray:
    """How strongly the router keeps a prefix on the replica that caches it, 0..1: the share of
    requests that follow their cached prefix, beyond what chance gives.

    The router's score is prefix_weight × prefix_frac − queue_weight × queue_norm − kv_weight × kv;
    the prefix term wins against a load imbalance of the same size when prefix_weight is large next
    to the mean load weight (queue_weight + kv_weight) / 2, so `load_weight` is their sum. Example:
    the defaults (3, 2 + 2) → 1 − e^(−1.5) = 0.78; no prefix weight → 0. The simulated router,
    replaying Mooncake conversations on 4 replicas, sent 0.78 of requests to a best-prefix replica
    beyond chance at the defaults (docs/decisions/0021-generated-step-time-table-and-one-affinity-formula.md).
    """
    res: np.ndarray = 1.0 - np.exp(-np.maximum(prefix_weight, 0.0) / np.maximum(0.5 * load_weight, 0.1))
    return res


def cache_prior(table: PhysicsTable, x: CacheInputs) -> CachePrior:
    """LRU retention prior for the pool's token hit rate.

    Each replica holds C free KV tokens (capacity minus the running requests' own blocks). New
    content enters at I tokens/s per replica: never-seen tokens, plus reused tokens that landed on
    a replica without them (1 − affinity of them, when R > 1). An unused block survives about
    T = C / I seconds. A reuse whose block was last used τ ago (fleet-wide) finds it:

    - routed with affinity (probability a): on the replica that used it, if it survived: T/(T + τ)
      (≈ 1 when τ ≪ T, ≈ T/τ when τ ≫ T);
    - routed at random (1 − a): on a replica that saw it within T; a block used every τ seconds
      fleet-wide reaches a given replica every R·τ: T/(T + R·τ). Popular prefixes (system
      prompts) are everywhere; a conversation's own history is on one replica in R.

    T/(T + τ) is P(the next use comes within T) when a block's use rate is exponentially spread
    around 1/τ (E[1 − e^(−rT)] over r ~ Exp(mean 1/τ)); it is also cheaper than an exponential.

        hit = Σ_k Δh_k · [a·T/(T + τ_k) + (1 − a)·T/(T + R·τ_k)]

    over the reuse profile's bins (Δh_k tokens reused after about τ_k). Example: all reuse at
    τ = 30 s, T = 60 s, R = 4: a = 1 → 0.67 of h∞; a = 0 → 0.33 of h∞.
    """
    k = x.physics_index
    R = np.maximum(x.replicas, 1.0)
    P = np.maximum(x.prompt_tokens, 1.0)
    O = np.maximum(x.output_tokens, 1.0)  # noqa: E741  O: output tokens, the formulas' symbol
    prof_tab = np.clip(x.reuse_hit_at, 0.0, 1.0)  # (profiles, K), cumulative in τ
    dh_tab = np.maximum(np.diff(prof_tab, axis=1, prepend=0.0), 0.0)  # per bin
    h_inf = prof_tab[x.reuse_index, -1]
    a = router_affinity(x.prefix_weight, x.queue_weight + x.kv_weight)
    lam = np.maximum(x.arrival_rps, 0.0)
    lam_r = lam / R
    # tokens held by running requests: λ_r × (residence ≈ 2 × O unloaded decode steps + 0.5 s) × context
    decode1 = table.decode_flat[k * len(TOKEN_GRID)]
    in_use = np.minimum(lam_r * (2.0 * O * decode1 + 0.5) * (P + 0.5 * O), 0.8 * table.kv[k])
    free = table.kv[k] - in_use
    unique = lam * P * (1.0 - h_inf)
    reinsert = lam * P * h_inf * (1.0 - a) * (1.0 - 1.0 / R)
    insert_r = np.maximum((unique + reinsert) / R, 1e-3)
    T = free / insert_r
    # g_p(T) = Σ_k Δh_k·T/(T + τ_k) for each profile p, tabulated on a log grid of T and read by
    # interpolation: two 1-D reads per row instead of a (rows × bins) sum.
    g_tab = _retention_table(dh_tab)
    temporal = _read_retention(g_tab, x.reuse_index, T)
    hit = a * temporal + (1.0 - a) * _read_retention(g_tab, x.reuse_index, T / R)
    return CachePrior(hit_rate=clamp(hit, 0.0, 1.0), affinity=a, retention_s=T, inf_hit=h_inf,
                      temporal_hit=temporal)


# log10 grid of retention times for g_p(T): 10 ms … 10^7 s, 16 points per decade
_RET_LOG10_LO, _RET_PER_DECADE, _RET_POINTS = -2.0, 16, 9 * 16 + 1
_RET_T = 10.0 ** (_RET_LOG10_LO + np.arange(_RET_POINTS) / _RET_PER_DECADE)


def _retention_table(dh_tab: np.ndarray) -> np.ndarray:
    """(profiles × _RET_POINTS) raveled: g_p(T) = Σ_k Δh_pk · T/(T + τ_k) on _RET_T."""
    frac = _RET_T[None, :] / (_RET_T[None, :] + _REUSE_BIN_TAU_S[:, None])  # (K, points)
    res: np.ndarray = (dh_tab @ frac).ravel()
    return res


def _read_retention(g_flat: np.ndarray, profile: np.ndarray, T: np.ndarray) -> np.ndarray:
    u = (np.log10(np.maximum(T, 1e-9)) - _RET_LOG10_LO) * _RET_PER_DECADE
    np.maximum(u, 0.0, out=u)
    np.minimum(u, _RET_POINTS - 1.000001, out=u)
    i = u.astype(np.intp)
    idx = profile * _RET_POINTS + i
    y0 = np.take(g_flat, idx)
    res: np.ndarray = y0 + (u - i) * (np.take(g_flat, idx + 1) - y0)
    return res


# representative reuse time of each profile bin: geometric middle of (τ_{k−1}, τ_k]; the first
# bin (0, 5 s] → 2.5 s, the last (1 h, ∞) → 4 h
_REUSE_BIN_TAU_S = np.array([2.5]
                            + [math.sqrt(REUSE_TAU_S[i - 1] * REUSE_TAU_S[i]) for i in range(1, len(REUSE_TAU_S) - 1)]
                            + [4 * 3600.0])
