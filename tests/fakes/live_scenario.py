"""A tiny scenario and generic JSONL trace, written to a tmp dir, for live-fleet tests.

Requests share prefixes (a few groups of `hash_ids`), so the prefix cache has
something to hit. Seeded: the same arguments write the same files.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

HASH_BLOCK_TOKENS = 64


def write_trace(path: Path, *, n: int = 300, rps: float = 5.0, seed: int = 7, groups: int = 4) -> Path:
    """Poisson arrivals at `rps`; prompts of 256–768 tokens whose first 4 blocks come from one of `groups` prefixes."""
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(1.0 / rps, n))
    next_id = 1000
    with path.open("w") as f:
        for i in range(n):
            prompt = int(rng.integers(256, 769))
            blocks = -(-prompt // HASH_BLOCK_TOKENS)
            g = int(rng.integers(0, groups))
            ids = [g * 10 + k for k in range(min(4, blocks))]
            while len(ids) < blocks:
                ids.append(next_id)
                next_id += 1
            rec = {"arrival_s": round(float(arrival[i]), 4), "prompt_tokens": prompt,
                   "output_tokens": int(rng.integers(16, 65)), "hash_ids": ids}
            f.write(json.dumps(rec) + "\n")
    return path


def write_scenario(tmp: Path, *, n: int = 300, rps: float = 5.0, replicas: int = 1, max_replicas: int = 4,
                   startup_s: float = 10.0, duration_s: float | None = None, name: str = "live-tiny") -> Path:
    write_trace(tmp / "trace.jsonl", n=n, rps=rps)
    text = f"""\
name: {name}
seed: 3
{f"duration_s: {duration_s}" if duration_s else ""}
trace: {{path: trace.jsonl, format: jsonl, hash_block_tokens: {HASH_BLOCK_TOKENS}}}
pools:
  - name: small
    model: llama-3-8b
    sku: a100-80gb
    replicas: {replicas}
    min_replicas: 0
    max_replicas: {max_replicas}
    startup_warm_s: {startup_s}
    startup_cold_s: {startup_s}
    node_gpus: 8
    engine: {{max_num_seqs: 64, max_num_batched_tokens: 4096}}
"""
    path = tmp / "scenario.yaml"
    path.write_text(text)
    return path
