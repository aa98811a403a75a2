"""The MPC planner on hand-built situations: table rows of (situation → what the plan must do).

Every row builds a PlanProblem by hand (pools of Llama-3-70B TP4 on H100, three classes with
the default SLOs), runs `solve` with the prior-only model and checks the first step the
policy would apply. Also: the model's pieces (fluid queue, burst term, forecaster), the
budget and determinism of the solver.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pytest
from scipy.special import ndtr

from controller.core.mpc import (
    ClassInput,
    MpcConfig,
    PlanProblem,
    PoolInput,
    applied_router_weights,
    delay_ladder,
    ladder_level,
    plan_steps,
    solve,
)
from controller.core.mpc.tails import lognormal_exceed
from controller.core.mpc_model import (
    LatencyQuery,
    QueueingPrior,
)
from controller.core.objective import PROFILES, ObjectiveWeights, resolve_weights
from controller.perf.engine_figures import EngineFigures
from controller.perf.figures import PROFILED_FIGURES, figures_for
from controller.types import PoolSpec

SPEC = PoolSpec("p", "llama-3-70b", "h100-80gb", gpus_per_replica=4, usd_per_replica_hour=49.16, min_replicas=1,
                max_replicas=16, startup_warm_s=60, startup_cold_s=300)
SLO = {"critical": (2.5, 0.1), "standard": (5.0, 0.15), "sheddable": (10.0, 0.3)}
SHARE = {"critical": 0.2, "standard": 0.6, "sheddable": 0.2}
CFG = MpcConfig(max_evaluations=1500)


def pool(name: str = "a", j: int = 0, **kw) -> PoolInput:
    base: dict[str, Any] = dict(name=name, model_index=j, group="g", role="mixed", usd_per_hour=49.16, lo=1, hi=16,
                                target=4, ready=4, startup_warm_s=60.0, startup_cold_s=300.0, prompt_tokens=1100.0,
                                output_tokens=210.0, hit_rate=0.3, reuse_inf_hit=0.3, reuse_working_set=20_000.0)
    base.update(kw)
    return PoolInput(**base)


def classes(total: np.ndarray, spread: float = 0.1) -> tuple[ClassInput, ...]:
    return tuple(ClassInput(c, *SLO[c], tuple(total * SHARE[c]), tuple(total * SHARE[c] * (1 + spread)))
                 for c in SLO)


def plan(pools: list[PoolInput], total, profile: str = "balanced", seed: int = 0, cfg: MpcConfig = CFG):
    H = plan_steps(cfg, pools)
    tot = np.full(H, float(total)) if np.ndim(total) == 0 else np.asarray(total, dtype=float)[:H]
    prob = PlanProblem(pools=tuple(pools), classes=classes(tot), weights=resolve_weights(profile))
    model = QueueingPrior.for_pools([SPEC] * len(pools))
    return solve(prob, model, cfg, np.random.default_rng(seed))


H20 = plan_steps(CFG, [pool()])
SURGE = np.array([12.0] * 5 + [28.0] * (H20 - 5))  # 12 req/s now, 28 req/s from +150 s


# --------------------------------------------------------------------------- table: replicas


@pytest.mark.parametrize("label, total, want_up", [
    ("traffic at a pool scaled to zero", 3.0, True),
    ("no traffic: stays at zero", 0.0, False),
])
def test_a_pool_at_zero_comes_back_when_traffic_is_forecast(label, total, want_up):
    """Lost requests are priced in cost per success; a plan that buys nothing must not price them at
    nothing (it won every tick and the pool never came back). With long cold starts the policy's
    activation rule is what brings a pool back (tests/policies, tests/bench/test_scale_to_zero.py)."""
    r = plan([pool(lo=0, target=0, ready=0, startup_warm_s=30.0, startup_cold_s=60.0)], total)
    assert (r.plan.pools["a"].replicas[0] >= 1) == want_up, (label, r.plan.pools["a"].replicas)



@dataclass
class Row:
    label: str
    pools: list
    total: object
    check: Callable[[Any], bool]  # the plan's result -> pass
    profile: str = "balanced"
    note: str = ""


ROWS = [
    Row("surge beyond the cold start: scale up now",
        [pool(warm_slots=0)], SURGE, lambda r: r.plan.pools["a"].replicas[0] >= 6,
        note="the surge is 150 s away, a cold start takes 300 s"),
    Row("same surge with warm slots: wait, then scale",
        [pool(warm_slots=6)], SURGE,
        lambda r: r.plan.pools["a"].replicas[0] == 4 and max(r.plan.pools["a"].replicas) >= 6),
    Row("flat load the fleet already serves: no scale-up",
        [pool()], 12.0, lambda r: r.plan.pools["a"].replicas[0] <= 4),
    Row("surplus: the plan wants fewer replicas",
        [pool(target=8, ready=8)], 10.0, lambda r: r.plan.pools["a"].replicas[0] < 8),
    Row("pool maximum binds",
        [pool(hi=5)], 40.0, lambda r: max(r.plan.pools["a"].replicas) <= 5),
    Row("latency profile keeps more headroom than cost",
        [pool(target=8, ready=8)], 22.0,
        lambda r: (r.plan.pools["a"].replicas[0]
                   >= plan([pool(target=8, ready=8)], 22.0, "cost").plan.pools["a"].replicas[0]),
        profile="latency"),
]


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.label)
def test_planner_replica_table(row: Row):
    r = plan(row.pools, row.total, row.profile)
    assert row.check(r), (row.label, {p: pp.replicas[:6] for p, pp in r.plan.pools.items()}, r.plan.shed)
    assert r.plan.shed["critical"] == 0.0


# --------------------------------------------------------------------------- capacity short: the quadrant order


@pytest.mark.parametrize("total", [30.0, 45.0])
def test_capacity_short_delays_in_lever_order(total):
    """Two pools at their maximum, demand beyond: sheddable is shed before standard, critical never."""
    r = plan([pool("a", 0, lo=4, hi=4), pool("b", 1, lo=2, hi=2, target=2, ready=2)], total)
    s = r.plan.shed
    assert s["critical"] == 0.0
    assert s["sheddable"] >= s["standard"]
    assert s["sheddable"] > 0.0, (total, s)


def test_capacity_far_short_still_sheds_sheddable() -> None:
    """Far past capacity (60-120 req/s where 30 already needs shedding) sheddable is shed: a request that
    would only time out in a backlog is lost as well as late (score.py prices it as both), and the split
    is searched with the delay level (search.py `_split_follows_delay`), so keeping the sheddable class
    on one pool while the other drowns no longer looks cheaper than shedding it. Issue 32 part 5."""
    for total in (60.0, 120.0):
        r = plan([pool("a", 0, lo=4, hi=4), pool("b", 1, lo=2, hi=2, target=2, ready=2)], total)
        assert r.plan.shed["sheddable"] > 0.0, (total, r.plan.shed)



@pytest.mark.parametrize("ready, quantile", [(1, 5.0), (1, 40.0), (2, 60.0)])
def test_a_median_of_zero_sheds_nothing(ready, quantile):
    """The median forecast expects no request, the quantile planned for does (up to far past the fleet).
    Shedding acts at once and is planned again every tick, so there is nothing to shed: it used to look
    free (no request in the expected terms, and a quantile past the fleet is late either way), and plans
    shed 75 % of critical and every standard request against a median of 0. Issue 32."""
    p = [pool(ready=ready, target=ready)]
    H = plan_steps(CFG, p)
    cls = tuple(ClassInput(c, *SLO[c], tuple([0.0] * H), tuple([quantile * SHARE[c]] * H)) for c in SLO)
    prob = PlanProblem(pools=tuple(p), classes=cls, weights=resolve_weights("balanced"))
    r = solve(prob, QueueingPrior.for_pools([SPEC]), CFG, np.random.default_rng(0))
    assert r.plan.shed == {"critical": 0.0, "standard": 0.0, "sheddable": 0.0}, (ready, quantile)


def test_a_backlog_the_fleet_carries_sheds_nothing():
    """Requests waiting now (12, then 40) and arrivals the fleet carries (8 req/s, 4 replicas ready): the
    backlog drains within a step, so nothing is shed and critical is on time (decision 0034's case 8 shed
    critical here; its cause was the token mix read from a warming window, tests/core/test_estimate.py)."""
    for backlog in (12.0, 40.0):
        r = plan([pool(backlog=backlog)], 8.0)
        assert r.plan.shed == {"critical": 0.0, "standard": 0.0, "sheddable": 0.0}, (backlog, r.plan.shed)
        assert r.terms["late_frac_p50"]["critical"] < 0.005, (backlog, r.terms["late_frac_p50"])

def test_capacity_short_moves_before_it_delays():
    """One pool pinned small, a sibling free: traffic moves to the sibling (and it grows); little is shed."""
    free = plan([pool("a", 0, lo=2, hi=2, target=2, ready=2), pool("b", 1, target=4, ready=4, warm_slots=8)], 30.0)
    a, b = free.plan.pools["a"], free.plan.pools["b"]
    assert b.traffic_weight > a.traffic_weight  # move: the sibling takes the larger share
    assert b.replicas[0] > 4 or max(b.replicas) > 4
    assert free.plan.shed["standard"] == 0.0 and free.plan.shed["critical"] == 0.0


@pytest.mark.parametrize("total,target", [(14.0, 6), (22.0, 6), (30.0, 9)])
def test_batch_cap_change_resweeps_the_replicas(total, target):
    """Bursty arrivals make max_num_batched_tokens worth a rolling restart; the replicas of that plan are
    the ones the new caps need (the same as a plan made with the new caps in force), not the ones bought
    under the old caps."""
    def solve_burst(p: PoolInput):
        H = plan_steps(CFG, [p])
        prob = PlanProblem(pools=(p,), classes=classes(np.full(H, total)), weights=resolve_weights("balanced"))
        model = QueueingPrior.for_pools([SPEC]).with_corrections([1.0], [1.0], 0.5, burst=[6.0])
        return solve(prob, model, CFG, np.random.default_rng(0))

    r = solve_burst(pool(batch_review=True, target=target, ready=target)).plan.pools["a"]
    assert r.max_num_batched_tokens < 8192  # the lever was pulled
    fixed = solve_burst(pool(target=target, ready=target, max_num_batched_tokens=r.max_num_batched_tokens))
    assert r.replicas[0] == fixed.plan.pools["a"].replicas[0], (r.replicas[:3], fixed.plan.pools["a"].replicas[:3])


def test_delay_ladder_order_and_inverse():
    cls = classes(np.ones(3))
    assert delay_ladder(np.array(0.5), cls).tolist() == [0.0, 0.0, 0.5]
    assert delay_ladder(np.array(1.3), cls).round(6).tolist() == [0.0, 0.3, 1.0]
    assert delay_ladder(np.array(3.0), cls).tolist() == [1.0, 1.0, 1.0]
    assert ladder_level(np.array([0.0, 0.3, 1.0])) == pytest.approx(1.3)


def test_override_pin_is_planned_around():
    """A pin on pool a (lo = hi = 2): pool b takes more replicas than when a is free."""
    pinned = plan([pool("a", 0, lo=2, hi=2), pool("b", 1)], 30.0)
    free = plan([pool("a", 0), pool("b", 1)], 30.0)
    assert pinned.plan.pools["a"].replicas[0] == 2
    assert max(pinned.plan.pools["b"].replicas) > max(free.plan.pools["b"].replicas)


def test_frozen_pool_keeps_everything():
    r = plan([pool("a", 0, frozen=True, lo=4, hi=4, prefix_weight=5.0, inflight_cap=40), pool("b", 1)], 30.0)
    a = r.plan.pools["a"]
    assert set(a.replicas) == {4} and a.prefix_weight == 5.0 and a.inflight_cap == 40


# --------------------------------------------------------------------------- solver properties


def test_deterministic_for_a_seed_and_budgeted():
    pools = [pool("a", 0), pool("b", 1, target=2, ready=2)]
    r1, r2 = plan(pools, 30.0, seed=7), plan(pools, 30.0, seed=7)
    assert r1.plan == r2.plan and r1.objective == r2.objective
    small = plan(pools, 30.0, cfg=MpcConfig(max_evaluations=60))
    assert small.evaluations <= 60 + 40  # the budget stops new batches (plus the fixed anchor/settle rows)
    assert small.budget_exhausted
    assert set(small.plan.pools) == {"a", "b"}  # never returns nothing


def test_injected_timer_bounds_the_search():
    """A fake monotonic clock that advances 50 ms per read: the search stops after the budget."""
    t = {"now": 0.0}

    def timer() -> float:
        t["now"] += 0.05
        return t["now"]

    pools = [pool("a", 0)]
    H = plan_steps(CFG, pools)
    prob = PlanProblem(pools=tuple(pools), classes=classes(np.full(H, 20.0)), weights=resolve_weights("balanced"))
    r = solve(prob, QueueingPrior.for_pools([SPEC]), MpcConfig(time_budget_s=0.2), np.random.default_rng(0),
              timer=timer)
    assert r.budget_exhausted and r.plan.pools["a"].replicas


class _CostClock:
    """A fake monotonic clock on which scoring n candidates takes `a + b·n` seconds (nothing else
    takes time): the planner's wall budget against a known cost per batch."""

    def __init__(self, a: float, b: float) -> None:
        self.now, self.a, self.b = 0.0, a, b

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("label, a, b, budget", [
    ("cheap rows, a tight budget", 0.002, 0.0004, 0.2),
    ("dear batches", 0.01, 0.002, 0.2),
    ("a budget of half a second", 0.002, 0.0004, 0.5),
])
def test_wall_budget_is_kept_whole_tick(monkeypatch, label, a, b, budget):
    """With a timer the search cuts batches to what fits, leaves room for settling the levers and
    stops `time_reserve_s` early: everything `solve` scores ends within the budget counted from
    `started_s`, and most of the budget is used."""
    from controller.core.mpc.score import Evaluator

    clock = _CostClock(a, b)
    real = Evaluator.score

    def score(self, cand, detail=False):
        clock.now += clock.a + clock.b * cand.n
        return real(self, cand, detail)

    monkeypatch.setattr(Evaluator, "score", score)
    pools = [pool(f"p{j}", j, group=f"g{j % 2}") for j in range(6)]
    H = plan_steps(CFG, pools)
    prob = PlanProblem(pools=tuple(pools), classes=classes(np.full(H, 60.0)), weights=resolve_weights("balanced"))
    cfg = MpcConfig(time_budget_s=budget, time_reserve_s=0.015)
    clock.now = 0.01  # the tick began 10 ms before the solver started
    r = solve(prob, QueueingPrior.for_pools([SPEC] * 6), cfg, np.random.default_rng(0), timer=clock, started_s=0.0)
    assert clock.now <= budget  # the detailed score of the chosen plan included
    assert clock.now >= 0.6 * budget or not r.budget_exhausted  # a cut search used most of it
    assert set(r.plan.pools) == {p.name for p in pools}


def test_wall_budget_that_is_not_needed_leaves_the_search_whole():
    """A generous wall budget: the same plan as the search by count when neither binds."""
    pools = [pool("a", 0)]
    H = plan_steps(CFG, pools)
    prob = PlanProblem(pools=tuple(pools), classes=classes(np.full(H, 20.0)), weights=resolve_weights("balanced"))
    model = QueueingPrior.for_pools([SPEC])
    by_count = solve(prob, model, MpcConfig(max_evaluations=10**6), np.random.default_rng(0))
    t = {"now": 0.0}
    by_time = solve(prob, model, MpcConfig(time_budget_s=1e6), np.random.default_rng(0), timer=lambda: t["now"])
    assert not by_count.budget_exhausted and not by_time.budget_exhausted
    assert by_time.plan == by_count.plan and by_time.objective == by_count.objective


def test_time_reserve_must_be_below_the_budget():
    with pytest.raises(ValueError, match="time_reserve_s"):
        MpcConfig(time_budget_s=0.1, time_reserve_s=0.1)


def test_warm_start_plan_is_a_candidate():
    pools = [pool("a", 0)]
    first = plan(pools, 20.0)
    H = plan_steps(CFG, pools)
    prob = PlanProblem(pools=tuple(pools), classes=classes(np.full(H, 20.0)), weights=resolve_weights("balanced"))
    again = solve(prob, QueueingPrior.for_pools([SPEC]), MpcConfig(max_evaluations=50), np.random.default_rng(1),
                  warm=first.plan, warm_shift=1)
    assert again.objective <= first.objective * 1.05


def test_plan_steps_cover_the_cold_start():
    assert plan_steps(MpcConfig(horizon_steps=10, step_s=30.0), [pool(startup_cold_s=300.0)]) == 20
    assert plan_steps(MpcConfig(horizon_steps=10, step_s=30.0), [pool(startup_cold_s=90.0)]) == 13


@pytest.mark.parametrize("bad", [dict(horizon_steps=1), dict(step_s=0.0), dict(max_evaluations=10),
                                 dict(ce_elite_frac=1.5), dict(prefix_weight_range=(3.0, 1.0))])
def test_config_rejects_bad_values(bad):
    with pytest.raises(ValueError):
        MpcConfig(**bad)


def test_problem_rejects_bad_bounds():
    with pytest.raises(ValueError, match="bounds"):
        PlanProblem(pools=(pool(lo=5, hi=2),), classes=classes(np.ones(20)), weights=ObjectiveWeights())


# --------------------------------------------------------------------------- the model


def _q(**kw) -> LatencyQuery:
    base = dict(pool_index=0, rps_per_replica=3.0, prompt_tokens=1100.0, output_tokens=210.0, hit_rate=0.3,
                inflight_cap=0.0, max_num_seqs=256.0, max_num_batched_tokens=8192.0)
    base.update(kw)
    n = max(np.size(v) for v in base.values())
    q = {k: np.broadcast_to(np.asarray(v, dtype=float), (n,)).copy() for k, v in base.items()}
    q["pool_index"] = q["pool_index"].astype(int)
    return LatencyQuery(**q)


def test_latency_rises_with_load_and_saturates():
    m = QueueingPrior.for_pools([SPEC])
    a = m.latency(_q(rps_per_replica=np.array([1.0, 3.0, 5.0, 7.0])))
    assert np.all(np.diff(a.tpot_p95_s) > 0) and np.all(np.diff(a.utilisation) > 0)
    assert a.utilisation[-1] > 1.0 > a.utilisation[0]
    # worked example of the module docstring: ~55 ms mean step at 3.3 req/s, 35 % hits, 1,155 prompt tokens
    b = m.latency(_q(rps_per_replica=3.3, prompt_tokens=1155.0, hit_rate=0.35, output_tokens=211.0))
    assert 0.045 < b.tpot_p50_s[0] < 0.07


def test_inflight_cap_trades_tpot_for_capacity():
    m = QueueingPrior.for_pools([SPEC])
    a = m.latency(_q(rps_per_replica=5.0, inflight_cap=np.array([0.0, 60.0])))
    assert a.tpot_p95_s[1] < a.tpot_p95_s[0]
    assert a.capacity_rps[1] < a.capacity_rps[0]


def test_burst_term_makes_the_batch_budget_a_lever():
    """Bursty arrivals: a smaller max_num_batched_tokens bounds the chunked step, so p95 TPOT falls."""
    m = QueueingPrior.for_pools([SPEC]).with_corrections([1.0], [1.0], 0.5, burst=[2.0])
    a = m.latency(_q(rps_per_replica=3.0, max_num_batched_tokens=np.array([8192.0, 1024.0])))
    assert a.tpot_p95_s[1] < a.tpot_p95_s[0]
    smooth = QueueingPrior.for_pools([SPEC]).latency(
        _q(rps_per_replica=3.0, max_num_batched_tokens=np.array([8192.0, 1024.0])))
    assert smooth.tpot_p95_s[1] == pytest.approx(smooth.tpot_p95_s[0], rel=0.02)
    burst = QueueingPrior.for_pools([SPEC]).burst_for(_q(rps_per_replica=3.0), float(a.tpot_p95_s[0]))
    assert burst == pytest.approx(2.0, rel=0.05)


SPEC_8B = PoolSpec("p", "llama-3-8b", "a100-80gb", gpus_per_replica=1, usd_per_replica_hour=4.1, min_replicas=1,
                   max_replicas=16, startup_warm_s=20, startup_cold_s=90)


def test_tpot_bound_is_one_full_prefill_chunk_per_step():
    """No step carries more prefill than the batch-token budget, so a request's TPOT (the mean of its
    steps) is bounded by a full-chunk step; under bursts the p95 sits at that bound."""
    q = _q(rps_per_replica=3.0, prompt_tokens=2048.0, output_tokens=28.0,
           max_num_batched_tokens=np.array([1024.0, 4096.0]))
    smooth = QueueingPrior.for_pools([SPEC_8B]).latency(q)
    bursty = QueueingPrior.for_pools([SPEC_8B]).with_corrections([1.0], [1.0], 0.0, burst=[4.0]).latency(q)
    assert smooth.tpot_max_s is not None and bursty.tpot_max_s is not None
    for a in (smooth, bursty):
        assert a.tpot_max_s is not None
        assert np.all(a.tpot_max_s >= a.tpot_p95_s)
        assert a.tpot_max_s[1] > a.tpot_max_s[0]  # a bigger chunk, a longer step
    assert np.all(smooth.tpot_max_s > 1.5 * smooth.tpot_p95_s)  # smooth arrivals: the p95 is far below it
    assert bursty.tpot_max_s[0] == pytest.approx(bursty.tpot_p95_s[0], rel=0.1)  # bursts fill the chunk
    assert 0.08 < bursty.tpot_max_s[0] < 0.11  # ~80 ms for a 1,024-token chunk on an 8B A100, plus decode
    dec = PoolSpec("d", "llama-3-8b", "a100-80gb", gpus_per_replica=1, role="decode")
    dec_max = QueueingPrior.for_pools([dec]).latency(_q(rps_per_replica=3.0)).tpot_max_s
    assert dec_max is not None and np.isinf(dec_max).all()


class _WithoutTpotBound:
    """The same model with an unbounded TPOT tail (what the planner assumed before the bound)."""

    def __init__(self, model: QueueingPrior) -> None:
        self.model = model

    def latency(self, q: LatencyQuery):
        from dataclasses import replace

        return replace(self.model.latency(q), tpot_max_s=None)

    def __getattr__(self, name: str):
        return getattr(self.model, name)


@pytest.mark.parametrize("rps", [10.0, 20.0])
def test_tpot_risk_under_bursts_is_cut_at_the_full_chunk_bound(rps):
    """Bursty prompts on an 8B A100 with 1,024-token chunks: the p95 TPOT sits at ~0.09 s whatever the
    replica count, just under critical's 0.1 s. Unbounded, the log-normal tail puts ~5 % of critical
    requests over it at any count: a risk no plan can lower, which also drowns the risks a plan can
    lower. Bounded, the TPOT risk is gone and the plan trades the TTFT risk left near the tolerance."""
    model = QueueingPrior.for_pools([SPEC_8B]).with_corrections([1.0], [1.1], 0.0, burst=[4.0])
    p = pool(usd_per_hour=4.1, startup_warm_s=20.0, startup_cold_s=90.0, prompt_tokens=2048.0, output_tokens=28.0,
             max_num_batched_tokens=1024)
    H = plan_steps(CFG, [p])
    prob = PlanProblem(pools=(p,), classes=classes(np.full(H, rps)), weights=resolve_weights("balanced"))
    bounded = solve(prob, model, CFG, np.random.default_rng(0))
    unbounded = solve(prob, _WithoutTpotBound(model), CFG, np.random.default_rng(0))
    tol = resolve_weights("balanced").risk_tolerance["critical"]
    assert max(bounded.terms["pools"]["a"]["tpot_p95_s_p90"]) > 0.085  # the p95 is near the SLO
    terms = bounded.terms["pools"]["a"]  # the bound is shown with the plan (`governor explain --json`)
    assert all(b >= p95 for b, p95 in zip(terms["tpot_bound_s_p90"], terms["tpot_p95_s_p90"], strict=True))
    assert max(terms["tpot_bound_s_p90"]) < 0.1 and unbounded.terms["pools"]["a"]["tpot_bound_s_p90"] is None
    late_b = bounded.terms["late_or_shed_frac_p90"]["critical"]
    late_u = unbounded.terms["late_or_shed_frac_p90"]["critical"]
    assert late_u > 5 * tol  # unbounded: ~5 %, whatever the plan
    assert late_b < 1.5 * tol and late_b < late_u / 4  # bounded: what is left is TTFT, near the tolerance


def test_cache_model_affinity_and_replicas():
    m = QueueingPrior.for_pools([SPEC])
    args = dict(pool_index=np.zeros(3, dtype=int), load_weight=np.full(3, 4.0), reuse_inf_hit=np.full(3, 0.4),
                reuse_working_set=np.full(3, 2e6), batch_tokens=np.zeros(3))
    by_aff = m.hit_rate(replicas=np.full(3, 4.0), prefix_weight=np.array([0.0, 3.0, 8.0]), **args)
    assert np.all(np.diff(by_aff) > 0) and by_aff[-1] <= 0.4
    # without affinity each replica holds the whole working set: more replicas do not help
    by_n = m.hit_rate(replicas=np.array([2.0, 4.0, 8.0]), prefix_weight=np.zeros(3), **args)
    assert np.allclose(by_n, by_n[0])


def test_figures_table_and_roofline_fallback():
    assert figures_for(SPEC) is PROFILED_FIGURES["llama-3-70b/h100-80gb/tp4"]
    odd = PoolSpec("x", "llama-2-13b", "a100-80gb", gpus_per_replica=1)
    f = figures_for(odd)
    assert f.source == "roofline" and 0.01 < f.a_s < 0.05
    with pytest.raises(ValueError, match="unknown field"):
        EngineFigures.of({"a_s": 0.01, "bogus": 1})


# --------------------------------------------------------------------------- objective profiles


def test_profiles_and_explicit_weights():
    assert set(PROFILES) == {"cost", "balanced", "latency", "throughput"}
    w = resolve_weights("cost", {"violation_weight": {"critical": 99.0}, "risk_weight": 5})
    assert w.violation_weight["critical"] == 99.0
    assert w.violation_weight["standard"] == PROFILES["cost"].violation_weight["standard"]
    assert w.risk_weight == 5.0
    cases: list[tuple[dict[str, Any], str]] = [
        ({"nope": 1}, "unknown field"), ({"risk_tolerance": {"gold": 0.1}}, "unknown class"),
        ({"plan_quantile": 0.7}, "reliability dial, not a weight"),
        ({"reliability": 0.7}, "policy parameter `reliability`"), ({"risk_weight": "x"}, "must be a number")]
    for bad, msg in cases:
        with pytest.raises(ValueError, match=msg):
            resolve_weights("balanced", bad)
    with pytest.raises(ValueError, match="unknown objective profile"):
        resolve_weights("fastest")


def test_learned_models_adapter_answers_in_bulk():
    """The planner runs on the learned coupling models too (prior-only coupling models here)."""
    from controller.core.coupling import CouplingModels
    from controller.core.mpc_model import LearnedPlanModel
    from controller.learning.physics import physics_for_pool_spec

    coupling = CouplingModels.prior_only([physics_for_pool_spec(SPEC)])
    m = LearnedPlanModel.for_pools(coupling, [SPEC])
    a = m.latency(_q(rps_per_replica=np.array([[1.0, 3.0], [4.0, 5.0]])[0]))
    assert a.tpot_p95_s.shape == (2,) and a.tpot_p95_s[1] > a.tpot_p95_s[0]
    assert np.all(a.confidence == 0.0)  # prior only: the models say so
    r = plan([pool()], 20.0)
    H = plan_steps(CFG, [pool()])
    prob = PlanProblem(pools=(pool(),), classes=classes(np.full(H, 20.0)), weights=resolve_weights("balanced"))
    learned = solve(prob, m, MpcConfig(max_evaluations=400), np.random.default_rng(0))
    assert 1 <= learned.plan.pools["a"].replicas[0] <= 16 and r.plan.pools["a"].replicas[0] >= 1
    with pytest.raises(KeyError, match="no physics"):
        LearnedPlanModel.for_pools(coupling, [PoolSpec("z", "llama-2-7b", "a100-80gb")])


def test_learned_adapter_plans_tpot_on_the_per_request_statistic_the_slo_judges():
    """The coupling models predict the pool's per-token inter-token latency, which chunked-prefill
    steps inflate; a TPOT SLO judges each request's mean TPOT. The adapter takes TPOT (and the
    capacity and batch that go with it) from its fallback's per-request model and TTFT from the
    coupling models."""
    from controller.core.coupling import CouplingModels, LatencyInputs
    from controller.core.mpc_model import LearnedPlanModel
    from controller.learning.physics import physics_for_pool_spec

    coupling = CouplingModels.prior_only([physics_for_pool_spec(SPEC)])
    fallback = QueueingPrior.for_pools([SPEC])
    m = LearnedPlanModel.for_pools(coupling, [SPEC], fallback=fallback)
    q = _q(rps_per_replica=np.array([1.0, 2.5, 4.0]))
    a, own = m.latency(q), fallback.latency(q)
    np.testing.assert_allclose(a.tpot_p95_s, own.tpot_p95_s)
    np.testing.assert_allclose(a.tpot_p50_s, own.tpot_p50_s)
    # the cap is judged on one model's TPOT, batch and sustainable rate
    for f in ("capacity_rps", "utilisation", "batch"):
        np.testing.assert_allclose(getattr(a, f), getattr(own, f), err_msg=f)
    x = LatencyInputs.build(3, physics_index=np.zeros(3, dtype=np.intp), arrival_rps_per_replica=q.rps_per_replica,
                            prompt_tokens=q.prompt_tokens, output_tokens=q.output_tokens, hit_rate=q.hit_rate,
                            inflight_cap=q.inflight_cap, max_num_seqs=q.max_num_seqs,
                            max_num_batched_tokens=q.max_num_batched_tokens)
    out, _, _ = coupling.predict_latency(x)
    np.testing.assert_allclose(a.ttft_p95_s, out["ttft_p95_s"])  # no in-flight cap: no router wait
    # at 4 req/s per 70B replica the inter-token p95 is well above the per-request one: not planned on
    assert out["tpot_p95_s"][2] > 1.3 * a.tpot_p95_s[2]


# --------------------------------------------------------------------------- tail shapes beyond the p95


def _exceed_beyond_p95(p95: float, bound: float, sigma: float) -> float:
    return float(1.0 - ndtr(1.6449 + math.log(bound / p95) / sigma))


@pytest.mark.parametrize("label,p50,p95,bound,tail,expect", [
    # a wide TTFT (p50 0.32 s, p95 3.43 s: cache hits and short prompts mixed with long uncached ones)
    ("wide TTFT, 3 x p95: the prompt tail (σ 1), not the fit (σ 1.44)", 0.324, 3.429, 3 * 3.429, 1.0,
     _exceed_beyond_p95(3.429, 3 * 3.429, 1.0)),
    ("wide TTFT below the p95: the fitted curve", 0.324, 3.429, 2.0, 1.0, None),
    ("narrow TTFT (azure-conv, σ 0.85): the fit stands", 0.122, 0.496, 1.0, 1.0, None),
    ("TPOT widened by a burst term: σ 0.5 beyond the p95", 0.015, 0.066, 0.1, 0.5,
     _exceed_beyond_p95(0.066, 0.1, 0.5)),
    ("at the p95 both give 5 %", 0.324, 3.429, 3.429, 1.0, 0.05),
])
def test_exceedance_tail_beyond_the_p95(label, p50, p95, bound, tail, expect):
    a = np.array([p50]), np.array([p95]), np.array([bound])
    fitted = float(lognormal_exceed(*a)[0])
    got = float(lognormal_exceed(*a, tail_sigma=tail)[0])
    assert got == pytest.approx(fitted if expect is None else expect, rel=1e-3, abs=1e-6), label
    assert got <= fitted + 1e-12  # a tail bound never adds risk


def test_long_prompt_pool_predicts_critical_late_near_what_the_simulator_shows():
    """mooncake-conv at its mean load (3.35 req/s, 12k-token prompts, 34 % hits) on 3 TP2 replicas: the
    simulator had 0.17 % of critical requests late; the planner must not predict beyond its 0.6 %
    tolerance (the fitted log-normal tail said 0.8 % and bought a fourth replica)."""
    spec = PoolSpec("m", "llama-3-8b", "h100-80gb", gpus_per_replica=2, usd_per_replica_hour=24.6, min_replicas=1,
                    max_replicas=8, startup_warm_s=20, startup_cold_s=90, max_num_batched_tokens=2048)
    slo = {"critical": (10.0, 0.1), "standard": (20.0, 0.15), "sheddable": (40.0, 0.3)}
    p = pool("m", lo=3, hi=3, target=3, ready=3, startup_warm_s=20.0, startup_cold_s=90.0, prompt_tokens=12035.0,
             output_tokens=343.0, hit_rate=0.34, reuse_inf_hit=0.37, reuse_working_set=0.0, usd_per_hour=24.6,
             max_num_batched_tokens=2048)
    H = plan_steps(CFG, [p])
    tot = np.full(H, 3.35)
    cl = tuple(ClassInput(c, *slo[c], tuple(tot * SHARE[c]), tuple(tot * SHARE[c] * 1.1)) for c in slo)
    model = QueueingPrior.for_pools([spec]).with_corrections([1.8], [1.0], 0.5)  # k_ttft as learned on the run
    r = solve(PlanProblem(pools=(p,), classes=cl, weights=resolve_weights("balanced")), model, CFG,
              np.random.default_rng(0))
    assert r.plan.pools["m"].replicas[0] == 3
    assert r.terms["late_frac_p50"]["critical"] < PROFILES["balanced"].risk_tolerance["critical"], r.terms


# --------------------------------------------------------------------------- routing weights


def test_traffic_weight_counts_the_replicas_landing_in_the_first_step():
    """Two equal pools in one group, one with 1 ready and 3 landing in 5 s: the router splits by the
    absolute weights until the next decision, so equal shares per replica need equal absolute weights
    (per replica × replicas serving in the first step), not 1 : 4."""
    pools = [pool("a", 0, lo=4, hi=4, target=4, ready=1, starting_eta_s=(5.0, 5.0, 5.0), traffic_weight=4.0),
             pool("b", 1, lo=4, hi=4, target=4, ready=4, traffic_weight=4.0)]
    r = plan(pools, 20.0)
    wa, wb = r.plan.pools["a"].traffic_weight, r.plan.pools["b"].traffic_weight
    assert 0.6 < wa / wb < 1.6, (wa, wb)


def test_traffic_weights_hold_steady_when_a_planned_scale_down_is_held():
    """The demo's A100 pool: the plan wants it at 1 replica, stabilisation holds 2. The planner reads
    its weight per replica back as weight / replicas serving, so weights written for the planned 1
    but served by 2 halved that pool's share every tick (0.30 → 0.00 in eight ticks, both replicas
    paid for). Written for the targets applied, the split holds, and a hop's weights sum to 1."""
    cfg = MpcConfig(max_evaluations=600)
    pools = [pool("a", 0, lo=1, hi=8, target=2, ready=2, traffic_weight=0.5, usd_per_hour=30.0),
             pool("b", 1, lo=5, hi=5, target=5, ready=5, traffic_weight=0.5)]
    H = plan_steps(cfg, pools)
    prob = PlanProblem(pools=tuple(pools), classes=classes(np.full(H, 9.0)), weights=resolve_weights("balanced"))
    model = QueueingPrior.for_pools([SPEC] * 2)
    warm, shares = None, []
    for tick in range(10):
        r = solve(prob, model, cfg, np.random.default_rng(tick), warm=warm, warm_shift=1)
        assert r.plan.pools["a"].replicas[0] < 2  # the plan wants the scale-down every tick ...
        w = applied_router_weights(prob, r.plan, {"a": 2, "b": 5}, cfg.step_s)  # ... and it is held
        assert w["a"] + w["b"] == pytest.approx(1.0, abs=1e-3), w
        shares.append(w["a"])
        warm = r.plan
        prob = PlanProblem(pools=tuple(replace(p, traffic_weight=w[p.name]) for p in prob.pools),
                           classes=prob.classes, weights=prob.weights)
    assert min(shares[3:]) > 0.5 * max(shares[:3]), shares


def test_applied_router_weights_rescale_for_the_replicas_serving():
    """Planned: a at 1 replica with weight 0.2, b at 4 with 0.8; applied: a held at 2 (2 ready) →
    a's weight doubles before the hop is renormalised (0.4 : 0.8 → 1/3 : 2/3). Pools alone on
    their hop keep the weight the plan gave them."""
    from controller.core.mpc import Plan, PoolPlan

    def pp(n: int, w: float) -> PoolPlan:
        return PoolPlan(replicas=(n,) * 3, warm_standby=0, prefix_weight=3.0, inflight_cap=0, traffic_weight=w,
                        max_num_seqs=256, max_num_batched_tokens=8192)

    prob = PlanProblem(pools=(pool("a", 0, ready=2, target=2), pool("b", 1, ready=4, target=4),
                              pool("c", 2, group="other", ready=1, target=1)),
                       classes=classes(np.full(3, 9.0)), weights=resolve_weights("balanced"))
    plan_ = Plan(pools={"a": pp(1, 0.2), "b": pp(4, 0.8), "c": pp(1, 1.0)}, shed={})
    w = applied_router_weights(prob, plan_, {"a": 2, "b": 4, "c": 1}, 30.0)
    assert w["a"] == pytest.approx(1 / 3, abs=1e-3) and w["b"] == pytest.approx(2 / 3, abs=1e-3)
    assert w["c"] == 1.0
    assert applied_router_weights(prob, plan_, {"a": 1, "b": 4, "c": 1}, 30.0)["a"] == pytest.approx(0.2, abs=1e-3)



# --------------------------------------------------------------------------- table: memory ceiling on batch caps

LONG_PROMPTS: dict[str, Any] = dict(batch_review=True, target=4, ready=4, max_num_batched_tokens=1024, max_num_seqs=64,
                                    prompt_tokens=16_000.0, hit_rate=0.0, reuse_inf_hit=0.0)


@pytest.mark.parametrize("label, ceiling, want", [
    ("no ceiling: 16,000-token prompts at a 1,024-token budget pay for the restart", None, 8192),
    ("framebuffer full: the ceiling is the caps in force, no raise", 1024, 1024),
    ("room for ~5,000 more tokens: the raise stops at the largest option under it", 6000, 4096),
])
def test_a_memory_ceiling_bars_batch_cap_raises(label, ceiling, want):
    r = plan([pool(**LONG_PROMPTS, max_batched_tokens=ceiling)], 12.0)
    assert r.plan.pools["a"].max_num_batched_tokens == want, label


def test_a_memory_ceiling_leaves_lowering_open():
    """Bursty arrivals lower max_num_batched_tokens (test above); a ceiling at the caps in force keeps that."""
    def solve_burst(p: PoolInput):
        H = plan_steps(CFG, [p])
        prob = PlanProblem(pools=(p,), classes=classes(np.full(H, 14.0)), weights=resolve_weights("balanced"))
        model = QueueingPrior.for_pools([SPEC]).with_corrections([1.0], [1.0], 0.5, burst=[6.0])
        return solve(prob, model, CFG, np.random.default_rng(0))

    free = solve_burst(pool(batch_review=True, target=6, ready=6)).plan.pools["a"]
    capped = solve_burst(pool(batch_review=True, target=6, ready=6, max_batched_tokens=8192)).plan.pools["a"]
    assert free.max_num_batched_tokens < 8192
    assert capped.max_num_batched_tokens == free.max_num_batched_tokens


# --------------------------------------------------------------------------- held levers (the bench's ablation)


def test_held_traffic_split_balances_replicas_instead_of_moving_work():
    """Held, the split is what a plain balancer over the hop's replicas gives: each pool's weight is
    its share of the replicas serving in the first step, whatever split was in force before."""
    cfg = MpcConfig(max_evaluations=1500, fixed_levers=("traffic_split",))
    skewed = [pool("a", 0, lo=4, hi=4, target=4, ready=4, traffic_weight=0.9),
              pool("b", 1, lo=4, hi=4, target=4, ready=4, traffic_weight=0.1)]
    held = plan(skewed, 25.0, cfg=cfg).plan.pools
    assert held["a"].traffic_weight == pytest.approx(0.5) and held["b"].traffic_weight == pytest.approx(0.5)
    uneven = [pool("a", 0, lo=2, hi=2, target=2, ready=2), pool("b", 1, target=4, ready=4, warm_slots=8)]
    held = plan(uneven, 30.0, cfg=cfg).plan.pools
    # 4 of b's replicas and 2 of a's serve in the first step (b's new ones are still starting)
    assert held["b"].traffic_weight / held["a"].traffic_weight == pytest.approx(4 / 2, rel=0.02)


@pytest.mark.parametrize("lever, field, in_force", [
    ("affinity", "prefix_weight", 3.0),
    ("inflight_cap", "inflight_cap", 0),
])
def test_held_router_levers_stay_at_what_is_in_force(lever, field, in_force):
    """Capacity short (both pools at their maximum): free, the planner caps or moves affinity; held,
    the plan carries the value in force whatever else it changes."""
    pools = [pool("a", 0, lo=4, hi=4), pool("b", 1, lo=2, hi=2, target=2, ready=2)]
    held = plan(pools, 45.0, cfg=MpcConfig(max_evaluations=1500, fixed_levers=(lever,)))
    for p in held.plan.pools.values():
        assert getattr(p, field) == in_force


def test_held_admission_sheds_only_the_floors():
    pools = [pool("a", 0, lo=4, hi=4), pool("b", 1, lo=2, hi=2, target=2, ready=2)]
    free = plan(pools, 45.0)
    held = plan(pools, 45.0, cfg=MpcConfig(max_evaluations=1500, fixed_levers=("admission",)))
    assert free.plan.shed["sheddable"] > 0.0  # the lever is pulled when free (test_capacity_short_delays...)
    assert all(v == 0.0 for v in held.plan.shed.values())  # no floors in this problem: nothing shed


def test_unknown_held_lever_is_refused():
    with pytest.raises(ValueError, match="fixed_levers.*valid"):
        MpcConfig(fixed_levers=("replicas",))


def test_capacity_moves_to_the_cheaper_pool_of_a_hop():
    """Two equal pools, one at nearly twice the price: the sweeps pool by pool stay put (taking a
    replica off the dear pool alone overloads it); a transfer orders replicas on the cheap pool and
    gives the dear pool's up once they serve, and the cheap pool takes the larger share at once."""
    pools = [pool("a", 0, lo=1, hi=8, target=4, ready=4, traffic_weight=0.5),
             pool("b", 1, lo=1, hi=8, target=4, ready=4, traffic_weight=0.5, usd_per_hour=90.0)]
    r = plan(pools, 25.0)
    a, b = r.plan.pools["a"], r.plan.pools["b"]
    assert a.replicas[-1] > b.replicas[-1]  # by the end of the horizon the cheap pool carries more
    assert a.traffic_weight > b.traffic_weight
    assert sum(a.replicas) * 49.16 + sum(b.replicas) * 90.0 < sum(b.replicas) * 49.16 + sum(a.replicas) * 90.0


def test_tier_rules_split_each_class_as_the_router_does():
    from controller.core.mpc.traffic import Traffic

    pools = [pool("large", 0), pool("small", 1, eligible=(("critical", 0.0), ("standard", 0.5)))]
    H = plan_steps(CFG, pools)
    prob = PlanProblem(pools=tuple(pools), classes=classes(np.full(H, 10.0)), weights=resolve_weights("balanced"))
    tr = Traffic(prob, H, CFG.step_s, CFG.client_retries)
    assert tr.tiered
    k = {c.name: i for i, c in enumerate(prob.classes)}
    eq = tr.class_shares(np.array([[1.0, 1.0]]))[:, 0]  # (K, P) at equal weights
    assert eq[k["critical"]] == pytest.approx([1.0, 0.0])  # no critical task may go small
    assert eq[k["standard"]] == pytest.approx([0.75, 0.25])  # half of the eligible half
    assert eq[k["sheddable"]] == pytest.approx([0.5, 0.5])
    all_small = tr.class_shares(np.array([[0.0, 1.0]]))[:, 0]
    assert all_small[k["standard"]] == pytest.approx([0.5, 0.5])  # at most its eligible share
    assert all_small[k["critical"]] == pytest.approx([1.0, 0.0])  # even at weight 0 the large takes it
    no_rule = Traffic(PlanProblem(pools=(pool("large", 0), pool("small", 1)), classes=prob.classes,
                                  weights=prob.weights), H, CFG.step_s, CFG.client_retries)
    assert not no_rule.tiered


def test_the_planner_keeps_the_large_tier_for_what_only_it_may_serve():
    """A cheap small tier that may serve only sheddable traffic: the large tier must keep the
    capacity for critical and standard; planned without the rule, the large tier would be cut."""
    def plan_for(eligible):
        pools = [pool("large", 0, lo=1, hi=16, target=6, ready=6),
                 pool("small", 1, lo=1, hi=16, target=6, ready=6, usd_per_hour=5.0, eligible=eligible)]
        return plan(pools, 36.0).plan.pools
    ruled = plan_for((("critical", 0.0), ("standard", 0.0)))
    free = plan_for(())
    assert ruled["large"].replicas[-1] > free["large"].replicas[-1]
    # critical + standard (80 % of 36 req/s) stay on the large tier: it keeps at least what 6 did before
    assert ruled["large"].replicas[-1] >= 6 and free["small"].replicas[-1] > ruled["small"].replicas[-1]
