"""Slow replicas (controller/core/outliers.py): judged against the pool's median for their own load,
ejected after consecutive ticks within the pool's cap, ejection that expires (longer each time),
replacement within the guardrails; and through Controller.step into the decision.

Each case is a pool of 8B replicas on A100 (the perf table's figures), each replica reporting its mean
ITL and running batch. `healthy(batch)` is the ITL the figures give for that batch × 1.1 (what every
replica shares beyond the figures cancels in the comparison).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import pytest

from controller.core.guards import GuardConfig
from controller.core.outliers import (
    OutlierConfig,
    OutlierState,
    detect,
    expected_step_s,
    outlier_threshold,
    slowness_scores,
)
from controller.core.step import Controller, TickInput
from controller.perf.figures import figures_for
from controller.types import (
    Decision,
    FleetObservation,
    FleetSpec,
    Override,
    PoolDecision,
    PoolObservation,
    PoolSpec,
    Reading,
    ReplicaObservation,
    SloSpec,
)
from tests.fakes.core_policy import ScriptedPolicy

SPEC = PoolSpec("a", "llama-3-8b", "a100-80gb", min_replicas=1, max_replicas=16)
FLEET = FleetSpec(pools=(SPEC,), slos={"critical": SloSpec(1.0, 0.1), "standard": SloSpec(5.0, 0.15)})
FIG = figures_for(SPEC)
CTX = 1000.0 + 0.5 * 200.0  # the pool's rates below: 1,000 prompt and 200 output tokens a request


def healthy(batch: float) -> float:
    return 1.1 * expected_step_s(FIG, batch, CTX)


def pool(itl: Mapping[str, tuple[float, float]], draining: float = 0.0) -> PoolObservation:
    """itl: replica → (ITL multiple of healthy, running batch)."""
    reps = {r: ReplicaObservation(r, Reading(k * healthy(b)), Reading(b)) for r, (k, b) in itl.items()}
    return PoolObservation(pool="a", replicas_ready=Reading(float(len(itl))), arrival_rps=Reading(10.0),
                           prompt_tokens_rps=Reading(10_000.0), generation_tokens_rps=Reading(2_000.0),
                           replicas_draining=Reading(draining), replicas=reps)


def obs(t: float, p: PoolObservation) -> FleetObservation:
    return FleetObservation(at_s=t, pools={"a": p}, source="test")


def run(rows, cfg=None, guards=None, overrides=(), frozen=False, state=None):
    """rows: [(t, pool observation)] → (state, results per tick)."""
    cfg = cfg or OutlierConfig()
    state = state or OutlierState()
    out = []
    for t, p in rows:
        r = detect(state, cfg, FLEET, obs(t, p), t, guards=guards, overrides=overrides, telemetry_frozen=frozen)
        state = r.state
        out.append(r)
    return state, out


NOW = OutlierConfig(replace_after=1)  # replace on the first ejection (the default waits for a second)
FOUR: dict[str, tuple[float, float]] = {"r0": (1.0, 40), "r1": (1.0, 42), "r2": (1.0, 38), "r3": (2.0, 40)}


def test_scores_compare_each_replica_with_the_others_median_for_its_load():
    # r3 runs twice the batch and takes the step time that batch explains: not slow
    s = slowness_scores(SPEC, pool({"r0": (1.0, 20), "r1": (1.0, 22), "r2": (1.0, 21), "r3": (1.0, 60)}))
    assert max(s.values()) < 1.05 and min(s.values()) > 0.95, s
    # r3 takes twice what its batch explains: 2× the others' median
    s = slowness_scores(SPEC, pool(FOUR))
    assert s["r3"] == pytest.approx(2.0, rel=0.02) and s["r0"] == pytest.approx(1.0, rel=0.02)
    # two replicas: each against the other; one alone: no reference; an idle replica is not judged
    two = slowness_scores(SPEC, pool({"r0": (1.0, 40), "r1": (2.0, 40)}))
    assert two["r1"] == pytest.approx(2.0, rel=0.02) and two["r0"] == pytest.approx(0.5, rel=0.02)
    assert slowness_scores(SPEC, pool({"r0": (1.0, 40)})) == {}
    assert "r3" not in slowness_scores(SPEC, pool({**FOUR, "r3": (2.0, 0.5)}))


@pytest.mark.parametrize("label, rows, ejected_at, replaced", [
    ("one slow replica: ejected on its second tick as an outlier, replaced",
     [FOUR, FOUR, FOUR], [(), ("r3",), ("r3",)], [(), ("r3",), ()]),
    ("one noisy window is not enough",
     [FOUR, {**FOUR, "r3": (1.0, 40)}, FOUR], [(), (), ()], [(), (), ()]),
    ("just under the threshold: never ejected",
     [{**FOUR, "r3": (1.28, 40)}] * 3, [(), (), ()], [(), (), ()]),
])
def test_ejection_needs_consecutive_ticks(label, rows, ejected_at, replaced):
    _, res = run([(15.0 * (i + 1), pool(r)) for i, r in enumerate(rows)], NOW)
    assert [r.ejected.get("a", ()) for r in res] == ejected_at, label
    assert [r.replace.get("a", ()) for r in res] == replaced, label
    if any(ejected_at):
        first = next(r for r in res if r.ejected)
        (reason,) = [x for x in first.reasons if x.code == "slow_replica"]
        assert reason.pool == "a" and reason.data["replica"] == "r3" and reason.data["score"] > 1.9


def test_at_most_a_third_of_the_pool_is_ejected_at_once_and_never_the_last():
    two_slow = {**FOUR, "r2": (2.5, 40)}
    _, res = run([(15.0, pool(two_slow)), (30.0, pool(two_slow))])
    assert res[-1].ejected["a"] == ("r2",)  # the slowest first; 34 % of 4 is one
    assert [x.data["replica"] for x in res[-1].reasons if x.code == "slow_replica_not_ejected"] == ["r3"]
    # a pool of three: at most one, whatever the cap says
    three = {"r0": (1.0, 40), "r1": (3.0, 40), "r2": (3.0, 40)}
    _, res = run([(15.0, pool(three)), (30.0, pool(three))], OutlierConfig(max_ejection_frac=1.0))
    assert len(res[-1].ejected.get("a", ())) <= 2


def test_ejection_expires_and_lasts_longer_the_second_time():
    cfg = OutlierConfig(base_ejection_s=60.0, max_ejection_s=600.0, replace=False)
    rows = [(15.0 * (i + 1), pool(FOUR)) for i in range(2)]
    state, res = run(rows, cfg)
    assert res[-1].ejected == {"a": ("r3",)}  # ejected at 30 s until 90 s
    state, res = run([(75.0, pool(FOUR)), (90.0, pool(FOUR))], cfg, state=state)
    assert res[0].ejected == {"a": ("r3",)} and res[1].ejected == {}
    assert any(x.code == "slow_replica_restored" for x in res[1].reasons)
    # judged afresh from the tick it is back (90 s: one strike), so ejected again at 105 s, for twice as long
    state, res = run([(105.0, pool(FOUR))], cfg, state=state)
    (r,) = [x for x in res[0].reasons if x.code == "slow_replica"]
    assert r.data["ejected_s"] == 120.0 and r.data["times_ejected"] == 2


@pytest.mark.parametrize("label, guards, draining, overrides, frozen", [
    ("max_concurrent_drains reached by a drain in progress", GuardConfig(max_concurrent_drains=1), 1.0, (), False),
    ("max_step_down 0", GuardConfig(max_step_down=0), 0.0, (), False),
    ("the pool frozen by an override", GuardConfig(), 0.0,
     (Override("ov-1", "freeze", pool="a", created_s=0.0, expires_s=1e9),), False),
])
def test_replacement_never_exceeds_the_guardrails(label, guards, draining, overrides, frozen):
    rows = [(15.0, pool(FOUR, draining)), (30.0, pool(FOUR, draining))]
    _, res = run(rows, NOW, guards=guards, overrides=overrides, frozen=frozen)
    assert res[-1].ejected == {"a": ("r3",)}, label  # ejected (the router's lever) ...
    assert res[-1].replace == {}, label  # ... but not replaced
    assert any(x.code == "slow_replica_replace_held" for x in res[-1].reasons), label


def test_a_transient_slowdown_is_only_ejected_a_chronic_one_is_replaced():
    """Default: the first ejection (120 s) takes the traffic away; slow again once it is back, it is ejected a
    second time and replaced then. An ejected replica gets no traffic, so it reports no batch: not judged."""
    idle = {**FOUR, "r3": (2.0, 0.0)}
    rows = ([(15.0, pool(FOUR)), (30.0, pool(FOUR))] + [(30.0 + 15.0 * i, pool(idle)) for i in range(1, 8)]
            + [(150.0, pool(FOUR)), (165.0, pool(FOUR))])
    _, res = run(rows)
    assert [r.replace.get("a", ()) for r in res] == [()] * 10 + [("r3",)]
    assert res[1].ejected == {"a": ("r3",)} and res[9].ejected == {}  # expired at 150 s
    assert res[-1].ejected == {"a": ("r3",)}
    _, healed = run(rows[:9] + [(150.0, pool({**FOUR, "r3": (1.0, 40)})), (165.0, pool({**FOUR, "r3": (1.0, 40)}))])
    assert [r.replace for r in healed] == [{}] * 11 and healed[-1].ejected == {}


def test_frozen_telemetry_ejects_nobody_new():
    _, res = run([(15.0, pool(FOUR)), (30.0, pool(FOUR))], frozen=True)
    assert res[-1].ejected == {} and res[-1].replace == {}


def test_the_mpc_parameter_turns_it_on_and_only_the_mpc_has_it():
    from controller.policies.registry import build_policy, outliers_for

    assert outliers_for("mpc") == OutlierConfig()  # on by default (decision 0035)
    assert outliers_for("mpc", {"outliers": False}) is None
    assert outliers_for("mpc", {"outliers": {"threshold": 0.5}}) == OutlierConfig(threshold=0.5)
    assert outliers_for("hpa", {}) is None
    with pytest.raises(ValueError, match=r"policy mpc: outliers: unknown field\(s\) \['nope'\]"):
        build_policy("mpc", FLEET, {"outliers": {"nope": 1}})
    with pytest.raises(ValueError, match="policy hpa: unknown parameter"):
        build_policy("hpa", FLEET, {"outliers": True})


def test_bad_configuration_is_refused_by_name():
    for bad, msg in (({"threshold": 0.0}, "threshold must be > 0"), ({"consecutive": 0}, "consecutive"),
                     ({"replace_after": 0}, "replace_after"),
                     ({"max_ejection_frac": 1.5}, "max_ejection_frac"),
                     ({"base_ejection_s": 900.0}, "max_ejection_s")):
        with pytest.raises(ValueError, match=msg):
            OutlierConfig(**bad)


def test_the_decision_carries_the_ejection_and_the_replacement_once():
    c = Controller(FLEET, ScriptedPolicy({"a": 4}), outliers=NOW)
    s = c.initial_state()
    decisions = []
    for t in (15.0, 30.0, 45.0):
        s, r = c.step(s, TickInput(now_s=t, observation=obs(t, pool(FOUR))))
        assert r.decision is not None
        decisions.append(r.decision.pools["a"])
    assert [(d.ejected, d.replace) for d in decisions] == [((), ()), (("r3",), ("r3",)), (("r3",), ())]
    assert r.diagnostics["outliers"]["ejected"] == {"a": ["r3"]}
    assert r.diagnostics["outliers"]["scores"]["a"]["r3"] > 1.9
    plain = Controller(FLEET, ScriptedPolicy({"a": 4}))
    _, r2 = plain.step(plain.initial_state(), TickInput(now_s=30.0, observation=obs(30.0, pool(FOUR))))
    assert r2.decision is not None and r2.decision.pools["a"].ejected == ()  # a controller without it: off
    assert "outliers" not in r2.diagnostics


def test_the_controller_judges_on_the_engine_figures_it_is_given_not_the_policys():
    # figures whose per-sequence cost dwarfs the fixed cost: the replicas' batches (38-42) then explain
    # more of their step times than FIG's do, so the scores move; the Controller judges on what it is given
    own = replace(FIG, a_s=FIG.a_s * 0.01, b_s_per_seq=FIG.b_s_per_seq * 50.0)
    p = pool(FOUR)
    given = Controller(FLEET, ScriptedPolicy({"a": 4}), outliers=NOW, engine_figures={"a": own})
    _, r = given.step(given.initial_state(), TickInput(now_s=15.0, observation=obs(15.0, p)))
    default = Controller(FLEET, ScriptedPolicy({"a": 4}), outliers=NOW)
    _, r0 = default.step(default.initial_state(), TickInput(now_s=15.0, observation=obs(15.0, p)))
    want = {k: round(v, 3) for k, v in slowness_scores(SPEC, p, NOW.min_batch, own).items()}
    assert r.diagnostics["outliers"]["scores"]["a"] == want
    assert r0.diagnostics["outliers"]["scores"]["a"] == {k: round(v, 3) for k, v in slowness_scores(SPEC, p).items()}
    assert want != r0.diagnostics["outliers"]["scores"]["a"]


def test_explain_names_the_slow_replica():
    c = Controller(FLEET, ScriptedPolicy({"a": 4}), outliers=NOW)
    s = c.initial_state()
    for t in (15.0, 30.0):
        s, r = c.step(s, TickInput(now_s=t, observation=obs(t, pool(FOUR))))
    assert "because slow_replica: r3: steps 2.00× slower" in r.explanation
    # nothing else of the decision moved: the same policy without detection decides the rest alike
    plain = Controller(FLEET, ScriptedPolicy({"a": 4}))
    s2 = plain.initial_state()
    for t in (15.0, 30.0):
        s2, r2 = plain.step(s2, TickInput(now_s=t, observation=obs(t, pool(FOUR))))
    assert r.decision is not None and r2.decision is not None
    assert replace(r.decision.pools["a"], ejected=(), replace=()) == r2.decision.pools["a"]


def test_a_replacement_we_ordered_is_not_a_replica_lost_for_the_breaker():
    from controller.core.step import _less_ordered
    from controller.types import BreakerSignals

    state, _ = run([(15.0, pool(FOUR)), (30.0, pool(FOUR))], NOW)  # r3 replaced at 30 s
    lost = BreakerSignals(lost={"a": 2}, carried=True)
    # within the pool's cold start-up (default 180 s): one of the two is ours
    assert _less_ordered(lost, state, FLEET, 45.0).lost == {"a": 1}
    assert _less_ordered(lost, state, FLEET, 30.0 + SPEC.startup_cold_s + 1.0).lost == {"a": 2}
    assert _less_ordered(BreakerSignals(), state, FLEET, 45.0) == BreakerSignals()


# --------------------------------------------------------------------------- load, not slowness; what matters


def test_a_pool_wide_slowdown_ejects_nobody():
    """A load surge, or a cost the figures miss that every replica shares: every replica's steps run 2.5× what
    its batch explains, at batches from 40 to 120. Compared with each other (like with like, each for its own
    batch) none is an outlier, over as many ticks as it lasts."""
    surge = {"r0": (2.5, 40), "r1": (2.6, 80), "r2": (2.4, 120), "r3": (2.5, 60)}
    _, res = run([(15.0 * (i + 1), pool(surge)) for i in range(6)])
    assert all(r.ejected == {} for r in res)
    assert not any(x.code.startswith("slow_replica") for r in res for x in r.reasons)
    assert max(res[-1].scores["a"].values()) < 1.1


def test_a_slower_replica_whose_requests_keep_their_tpot_is_left_alone():
    """2× slower than its peers, but at a batch of 8 its steps take ~32 ms, under half of critical's 100 ms TPOT
    SLO (a pool's TPOT p95 runs about twice its mean step): its requests make their SLO; ejecting it would only
    take capacity. At a batch of 40 the same slowness costs them their TPOT (~68 ms steps): ejected."""
    light = {"r0": (1.0, 8), "r1": (1.0, 8), "r2": (1.0, 8), "r3": (2.0, 8)}
    assert 2.0 * healthy(8) < 0.05 < 2.0 * healthy(40)
    _, res = run([(15.0 * (i + 1), pool(light)) for i in range(4)], NOW)
    assert all(r.ejected == {} for r in res) and res[-1].scores["a"]["r3"] > 1.9
    _, res = run([(15.0 * (i + 1), pool(FOUR)) for i in range(2)], NOW)
    assert res[-1].ejected == {"a": ("r3",)}


def test_outliers_over_the_cap_serve_on_but_count_as_capacity_the_pool_does_not_have():
    """Two slow replicas of four: the cap (34 %) ejects the slower; the other keeps serving, its requests still
    late, so the policy plans the pool without either: two replicas out of service, two slots on the target."""
    two_slow = {**FOUR, "r2": (2.5, 40)}
    _, res = run([(15.0, pool(two_slow)), (30.0, pool(two_slow))])
    assert res[-1].ejected == {"a": ("r2",)}
    assert res[-1].out_of_service == {"a": 2} and res[-1].in_target == {"a": 2}
    assert res[0].out_of_service == {} and res[0].in_target == {}  # one tick as an outlier is not enough


def test_two_slow_of_three_the_ejected_one_is_no_reference():
    """Two of three replicas slow (3.2× and 2.2×): the worse holds the other's reference up (the median of the
    other two is halfway), so only the worse is ejected first; from then on the other is judged against the
    healthy one alone and ejected too (max_ejection_frac 1: the cap is not what this pins)."""
    three = {"r0": (1.0, 30), "r1": (3.2, 30), "r2": (2.2, 30)}
    s = slowness_scores(SPEC, pool(three))
    assert s["r2"] < 1.3 < s["r1"]
    assert slowness_scores(SPEC, pool(three), exclude=frozenset({"r1"}))["r2"] == pytest.approx(2.2, rel=0.02)
    cfg = OutlierConfig(max_ejection_frac=1.0)
    _, res = run([(15.0 * (i + 1), pool(three)) for i in range(4)], cfg)
    assert [r.ejected.get("a", ()) for r in res] == [(), ("r1",), ("r1",), ("r1", "r2")]


def test_an_ejected_replica_is_capacity_the_policy_does_not_have():
    """While r3 is ejected (not replaced: the default waits for a second ejection) the policy plans the pool
    without it: 3 ready, the target in force 3, max_replicas 15; it asks for 4 to take the traffic and the
    decision's target is 5, r3 holding its slot. Once r3 is replaced, its successor is in the target: no slot
    on top, and the telemetry's ready count (which still counts r3 while it drains) is less r3 alone."""
    policy = ScriptedPolicy({"a": 4})
    c = Controller(FLEET, policy, outliers=OutlierConfig())
    s = c.initial_state(current=Decision("d-0", 0, 0.0, 1e9, {"a": PoolDecision(replicas=4)}))
    targets = []
    for t in (15.0, 30.0, 45.0):
        s, r = c.step(s, TickInput(now_s=t, observation=obs(t, pool(FOUR))))
        assert r.decision is not None
        targets.append(r.decision.pools["a"].replicas)
    assert targets == [4, 5, 5]
    seen = policy.seen[-1]
    assert seen.observation.pools["a"].replicas_ready.value == 3.0
    assert seen.current is not None and seen.current.pools["a"].replicas == 4  # 5 in force, r3's slot off
    assert seen.fleet.pool("a").max_replicas == SPEC.max_replicas - 1
    assert seen.estimate is not None and seen.estimate.pools["a"].ejected == 1
    assert r.estimate.observation.pools["a"].replicas_ready.value == 4.0  # the core's own view is the fleet's
    assert r.diagnostics["outliers"]["planned_without"] == {"a": 1}
    replaced = Controller(FLEET, ScriptedPolicy({"a": 4}), outliers=NOW)
    s = replaced.initial_state()
    for t in (15.0, 30.0, 45.0):
        s, r = replaced.step(s, TickInput(now_s=t, observation=obs(t, pool(FOUR))))
    assert r.decision is not None and r.decision.pools["a"].replicas == 4
    assert r.diagnostics["outliers"]["planned_without"] == {}


def test_the_threshold_widens_for_a_reference_of_few_replicas():
    """The median of m others is as noisy as the replica judged: 0.3 · √(1 + π/(2m)). Two replicas at the same
    batch, one stepping 1.34× the other (tiers-crash's two overloaded 70B replicas after its crash): within what
    two healthy replicas differ by, not ejected; 1.6×: ejected."""
    assert [round(outlier_threshold(OutlierConfig(), m), 2) for m in (1, 2, 3, 7)] == [0.48, 0.4, 0.37, 0.33]
    pair = {"r0": (1.0, 60), "r1": (1.34, 60)}
    _, res = run([(15.0 * (i + 1), pool(pair)) for i in range(3)])
    assert all(r.ejected == {} for r in res)
    _, res = run([(15.0 * (i + 1), pool({**pair, "r1": (1.6, 60)})) for i in range(2)])
    assert res[-1].ejected == {"a": ("r1",)}
