"""The task profile the bench hands the controller: measured from the simulator's agentic tasks as the picker's
task book measures them, None where no task is labelled (controller/bench/task_profile.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from controller.bench.task_profile import sim_task_profile
from controller.core.workflow import profile_from_samples, task_loss
from controller.sim.fleet import Fleet
from controller.sim.scenario import parse_scenario


def _scenario(tmp_path: Path, kind: str) -> Fleet:
    rng = np.random.default_rng(5)
    lines = []
    for i in range(60):
        blocks = int(rng.integers(4, 12))
        hashes = [0, 1] + [100 * (i + 1) + k for k in range(blocks - 2)]
        lines.append(json.dumps({"arrival_s": 2.0 * i, "prompt_tokens": 512 * blocks - 100,
                                 "output_tokens": int(rng.integers(10, 60)), "hash_ids": hashes}))
    (tmp_path / "a.jsonl").write_text("\n".join(lines) + "\n")
    tasks = ("{kind: agentic, steps_min: 3, steps_max: 8, think_time_s: 2}" if kind == "agentic"
             else "{kind: single}")
    text = f"""
name: t
seed: 4
trace: {{path: a.jsonl}}
pools: [{{name: p, model: llama-3-8b, sku: a100-80gb, replicas: 2}}]
tasks: {tasks}
"""
    return Fleet(parse_scenario(text, source="t.yaml", base_dir=tmp_path), seed=1)


def test_agentic_tasks_give_each_class_a_step_profile(tmp_path):
    fleet = _scenario(tmp_path, "agentic")
    fleet.run_until(150.0)
    prof = sim_task_profile(fleet, 150.0)
    assert prof is not None and prof.classes
    wl = fleet.workload
    for p in prof.classes.values():
        assert len(p.tasks) <= 8 and sum(p.tasks) == pytest.approx(1.0)
        assert sum(p.tasks[:2]) == 0.0  # 3-8 steps: no task of one or two
        # contexts grow step by step: a later step costs more, so a lost one carries more than itself
        assert p.tokens[-1] > p.tokens[0]
        assert task_loss(p) > 1.5
    assert sum(p.count for p in prof.classes.values()) <= wl.n_tasks


def test_unlabelled_tasks_give_no_profile(tmp_path):
    fleet = _scenario(tmp_path, "single")
    fleet.run_until(150.0)
    assert sim_task_profile(fleet, 150.0) is None


def test_nothing_sent_in_the_window_gives_no_profile(tmp_path):
    fleet = _scenario(tmp_path, "agentic")
    assert sim_task_profile(fleet, 0.0) is None


def test_profile_from_samples_rows():
    p = profile_from_samples(np.array([1, 2]), np.array([0, 0, 1]), np.array([900.0, 1100.0, 3000.0]))
    assert p is not None and p.tasks == (0.5, 0.5) and p.tokens == (1000.0, 3000.0) and p.count == 2
    assert profile_from_samples(np.array([1, 1, 1]), np.array([0, 0, 0]), np.array([5.0, 5.0, 5.0])) is None
    # a step index the window did not see takes the one before it
    q = profile_from_samples(np.array([3]), np.array([0, 2]), np.array([100.0, 300.0]))
    assert q is not None and q.tokens == (100.0, 100.0, 300.0)
    # past the cap, indices share the last bucket
    r = profile_from_samples(np.array([50]), np.arange(50), np.full(50, 10.0), max_steps=4)
    assert r is not None and len(r.tasks) == 4 and r.tasks[-1] == 1.0
