"""What one replica of a pool sustains within the SLO, profiled: `ReplicaCapacity`, and `capacity_from_samples`
that builds it from (per-replica load, latency) samples.

The bench profiles it on the simulator (controller/bench/side_by_side.py); the SLA planner sizes pools
with it (controller/policies/sla_planner.py), the composed stacks read its requests/s, and the MPC seeds
its correction factors from its latency profile (controller/policies/mpc/corrections.py).

Must not: do I/O or read a clock.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from controller.types import SloSpec


def check_positive(name: str, v: float, *, allow_zero: bool = False) -> float:
    """`v` as a float, or ValueError naming `name` unless it is finite and > 0 (>= 0 with `allow_zero`)."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number (got {v!r})") from None
    ok = math.isfinite(f) and (f >= 0 if allow_zero else f > 0)
    if not ok:
        raise ValueError(f"{name} must be a finite number {'>= 0' if allow_zero else '> 0'} (got {v!r})")
    return f




def _max_load_within(loads: Sequence[float], lats: Sequence[float], bound: float) -> float | None:
    """Largest load whose (monotone, linearly interpolated) latency is ≤ bound; None if even the first is over.

    Example: loads 1, 2, 4 with latency 0.2, 0.4, 1.2 and bound 0.8 → 2 + (0.8-0.4)/(1.2-0.4) × 2 = 3.
    """
    if lats[0] > bound:
        return None
    for i in range(len(loads) - 1):
        if lats[i + 1] > bound:
            if lats[i + 1] == lats[i]:
                return float(loads[i])
            return float(loads[i] + (bound - lats[i]) * (loads[i + 1] - loads[i]) / (lats[i + 1] - lats[i]))
    return float(loads[-1])


@dataclass(frozen=True, slots=True)
class ReplicaCapacity:
    """What one replica of a pool sustains while meeting the SLO, plus (optionally) its latency profile.

    rps: requests/s per replica at the SLO; prompt_tokens_per_s / generation_tokens_per_s:
    the same in tokens (0 = unknown, requests/s is used). profile_*: per-replica load
    (ascending) and the latency measured there (made non-decreasing), used for Dynamo's
    correction factors; empty = no profile.
    """

    rps: float
    prompt_tokens_per_s: float = 0.0
    generation_tokens_per_s: float = 0.0
    profile_rps: tuple[float, ...] = ()
    profile_ttft_s: tuple[float, ...] = ()
    profile_tpot_s: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        check_positive("capacity.rps", self.rps)
        check_positive("capacity.prompt_tokens_per_s", self.prompt_tokens_per_s, allow_zero=True)
        check_positive("capacity.generation_tokens_per_s", self.generation_tokens_per_s, allow_zero=True)
        n = len(self.profile_rps)
        for f in ("profile_ttft_s", "profile_tpot_s"):
            if len(getattr(self, f)) not in (0, n):
                raise ValueError(f"capacity.{f} has {len(getattr(self, f))} points, profile_rps has {n}")
        if any(b <= a for a, b in zip(self.profile_rps, self.profile_rps[1:], strict=False)):
            raise ValueError("capacity.profile_rps must be strictly ascending")
        for f in ("profile_rps", "profile_ttft_s", "profile_tpot_s"):
            if any(not (math.isfinite(x) and x >= 0) for x in getattr(self, f)):
                raise ValueError(f"capacity.{f} must hold finite numbers >= 0")

    @classmethod
    def of(cls, v: ReplicaCapacity | Mapping[str, Any]) -> ReplicaCapacity:
        """Accept a ReplicaCapacity or a mapping of its fields (from a config file)."""
        if isinstance(v, ReplicaCapacity):
            return v
        if not isinstance(v, Mapping):
            raise ValueError(f"capacity must be a ReplicaCapacity or a mapping (got {type(v).__name__})")
        allowed = set(cls.__dataclass_fields__)
        unknown = set(v) - allowed
        if unknown:
            raise ValueError(f"capacity: unknown field(s) {sorted(unknown)}; allowed: {sorted(allowed)}")
        kw: dict[str, Any] = {k: (tuple(float(x) for x in val) if k.startswith("profile_") else float(val))
                              for k, val in v.items()}
        return cls(**kw)

    def _interp(self, lats: tuple[float, ...], rps: float) -> float | None:
        if not lats:
            return None
        return float(np.interp(rps, self.profile_rps, lats))

    def expected_ttft_s(self, rps_per_replica: float) -> float | None:
        return self._interp(self.profile_ttft_s, rps_per_replica)

    def expected_tpot_s(self, rps_per_replica: float) -> float | None:
        return self._interp(self.profile_tpot_s, rps_per_replica)

    def rps_within(self, *, ttft_s: float | None = None, tpot_s: float | None = None) -> float | None:
        """Highest profiled per-replica load meeting the given latency bounds (None: not even the lowest)."""
        out = math.inf
        for lats, bound in ((self.profile_ttft_s, ttft_s), (self.profile_tpot_s, tpot_s)):
            if bound is None:
                continue
            if not lats:
                raise ValueError("capacity has no latency profile for this bound")
            m = _max_load_within(self.profile_rps, lats, bound)
            if m is None:
                return None
            out = min(out, m)
        return None if math.isinf(out) else out


def capacity_from_samples(load_rps: Sequence[float], ttft_s: Sequence[float] | None, tpot_s: Sequence[float] | None,
                          slo: SloSpec, *, mean_prompt_tokens: float = 0.0,
                          mean_output_tokens: float = 0.0) -> ReplicaCapacity:
    """Build a ReplicaCapacity from profiled (per-replica load, latency) samples.

    Samples at the same load are averaged, rows with a NaN/inf value are dropped,
    and each latency curve is made non-decreasing in load (a running max) so noise
    cannot invent capacity. The sustainable load is the largest load whose
    interpolated latency meets the SLO on every curve given (TTFT and/or TPOT);
    it is never extrapolated beyond the highest profiled load. Token rates are the
    load times the mean prompt/output length. Example: loads 1, 2, 4 req/s with
    p95 TTFT 0.3, 0.5, 2.1 s and a 1.3 s TTFT SLO → 2 + (0.8/1.6) × 2 = 3 req/s.
    Raises ValueError naming the problem (lengths, no usable rows, SLO not met even
    at the lowest load).
    """
    if ttft_s is None and tpot_s is None:
        raise ValueError("capacity_from_samples: give ttft_s and/or tpot_s")
    load = np.asarray(load_rps, dtype=float)
    cols: dict[str, np.ndarray] = {}
    for name, arr in (("ttft_s", ttft_s), ("tpot_s", tpot_s)):
        if arr is not None:
            a = np.asarray(arr, dtype=float)
            if a.shape != load.shape:
                raise ValueError(f"capacity_from_samples: {name} has {a.size} samples, load_rps has {load.size}")
            cols[name] = a
    if load.ndim != 1 or load.size == 0:
        raise ValueError("capacity_from_samples: load_rps must be a non-empty 1-D sequence")
    ok = np.isfinite(load) & (load > 0)
    for a in cols.values():
        ok &= np.isfinite(a) & (a >= 0)
    if not ok.any():
        raise ValueError("capacity_from_samples: no sample has a finite load > 0 and finite latencies")
    load = load[ok]
    uniq, inv = np.unique(load, return_inverse=True)
    curves: dict[str, tuple[float, ...]] = {}
    for name, a in cols.items():
        means = np.bincount(inv, weights=a[ok]) / np.bincount(inv)
        curves[name] = tuple(float(x) for x in np.maximum.accumulate(means))
    loads = tuple(float(x) for x in uniq)
    best = math.inf
    for name, bound in (("ttft_s", slo.ttft_s), ("tpot_s", slo.tpot_s)):
        if name not in curves:
            continue
        m = _max_load_within(loads, curves[name], bound)
        if m is None:
            raise ValueError(f"capacity_from_samples: {name} {curves[name][0]:.3g} at the lowest profiled load "
                             f"{loads[0]:.3g} req/s already exceeds the SLO {bound:g} s")
        best = min(best, m)
    rps = float(best)
    return ReplicaCapacity(rps=rps, prompt_tokens_per_s=rps * float(mean_prompt_tokens),
                           generation_tokens_per_s=rps * float(mean_output_tokens), profile_rps=loads,
                           profile_ttft_s=curves.get("ttft_s", ()), profile_tpot_s=curves.get("tpot_s", ()))
