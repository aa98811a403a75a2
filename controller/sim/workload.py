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
- agentic, on a trace with its own hash ids (Mooncake): every trace request becomes one task of
  S calls, S uniform in [steps_min, steps_max]; call k (0-based) sends the first
  max(1, round(prompt × (k + 1) / S)) tokens of that request's prompt with the matching leading
  hash blocks, so each call re-sends the previous call's context and adds to it (an agent loop
  re-reading its history and tool output) and the last call is the trace's request itself. The
  last call keeps the request's output length; earlier calls draw theirs from the trace's output
  lengths (seeded). Example: a 12,000-token prompt in 4 calls sends 3,000, 6,000, 9,000 and
  12,000 tokens, the first 5, 11, 17 and 23 512-token blocks shared with the call before.
  Shared system-prompt blocks across tasks stay shared, as in the trace.
- Tenants (`scenario.tenants`): each request of the loaded trace draws a tenant by share (its
  own stream); a tenant's `surge` then adds copies of that tenant's requests only (controller/
  sim/trace_transforms.py `add_surge_where`); workflow tasks group consecutive requests of one
  tenant. A task's class is drawn from its tenant's class mix.
- Tier draw: when a pool has an `eligible` rule, each task draws u ~ U[0, 1) (its own stream),
  shared by its steps; the router sends it only to pools with u < eligible[class].
- Priorities: each task draws a class with probability `scenario.classes[c].share` (classes
  not listed have share 0); every request of a task gets its task's class.
- Streams beyond the first three (tenants, agentic output draws, tier draws) are spawned after
  them, so a scenario without those features draws exactly what it drew before.
- Timing (the engine's job, stated here for reference): step 0 is sent at its trace arrival; step
  k > 0 is sent `think_time_s` after step k − 1 finished successfully, its own arrival_s ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from controller.sim.scenario import Scenario, TaskSpec
from controller.sim.trace_transforms import add_surge_where
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
    tenant: np.ndarray | None = None  # int16 per request: index into tenant_names; None without tenants
    tenant_names: tuple[str, ...] = ()
    tier_u: np.ndarray | None = None  # float64 per request (its task's draw); None: no tier rules

    def __post_init__(self) -> None:
        n = len(self.trace)
        for name in ("priority", "task_id", "step", "steps_in_task", "tenant", "tier_u"):
            arr = getattr(self, name)
            if arr is None:
                continue
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
    tenant_names = tuple(scenario.tenants)
    tenant: np.ndarray | None = None
    if tenant_names:
        trace, tenant = assign_tenants(trace, scenario, rng.spawn(1)[0])
    if tasks.kind == "agentic":
        if not own_hashes:
            raise ValueError(f"{scenario.trace.path}: tasks.kind agentic needs a trace with its own hash_ids "
                             "(Mooncake): its calls are growing prefixes of a real prompt")
        trace, src, task_id, step = agentic_tasks(trace, tasks, rng.spawn(1)[0])
        tenant = tenant[src] if tenant is not None else None
    elif tasks.kind == "single":
        task_id = np.arange(len(trace), dtype=np.int64)
        step = np.zeros(len(trace), dtype=np.int32)
    elif tasks.kind == "session" and own_hashes:
        task_id, step = conversations(trace)
    elif tenant is not None:
        task_id, step = per_tenant_consecutive_tasks(tenant, len(tenant_names), tasks, task_rng)
    else:
        task_id, step = consecutive_tasks(len(trace), tasks, task_rng)
    n_tasks = int(task_id.max()) + 1 if len(task_id) else 0
    steps_in_task = np.bincount(task_id, minlength=n_tasks).astype(np.int32)[task_id]
    default = {c: scenario.classes[c].share if c in scenario.classes else 0.0 for c in PRIORITY_CLASSES}
    shares = np.array([default[c] for c in PRIORITY_CLASSES])
    if tenant is None:
        task_class = prio_rng.choice(len(PRIORITY_CLASSES), size=n_tasks, p=shares / shares.sum()).astype(np.int8)
    else:
        task_tenant = np.zeros(n_tasks, dtype=np.int64)
        task_tenant[task_id] = tenant
        u = prio_rng.random(n_tasks)
        task_class = np.zeros(n_tasks, dtype=np.int8)
        for k, name in enumerate(tenant_names):
            mix = scenario.tenants[name].class_shares(default)
            cum = np.cumsum([mix.get(c, 0.0) for c in PRIORITY_CLASSES])
            mine = task_tenant == k
            task_class[mine] = np.minimum(np.searchsorted(cum / cum[-1], u[mine], side="right"),
                                          len(PRIORITY_CLASSES) - 1)
    tier_u = None
    if any(p.eligible for p in scenario.pools):
        tier_u = rng.spawn(1)[0].random(n_tasks)[task_id]
    return Workload(
        trace=trace,
        priority=task_class[task_id],
        task_id=task_id,
        step=step,
        steps_in_task=steps_in_task,
        think_time_s=tasks.think_time_s,
        n_tasks=n_tasks,
        tenant=tenant.astype(np.int16) if tenant is not None else None,
        tenant_names=tenant_names,
        tier_u=tier_u,
    )


def assign_tenants(trace: Trace, scenario: Scenario, rng: np.random.Generator) -> tuple[Trace, np.ndarray]:
    """Draw a tenant per request by share, then add each tenant's own surge. Returns (trace, tenant index)."""
    names = tuple(scenario.tenants)
    shares = np.array([scenario.tenants[t].share for t in names])
    tenant = rng.choice(len(names), size=len(trace), p=shares / shares.sum())
    for k, name in enumerate(names):
        surge = scenario.tenants[name].surge
        if surge is not None:
            trace, src = add_surge_where(trace, surge, tenant == k, rng)
            tenant = tenant[src]
    return trace, tenant.astype(np.int64)


def per_tenant_consecutive_tasks(tenant: np.ndarray, n_tenants: int, tasks: TaskSpec,
                                 rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """`consecutive_tasks` within each tenant's requests (a task never mixes tenants); ids by first step."""
    n = len(tenant)
    task_id = np.zeros(n, dtype=np.int64)
    step = np.zeros(n, dtype=np.int32)
    offset = 0
    for k in range(n_tenants):
        idx = np.flatnonzero(tenant == k)
        if idx.size == 0:
            continue
        tid, st = consecutive_tasks(idx.size, tasks, rng)
        task_id[idx] = tid + offset
        step[idx] = st
        offset += int(tid.max()) + 1
    # renumber so tasks are numbered in order of their step 0 (the Workload convention)
    heads = np.flatnonzero(step == 0)
    order = np.empty(offset, dtype=np.int64)
    order[task_id[heads]] = np.arange(heads.size)
    return order[task_id], step


def agentic_tasks(trace: Trace, tasks: TaskSpec,
                  rng: np.random.Generator) -> tuple[Trace, np.ndarray, np.ndarray, np.ndarray]:
    """Each request → one task of growing-prefix calls (rules in the module docstring).

    Returns the new trace (a task's calls consecutive, all at the task's arrival), the source
    request of each call, task ids and steps."""
    assert trace.block_hashes is not None  # checked by the caller
    n = len(trace)
    steps = rng.integers(tasks.steps_min, tasks.steps_max + 1, size=n)
    src = np.repeat(np.arange(n), steps)
    starts = np.concatenate([[0], np.cumsum(steps)[:-1]])
    step = (np.arange(src.size) - starts[src]).astype(np.int32)
    total = steps[src]
    prompt_full = trace.prompt_tokens[src].astype(np.int64)
    prompt = np.maximum(1, np.rint(prompt_full * (step + 1) / total).astype(np.int64))
    last = step == total - 1
    prompt[last] = prompt_full[last]
    drawn = trace.output_tokens[rng.integers(0, n, size=src.size)]
    output = np.where(last, trace.output_tokens[src], drawn).astype(trace.output_tokens.dtype)
    b = trace.hash_block_tokens
    n_blocks = -(-prompt // b)
    hashes = tuple(trace.block_hashes[i][:k] for i, k in zip(src.tolist(), n_blocks.tolist(), strict=True))
    new = Trace(name=f"{trace.name}-agentic", arrival_s=np.ascontiguousarray(trace.arrival_s[src]),
                prompt_tokens=np.ascontiguousarray(prompt), output_tokens=np.ascontiguousarray(output),
                block_hashes=hashes, hash_block_tokens=b)
    return new, src, src.astype(np.int64), step


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
