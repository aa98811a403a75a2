"""`governor replay`: the requests it builds from a trace, its bounds, and its measures against a live replica."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from controller.cli import main
from controller.dataplane.replay import build_requests, replay
from controller.paths import PROJECT_ROOT
from controller.sim.live import LiveFleet
from controller.sim.openai_api import pseudo_tokens
from controller.sim.trace_types import Trace

SCENARIO = PROJECT_ROOT / "scenarios" / "dataplane" / "fleet.yaml"


def _trace() -> Trace:
    return Trace("t", np.array([0.0, 0.5, 1.0, 4.0]), np.array([40, 40, 20, 16]), np.array([5, 300, 1, 2]),
                 ((7, 8), (7, 9), (7,), (1,)), 16)


def test_requests_share_text_where_the_trace_shares_blocks_and_carry_exact_counts():
    reqs = build_requests(_trace(), chat=False, model="", max_requests=10, time_scale=2.0, start_s=0.0,
                          class_mix=(0.0, 1.0, 0.0), max_output=100, seed=3, until_s=1.0)
    assert [r.at_s for r in reqs] == [0.0, 0.25, 0.5]  # 4.0 / 2 is past until_s
    bodies = [json.loads(r.body) for r in reqs]
    assert [b["prompt_tokens"] for b in bodies] == [40, 40, 20]
    assert [b["max_tokens"] for b in bodies] == [5, 100, 1]  # capped by max_output
    assert all(r.cls == "standard" for r in reqs)
    toks = [pseudo_tokens(b["prompt"]) for b in bodies]
    assert [len(t) for t in toks] == [40, 40, 20]  # the engine's estimate finds the trace's counts
    assert toks[0][:16] == toks[1][:16] == toks[2][:16]  # block 7 is shared
    assert toks[0][16:32] != toks[1][16:32]  # blocks 8 and 9 differ


@pytest.mark.parametrize("flag,value,msg", [("--class-mix", "1,2", "--class-mix '1,2'"),
                                            ("--concurrency", "0", "--concurrency 0"),
                                            ("--duration", "-1", "--duration -1.0")])
def test_bad_flags_are_named(capsys, flag, value, msg):
    trace = str(PROJECT_ROOT / "scenarios" / "dataplane" / "idle.jsonl")
    assert main(["replay", trace, "--url", "http://127.0.0.1:9", flag, value]) == 2
    assert msg in capsys.readouterr().err


def test_a_missing_trace_is_named(capsys):
    assert main(["replay", "/nonexistent/trace.csv", "--url", "http://127.0.0.1:9"]) == 2
    assert "/nonexistent/trace.csv" in capsys.readouterr().err


@pytest.mark.e2e
def test_replay_measures_ttft_and_tpot_at_a_live_replica():
    lf = LiveFleet(SCENARIO, step_wall_s=0.01)
    info = lf.start()
    try:
        reqs = build_requests(_trace(), chat=True, model="", max_requests=3, time_scale=10.0, start_s=0.0,
                              class_mix=(1.0, 1.0, 1.0), max_output=50, seed=1)
        summary = asyncio.run(replay(info["replicas"][0]["api"], reqs, chat=True, concurrency=2, duration_s=10,
                                     timeout_s=20))
    finally:
        lf.stop()
    out = summary.to_dict()
    assert out["requests"] == 3 and out["ok"] == 3 and out["errors"] == 0
    assert [r.tokens for r in summary.results] == [5, 50, 1]
    assert all(r.ttft_s > 0 for r in summary.results) and summary.results[1].tpot_s > 0
    assert out["ttft_s"]["p50"] is not None and sum(c["requests"] for c in out["by_class"].values()) == 3
