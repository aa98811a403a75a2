"""A small scenario for the bench tests: a short generic trace whose rate steps up and back down.

Written to a tmp dir, seeded, so every run writes the same files. The load step makes
a schedule that follows demand cheaper than static peak provisioning, and the pool's
short start-up keeps replays of it quick.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

# (duration s, arrivals/s) phases of the trace
PHASES = ((120.0, 2.0), (120.0, 9.0), (180.0, 2.0))


def write_trace(path: Path, seed: int = 11) -> Path:
    rng = np.random.default_rng(seed)
    t0 = 0.0
    rows = []
    for duration, rate in PHASES:
        t = t0
        while True:
            t += rng.exponential(1.0 / rate)
            if t >= t0 + duration:
                break
            rows.append({"arrival_s": round(t, 4), "prompt_tokens": int(rng.integers(1000, 3000)),
                         "output_tokens": int(rng.integers(60, 200))})
        t0 += duration
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_scenario(folder: Path, *, name: str = "bench-tiny", extra: str = "") -> Path:
    write_trace(folder / "trace.jsonl")
    path = folder / f"{name}.yaml"
    path.write_text(f"""\
name: {name}
seed: 5
trace: {{path: trace.jsonl, format: jsonl}}
pools:
  - name: small
    model: llama-3-8b
    sku: a100-80gb
    replicas: 1
    min_replicas: 1
    max_replicas: 8
    startup_warm_s: 10
    startup_cold_s: 20
    engine: {{max_num_seqs: 64, max_num_batched_tokens: 4096}}
tasks:
  kind: workflow
  steps_min: 1
  steps_max: 2
{extra}""")
    return path


@pytest.fixture
def tiny_scenario(tmp_path: Path) -> Path:
    return write_scenario(tmp_path)
