"""The simulated fleet obeys the controller's slow-replica decisions (controller/core/outliers.py): an
ejected replica gets no new requests while another candidate is left, a replaced one drains and a new
one starts with the target unchanged; end to end, the bench's loop detects an injected slowdown from the
replicas' own series, ejects and replaces the slow replica.

Real calibration (Llama-3-8B on A100), real engine and router (tests/fakes/sim_fleet.py).
"""

from __future__ import annotations

from controller.bench.observe import SimObserver
from controller.core.guards import GuardConfig
from controller.core.outliers import OutlierConfig
from controller.core.step import Controller, TickInput
from controller.sim.control import apply_decision
from controller.sim.fleet import Fleet
from controller.sim.fleetspec import fleet_spec_from_scenario
from controller.types import Decision, PoolDecision
from tests.fakes.core_policy import ScriptedPolicy
from tests.fakes.sim_fleet import pool, scenario, workload


def _requests_on(f: Fleet) -> dict[str, int]:
    return {rs.replica_id: int(rs.ttft_s.count) for rs in f.replica_stats()}


def test_an_ejected_replica_gets_no_new_requests_unless_it_is_the_last():
    wl = workload([0.5 * i for i in range(120)], 200, 20)
    f = Fleet(scenario([pool(replicas=3)]), workload=wl)
    f.run_until(1.0)
    ids = sorted(_requests_on(f))
    f.set_ejected("p8", [ids[0]])
    f.run_until(5.0)  # what it was sent before finishes (200-token prompts, 20 tokens out: well under a second)
    before = _requests_on(f)
    f.run_until(30.0)
    after = _requests_on(f)
    assert after[ids[0]] == before[ids[0]]  # nothing new: the other two took the traffic
    assert all(after[r] > before[r] for r in ids[1:])
    # every candidate ejected: as Envoy's panic threshold, the router uses them all again
    f.set_ejected("p8", ids)
    f.run_until(60.0)
    assert all(n > after[r] for r, n in _requests_on(f).items())


def test_replace_drains_the_replica_and_starts_a_new_one_at_the_same_target():
    f = Fleet(scenario([pool(replicas=2, startup_warm_s=5.0, startup_cold_s=10.0)]),
              workload=workload([0.5 * i for i in range(200)], 200, 20))
    f.run_until(5.0)
    old = sorted(_requests_on(f))
    assert f.replace_replicas("p8", [old[0], "not-a-replica"]) == [old[0]]
    st = f.pool_states()["p8"]
    assert (st.target_replicas, st.starting) == (2, 1)
    f.run_until(40.0)
    now = sorted(_requests_on(f))
    assert old[0] not in now and old[1] in now and len(now) == 2  # replaced, not removed


def test_the_decision_reaches_the_router_and_the_autoscaler():
    f = Fleet(scenario([pool(replicas=3)]), workload=workload([0.5 * i for i in range(40)], 200, 20))
    f.run_until(1.0)
    ids = sorted(_requests_on(f))
    d = Decision("d-1", 1, 1.0, 121.0, {"p8": PoolDecision(replicas=3, ejected=(ids[2],), replace=(ids[2],))})
    apply_decision(f, d)
    assert f.pools["p8"].route.ejected == frozenset({ids[2]})
    assert f.pool_states()["p8"].starting == 1


def test_the_bench_loop_finds_an_injected_slowdown_and_replaces_it():
    """Four replicas under steady load; one is made 2.5× slower at 120 s for five minutes. The loop (SimObserver →
    Controller.step → apply_decision) judges each replica from its own /metrics series, ejects the slow one within
    three ticks of the window filling with its slow steps; still slow once its 120 s ejection expires, it is
    ejected again and the fleet replaces it; no healthy replica is touched. Critical's TPOT SLO is 40 ms, so the
    slow replica's ~30 ms steps (healthy ones step at ~12 ms here) cost its requests their TPOT: worth ejecting.
    The pool is at its max_replicas (4), so the target cannot carry the ejected replica's slot on top of the 4
    the policy asks for (tests/core/test_outliers.py has the pool that can)."""
    classes = {"critical": {"share": 0.2, "ttft_slo_s": 2.5, "tpot_slo_s": 0.04},
               "standard": {"share": 0.6, "ttft_slo_s": 5.0, "tpot_slo_s": 0.15},
               "sheddable": {"share": 0.2, "ttft_slo_s": 10.0, "tpot_slo_s": 0.3}}
    sc = scenario([pool(replicas=4, max_replicas=4, startup_warm_s=20.0, startup_cold_s=40.0)], classes=classes)
    f = Fleet(sc, workload=workload([0.1 * i for i in range(4000)], 300, 120))
    obs = SimObserver(f, window_s=60.0)
    c = Controller(fleet_spec_from_scenario(sc), ScriptedPolicy({"p8": 4}), guards=GuardConfig(), seed=1,
                   outliers=OutlierConfig())
    s = c.initial_state()
    slow: list[str] = []
    ejected_at = None
    replaced: list[str] = []
    ejections = 0
    for k in range(1, 31):
        t = 15.0 * k
        f.run_until(t)
        if t == 120.0:
            slow = f.inject_fault("slow", "p8", duration_s=300.0, factor=2.5)
        s, r = c.step(s, TickInput(now_s=t, observation=obs.read(t), fleet_state=obs.fleet_state()))
        assert r.decision is not None
        pd = r.decision.pools["p8"]
        if pd.ejected and ejected_at is None:
            ejected_at = t
        ejections += sum(1 for x in r.policy_reasons if x.code == "slow_replica")
        replaced += list(pd.replace)
        assert pd.replicas == 4  # at its max: no slot on top
        apply_decision(f, r.decision)
    assert ejected_at is not None and 120.0 < ejected_at <= 120.0 + 60.0 + 3 * 15.0, ejected_at
    assert ejections == 2 and replaced == slow  # the slow one, twice, replaced once, and nobody else
    assert slow[0] not in {rs.replica_id for rs in f.replica_stats()}
    assert f.pool_states()["p8"].ready == 4
