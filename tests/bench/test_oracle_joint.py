"""The joint oracle: its DP against worked examples and brute force, and its replay with a moving split."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from controller.bench.harness import prepare
from controller.bench.oracle import (
    SchedulePolicy,
    plan_cost,
    plan_pool,
    pool_demands,
    run_oracle,
)
from controller.bench.oracle_joint import JointTooLargeError, joint_groups, plan_group, router_weights, share_points
from controller.bench.oracle_lag import lagged_weights, reference_lag_s
from controller.bench.profile import request_work_s
from controller.bench.side_by_side import ORACLE_JOINT, ORACLE_LAG, default_policies, run_bench
from controller.perf.iteration import IterationModel
from controller.sim.scenario import PoolSpecModel, load_scenario
from tests.bench.conftest import write_scenario


def pool(name: str, **kw) -> PoolSpecModel:
    base = dict(name=name, model="llama-3-8b", sku="a100-80gb", replicas=0, min_replicas=0, max_replicas=8,
                startup_warm_s=0.0, startup_cold_s=0.0)
    return PoolSpecModel(**{**base, **kw})


def brute_force(specs, units, prices, drains, window_s, eligible, floors):
    """Every replica path (small grids only): the cheapest that carries every window, as plan_group defines it."""
    n_w = len(units[0])
    ranges = [range(s.max_replicas + 1) for s in specs]
    best = np.inf
    for path in itertools.product(itertools.product(*ranges), repeat=n_w):
        ok = all(sum(min(path[k][i] / units[i][k], eligible[i]) if units[i][k] > 0 else eligible[i]
                     for i in range(len(specs))) >= 1 - 1e-9 for k in range(n_w))
        if not ok or any(path[k][i] < floors[i] for k in range(n_w) for i in range(len(specs))):
            continue
        # a window that ends before a cold start-up ordered at t = 0 could serve has only the initial replicas
        if any(path[k][i] > max(s.replicas, floors[i]) for i, s in enumerate(specs)
               for k in range(n_w) if k < -(-s.startup_cold_s // window_s)):
            continue
        cost = sum(plan_cost([path[k][i] for k in range(n_w)], specs[i].replicas, window_s=window_s,
                             usd_per_s=prices[i], startup_s=specs[i].startup_cold_s, drain_s=drains[i])
                   for i in range(len(specs)))
        best = min(best, cost)
    return best


def test_cheaper_work_per_dollar_takes_the_load() -> None:
    # u = (4, 2): the second SKU does twice the work per replica; prices 1 and 3 per replica-window.
    # All on the first costs 4, all on the second 6, half and half 2 + 3 = 5 → 4 replicas of the first.
    specs = [pool("a"), pool("b")]
    gp = plan_group(specs, [np.full(3, 4.0), np.full(3, 2.0)], usd_per_s=[1 / 60, 3 / 60], drain_s=[0, 0],
                    window_s=60.0)
    assert gp.replicas == {"a": (4, 4, 4), "b": (0, 0, 0)}
    assert gp.shares["a"] == (1.0, 1.0, 1.0) and gp.shares["b"] == (0.0, 0.0, 0.0)
    assert gp.planned_cost_usd == pytest.approx(12.0)


def test_a_fast_starting_pool_carries_the_peak() -> None:
    # Pool a is cheaper per unit of work but takes 20 windows' worth of its price to start a replica;
    # pool b costs 1.5× per unit but starts instantly: the base load stays on a, the one-window peak goes to b.
    specs = [pool("a", replicas=2, startup_cold_s=1200.0), pool("b", startup_cold_s=0.0)]
    demand = np.array([2.0, 2.0, 6.0, 2.0, 2.0])
    gp = plan_group(specs, [demand, demand], usd_per_s=[1 / 60, 1.5 / 60], drain_s=[0, 0], window_s=60.0)
    assert gp.replicas["a"] == (2, 2, 2, 2, 2)
    assert gp.replicas["b"] == (0, 0, 4, 0, 0)
    assert gp.shares["b"][2] == pytest.approx(4 / 6)


def test_an_ineligible_tier_takes_at_most_its_share() -> None:
    # the small tier (b) is far cheaper, but only half of the traffic may go to it
    specs = [pool("a"), pool("b")]
    gp = plan_group(specs, [np.full(2, 4.0), np.full(2, 2.0)], usd_per_s=[3 / 60, 1 / 60], drain_s=[0, 0],
                    window_s=60.0, eligible=[1.0, 0.5])
    assert gp.replicas == {"a": (2, 2), "b": (1, 1)}
    assert gp.shares["b"] == (0.5, 0.5)


def test_matches_brute_force_on_random_small_groups() -> None:
    rng = np.random.default_rng(3)
    checked = 0
    for _ in range(12):
        specs = [pool("a", replicas=int(rng.integers(0, 3)), max_replicas=3,
                      startup_cold_s=float(rng.choice([0.0, 60.0, 300.0]))),
                 pool("b", replicas=int(rng.integers(0, 3)), max_replicas=3,
                      startup_cold_s=float(rng.choice([0.0, 60.0, 300.0])))]
        units = [rng.uniform(0.0, 3.0, 3), rng.uniform(0.5, 3.0, 3)]
        units[1] = np.maximum(units[1], units[0] / 3.0 + 0.1)  # keep every window carriable within the grid
        prices = [float(rng.uniform(0.5, 2.0)) / 60, float(rng.uniform(0.5, 2.0)) / 60]
        eligible = [1.0, float(rng.choice([1.0, 0.6]))]
        gp = plan_group(specs, units, usd_per_s=prices, drain_s=[5.0, 5.0], window_s=60.0, eligible=eligible,
                        floors=[0, 0])
        if gp.capped_windows:
            continue
        want = brute_force(specs, units, prices, [5.0, 5.0], 60.0, eligible, [0, 0])
        if not np.isfinite(want):
            continue  # the early windows cannot carry the load: the DP's fallback, not compared here
        checked += 1
        assert gp.planned_cost_usd == pytest.approx(want, rel=1e-9, abs=1e-12)
        got = sum(plan_cost(gp.replicas[s.name], s.replicas, window_s=60.0, usd_per_s=prices[i],
                            startup_s=s.startup_cold_s, drain_s=5.0) for i, s in enumerate(specs))
        assert got == pytest.approx(gp.planned_cost_usd)
    assert checked >= 6  # most random instances are compared, not skipped


def test_never_dearer_than_the_fixed_split() -> None:
    # the scenario's even split is one of the joint programme's schedules, so it can only do better
    rng = np.random.default_rng(7)
    for _ in range(10):
        specs = [pool("a", replicas=1, min_replicas=1, startup_cold_s=120.0),
                 pool("b", replicas=1, min_replicas=1, startup_cold_s=30.0, sku="h100-80gb")]
        full = [rng.uniform(0.5, 12.0, 8), rng.uniform(0.3, 7.0, 8)]
        prices = [1.0 / 60, 2.2 / 60]
        gp = plan_group(specs, full, usd_per_s=prices, drain_s=[3.0, 3.0], window_s=60.0)
        fixed = 0.0
        for i, s in enumerate(specs):
            plan = plan_pool(s, full[i] / 2.0, 1.0, window_s=60.0, drain_s=3.0)
            fixed += plan_cost(plan.replicas, s.replicas, window_s=60.0, usd_per_s=prices[i],
                               startup_s=s.startup_cold_s, drain_s=3.0)
        assert gp.planned_cost_usd <= fixed + 1e-9


def test_refuses_a_grid_too_large() -> None:
    specs = [pool(n, max_replicas=512) for n in "abc"]
    with pytest.raises(JointTooLargeError):
        plan_group(specs, [np.full(2, 400.0)] * 3, usd_per_s=[1.0] * 3, drain_s=[0.0] * 3, window_s=60.0)


def test_share_points_and_schedule_policy_weights() -> None:
    assert share_points((0.5, 0.5, 1.0, 0.25), window_s=60.0) == ((0.0, 0.5), (120.0, 1.0), (180.0, 0.25))
    pol = SchedulePolicy({"a": ((0.0, 2),)}, {}, {"a": ((0.0, 0.5), (120.0, 1.0))})
    assert pol.weight_at("a", 119.0, 1.0) == 0.5 and pol.weight_at("a", 120.0, 1.0) == 1.0
    assert pol.weight_at("b", 10.0, 1.0) == 1.0


def test_prefill_and_decode_pools_weigh_their_own_phase() -> None:
    m = IterationModel.build("llama-3-8b", "a100-80gb", 1)
    p, o = np.array([4000, 500]), np.array([50, 800])
    both = request_work_s(m, p, o, max_num_batched_tokens=8192)
    pre = request_work_s(m, p, o, max_num_batched_tokens=8192, part="prefill")
    dec = request_work_s(m, p, o, max_num_batched_tokens=8192, part="decode")
    assert np.allclose(pre + dec, both)
    assert pre[0] > pre[1] and dec[1] > dec[0]  # the long prompt weighs on prefill, the long answer on decode
    with pytest.raises(ValueError, match="part"):
        request_work_s(m, p, o, max_num_batched_tokens=8192, part="all")


TWO_SKU_POOLS = """\
  - name: dear
    model: llama-3-8b
    sku: h100-80gb
    replicas: 1
    min_replicas: 0
    max_replicas: 8
    startup_warm_s: 10
    startup_cold_s: 20
    usd_per_gpu_hour: 20.0
    engine: {max_num_seqs: 64, max_num_batched_tokens: 4096}
"""


def test_joint_oracle_moves_work_to_the_cheaper_pool(tmp_path) -> None:
    path = write_scenario(tmp_path, name="bench-two-sku")
    text = path.read_text().replace("tasks:\n", TWO_SKU_POOLS + "tasks:\n", 1)
    path.write_text(text)
    scenario = load_scenario(path)
    assert [[p.name for p in g] for g in joint_groups(scenario)] == [["small", "dear"]]
    assert ORACLE_JOINT in default_policies(scenario)
    ctx = prepare(scenario, seed=scenario.seed, cache_dir=tmp_path / ".cache")
    full = pool_demands(scenario, ctx.workload, ctx.profiles, full_share=True)
    # at share 1 each pool's demand is the whole group's; the scenario's even split halves it
    for name in ("small", "dear"):
        assert full[name].total == pytest.approx(2 * ctx.demands[name].total)
    joint = run_oracle(scenario, workload=ctx.workload, profiles=ctx.profiles, demands=ctx.demands,
                       seed=scenario.seed, full_demands=full, label=ORACLE_JOINT, max_replays=2, repair_rounds=1)
    plain = run_oracle(scenario, workload=ctx.workload, profiles=ctx.profiles, demands=ctx.demands,
                       seed=scenario.seed, max_replays=2, repair_rounds=1)
    assert joint.run.policy == ORACLE_JOINT and plain.run.policy == "oracle"
    split = joint.run.extra.get("split") or {}
    assert not joint.candidate.fallback_static
    # the $20/h H100 costs about 2.2 $/h per req/s of capacity against the A100's 0.9: the joint
    # schedule takes it out and routes everything to the A100 pool once a start-up could serve
    assert np.mean(split["dear"]) < 0.5 and split["dear"][-1] == 0.0
    assert joint.candidate.planned_cost_usd < plain.candidate.planned_cost_usd
    assert joint.run.summary["cost_usd"] < plain.run.summary["cost_usd"]
    # same seed, same inputs: the same schedule and split every time
    again = run_oracle(scenario, workload=ctx.workload, profiles=ctx.profiles, demands=ctx.demands,
                       seed=scenario.seed, full_demands=full, label=ORACLE_JOINT, max_replays=2, repair_rounds=1)
    assert again.run.extra["schedule"] == joint.run.extra["schedule"]
    assert again.run.extra.get("split") == joint.run.extra.get("split")


def test_lagged_weights_and_the_reference_lag(tmp_path) -> None:
    assert lagged_weights(((0.0, 0.5), (120.0, 1.0)), 30.0) == ((0.0, 1.0), (30.0, 0.5), (150.0, 1.0))
    assert lagged_weights(((0.0, 0.5),), 0.0) == ((0.0, 0.5),)
    with pytest.raises(ValueError, match="lag_s"):
        lagged_weights(((0.0, 0.5),), float("nan"))
    scenario = load_scenario(write_scenario(tmp_path))
    assert reference_lag_s(scenario, 15.0) == 15.0 + 10.0  # tick + the pool's 10 s warm start-up


def test_bench_lists_the_joint_references_with_their_ratios(tmp_path) -> None:
    path = write_scenario(tmp_path, name="bench-two-sku")
    path.write_text(path.read_text().replace("tasks:\n", TWO_SKU_POOLS + "tasks:\n", 1))
    scenario = load_scenario(path)
    report, runs, _ = run_bench(scenario, ["static", ORACLE_JOINT, ORACLE_LAG], seed=scenario.seed,
                                cache_dir=tmp_path / ".cache", oracle_max_replays=2)
    pols = report["policies"]
    assert set(pols) == {"static", ORACLE_JOINT, ORACLE_LAG}  # the joint oracle ran for the lag, unlisted twice
    lag_run = next(r for r in runs if r.policy == ORACLE_LAG)
    assert lag_run.extra["lag_s"] == pytest.approx(25.0) and lag_run.extra["lagged"] == ORACLE_JOINT
    for e in pols.values():
        assert e["ratio_to_oracle_joint"] is not None and e["ratio_to_oracle_lag"] is not None
        assert set(e["slo_attainment"]) == {"critical", "standard", "sheddable"}
    assert pols[ORACLE_JOINT]["ratio_to_oracle_joint"] == pytest.approx(1.0)
    # reacting a tick and a warm start-up late costs at least what the schedule planned, or loses tasks
    lag, joint = pols[ORACLE_LAG], pols[ORACLE_JOINT]
    assert (lag["cost_per_successful_task_usd"] >= 0.98 * joint["cost_per_successful_task_usd"]
            or lag["successful_tasks"] < joint["successful_tasks"])


def test_lever_ablation_replays_the_mpc_once_per_held_lever(tmp_path) -> None:
    from controller.core.mpc import LEVERS

    path = write_scenario(tmp_path, name="bench-two-sku")
    path.write_text(path.read_text().replace("tasks:\n", TWO_SKU_POOLS + "tasks:\n", 1))
    scenario = load_scenario(path)
    report, runs, _ = run_bench(scenario, ["static", "mpc"], seed=scenario.seed, cache_dir=tmp_path / ".cache",
                                ablate=True)
    ab = report["lever_ablation"]
    assert set(ab["levers"]) == set(LEVERS)
    mpc = report["policies"]["mpc"]["cost_per_successful_task_usd"]
    assert ab["mpc"] == mpc
    for lever, e in ab["levers"].items():
        assert e["ratio_to_mpc"] == pytest.approx(e["cost_per_successful_task_usd"] / mpc), lever
        assert set(e["slo_attainment"]) == {"critical", "standard", "sheddable"}
        if ab["gain_usd_per_task"] is None:
            assert e["share_of_gain"] is None
    # a replay with the traffic split held is a different run from the MPC's own (the split moves here)
    assert ab["levers"]["traffic_split"]["cost_per_successful_task_usd"] != mpc
    assert "lever_ablation" in run_bench(scenario, ["static"], seed=scenario.seed,
                                         cache_dir=tmp_path / ".cache")[0]


@pytest.mark.parametrize("shares, eligible, want", [
    ((0.7, 0.3), (1.0, 0.5), (0.4, 0.6)),  # the small tier gets 0.6 of the eligible half = 0.3 of all
    ((0.5, 0.5), (1.0, 1.0), (0.5, 0.5)),  # no tier rule: the weights are the shares
    ((1.0, 0.0), (1.0, 0.2), (1.0, 0.0)),
    ((0.2, 0.8), (1.0, 0.8), (0.0, 1.0)),  # every eligible request to the small tier
])
def test_router_weights_give_the_shares_under_a_tier_rule(shares, eligible, want) -> None:
    w = router_weights(list(shares), list(eligible))
    assert w == pytest.approx(list(want))
    # as the router splits: eligible requests by weight among both, the rest to the large tier only
    small = eligible[1] * w[1] / (w[0] + w[1])
    assert small == pytest.approx(shares[1])


def test_a_restricted_tier_takes_at_most_its_eligible_share_per_window() -> None:
    specs = [pool("large"), pool("small")]
    e_small = np.array([0.2, 0.6])  # the class mix changes: 20 % then 60 % of the work may go small
    gp = plan_group(specs, [np.full(2, 8.0), np.full(2, 4.0)], usd_per_s=[4 / 60, 1 / 60], drain_s=[0, 0],
                    window_s=60.0, eligible=[np.ones(2), e_small])
    # window 0: 1 small replica carries its whole 20 %, 7 large ones the rest (0.2 + 7/8 ≥ 1 by 7.5 %);
    # window 1: 2 small carry half of all (below their 60 %), 4 large the other half (2/4 + 4/8 = 1)
    assert gp.replicas["small"] == (1, 2) and gp.replicas["large"] == (7, 4)
    assert gp.shares["small"] == pytest.approx((0.2 / 1.075, 0.5))
    assert all(s <= e + 1e-9 for s, e in zip(gp.shares["small"], e_small, strict=True))
    assert gp.planned_cost_usd == pytest.approx(7 * 4 + 1 + 4 * 4 + 2 * 1)
