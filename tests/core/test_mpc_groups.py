"""The planner's group search (controller/core/mpc/groups.py) on hand-made fleets: which parts a fleet is
searched in, that a part's evaluator scores a candidate as the fleet's evaluator does, and that the
group search finds the complete search's plan on a small coupled fleet, deterministically."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from controller.core.mpc import ClassInput, MpcConfig, PlanProblem, PoolInput, plan_steps, solve
from controller.core.mpc.groups import PartEvaluator, columns, others_of, plan_groups, put_columns
from controller.core.mpc.score import Evaluator
from controller.core.mpc_model import QueueingPrior
from controller.core.objective import resolve_weights
from controller.types import PoolSpec

SLO = {"critical": (2.5, 0.1), "standard": (5.0, 0.15), "sheddable": (10.0, 0.3)}
SHARE = {"critical": 0.2, "standard": 0.6, "sheddable": 0.2}
# (model, SKU, GPUs, $/replica-hour, warm s, cold s)
KINDS = {"8b-a100": ("llama-3-8b", "a100-80gb", 1, 5.12, 20.0, 90.0),
         "8b-h100": ("llama-3-8b", "h100-80gb", 1, 12.29, 20.0, 90.0),
         "70b-h100": ("llama-3-70b", "h100-80gb", 4, 49.16, 60.0, 300.0),
         "70b-a100": ("llama-3-70b", "a100-80gb", 4, 20.48, 60.0, 300.0)}


def fleet(layout: list[tuple[str, str, int]], total_rps: float, spread: float = 0.1,
          shed_floor: float = 0.0) -> tuple[PlanProblem, QueueingPrior]:
    """Pools (group, kind, replicas) in fleet order; class forecasts flat at `total_rps`."""
    specs, pools = [], []
    for j, (group, kind, n) in enumerate(layout):
        model, sku, tp, price, warm, cold = KINDS[kind]
        specs.append(PoolSpec(f"p{j}", model, sku, gpus_per_replica=tp, usd_per_replica_hour=price, min_replicas=1,
                              max_replicas=24, startup_warm_s=warm, startup_cold_s=cold, group=group))
        pools.append(PoolInput(name=f"p{j}", model_index=j, group=group, role="mixed", usd_per_hour=price, lo=1,
                               hi=24, target=n, ready=n, startup_warm_s=warm, startup_cold_s=cold,
                               prompt_tokens=1100.0, output_tokens=210.0, hit_rate=0.3, reuse_inf_hit=0.3,
                               reuse_working_set=20_000.0))
    H = plan_steps(MpcConfig(), pools)
    cls = tuple(ClassInput(c, *SLO[c], (total_rps * SHARE[c],) * H, (total_rps * SHARE[c] * (1 + spread),) * H,
                           min_shed=shed_floor if c == "sheddable" else 0.0) for c in SLO)
    groups = sorted({g for g, _, _ in layout})
    prob = PlanProblem(pools=tuple(pools), classes=cls, weights=resolve_weights("balanced"),
                       group_share={g: (k + 1.0) for k, g in enumerate(groups)})
    return prob, QueueingPrior.for_pools(specs)


def test_a_fleet_is_searched_per_route_group_largest_spend_first() -> None:
    layout = ([("chat", "8b-a100", 2)] * 3 + [("code", "70b-h100", 3), ("code", "70b-a100", 2)]
              + [("batch", "8b-h100", 1)] * 7)
    prob, _ = fleet(layout, 20.0)
    cfg = MpcConfig(group_search_min_pools=12)
    # code spends 3 × 49.16 + 2 × 20.48, batch 7 × 12.29, chat 3 × 2 × 5.12
    assert plan_groups(prob, cfg) == [[3, 4], [5, 6, 7, 8, 9, 10, 11], [0, 1, 2]]
    assert plan_groups(prob, replace(cfg, group_search_min_pools=13)) == []  # a small fleet: one search
    assert plan_groups(prob, replace(cfg, group_search=False)) == []
    one = replace(prob, pools=tuple(replace(p, group="all") for p in prob.pools))
    assert plan_groups(one, cfg) == []  # one route group: nothing to split


@pytest.mark.parametrize("label, total, floor, shed, variant", [
    ("served, no shedding", 30.0, 0.0, 0.0, None),
    ("short, shedding applies while a group is short", 160.0, 0.1, 0.6, None),
    ("tier rules: a pool serves half of standard and no critical", 30.0, 0.0, 0.0, "tiers"),
    ("the other group disaggregated: prefill and decode hops", 60.0, 0.0, 0.3, "pd"),
])
def test_a_part_scores_a_candidate_as_the_fleet_does(label, total, floor, shed, variant) -> None:
    layout = [("a", "8b-a100", 2), ("a", "8b-h100", 1), ("b", "70b-h100", 2), ("b", "70b-a100", 1)]
    prob, model = fleet(layout, total, shed_floor=floor)
    pools = list(prob.pools)
    if variant == "tiers":
        pools[1] = replace(pools[1], eligible=(("critical", 0.0), ("standard", 0.5)))
    if variant == "pd":
        pools[2], pools[3] = replace(pools[2], role="prefill"), replace(pools[3], role="decode")
    prob = replace(prob, pools=tuple(pools))
    cfg = MpcConfig()
    full = Evaluator(prob, model, cfg)
    full.need = np.full((4, full.H), 3.0)
    best = full.cur.tile(1)
    best.shed = np.array([[0.0, 0.0, shed]])
    rng = np.random.default_rng(3)
    cands = best.tile(24)
    cands.repl = cands.repl.copy()
    cands.pw, cands.cap, cands.tw = cands.pw.copy(), cands.cap.copy(), cands.tw.copy()
    a = np.array([0, 1])
    cands.repl[:, a, :] = rng.integers(1, 9, size=(24, 2, 1))
    cands.pw[:, a] = rng.uniform(0.0, 8.0, size=(24, 2))
    cands.cap[:, a] = rng.integers(16, 256, size=(24, 2))
    cands.tw[:, a] = rng.uniform(0.1, 1.0, size=(24, 2))
    J_full, _ = full.score(cands)
    parts = [PartEvaluator(full, [0, 1]), PartEvaluator(full, [2, 3])]
    sums = [parts[0].part(columns(best, parts[0].idx)), parts[1].part(columns(best, parts[1].idx))]
    parts[0].set_others(others_of(sums, 0))
    J_part, _ = parts[0].score(columns(cands, parts[0].idx))
    np.testing.assert_allclose(J_part, J_full, rtol=1e-9)
    assert np.ptp(J_full) > 0  # the rows differ: the check compares real scores
    # and a row written back into the fleet's plan scores the same there
    k = int(np.argmin(J_part))
    back = put_columns(best, columns(cands, parts[0].idx).take(np.array([k])), parts[0].idx)
    np.testing.assert_allclose(full.score(back)[0][0], J_full[k], rtol=1e-9)


SMALL = [("a", "8b-a100", 3), ("a", "8b-h100", 2), ("b", "70b-h100", 2), ("b", "70b-a100", 2)]


def _solve(prob, model, grouped: bool, seed: int = 0):
    cfg = MpcConfig(max_evaluations=10**7, group_search=grouped, group_search_min_pools=2)
    return solve(prob, model, cfg, np.random.default_rng(seed))


@pytest.mark.parametrize("total, same_plan", [(10.0, True), (60.0, False)])
def test_the_group_search_finds_the_complete_search_plan_on_a_small_coupled_fleet(total, same_plan) -> None:
    """Both searches are local: on this fleet at 10 req/s they end at the same plan; at 60 req/s at the
    same replicas ordered now, with levers of different quality: far past capacity the objective prices a
    request timing out as lost as well as late (score.py), and the complete search's split-with-delay move
    (search.py) finds a split that sheds where the group search, moving one group's levers at a time, stops
    short (its objective 11 % above the complete search's here; on main before that pricing it was 4.6 %
    below). Bounded at 15 % so that a regression of either search still shows."""
    prob, model = fleet(SMALL, total)
    grouped, complete = _solve(prob, model, True), _solve(prob, model, False)
    assert grouped.groups == (("p2", "p3"), ("p0", "p1")) and complete.groups == ()
    assert grouped.objective <= complete.objective * (1 + (1e-9 if same_plan else 0.15))
    if same_plan:
        assert grouped.plan == complete.plan
    # the replicas it orders now are the complete search's
    assert ({n: pp.replicas[0] for n, pp in grouped.plan.pools.items()}
            == {n: pp.replicas[0] for n, pp in complete.plan.pools.items()})
    assert grouped.objective < grouped.incumbent_objective


def test_the_group_search_is_deterministic_and_budgeted() -> None:
    prob, model = fleet(SMALL, 60.0)
    a, b = _solve(prob, model, True, seed=5), _solve(prob, model, True, seed=5)
    assert a.plan == b.plan and a.objective == b.objective and a.evaluations == b.evaluations
    cut = solve(prob, model, MpcConfig(max_evaluations=400, group_search_min_pools=2), np.random.default_rng(5))
    assert cut.budget_exhausted and cut.evaluations < a.evaluations
    assert cut.objective <= cut.incumbent_objective
