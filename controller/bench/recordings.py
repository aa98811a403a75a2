"""Simulated training and test runs for the learned models: the bench drives the simulator, the
learning edge fits on what it records (DESIGN.md §4: the simulator is a driver's plant).

A `RunSpec` names a scenario, a trace window, a seed and an *excitation*: every `segment_s`
the run draws new pool settings (replicas, cache affinity, in-flight cap) from the spec's
choices, so the data covers the levers the planner will move. `record_run` drives the fleet on
its own virtual clock (no wall-clock waits), reads it through `SimObserver` every `tick_s` (the
same numbers a scrape gives) and returns a `Recording`: one `ObservationRecord` per tick, with
the settings in force and the traffic's reuse profile (from the trace's prefix-block ids, at the
times the requests were really sent).

`default_suite()` is the shipped split: training runs on the first part of each shared trace,
test runs on a later part with other fleet sizes (see `governor bench models`). `record_many`
runs several specs in worker processes; each worker sends back the records in their JSON form
(controller/learning/records.py), so results cross the process boundary as plain data, in the
order of the specs whatever finishes first. `record_cached` keeps them in a cache directory.

Must not: read the wall clock, share state between workers (each builds its own fleet from the
spec and seed), or write files other than the recording cache a caller names.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from controller.core.coupling import REUSE_TAU_S, PoolPhysics
from controller.core.estimate import estimate
from controller.core.observations import (
    ObservationRecord,
    PoolSettings,
    ReuseProfile,
    request_reuse,
    request_reuse_since,
    window_profile,
)
from controller.learning.physics import physics_for_scenario_pool
from controller.learning.records import (
    Recording,
    header_dict,
    read_recording,
    record_from_dict,
    record_to_dict,
    write_recording,
)
from controller.paths import PROJECT_ROOT
from controller.types import Reading


@dataclass(frozen=True)
class Excitation:
    """Random settings per segment (seeded). Empty choices keep the scenario's value."""

    segment_s: float = 300.0
    replicas: tuple[int, ...] = ()
    prefix_weights: tuple[float, ...] = ()
    inflight_caps: tuple[int, ...] = ()


@dataclass(frozen=True)
class RunSpec:
    scenario_path: str  # scenario YAML (relative paths resolve against the repo's scenarios/)
    label: str
    seed: int = 1
    start_s: float | None = None  # trace window (trace seconds); None keeps the scenario's
    duration_s: float | None = None
    time_scale: float | None = None
    rate_scale: float | None = None
    sim_duration_s: float | None = None  # stop after this (simulated); default: trace end
    initial_replicas: int | None = None
    servegen_start_day: float | None = None  # ServeGen traces: which day of the 14
    window_s: float = 60.0  # telemetry window (test runs use longer ones: less sampling noise in a p95)
    excitation: Excitation = field(default_factory=Excitation)


def load_run_scenario(spec: RunSpec):
    """The scenario of a RunSpec with its trace window / scales / initial replicas applied."""
    from controller.sim.scenario import load_scenario

    path = Path(spec.scenario_path)
    if not path.is_absolute():
        path = PROJECT_ROOT / path
    sc = load_scenario(path)
    tr = sc.trace
    upd = {}
    for name in ("start_s", "duration_s", "time_scale", "rate_scale"):
        v = getattr(spec, name)
        if v is not None:
            upd[name] = v
    if spec.servegen_start_day is not None and tr.servegen is not None:
        upd["servegen"] = tr.servegen.model_copy(update={"start_day": spec.servegen_start_day})
    if upd:
        tr = tr.model_copy(update=upd)
    pools = list(sc.pools)
    if spec.initial_replicas is not None:
        pools = [p.model_copy(update={"replicas": max(p.min_replicas, min(p.max_replicas, spec.initial_replicas))})
                 for p in pools]
    return sc.model_copy(update={"trace": tr, "pools": pools, "faults": [], "seed": spec.seed,
                                 "duration_s": spec.sim_duration_s})


class SimRecorder:
    """Reads a simulated fleet every tick into ObservationRecords (settings and reuse profile included)."""

    def __init__(self, fleet, *, window_s: float = 60.0) -> None:
        from controller.bench.observe import SimObserver

        self.fleet = fleet
        self.window_s = window_s
        sc = fleet.scenario
        self.observer = SimObserver(fleet, window_s=window_s)
        self._gpu_ok: bool | None = None
        r = sc.router
        self.settings: dict[str, PoolSettings] = {
            p.name: PoolSettings(replicas=p.replicas, prefix_weight=r.prefix_weight, queue_weight=r.queue_weight,
                                 kv_weight=r.kv_weight, inflight_cap=r.inflight_cap,
                                 max_num_seqs=p.engine.max_num_seqs,
                                 max_num_batched_tokens=p.engine.max_num_batched_tokens,
                                 traffic_weight=p.traffic_weight)
            for p in sc.pools}
        tr = fleet.workload.trace
        self._arrival = np.asarray(tr.arrival_s)
        self._prompt = np.asarray(tr.prompt_tokens)
        self._hashes = tr.block_hashes
        self._block_tokens = tr.hash_block_tokens
        # The reuse profile follows the times requests were really sent when the fleet records
        # them: a session's next turn (a workflow's next step) goes out after the previous answer,
        # not at its trace time, so trace times misplace it in the window and misstate how long
        # ago its context was used. Otherwise (or for an open-loop trace) the trace's own times.
        self._sent_based = bool(getattr(fleet, "record_requests", False)) and tr.block_hashes is not None
        if self._sent_based:
            n = len(self._arrival)
            self._seen = np.zeros(n, dtype=bool)
            self._sent_s = np.full(n, np.nan)
            self._rows = np.zeros((n, len(REUSE_TAU_S)))
            self._last_use: dict[int, float] = {}
        else:
            self._reuse = request_reuse(self._arrival, self._prompt, tr.block_hashes, tr.hash_block_tokens)
        self._busy_prev: dict[str, tuple[float, dict[str, float]]] = {}

    def apply(self, pool: str, s: PoolSettings) -> None:
        """Set a pool's levers on the fleet and remember them as the settings in force."""
        old = self.settings[pool]
        if s.replicas != old.replicas:
            self.fleet.set_pool_target(pool, replicas=int(s.replicas))
        if (s.prefix_weight, s.queue_weight, s.kv_weight, s.inflight_cap, s.traffic_weight) != (
                old.prefix_weight, old.queue_weight, old.kv_weight, old.inflight_cap, old.traffic_weight):
            self.fleet.set_pool_routing(pool, prefix_weight=s.prefix_weight, queue_weight=s.queue_weight,
                                        kv_weight=s.kv_weight, inflight_cap=int(s.inflight_cap),
                                        traffic_weight=s.traffic_weight)
        self.settings[pool] = s

    def _busy_fallback(self, now_s: float) -> dict[str, float]:
        """GPU busy fraction per pool from the engines' busy seconds (what DCGM would show)."""
        out: dict[str, float] = {}
        stats = self.fleet.replica_stats()
        by_pool: dict[str, dict[str, float]] = {}
        for rs in stats:
            by_pool.setdefault(rs.pool, {})[rs.replica_id] = rs.busy_s
        for pool, cur in by_pool.items():
            prev = self._busy_prev.get(pool)
            if prev is not None and now_s > prev[0]:
                dt = now_s - prev[0]
                common = [r for r in cur if r in prev[1]]
                if common:
                    out[pool] = float(np.clip(np.mean([(cur[r] - prev[1][r]) / dt for r in common]), 0.0, 1.0))
            self._busy_prev[pool] = (now_s, cur)
        return out

    def _profile(self, now_s: float) -> ReuseProfile:
        """The reuse profile of the requests sent in the telemetry window ending now."""
        if not self._sent_based:
            return window_profile(self._reuse, self._arrival, self._prompt, now_s - self.window_s, now_s)
        sent = self.fleet.request_records()["sent_s"]
        new = np.flatnonzero(~self._seen & (sent <= now_s))
        if len(new):
            new = new[np.argsort(sent[new], kind="stable")]
            self._rows[new] = request_reuse_since(sent[new], self._prompt[new], [self._hashes[i] for i in new],
                                                  self._block_tokens, self._last_use)
            self._seen[new] = True
            self._sent_s[new] = sent[new]
        inside = self._seen & (self._sent_s >= now_s - self.window_s) & (self._sent_s < now_s)
        total = float(np.sum(self._prompt[inside]))
        if total <= 0:
            return ReuseProfile.none()
        prof = np.sum(self._rows[inside], axis=0) / total
        return ReuseProfile(tuple(float(min(max(v, 0.0), 1.0)) for v in prof))

    def read(self, now_s: float) -> ObservationRecord:
        obs = None
        if self._gpu_ok is not False:
            try:
                obs = self.observer.read(now_s)
                self._gpu_ok = True
            except ValueError:
                # the simulated DCGM view is unavailable: read engines only, busy from engine time
                from controller.bench.observe import SimObserver

                self._gpu_ok = False
                self.observer = SimObserver(self.fleet, window_s=self.window_s, include_gpu=False)
        if obs is None:
            obs = self.observer.read(now_s)
        obs = estimate(None, obs, self.observer.fleet_state(), now_s).observation  # + starting, draining
        busy = self._busy_fallback(now_s)
        if busy:
            pools = dict(obs.pools)
            for name, frac in busy.items():
                if name in pools and not pools[name].gpu_util_frac.ok:
                    pools[name] = replace(pools[name], gpu_util_frac=Reading(frac))
            obs = replace(obs, pools=pools)
        prof = self._profile(now_s)
        return ObservationRecord(at_s=now_s, observation=obs, settings=dict(self.settings),
                                 reuse=dict.fromkeys(self.settings, prof))


def record_run(spec: RunSpec, *, scenario=None, tick_s: float = 15.0, window_s: float | None = None,
               max_sim_s: float | None = None, progress: Callable[[str], None] | None = None) -> Recording:
    """Run one RunSpec to the end (or max_sim_s) and return its records. `scenario` (a Scenario
    value) replaces the spec's file and trace settings, e.g. one built in a test."""
    from controller.sim.fleet import Fleet

    window_s = spec.window_s if window_s is None else window_s
    sc = load_run_scenario(spec) if scenario is None else scenario
    fleet = Fleet(sc, seed=spec.seed, record_requests=True)  # send times: the reuse profile
    rec = SimRecorder(fleet, window_s=window_s)
    rng = np.random.default_rng(np.random.SeedSequence([spec.seed, 7919]))
    ex = spec.excitation
    records: list[ObservationRecord] = []
    t = 0.0
    next_change = ex.segment_s
    stop = max_sim_s if max_sim_s is not None else math.inf
    while not fleet.done and t < stop:
        t += tick_s
        fleet.run_until(t)
        records.append(rec.read(t))
        if t >= next_change:
            next_change += ex.segment_s
            for pool in rec.settings:
                s = rec.settings[pool]
                p = sc.pool(pool)
                upd: dict[str, Any] = {}
                if ex.replicas:
                    upd["replicas"] = int(np.clip(rng.choice(ex.replicas), p.min_replicas, p.max_replicas))
                if ex.prefix_weights:
                    upd["prefix_weight"] = float(rng.choice(ex.prefix_weights))
                if ex.inflight_caps:
                    upd["inflight_cap"] = int(rng.choice(ex.inflight_caps))
                if upd:
                    rec.apply(pool, replace(s, **upd))
    if progress:
        progress(f"{spec.label}: {len(records)} ticks, {t:.0f} simulated s")
    physics = {p.name: physics_for_scenario_pool(p) for p in sc.pools}
    return Recording(label=spec.label, records=tuple(records), physics=physics, window_s=window_s, tick_s=tick_s,
                     meta={"scenario": sc.name, "seed": spec.seed, "start_s": sc.trace.start_s,
                           "duration_s": sc.trace.duration_s, "excitation": _ex_dict(ex)})


def _ex_dict(ex: Excitation) -> dict:
    return {"segment_s": ex.segment_s, "replicas": list(ex.replicas), "prefix_weights": list(ex.prefix_weights),
            "inflight_caps": list(ex.inflight_caps)}


# --------------------------------------------------------------------------- the shipped split

PREFIX_WEIGHTS = (0.0, 1.0, 3.0, 8.0)
TEST_SEGMENT_S = 450.0
TEST_WINDOW_S = 60.0


def default_suite(seed: int = 0) -> tuple[tuple[RunSpec, ...], tuple[RunSpec, ...]]:
    """(training runs, test runs). Test runs use later trace segments (ServeGen: another day),
    other seeds and fleet sizes the training runs never had, so the test error is out of sample.

    Training runs change settings every 4-5 minutes, test runs every 450 s (more steady windows
    per setting). Both read telemetry over 60 s windows, the daemon's default: the models are
    judged on the numbers the daemon itself would see."""
    def ex_train(seg: float, reps: tuple[int, ...], caps: bool = True, affinity: bool = True) -> Excitation:
        return Excitation(seg, replicas=reps, prefix_weights=PREFIX_WEIGHTS if affinity else (),
                          inflight_caps=(0, 0, 16) if caps else ())

    def ex_test(reps: tuple[int, ...], affinity: bool = True) -> Excitation:
        return Excitation(TEST_SEGMENT_S, replicas=reps, prefix_weights=(0.0, 2.0, 5.0) if affinity else ())

    runs: list[RunSpec] = []
    for base in (11, 31):
        runs += [
            RunSpec("scenarios/mooncake-conv.yaml", f"mooncake-train-{base}", seed=base, start_s=0.0, duration_s=2100.0,
                    time_scale=1.0, initial_replicas=4, excitation=ex_train(300.0, (2, 4, 6, 8), caps=False)),
            RunSpec("scenarios/azure-conv.yaml", f"azure-conv-train-{base}", seed=base + 1, start_s=0.0,
                    duration_s=1800.0, rate_scale=2.0, initial_replicas=4, excitation=ex_train(240.0, (2, 4, 6, 8))),
            RunSpec("scenarios/azure-code.yaml", f"azure-code-train-{base}", seed=base + 2, start_s=0.0,
                    duration_s=1800.0, rate_scale=6.0, initial_replicas=4, excitation=ex_train(240.0, (2, 4, 6, 8))),
            RunSpec("scenarios/servegen-diurnal.yaml", f"servegen-train-{base}", seed=base + 3, sim_duration_s=3600.0,
                    servegen_start_day=0.0 if base == 11 else 1.0, initial_replicas=5,
                    excitation=ex_train(240.0, (3, 5, 8), affinity=False)),
        ]
    test: tuple[RunSpec, ...] = (
        RunSpec("scenarios/mooncake-conv.yaml", "mooncake-test", seed=21, start_s=2100.0, duration_s=1437.0,
                time_scale=1.0, initial_replicas=3, window_s=TEST_WINDOW_S, excitation=ex_test((3, 5, 7))),
        RunSpec("scenarios/azure-conv.yaml", "azure-conv-test", seed=22, start_s=1800.0, duration_s=1700.0,
                rate_scale=2.0, initial_replicas=5, window_s=TEST_WINDOW_S, excitation=ex_test((3, 5, 7))),
        RunSpec("scenarios/azure-code.yaml", "azure-code-test", seed=23, start_s=1800.0, duration_s=1600.0,
                rate_scale=6.0, initial_replicas=5, window_s=TEST_WINDOW_S, excitation=ex_test((3, 5, 7))),
        RunSpec("scenarios/servegen-diurnal.yaml", "servegen-test", seed=24, sim_duration_s=3600.0,
                servegen_start_day=3.0, initial_replicas=6, window_s=TEST_WINDOW_S,
                excitation=ex_test((4, 6, 10), affinity=False)),
    )
    train = tuple(runs)
    if seed:
        train = tuple(replace(s, seed=s.seed + 1000 * seed) for s in train)
        test = tuple(replace(s, seed=s.seed + 1000 * seed) for s in test)
    return train, test


def trace_of(label: str) -> str:
    """"mooncake-train-11" → "mooncake"; "azure-conv-test" → "azure-conv"."""
    for mark in ("-train", "-test"):
        if mark in label:
            return label.split(mark)[0]
    return label


# --------------------------------------------------------------------------- several runs


def _work(spec: RunSpec) -> dict:
    rec = record_run(spec)
    return {"label": rec.label, "window_s": rec.window_s, "tick_s": rec.tick_s, "meta": dict(rec.meta),
            "physics": {k: p.to_dict() for k, p in rec.physics.items()},
            "records": [record_to_dict(r) for r in rec.records]}


def _back(d: dict) -> Recording:
    return Recording(label=d["label"], records=tuple(record_from_dict(r) for r in d["records"]),
                     physics={k: PoolPhysics.from_dict(p) for k, p in d["physics"].items()},
                     window_s=d["window_s"], tick_s=d["tick_s"], meta=d["meta"])


def record_many(specs: Sequence[RunSpec], *, workers: int | None = None,
                progress: Callable[[str], None] | None = None) -> list[Recording]:
    n = workers if workers is not None else max(1, min(len(specs), os.cpu_count() or 1))
    if n <= 1 or len(specs) <= 1:
        out = []
        for s in specs:
            out.append(record_run(s))
            if progress:
                progress(f"recorded {s.label}: {len(out[-1].records)} ticks")
        return out
    results: list[Recording | None] = [None] * len(specs)
    with ProcessPoolExecutor(max_workers=n) as pool:
        futs = {pool.submit(_work, s): i for i, s in enumerate(specs)}
        for fut, i in futs.items():
            rec = results[i] = _back(fut.result())
            if progress:
                progress(f"recorded {specs[i].label}: {len(rec.records)} ticks")
    return [r for r in results if r is not None]


def record_cached(specs: Sequence[RunSpec], cache_dir: str | None, *,
                  progress: Callable[[str], None] | None = None) -> list[Recording]:
    """record_many, keeping each recording as a JSON-lines file in `cache_dir` (when given) and
    reading it back on the next call with the same label and seed (GOVERNOR_RECORDING_CACHE)."""
    recs: list[Recording | None] = [None] * len(specs)
    todo = []
    for i, s in enumerate(specs):
        path = Path(cache_dir) / f"{s.label}-seed{s.seed}.jsonl" if cache_dir else None
        if path is not None and path.exists():
            header, physics, records = read_recording(path)
            recs[i] = Recording(s.label, tuple(records), physics, header["window_s"], header["tick_s"],
                                header.get("meta", {}))
        else:
            todo.append(i)
    if todo:
        if progress:
            progress(f"simulating {len(todo)} runs")
        for i, r in zip(todo, record_many([specs[i] for i in todo], progress=progress), strict=True):
            recs[i] = r
            if cache_dir:
                Path(cache_dir).mkdir(parents=True, exist_ok=True)
                write_recording(Path(cache_dir) / f"{specs[i].label}-seed{specs[i].seed}.jsonl",
                                header_dict(r.physics, window_s=r.window_s, tick_s=r.tick_s, source=r.label,
                                            meta=r.meta), r.records)
    return [r for r in recs if r is not None]
