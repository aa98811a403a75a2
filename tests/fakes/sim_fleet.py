"""Builders for fleet tests: a Scenario from a few overrides, a Workload from plain lists.

Fleets built here use the real calibration and engine; only the traffic is made
up, so each test states exactly which requests arrive when.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from controller.sim.scenario import Scenario
from controller.sim.trace_types import Trace
from controller.sim.workload import Workload


def pool(name: str = "p8", **over) -> dict:
    base = dict(name=name, model="llama-3-8b", sku="a100-80gb", tp=1, replicas=1, min_replicas=0, max_replicas=8,
                startup_warm_s=20.0, startup_cold_s=90.0)
    base.update(over)
    return base


def scenario(pools: Sequence[dict] | None = None, **over) -> Scenario:
    data = dict(name="t", seed=1, trace=dict(path="unused.csv"), pools=list(pools or [pool()]))
    data.update(over)
    return Scenario.model_validate(data)


def workload(arrival_s: Sequence[float], prompt: Sequence[int] | int, output: Sequence[int] | int, *,
             priority: Sequence[int] | int = 1, task_id: Sequence[int] | None = None,
             step: Sequence[int] | None = None, hashes: Sequence[Sequence[int]] | None = None,
             hash_block_tokens: int = 512, think_time_s: float = 0.0) -> Workload:
    n = len(arrival_s)

    def arr(v, dtype) -> np.ndarray:
        return np.asarray([v] * n if np.isscalar(v) else list(v), dtype=dtype)

    prompt_a = arr(prompt, np.int64)
    hashes_t = None if hashes is None else tuple(tuple(h) for h in hashes)
    trace = Trace("test", np.asarray(arrival_s, dtype=np.float64), prompt_a, arr(output, np.int64), hashes_t,
                  hash_block_tokens)
    task = np.arange(n, dtype=np.int64) if task_id is None else np.asarray(task_id, dtype=np.int64)
    st = np.zeros(n, dtype=np.int32) if step is None else np.asarray(step, dtype=np.int32)
    n_tasks = int(task.max()) + 1 if n else 0
    steps_in_task = np.bincount(task, minlength=n_tasks).astype(np.int32)[task]
    return Workload(trace=trace, priority=arr(priority, np.int8), task_id=task, step=st, steps_in_task=steps_in_task,
                    think_time_s=think_time_s, n_tasks=n_tasks)


def shared_hashes(n: int, prompt_tokens: int, block: int = 512, shared_blocks: int | None = None) -> list[list[int]]:
    """n prompts whose first `shared_blocks` (default: all full) blocks are identical; the rest unique."""
    full = -(-prompt_tokens // block)
    k = full if shared_blocks is None else shared_blocks
    return [list(range(k)) + [10_000 + 100 * i + j for j in range(full - k)] for i in range(n)]
