"""Observation records and what the models read from them: the settings in force, the traffic's
reuse profile and burstiness, the forecaster's series.

Pure: records in, values and arrays out. A record is one tick: the FleetObservation, the settings
each pool ran with (replicas, router weights, in-flight cap, engine caps) and, when known, the
traffic's prefix-reuse profile. The same records come from the daemon's history buffer, from
`governor record` and from the simulated training runs; controller/learning/training_data.py
turns them into the coupling models' training rows.

Also here: the reuse profile of a trace (what an LRU cache with a given retention would hit),
computed from prefix-block ids.

Must not: do I/O or read the clock.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from controller.core.coupling import REUSE_TAU_S
from controller.types import FleetObservation, PoolDecision, Reading


@dataclass(frozen=True)
class PoolSettings:
    """The levers a pool ran with during a tick (what the actuators applied)."""

    replicas: int  # target serving replicas
    prefix_weight: float = 3.0  # router cache affinity
    queue_weight: float = 2.0
    kv_weight: float = 2.0
    inflight_cap: int = 0  # per replica; 0 = none
    max_num_seqs: int = 0  # 0 = the pool's default
    max_num_batched_tokens: int = 0
    traffic_weight: float = 1.0

    @staticmethod
    def from_decision(d: PoolDecision) -> PoolSettings:
        return PoolSettings(replicas=d.replicas, prefix_weight=d.prefix_weight, queue_weight=d.queue_weight,
                            kv_weight=d.kv_weight, inflight_cap=d.inflight_cap, max_num_seqs=d.max_num_seqs,
                            max_num_batched_tokens=d.max_num_batched_tokens, traffic_weight=d.traffic_weight)


@dataclass(frozen=True)
class ReuseProfile:
    """Fraction of prompt tokens whose prefix block was last used less than REUSE_TAU_S[k] ago.

    hit_at[-1] is what an infinite cache would hit. Example (Mooncake conversations, time x3):
    ≈ (0.07, 0.10, 0.12, 0.15, 0.19, 0.25, 0.29, 0.34, 0.36, 0.37).
    """

    hit_at: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.hit_at) != len(REUSE_TAU_S):
            raise ValueError(f"ReuseProfile.hit_at: need {len(REUSE_TAU_S)} values, got {len(self.hit_at)}")
        if not all(0.0 <= v <= 1.0 for v in self.hit_at):
            raise ValueError(f"ReuseProfile.hit_at: values must be in [0, 1], got {self.hit_at}")

    @property
    def inf_hit(self) -> float:
        return self.hit_at[-1]

    @staticmethod
    def none() -> ReuseProfile:
        return ReuseProfile(tuple(0.0 for _ in REUSE_TAU_S))


@dataclass(frozen=True)
class ObservationRecord:
    """One tick of history: what was observed and what was in force."""

    at_s: float
    observation: FleetObservation
    settings: Mapping[str, PoolSettings]
    reuse: Mapping[str, ReuseProfile] = field(default_factory=dict)  # per pool, when known


# --------------------------------------------------------------------------- reuse profiles


def request_reuse(arrival_s: np.ndarray, prompt_tokens: np.ndarray, block_hashes: Sequence[Sequence[int]] | None,
                  block_tokens: int) -> np.ndarray:
    """Per request, tokens found in a cache of unbounded size whose reuse time is < REUSE_TAU_S[k].

    Returns (n, K) token counts. Only full blocks are cacheable and a lookup stops at the first
    block never seen before (block ids name the whole prefix, like vLLM's chained hashes).
    Example: a request of 1,300 tokens with blocks (7, 8, 9) of 512 tokens, where 7 and 8 were
    used 20 s ago: 1,024 tokens counted for τ ≥ 30 s, none for 5 s and 15 s.
    """
    if block_hashes is None:
        return np.zeros((len(arrival_s), len(REUSE_TAU_S)))
    return request_reuse_since(arrival_s, prompt_tokens, block_hashes, block_tokens, {})


def request_reuse_since(arrival_s: np.ndarray, prompt_tokens: np.ndarray, block_hashes: Sequence[Sequence[int]],
                        block_tokens: int, last_use_s: dict[int, float]) -> np.ndarray:
    """request_reuse for requests arriving after those already seen: `last_use_s` (block id →
    last time used) carries the history between calls and is updated in place. Requests must
    come in time order. Lets a recorder follow the times requests were really sent (closed-loop
    sessions send a turn after the previous answer, not at its trace time)."""
    n = len(arrival_s)
    out = np.zeros((n, len(REUSE_TAU_S)))
    last = last_use_s
    taus = REUSE_TAU_S
    for i in range(n):
        t = float(arrival_s[i])
        full = int(prompt_tokens[i]) // block_tokens
        blocks = block_hashes[i]
        matching = True
        row = out[i]
        for j in range(min(full, len(blocks))):
            b = blocks[j]
            if matching:
                prev = last.get(b)
                if prev is None:
                    matching = False
                else:
                    age = t - prev
                    row[np.searchsorted(taus, age, side="right"):] += block_tokens
            last[b] = t
    return out


def window_profile(reuse_tokens: np.ndarray, arrival_s: np.ndarray, prompt_tokens: np.ndarray,
                   t0_s: float, t1_s: float) -> ReuseProfile:
    """The reuse profile of the requests arriving in [t0_s, t1_s) (zeros if none)."""
    lo, hi = np.searchsorted(arrival_s, [t0_s, t1_s], side="left")
    if hi <= lo:
        return ReuseProfile.none()
    total = float(np.sum(prompt_tokens[lo:hi]))
    prof = np.sum(reuse_tokens[lo:hi], axis=0) / max(total, 1.0)
    return ReuseProfile(tuple(float(min(max(v, 0.0), 1.0)) for v in prof))


# --------------------------------------------------------------------------- traffic burstiness

DISPERSION_TICKS = 8  # consecutive observations used for the dispersion (2 minutes at 15 s)


def arrival_dispersion(t_s: Sequence[float] | np.ndarray, rate_rps: Sequence[float] | np.ndarray,
                       window_s: float) -> float:
    """Index of dispersion D = Var(N)/E(N) of arrival counts per tick, from consecutive windowed rates.

    Telemetry gives the rate over a sliding window w at ticks τ apart. The difference of two
    consecutive rates is (N(t−τ, t] − N(t−w−τ, t−w]) / w, two disjoint counts over τ, so
    Var(Δr) = 2·Var(N_τ)/w² and D = w²·Var(Δr) / (2·r̄·τ). Poisson arrivals give D ≈ 1; clumps
    of k requests give D ≈ k. Example: w = 60 s, τ = 15 s, r̄ = 4 rps, sd(Δr) = 0.5 rps →
    D = 3600 × 0.25 / (2 × 4 × 15) = 7.5. Returns 1 (Poisson) with fewer than 4 ticks.
    """
    t = np.asarray(t_s, dtype=float)
    r = np.asarray(rate_rps, dtype=float)
    ok = np.isfinite(t) & np.isfinite(r)
    t, r = t[ok], r[ok]
    if len(r) < 4:
        return 1.0
    tau = float(np.median(np.diff(t)))
    mean = float(np.mean(r))
    if tau <= 0 or mean <= 0:
        return 1.0
    d = window_s * window_s * float(np.var(np.diff(r))) / (2.0 * mean * tau)
    return float(min(max(d, 0.5), 1000.0))


# --------------------------------------------------------------------------- readings


def reading_value(r: Reading) -> float:
    """A reading's value when it is OK and finite, else NaN (what the arrays hold for "unknown")."""
    return float(r.value) if r.ok and math.isfinite(r.value) else math.nan


# --------------------------------------------------------------------------- forecaster inputs


def forecast_series(records: Sequence[ObservationRecord]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The series the load forecaster models, from a history of records:

    - "arrival_rps:<class>": router arrivals per priority class;
    - "arrival_rps": all pools' arrivals (used when the router reports no classes);
    - "prompt_tokens_per_request", "output_tokens_per_request": the fleet's token mix (the
      telemetry has no per-class token counters, so every class shares this mix).
    Missing readings are skipped (not zero-filled).
    """
    out: dict[str, tuple[list[float], list[float]]] = {}

    def add(name: str, t: float, v: float) -> None:
        if math.isfinite(v):
            ts, vs = out.setdefault(name, ([], []))
            ts.append(t)
            vs.append(v)

    for rec in sorted(records, key=lambda r: r.at_s):
        t = rec.at_s
        for c, co in rec.observation.classes.items():
            add(f"arrival_rps:{c}", t, reading_value(co.arrival_rps))
        lam = prompt = gen = 0.0
        ok = False
        for po in rec.observation.pools.values():
            a = reading_value(po.arrival_rps)
            if math.isfinite(a):
                ok = True
                lam += a
                p, g = reading_value(po.prompt_tokens_rps), reading_value(po.generation_tokens_rps)
                prompt += p if math.isfinite(p) else 0.0
                gen += g if math.isfinite(g) else 0.0
        if ok:
            add("arrival_rps", t, lam)
            if lam > 0:
                add("prompt_tokens_per_request", t, prompt / lam)
                add("output_tokens_per_request", t, gen / lam)
    return {k: (np.asarray(v[0]), np.asarray(v[1])) for k, v in out.items()}


@dataclass(frozen=True)
class TrafficProfile:
    """What the latest history says about a pool's traffic, for the planner's "what if" calls."""

    reuse: ReuseProfile | None  # None when the telemetry does not carry it (infer it from the hit rate)
    arrival_dispersion: float  # index of dispersion of arrivals (1 = Poisson)
    observed_hit_rate: float  # NaN when unknown


def traffic_profiles(records: Sequence[ObservationRecord], window_s: float = 60.0) -> dict[str, TrafficProfile]:
    """Per pool, from the newest records (a few ticks are enough; pass the history's tail)."""
    recs = sorted(records, key=lambda r: r.at_s)[-(DISPERSION_TICKS + 1):]
    out: dict[str, TrafficProfile] = {}
    if not recs:
        return out
    last = recs[-1]
    for pool, po in last.observation.pools.items():
        pts = [(r.at_s, reading_value(r.observation.pools[pool].arrival_rps))
               for r in recs if pool in r.observation.pools]
        disp = arrival_dispersion([p[0] for p in pts], [p[1] for p in pts], window_s)
        out[pool] = TrafficProfile(reuse=last.reuse.get(pool), arrival_dispersion=disp,
                                   observed_hit_rate=reading_value(po.hit_rate))
    return out
