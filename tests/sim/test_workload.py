"""build_workload: task grouping (single, workflow, session) and priorities, seeded."""

from __future__ import annotations

import numpy as np
import pytest

from controller.paths import shared_data_dir
from controller.sim.scenario import Scenario, parse_scenario
from controller.sim.workload import Workload, build_workload, consecutive_tasks
from controller.types import PRIORITY_CLASSES

TRACES = shared_data_dir() / "traces"


def _scenario(trace: str, tasks: str = "kind: single", classes: str | None = None, extra_trace: str = "") -> Scenario:
    text = f"""
name: t
seed: 3
trace:
  path: {trace}
{extra_trace}
pools:
  - name: p
    model: llama-3-8b
    sku: a100-80gb
tasks:
  {tasks}
"""
    if classes:
        text += f"classes:\n{classes}"
    return parse_scenario(text, source="t.yaml", base_dir=TRACES)


def _check_structure(w: Workload) -> None:
    """Invariants of every workload: aligned arrays, tasks numbered by their first step, steps 0..k-1."""
    n = len(w)
    assert len(w.priority) == len(w.task_id) == len(w.step) == len(w.steps_in_task) == n
    assert w.priority.dtype == np.int8 and w.task_id.dtype == np.int64
    assert w.step.dtype == np.int32 and w.steps_in_task.dtype == np.int32
    first = w.task_first_index()
    assert len(first) == w.n_tasks and np.all(first >= 0)
    assert np.all(np.diff(first) > 0)  # tasks numbered in trace order of their step 0
    assert np.all(w.step[first] == 0)
    assert np.array_equal(np.bincount(w.task_id, minlength=w.n_tasks)[w.task_id], w.steps_in_task)
    assert np.all(w.step < w.steps_in_task)
    # One priority per task.
    assert np.array_equal(w.priority, w.task_priority()[w.task_id])
    nxt = w.next_step_index()
    has = nxt >= 0
    assert np.sum(~has) == w.n_tasks
    idx = np.flatnonzero(has)
    assert np.all(nxt[idx] > idx)  # later steps come later in trace order
    assert np.all(w.task_id[nxt[idx]] == w.task_id[idx]) and np.all(w.step[nxt[idx]] == w.step[idx] + 1)


def test_single():
    w = build_workload(_scenario("azure2023_code.csv"), np.random.default_rng(0))
    _check_structure(w)
    assert w.n_tasks == len(w) == 8_819
    assert np.all(w.step == 0) and np.all(w.steps_in_task == 1)
    assert w.think_time_s == 0.0


@pytest.mark.parametrize(("lo", "hi"), [(1, 1), (1, 4), (3, 3), (2, 7)])
def test_workflow_groups_consecutive_requests(lo, hi):
    sc = _scenario("azure2023_code.csv", f"kind: workflow\n  steps_min: {lo}\n  steps_max: {hi}\n  think_time_s: 1.5")
    w = build_workload(sc, np.random.default_rng(1))
    _check_structure(w)
    assert w.think_time_s == 1.5
    # Consecutive: a task's steps are adjacent requests.
    assert np.all(np.diff(w.task_id) >= 0) and np.all(np.diff(w.task_id) <= 1)
    sizes = np.bincount(w.task_id)
    assert sizes[:-1].min() >= lo and sizes.max() <= hi  # the last task may be cut short
    assert w.n_tasks == pytest.approx(len(w) / ((lo + hi) / 2), rel=0.05)
    if hi > lo:
        assert set(np.unique(sizes[:-1])) == set(range(lo, hi + 1))


def test_consecutive_tasks_covers_every_request():
    from controller.sim.scenario import TaskSpec

    for n in (1, 2, 5, 17):
        task_id, step = consecutive_tasks(n, TaskSpec(kind="workflow", steps_min=2, steps_max=3),
                                          np.random.default_rng(n))
        assert len(task_id) == n and task_id[0] == 0 and step[0] == 0
        assert np.all(np.diff(task_id) >= 0)


@pytest.fixture(scope="module")
def mooncake_sessions() -> Workload:
    sc = _scenario("mooncake_conversation.jsonl", "kind: session\n  think_time_s: 30")
    return build_workload(sc, np.random.default_rng(0))


def test_mooncake_sessions_follow_prefix_reuse(mooncake_sessions):
    w = mooncake_sessions
    _check_structure(w)
    assert w.think_time_s == 30.0
    assert w.n_tasks == 7_927  # deterministic: the data decides, not the generator
    assert np.mean(w.step > 0) == pytest.approx(0.341, abs=0.002)
    assert w.steps_in_task.max() == 43
    hashes = w.trace.block_hashes
    nxt = w.next_step_index()
    for i in np.flatnonzero(nxt >= 0):
        a, b = hashes[i], hashes[nxt[i]]
        shared = 0
        for x, y in zip(a, b, strict=False):
            if x != y:
                break
            shared += 1
        # A later turn re-sends at least half of the previous turn's blocks, and more than block 0.
        assert shared >= 2 and shared >= 0.5 * len(a)


def test_session_without_own_hashes_groups_consecutively():
    sc = _scenario(
        "azure2023_conv.csv",
        "kind: session\n  steps_min: 2\n  steps_max: 5",
        extra_trace="  prefixes: {groups: 8, prefix_tokens: 1024}",
    )
    w = build_workload(sc, np.random.default_rng(0))
    _check_structure(w)
    sizes = np.bincount(w.task_id)
    assert sizes[:-1].min() >= 2 and sizes.max() <= 5
    assert np.all(np.diff(w.task_id) <= 1)


@pytest.mark.parametrize(
    "shares",
    [
        {"critical": 0.2, "standard": 0.6, "sheddable": 0.2},
        {"critical": 0.5, "standard": 0.5},
        {"sheddable": 1.0},
    ],
)
def test_priorities_follow_class_shares(shares):
    classes = "".join(
        f"  {c}: {{share: {s}, ttft_slo_s: 2, tpot_slo_s: 0.1}}\n" for c, s in shares.items()
    )
    sc = _scenario("azure2023_conv.csv", "kind: workflow\n  steps_min: 1\n  steps_max: 3", classes=classes)
    w = build_workload(sc, np.random.default_rng(2))
    _check_structure(w)
    got = np.bincount(w.task_priority(), minlength=len(PRIORITY_CLASSES)) / w.n_tasks
    for k, c in enumerate(PRIORITY_CLASSES):
        assert got[k] == pytest.approx(shares.get(c, 0.0), abs=0.02)


def test_deterministic_and_streams_are_independent():
    tasks = "kind: workflow\n  steps_min: 1\n  steps_max: 4"
    a = build_workload(_scenario("azure2023_code.csv", tasks, extra_trace="  rate_scale: 1.7"),
                       np.random.default_rng(5))
    b = build_workload(_scenario("azure2023_code.csv", tasks, extra_trace="  rate_scale: 1.7"),
                       np.random.default_rng(5))
    for name in ("priority", "task_id", "step"):
        assert np.array_equal(getattr(a, name), getattr(b, name))
    assert np.array_equal(a.trace.arrival_s, b.trace.arrival_s)
    # Changing the class shares changes priorities but not the trace or the task grouping.
    classes = ("  critical: {share: 0.9, ttft_slo_s: 2, tpot_slo_s: 0.1}\n"
               "  standard: {share: 0.1, ttft_slo_s: 5, tpot_slo_s: 0.2}\n")
    c = build_workload(
        _scenario("azure2023_code.csv", tasks, classes=classes, extra_trace="  rate_scale: 1.7"),
        np.random.default_rng(5),
    )
    assert np.array_equal(a.trace.arrival_s, c.trace.arrival_s)
    assert np.array_equal(a.task_id, c.task_id)
    assert not np.array_equal(a.priority, c.priority)
    d = build_workload(_scenario("azure2023_code.csv", tasks, extra_trace="  rate_scale: 1.7"),
                       np.random.default_rng(6))
    assert len(d) != len(a) or not np.array_equal(a.trace.arrival_s, d.trace.arrival_s)


def test_workload_rejects_misaligned_arrays():
    w = build_workload(_scenario("azure2023_code.csv"), np.random.default_rng(0))
    with pytest.raises(ValueError, match="priority has 3 entries"):
        Workload(w.trace, np.zeros(3, np.int8), w.task_id, w.step, w.steps_in_task, 0.0, w.n_tasks)
