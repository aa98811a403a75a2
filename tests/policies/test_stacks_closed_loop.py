"""The three composed stacks in closed loop on a small two-pool (A100 + H100) scenario with a load step.

Short (240 simulated seconds, a few seconds of wall time each): each stack must run through the
bench's runner, serve most tasks, scale up into the step, and use its own layers (scorer weights,
shedding, SKU mix) as its rules say.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from controller.bench.runner import run_policy
from controller.policies import ReplicaCapacity
from controller.sim.scenario import load_scenario

PHASES = ((60.0, 4.0), (120.0, 25.0), (60.0, 4.0))  # (duration s, arrivals/s)


def write_scenario(folder: Path) -> Path:
    rng = np.random.default_rng(7)
    rows, t0 = [], 0.0
    for duration, rate in PHASES:
        t = t0
        while (t := t + rng.exponential(1.0 / rate)) < t0 + duration:
            rows.append({"arrival_s": round(t, 4), "prompt_tokens": int(rng.integers(600, 1800)),
                         "output_tokens": int(rng.integers(40, 160))})
        t0 += duration
    (folder / "trace.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = folder / "stacks-tiny.yaml"
    pool = """  - name: {name}
    model: llama-3-8b
    sku: {sku}
    replicas: 1
    min_replicas: 1
    max_replicas: 6
    startup_warm_s: 8
    startup_cold_s: 15
    engine: {{max_num_seqs: 64, max_num_batched_tokens: 4096}}
"""
    path.write_text("name: stacks-tiny\nseed: 3\ntrace: {path: trace.jsonl, format: jsonl, hash_block_tokens: 256,"
                    " prefixes: {groups: 8, zipf_a: 1.2, prefix_tokens: 512}}\npools:\n"
                    + pool.format(name="a100", sku="a100-80gb") + pool.format(name="h100", sku="h100-80gb")
                    + "tasks:\n  kind: single\n")
    return path


@pytest.fixture(scope="module")
def scenario(tmp_path_factory):
    return load_scenario(write_scenario(tmp_path_factory.mktemp("stacks")))


# A rough per-replica capacity at the SLO: an 8B A100 replica serves ~5 req/s of this mix, an H100 ~1.5×.
CAPACITY = {"a100": ReplicaCapacity(rps=5.0), "h100": ReplicaCapacity(rps=7.5)}


@pytest.mark.parametrize("name", ["llm-d-stack", "aibrix-stack", "dynamo-stack"])
def test_stack_serves_the_step_in_closed_loop(scenario, name):
    params: dict = {"capacity": CAPACITY}
    if name == "dynamo-stack":
        params["adjustment_interval_s"] = 60.0  # a 240 s run would see one 180 s planner interval only
    run = run_policy(scenario, name, seed=3, params=params)
    s = run.summary
    assert s["tasks"] > 3000
    assert s["successful_tasks"] / s["tasks"] > 0.8
    assert s["slo_attainment"]["critical"] >= 0.95  # critical is what every stack protects first
    peaks = {p: v["replicas_peak"] for p, v in s["per_pool"].items()}
    assert sum(peaks.values()) > 2, peaks  # the 25 req/s step needs more than the 1 + 1 it starts with
    assert run.scaling_actions >= 1


def test_the_bench_runs_the_stacks_by_default_and_the_router_only_variants_on_request(scenario):
    from controller.bench.side_by_side import OPT_IN_VARIANTS, default_policies, parse_policies, resolve

    labels = default_policies(scenario)
    assert {"llm-d-stack", "aibrix-stack", "dynamo-stack"} <= set(labels)
    assert not OPT_IN_VARIANTS & set(labels)
    assert parse_policies("static,static-llm-d-routing", scenario) == ["static", "static-llm-d-routing"]
    base, params = resolve("static-aibrix-routing")
    assert base == "static" and params["routing"] == {"prefix_weight": 2.0, "queue_weight": 1.0, "kv_weight": 0.0}
