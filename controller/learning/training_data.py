"""The coupling models' training rows: `TrainingData` (one row per tick × pool), built from
observation records, joined across runs, and the row filters fitting and evaluation share
(steady windows with enough requests; engines that were admitting what arrived).

Must not: fit anything, do I/O or read the clock.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields

import numpy as np

from controller.core.coupling import ALL_TARGETS, CacheInputs, LatencyInputs, PhysicsTable, PoolPhysics
from controller.core.observations import (
    DISPERSION_TICKS,
    ObservationRecord,
    ReuseProfile,
    arrival_dispersion,
    reading_value,
)


@dataclass(frozen=True)
class TrainingData:
    """Observed windows for fitting, one row per (tick, pool). Built by build_training_data."""

    latency: LatencyInputs
    cache: CacheInputs
    targets: Mapping[str, np.ndarray]  # ALL_TARGETS → observed values (NaN where unknown)
    t_s: np.ndarray  # time of each row
    steady: np.ndarray  # bool: settings stable over the window (no change, nobody starting/draining)
    aux: Mapping[str, np.ndarray] = field(default_factory=dict)  # observed state, not model inputs:
    # waiting_per_replica, running_per_replica, kv_usage_frac (used to tell saturated windows); request_tpot_p95_s,
    # the per-request TPOT p95 a TPOT SLO judges, beside the ITL target (docs/decisions/0032-one-latency-prior-trial.md)

    def __len__(self) -> int:
        return len(self.t_s)

    def subset(self, mask: np.ndarray) -> TrainingData:
        idx = np.flatnonzero(mask)
        lat = LatencyInputs(**{f.name: getattr(self.latency, f.name)[idx] for f in fields(self.latency)})
        c = self.cache
        cache = CacheInputs(**{f.name: (getattr(c, f.name) if f.name == "reuse_hit_at" else getattr(c, f.name)[idx])
                               for f in fields(c)})
        return TrainingData(lat, cache, {k: v[idx] for k, v in self.targets.items()}, self.t_s[idx], self.steady[idx],
                            {k: v[idx] for k, v in self.aux.items()})


MIN_WINDOW_REQUESTS = 30  # a window's p95 from fewer requests is noise, not signal


def _enough_requests(data: TrainingData) -> np.ndarray:
    n = data.aux.get("requests_in_window")
    return np.ones(len(data), dtype=bool) if n is None else n >= MIN_WINDOW_REQUESTS


def valid_latency_rows(data: TrainingData, target: str) -> np.ndarray:
    y = data.targets[target]
    return (np.isfinite(y) & (y > 0) & (data.latency.arrival_rps_per_replica > 0) & data.steady
            & _enough_requests(data))


MAX_QUEUED_PER_REPLICA = 1.0  # an engine queue this long at the window's end: the engines cannot admit


def engine_not_saturated(data: TrainingData, max_queued_per_replica: float = MAX_QUEUED_PER_REPLICA) -> np.ndarray:
    """Rows whose engines were admitting what arrived: the engine queue (vllm:num_requests_waiting,
    per ready replica, read at the window's end) below max_queued_per_replica. vLLM queues a
    request only when it cannot schedule it (KV cache or max_num_seqs full), so a standing queue
    means the window measured how long a queue grew, not a load. Rows without the gauge count as
    not saturated (the prior's utilisation rule still applies)."""
    w = data.aux.get("waiting_per_replica")
    if w is None:
        return np.ones(len(data), dtype=bool)
    w = np.asarray(w, dtype=float)
    return ~(w >= max_queued_per_replica)


def valid_cache_rows(data: TrainingData) -> np.ndarray:
    y = data.targets["hit_rate"]
    prof_inf = data.cache.reuse_hit_at[data.cache.reuse_index][:, -1]
    return (np.isfinite(y) & (prof_inf >= 1e-3) & (data.cache.arrival_rps > 0) & data.steady
            & _enough_requests(data))


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
        "waiting", "running", "kv", "disp", "nreq", "req_tpot")}
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
            R = reading_value(po.replicas_ready)
            state = (st, R)
            if last_state.get(pool) != state:
                last_state[pool] = state
                last_change[pool] = rec.at_s if pool in last_change else start - 1e9
            lam = reading_value(po.arrival_rps)
            hist = recent.setdefault(pool, [])
            if math.isfinite(lam):
                hist.append((rec.at_s, lam))
                del hist[:-(DISPERSION_TICKS + 1)]
            if not (R >= 1) or not (lam > 0):
                continue
            prompt = reading_value(po.prompt_tokens_rps) / lam
            output = reading_value(po.generation_tokens_rps) / lam
            if not (prompt >= 1 and output >= 1):
                continue
            starting = reading_value(po.replicas_starting)
            draining = reading_value(po.replicas_draining)
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
            c["hit"].append(reading_value(po.hit_rate))
            c["cap"].append(st.inflight_cap)
            c["seqs"].append(st.max_num_seqs)
            c["tokens"].append(st.max_num_batched_tokens)
            c["pw"].append(st.prefix_weight)
            c["qw"].append(st.queue_weight)
            c["kw"].append(st.kv_weight)
            c["t"].append(rec.at_s)
            c["steady"].append(1.0 if steady else 0.0)
            c["prof"].append(prof_index[h] if prof is not None else -1)
            c["waiting"].append(reading_value(po.waiting) / R)
            c["running"].append(reading_value(po.running) / R)
            c["kv"].append(reading_value(po.kv_usage_frac))
            c["disp"].append(arrival_dispersion([h[0] for h in hist], [h[1] for h in hist], window_s))
            c["nreq"].append(lam * window_s)
            c["req_tpot"].append(reading_value(po.request_tpot_p95_s))
            pool_names.append(pool)
            targets["hit_rate"].append(reading_value(po.hit_rate))
            targets["ttft_p50_s"].append(reading_value(po.ttft_p50_s))
            targets["ttft_p95_s"].append(reading_value(po.ttft_p95_s))
            targets["tpot_p50_s"].append(reading_value(po.tpot_p50_s))
            targets["tpot_p95_s"].append(reading_value(po.tpot_p95_s))
            targets["gpu_busy_frac"].append(reading_value(po.gpu_util_frac))
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
           "requests_in_window": a["nreq"], "pool": np.asarray(pool_names, dtype=str),
           "request_tpot_p95_s": a["req_tpot"]}
    data = TrainingData(latency=lat, cache=cache, targets=tg, t_s=a["t"], steady=a["steady"] > 0.5, aux=aux)
    return data, tuple(phys)


def concat_training_data(
        parts: Sequence[tuple[TrainingData, Sequence[PoolPhysics]]],
) -> tuple[TrainingData, tuple[PoolPhysics, ...]]:
    """Join training data built against different physics lists (indices are remapped by physics key).
    aux["run"] numbers the parts (runs) so that cross-validation can leave whole runs out."""
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
        for f in fields(data.latency):
            v = getattr(data.latency, f.name)
            lat_cols.setdefault(f.name, []).append(remap_a[v] if f.name == "physics_index" and len(v) else v)
        for f in fields(data.cache):
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
                                    else getattr(lat, f.name)) for f in fields(lat)})
    cache = CacheInputs(**{f.name: (getattr(cache, f.name).astype(np.intp) if f.name in ("physics_index", "reuse_index")
                                    else getattr(cache, f.name)) for f in fields(cache)})
    return (TrainingData(lat, cache, {k: np.concatenate(v) for k, v in tg.items()}, np.concatenate(ts),
                         np.concatenate(steady), {k: np.concatenate(v) for k, v in aux.items()}), tuple(phys))
