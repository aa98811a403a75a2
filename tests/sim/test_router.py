"""Router: replica scoring (prefix, queue, KV), in-flight cap, admission, pool choice, hold order."""

from __future__ import annotations

import numpy as np
import pytest

from controller.sim.engine_records import HELD, Req
from controller.sim.router import ClassAdmissionState, PoolRoute, Router
from tests.fakes.sim_engine import Driver, make_replica


def _levers(traffic_weight: float) -> dict[str, float]:
    return dict(traffic_weight=traffic_weight, inflight_cap=0, prefix_weight=3, queue_weight=2, kv_weight=2)


def _replicas(n: int, **kw):
    drv = Driver()
    return [make_replica(drv, unit_tokens=64, **kw) for _ in range(n)]


def _load(rep, k: int) -> None:
    for i in range(k):
        rep.add(Req(1000 + i, 1, 1000 + i, 0, 50, 5), 0.0)  # waiting (the driver never runs)


def _cache_units(rep, units) -> None:
    rep.cache.allocate(len(units) * rep.cache.unit_blocks)
    rep.cache.insert_owned(list(units))
    rep.cache.unpin(list(units))


def _route(cands, **w) -> PoolRoute:
    r = PoolRoute("p", dict(traffic_weight=1.0, inflight_cap=w.pop("cap", 0), prefix_weight=w.pop("prefix", 3.0),
                           queue_weight=w.pop("queue", 2.0), kv_weight=w.pop("kv", 2.0)))
    r.candidates = list(cands)
    return r


# label, in-flight per replica, cached units per replica, request units, weights, expected winner
PICK_CASES = [
    ("full hit beats idle replica", [3, 0], [(1, 2, 3, 4), ()], (1, 2, 3, 4), {}, 0),
    ("half hit loses to idle replica", [3, 0], [(1, 2), ()], (1, 2, 3, 4), {}, 1),
    ("no prefix weight: least loaded", [3, 0], [(1, 2, 3, 4), ()], (1, 2, 3, 4), {"prefix": 0.0}, 1),
    ("no hashes: least loaded", [2, 5, 1], [(), (), ()], (), {}, 2),
    ("prefix only", [9, 0, 0], [(1, 2, 3, 4), (), ()], (1, 2, 3, 4), {"queue": 0.0, "kv": 0.0}, 0),
    ("longer match wins", [0, 0], [(1,), (1, 2, 3)], (1, 2, 3, 4), {}, 1),
]


@pytest.mark.parametrize("label,inflight,cached,units,weights,want", PICK_CASES, ids=[c[0] for c in PICK_CASES])
def test_pick_scores(label, inflight, cached, units, weights, want):
    reps = _replicas(len(inflight))
    for rep, k, u in zip(reps, inflight, cached, strict=True):
        _load(rep, k)
        if u:
            _cache_units(rep, u)
    route = _route(reps, **weights)
    req = Req(0, 1, 0, 0, 4 * 64 + 10, 5, units)
    assert route.pick(req) is reps[want]


def test_kv_usage_breaks_equal_queues():
    a, b = _replicas(2, kv_blocks=100)
    a.cache.allocate(60)  # 60% used
    b.cache.allocate(10)
    route = _route([a, b], prefix=0.0)
    assert route.pick(Req(0, 1, 0, 0, 50, 5)) is b


def test_queue_is_min_max_normalised():
    # in-flight 2, 5, 8 → penalties 0, 0.5, 1 (× queue weight); a prefix worth 1.2 offsets 0.5 but not 1
    reps = _replicas(3)
    for rep, k in zip(reps, (2, 5, 8), strict=True):
        _load(rep, k)
    units = tuple(range(10))
    _cache_units(reps[1], units[:4])  # 4 of 10 units → 0.4 × 3 = 1.2
    route = _route(reps, kv=0.0)
    req = Req(0, 1, 0, 0, 640, 5, units)
    assert route.pick(req) is reps[1]  # 1.2 − 1.0 > 0 − 0
    _cache_units(reps[2], units[:4])
    _load(reps[1], 6)  # now in-flight 2, 11, 8 → 0, 1, 6/9
    assert route.pick(req) is reps[0]


def test_inflight_cap_and_ties_rotate():
    reps = _replicas(3)
    route = _route(reps, cap=2, prefix=0.0, kv=0.0)
    picked = []
    for i in range(6):
        rep = route.pick(Req(i, 1, i, 0, 50, 5))
        assert rep is not None
        rep.add(Req(i, 1, i, 0, 50, 5), 0.0)
        picked.append(reps.index(rep))
    assert sorted(picked) == [0, 0, 1, 1, 2, 2]  # spread evenly, each up to the cap
    assert route.pick(Req(99, 1, 99, 0, 50, 5)) is None  # all at the cap: the router must hold


def test_token_bucket_one_second_burst():
    a = ClassAdmissionState(rate_limit_rps=2.0)
    a.reset_bucket(0.0)
    assert [a.take_token(0.0) for _ in range(3)] == [True, True, False]
    assert a.take_token(0.5)  # one token refilled
    assert not a.take_token(0.5)
    slow = ClassAdmissionState(rate_limit_rps=0.2)  # below 1 rps the bucket still holds one request
    slow.reset_bucket(0.0)
    assert slow.take_token(0.0) and not slow.take_token(4.9) and slow.take_token(5.0)


def test_shed_frac_is_seeded_and_per_class():
    def draws(seed: int) -> list[int]:
        router = Router(np.random.default_rng(seed))
        router.classes[2].shed_frac = 0.3  # sheddable only
        return [router.admit(k % 3, 0.0) for k in range(30_000)]

    a = draws(5)
    assert a == draws(5)
    assert a != draws(6)
    shed = np.array(a).reshape(-1, 3)
    assert (shed[:, 0] == 0).all() and (shed[:, 1] == 0).all()  # critical and standard never shed
    assert abs((shed[:, 2] == 429).mean() - 0.3) < 0.02


def test_pool_choice_follows_traffic_weight():
    router = Router(np.random.default_rng(1))
    a = PoolRoute("a", _levers(3.0))
    b = PoolRoute("b", _levers(1.0))
    picks = [router.choose([a, b]) for _ in range(20_000)]
    assert abs(sum(p is a for p in picks) / len(picks) - 0.75) < 0.015
    b.traffic_weight = 0.0
    assert all(router.choose([a, b]) is a for _ in range(100))
    a.traffic_weight = 0.0  # all zero: equal split
    picks = [router.choose([a, b]) for _ in range(4000)]
    assert 0.45 < sum(p is a for p in picks) / len(picks) < 0.55


def test_pool_choice_skips_pools_without_a_ready_replica():
    """As governor picker skips a pool with no healthy endpoint: its share goes to the others at once."""
    router = Router(np.random.default_rng(2))
    a = PoolRoute("a", _levers(0.9))  # every replica crashed: no candidate
    b, c = _route(_replicas(1)), _route(_replicas(2))
    b.traffic_weight, c.traffic_weight = 0.1, 0.0
    assert all(router.choose([a, b, c]) is b for _ in range(200))  # weight 0 keeps no share while b has one
    b.traffic_weight = 0.0  # the ready pools' weights are all 0: equal split between them
    picks = [router.choose([a, b, c]) for _ in range(4000)]
    assert not any(p is a for p in picks)
    assert 0.45 < sum(p is b for p in picks) / len(picks) < 0.55
    b.candidates, c.candidates = [], []  # none ready anywhere: drawn by weight, held where drawn
    a.traffic_weight, b.traffic_weight = 3.0, 1.0
    picks = [router.choose([a, b, c]) for _ in range(20_000)]
    assert abs(sum(p is a for p in picks) / len(picks) - 0.75) < 0.015


def test_held_requests_leave_by_priority_then_fcfs_and_skip_stale():
    route = PoolRoute("p", _levers(1.0))
    reqs = [Req(i, prio, i, 0, 10, 1) for i, prio in enumerate([2, 1, 0, 1, 0, 2])]
    for r in reqs:
        route.hold(r)
        assert r.state == HELD
    route.unhold(reqs[3])  # timed out while held
    reqs[3].state = 0
    order = []
    while (held := route.pop_held()) is not None:
        order.append(held.idx)
    assert order == [2, 4, 1, 0, 5]
    assert route.n_held == 0
