"""Turn sequences of observations (and the settings in force) into the models' feature arrays.

Pure: records in, arrays out. A record is one tick: the FleetObservation, the settings each pool
ran with (replicas, router weights, in-flight cap, engine caps) and, when known, the traffic's
prefix-reuse profile. The same records come from the daemon's history buffer, from
`governor record` and from the training-data generator, so one function builds training data for
all three.

Also here: the reuse profile of a trace (what an LRU cache with a given retention would hit),
computed from prefix-block ids.

Must not: do I/O or read the clock.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from controller.core.coupling import (
    ALL_TARGETS,
    REUSE_TAU_S,
    CacheInputs,
    LatencyInputs,
    PhysicsTable,
    PoolPhysics,
    TrainingData,
)
from controller.types import FleetObservation, PoolDecision


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


def arrival_dispersion(t_s: Sequence[float], rate_rps: Sequence[float], window_s: float) -> float:
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


# --------------------------------------------------------------------------- training data


def _val(r) -> float:
    return float(r.value) if r.ok and math.isfinite(r.value) else math.nan


def build_training_data(records: Sequence[ObservationRecord], physics_by_pool: Mapping[str, PoolPhysics], *,
                        window_s: float = 60.0, settle_s: float = 30.0) -> tuple[TrainingData, tuple[PoolPhysics, ...]]:
    """One row per (record, pool with a physics entry and at least one ready replica).

    A row is *steady* when the pool's settings and ready count have not changed for window_s +
    settle_s (the telemetry window then holds only the current regime), nothing is starting or
    draining, and the ready count equals the target. Only steady rows train the models; the rest
    are kept for the tracker's error figures.
    Records must be in time order (they are, from every source); out-of-order ones are sorted.
    """
    recs = sorted(records, key=lambda r: r.at_s)
    keys: list[str] = []
    phys: list[PoolPhysics] = []
    for p in physics_by_pool.values():
        if p.key not in keys:
            keys.append(p.key)
            phys.append(p)
    table = PhysicsTable(phys)
    cols: dict[str, list[float]] = {c: [] for c in (
        "k", "lam_r", "lam", "R", "P", "O", "hit", "cap", "seqs", "tokens", "pw", "qw", "kw", "t", "steady", "prof",
        "waiting", "running", "kv", "disp", "nreq")}
    pool_names: list[str] = []
    targets: dict[str, list[float]] = {t: [] for t in ALL_TARGETS}
    profiles: list[tuple[float, ...]] = [ReuseProfile.none().hit_at]
    prof_index: dict[tuple[float, ...], int] = {profiles[0]: 0}
    last_change: dict[str, float] = {}
    recent: dict[str, list[tuple[float, float]]] = {}  # pool → recent (t, arrival rps) for the dispersion
    last_state: dict[str, tuple] = {}
    start = recs[0].at_s if recs else 0.0
    for rec in recs:
        for pool, po in rec.observation.pools.items():
            physics = physics_by_pool.get(pool)
            st = rec.settings.get(pool)
            if physics is None or st is None:
                continue
            R = _val(po.replicas_ready)
            state = (st, R)
            if last_state.get(pool) != state:
                last_state[pool] = state
                last_change[pool] = rec.at_s if pool in last_change else start - 1e9
            lam = _val(po.arrival_rps)
            hist = recent.setdefault(pool, [])
            if math.isfinite(lam):
                hist.append((rec.at_s, lam))
                del hist[:-(DISPERSION_TICKS + 1)]
            if not (R >= 1) or not (lam > 0):
                continue
            prompt = _val(po.prompt_tokens_rps) / lam
            output = _val(po.generation_tokens_rps) / lam
            if not (prompt >= 1 and output >= 1):
                continue
            starting = _val(po.replicas_starting)
            draining = _val(po.replicas_draining)
            steady = (rec.at_s - last_change[pool] >= window_s + settle_s and rec.at_s - start >= window_s + settle_s
                      and not (starting > 0) and not (draining > 0) and int(R) == int(st.replicas))
            prof = rec.reuse.get(pool)
            h = prof.hit_at if prof is not None else profiles[0]
            if h not in prof_index:
                prof_index[h] = len(profiles)
                profiles.append(h)
            c = cols
            c["k"].append(table.index(physics.key))
            c["lam_r"].append(lam / R)
            c["lam"].append(lam)
            c["R"].append(R)
            c["P"].append(prompt)
            c["O"].append(output)
            c["hit"].append(_val(po.hit_rate))
            c["cap"].append(st.inflight_cap)
            c["seqs"].append(st.max_num_seqs)
            c["tokens"].append(st.max_num_batched_tokens)
            c["pw"].append(st.prefix_weight)
            c["qw"].append(st.queue_weight)
            c["kw"].append(st.kv_weight)
            c["t"].append(rec.at_s)
            c["steady"].append(1.0 if steady else 0.0)
            c["prof"].append(prof_index[h] if prof is not None else -1)
            c["waiting"].append(_val(po.waiting) / R)
            c["running"].append(_val(po.running) / R)
            c["kv"].append(_val(po.kv_usage_frac))
            c["disp"].append(arrival_dispersion([h[0] for h in hist], [h[1] for h in hist], window_s))
            c["nreq"].append(lam * window_s)
            pool_names.append(pool)
            targets["hit_rate"].append(_val(po.hit_rate))
            targets["ttft_p50_s"].append(_val(po.ttft_p50_s))
            targets["ttft_p95_s"].append(_val(po.ttft_p95_s))
            targets["tpot_p50_s"].append(_val(po.tpot_p50_s))
            targets["tpot_p95_s"].append(_val(po.tpot_p95_s))
            targets["gpu_busy_frac"].append(_val(po.gpu_util_frac))
    a = {k: np.asarray(v, dtype=float) for k, v in cols.items()}
    n = len(a["t"])
    hit_obs = np.where(np.isfinite(a["hit"]), a["hit"], 0.0)
    lat = LatencyInputs.build(n, physics_index=a["k"].astype(np.intp), arrival_rps_per_replica=a["lam_r"],
                              prompt_tokens=a["P"], output_tokens=a["O"], hit_rate=hit_obs, inflight_cap=a["cap"],
                              max_num_seqs=a["seqs"], max_num_batched_tokens=a["tokens"],
                              arrival_dispersion=a["disp"])
    prof_idx = a["prof"].astype(np.intp)
    # rows without a known profile point at profile 0 (no reuse): the cache model never trains on them
    cache = CacheInputs.build(n, physics_index=a["k"].astype(np.intp), replicas=a["R"], arrival_rps=a["lam"],
                              prompt_tokens=a["P"], output_tokens=a["O"], reuse_hit_at=np.array(profiles),
                              reuse_index=np.maximum(prof_idx, 0), prefix_weight=a["pw"], queue_weight=a["qw"],
                              kv_weight=a["kw"])
    tg = {k: np.asarray(v, dtype=float) for k, v in targets.items()}
    tg["hit_rate"] = np.where(prof_idx >= 0, tg["hit_rate"], np.nan)
    aux = {"waiting_per_replica": a["waiting"], "running_per_replica": a["running"], "kv_usage_frac": a["kv"],
           "requests_in_window": a["nreq"], "pool": np.asarray(pool_names, dtype=str)}
    data = TrainingData(latency=lat, cache=cache, targets=tg, t_s=a["t"], steady=a["steady"] > 0.5, aux=aux)
    return data, tuple(phys)


def concat_training_data(parts: Sequence[tuple[TrainingData, Sequence[PoolPhysics]]]) -> tuple[TrainingData, tuple[PoolPhysics, ...]]:
    """Join training data built against different physics lists (indices are remapped by physics key).
    aux["run"] numbers the parts (runs) so that cross-validation can leave whole runs out."""
    from dataclasses import fields as _fields

    keys: list[str] = []
    phys: list[PoolPhysics] = []
    lat_cols: dict[str, list[np.ndarray]] = {}
    cache_cols: dict[str, list[np.ndarray]] = {}
    profiles: list[np.ndarray] = []
    offset = 0
    tg: dict[str, list[np.ndarray]] = {}
    ts: list[np.ndarray] = []
    steady: list[np.ndarray] = []
    aux: dict[str, list[np.ndarray]] = {}
    n_runs = 0
    for data, ph in parts:
        remap = []
        for p in ph:
            if p.key not in keys:
                keys.append(p.key)
                phys.append(p)
            remap.append(keys.index(p.key))
        remap_a = np.asarray(remap, dtype=np.intp)
        for f in _fields(data.latency):
            v = getattr(data.latency, f.name)
            lat_cols.setdefault(f.name, []).append(remap_a[v] if f.name == "physics_index" and len(v) else v)
        for f in _fields(data.cache):
            v = getattr(data.cache, f.name)
            if f.name == "reuse_hit_at":
                continue
            if f.name == "physics_index" and len(v):
                v = remap_a[v]
            if f.name == "reuse_index":
                v = v + offset
            cache_cols.setdefault(f.name, []).append(v)
        profiles.append(data.cache.reuse_hit_at)
        offset += len(data.cache.reuse_hit_at)
        for k, v in data.targets.items():
            tg.setdefault(k, []).append(v)
        ts.append(data.t_s)
        steady.append(data.steady)
        for k, v in data.aux.items():
            if k != "run":
                aux.setdefault(k, []).append(v)
        # which run each row came from (cross-validation leaves whole runs out)
        own = data.aux.get("run")
        run = (np.asarray(own, dtype=float) + n_runs) if own is not None else np.full(len(data), float(n_runs))
        aux.setdefault("run", []).append(run)
        n_runs = int(run.max()) + 1 if len(run) else n_runs + 1
    lat = LatencyInputs(**{k: np.concatenate(v) for k, v in lat_cols.items()})
    cache = CacheInputs(**{k: np.concatenate(v) for k, v in cache_cols.items()}, reuse_hit_at=np.concatenate(profiles))
    lat = LatencyInputs(**{f.name: (getattr(lat, f.name).astype(np.intp) if f.name == "physics_index"
                                    else getattr(lat, f.name)) for f in _fields(lat)})
    cache = CacheInputs(**{f.name: (getattr(cache, f.name).astype(np.intp) if f.name in ("physics_index", "reuse_index")
                                    else getattr(cache, f.name)) for f in _fields(cache)})
    return (TrainingData(lat, cache, {k: np.concatenate(v) for k, v in tg.items()}, np.concatenate(ts),
                         np.concatenate(steady), {k: np.concatenate(v) for k, v in aux.items()}), tuple(phys))


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
            add(f"arrival_rps:{c}", t, _val(co.arrival_rps))
        lam = prompt = gen = 0.0
        ok = False
        for po in rec.observation.pools.values():
            a = _val(po.arrival_rps)
            if math.isfinite(a):
                ok = True
                lam += a
                p, g = _val(po.prompt_tokens_rps), _val(po.generation_tokens_rps)
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
        pts = [(r.at_s, _val(r.observation.pools[pool].arrival_rps)) for r in recs if pool in r.observation.pools]
        disp = arrival_dispersion([p[0] for p in pts], [p[1] for p in pts], window_s)
        out[pool] = TrafficProfile(reuse=last.reuse.get(pool), arrival_dispersion=disp,
                                   observed_hit_rate=_val(po.hit_rate))
    return out
