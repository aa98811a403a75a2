"""The MPC's memory headroom: DCGM framebuffer use sets a ceiling on raising a pool's engine batch caps.

`memory_headroom` (controller/policies/mpc/plan_inputs.py) turns the FB used fraction of a pool's fullest
GPU into the largest max_num_batched_tokens whose extra activation memory fits in the free FB with a
margin; the planner may not raise the caps above it (tests/core/test_mpc.py checks the search), the
reasons say so, and a missing reading changes nothing.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from controller.core.forecast import LoadForecast
from controller.core.mpc import PlanProblem
from controller.core.objective import resolve_weights
from controller.perf.catalogue import GIB, MODELS
from controller.policies.mpc import MpcPolicy
from controller.policies.mpc.memory import MpcPoolMemory
from controller.policies.mpc.plan_inputs import FB_MARGIN_GIB, build_problem, memory_headroom, memory_headrooms
from controller.policies.mpc.reasons import memory_reasons
from controller.types import BreakerAction, Reading, SignalStatus
from tests.policies.builders import drive, fleet, inp, obs_row, spec

A100 = spec("p", model="llama-3-8b", sku="a100-80gb", usd_per_replica_hour=2.2, max_replicas=16,
            startup_warm_s=8.0, startup_cold_s=20.0)
OPTIONS = (1024, 2048, 4096, 8192)


def test_activation_memory_per_token_from_the_catalogue_shapes():
    assert MODELS["llama-3-8b"].activation_bytes_per_token(1) == (2 * 14336 + 4 * 4096) * 2  # 90,112 B
    assert MODELS["llama-3-70b"].activation_bytes_per_token(4) == (2 * 28672 / 4 + 4 * 8192) * 2
    # mixture of experts: each token's MLP intermediate once per expert it goes through
    assert MODELS["mixtral-8x7b"].activation_bytes_per_token(1) == (2 * 14336 * 2 + 4 * 4096) * 2


def test_the_vllm_steady_state_leaves_room_and_a_full_gpu_none():
    """At vLLM's default gpu_memory_utilization 0.9 an 80 GB A100 has 8 GiB free: far more than any
    batch-token option needs. At 0.99 used the 0.8 GiB left is under the margin: the caps in force."""
    steady = memory_headroom(A100, obs_row(gpu_mem_used_frac=0.9), 1024)
    assert steady is not None and steady.free_gib == pytest.approx(8.0)
    want = 1024 + int((8.0 - FB_MARGIN_GIB) * GIB // 90_112)
    assert steady.max_batched_tokens == want and want > 80_000
    full = memory_headroom(A100, obs_row(gpu_mem_used_frac=0.99), 1024)
    assert full is not None and full.max_batched_tokens == 1024
    # 1.2 GiB free: 0.2 GiB over the margin holds 2,383 more tokens of Llama-3-8B activation
    tight = memory_headroom(A100, obs_row(gpu_mem_used_frac=0.985), 1024)
    assert tight is not None and tight.max_batched_tokens == 1024 + 2383


@pytest.mark.parametrize("label, reading, pool_spec", [
    ("no reading", None, A100),
    ("NaN", "nan", A100),
    ("stale", Reading(0.99, SignalStatus.STALE, age_s=600.0), A100),
    ("out of range", 1.5, A100),
    ("a model the built-in catalogue does not list (declared in config)", 0.99, replace(A100, model="my-model")),
])
def test_no_trusted_reading_or_no_catalogue_entry_sets_no_ceiling(label, reading, pool_spec):
    assert memory_headroom(pool_spec, obs_row(gpu_mem_used_frac=reading), 1024) is None, label


def _problem(used: float | None, *, batch_review: bool = True) -> tuple[PlanProblem, dict]:
    fl = fleet(A100)
    i = inp(600.0, {"p": dict(ready=4, rps=8.0, gpu_mem_used_frac=used)}, fl=fl, current={"p": 4})
    mem = {"p": MpcPoolMemory(caps=(256, 1024), caps_changed_s=-1e9, burst=0.5)}
    head = memory_headrooms(i, mem)
    lead = np.arange(10) * 30.0 + 15.0
    fc = LoadForecast(lead, np.full(10, 8.0), np.full(10, 9.0), 8.0, 0.0)
    pol = MpcPolicy(max_evaluations=300)
    prob = build_problem(i, fl, mem, {"p": 4}, {"critical": 0.2, "standard": 0.6, "sheddable": 0.2}, fc,
                         resolve_weights("balanced"), BreakerAction(), pol._prior(fl), 600.0, 600.0,
                         min_history_s=300.0, batch_review_s=1200.0 if batch_review else 0.0,
                         protect_streams=True, headroom=head)
    return prob, head


def test_a_full_framebuffer_caps_the_problem_and_says_why():
    prob, head = _problem(0.99)
    p = prob.pools[0]
    assert p.batch_review and p.max_batched_tokens == 1024 == p.max_num_batched_tokens
    (r,) = memory_reasons(prob, head, OPTIONS)
    assert r.code == "memory_headroom" and r.pool == "p"
    assert "framebuffer 99% used" in r.message and "0.8 GiB free" in r.message and "1024→2048" in r.message
    assert r.data["barred"] == [2048, 4096, 8192] and r.data["max_batched_tokens"] == 1024


@pytest.mark.parametrize("label, used, batch_review", [
    ("vLLM steady state", 0.9, True),
    ("no reading", None, True),
    ("caps not up for review", 0.99, False),
])
def test_room_no_reading_or_no_review_gives_no_memory_reason(label, used, batch_review):
    prob, head = _problem(used, batch_review=batch_review)
    assert memory_reasons(prob, head, OPTIONS) == [], label
    if used is None:
        assert prob.pools[0].max_batched_tokens is None and head == {}


def test_framebuffer_in_steady_state_changes_no_decision():
    """The same ticks with FB at vLLM's 0.9 and with no FB reading: the same decisions; the
    diagnostics carry the headroom only when it was read."""
    fl = fleet(A100)

    def run(used: float | None):
        steps = [(15.0 * (k + 1), {"p": dict(ready=4, rps=10.0 + k, prompt=1100.0 * (10 + k), gen=210.0 * (10 + k),
                                             hit_rate=0.3, tpot=0.05, ttft=0.4, kv=0.2, running=40.0,
                                             gpu_mem_used_frac=used)}) for k in range(6)]
        return drive(MpcPolicy(max_evaluations=300), fl, steps, start={"p": 4})

    with_fb, without = run(0.9), run(None)
    assert [(o.pools, o.admission) for o in with_fb] == [(o.pools, o.admission) for o in without]
    assert with_fb[-1].diagnostics["memory"]["p"]["fb_used_frac"] == 0.9
    assert with_fb[-1].diagnostics["memory"]["p"]["fb_free_gib"] == pytest.approx(8.0)
    assert without[-1].diagnostics["memory"] == {}
    # the typed status the daemon renders and exports: a status row and the gauges, only when read
    st = with_fb[-1].status
    assert dict(st.lines)["memory.p"].startswith("FB 90% used, 8.0 of 80 GiB free")
    assert st.pools["p"].gpu_mem_free_bytes == pytest.approx(8.0 * 2**30)
    assert st.pools["p"].batch_tokens_ceiling == with_fb[-1].diagnostics["memory"]["p"]["max_batched_tokens"]
    assert "memory.p" not in dict(without[-1].status.lines) and without[-1].status.pools == {}
    assert st.candidates == with_fb[-1].diagnostics["evaluations"] > 0

