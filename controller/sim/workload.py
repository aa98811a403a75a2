"""The workload a simulated fleet serves: a trace plus priorities and task structure.

Role: `build_workload(scenario, rng)` loads the scenario's trace and decides, seeded, which
requests form one task and which priority class each task belongs to. It must not simulate
anything or read the wall clock; all randomness comes from the generator passed in.

Rules (requests stay in trace order; a task's requests are its steps, in trace order):

- Streams: the generator is split with `rng.spawn(3)` into one stream for the trace, one for
  task grouping and one for priorities, so changing class shares does not change the trace.
- single: every request is its own task.
- workflow: consecutive trace requests are grouped; each task's step count is drawn uniformly
  from [steps_min, steps_max] (the last task takes what is left). Example with steps 1..4:
  sizes 3, 1, 4, ... → requests 0-2 are task 0, request 3 is task 1, requests 4-7 are task 2.
- session, on a trace with its own hash ids (Mooncake): conversations are rebuilt from prefix
  reuse. Block 0 is not a key (every Mooncake request starts with the same system-prompt block).
  Request i continues the conversation of the most recent earlier request j with which it shares
  the longest prefix, when (a) that prefix has at least 2 blocks, (b) it covers at least half of
  j's blocks (a follow-up turn re-sends the earlier context; in Mooncake the median coverage is
  92%), and (c) j is the latest step of its conversation (a conversation is a chain; a second
  follow-up of the same j starts a new task). On the full Mooncake trace this gives 7,927
  conversations from 12,031 requests; 34% of requests are later turns, the longest has 43 turns.
  steps_min/steps_max do not apply: the data decides.
- session on a trace without its own hash ids (Azure, ServeGen, synthetic prefixes): grouped
  like workflow (consecutive requests, steps uniform in [steps_min, steps_max]).
- Priorities: each task draws a class with probability `scenario.classes[c].share` (classes
  not listed have share 0); every request of a task gets its task's class.
- Timing (the engine's job, stated here for reference): step 0 is sent at its trace arrival; step
  k > 0 is sent `think_time_s` after step k − 1 finished successfully, its own arrival_s ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from controller.sim.scenario import Scenario, TaskSpec
from controller.sim.trace_types import Trace
from controller.sim.traces import load_trace
from controller.types import PRIORITY_CLASSES

# Conversation rule constants (see the module docstring).
SESSION_MIN_SHARED_BLOCKS = 2
SESSION_MIN_COVERAGE_FRAC = 0.5


@dataclass(frozen=True)
class Workload:
    """Per-request arrays aligned with `trace` (index i is the same request everywhere)."""

    trace: Trace
    priority: np.ndarray  # int8 per request: index into controller.types.PRIORITY_CLASSES
    task_id: np.ndarray  # int64 per request; tasks are numbered in order of their step 0
    step: np.ndarray  # int32 per request, 0-based step index within its task
    steps_in_task: np.ndarray  # int32 per request
    think_time_s: float  # delay between a step's completion and the next step's send
    n_tasks: int

    def __post_init__(self) -> None:
        n = len(self.trace)
        for name in ("priority", "task_id", "step", "steps_in_task"):
            arr = getattr(self, name)
            if len(arr) != n:
                raise ValueError(f"Workload: {name} has {len(arr)} entries for {n} requests")
            arr.setflags(write=False)

    def __len__(self) -> int:
        return len(self.trace)

    def task_first_index(self) -> np.ndarray:
        """Index of step 0 per task id (int64, length n_tasks)."""
        first = np.full(self.n_tasks, -1, dtype=np.int64)
        heads = np.flatnonzero(self.step == 0)
        first[self.task_id[heads]] = heads
        return first

    def next_step_index(self) -> np.ndarray:
        """Per request, the index of the same task's next step, or -1 for a task's last step."""
        nxt = np.full(len(self), -1, dtype=np.int64)
        order = np.lexsort((self.step, self.task_id))  # by task, then step
        same = self.task_id[order[1:]] == self.task_id[order[:-1]]
        nxt[order[:-1][same]] = order[1:][same]
        return nxt

    def task_priority(self) -> np.ndarray:
        """Priority class index per task id (int8, length n_tasks)."""
        return self.priority[self.task_first_index()]


def build_workload(scenario: Scenario, rng: np.random.Generator) -> Workload:
    """Load the scenario's trace and assign tasks and priorities (seeded by `rng`)."""
    trace_rng, task_rng, prio_rng = rng.spawn(3)
    trace = load_trace(scenario.trace, Path(scenario.base_dir), trace_rng)
    tasks = scenario.tasks
    own_hashes = trace.block_hashes is not None and scenario.trace.prefixes is None
    if tasks.kind == "single":
        task_id = np.arange(len(trace), dtype=np.int64)
        step = np.zeros(len(trace), dtype=np.int32)
    elif tasks.kind == "session" and own_hashes:
        task_id, step = conversations(trace)
    else:
        task_id, step = consecutive_tasks(len(trace), tasks, task_rng)
    n_tasks = int(task_id.max()) + 1 if len(task_id) else 0
    steps_in_task = np.bincount(task_id, minlength=n_tasks).astype(np.int32)[task_id]
    shares = np.array([scenario.classes[c].share if c in scenario.classes else 0.0 for c in PRIORITY_CLASSES])
    task_class = prio_rng.choice(len(PRIORITY_CLASSES), size=n_tasks, p=shares / shares.sum()).astype(np.int8)
    return Workload(
        trace=trace,
        priority=task_class[task_id],
        task_id=task_id,
        step=step,
        steps_in_task=steps_in_task,
        think_time_s=tasks.think_time_s,
        n_tasks=n_tasks,
    )


def consecutive_tasks(n: int, tasks: TaskSpec, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Group n requests into runs of uniform-random length in [steps_min, steps_max]."""
    sizes = rng.integers(tasks.steps_min, tasks.steps_max + 1, size=n // tasks.steps_min + 1)
    ends = np.cumsum(sizes)
    n_tasks = int(np.searchsorted(ends, n, side="left")) + 1
    starts = np.concatenate([[0], ends[: n_tasks - 1]])
    task_id = np.repeat(np.arange(n_tasks, dtype=np.int64), np.diff(np.append(starts, n)))
    step = (np.arange(n) - starts[task_id]).astype(np.int32)
    return task_id, step


def conversations(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """Chain requests into conversations by prefix reuse (rules in the module docstring)."""
    if trace.block_hashes is None:
        raise ValueError("conversations: the trace has no block hashes")
    hashes = trace.block_hashes
    n = len(hashes)
    # Block id → the latest request holding it. Ids name whole prefixes (equal id = equal content
    # up to that block), so the latest holder of h[p] shares h[0..p] with request i.
    holder: dict[int, int] = {}
    conv = np.empty(n, dtype=np.int64)
    step = np.empty(n, dtype=np.int32)
    tail: list[int] = []  # per conversation: its latest request
    for i, h in enumerate(hashes):
        parent, shared = -1, 0
        for p in range(len(h) - 1, SESSION_MIN_SHARED_BLOCKS - 2, -1):
            j = holder.get(h[p], -1)
            if j >= 0:
                parent, shared = j, p + 1
                break
        if (
            parent >= 0
            and shared >= SESSION_MIN_SHARED_BLOCKS
            and shared >= SESSION_MIN_COVERAGE_FRAC * len(hashes[parent])
            and tail[conv[parent]] == parent
        ):
            conv[i] = conv[parent]
            step[i] = step[parent] + 1
            tail[conv[i]] = i
        else:
            conv[i] = len(tail)
            step[i] = 0
            tail.append(i)
        for b in h:
            holder[b] = i
    return conv, step
