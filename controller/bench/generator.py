"""Generated bench cases: the shipped fleets under traffic shapes none of the shipped scenarios has.

Role: `generate_case(seed, k, work_dir=..., cache_dir=...)` builds case k of a seeded family as a
`Scenario` (with its trace written as generic JSONL into `work_dir`, and the scenario as YAML
beside it, so `governor bench policies --scenario <work_dir>/gen-sS-cKKKK.yaml` replays it alone).
A case is a pure function of (seed, k): every draw comes from `numpy.random.default_rng([seed,
k])`, and the only other input, the per-replica capacity used to size the rates, is itself
deterministic (a profile, cached under `cache_dir`). That profile replays the simulator, so a
change to the simulator's sources (which the profile's cache key names) may resize the cases; a
change to any policy never changes them. Must not: run policies, read the wall clock, or write
anywhere but `work_dir` and `cache_dir`.

What a case is made of:

- Fleet: the pools of one shipped scenario family (`scenarios/*.yaml`, one fleet per distinct
  set of pool definitions: model, SKU, TP, engine caps, start-up times and prices as shipped),
  with its router, task structure, SLOs and prefix model. Fleets and shapes are assigned in turn
  (case k gets shape (k + a) mod 11 and fleet (k + b) mod F, a and b drawn from the seed), so any
  11 x F consecutive cases hold every pair. The case sets only the replica bounds and the start:
  max_replicas is at most `CASE_MAX_REPLICAS` (smaller when the request budget binds, below),
  min_replicas as shipped, and the fleet starts at what the busiest minute of the first
  `startup_cold_s` + 60 s of arrivals needs at `START_UTILISATION` (a controller takes over a
  running fleet, as in the shipped scenarios).
- Lengths: (prompt, output) pairs drawn with replacement from the fleet's own request trace
  (a fleet whose shipped trace is ServeGen rates, which have no lengths, uses the Azure
  conversation trace, the trace its synthetic lengths are modelled on), optionally reweighted
  towards long or short prompts or outputs (`MIXES`: weight (prompt / median)^a x (output /
  median)^b, clipped to [1/10, 10] so no handful of requests dominates). Every pair is a real
  pair of the trace; the "trace" mix is the trace's own joint distribution.
- Rate curve: a multiplier m(t) in (0, 1] per second (`rate_multiplier`, one per shape in
  `SHAPES`; the diurnal one is a ServeGen day compressed into the case) times the peak rate.
- Arrivals: the inter-arrival gaps of a request trace (Azure code, Azure conversation or
  Mooncake; always Azure code for "bursts") from a random offset, each divided by the trace's
  mean gap over the `GAP_NORM_WINDOW_S` around it: a unit-rate point process that keeps the
  trace's sub-minute burstiness but not its slow drift. Time-changed by the cumulative rate
  curve (arrival = Lambda^-1(u)), it follows the shape with the trace's own clustering.
- Size: the busiest minute's arrival rate (measured on the generated arrivals, after one rescale
  of the curve: the trace's clustering puts more than the curve's peak into some minute) is a
  drawn `level` times the rate at which the first pool reaches max_replicas x its profiled
  per-replica capacity at the SLO (`controller.bench.profile`, profiled once per fleet and length
  mix on a sample of the mix: `sizing_capacity`; the router splits traffic by weight, so the
  pool that fills first binds). level lies in [(min_replicas + 0.5) / max_replicas, PEAK_FILL]
  for most cases (PEAK_FILL - FAULT_HEADROOM with a fault), and in `BEYOND_MAX` for a share
  `BEYOND_MAX_SHARE` of them, where no fleet within bounds keeps every class and shedding the
  sheddable class (then at least `BEYOND_MIN_SHEDDABLE` of the tasks) is right. Expected
  requests are held under `MAX_REQUESTS` by a smaller max_replicas (not under
  `FAULT_MIN_REPLICAS` with a fault), else by a lower level, so a case replays in seconds.
- Classes: the fleet's SLOs with one of `CLASS_SHARES`' share presets.
- Faults: none, a crash of 20-40 % of the peak's replicas, or 1-2 slow replicas (step time
  `SLOW_FACTOR` for 1-3 minutes), within the busiest minute of arrivals after the first cold
  start-up ordered at t = 0 could serve (`FAULT_SHARES`; never in a case beyond max_replicas).
- Length: 10-20 simulated minutes (at least three 70B cold start-ups plus 150 s, so what happens
  after the first cold start can serve is judged too).

Families: `generate_case(..., family="robustness")` (the default, `governor bench robustness`'s)
takes its shapes from `SHAPES`; `family="arena"` (opt-in, `governor bench frontier --family`) takes
them from `ARENA_SHAPES` (the Autoscaling Arena's patterns: staircase, flash crowd, diurnal, a
sinusoid slower than a cold start, ramps) with draws of its own (`default_rng([seed, k,
ARENA_STREAM])`, files gen-sS-aKKKK), and is built by the same code from there on. Adding the arena
family changed no draw of the robustness family: its cases are the same, bit for bit.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from controller.bench.oracle import PEAK_WINDOW_S
from controller.bench.profile import profile_scenario
from controller.bench.shapes import ARENA_SHAPES, SHAPES, ShapeError, draw_shape_params, rate_multiplier
from controller.paths import PROJECT_ROOT, shared_data_dir
from controller.sim.fleet import Fleet
from controller.sim.scenario import ClassSpec, FaultSpec, PoolSpecModel, Scenario, load_scenario
from controller.sim.trace_types import Trace
from controller.sim.traces import detect_format, read_trace_file, save_trace
from controller.types import PRIORITY_CLASSES

# Length mixes: (exponent on prompt / median, exponent on output / median) of the resampling weight.
MIXES: dict[str, tuple[float, float]] = {"trace": (0.0, 0.0), "long-prompts": (0.8, 0.0),
                                         "short-prompts": (-0.8, 0.0), "long-outputs": (0.0, 0.8),
                                         "short-outputs": (0.0, -0.8)}
MIX_WEIGHT_CLIP = 10.0
# Class shares (critical, standard, sheddable): the shipped default and three skews.
CLASS_SHARES: dict[str, tuple[float, float, float]] = {"default": (0.2, 0.6, 0.2), "critical-heavy": (0.5, 0.4, 0.1),
                                                       "sheddable-heavy": (0.1, 0.4, 0.5),
                                                       "standard-heavy": (0.1, 0.8, 0.1)}
FAULT_SHARES = {"none": 0.6, "crash": 0.25, "slow": 0.15}
FAULT_HEADROOM = 0.2  # a case with a fault peaks this much lower: losing 20-40 % of the peak's replicas
# must leave the rest under ~70 % utilisation, or no fleet within bounds rides it out
FAULT_MIN_REPLICAS = 5  # ...and its fleet may grow to at least this many replicas per pool (one of
# four is a quarter of the fleet for a 70B pool's 5-minute cold start)
# A slow replica keeps its share of the traffic, so any factor that lifts its step time over the
# TPOT SLO makes those requests late whatever the fleet size; x1.5-3 is a degraded GPU, not a dead one.
SLOW_FACTOR = (1.5, 3.0)
CASE_MAX_REPLICAS = 8  # per pool: small fleets keep a case to seconds of replay
PEAK_FILL = 0.7  # in-bounds peaks stay this far under max_replicas' capacity: the capacity is where p95 meets
# the SLO, and 99 % of tasks on time (through a crash or slow replicas too) needs headroom under it
BEYOND_MAX_SHARE = 0.1
BEYOND_MAX = (1.1, 1.5)  # peak / (max_replicas' capacity) of those cases, at most PEAK_FILL / (1 - sheddable share)
BEYOND_MIN_SHEDDABLE = 0.2
MAX_REQUESTS = 12_000  # expected requests per case: the sim cost grows with them (~1-2 s of replay per 10k)
START_UTILISATION = PEAK_FILL  # the start fleet serves the first minutes at this share of capacity
DURATION_S = (600.0, 1200.0)
GAP_NORM_WINDOW_S = 300.0
GRID_S = 1.0  # resolution of the rate curve
SIZING_REQUESTS = 3000  # requests of the sample a fleet and mix are profiled on
SIZING_SEED = 15  # the sizing sample is the same for every seed: one profile per fleet and mix

ROBUSTNESS = "robustness"
ARENA = "arena"
FAMILIES = (ROBUSTNESS, ARENA)  # each with its own shapes and draws (see the module docstring)
ARENA_STREAM = 32  # the arena family's draws: default_rng([seed, ARENA_STREAM]) and ([seed, k, ARENA_STREAM])

SCENARIOS_DIR = PROJECT_ROOT / "scenarios"
# Request traces whose gaps drive arrivals (by file name in the shared traces folder).
GAP_TRACES = ("azure2023_code.csv", "azure2023_conv.csv", "mooncake_conversation.jsonl")
BURST_GAP_TRACE = "azure2023_code.csv"
LENGTHS_FOR_RATES_ONLY = "azure2023_conv.csv"


class GeneratorError(ShapeError):
    """The generator cannot build a case (missing shipped scenarios or traces); the message says what."""


@dataclass(frozen=True)
class FleetSource:
    """One shipped fleet: the scenario it comes from and the request trace its lengths are drawn from."""

    name: str
    scenario: Scenario
    lengths_path: Path


@dataclass(frozen=True)
class CaseSpec:
    """What was drawn for one case (JSON-ready via `to_dict`); the scenario follows from it."""

    index: int
    seed: int
    fleet: str
    shape: str
    shape_params: Mapping[str, float]
    mix: str
    classes: str
    fault: str
    duration_s: float
    peak_rps: float
    peak_replicas: float  # peak demand in replicas' worth of profiled capacity (summed over pools)
    peak_level: float  # drawn busiest-minute rate / the rate at which the first pool is at max_replicas' capacity
    realised_peak_rps: float  # arrivals per second in the case's busiest minute
    beyond_max: bool
    max_replicas: Mapping[str, int]
    start_replicas: Mapping[str, int]
    capacity_rps: Mapping[str, float]  # profiled per-replica capacity at the SLO used to size the rates
    gap_trace: str
    requests: int
    sim_seed: int
    fault_params: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in self.__dict__.items()}


@dataclass(frozen=True)
class Case:
    spec: CaseSpec
    scenario: Scenario
    scenario_path: Path
    t_s: np.ndarray  # the rate curve's grid
    rate_rps: np.ndarray  # expected arrivals per second on that grid


# --------------------------------------------------------------------------- sources


def shared_traces_dir() -> Path:
    return shared_data_dir() / "traces"


def shipped_fleets(folder: Path | None = None) -> list[FleetSource]:
    """The distinct pool definitions of the shipped scenarios, one FleetSource each, by file name.

    Two scenarios are the same fleet when their pools agree on everything but the replica counts
    (a -crash or -surge variant of a base scenario). Heterogeneous fleets are left out (`_heterogeneous`)."""
    folder = folder or SCENARIOS_DIR
    out: list[FleetSource] = []
    seen: set[str] = set()
    files = sorted(folder.glob("*.yaml"), key=lambda p: (p.stem.count("-crash") + p.stem.count("-surge"), p.stem))
    for path in files:
        sc = load_scenario(path)
        if _heterogeneous(sc):
            continue
        key = repr([p.model_dump(exclude={"replicas", "min_replicas", "max_replicas"}) for p in sc.pools])
        if key in seen:
            continue
        seen.add(key)
        trace = sc.trace_path()
        fmt = sc.trace.format if sc.trace.format != "auto" else detect_format(trace)
        lengths = trace if fmt in ("azure", "mooncake", "jsonl", "csv") else trace.parent / LENGTHS_FOR_RATES_ONLY
        out.append(FleetSource(sc.name, sc, lengths))
    if not out:
        raise GeneratorError(f"no shipped scenarios in {folder}")
    return sorted(out, key=lambda f: f.name)


def _heterogeneous(sc: Scenario) -> bool:
    """A fleet the cases cannot stand for: cases send one tenant's single-class-mix traffic split over
    mixed pools by equal weights (the issue-15 fleets), so tier rules, prefill/decode roles, unequal
    traffic weights, tenants, agentic tasks and shifting length mixes (the issue-16 scenarios,
    benchmarked on their own files) are left out."""
    weights = {p.traffic_weight for p in sc.pools}
    return (any(p.eligible or p.role != "mixed" for p in sc.pools) or len(weights) > 1 or bool(sc.tenants)
            or sc.tasks.kind == "agentic" or sc.trace.mix_shift is not None)


@lru_cache(maxsize=8)
def _read_request_trace(path: str) -> Trace:
    p = Path(path)
    return read_trace_file(p, detect_format(p))


@lru_cache(maxsize=8)
def unit_gaps(path: str) -> np.ndarray:
    """The trace's inter-arrival gaps, each divided by the mean gap of the GAP_NORM_WINDOW_S around it.

    Mean ~1: a unit-rate stream with the trace's short-term clustering and without its slow
    drift. Example: gaps of 0.1 s in a stretch carrying 10 req/s become 1.0."""
    arr = np.asarray(_read_request_trace(path).arrival_s, dtype=np.float64)
    gaps = np.diff(arr)
    mid = arr[:-1]
    lo = np.searchsorted(arr, mid - GAP_NORM_WINDOW_S / 2, side="left")
    hi = np.searchsorted(arr, mid + GAP_NORM_WINDOW_S / 2, side="right")
    span = np.minimum(mid + GAP_NORM_WINDOW_S / 2, arr[-1]) - np.maximum(mid - GAP_NORM_WINDOW_S / 2, arr[0])
    local_rate = (hi - lo) / np.maximum(span, 1.0)
    unit = gaps * local_rate
    return unit / float(np.mean(unit))


# --------------------------------------------------------------------------- lengths and arrivals


def draw_lengths(trace: Trace, mix: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """Indices of n requests of `trace` drawn with replacement under the length mix `mix`."""
    a, b = MIXES[mix]
    prompt = np.asarray(trace.prompt_tokens, dtype=np.float64)
    output = np.asarray(trace.output_tokens, dtype=np.float64)
    w = (prompt / np.median(prompt)) ** a * (output / np.median(output)) ** b
    w = np.clip(w, 1.0 / MIX_WEIGHT_CLIP, MIX_WEIGHT_CLIP)
    return rng.choice(len(trace), size=n, p=w / w.sum())


def shaped_arrivals(gaps: np.ndarray, t_s: np.ndarray, rate_rps: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Arrival times following `rate_rps` (per second of the grid `t_s`) with the clustering of `gaps`.

    The unit-rate stream (cumulative sums of `gaps` from a random offset, wrapping around) is
    mapped through the inverse of the cumulative rate: a stretch with twice the rate gets twice
    the arrivals, in the trace's own pattern."""
    cum = np.concatenate([[0.0], np.cumsum(rate_rps[:-1] * np.diff(t_s))])
    cum = cum + 1e-9 * np.arange(len(cum))  # strictly increasing even through a zero-rate stretch
    total = float(cum[-1])
    need = int(total * 1.2) + 64
    start = int(rng.integers(len(gaps)))
    reps = need // len(gaps) + 2
    stream = np.tile(gaps, reps)[start:start + need]
    u = np.cumsum(stream) + float(rng.uniform(0.0, 1.0)) * float(stream[0])
    while u[-1] < total:  # a trace much shorter than the case: go round again
        u = np.concatenate([u, u[-1] + np.cumsum(np.tile(gaps, 2))])
    u = u[u < total]
    return np.interp(u, cum, t_s)


def busiest_window_rps(arrival_s: np.ndarray, window_s: float) -> float:
    """Arrivals per second in the busiest window [t, t + window_s) starting at an arrival."""
    a = np.asarray(arrival_s, dtype=np.float64)
    if len(a) == 0:
        return 0.0
    end = np.searchsorted(a, a + window_s, side="left")
    return float(np.max(end - np.arange(len(a)))) / window_s


def _hashes(trace: Trace, idx: np.ndarray) -> list[tuple[int, ...]] | None:
    """Block ids for resampled requests of a trace with its own ids (Mooncake): the leading ids that
    other requests of the trace share (system prompts, earlier turns) are kept, the request's own
    tail gets fresh ids per draw, so a request drawn twice does not hit its own whole prompt."""
    if trace.block_hashes is None:
        return None
    counts = _id_counts(trace)
    fresh = 1 + max((max(h) for h in trace.block_hashes if h), default=0)
    out = []
    for i in idx.tolist():
        ids = trace.block_hashes[i]
        keep = 0
        while keep < len(ids) and counts[ids[keep]] > 1:
            keep += 1
        out.append(tuple(ids[:keep]) + tuple(range(fresh, fresh + len(ids) - keep)))
        fresh += len(ids) - keep
    return out


_ID_COUNTS: dict[str, dict[int, int]] = {}


def _id_counts(trace: Trace) -> dict[int, int]:
    if trace.name not in _ID_COUNTS:
        c: dict[int, int] = {}
        for h in trace.block_hashes or ():
            for x in h:
                c[x] = c.get(x, 0) + 1
        _ID_COUNTS[trace.name] = c
    return _ID_COUNTS[trace.name]


# --------------------------------------------------------------------------- sizing


def _write_trace(path: Path, trace: Trace, idx: np.ndarray, arrival_s: np.ndarray) -> None:
    hashes = _hashes(trace, idx)
    out = Trace(name=path.stem, arrival_s=np.asarray(arrival_s, dtype=np.float64),
                prompt_tokens=np.asarray(trace.prompt_tokens[idx], dtype=np.int64),
                output_tokens=np.asarray(trace.output_tokens[idx], dtype=np.int64),
                block_hashes=tuple(hashes) if hashes is not None else None,
                hash_block_tokens=trace.hash_block_tokens)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    save_trace(out, tmp)
    tmp.replace(path)  # atomic, one temporary per process: two workers writing one sizing sample never clash


def _scenario(fleet: FleetSource, name: str, trace_file: str, work_dir: Path, *, pools: Sequence[PoolSpecModel],
              classes: Mapping[str, ClassSpec], faults: Sequence[FaultSpec], seed: int, source: Trace,
              description: str) -> Scenario:
    sc = fleet.scenario
    own_ids = source.block_hashes is not None
    trace: dict[str, Any] = {"path": trace_file, "format": "jsonl",
                             "hash_block_tokens": source.hash_block_tokens if own_ids else sc.trace.hash_block_tokens}
    if not own_ids and sc.trace.prefixes is not None:
        trace["prefixes"] = sc.trace.prefixes.model_dump()
    data = {"name": name, "description": description, "seed": seed, "trace": trace,
            "pools": [p.model_dump() for p in pools], "router": sc.router.model_dump(),
            "classes": {c: v.model_dump() for c, v in classes.items()}, "tasks": sc.tasks.model_dump(),
            "clients": sc.clients.model_dump(), "faults": [f.model_dump(exclude_none=True) for f in faults],
            "base_dir": str(work_dir)}
    return Scenario.model_validate(data)


def sizing_capacity(fleet: FleetSource, mix: str, *, work_dir: Path, cache_dir: Path | None) -> dict[str, float]:
    """Per pool, the profiled per-replica capacity at the SLO (req/s) for the fleet under length mix `mix`.

    Profiled (`profile.profile_scenario`) on SIZING_REQUESTS requests drawn under the mix with a
    fixed seed, so every seed's cases are sized from the same profiles (cached in `cache_dir`)."""
    source = _read_request_trace(str(fleet.lengths_path))
    rng = np.random.default_rng([SIZING_SEED, list(MIXES).index(mix)])
    idx = draw_lengths(source, mix, SIZING_REQUESTS, rng)
    name = f"sizing-{fleet.name}-{mix}"
    path = work_dir / f"{name}.jsonl"
    if not path.exists():
        _write_trace(path, source, idx, np.arange(SIZING_REQUESTS, dtype=np.float64))
    pools = list(fleet.scenario.pools)
    sc = _scenario(fleet, name, path.name, work_dir, pools=pools, classes=fleet.scenario.classes, faults=[],
                   seed=SIZING_SEED, source=source, description=f"sizing sample of {fleet.name}, mix {mix}")
    wl = Fleet(sc, seed=SIZING_SEED, record_requests=False).workload
    profiles = profile_scenario(sc, workload=wl, seed=SIZING_SEED, cache_dir=cache_dir)
    return {p: prof.capacity.rps for p, prof in profiles.items()}


# --------------------------------------------------------------------------- one case


def _pick(rng: np.random.Generator, shares: Mapping[str, float]) -> str:
    names = list(shares)
    p = np.array([shares[n] for n in names], dtype=np.float64)
    return names[int(rng.choice(len(names), p=p / p.sum()))]


def case_plan(seed: int, k: int, n_fleets: int) -> tuple[str, int]:
    """(shape, fleet index) of case k: both taken in turn from offsets drawn from the seed, so any
    len(SHAPES) x n_fleets consecutive cases hold every pair once when the counts are coprime."""
    family = np.random.default_rng([seed])
    shape_offset, fleet_offset = int(family.integers(len(SHAPES))), int(family.integers(n_fleets))
    return SHAPES[(k + shape_offset) % len(SHAPES)], (k + fleet_offset) % n_fleets


def arena_case_plan(seed: int, k: int, n_fleets: int) -> tuple[str, int]:
    """`case_plan` for the arena family: its shapes, offsets drawn from a stream of its own."""
    family = np.random.default_rng([seed, ARENA_STREAM])
    shape_offset, fleet_offset = int(family.integers(len(ARENA_SHAPES))), int(family.integers(n_fleets))
    return ARENA_SHAPES[(k + shape_offset) % len(ARENA_SHAPES)], (k + fleet_offset) % n_fleets


def case_name(seed: int, k: int, family: str = ROBUSTNESS) -> str:
    return f"gen-s{seed}-c{k:04d}" if family == ROBUSTNESS else f"gen-s{seed}-a{k:04d}"


def generate_case(seed: int, k: int, *, work_dir: Path | str, cache_dir: Path | str | None = None,
                  fleets: Sequence[FleetSource] | None = None, family: str = ROBUSTNESS) -> Case:
    """Case k of the family (`FAMILIES`) seeded by `seed`: draw it, size it, write its trace and YAML,
    return it."""
    if k < 0:
        raise GeneratorError(f"case index must be >= 0 (got {k})")
    if family not in FAMILIES:
        raise GeneratorError(f"unknown case family {family!r}; families: {', '.join(FAMILIES)}")
    work = Path(work_dir)
    cache = Path(cache_dir) if cache_dir is not None else None
    fleets = list(fleets) if fleets is not None else shipped_fleets()
    if family == ROBUSTNESS:
        shape, fleet_index = case_plan(seed, k, len(fleets))
        rng = np.random.default_rng([seed, k])
    else:
        shape, fleet_index = arena_case_plan(seed, k, len(fleets))
        rng = np.random.default_rng([seed, k, ARENA_STREAM])
    fleet = fleets[fleet_index]
    sc = fleet.scenario
    cold = max(p.startup_cold_s for p in sc.pools)
    lo_d = max(DURATION_S[0], 3.0 * cold + 150.0)
    duration = float(round(rng.uniform(lo_d, max(lo_d, DURATION_S[1])) / 60.0) * 60.0)
    params = draw_shape_params(shape, duration, rng, cold_start_s=cold)
    mix = list(MIXES)[int(rng.integers(len(MIXES)))]
    beyond = bool(rng.uniform() < BEYOND_MAX_SHARE)
    # A case beyond max_replicas is one where shedding the sheddable class is the right answer, so
    # its sheddable share is large enough that critical + standard alone fit the fleet at max.
    presets = [n for n, v in CLASS_SHARES.items() if not beyond or v[2] >= BEYOND_MIN_SHEDDABLE]
    classes_name = presets[int(rng.integers(len(presets)))]
    fault = _pick(rng, FAULT_SHARES)
    if beyond:  # overload is the case's test; a fault on top would leave no class it could keep
        fault = "none"
    fill = float(rng.uniform())
    gap_trace = BURST_GAP_TRACE if shape == "bursts" else GAP_TRACES[int(rng.integers(len(GAP_TRACES)))]
    sim_seed = int(rng.integers(2**31))
    arrival_seed = int(rng.integers(2**31))

    cap = sizing_capacity(fleet, mix, work_dir=work, cache_dir=cache)
    t = np.arange(0.0, duration + GRID_S, GRID_S)
    m = rate_multiplier(shape, params, t, duration)
    # Peak 1 over PEAK_WINDOW_S, the window static provisioning is sized on: a 10 s burst may
    # exceed the fleet's capacity for those seconds, as real sub-minute bursts do.
    window = min(int(PEAK_WINDOW_S / GRID_S), len(m))
    m = m / float(np.max(np.convolve(m, np.ones(window) / window, mode="valid")))
    mean_m = float(np.mean(m))
    weights = {p.name: p.traffic_weight for p in sc.pools}
    total_w = sum(weights.values()) or 1.0
    share = {n: (w / total_w if sum(weights.values()) > 0 else 1.0 / len(weights)) for n, w in weights.items()}
    floor_reps = {p.name: max(p.min_replicas, 1) for p in sc.pools}
    max_reps = {p.name: min(p.max_replicas, CASE_MAX_REPLICAS) for p in sc.pools}
    sheddable = CLASS_SHARES[classes_name][2]

    def sized(reps: Mapping[str, int]) -> tuple[float, float]:
        """(level, peak req/s): the router splits traffic by weight, so the pool that reaches its
        max first binds; level is the peak as a multiple of that binding rate."""
        bind = min(reps[n] * cap[n] / share[n] for n in reps)
        if beyond:
            hi = min(BEYOND_MAX[1], max(BEYOND_MAX[0], PEAK_FILL / (1.0 - sheddable)))
            level = BEYOND_MAX[0] + fill * (hi - BEYOND_MAX[0])
        else:
            top = PEAK_FILL - (FAULT_HEADROOM if fault != "none" else 0.0)
            lo = min(max((floor_reps[n] + 0.5) / reps[n] for n in reps), top)
            level = lo + fill * (top - lo)
        return level, level * bind

    level, peak = sized(max_reps)
    # A fault needs a fleet it does not wipe out: a crash or slow replica of two is half the fleet.
    smallest = {n: max(v + 1, FAULT_MIN_REPLICAS if fault != "none" else 0) for n, v in floor_reps.items()}
    smallest = {n: min(v, max_reps[n]) for n, v in smallest.items()}
    while peak * mean_m * duration > MAX_REQUESTS and any(max_reps[n] > smallest[n] for n in max_reps):
        max_reps = {n: max(v - 1, smallest[n]) for n, v in max_reps.items()}
        level, peak = sized(max_reps)
    if peak * mean_m * duration > MAX_REQUESTS:  # even the smallest fleet: a lower peak instead
        bind = peak / level
        level = min(level, MAX_REQUESTS / (mean_m * duration) / bind)
        if beyond and level < BEYOND_MAX[0]:  # no longer beyond max: an in-bounds case like the others
            beyond = False
            level = min(level, PEAK_FILL)
        peak = level * bind
    # The trace's clustering puts more than the curve's peak into the busiest minute; what a fleet
    # must serve (and static provisioning is sized on) is that realised peak, so the curve is
    # rescaled once to bring the realised 60 s peak to the drawn level.
    gaps = unit_gaps(str(shared_traces_dir() / gap_trace))
    arrivals = shaped_arrivals(gaps, t, peak * m, np.random.default_rng(arrival_seed))
    realised = busiest_window_rps(arrivals, PEAK_WINDOW_S)
    target = peak
    if realised > target:
        peak *= target / realised
        arrivals = shaped_arrivals(gaps, t, peak * m, np.random.default_rng(arrival_seed))
        realised = busiest_window_rps(arrivals, PEAK_WINDOW_S)
    demand = sum(realised * share[n] / cap[n] for n in max_reps)
    rate = peak * m
    if len(arrivals) == 0:
        arrivals = np.array([0.0])
    source = _read_request_trace(str(fleet.lengths_path))
    idx = draw_lengths(source, mix, len(arrivals), rng)

    # The start serves the busiest minute of arrivals before the first cold start-up ordered at
    # t = 0 could help (as the shipped scenarios start at what their first minutes need).
    first = busiest_window_rps(arrivals[arrivals <= cold + 60.0], PEAK_WINDOW_S)
    pools = []
    start: dict[str, int] = {}
    for p in sc.pools:
        need = math.ceil(first * share[p.name] / (cap[p.name] * START_UTILISATION) - 1e-9)
        hi = max_reps[p.name]
        lo = min(p.min_replicas, hi)
        start[p.name] = int(min(max(need, lo, 1), hi))
        pools.append(p.model_copy(update={"replicas": start[p.name], "min_replicas": lo, "max_replicas": hi}))

    faults, fault_params = _faults(fault, pools, arrivals, (min(cold + 60.0, duration / 2), duration - 120.0),
                                   demand, rng)
    shares = CLASS_SHARES[classes_name]
    classes = {c: sc.classes[c].model_copy(update={"share": s})
               for c, s in zip(PRIORITY_CLASSES, shares, strict=True) if c in sc.classes}
    total = sum(c.share for c in classes.values())
    classes = {c: v.model_copy(update={"share": v.share / total}) for c, v in classes.items()}

    name = case_name(seed, k, family)
    trace_path = work / f"{name}.jsonl"
    _write_trace(trace_path, source, idx, arrivals)
    spec = CaseSpec(index=k, seed=seed, fleet=fleet.name, shape=shape, shape_params=params, mix=mix,
                    classes=classes_name, fault=fault, duration_s=duration, peak_rps=float(peak),
                    peak_replicas=float(demand), peak_level=float(level), realised_peak_rps=realised, beyond_max=beyond,
                    max_replicas=max_reps, start_replicas=start,
                    capacity_rps=cap, gap_trace=gap_trace, requests=len(arrivals), sim_seed=sim_seed,
                    fault_params=fault_params)
    desc = (f"generated case {k} of seed {seed}: {shape} on the {fleet.name} fleet, mix {mix}, classes "
            f"{classes_name}, fault {fault}, peak {demand:.1f} replicas' worth")
    scenario = _scenario(fleet, name, trace_path.name, work, pools=pools, classes=classes, faults=faults,
                         seed=sim_seed, source=source, description=desc)
    yaml_path = work / f"{name}.yaml"
    _write_yaml(yaml_path, scenario, spec, family)
    return Case(spec=spec, scenario=scenario, scenario_path=yaml_path, t_s=t, rate_rps=rate)


def _faults(kind: str, pools: Sequence[PoolSpecModel], arrival_s: np.ndarray, window_s: tuple[float, float],
            demand: float, rng: np.random.Generator) -> tuple[list[FaultSpec], dict[str, Any]]:
    """The case's fault within its busiest minute of arrivals in `window_s` (after the first cold
    start-up could serve, so that a policy can answer it): a crash of 20-40 % of the peak's
    replicas, or 1-2 slow replicas (step time x1.5-3 for 1-3 minutes)."""
    if kind == "none":
        return [], {}
    lo, hi = window_s
    starts = np.arange(lo, max(hi, lo + 1.0), 1.0)
    counts = np.searchsorted(arrival_s, starts + 60.0) - np.searchsorted(arrival_s, starts)
    at = float(starts[int(np.argmax(counts))]) + float(rng.uniform(0.0, 60.0))
    pool = pools[int(rng.integers(len(pools)))]
    share = pool.max_replicas / max(sum(p.max_replicas for p in pools), 1)
    if kind == "crash":
        count = max(1, round(float(rng.uniform(0.2, 0.4)) * demand * share))
        return [FaultSpec(kind="crash", pool=pool.name, at_s=at, count=count)], \
            {"pool": pool.name, "at_s": at, "count": count}
    count = min(int(rng.integers(1, 3)), max(1, pool.max_replicas // 4))
    factor, dur = float(rng.uniform(SLOW_FACTOR[0], SLOW_FACTOR[1])), float(rng.uniform(60.0, 180.0))
    return [FaultSpec(kind="slow", pool=pool.name, at_s=at, count=count, factor=factor, duration_s=dur)], \
        {"pool": pool.name, "at_s": at, "count": count, "factor": factor, "duration_s": dur}


def _write_yaml(path: Path, scenario: Scenario, spec: CaseSpec, family: str = ROBUSTNESS) -> None:
    again = (f"governor bench robustness --seed {spec.seed} --case {spec.index}" if family == ROBUSTNESS
             else f"governor bench frontier --family {family} --seed {spec.seed} --case {spec.index}")
    head = "".join(f"# {line}\n" for line in (
        f"Generated by controller/bench/generator.py: case {spec.index} of seed {spec.seed}"
        + (f" ({family} family)" if family != ROBUSTNESS else "") + " (do not edit;",
        f"regenerate with `{again}`).",
        f"shape {spec.shape}, fleet {spec.fleet}, mix {spec.mix}, classes {spec.classes}, fault {spec.fault},",
        f"peak {spec.peak_rps:.2f} req/s = {spec.peak_replicas:.2f} replicas at the profiled capacity.",
    ))
    body = yaml.safe_dump(scenario.model_dump(mode="json", exclude_none=True), sort_keys=False)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(head + body)
    tmp.replace(path)


__all__ = ["ARENA", "ARENA_SHAPES", "CLASS_SHARES", "FAMILIES", "MIXES", "ROBUSTNESS", "SHAPES", "Case",
           "CaseSpec", "FleetSource", "GeneratorError", "ShapeError", "arena_case_plan", "case_name", "case_plan",
           "draw_lengths", "draw_shape_params", "generate_case", "rate_multiplier", "shaped_arrivals",
           "shipped_fleets", "sizing_capacity", "unit_gaps"]
