"""The MPC policy adapter: registry, closed loops on synthetic telemetry, profiles, breaker, explanation."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from controller.core.breaker import BreakerState, advance_breaker, breaker_reasons
from controller.core.estimate import account_fleet, carried
from controller.core.guards import GuardConfig
from controller.core.step import Controller, TickInput
from controller.policies import ReplicaCapacity, build_policy
from controller.policies.mpc import MpcPolicy
from controller.policies.mpc.first_step import down_window_s
from controller.policies.mpc.plan_inputs import redundancy_floor, split_floors
from controller.policies.registry import breaker_for
from controller.types import (
    MISSING,
    BreakerSignals,
    ClassObservation,
    Decision,
    FleetEstimate,
    FleetObservation,
    PolicyInput,
    PolicyOutput,
    PoolDecision,
    PoolObservation,
    Reading,
)
from tests.policies.builders import fleet, inp, obs_row, spec

FL = fleet(spec("p", model="llama-3-70b", sku="h100-80gb", gpus_per_replica=4, usd_per_replica_hour=49.16,
                min_replicas=1, max_replicas=16, startup_warm_s=60.0, startup_cold_s=300.0))
FAST: dict[str, Any] = {"max_evaluations": 300}  # the MpcPolicy keywords every test shares


def pool_signals(rps: float, ready: int, *, starting: int = 0, hit: float = 0.3, tpot: float | None = None,
                 ttft: float | None = None, waiting: float = 0.0) -> dict:
    per = rps / max(ready, 1)
    return dict(ready=ready, starting=starting, rps=rps, prompt=rps * 1100.0, gen=rps * 210.0, hit_rate=hit,
                tpot=tpot if tpot is not None else 0.05 + 0.008 * per,
                ttft=ttft if ttft is not None else 0.3 + 0.05 * per,
                waiting=waiting, running=per * 15 * ready, kv=0.2)


def braked(pol, state, bstate: BreakerState, i: PolicyInput, rng) -> tuple[Any, BreakerState, PolicyOutput]:
    """One decision with the breaker stage in front of it, as Controller.step runs it (no guards): the
    output carries the breaker's reasons and status as a step's result would."""
    # the breaker reads the core's estimate (as Controller.step builds it; the policy advances the same one)
    est = account_fleet(FleetEstimate(at_s=i.now_s, observation=i.observation), state.estimate, i.fleet, i.current,
                        pol.estimator())
    signals = BreakerSignals(lost={p: a.unordered for p, a in est.pools.items()}, carried=est.carried)
    cfg = breaker_for("mpc")
    assert cfg is not None
    bstate, action, notes = advance_breaker(bstate, cfg, i, signals)
    state, out = pol.decide(state, replace(i, breaker=action), rng)
    return state, bstate, replace(out, reasons=breaker_reasons(notes, bstate) + out.reasons,
                                  diagnostics={**out.diagnostics, "breaker": bstate.status().to_dict()})


def loop(pol, series, start: int = 4, profile: str = "balanced"):
    """series: list of (rps, ready override or None); ready follows the decision (instant) unless given.
    Returns (policy state, outputs, breaker state)."""
    state, current, outs = pol.initial_state(), None, []
    bstate = BreakerState()
    replicas = start
    for k, (rps, ready) in enumerate(series):
        t = 15.0 * (k + 1)
        i = inp(t, {"p": pool_signals(rps, ready if ready is not None else replicas)}, fl=FL,
                current=current if current is not None else {"p": start})
        i = replace(i, profile=profile)
        state, bstate, out = braked(pol, state, bstate, i, np.random.default_rng(k))
        outs.append(out)
        replicas = out.pools["p"].replicas
        current = Decision(decision_id=f"d-{k}", generation=k, at_s=t, valid_until_s=t + 120, pools=dict(out.pools),
                           admission=dict(out.admission))
    return state, outs, bstate


def test_registry_builds_mpc_and_checks_its_parameters():
    pol = build_policy("mpc", FL, {"weights": {"risk_weight": 50}, "planner": {"terminal_steps": 2}})
    assert isinstance(pol, MpcPolicy)
    assert pol.name == "mpc" and pol.config.terminal_steps == 2
    cases: list[tuple[dict[str, Any], str]] = [
        ({"weights": {"bogus": 1}}, "unknown field"), ({"planner": {"nope": 1}}, "unknown field"),
        ({"breaker": {"loss_frac": 3}}, "loss_frac"), ({"scale_down_stabilization_s": -1}, "must be"),
        ({"engine_figures": {"p": {"a_s": 0}}}, "missing field"),
        ({"planning_model": "magic"}, "planning_model must be one of prior, learned"),
        ({"planning_model": "learned"}, "needs the learned coupling models"),
        ({"min_serving_replicas": 0}, "min_serving_replicas must be an integer >= 1"),
        ({"min_serving_replicas": True}, "min_serving_replicas must be an integer >= 1")]
    for params, msg in cases:
        with pytest.raises(ValueError, match=msg):
            build_policy("mpc", FL, params)


def test_surplus_scales_down_only_after_stabilisation():
    pol = MpcPolicy(scale_down_stabilization_s=120.0, min_history_s=60.0, **FAST)
    series = [(30.0, None)] * 24 + [(8.0, None)] * 24  # 6 minutes busy, then a sustained drop
    _, outs, _ = loop(pol, series, start=8)
    reps = [o.pools["p"].replicas for o in outs]
    drop = 24
    assert min(reps[drop:drop + 7]) == reps[drop - 1]  # held for the window (120 s = 8 ticks, 1 tick of telemetry lag)
    assert reps[-1] < reps[drop - 1]  # then down
    held = [r.code for o in outs[drop:drop + 8] for r in o.reasons]
    assert "scale_down_stabilised" in held
    assert any(r.code == "mpc_scale_down" for o in outs[drop:] for r in o.reasons)


@pytest.mark.parametrize("label,min_serving,final,floor_reason", [
    ("default: two replicas, one can fail", None, 2, True),
    ("floor off: the load's one replica", 1, 1, False),
])
def test_light_load_keeps_the_redundancy_floor(label, min_serving, final, floor_reason):
    extra = {} if min_serving is None else {"min_serving_replicas": min_serving}
    pol = MpcPolicy(scale_down_stabilization_s=60.0, min_history_s=60.0, **FAST, **extra)
    _, outs, _ = loop(pol, [(1.0, None)] * 40, start=4)  # 1 req/s on a 70B pool: one replica's load
    assert outs[-1].pools["p"].replicas == final, label
    codes = {r.code for r in outs[-1].reasons}
    assert ("redundancy_floor" in codes) == floor_reason, (label, codes)


@pytest.mark.parametrize("label,arrivals,max_replicas,expect", [
    ("traffic: the floor", 3.0, 8, 2),
    ("no traffic: no floor (scale to zero stays possible)", 0.0, 8, None),
    ("the pool's maximum wins", 3.0, 1, 1),
])
def test_redundancy_floor_rule(label, arrivals, max_replicas, expect):
    sp = spec("p", max_replicas=max_replicas)
    po = PoolObservation(pool="p", arrival_rps=Reading(arrivals))
    assert redundancy_floor(sp, po, 2) == expect, label
    assert redundancy_floor(sp, po, 1) is None, label  # 1 turns it off
    assert redundancy_floor(sp, None, 2) is None, label  # no reading: no floor (the feedback and breaker have theirs)


def test_redundancy_floor_is_a_plan_bound_only_where_the_hop_has_one_pool():
    fl = fleet(spec("a100"), spec("h100", sku="h100-80gb"), spec("solo", group="g2"),
               spec("pre", group="g3", role="prefill"), spec("dec", group="g3", role="decode"))
    floors = {"a100": 2, "h100": 2, "solo": 2, "pre": 2, "dec": 2}
    assert split_floors(fl, floors) == ({"solo": 2, "pre": 2, "dec": 2}, {"a100": 2, "h100": 2})


def test_pools_sharing_a_hop_never_carry_traffic_on_one_replica():
    # two pools of one route group: the plan may move the light load to one of them and release the
    # other, but a pool it still sends traffic to is decided at two replicas at least
    fl = fleet(spec("a100", min_replicas=0, max_replicas=8, usd_per_replica_hour=4.0),
               spec("h100", sku="h100-80gb", min_replicas=0, max_replicas=8, usd_per_replica_hour=12.0))
    pol = MpcPolicy(scale_down_stabilization_s=60.0, min_history_s=60.0, **FAST)
    state, current = pol.initial_state(), None
    replicas = {"a100": 3, "h100": 3}
    weights = {"a100": 1.0, "h100": 1.0}
    for k in range(40):
        t = 15.0 * (k + 1)
        total = sum(weights.values()) or 1.0
        rows = {n: pool_signals(2.0 * weights[n] / total, replicas[n], tpot=0.012, ttft=0.08) for n in replicas}
        i = inp(t, rows, fl=fl, current=current if current is not None else dict(replicas))
        state, out = pol.decide(state, i, np.random.default_rng(k))
        for n, d in out.pools.items():
            assert d.traffic_weight <= 0 or d.replicas >= 2, (k, n, d)
        replicas = {n: d.replicas for n, d in out.pools.items()}
        weights = {n: d.traffic_weight for n, d in out.pools.items()}
        current = Decision(decision_id=f"d-{k}", generation=k, at_s=t, valid_until_s=t + 120, pools=dict(out.pools),
                           admission=dict(out.admission))
    assert sum(d.traffic_weight for d in out.pools.values()) > 0
    assert sum(replicas.values()) < 6  # the light load was not held at the start's six replicas


def test_rising_load_scales_up_with_an_explanation():
    pol = MpcPolicy(**FAST)
    series = [(12.0 + 1.5 * k, 4) for k in range(14)]  # rising 1.5 req/s per tick, replicas still starting
    _, outs, _ = loop(pol, series, start=4)
    up = [r for o in outs for r in o.reasons if r.code in ("mpc_scale_up", "mpc_scale_up_early")]
    assert up, [r.code for o in outs for r in o.reasons]
    d = outs[-1].diagnostics
    for key in ("forecast", "plan", "predicted", "binding_constraints", "objective", "pools"):
        assert key in d
    assert 0.0 <= outs[-1].confidence <= 1.0  # a typed field, read by the low-confidence guard
    assert d["forecast"]["p90_rps"][-1] >= d["forecast"]["p50_rps"][-1]
    assert "cost_per_success_usd" in d["predicted"] and "late_or_shed_frac_p90" in d["predicted"]


def test_profile_at_run_time_moves_the_cost_latency_point():
    series = [(24.0, None)] * 16
    _, cost, _ = loop(MpcPolicy(**FAST), series, start=8, profile="cost")
    _, lat, _ = loop(MpcPolicy(**FAST), series, start=8, profile="latency")
    assert lat[-1].pools["p"].replicas >= cost[-1].pools["p"].replicas
    assert sum(o.pools["p"].replicas for o in lat) > sum(o.pools["p"].replicas for o in cost)


def test_crash_trips_the_breaker_and_sheds_sheddable_first():
    pol = MpcPolicy(**FAST)
    series = [(25.0, None)] * 12
    state, outs, bstate = loop(pol, series, start=8)
    cur = Decision("d", 1, 180.0, 300.0, pools=dict(outs[-1].pools))
    n = outs[-1].pools["p"].replicas
    crash = dict(pool_signals(25.0, n - 3, starting=3, hit=0.1, tpot=0.16, ttft=3.5, waiting=40.0))
    classes = {c: ClassObservation(priority_class=c, arrival_rps=Reading(25.0 * s), retry_rps=Reading(0.0),
                                   shed_rps=Reading(0.0), ttft_p95_s=Reading(3.5), tpot_p95_s=Reading(0.16))
               for c, s in (("critical", 0.2), ("standard", 0.6), ("sheddable", 0.2))}
    i = inp(195.0, {"p": crash}, fl=FL, current=cur)
    i = replace(i, observation=FleetObservation(at_s=195.0, pools=i.observation.pools, classes=classes))
    state, bstate, out = braked(pol, state, bstate, i, np.random.default_rng(0))
    b = out.diagnostics["breaker"]
    assert b["phase"] == "open" and "replica loss" in b["trigger"]
    assert out.pools["p"].replicas >= n  # replacements, never a scale-down
    assert out.admission["sheddable"].shed_frac >= 0.5
    assert out.admission.get("critical") is None or out.admission["critical"].shed_frac == 0.0
    assert out.pools["p"].inflight_cap > 0  # running streams protected
    assert any(r.code == "breaker_open" for r in out.reasons)


def test_capacity_profile_seeds_the_corrections():
    cap = ReplicaCapacity(rps=4.0, prompt_tokens_per_s=4400.0, generation_tokens_per_s=840.0,
                          profile_rps=(1.0, 2.0, 3.0, 4.0), profile_ttft_s=(1.0, 1.2, 1.5, 2.0),
                          profile_tpot_s=(0.08, 0.09, 0.1, 0.12))
    seeded = MpcPolicy(capacity={"p": cap}, **FAST)._prior(FL)
    plain = MpcPolicy(**FAST)._prior(FL)
    assert seeded.ttft_correction[0] > 1.5 and seeded.tpot_correction[0] > 1.0
    assert plain.ttft_correction == (1.0,)


def test_low_confidence_guard_holds_through_the_controller():
    """The Controller passes the policy's confidence to the guards: early on (prior only) a scale-down is held."""
    pol = MpcPolicy(min_history_s=0.0, warmup_s=0.0, **FAST)
    ctl = Controller(FL, pol, guards=GuardConfig(min_confidence=0.95))
    st = ctl.initial_state(current=Decision("d0", 0, 0.0, 120.0, pools={"p": PoolDecision(10)}))
    seen = set()
    for t in (15.0, 30.0, 45.0):
        obs = FleetObservation(at_s=t, pools={"p": obs_row("p", **pool_signals(5.0, 10))})
        st, res = ctl.step(st, TickInput(now_s=t, observation=obs))
        assert res.decision is not None
        assert res.decision.pools["p"].replicas == 10
        seen |= {r.code for r in res.guard_adjustments}
    assert "guard_low_confidence_hold" in seen
    assert res.diagnostics["confidence"] < 0.95


def test_missing_telemetry_is_not_a_reason_to_scale_down():
    pol = MpcPolicy(**FAST)
    state, outs, _ = loop(pol, [(20.0, None)] * 6, start=6)
    cur = Decision("d", 1, 90.0, 200.0, pools=dict(outs[-1].pools))
    i = PolicyInput(now_s=105.0, observation=FleetObservation(at_s=105.0, pools={}), fleet=FL, current=cur)
    _, out = pol.decide(state, i, np.random.default_rng(0))
    assert out.pools["p"].replicas >= outs[-1].pools["p"].replicas


@pytest.mark.parametrize("label,samples,expect_s", [
    ("bursts with silence between", (2, 2, 30, 2, 2, 2, 28, 2), 420.0),
    ("smooth chat-like load", (20, 22, 21, 19, 20, 21), 120.0),
    ("one level shift (a falling load)", (30,) * 8 + (8,) * 8, 120.0),
    ("too few samples to tell", (2, 30, 2), 120.0),
    ("no demand", (0, 0, 0, 0, 0), 120.0),
])
def test_scale_down_window_stretches_only_for_bursty_demand(label, samples, expect_s):
    t = tuple(15.0 * k for k in range(len(samples)))
    got = down_window_s(t, tuple(float(x) for x in samples), t[-1] + 15.0, 120.0, 420.0)
    assert got == pytest.approx(expect_s), label


def test_scale_down_window_ignores_samples_older_than_its_window():
    t = tuple(15.0 * k for k in range(80))  # bursty for the first 10 minutes, smooth for the last 10
    y = tuple(30.0 if (k < 40 and k % 4 == 0) else 10.0 for k in range(80))
    assert down_window_s(t[:40], y[:40], 600.0, 120.0, 420.0) == pytest.approx(420.0)
    assert down_window_s(t, y, 1200.0, 120.0, 420.0) == pytest.approx(120.0)


def test_bursty_demand_holds_replicas_between_bursts():
    """Bursts of 40 req/s (30 s) every 3 minutes over 3 req/s: a replica ordered at a burst arrives after it,
    so the policy keeps the burst's replicas through the gaps when the bursty window is on, and lets
    them go within the base window when it is off."""
    series = ([(40.0, None)] * 2 + [(3.0, None)] * 10) * 5
    kw: dict[str, Any] = dict(scale_down_stabilization_s=60.0, min_history_s=60.0, warmup_s=0.0, **FAST)
    _, on, _ = loop(MpcPolicy(bursty_down_window_s=300.0, **kw), series, start=6)
    _, off, _ = loop(MpcPolicy(bursty_down_window_s=60.0, **kw), series, start=6)
    gaps = [k for k in range(24, len(series)) if k % 12 >= 6]  # late in each gap, after the first two cycles
    held_on = np.mean([on[k].pools["p"].replicas for k in gaps])
    held_off = np.mean([off[k].pools["p"].replicas for k in gaps])
    assert held_on > held_off, (held_on, held_off)
    windows = [r.data.get("window_s") for o in on for r in o.reasons if r.code == "scale_down_stabilised"]
    assert windows and max(windows) > 60.0


def test_ttft_correction_learns_from_the_pool_not_the_worst_class():
    """Sheddable waits behind the others in the priority queue (14 s p95) while the pool's p95 is 0.4 s:
    the TTFT correction follows the pool's p95 (what the model predicts), so critical is not planned
    as if it waited like sheddable."""
    pol = MpcPolicy(min_history_s=0.0, warmup_s=0.0, **FAST)
    state = pol.initial_state()
    current: dict[str, int] | Decision = {"p": 8}
    classes = {c: ClassObservation(priority_class=c, arrival_rps=Reading(20.0 * s), retry_rps=Reading(0.0),
                                   shed_rps=Reading(0.0), ttft_p95_s=Reading(t), tpot_p95_s=Reading(0.06))
               for c, s, t in (("critical", 0.2, 0.3), ("standard", 0.6, 0.5), ("sheddable", 0.2, 14.0))}
    for k in range(12):
        t = 15.0 * (k + 1)
        i = inp(t, {"p": pool_signals(20.0, 8, ttft=0.4)}, fl=FL, current=current)
        i = replace(i, observation=FleetObservation(at_s=t, pools=i.observation.pools, classes=classes))
        state, out = pol.decide(state, i, np.random.default_rng(k))
        current = Decision(f"d-{k}", k, t, t + 120, pools=dict(out.pools))
    k_ttft = out.diagnostics["model"]["corrections"]["p"]["k_ttft"]
    assert k_ttft < 2.0, k_ttft


def _corrections_at_8_replicas(ticks: int, signals, classes=None) -> dict:
    """The pool's learned corrections after `ticks` ticks of telemetry signals(k) (and class readings
    classes(k)), the fleet held at 8 replicas whatever the policy decides."""
    pol = MpcPolicy(min_history_s=0.0, warmup_s=0.0, **FAST)
    state = pol.initial_state()
    current: dict[str, int] | Decision = {"p": 8}
    for k in range(ticks):
        t = 15.0 * (k + 1)
        i = inp(t, {"p": signals(k)}, fl=FL, current=current)
        if classes is not None:
            i = replace(i, observation=FleetObservation(at_s=t, pools=i.observation.pools, classes=classes(k)))
        state, out = pol.decide(state, i, np.random.default_rng(k))
        current = Decision(f"d-{k}", k, t, t + 120, pools={"p": replace(out.pools["p"], replicas=8)})
    return out.diagnostics["model"]["corrections"]["p"]


@pytest.mark.parametrize("label,waiting,k_range", [
    # a window whose p95 TTFT carries a standing queue (30 waiting on 8 replicas): the wait is the
    # planner's own backlog term, so the factor does not learn it a second time
    ("standing queue: not learned", 30.0, (0.85, 1.15)),
    # the same p95 with no queue is the model's own error: learned
    ("no queue: learned", 0.0, (1.6, 10.0)),
])
def test_ttft_correction_learns_only_from_windows_without_a_standing_queue(label, waiting, k_range):
    c = _corrections_at_8_replicas(16, lambda k: pool_signals(12.0, 8, ttft=4.0, waiting=waiting))
    assert k_range[0] <= c["k_ttft"] <= k_range[1], (label, c)


def _classes(rps: float, ttft: float, tpot: float) -> dict:
    return {c: ClassObservation(priority_class=c, arrival_rps=Reading(rps * s), retry_rps=Reading(0.0),
                                shed_rps=Reading(0.0), ttft_p95_s=Reading(ttft), tpot_p95_s=Reading(tpot))
            for c, s in (("critical", 0.2), ("standard", 0.6), ("sheddable", 0.2))}


@pytest.mark.parametrize("label,first_tpot,k_range", [
    # 0.30 s p95 is 6 × what smooth arrivals explain: a burst regime is learned (burst ≈ 3 s); then
    # 0.07 s (1.4 × smooth) is below what the remembered burst term predicts, so k stays at 1
    ("after a burst: the burst term explains the p95, k stays 1", 0.30, (0.95, 1.05)),
    # no burst ever: ~1.4 × smooth is the model's error, and k learns it (None: k ≈ observed / smooth)
    ("no burst: k learns observed / smooth", 0.07, None),
])
def test_tpot_correction_carries_only_what_the_burst_term_does_not_explain(label, first_tpot, k_range):
    c = _corrections_at_8_replicas(36, lambda k: pool_signals(12.0, 8, ttft=0.4),
                                   lambda k: _classes(12.0, 0.4, first_tpot if k < 12 else 0.07))
    if k_range is None:
        assert c["tpot_obs_over_smooth"] > 1.2, (label, c)
        assert c["k_tpot"] == pytest.approx(c["tpot_obs_over_smooth"], rel=0.03), (label, c)
    else:
        assert k_range[0] <= c["k_tpot"] <= k_range[1], (label, c)
    assert (c["burst"] > 0) == (first_tpot > 0.1), (label, c)


def _crash_stream_cap(waiting: float, **extra: float) -> tuple[int | None, MpcPolicy]:
    """The in-flight ceiling the breaker's stream protection sets on a 70B pool after a crash: 5 ready
    running 98 streams each (490), 3 starting, `waiting` in the engines; `extra` signals added."""
    from controller.core.forecast import LoadForecast
    from controller.core.objective import resolve_weights
    from controller.policies.mpc.memory import MpcPoolMemory
    from controller.policies.mpc.plan_inputs import build_problem
    from controller.types import BreakerAction

    pol = MpcPolicy(**FAST)
    sig = dict(pool_signals(25.0, 5, starting=3, hit=0.1, tpot=0.16, ttft=1.0, waiting=waiting))
    sig["running"] = 490.0
    sig.update(extra)
    i = inp(600.0, {"p": sig}, fl=FL, current={"p": 8})
    mem = {"p": MpcPoolMemory(prompt_tokens=1100.0, output_tokens=210.0)}
    lead = np.arange(10) * 30.0 + 15.0
    fc = LoadForecast(lead, np.full(10, 25.0), np.full(10, 28.0), 25.0, 0.0)
    action = BreakerAction(protect_streams=True, pools=("p",))
    prob = build_problem(i, FL, mem, {"p": 8}, {"critical": 0.2, "standard": 0.6, "sheddable": 0.2}, fc,
                         resolve_weights("balanced"), action, pol._prior(FL), 600.0, 600.0,
                         min_history_s=pol.min_history_s, batch_review_s=pol.batch_review_s, protect_streams=True)
    return prob.pools[0].max_inflight_cap, pol


@pytest.mark.parametrize("label,waiting,cap_at_least_held", [
    # a shallow engine queue: the streams running are what the cap protects, so it bites at once
    ("shallow engine queue: the SLO-safe batch at once", 3.0, False),
    # a deep engine queue of older work: a cap below it would lock critical out at the router
    ("deep engine queue: never below what the replicas hold", 60.0, True),
])
def test_breaker_stream_cap_bites_unless_the_engine_queue_is_deep(label, waiting, cap_at_least_held):
    ready, running = 5, 490.0  # 98 per replica after the crash
    cap, _ = _crash_stream_cap(waiting)
    held = (running + waiting) / ready
    assert cap is not None and cap >= 8
    assert (cap >= held) == cap_at_least_held, (label, cap, held)


@pytest.mark.parametrize("label,request_tpot,cap_at_least_running", [
    # streams on pace at 98 per replica (p95 0.08 s within 90 % of critical's 0.1 s): that batch is safe
    ("streams on pace: the cap is never below the batch they run at", 0.08, True),
    # streams over the target: what they run at is no evidence, the model's safe batch caps them
    ("streams late: the model's safe batch", 0.095, False),
    ("no TPOT reading: the model's safe batch", None, False),
])
def test_breaker_stream_cap_is_never_below_a_batch_seen_on_pace(label, request_tpot, cap_at_least_running):
    from controller.policies.mpc.memory import MpcPoolMemory
    from controller.policies.mpc.plan_inputs import safe_batch

    extra = {} if request_tpot is None else {"request_tpot_p95_s": request_tpot}
    cap, pol = _crash_stream_cap(3.0, **extra)
    model_cap = safe_batch(pol._prior(FL), 0, MpcPoolMemory(prompt_tokens=1100.0, output_tokens=210.0), FL.pools[0],
                           0.1, 0.1)
    assert model_cap < 490.0 / 5  # the model alone would cap below what the replicas run
    assert cap == (98 if cap_at_least_running else model_cap), (label, cap, model_cap)


def test_seen_safe_batch_reads_the_batch_only_while_streams_are_on_pace():
    from controller.policies.mpc.plan_inputs import seen_safe_batch

    def po(tpot, running):
        return PoolObservation("p", running=Reading(running) if running is not None else MISSING,
                               request_tpot_p95_s=Reading(tpot) if tpot is not None else MISSING)

    assert seen_safe_batch(po(0.05, 100.0), 3, 0.1) == 34  # ceil(33.3): on pace at 33.3 per replica
    assert seen_safe_batch(po(0.09, 100.0), 3, 0.1) == 34  # exactly at 90 % of the SLO: still on pace
    assert seen_safe_batch(po(0.0901, 100.0), 3, 0.1) == 0
    assert seen_safe_batch(po(math.nan, 100.0), 3, 0.1) == 0
    assert seen_safe_batch(po(None, 100.0), 3, 0.1) == 0
    assert seen_safe_batch(po(0.05, None), 3, 0.1) == 0
    assert seen_safe_batch(po(0.05, 100.0), 0, 0.1) == 0  # no ready replica: nothing seen
    assert seen_safe_batch(None, 3, 0.1) == 0


# A small fast-starting pool (the demo's shape: 8B on A100, cold start 20 s) for surge tests.
SURGE_FL = fleet(spec("p", model="llama-3-8b", sku="a100-80gb", usd_per_replica_hour=2.2, min_replicas=1,
                      max_replicas=16, startup_warm_s=8.0, startup_cold_s=20.0))


def _window_mean(t: float, start_s: float, surge_at_s: float, base: float, peak: float,
                 window_s: float = 60.0) -> float:
    """What a 60 s windowed rate reads at t for a step base → peak at surge_at_s (window clipped at start_s)."""
    lo = max(t - window_s, start_s)
    if t - lo <= 0:
        return base
    hi_part = max(0.0, t - max(lo, surge_at_s))
    return (base * (t - lo - hi_part) + peak * hi_part) / (t - lo)


def _surge_run(ticks: list[float], start_s: float, surge_at_s: float, base: float, peak: float):
    pol = MpcPolicy(**FAST)
    state, current, reps = pol.initial_state(), None, []
    replicas = 2
    for k, t in enumerate(ticks):
        rps = base if t <= start_s else _window_mean(t, start_s, surge_at_s, base, peak)
        i = inp(t, {"p": pool_signals(rps, replicas)}, fl=SURGE_FL, current=current or {"p": replicas})
        state, out = pol.decide(state, i, np.random.default_rng(k))
        replicas = out.pools["p"].replicas
        reps.append(replicas)
        current = Decision(decision_id=f"d-{k}", generation=k, at_s=t, valid_until_s=t + 120, pools=dict(out.pools),
                           admission=dict(out.admission))
    return reps


@pytest.mark.parametrize("label,first_s,surge_at_s,base,peak", [
    # the demo's shape: the first tick at 15 s, a 3x surge at 20 s, inside the policy's 60 s warm-up:
    # the surge must reach the forecast while warming, not once warm
    ("3x surge 5 s after the first tick", 15.0, 20.0, 8.0, 24.0),
    ("3x surge 10 s after the first tick", 15.0, 25.0, 10.0, 30.0),
    ("4x surge, first tick at 30 s", 30.0, 40.0, 6.0, 24.0),
])
def test_a_surge_in_the_first_minute_is_met_within_two_ticks(label, first_s, surge_at_s, base, peak):
    ticks = [first_s + 15.0 * k for k in range(8)]
    reps = _surge_run(ticks, first_s, surge_at_s, base, peak)
    settled = reps[-1]  # what it orders once its windows are full of the surge
    seen = next(k for k, t in enumerate(ticks) if t > surge_at_s)  # first reading with the surge in its window
    assert reps[seen - 1] < settled - 1, (label, reps)  # not provisioned for the surge before it
    assert max(reps[seen:seen + 2]) >= settled - 1, (label, reps)  # within two ticks of seeing it


@pytest.mark.parametrize("label,rollout_left,seen_s,tripped", [
    ("surge replica of a rolling restart the policy ordered", 3, 180.0, False),
    ("the same start with no restart in progress is a crash replacement", 0, 180.0, True),
    ("a restart ordered long ago that never came (shadow mode) does not mask a crash", 3, -400.0, True),
])
def test_rolling_restart_surge_is_not_a_replica_loss(label, rollout_left, seen_s, tripped):
    # a batch-cap change makes the fleet restart every replica, one warm surge replica at a time
    # (maxSurge 1): that surge is not a crash and must not trip the breaker
    pol = MpcPolicy(**FAST)
    state, outs, bstate = loop(pol, [(4.0, 3)] * 12, start=3)
    cur = Decision("d", 1, 180.0, 300.0, pools={"p": replace(outs[-1].pools["p"], replicas=3)})
    est = state.estimate  # the core's replica accounting (the policy, driven alone, advances it)
    assert est is not None
    acc = replace(est.pools["p"], target=3, serving=3, rollout_left=rollout_left, rollout_seen_s=seen_s)
    state = replace(state, estimate=replace(est, pools={"p": acc}))
    classes = {c: ClassObservation(priority_class=c, arrival_rps=Reading(4.0 * s), retry_rps=Reading(0.0),
                                   shed_rps=Reading(0.0), ttft_p95_s=Reading(3.5), tpot_p95_s=Reading(0.16))
               for c, s in (("critical", 0.2), ("standard", 0.6), ("sheddable", 0.2))}
    i = inp(195.0, {"p": pool_signals(4.0, 3, starting=1, hit=0.1, ttft=3.5, tpot=0.16)}, fl=FL, current=cur)
    i = replace(i, observation=FleetObservation(at_s=195.0, pools=i.observation.pools, classes=classes))
    state, bstate, out = braked(pol, state, bstate, i, np.random.default_rng(0))
    assert (out.diagnostics["breaker"]["phase"] == "open") is tripped, label
    assert state.pools["p"].unordered == (1 if tripped else 0)
    assert state.pools["p"].rollout_left == (0 if tripped else rollout_left - 1)


@pytest.mark.parametrize("label,cur,final,need,lo,expect", [
    ("the p95 needs more soon", 4, 6, [4, 6, 6], 1, "forecast p90 needs 6 by +45 s"),
    ("the p95 needs more now", 4, 6, [6, 6, 6], 1, "p90 load needs 6 now"),
    ("no step's p95 needs more: the tail bought it", 4, 5, [3, 3, 3], 1,
     "the p95s fit 3, the plan keeps 5 for the tail (predicted late-or-shed share at p90 load: sheddable 33.7%)"),
    ("no step's p95 needs more: a floor holds it", 3, 5, [3, 3, 3], 5, "held at the floor 5"),
    ("scale down, above what the p95 needs", 6, 4, [3, 3, 3], 1,
     "needs at most 3 (keeps 4 for the tail: predicted late-or-shed share at p90 load sheddable 33.7%)"),
])
def test_scale_reasons_name_what_bought_the_replicas(label, cur, final, need, lo, expect):
    # when the tail, not the p95, bought the replica, "forecast p90 needs 3" next to a scale-up to 5
    # would mislead: an operator asking why must get the real reason
    from types import SimpleNamespace

    from controller.policies.mpc.reasons import pool_reasons

    pol = MpcPolicy(**FAST)
    spec = FL.pools[0]
    # stand-ins with only the fields pool_reasons reads (Any: they are not the real dataclasses)
    result: Any = SimpleNamespace(terms={"pools": {"p": {"need_by_step_p90": need, "hit_rate": [0.3, 0.3, 0.3]}},
                                    "late_or_shed_frac_p90": {"critical": 0.001, "standard": 0.01, "sheddable": 0.337}})
    pin: Any = SimpleNamespace(lo=lo, hi=16, frozen=False, max_num_seqs=256, max_num_batched_tokens=8192)
    pp: Any = SimpleNamespace(prefix_weight=3.0, inflight_cap=0, traffic_weight=1.0, standby=0, max_num_seqs=256,
                         max_num_batched_tokens=8192)
    out = pool_reasons(spec, pin, cur, final, pp, None, result, pol.config.step_s)
    msgs = [r.message for r in out if r.code.startswith("mpc_scale")]
    assert len(msgs) == 1 and expect in msgs[0], (label, msgs)


@pytest.mark.parametrize("label,request_tpot,inflated", [
    ("per-request TPOT near the model's prediction: taken as it is", 0.02, False),
    ("no per-request histogram: the per-token ITL p95 (0.3 s) reads as bursts", None, True),
])
def test_multi_pool_tpot_correction_learns_from_the_per_request_tpot(label, request_tpot, inflated):
    # two pools (the router's per-class TPOT mixes them): each pool's TPOT correction comes from its
    # own per-request TPOT p95 when the engines export it, not from the per-token ITL p95, which
    # chunked-prefill steps push far above it (without it the policy falls back to 0.8 × ITL)
    two = fleet(spec("a", model="llama-3-8b", sku="a100-80gb", usd_per_replica_hour=5.12),
                spec("b", model="llama-3-8b", sku="h100-80gb", usd_per_replica_hour=12.29))
    pol = MpcPolicy(**FAST)
    state, current = pol.initial_state(), None
    for k in range(30):
        t = 15.0 * (k + 1)
        sig = {n: dict(pool_signals(8.0, 4, tpot=0.3), request_tpot_p95_s=request_tpot) for n in ("a", "b")}
        i = inp(t, sig, fl=two, current=current if current is not None else {"a": 4, "b": 4})
        state, out = pol.decide(state, i, np.random.default_rng(k))
        current = Decision(f"d-{k}", k, t, t + 120, pools=dict(out.pools), admission=dict(out.admission))
    corr = out.diagnostics["model"]["corrections"]
    for n in ("a", "b"):
        seen = corr[n]["tpot_obs_over_smooth"]
        assert (seen > 5.0) is inflated and (corr[n]["burst"] > 0) is inflated, (label, n, corr[n])


def test_carried_judgement_for_the_breaker():
    """The fleet carries its load when every pool has the replicas the last plan needed ready and no
    queue stands (engines: at most one waiting per ready replica; router: nothing held); a missing
    reading or no plan yet gives None (the breaker then keeps counting latency)."""
    fl = fleet(spec("a"), spec("b"))

    def obs(a: dict, b: dict, held: float = 0.0) -> FleetObservation:
        return FleetObservation(at_s=0.0, pools={"a": obs_row("a", **a), "b": obs_row("b", **b)},
                                classes={"critical": ClassObservation("critical", queue_depth=Reading(held))})

    ok = {"replicas_ready": 4, "waiting": 3}
    need = {"a": 4, "b": 2}
    assert carried(obs(ok, {"replicas_ready": 2, "waiting": 0}), fl, need) is True
    assert carried(obs(ok, {"replicas_ready": 1, "waiting": 0}), fl, need) is False  # b short
    assert carried(obs(ok, {"replicas_ready": 2, "waiting": 5}), fl, need) is False  # b queued
    assert carried(obs(ok, {"replicas_ready": 2, "waiting": 0}, held=3), fl, need) is False
    assert carried(obs(ok, {"replicas_ready": 2}), fl, need) is None  # waiting missing
    assert carried(obs(ok, {"replicas_ready": 2, "waiting": 0}), fl, {}) is None  # no plan yet


def test_learned_planning_reads_the_model_source_every_tick_and_picks_up_a_swap():
    """planning_model learned: each tick plans on what the source returns now (the daemon's model
    slot), so a refit that passed the validation gate is planned on from the next tick."""
    from controller.core.coupling import CouplingModels
    from controller.core.mpc_model import LearnedPlanModel
    from controller.learning.physics import physics_for_pool_spec

    physics = [physics_for_pool_spec(p) for p in FL.pools]
    current = {"models": CouplingModels.prior_only(physics)}
    calls: list[int] = []

    def source():
        calls.append(1)
        return current["models"]

    pol = MpcPolicy(planning_model="learned", coupling_source=source, **FAST)
    _, outs, _ = loop(pol, [(20.0, None)] * 3)
    assert len(calls) == 3
    model = outs[-1].diagnostics["model"]
    assert model["kind"] == "LearnedPlanModel" and model["planning_model"] == "learned"
    assert "learned_unusable" not in model
    first = pol._plan_model(FL, pol._prior(FL))[0]
    assert pol._plan_model(FL, pol._prior(FL))[0] is first  # same models: the adapter is reused
    current["models"] = CouplingModels.prior_only(physics)  # a swap
    second = pol._plan_model(FL, pol._prior(FL))[0]
    assert isinstance(second, LearnedPlanModel)
    assert second is not first and second.models is current["models"]
    # the default plans on the prior and never asks for models
    _, outs, _ = loop(MpcPolicy(**FAST), [(20.0, None)] * 2)
    assert outs[-1].diagnostics["model"]["kind"] == "QueueingPrior"
    assert outs[-1].diagnostics["model"]["planning_model"] == "prior"


@pytest.mark.parametrize("label, models, reason", [
    ("no models loaded", None, "no learned models loaded"),
    ("no physics for the pool's engine", "other-engine", "no physics for pool p"),
])
def test_learned_planning_falls_back_to_the_prior_and_says_why(label, models, reason):
    from controller.core.coupling import CouplingModels
    from controller.learning.physics import physics_for_pool_spec

    if models == "other-engine":  # models fitted for another engine only
        models = CouplingModels.prior_only([physics_for_pool_spec(spec("q", model="llama-3-8b", sku="a100-80gb"))])
    pol = MpcPolicy(planning_model="learned", coupling_source=lambda: models, **FAST)
    _, outs, _ = loop(pol, [(20.0, None)] * 2)
    model = outs[-1].diagnostics["model"]
    assert model["kind"] == "QueueingPrior", label
    assert reason in model["learned_unusable"], label
    assert outs[-1].pools["p"].replicas >= 1


def _pin(name, group="g", role="mixed", price=4.1, ready=0, lo=0, hi=8, starting=(), frozen=False):
    from controller.core.mpc import PoolInput

    return PoolInput(name=name, model_index=0, group=group, role=role, usd_per_hour=price, lo=lo, hi=hi, target=ready,
                     ready=ready, starting_eta_s=starting, frozen=frozen)


@pytest.mark.parametrize("label, pools, arrivals, held, demand, raised", [
    ("one group at zero, demand at the router", [_pin("a")], {}, 0.0, True, {"a"}),
    ("one group at zero, requests held, no rate yet", [_pin("a")], {}, 5.0, False, {"a"}),
    ("no traffic: stays at zero", [_pin("a")], {}, 0.0, False, set()),
    ("a replica is already starting", [_pin("a", starting=(40.0,))], {}, 5.0, True, set()),
    ("the cheapest pool of the group", [_pin("a", price=8.0), _pin("b", price=4.1)], {}, 0.0, True, {"b"}),
    ("disaggregated: the cheapest of each hop",
     [_pin("p1", role="prefill", price=9.0), _pin("p2", role="prefill", price=5.0), _pin("d1", role="decode")],
     {}, 0.0, True, {"p2", "d1"}),
    ("two groups: only the one its arrivals show", [_pin("a", group="x"), _pin("b", group="y", ready=2)],
     {"x": 1.5, "y": 3.0}, 0.0, True, {"a"}),
    ("two groups: router demand alone does not say which", [_pin("a", group="x"), _pin("b", group="y", ready=2)],
     {"y": 3.0}, 4.0, True, set()),
    ("pinned at zero by an operator", [_pin("a", hi=0)], {}, 5.0, True, set()),
    ("frozen", [_pin("a", lo=0, hi=0, frozen=True)], {}, 5.0, True, set()),
])
def test_activation_starts_one_replica_for_a_group_serving_nothing(label, pools, arrivals, held, demand, raised):
    from controller.policies.mpc.plan_inputs import activate

    out = activate(list(pools), arrivals, demand or held > 0)  # the policy's demand: a rate or requests held
    assert {p.name for p, q in zip(pools, out, strict=True) if q.lo > p.lo} == raised, label
    assert all(q.lo <= 1 and q.hi == p.hi for p, q in zip(pools, out, strict=True)), label


# --------------------------------------------------------------------------- the stream guard



@pytest.mark.parametrize("label,pool,slos,expect", [
    ("a mixed pool serving every class: critical's TPOT", spec("p"), None, 0.1),
    ("a tier that no critical task reaches: standard's TPOT",
     spec("p", eligible=(("critical", 0.0), ("standard", 0.5), ("sheddable", 1.0))), None, 0.15),
    ("a prefill-only pool: its requests decode elsewhere", spec("p", role="prefill"), None, None),
    ("a tier only sheddable traffic reaches: nothing to guard",
     spec("p", eligible=(("critical", 0.0), ("standard", 0.0), ("sheddable", 1.0))), None, None),
])
def test_guard_keeps_the_tightest_tpot_of_the_protected_classes_a_pool_serves(label, pool, slos, expect):
    from controller.policies.mpc.plan_inputs import guard_tpot_s

    assert guard_tpot_s(fleet(pool, slos=slos), pool) == expect, label


def test_guard_batch_is_the_largest_batch_the_calibrated_engine_runs_within_the_target():
    from controller.core.mpc_model import LatencyQuery
    from controller.policies.mpc.memory import MpcPoolMemory
    from controller.policies.mpc.plan_inputs import guard_batch

    fl = fleet(spec("p"))
    pol = MpcPolicy(**FAST)
    prior = pol._prior(fl)
    mem = MpcPoolMemory(prompt_tokens=1260.0, output_tokens=152.0)  # the demo trace's mix
    b = guard_batch(prior, 0, mem, fl.pools[0], 0.1, 0.2, 8)
    assert b is not None and 40 <= b <= 72 and b % 4 == 0  # 8B on an A100 at the demo's mix: ~60

    def p95(batch: float, p=prior) -> float:
        a = p.latency(LatencyQuery(pool_index=np.array([0]), rps_per_replica=np.array([1e4]),
                                   prompt_tokens=np.array([1260.0]), output_tokens=np.array([152.0]),
                                   hit_rate=np.array([0.2]), inflight_cap=np.array([batch]),
                                   max_num_seqs=np.array([256.0]), max_num_batched_tokens=np.array([8192.0])))
        return float(a.tpot_p95_s[0])

    assert p95(b) <= 0.09 < p95(b + 4)  # the last step of the grid within 90 % of the SLO
    # online corrections do not move it: they carry the windows of uncapped engines
    corrected = prior.with_corrections([2.0], [2.5], 0.3, [3.0])
    assert guard_batch(corrected, 0, mem, fl.pools[0], 0.1, 0.2, 8) == b
    # a tighter SLO, a smaller batch; none at all when even 8 streams miss it
    tighter = guard_batch(prior, 0, mem, fl.pools[0], 0.05, 0.2, 8)
    assert tighter is not None and tighter < b
    assert guard_batch(prior, 0, mem, fl.pools[0], 0.01, 0.2, 8) is None


def _guarded_cap(signals: dict, **kw) -> tuple[PolicyOutput, int | None]:
    """One decision on the 70B pool at 8 replicas with `signals`; (the output, the guard's ceiling)."""
    pol = MpcPolicy(**FAST, **kw)
    i = inp(600.0, {"p": signals}, fl=FL, current={"p": 8})
    _, out = pol.decide(pol.initial_state(), i, np.random.default_rng(0))
    return out, out.diagnostics["stream_guard"].get("p")


def test_the_guard_caps_every_tick_and_names_itself_only_where_it_binds():
    # light load: the ceiling is in force (a surge between ticks meets it), nothing to explain
    out, g = _guarded_cap(pool_signals(8.0, 8))
    assert g is not None and 8 <= out.pools["p"].inflight_cap <= g
    assert "stream_guard" not in {r.code for r in out.reasons}
    # the engines at the ceiling: the guard says so, with the batch it holds
    sig = pool_signals(40.0, 8)
    sig["running"] = 8 * g
    out, g2 = _guarded_cap(sig)
    assert out.pools["p"].inflight_cap == g2
    r = next(r for r in out.reasons if r.code == "stream_guard")
    assert r.pool == "p" and r.data["ceiling"] == g2 and r.data["batch"] == pytest.approx(g)


def test_the_guard_never_caps_below_a_batch_seen_on_pace():
    sig = pool_signals(30.0, 8)
    sig["running"] = 8 * 150.0  # 150 streams per replica at a per-request p95 TPOT of 70 ms (critical's 0.1 s)
    sig["request_tpot_p95_s"] = 0.07
    _, g = _guarded_cap(sig)
    assert g == 150


def test_without_the_guard_the_cap_is_the_plans_alone():
    out, g = _guarded_cap(pool_signals(8.0, 8), stream_guard=False)
    assert g is None
    with pytest.raises(ValueError, match="stream_guard must be true or false"):
        MpcPolicy(**FAST, stream_guard="yes")  # type: ignore[arg-type]  # a config typo, refused
