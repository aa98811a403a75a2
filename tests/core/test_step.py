"""Controller.step: numbering, determinism, modes, overrides and explanations."""

from __future__ import annotations

import pytest

from controller.core.breaker import BreakerConfig
from controller.core.guards import GuardConfig
from controller.core.step import Controller, TickInput
from controller.types import FleetSpec, Mode, Override, PoolSpec, SloSpec
from tests.fakes.core_policy import ScriptedPolicy
from tests.fakes.observations import fleet_obs, pool_obs

FLEET = FleetSpec(pools=(PoolSpec("a", "llama-3-8b", "a100-80gb", min_replicas=1, max_replicas=8),),
                  slos={"critical": SloSpec(1.0, 0.1), "standard": SloSpec(5.0, 0.15)})


def tick(t, mode=Mode.ACTIVE, overrides=(), **obs):
    return TickInput(now_s=t, observation=fleet_obs(t, pool_obs("a", **obs)), mode=mode, overrides=overrides)


def test_generation_and_ids_increase_and_validity_is_set():
    c = Controller(FLEET, ScriptedPolicy({"a": 3}), decision_validity_s=90)
    s = c.initial_state(generation=41)
    s, r1 = c.step(s, tick(10))
    s, r2 = c.step(s, tick(25))
    assert r1.decision is not None and r2.decision is not None
    assert (r1.decision.generation, r2.decision.generation) == (42, 43)
    assert r1.decision.decision_id == "d-00000042"
    assert r2.decision.valid_until_s == 25 + 90
    assert r1.changed and not r2.changed
    assert "scale a=3" in r1.explanation.splitlines()[0]


def test_same_inputs_same_decisions_and_random_draws():
    def run():
        pol = ScriptedPolicy({"a": 4})
        c = Controller(FLEET, pol, seed=7)
        s = c.initial_state()
        out = []
        for t in (0, 15, 30):
            s, r = c.step(s, tick(t))
            out.append(r.record())
        return out, pol.draws

    assert run() == run()


def test_paused_makes_no_decision_and_keeps_state():
    c = Controller(FLEET, ScriptedPolicy({"a": 3}))
    s0 = c.initial_state()
    s1, r = c.step(s0, tick(0, mode=Mode.PAUSED))
    assert r.decision is None and s1 is s0


def test_shadow_starts_from_the_observed_fleet():
    pol = ScriptedPolicy({"a": 3})
    c = Controller(FLEET, pol)
    s = c.initial_state()
    s, _ = c.step(s, tick(0, mode=Mode.ACTIVE))
    s, _ = c.step(s, tick(15, mode=Mode.SHADOW, ready=6, starting=1))
    current = pol.seen[-1].current
    assert current is not None
    assert current.pools["a"].replicas == 7


def test_slo_and_profile_overrides_reach_the_policy_and_expire():
    pol = ScriptedPolicy({"a": 2})
    c = Controller(FLEET, pol)
    s = c.initial_state()
    ovs = (Override("o1", "slo_ttft", value=0.5, priority_class="critical", author="sre", created_s=0, expires_s=20),
           Override("o2", "profile", text="latency", author="sre", created_s=0, expires_s=20))
    s, r = c.step(s, tick(10, overrides=ovs))
    assert pol.seen[-1].fleet.slos["critical"].ttft_s == 0.5
    assert pol.seen[-1].profile == "latency"
    assert len(r.overrides) == 2 and "overrides:" in r.explanation
    s, r = c.step(s, tick(30, overrides=ovs))
    assert pol.seen[-1].fleet.slos["critical"].ttft_s == 1.0 and pol.seen[-1].profile == "balanced"
    assert r.overrides == ()


def test_record_is_json_ready_and_explains_guards():
    import json

    c = Controller(FLEET, ScriptedPolicy({"a": 20}), guards=GuardConfig(max_step_up=2))
    s = c.initial_state()
    s, _ = c.step(s, tick(0))  # 20 → capped at 8 (max) on the first tick: no current yet, so no step limit
    s, r = c.step(s, tick(15))
    rec = json.loads(json.dumps(r.record()))
    assert rec["pools"]["a"]["replicas"] == 8
    s2 = c.initial_state(current=r.decision)
    pol = ScriptedPolicy({"a": 1})
    c2 = Controller(FLEET, pol, guards=GuardConfig(max_step_down=2))
    _, r2 = c2.step(s2, tick(30))
    assert r2.decision is not None
    assert r2.decision.pools["a"].replicas == 6
    assert any(g["code"] == "guard_max_step_down" for g in r2.record()["guard_adjustments"])
    assert "guardrail guard_max_step_down" in r2.explanation


def test_summary_line_says_what_moved_when_replicas_did_not():
    """The first line names a replica change; without one it names the reasons (a lever moved, a
    scale-down held) rather than "no change", which it says only when nothing was said at all."""
    from controller.core.step import explain
    from controller.types import Decision, PoolDecision, Reason

    cur = Decision("d-1", 1, 0.0, 60.0, pools={"a": PoolDecision(replicas=3)})
    dec = Decision("d-2", 2, 15.0, 75.0, pools={"a": PoolDecision(replicas=3, traffic_weight=0.4)})
    moved = (Reason("lever_move", "traffic 0.5→0.4", pool="a"), Reason("lever_move", "again", pool="a"))
    head = explain(dec, cur, moved, (), {"a": "ok"}, (), False, Mode.ACTIVE).splitlines()[0]
    assert head == "d-2 (active) replicas unchanged: lever_move"
    head = explain(dec, cur, (), (), {"a": "ok"}, (), False, Mode.ACTIVE).splitlines()[0]
    assert head == "d-2 (active) no change"
    up = Decision("d-3", 3, 30.0, 90.0, pools={"a": PoolDecision(replicas=4)})
    head = explain(up, cur, moved, (), {"a": "ok"}, (), False, Mode.ACTIVE).splitlines()[0]
    assert head == "d-3 (active) scale a 3→4"


def _crash_run(policy, **breaker):
    """8 replicas serving, then 4 vanish (no drain, no lower target) and the hit rate collapses."""
    c = Controller(FLEET, policy, **breaker)
    s = c.initial_state()
    for k in range(1, 13):
        s, r = c.step(s, tick(15.0 * k, ready=8, hit_rate=0.5))
    return c.step(s, tick(195.0, ready=4, hit_rate=0.1))


@pytest.mark.parametrize("label, config", [
    ("a controller built without a breaker setting runs the default breaker", "undeclared"),
    ("a controller runs the breaker it is given", BreakerConfig(shed_stage2=0.25)),
])
def test_the_breaker_runs_in_step_for_every_policy(label, config):
    pol = ScriptedPolicy({"a": 8})
    _, r = _crash_run(pol, **({} if config == "undeclared" else {"breaker": config}))
    assert r.diagnostics["breaker"]["phase"] == "open", label
    assert r.policy_reasons[0].code == "breaker_open", label  # the breaker's reasons come before the policy's
    assert r.diagnostics["breaker_constraints"]["min_replicas"] == {"a": 8}, label
    assert pol.seen[-1].breaker.min_replicas == {"a": 8}, label  # the policy planned knowing the constraints
    shed = 0.5 if config == "undeclared" else 0.25
    assert r.decision.admission["sheddable"].shed_frac == shed, label  # the shed floor, applied by step


def test_the_breaker_floor_is_applied_to_a_proposal_below_it():
    pol = ScriptedPolicy({"a": 8})
    c = Controller(FLEET, pol)
    s = c.initial_state()
    for k in range(1, 13):
        s, _ = c.step(s, tick(15.0 * k, ready=8, hit_rate=0.5))
    pol.replicas = {"a": 3}
    _, r = c.step(s, tick(195.0, ready=4, hit_rate=0.1))
    assert r.decision is not None
    assert r.decision.pools["a"].replicas == 8
    assert "guard_breaker_floor" in {a.code for a in r.guard_adjustments}


def test_a_controller_without_a_breaker_runs_none():
    pol = ScriptedPolicy({"a": 8})
    _, r = _crash_run(pol, breaker=None)
    assert "breaker" not in r.diagnostics and not pol.seen[-1].breaker.active
    assert not r.decision.admission
