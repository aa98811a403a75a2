"""The engine: vLLM V1 scheduling rules, checked against a naive step-by-step reference.

The real engine jumps over pure-decode stretches and keeps decoding requests
implicitly; the reference (tests/fakes/sim_engine.py) runs one explicit loop
iteration per step. With a step time linear in its inputs the two must give the
same first-token and finish times for every request (up to float rounding), in
every regime: plain, batch-capped, chunked, KV-starved (preemption), prefix
cached and mixed priorities.
"""

from __future__ import annotations

import numpy as np
import pytest

from controller.sim.engine_records import Req
from tests.fakes.sim_engine import Driver, LinearStepModel, NaiveEngine, make_replica

CASES = [
    # label, n, engine kwargs, prompt range, output range, rate (req/s), prefix groups (0 = none), priorities
    ("plain", 40, dict(kv_blocks=4096, max_num_seqs=256, max_batched_tokens=2048), (50, 600), (5, 120), 8.0, 0, False),
    ("seq_cap", 40, dict(kv_blocks=4096, max_num_seqs=3, max_batched_tokens=2048), (50, 300), (5, 80), 10.0, 0, False),
    ("chunked", 30, dict(kv_blocks=4096, max_num_seqs=16, max_batched_tokens=64), (100, 500), (3, 40), 4.0, 0, False),
    ("kv_starved", 30, dict(kv_blocks=60, max_num_seqs=64, max_batched_tokens=512), (60, 250), (40, 200), 20.0, 0,
     False),
    ("prefix", 40, dict(kv_blocks=400, max_num_seqs=64, max_batched_tokens=1024), (130, 700), (5, 60), 6.0, 3, False),
    ("priorities", 40, dict(kv_blocks=120, max_num_seqs=8, max_batched_tokens=512), (60, 300), (10, 90), 25.0, 2,
     True),
]


def _workload(n: int, prompt: tuple[int, int], output: tuple[int, int], rate: float, groups: int, prios: bool,
              unit: int, seed: int) -> list[tuple[float, int, int, int, int, tuple[int, ...]]]:
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1.0 / rate, n))
    out = []
    for i in range(n):
        p = int(rng.integers(*prompt))
        units: tuple[int, ...] = ()
        if groups:
            g = int(rng.integers(groups))
            shared = min(p // unit, 2)
            # group prefix ids 1000*g + k, then ids unique to the request
            units = tuple(1000 * g + k for k in range(shared)) + tuple(10**6 + 100 * i + k
                                                                         for k in range(p // unit - shared))
        prio = int(rng.integers(3)) if prios else 1
        out.append((float(t[i]), i, prio, p, int(rng.integers(*output)), units))
    return out


@pytest.mark.parametrize("label,n,kw,prompt,output,rate,groups,prios", CASES, ids=[c[0] for c in CASES])
def test_matches_step_by_step_reference(label, n, kw, prompt, output, rate, groups, prios):
    unit = 64
    reqs = _workload(n, prompt, output, rate, groups, prios, unit, seed=7)
    model = LinearStepModel()
    naive = NaiveEngine(model, block_size=16, unit_tokens=unit, **kw)
    want_first, want_done = naive.run(reqs)

    drv = Driver()
    rep = make_replica(drv, unit_tokens=unit, model=model, **kw)

    def check(r):
        assert len(r.running) <= kw["max_num_seqs"]
        r.cache.check()

    drv.on_step = check
    drv.run(rep, [(t, Req(i, pr, i, 0, p, o, u)) for t, i, pr, p, o, u in reqs])

    assert sorted(drv.finished) == sorted(want_done) == list(range(n))
    for i in range(n):
        assert drv.first_token[i] == pytest.approx(want_first[i], rel=1e-6, abs=1e-6), (label, i)
        assert drv.finished[i] == pytest.approx(want_done[i], rel=1e-6, abs=1e-6), (label, i)
    assert rep.stats.num_preemptions == naive.preemptions
    if label == "kv_starved":
        assert naive.preemptions > 0  # the case must exercise preemption
    # everything released: only unreferenced cached units remain
    c = rep.cache
    assert c.pinned_blocks == 0 and rep.dec_blocks == 0 and rep.n_dec == 0
    assert c.free_blocks + c.cached_blocks == c.total_blocks
    assert rep.stats.generation_tokens == sum(r[4] for r in reqs)
    assert rep.stats.request_success["stop"] == n


@pytest.mark.parametrize("max_num_seqs,max_batched_tokens", [(2, 32), (5, 100), (64, 128)])
def test_caps_never_exceeded(max_num_seqs, max_batched_tokens):
    reqs = _workload(60, (20, 400), (2, 60), 50.0, 0, True, 64, seed=3)
    drv = Driver()
    rep = make_replica(drv, kv_blocks=2048, max_num_seqs=max_num_seqs, max_batched_tokens=max_batched_tokens)
    seen = []

    def check(r):
        seen.append(len(r.running))
        assert len(r.running) <= max_num_seqs

    drv.on_step = check
    drv.run(rep, [(t, Req(i, pr, i, 0, p, o, u)) for t, i, pr, p, o, u in reqs])
    assert len(drv.finished) == 60
    assert rep.max_running_seen <= max_num_seqs and max(seen) <= max_num_seqs
    assert rep.max_tokens_seen <= max_batched_tokens
    # under this load one of the two caps binds (else the test would prove nothing)
    assert rep.max_running_seen == max_num_seqs or rep.max_tokens_seen == max_batched_tokens


def test_preemption_when_kv_exhausted_and_requests_complete():
    # 40 blocks × 16 = 640 tokens of KV; four requests of 100 + 300 tokens cannot all stay resident
    drv = Driver()
    rep = make_replica(drv, kv_blocks=40, max_num_seqs=8, max_batched_tokens=512, caching=False)
    reqs = [Req(i, 1, i, 0, 100, 300) for i in range(4)]
    drv.run(rep, [(0.001 * i, r) for i, r in enumerate(reqs)])
    assert rep.stats.num_preemptions > 0
    assert sorted(drv.finished) == [0, 1, 2, 3]
    assert rep.stats.generation_tokens == 4 * 300
    # the latest arrival is preempted first, so the first request is never delayed by the others' KV
    assert drv.finished[0] == min(drv.finished.values())
    assert rep.cache.free_blocks == 40


def test_lower_priority_preempted_first():
    drv = Driver()
    rep = make_replica(drv, kv_blocks=30, max_num_seqs=8, max_batched_tokens=512, caching=False)
    # request 0 is sheddable and arrives first; 1 is critical and arrives later
    reqs = [(0.0, Req(0, 2, 0, 0, 100, 250)), (0.01, Req(1, 0, 1, 0, 100, 250))]
    drv.run(rep, reqs)
    assert rep.stats.num_preemptions > 0
    assert drv.finished[1] < drv.finished[0]


def test_prefix_hit_skips_prefill():
    drv = Driver()
    rep = make_replica(drv, kv_blocks=1024, unit_tokens=64, max_batched_tokens=4096)
    units = tuple(range(30))  # 30 × 64 = 1,920 shared tokens
    a = Req(0, 1, 0, 0, 1950, 4, units)
    b = Req(1, 1, 1, 0, 1950, 4, units)
    drv.run(rep, [(0.0, a), (10.0, b)])
    ttft_a = drv.first_token[0] - 0.0
    ttft_b = drv.first_token[1] - 10.0
    assert ttft_b < 0.5 * ttft_a
    assert rep.stats.prefix_cache_queries == 2 * 1950
    assert rep.stats.prefix_cache_hits == 1920


def test_no_cache_no_hit():
    drv = Driver()
    rep = make_replica(drv, kv_blocks=1024, unit_tokens=64, caching=False)
    units = tuple(range(30))
    drv.run(rep, [(0.0, Req(0, 1, 0, 0, 1950, 4, units)), (10.0, Req(1, 1, 1, 0, 1950, 4, units))])
    assert rep.stats.prefix_cache_hits == 0
    assert drv.first_token[1] - 10.0 == pytest.approx(drv.first_token[0], rel=1e-9)


def test_request_larger_than_kv_is_rejected():
    drv = Driver()
    rep = make_replica(drv, kv_blocks=10, caching=False)  # 160 tokens
    drv.run(rep, [(0.0, Req(0, 1, 0, 0, 400, 10)), (0.0, Req(1, 1, 1, 0, 50, 10))])
    assert drv.rejected == [0]
    assert list(drv.finished) == [1]
    assert rep.stats.request_success["error"] == 1


def test_jump_truncated_by_arrival_matches_steps():
    # one long decode; a second request arrives in the middle of the jump and is admitted at the
    # next step boundary, exactly as in the step-by-step reference
    model = LinearStepModel()
    reqs = [(0.0, 0, 1, 100, 500, ()), (1.2345, 1, 1, 200, 20, ())]
    naive = NaiveEngine(model, kv_blocks=4096, block_size=16, unit_tokens=64, max_num_seqs=8, max_batched_tokens=512)
    first, done = naive.run(reqs)
    drv = Driver()
    rep = make_replica(drv, model=model, max_num_seqs=8, max_batched_tokens=512)
    drv.run(rep, [(t, Req(i, p, i, 0, pr, o, u)) for t, i, p, pr, o, u in reqs])
    for i in (0, 1):
        assert drv.first_token[i] == pytest.approx(first[i], abs=1e-9)
        assert drv.finished[i] == pytest.approx(done[i], abs=1e-6)
    # ITL observations: 499 + 19 gaps, all recorded
    assert rep.stats.itl_s.count == 499 + 19


def test_settle_brings_counters_to_now():
    drv = Driver()
    rep = make_replica(drv)
    drv.run(rep, [(0.0, Req(0, 1, 0, 0, 100, 1000))], until_s=1.0)
    before = rep.stats.generation_tokens
    rep.settle(1.0)
    after = rep.stats.generation_tokens
    assert after > before  # the jump's completed steps are applied
    assert rep.stats.busy_s == pytest.approx(1.0, abs=0.05)
    drv.run(rep, [])
    assert rep.stats.generation_tokens == 1000


def test_abort_frees_kv_and_counts():
    drv = Driver()
    rep = make_replica(drv, kv_blocks=200, caching=False)
    r0 = Req(0, 1, 0, 0, 300, 2000)
    drv.run(rep, [(0.0, r0)], until_s=2.0)
    assert rep.cache.free_blocks < 200
    rep.abort(r0, 2.0)
    drv.run(rep, [])
    assert rep.cache.free_blocks == 200
    assert rep.stats.request_success["abort"] == 1
    assert 0 not in drv.finished


def test_cache_evicts_least_recently_used_prompt_tail_first():
    # 100 blocks; each prompt is 10 units of 64 tokens = 40 blocks (+1 for its output)
    drv = Driver()
    rep = make_replica(drv, kv_blocks=100, unit_tokens=64, max_batched_tokens=2048)
    prompt = {name: tuple(100 * k + u for u in range(10)) for k, name in enumerate("ABC")}
    hits: list[float] = []
    t = 0.0
    for name in ("A", "B", "C", "C", "A"):
        before = rep.stats.prefix_cache_hits
        drv.run(rep, [(t, Req(len(hits), 1, len(hits), 0, 640, 2, prompt[name]))], until_s=t + 4.0)
        hits.append(rep.stats.prefix_cache_hits - before)
        t += 5.0
    # C evicted A's units (A was released first), last unit first, keeping A's first 4 units
    assert hits == [0, 0, 0, 639, 4 * 64]
    rep.cache.check()
