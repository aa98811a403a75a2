"""Tasks, steps and tenants as the planner weighs them: values derived from the measured task profile.

The data plane measures, per priority class, how many steps tasks run and what a step costs at each index
(`StepProfile`, controller/types.py; the picker's task book in the daemon, the simulator's tasks in the bench).
From it the planner takes what losing one request of the class costs, in requests' worth of work:

- step-blind (a shed or late request falls on any step alike): a request at step s loses its own tokens and the
  tokens its task sank into steps 0 … s − 1 (the task fails, DESIGN.md §2 "workflow context"), so

      task_loss = Σ_s r_s × (sunk_s + own_s) / Σ_s r_s × own_s,

  r_s the share of the class's requests at step s (the tasks that reach it: r_s ∝ P(steps > s)).
  Example: every task two steps of 1,000 then 3,000 tokens: r = (½, ½), task_loss = (1,000 + 4,000) /
  (1,000 + 3,000) = 1.25; tasks of 5 equal steps: (1 + 2 + … + 5) / 5 = 3, the static (1 + 5) / 2.
  Equivalently task_loss = 1 + E[sunk] / E[own]: each lost request is one request's worth of its own, plus what
  its task sank before it.
- step-aware (the router takes a class's shed share of all arrivals from first steps, and holds later steps
  first: controller/dataplane/picker.py, controller/sim/router.py): a drop falls on a task that has not started,
  nothing is sunk: 1 request's worth, as long as there are first steps to drop, the share `first_share` of the
  class's arriving steps (measured: shedding first steps raises it, the dropped tasks' later steps never arrive).
  Beyond that the drops fall on later steps, each losing `later = 1 + E[sunk | step > 0] / E[own]`
  (`StepLoss`; blind = first_share × 1 + (1 − first_share) × later).

Tenants: a token-weighted fair share (max-min fair on tokens per second: no tenant gets more than it asks,
what the light ones leave is shared equally among the rest), the share the picker's fair queue serves
(controller/dataplane/task_book.py, virtual time = tokens served / weight).

Must not: do I/O, read a clock or import anything outside the values.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from controller.types import StepProfile


@dataclass(frozen=True, slots=True)
class StepLoss:
    """What a lost request of a class costs, in requests' worth (module docstring): step-blind (`blind`), and
    step-aware: 1 for the first steps, the share `first_share` of arrivals, `later` beyond them."""

    blind: float
    first_share: float = 1.0
    later: float = 1.0


def step_loss(p: StepProfile) -> StepLoss:
    """The profile's `StepLoss`. Example: tasks of two steps of 1,000 then 3,000 tokens: blind 1.25, first share
    0.5, later 1 + 1,000 / 2,000 × 2 = 1.5."""
    blind = task_loss(p)
    r0 = float(request_shares(p)[0])
    later = 1.0 + (blind - 1.0) / (1.0 - r0) if r0 < 1.0 - 1e-12 else blind
    return StepLoss(blind=blind, first_share=r0, later=later)


def request_shares(p: StepProfile) -> np.ndarray:
    """The share of the class's requests at each step index: as measured (`requests`), else the tasks that run at
    least s + 1 steps. Example: tasks (0.5, 0.5) (one step, two steps) → requests (2/3, 1/3)."""
    if p.requests:
        m = np.asarray(p.requests, dtype=float)
        return np.asarray(m / m.sum(), dtype=float)
    t = np.asarray(p.tasks, dtype=float)
    reach = np.cumsum(t[::-1])[::-1]  # tasks with at least s + 1 steps
    return np.asarray(reach / reach.sum(), dtype=float)


def sunk_tokens(p: StepProfile) -> np.ndarray:
    """Tokens a task has sunk into its earlier steps when it sends step s (0 for the first)."""
    tok = np.asarray(p.tokens, dtype=float)
    return np.concatenate(([0.0], np.cumsum(tok)[:-1]))


def task_loss(p: StepProfile) -> float:
    """Requests' worth of work one request of the class loses when it is shed or late, step-blind (its own and
    its task's sunk steps; module docstring). At least 1; 1 for single-step tasks or a profile with no tokens."""
    r = request_shares(p)
    tok = np.asarray(p.tokens, dtype=float)
    own = float((r * tok).sum())
    if own <= 0:
        return 1.0
    return max(1.0, float((r * (sunk_tokens(p) + tok)).sum()) / own)


def static_loss(steps_per_task: float) -> float:
    """The static weight the objective used before a profile was measured: (1 + steps) / 2, the mean over a
    task's steps of the steps lost with it when every step costs the same (controller/core/objective.py)."""
    return (1.0 + steps_per_task) / 2.0


def mean_steps(p: StepProfile) -> float:
    """Mean steps per task of the profile."""
    t = np.asarray(p.tasks, dtype=float)
    return float((t * np.arange(1, len(t) + 1)).sum() / t.sum())


def fair_shares(demand: Mapping[str, float], capacity: float) -> dict[str, float]:
    """Max-min fair shares of `capacity` over `demand` (same unit: tokens per second): a tenant asking less than
    an equal share keeps what it asks, the rest is split equally among the others (water filling).
    Example: demand {a: 100, b: 10}, capacity 60 → {a: 50, b: 10}; capacity 200 → {a: 100, b: 10}."""
    if not math.isfinite(capacity) or capacity < 0:
        raise ValueError(f"fair_shares: capacity must be a finite number >= 0 (got {capacity!r})")
    left = capacity
    out: dict[str, float] = {}
    todo = sorted(((max(float(d), 0.0), t) for t, d in demand.items()), key=lambda x: (x[0], x[1]))
    while todo:
        level = left / len(todo)
        d, t = todo[0]
        if d <= level:
            out[t] = d
            left -= d
            todo.pop(0)
            continue
        for _d, t2 in todo:
            out[t2] = level
        break
    return out


MAX_PROFILE_STEPS = 32  # step indices past this share the last bucket (an agent's long loop: its tail, not its shape)


def profile_from_samples(task_steps: np.ndarray, step_index: np.ndarray, step_tokens: np.ndarray,
                         max_steps: int = MAX_PROFILE_STEPS) -> StepProfile | None:
    """A step profile from samples: the step counts of the tasks seen (`task_steps`, one per task) and each step
    seen arriving with its index and tokens (`step_index`, `step_tokens`; their shares are the profile's
    `requests`), counted into `profile_from_counts`: None without a task of more than one step (a profile of
    single requests weighs as none). Example: tasks [1, 2], steps (0, 900), (0, 1100), (1, 3000) →
    tasks (0.5, 0.5), tokens (1000, 3000)."""
    n = np.asarray(task_steps, dtype=np.int64)
    idx = np.asarray(step_index, dtype=np.int64)
    if n.size == 0 or idx.size == 0:
        return None
    seen = np.bincount(idx)
    total = np.bincount(idx, weights=np.asarray(step_tokens, dtype=float))
    return profile_from_counts({int(k): float(v) for k, v in enumerate(np.bincount(n)) if v > 0},
                               {s: float(v) for s, v in enumerate(seen) if v > 0},
                               {s: float(total[s]) for s, v in enumerate(seen) if v > 0}, max_steps)


def profile_from_counts(task_steps: Mapping[int, float], step_requests: Mapping[int, float],
                        step_tokens: Mapping[int, float], max_steps: int = MAX_PROFILE_STEPS) -> StepProfile | None:
    """A step profile from counts (the picker's counters over a window, controller/obs/task_cost.py): tasks settled
    by the steps they ran (1-based), arriving steps and their tokens by step index (0-based). The same rules as
    `profile_from_samples`: None without a task of more than one step. Example: {1: 5, 2: 5}, {0: 10, 1: 5},
    {0: 10_000, 1: 15_000} → tasks (0.5, 0.5), tokens (1000, 3000)."""
    tasks = {min(int(n), max_steps): 0.0 for n in task_steps}
    for n, v in task_steps.items():
        if n >= 1 and v > 0:
            tasks[min(int(n), max_steps)] += float(v)
    tasks = {n: v for n, v in tasks.items() if v > 0}
    if not tasks or max(tasks) <= 1:
        return None
    size = max(tasks)
    counts = np.zeros(size)
    for n, v in tasks.items():
        counts[n - 1] += v
    seen, total = np.zeros(size), np.zeros(size)
    for s, v in step_requests.items():
        if s >= 0 and v > 0:
            seen[min(int(s), size - 1)] += float(v)
            total[min(int(s), size - 1)] += float(step_tokens.get(s, 0.0))
    if not seen.any():
        return None
    mean = _fill_forward(np.where(seen > 0, total / np.maximum(seen, 1e-12), np.nan))
    return StepProfile(tasks=tuple(float(x) / float(counts.sum()) for x in counts),
                       tokens=tuple(float(x) for x in mean), count=int(round(counts.sum())),
                       requests=tuple(float(x) / float(seen.sum()) for x in seen))


def _fill_forward(mean: np.ndarray) -> np.ndarray:
    """An index no step was seen at (the window cut it) takes the nearest earlier one's mean (the first seen's
    before any was seen). `mean` has at least one value that is not NaN."""
    out = mean.copy()
    for s in range(out.size):
        if np.isnan(out[s]):
            earlier = out[:s][~np.isnan(out[:s])]
            out[s] = earlier[-1] if earlier.size else mean[~np.isnan(mean)][0]
    return out
