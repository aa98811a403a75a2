"""Run several simulated recordings in worker processes (the bench and `fit --defaults`).

Each worker runs one RunSpec on its own virtual clock and sends back the records in their JSON
form (controller/learning/records.py), which the parent turns back into values: results cross
the process boundary as plain data. Order of results = order of specs, whatever finishes first.

Must not: share state between workers (each builds its own fleet from the spec and seed).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor

from controller.core.coupling import PoolPhysics
from controller.learning.dataset import Recording, RunSpec, record_run
from controller.learning.records import record_from_dict, record_to_dict


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
            results[i] = _back(fut.result())
            if progress:
                progress(f"recorded {specs[i].label}: {len(results[i].records)} ticks")
    return [r for r in results if r is not None]


def record_cached(specs: Sequence[RunSpec], cache_dir: str | None, *,
                  progress: Callable[[str], None] | None = None) -> list[Recording]:
    """record_many, keeping each recording as a JSON-lines file in `cache_dir` (when given) and
    reading it back on the next call with the same label and seed (GOVERNOR_RECORDING_CACHE)."""
    from pathlib import Path

    from controller.learning.records import header_dict, read_recording, write_recording

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
        for i, r in zip(todo, record_many([specs[i] for i in todo], progress=progress)):
            recs[i] = r
            if cache_dir:
                Path(cache_dir).mkdir(parents=True, exist_ok=True)
                write_recording(Path(cache_dir) / f"{specs[i].label}-seed{specs[i].seed}.jsonl",
                                header_dict(r.physics, window_s=r.window_s, tick_s=r.tick_s, source=r.label,
                                            meta=r.meta), r.records)
    return [r for r in recs if r is not None]
