"""Per-replica capacity at the SLO, profiled from the simulator the way NVIDIA Dynamo profiles an engine.

Dynamo's pre-deployment profiler runs one engine configuration at a sweep of loads
and records TTFT and ITL at each; its planner then reads "throughput per replica at
the SLO" off that table. We do the same against the calibrated simulator:

- the pool under test runs as a *fixed small pool* (`PROFILE_REPLICAS` = 2 replicas of
  its model, SKU, tensor parallelism and engine caps, the scenario's router weights, no
  autoscaling, no faults, no client retries, no admission limits);
- the requests are the scenario's own request-size mix: `SAMPLE_BLOCKS` contiguous
  runs of the scenario's workload spread evenly over the trace (contiguous, so the
  prefix-sharing structure inside a run is kept), re-timed as a Poisson stream at the
  point's rate (common random numbers: one unit-rate stream scaled per point);
- the load grid is geometric (×`GRID_RATIO`) around an anchor `r_est` computed from the
  calibrated iteration model (`request_work_s`), independent of the SLO, so a tighter
  SLO sees a subset of the same points: the capacity is monotone in the SLO;
- per point, after `WARMUP_S` of warm-up, p95 (and p50) of the client TTFT and TPOT of
  the requests that arrived in the measured span; a request that did not complete
  counts as an infinitely late one (`PENALTY_S`);
- the sweep climbs from the anchor until a point misses the SLO (or walks down until
  one meets it); `capacity_from_samples` (controller.policies.sla_planner) turns the
  points into a `ReplicaCapacity` (latency curves made non-decreasing, linear
  interpolation, never extrapolated); the curves it carries for a planner's
  correction factors keep only the points where every request completed.

The SLO is the tightest class's (min TTFT, min TPOT). Results are cached as JSON
under `cache_dir`, keyed by a SHA-256 of every input (the pool, the router, the SLO,
the sampled requests, the profile settings and the simulator's source files), so a
repeated bench run skips the sweep. Must not: write anywhere but `cache_dir`, read
the wall clock, or draw unseeded randomness.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from controller.perf.engines import Catalogue, step_model
from controller.perf.iteration import IterationModel
from controller.perf.replica_capacity import ReplicaCapacity, capacity_from_samples
from controller.perf.roofline import Roofline
from controller.policies.common import tightest_slo
from controller.sim.fleet import Fleet
from controller.sim.fleetspec import fleet_spec_from_scenario
from controller.sim.scenario import PoolSpecModel, Scenario
from controller.sim.trace_types import Trace
from controller.sim.workload import Workload
from controller.types import SloSpec

PROFILE_VERSION = 4  # bump when the procedure changes (part of the cache key)
PROFILE_REPLICAS = 2
SAMPLE_BLOCKS = 8
GRID_RATIO = 1.15
MAX_GRID_STEPS = 40
WARMUP_S = 30.0
MIN_MEASURE_S = 120.0
MAX_MEASURE_S = 600.0
TARGET_REQUESTS = 800  # measured requests per point (fewer when MAX_MEASURE_S binds)
PENALTY_S = 1.0e4  # latency given to a request that never completed
ANCHOR_UTILISATION = 0.8  # r_est = this / mean work seconds per request
DECODE_BATCH = 64  # batch size at which the decode cost per token is estimated
# The sources a profile depends on, relative to controller/ (part of the cache key).
_SIM_SOURCES = ("perf/catalogue.py", "perf/curves.py", "perf/profiles.py", "perf/iteration.py", "sim/engine.py",
                "sim/engine_records.py", "sim/engine_schedule.py", "sim/engine_kv.py", "sim/engine_steps.py",
                "sim/fleet.py", "sim/fleet_events.py", "sim/fleet_lifecycle.py", "sim/fleet_clients.py",
                "sim/fleet_faults.py", "sim/fleet_accounting.py", "sim/fleet_records.py", "sim/router.py",
                "sim/cache.py", "sim/workload.py")


class ProfileError(ValueError):
    """The pool cannot meet the SLO at any profiled load (names the pool, the SLO and the lowest point)."""


@dataclass(frozen=True)
class ProfilePoint:
    rps_per_replica: float
    requests: int  # measured requests
    ttft_p50_s: float
    ttft_p95_s: float
    tpot_p50_s: float
    tpot_p95_s: float
    completed_frac: float


@dataclass(frozen=True)
class PoolProfile:
    """What the sweep found for one pool (the bench uses `capacity`; the rest explains it)."""

    pool: str
    capacity: ReplicaCapacity
    slo: SloSpec
    points: tuple[ProfilePoint, ...]
    anchor_rps: float  # r_est, the grid's anchor
    mean_work_s: float  # estimated replica-seconds per request of the scenario's mix (request_work_s)
    ttft_p50_at_capacity_s: float
    tpot_p50_at_capacity_s: float
    mean_prompt_tokens: float
    mean_output_tokens: float
    replicas: int
    cache_key: str
    cached: bool = False

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["capacity"] = asdict(self.capacity)
        d["slo"] = {"ttft_s": self.slo.ttft_s, "tpot_s": self.slo.tpot_s}
        return d

    @staticmethod
    def from_dict(d: Mapping[str, Any], cached: bool) -> PoolProfile:
        cap = d["capacity"]
        return PoolProfile(
            pool=d["pool"], slo=SloSpec(**d["slo"]),
            capacity=ReplicaCapacity(rps=cap["rps"], prompt_tokens_per_s=cap["prompt_tokens_per_s"],
                                     generation_tokens_per_s=cap["generation_tokens_per_s"],
                                     profile_rps=tuple(cap["profile_rps"]), profile_ttft_s=tuple(cap["profile_ttft_s"]),
                                     profile_tpot_s=tuple(cap["profile_tpot_s"])),
            points=tuple(ProfilePoint(**p) for p in d["points"]), anchor_rps=d["anchor_rps"],
            mean_work_s=d["mean_work_s"], ttft_p50_at_capacity_s=d["ttft_p50_at_capacity_s"],
            tpot_p50_at_capacity_s=d["tpot_p50_at_capacity_s"], mean_prompt_tokens=d["mean_prompt_tokens"],
            mean_output_tokens=d["mean_output_tokens"], replicas=d["replicas"], cache_key=d["cache_key"],
            cached=cached)


# --------------------------------------------------------------------------- work estimate


WORK_PARTS = ("both", "prefill", "decode")


def request_work_s(model: IterationModel | Roofline, prompt_tokens: np.ndarray, output_tokens: np.ndarray, *,
                   max_num_batched_tokens: int, decode_batch: int = DECODE_BATCH, part: str = "both") -> np.ndarray:
    """Replica-seconds each request costs, from the calibrated iteration model (no cache hits assumed).

    Prefill: the prompt in chunks of the token budget, each a step of its own (attention
    work chunk × (context before + chunk / 2)). Decode: each output token costs 1/batch
    of a step decoding `decode_batch` sequences at the request's mean context
    (prompt + output / 2). Example (Llama-3-8B, A100): 2,000 prompt tokens ≈ 0.1 s of
    prefill, and each output token ≈ 0.4 ms at batch 64. It is a relative weight
    (how much heavier one request is than another), not a latency prediction. `part`:
    "prefill" or "decode" keeps only that phase's work (what a disaggregated pool of that
    role spends on the request; a mix shifting to longer prompts then moves prefill work,
    not decode work).
    """
    if part not in WORK_PARTS:
        raise ValueError(f"part must be one of {WORK_PARTS} (got {part!r})")
    pre, dec = part != "decode", part != "prefill"
    budget = int(max_num_batched_tokens)
    out = np.empty(len(prompt_tokens), dtype=np.float64)
    memo: dict[tuple[int, int], float] = {}
    for i, (p, o) in enumerate(zip(prompt_tokens.tolist(), output_tokens.tolist(), strict=True)):
        # bucket the key so memoisation works on long traces (weights are smooth in both)
        key = (p >> 4, o >> 2)
        w = memo.get(key)
        if w is None:
            t = 0.0
            before = 0
            while pre and before < p:
                c = min(budget, p - before)
                t += model.step_time_s(c, c * (before + c / 2.0), 0, 0)
                before += c
            ctx = p + o // 2
            per_token = model.step_time_s(0, 0.0, decode_batch, decode_batch * ctx) / decode_batch
            w = memo[key] = t + (o * per_token if dec else 0.0)
        out[i] = w
    return out


def pool_model(spec: PoolSpecModel) -> IterationModel | Roofline:
    """What the simulator times the pool's replicas with: the calibrated model, or the roofline prior for a
    pair nobody profiled (e.g. an L40S pool), as controller.perf.engines.step_model picks."""
    cat = Catalogue.builtin()
    return step_model(cat.model(spec.model), cat.sku(spec.sku), spec.tp)


# --------------------------------------------------------------------------- the sweep


def _sample_indices(n_total: int, n: int) -> np.ndarray:
    """n request indices as SAMPLE_BLOCKS contiguous runs spread evenly over [0, n_total) (cyclic)."""
    blocks = min(SAMPLE_BLOCKS, max(1, n))
    sizes = [n // blocks + (1 if b < n % blocks else 0) for b in range(blocks)]
    idx = []
    for b, size in enumerate(sizes):
        start = (b * n_total) // blocks
        idx.append((start + np.arange(size)) % n_total)
    return np.concatenate(idx).astype(np.int64)


def _profile_scenario(scenario: Scenario, pool: str, duration_s: float) -> Scenario:
    """The scenario cut down to a fixed PROFILE_REPLICAS-replica pool (plus its disaggregated partner)."""
    spec = scenario.pool(pool)
    pools = []
    for p in scenario.pools:
        if p.name == pool:
            n = PROFILE_REPLICAS
        elif p.group == spec.group and spec.role != "mixed" and p.role not in ("mixed", spec.role):
            n = 2 * PROFILE_REPLICAS  # the other half of a prefill/decode pair, sized not to be the bottleneck
        else:
            continue
        # eligible: {} — a pool's capacity is measured on its own, whichever classes the tier rule lets in
        pools.append(p.model_copy(update={"replicas": n, "min_replicas": n, "max_replicas": max(n, 1),
                                          "warm_standby": 0, "traffic_weight": 1.0, "eligible": {}}))
    return scenario.model_copy(update={
        "name": f"{scenario.name}-profile-{pool}",
        "pools": pools,
        "faults": [],
        "duration_s": duration_s,
        "router": scenario.router.model_copy(update={"admission": {}}),
        "clients": scenario.clients.model_copy(update={"max_retries": 0}),
        "tenants": {},  # capacity is per pool, not per tenant: no quotas, no per-tenant surges
        "tasks": scenario.tasks.model_copy(update={"kind": "single", "steps_min": 1, "steps_max": 1,
                                                   "think_time_s": 0.0}),
    })


def _point_workload(src: Workload, idx: np.ndarray, arrival_s: np.ndarray) -> Workload:
    tr = src.trace
    hashes = tuple(tr.block_hashes[i] for i in idx.tolist()) if tr.block_hashes is not None else None
    trace = Trace(name=f"{tr.name}-profile", arrival_s=np.asarray(arrival_s, dtype=np.float64),
                  prompt_tokens=np.asarray(tr.prompt_tokens[idx], dtype=np.int64),
                  output_tokens=np.asarray(tr.output_tokens[idx], dtype=np.int64),
                  block_hashes=hashes, hash_block_tokens=tr.hash_block_tokens)
    n = len(idx)
    return Workload(trace=trace, priority=np.zeros(n, dtype=np.int8), task_id=np.arange(n, dtype=np.int64),
                    step=np.zeros(n, dtype=np.int32), steps_in_task=np.ones(n, dtype=np.int32), think_time_s=0.0,
                    n_tasks=n)


def _measure_point(scenario: Scenario, pool: str, workload: Workload, rps_per_replica: float,
                   seed: int) -> ProfilePoint:
    total_rps = rps_per_replica * PROFILE_REPLICAS
    measure_s = min(MAX_MEASURE_S, max(MIN_MEASURE_S, TARGET_REQUESTS / total_rps))
    span_s = WARMUP_S + measure_s
    # Common random numbers: the same unit-rate gaps for every point, scaled by the rate.
    gaps = np.random.default_rng([seed, 7]).exponential(1.0, size=int(span_s * total_rps * 1.5) + 64)
    arrival = np.cumsum(gaps) / total_rps
    arrival = arrival[arrival < span_s]
    if len(arrival) == 0:
        arrival = np.array([0.0])
    idx = _sample_indices(len(workload), len(arrival))
    wl = _point_workload(workload, idx, arrival)
    drain_s = scenario.clients.timeout_s + 30.0
    fleet = Fleet(_profile_scenario(scenario, pool, span_s + drain_s), seed=seed, workload=wl, record_requests=True)
    fleet.run()
    rec = fleet.request_records()
    measured = arrival >= WARMUP_S
    if measured.sum() < 20:
        measured = np.ones(len(arrival), dtype=bool)
    done = rec["status"][measured] == 1
    ttft = np.where(done, rec["ttft_s"][measured], PENALTY_S)
    multi = wl.trace.output_tokens[measured] > 1
    tpot = np.where(done, rec["tpot_s"][measured], PENALTY_S)[multi]
    if len(tpot) == 0:
        tpot = np.zeros(1)
    return ProfilePoint(rps_per_replica=float(rps_per_replica), requests=int(measured.sum()),
                        ttft_p50_s=float(np.percentile(ttft, 50)), ttft_p95_s=float(np.percentile(ttft, 95)),
                        tpot_p50_s=float(np.percentile(tpot, 50)), tpot_p95_s=float(np.percentile(tpot, 95)),
                        completed_frac=float(done.mean()) if len(done) else 0.0)


def _meets(pt: ProfilePoint, slo: SloSpec) -> bool:
    return pt.ttft_p95_s <= slo.ttft_s and pt.tpot_p95_s <= slo.tpot_s


def _sim_source_digest() -> str:
    h = hashlib.sha256()
    src_dir = Path(__file__).resolve().parent.parent
    for name in _SIM_SOURCES:
        p = src_dir / name
        h.update(name.encode())
        h.update(p.read_bytes() if p.exists() else b"")
    return h.hexdigest()


def _workload_digest(workload: Workload) -> str:
    tr = workload.trace
    h = hashlib.sha256()
    h.update(np.ascontiguousarray(tr.prompt_tokens, dtype=np.int64).tobytes())
    h.update(np.ascontiguousarray(tr.output_tokens, dtype=np.int64).tobytes())
    h.update(str(tr.hash_block_tokens).encode())
    if tr.block_hashes is not None:
        lens = np.fromiter((len(b) for b in tr.block_hashes), dtype=np.int64, count=len(tr.block_hashes))
        flat = np.fromiter((x for b in tr.block_hashes for x in b), dtype=np.int64, count=int(lens.sum()))
        h.update(lens.tobytes())
        h.update(flat.tobytes())
    return h.hexdigest()


def profile_key(scenario: Scenario, pool: str, workload: Workload, slo: SloSpec, seed: int,
                workload_digest: str | None = None) -> str:
    spec = scenario.pool(pool)
    partners = [p.model_dump() for p in _profile_scenario(scenario, pool, 1.0).pools if p.name != pool]
    blob = json.dumps({
        "version": PROFILE_VERSION,
        "pool": spec.model_dump(exclude={"replicas", "min_replicas", "max_replicas", "warm_standby", "name",
                                         "startup_warm_s", "startup_cold_s", "usd_per_gpu_hour", "traffic_weight"}),
        "partners": partners,
        "router": scenario.router.model_dump(exclude={"admission"}),
        "clients_timeout_s": scenario.clients.timeout_s,
        "slo": [slo.ttft_s, slo.tpot_s],
        "seed": seed,
        "settings": [PROFILE_REPLICAS, SAMPLE_BLOCKS, GRID_RATIO, MAX_GRID_STEPS, WARMUP_S, MIN_MEASURE_S,
                     MAX_MEASURE_S, TARGET_REQUESTS, PENALTY_S, ANCHOR_UTILISATION, DECODE_BATCH],
        "workload": workload_digest or _workload_digest(workload),
        "sim": _sim_source_digest(),
    }, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def profile_pool(scenario: Scenario, pool: str, *, workload: Workload, slo: SloSpec | None = None,
                 seed: int = 0, cache_dir: Path | str | None = None, work_s: np.ndarray | None = None,
                 workload_digest: str | None = None) -> PoolProfile:
    """Sweep load on a small fixed pool of `pool` and find the per-replica rate that meets `slo`.

    `slo` defaults to the scenario's tightest class SLO. `work_s` (per request of
    `workload`, from `request_work_s`) may be passed to save recomputing it.
    Raises ProfileError when even the lowest load misses the SLO.
    """
    spec = scenario.pool(pool)
    if slo is None:
        slo = tightest_slo(fleet_spec_from_scenario(scenario))
        if slo is None:
            raise ProfileError(f"scenario {scenario.name}: no SLO classes to profile against")
    if len(workload) == 0:
        raise ProfileError(f"scenario {scenario.name}: the workload has no requests to profile with")
    key = profile_key(scenario, pool, workload, slo, seed, workload_digest)
    path = Path(cache_dir) / f"profile-{key}.json" if cache_dir is not None else None
    if path is not None and path.exists():
        try:
            return PoolProfile.from_dict(json.loads(path.read_text()), cached=True)
        except (ValueError, KeyError, TypeError):
            pass  # a corrupt or old cache entry: profile again and overwrite it

    if work_s is None:
        work_s = request_work_s(pool_model(spec), workload.trace.prompt_tokens, workload.trace.output_tokens,
                                max_num_batched_tokens=spec.engine.max_num_batched_tokens)
    mean_work = float(np.mean(work_s))
    anchor = ANCHOR_UTILISATION / mean_work

    points: dict[int, ProfilePoint] = {}

    def at(j: int) -> ProfilePoint:
        if j not in points:
            points[j] = _measure_point(scenario, pool, workload, anchor * GRID_RATIO**j, seed)
        return points[j]

    if _meets(at(0), slo):
        j = 0
        while j < MAX_GRID_STEPS and _meets(at(j), slo):
            j += 1
    else:
        j = 0
        while not _meets(at(j), slo):
            j -= 1
            if j < -MAX_GRID_STEPS:
                low = points[min(points)]
                raise ProfileError(
                    f"pool {pool} of scenario {scenario.name}: p95 TTFT {low.ttft_p95_s:.3g} s / TPOT "
                    f"{low.tpot_p95_s:.3g} s at {low.rps_per_replica:.3g} req/s per replica, the lowest load "
                    f"profiled, already miss the SLO (TTFT {slo.ttft_s:g} s, TPOT {slo.tpot_s:g} s)")
    ordered = [points[k] for k in sorted(points)]
    loads = [p.rps_per_replica for p in ordered]
    mean_prompt = float(np.mean(workload.trace.prompt_tokens))
    mean_output = float(np.mean(workload.trace.output_tokens))
    cap = capacity_from_samples(loads, [p.ttft_p95_s for p in ordered], [p.tpot_p95_s for p in ordered], slo,
                                mean_prompt_tokens=mean_prompt, mean_output_tokens=mean_output)
    # The latency curves a planner reads (Dynamo's correction factors divide measured latency by
    # them) keep only the points where every measured request completed: a point past saturation
    # holds the PENALTY_S stand-in, not a latency, and would make any measured latency look tiny.
    valid = [p for p in ordered if p.completed_frac >= 1.0] or ordered[:1]
    cap = replace(cap, profile_rps=tuple(p.rps_per_replica for p in valid),
                  profile_ttft_s=tuple(np.maximum.accumulate([p.ttft_p95_s for p in valid]).tolist()),
                  profile_tpot_s=tuple(np.maximum.accumulate([p.tpot_p95_s for p in valid]).tolist()))
    ttft50 = float(np.interp(cap.rps, loads, np.maximum.accumulate([p.ttft_p50_s for p in ordered])))
    tpot50 = float(np.interp(cap.rps, loads, np.maximum.accumulate([p.tpot_p50_s for p in ordered])))
    prof = PoolProfile(pool=pool, capacity=cap, slo=slo, points=tuple(ordered), anchor_rps=anchor,
                       mean_work_s=mean_work, ttft_p50_at_capacity_s=ttft50, tpot_p50_at_capacity_s=tpot50,
                       mean_prompt_tokens=mean_prompt, mean_output_tokens=mean_output, replicas=PROFILE_REPLICAS,
                       cache_key=key)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(prof.to_dict(), sort_keys=True))
        tmp.replace(path)  # atomic, and one temporary file per process: concurrent benches never clash
    return prof


def profile_scenario(scenario: Scenario, *, workload: Workload, seed: int = 0,
                     cache_dir: Path | str | None = None,
                     work_s: Mapping[str, np.ndarray] | None = None) -> dict[str, PoolProfile]:
    """`profile_pool` for every pool of the scenario."""
    digest = _workload_digest(workload)
    return {p.name: profile_pool(scenario, p.name, workload=workload, seed=seed, cache_dir=cache_dir,
                                 work_s=(work_s or {}).get(p.name), workload_digest=digest)
            for p in scenario.pools}


def replica_capacity(scenario: Scenario, pool: str, *, workload: Workload, slo: SloSpec | None = None,
                     seed: int = 0, cache_dir: Path | str | None = None) -> ReplicaCapacity:
    """The per-replica capacity at the SLO (what the SLA planner and the oracle consume)."""
    return profile_pool(scenario, pool, workload=workload, slo=slo, seed=seed, cache_dir=cache_dir).capacity


def is_finite_capacity(cap: ReplicaCapacity) -> bool:
    return math.isfinite(cap.rps) and cap.rps > 0
