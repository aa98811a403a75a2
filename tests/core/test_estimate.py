"""The estimate stage: the autoscaler's replica phases join the telemetry, one rule for every driver."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import pytest

from controller.core.estimate import estimate, target_in_force
from controller.core.step import Controller, TickInput
from controller.types import Decision, FleetObservation, FleetSpec, PoolDecision, PoolObservation, PoolSpec, Reading
from tests.fakes.core_policy import ScriptedPolicy


@dataclass(frozen=True)
class _Phases:
    ready: int
    starting: int
    draining: int


def _obs(**pools: PoolObservation) -> FleetObservation:
    return FleetObservation(at_s=10.0, pools=pools)


@pytest.mark.parametrize("label, reading, phases, want_ready, zero", [
    ("scaled to zero: missing ready reads 0", PoolObservation("a"), _Phases(0, 0, 0), 0.0, ("a",)),
    ("replicas up: a missing reading stays missing", PoolObservation("a"), _Phases(2, 0, 0), None, ()),
    ("starting only: still missing (an engine is on its way)", PoolObservation("a"), _Phases(0, 1, 0), None, ()),
    ("draining only: still missing", PoolObservation("a"), _Phases(0, 0, 1), None, ()),
    ("a reading is kept as read", PoolObservation("a", replicas_ready=Reading(3.0)), _Phases(0, 0, 0), 3.0, ()),
])
def test_fleet_state_merge(label, reading, phases, want_ready, zero):
    est = estimate(None, _obs(a=reading), {"a": phases}, 10.0)
    p = est.observation.pools["a"]
    assert (p.replicas_ready.value if p.replicas_ready.ok else None) == want_ready, label
    assert (p.replicas_starting.value, p.replicas_draining.value) == (phases.starting, phases.draining), label
    assert est.scaled_to_zero == zero, label


def test_no_fleet_state_leaves_the_observation_as_read_and_unknown_pools_are_added():
    obs = _obs(a=PoolObservation("a"))
    assert estimate(None, obs, None, 10.0).observation is obs
    assert estimate(None, obs, {}, 10.0).observation is obs
    est = estimate(None, obs, {"b": _Phases(1, 0, 0)}, 10.0)
    assert set(est.observation.pools) == {"a", "b"}
    assert not est.observation.pools["a"].replicas_starting.ok  # not reported: unknown


def test_target_in_force_prefers_the_decision_then_the_fleet_then_the_minimum():
    spec = PoolSpec("a", "llama-3-8b", "a100-80gb", min_replicas=2)
    seen = _obs(a=PoolObservation("a", replicas_ready=Reading(3.0), replicas_starting=Reading(1.0)))
    d = Decision("d", 1, 0.0, 60.0, pools={"a": PoolDecision(5)})
    assert target_in_force(d, seen, spec) == (5, "decision")
    assert target_in_force(None, seen, spec) == (4, "observed")
    assert target_in_force(None, _obs(), spec) == (2, "pool_min")


def test_step_hands_the_policy_the_estimate():
    fleet = FleetSpec(pools=(PoolSpec("a", "llama-3-8b", "a100-80gb", min_replicas=0),), slos={})
    pol = ScriptedPolicy({"a": 1})
    c = Controller(fleet, pol)
    _, res = c.step(c.initial_state(), TickInput(now_s=10.0, observation=_obs(a=PoolObservation("a")),
                                                  fleet_state={"a": _Phases(0, 0, 0)}))
    assert res.estimate.scaled_to_zero == ("a",)
    assert res.estimate.observation.pools["a"].replicas_ready.value == 0.0
    assert res.telemetry["a"] != "missing"
    assert pol.seen[-1].observation.pools["a"].replicas_ready.value == 0.0  # what the policy saw


# --------------------------------------------------------------------------- the replica accounting


def _caps_policy(caps_at: dict[int, int]):
    """A scripted policy holding 3 replicas that sets max_num_seqs to caps_at[call] when given, and says
    each pool needs 3 replicas now."""

    class CapsPolicy(ScriptedPolicy):
        def decide(self, state, inp, rng):
            state, out = super().decide(state, inp, rng)
            n = caps_at.get(state)
            pools = {p: replace(d, max_num_seqs=n, max_num_batched_tokens=8192) if n else d
                     for p, d in out.pools.items()}
            return state, replace(out, pools=pools, needs={"a": 3})

    return CapsPolicy({"a": 3})


def _tick(t: float, ready: int, starting: int = 0, waiting: float = 0.0) -> TickInput:
    from tests.fakes.observations import fleet_obs, pool_obs
    return TickInput(now_s=t, observation=fleet_obs(t, pool_obs("a", ready=ready, starting=starting, waiting=waiting)))


FLEET3 = FleetSpec(pools=(PoolSpec("a", "llama-3-8b", "a100-80gb", min_replicas=1, max_replicas=8,
                                   startup_warm_s=30.0, startup_cold_s=180.0),), slos={})


def test_the_core_accounts_replicas_once_a_tick_and_every_policy_reads_it():
    pol = _caps_policy({})
    c = Controller(FLEET3, pol)
    s = c.initial_state()
    s, _ = c.step(s, _tick(15.0, ready=3))
    s, r = c.step(s, _tick(30.0, ready=2, starting=1))  # one replica crashed; the fleet replaces it
    est = pol.seen[-1].estimate
    assert est is not None and est.pools == r.estimate.pools  # the policy read the tick's estimate
    acc = est.pools["a"]
    assert (acc.unordered, acc.serving, acc.target) == (1, 3, 3)  # a replacement nobody ordered: cold
    assert acc.etas == (30.0 + 180.0,)
    assert est.carried is False  # the policy said 3 are needed now; 2 are ready
    s, _ = c.step(s, _tick(45.0, ready=3))
    assert pol.seen[-1].estimate.pools["a"].unordered == 0 and pol.seen[-1].estimate.carried is True


def test_a_batch_cap_change_the_policy_decided_is_a_rolling_restart_not_a_loss():
    pol = _caps_policy({1: 128})  # its first decision halves max_num_seqs
    c = Controller(FLEET3, pol)
    s = c.initial_state()
    s, r = c.step(s, _tick(15.0, ready=3))
    assert r.estimate.decided_caps == {"a": (128, 8192)}
    s, _ = c.step(s, _tick(30.0, ready=3, starting=1))  # the fleet's surge replica for the restart
    acc = pol.seen[-1].estimate.pools["a"]
    assert (acc.unordered, acc.rollout_left, acc.etas) == (0, 2, (30.0 + 30.0,))  # expected, warm



def test_a_warming_window_counts_the_requests_in_flight_where_it_began():
    """A fleet starting at its peak (decision 0034's case 8): 200 streams, half done, are in flight at the
    first tick, where the telemetry windows begin. By 30 s they have finished (25,000 tokens) with 7.5 new
    requests of 250 tokens: the window reads 1,792 generation tokens/s for 0.5 arrivals/s, 3,583 tokens an
    arrival, which the planner took for the mix. Counted with the requests in flight at each end it reads 250;
    a window whose in-flight work is less than its arrivals' own, and a full one, read as they are."""
    from tests.fakes.observations import fleet_obs, pool_obs

    def tick(t: float, arrival: float, gen: float, running: float) -> TickInput:
        return TickInput(now_s=t, observation=fleet_obs(t, pool_obs(
            "a", ready=3, arrival=arrival, running=running, waiting=0.0,
            prompt_tokens_rps=arrival * 1000.0, generation_tokens_rps=gen)))

    pol = _caps_policy({})
    c = Controller(FLEET3, pol)
    s = c.initial_state()
    s, _ = c.step(s, tick(15.0, math.nan, math.nan, running=200.0))  # one sample: no rate yet
    s, _ = c.step(s, tick(30.0, 0.5, (200 * 125 + 7.5 * 250) / 15.0, running=0.0))
    acc = pol.seen[-1].estimate.pools["a"]
    assert acc.first_in_flight == (200.0, 0.0)
    assert acc.output_tokens == pytest.approx(250.0) and acc.prompt_tokens == pytest.approx(1000.0)
    # 45 s: the streams in flight at each end carry less than the arrivals' own work: read as it is
    s, _ = c.step(s, tick(45.0, 10.0, 10.0 * 350.0, running=60.0))
    assert pol.seen[-1].estimate.pools["a"].output_tokens == pytest.approx(0.7 * 250.0 + 0.3 * 350.0)
    s, _ = c.step(s, tick(75.0, 10.0, 10.0 * 350.0, running=600.0))  # the windows are full (60 s after 15 s)
    assert pol.seen[-1].estimate.pools["a"].output_tokens == pytest.approx(0.7 * (0.7 * 250.0 + 0.3 * 350.0)
                                                                           + 0.3 * 350.0)
