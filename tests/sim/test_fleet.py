"""The fleet: caching, failures, draining, start-up, clients, admission, holding, P/D, cost, control.

Real calibration (Llama-3-8B on A100 unless stated), real engine and router; the
traffic is spelled out per test (tests/fakes/sim_fleet.py).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from controller.paths import shared_data_dir
from controller.perf.catalogue import MODELS
from controller.sim.control import apply_decision
from controller.sim.fleet import Fleet
from controller.sim.fleet_lifecycle import WARM_NODE_TTL_S
from controller.types import ClassAdmission, Decision, PoolDecision
from tests.fakes.sim_fleet import pool, scenario, shared_hashes, workload


def _cell_sum(fleet: Fleet, cls: str, field: str) -> float:
    return sum(getattr(c, field) for (p, _), c in fleet.router_stats.cells.items() if p == cls)


# --------------------------------------------------------------------------- prefix cache


def test_second_identical_prompt_hits_the_cache():
    f = Fleet(scenario([pool(replicas=1)]), workload=workload([0.0, 20.0], 4096, 16, hashes=shared_hashes(2, 4096)))
    s = f.run()
    rec = f.request_records()
    assert rec["status"].tolist() == [1, 1]
    assert rec["ttft_s"][1] < 0.3 * rec["ttft_s"][0]  # 4,095 of 4,096 prompt tokens skipped
    assert s.hit_rate == pytest.approx(4095 / 8192)


def test_prefix_caching_disabled_in_the_engine_spec():
    sc = scenario([pool(replicas=1, engine=dict(enable_prefix_caching=False))])
    f = Fleet(sc, workload=workload([0.0, 20.0], 4096, 16, hashes=shared_hashes(2, 4096)))
    s = f.run()
    rec = f.request_records()
    assert s.hit_rate == 0.0
    assert rec["ttft_s"][1] == pytest.approx(rec["ttft_s"][0], rel=1e-6)


# --------------------------------------------------------------------------- failures


def test_crash_fails_streaming_requests_retries_the_others_and_loses_the_cache():
    sc = scenario([pool(replicas=1, startup_cold_s=60.0)], clients=dict(max_retries=2, retry_backoff_s=1.0))
    hashes = [list(range(8)), [500 + k for k in range(59)], list(range(8))]
    wl = workload([0.0, 9.5, 100.0], [4096, 30000, 4096], [3000, 10, 10], hashes=hashes)
    f = Fleet(sc, workload=wl)
    f.run_until(10.0)
    assert f.replica_stats()[0].prefix_cache_queries > 0
    hit = f.inject_fault("crash", "p8")
    assert hit == ["p8-0"]
    assert f.replica_stats() == []  # the engine and its cache are gone
    st = f.pool_states()["p8"]
    assert (st.ready, st.starting, st.target_replicas) == (0, 1, 1)  # the target is unchanged: a replacement
    s = f.run()
    rec = f.request_records()
    assert rec["status"].tolist() == [2, 1, 1]  # request 0 was streaming: failed, not retried
    assert rec["attempts"].tolist() == [1, 2, 1]  # request 1 had no token yet: retried once
    assert s.failed == 1 and s.retried == 1
    assert rec["ttft_s"][1] >= 60.0  # served by the replacement after its cold start...
    assert s.successful_tasks == 1  # ...which misses the 5 s TTFT SLO: only request 2's task succeeds
    (new,) = f.replica_stats()
    assert new.replica_id == "p8-1"
    assert new.prefix_cache_hits == 0  # request 2 repeats request 0's prompt, but that cache died
    errors = {k: v for (_, _), c in f.router_stats.cells.items() for k, v in c.errors.items()}
    assert errors.get("500") == 2


def test_spot_preemption_takes_the_gpus():
    sc = scenario([pool(replicas=2, node_gpus=2)])
    f = Fleet(sc, workload=workload([0.0], 100, 10))
    f.run_until(1.0)
    (rid,) = f.inject_fault("preempt", "p8")
    f.run_until(200.0)
    st = f.pool_states()["p8"]
    assert st.ready == 2
    slots = [s for n in f.pools["p8"].nodes for s in n.slots]
    assert sum(s.gone for s in slots) == 1
    assert len(f.pools["p8"].nodes) == 2  # the replacement needed a new node
    assert rid not in [r.replica_id for r in f.replica_stats()]


def test_slow_replica_generates_slower_for_a_while():
    f = Fleet(scenario([pool(replicas=1)]), workload=workload([0.0], 100, 20000))
    f.run_until(10.0)
    g0 = f.replica_stats()[0].generation_tokens
    f.run_until(20.0)
    normal = f.replica_stats()[0].generation_tokens - g0
    f.inject_fault("slow", "p8", duration_s=10.0, factor=3.0)
    g1 = f.replica_stats()[0].generation_tokens
    f.run_until(30.0)
    slow = f.replica_stats()[0].generation_tokens - g1
    f.run_until(40.0)
    after = f.replica_stats()[0].generation_tokens - g1 - slow
    assert slow == pytest.approx(normal / 3, rel=0.05)
    assert after == pytest.approx(normal, rel=0.05)


def test_poisson_faults_are_seeded():
    def crashes(seed: int) -> list:
        sc = scenario([pool(replicas=4, startup_cold_s=5.0)],
                      faults=[dict(kind="crash", pool="p8", rate_per_hour=60.0)])
        f = Fleet(sc, seed=seed, workload=workload([0.0], 100, 10))
        f.run_until(600.0)
        return [(rid, round(since, 6)) for rid, _, _, since in f.replica_phases()]

    a = crashes(1)
    assert a == crashes(1)
    assert a != crashes(2)
    assert max(int(rid.rsplit("-", 1)[1]) for rid, _ in a) >= 10  # ~40 crashes in 10 min → many replacements


# --------------------------------------------------------------------------- autoscaling


def test_drain_lets_running_requests_finish_and_admits_no_new_ones():
    arrivals = [0.1 * i for i in range(8)] + [5.0 + 0.5 * i for i in range(10)]
    outputs = [600] * 8 + [20] * 10
    f = Fleet(scenario([pool(replicas=2)]), workload=workload(arrivals, 1000, outputs))
    f.run_until(2.0)
    f.set_pool_target("p8", replicas=1)
    (drained,) = [(rid, st) for rid, _, ph, st in f.replica_phases() if ph == "draining"]
    stats = {r.replica_id: r for r in f.replica_stats()}[drained[0]]
    in_flight = stats.num_requests_running + stats.num_requests_waiting
    done_before = stats.request_success["stop"]
    assert in_flight > 0
    s = f.run()
    assert s.failed == 0 and s.completed == 18
    assert stats.request_success["stop"] == done_before + in_flight  # its own requests finished, no new ones
    assert drained[0] not in [rid for rid, *_ in f.replica_phases()]  # gone once empty
    assert f.pool_states()["p8"].ready == 1


@pytest.mark.parametrize("standby,delay_s", [(0, 90.0), (1, 20.0)])
def test_start_up_delay_warm_vs_cold(standby, delay_s):
    sc = scenario([pool(replicas=1, warm_standby=standby, startup_warm_s=20.0, startup_cold_s=90.0)])
    f = Fleet(sc, workload=workload([0.0], 100, 10))
    f.run_until(5.0)
    f.set_pool_target("p8", replicas=2, warm_standby=standby)
    f.run_until(5.0 + delay_s - 0.01)
    assert f.pool_states()["p8"].ready == 1
    assert f.pool_states()["p8"].starting == 1
    f.run_until(5.0 + delay_s + 0.01)
    assert f.pool_states()["p8"].ready == 2
    if standby:  # the standby was promoted and a new one is loading
        assert f.pool_states()["p8"].standby == 1


def test_warm_weights_on_a_node_expire():
    sc = scenario([pool(replicas=2, startup_warm_s=20.0, startup_cold_s=90.0)])
    f = Fleet(sc, workload=workload([0.0], 100, 10))
    f.run_until(10.0)
    f.set_pool_target("p8", replicas=1)  # idle: drained and gone at once, weights stay on the node
    f.set_pool_target("p8", replicas=2)
    f.run_until(10.0 + 20.0 + 0.01)
    assert f.pool_states()["p8"].ready == 2  # warm start
    f.set_pool_target("p8", replicas=1)
    f.run_until(50.0 + WARM_NODE_TTL_S)
    f.set_pool_target("p8", replicas=2)
    f.run_until(f.now_s + 20.0 + 0.01)
    assert f.pool_states()["p8"].ready == 1  # the node dropped the weights: cold start
    f.run_until(f.now_s + 70.0)
    assert f.pool_states()["p8"].ready == 2


def test_scale_down_removes_starting_replicas_first():
    f = Fleet(scenario([pool(replicas=2)]), workload=workload([0.0], 100, 10))
    f.set_pool_target("p8", replicas=4)
    assert f.pool_states()["p8"].starting == 2
    f.set_pool_target("p8", replicas=3)
    st = f.pool_states()["p8"]
    assert (st.ready, st.starting, st.draining) == (2, 1, 0)
    phases = {rid: ph for rid, _, ph, _ in f.replica_phases()}
    assert phases == {"p8-0": "ready", "p8-1": "ready", "p8-2": "starting"}  # the latest started went first


def test_engine_caps_roll_out_one_replica_at_a_time():
    f = Fleet(scenario([pool(replicas=2, startup_warm_s=20.0)]), workload=workload([0.0], 100, 10))
    f.set_pool_target("p8", replicas=2, max_num_seqs=64, max_num_batched_tokens=4096)
    st = f.pool_states()["p8"]
    assert (st.ready, st.starting, st.max_num_seqs) == (2, 1, 64)  # a surge replica, the old ones still serve
    f.run_until(20.01)
    st = f.pool_states()["p8"]
    assert st.ready == 2 and st.starting == 1  # one old replica drained away, the next surge started
    f.run_until(41.0)
    st = f.pool_states()["p8"]
    assert (st.ready, st.starting, st.draining) == (2, 0, 0)
    engines = [i.live_engine() for i in f.pools["p8"].insts]
    assert [(e.max_num_seqs, e.max_batched_tokens) for e in engines] == [(64, 4096), (64, 4096)]


# --------------------------------------------------------------------------- clients


def test_shed_requests_are_retried_within_budget():
    sc = scenario([pool(replicas=1)], clients=dict(max_retries=2, retry_backoff_s=1.0))
    f = Fleet(sc, workload=workload([0.0, 0.1, 0.2], 500, 10))
    f.set_admission("standard", rate_limit_rps=0.0, queue_budget=-1, shed_frac=1.0)
    f.run_until(1.5)  # first attempts shed; retries due at 1.0–1.2 are shed too
    f.set_admission("standard", rate_limit_rps=0.0, queue_budget=-1, shed_frac=0.0)
    s = f.run()
    rec = f.request_records()
    assert rec["status"].tolist() == [1, 1, 1]
    assert rec["attempts"].tolist() == [3, 3, 3]
    assert s.shed == 6 and s.retried == 6 and s.failed == 0


@pytest.mark.parametrize("retry_on_shed,retried,failed", [(True, 6, 3), (False, 0, 3)])
def test_shed_requests_fail_when_out_of_retries(retry_on_shed, retried, failed):
    sc = scenario([pool(replicas=1)], clients=dict(max_retries=2, retry_on_shed=retry_on_shed),
                  router=dict(admission={"standard": dict(shed_frac=1.0)}))
    s = Fleet(sc, workload=workload([0.0, 0.1, 0.2], 500, 10)).run()
    assert (s.retried, s.failed, s.successful_tasks) == (retried, failed, 0)


def test_timeout_before_first_token_is_retried_then_fails():
    sc = scenario([pool(replicas=1)], clients=dict(timeout_s=2.0, max_retries=1, retry_backoff_s=1.0))
    f = Fleet(sc, workload=workload([0.0], 100_000, 10))  # ~30 s of prefill
    s = f.run()
    assert (s.timed_out, s.retried, s.failed) == (2, 1, 1)
    assert f.replica_stats()[0].request_success["abort"] == 2
    assert f.replica_stats()[0].kv_cache_usage_perc == 0.0


def test_timeout_after_streaming_fails_without_retry():
    sc = scenario([pool(replicas=1)], clients=dict(timeout_s=5.0, max_retries=3))
    s = Fleet(sc, workload=workload([0.0], 100, 5000)).run()  # ~55 s of decode
    assert (s.timed_out, s.retried, s.failed) == (1, 0, 1)


def test_next_step_is_sent_think_time_after_the_previous_one_finished():
    wl = workload([0.0, 0.0, 3.0, 3.0], 800, 50, task_id=[0, 0, 1, 1], step=[0, 1, 0, 1], think_time_s=5.0)
    f = Fleet(scenario([pool(replicas=1)]), workload=wl)
    s = f.run()
    rec = f.request_records()
    finish = rec["sent_s"] + rec["e2e_s"]
    assert rec["sent_s"][1] == pytest.approx(finish[0] + 5.0)
    assert rec["sent_s"][3] == pytest.approx(finish[2] + 5.0)
    assert s.tasks == 2 and s.successful_tasks == 2


def test_task_succeeds_only_when_every_step_meets_its_slo():
    classes = {"critical": dict(share=0.5, ttft_slo_s=0.05, tpot_slo_s=1.0),  # 0.05 s: impossible for 4k tokens
               "standard": dict(share=0.5, ttft_slo_s=5.0, tpot_slo_s=1.0)}
    wl = workload([0.0, 0.0, 10.0, 10.0], [200, 4000, 200, 4000], 20, priority=[0, 0, 1, 1], task_id=[0, 0, 1, 1],
                  step=[0, 1, 0, 1])
    s = Fleet(scenario([pool(replicas=1)], classes=classes), workload=wl).run()
    assert s.successful_tasks == 1 and s.completed == 4
    assert s.slo_attainment == {"critical": 0.0, "standard": 1.0}


# --------------------------------------------------------------------------- admission and holding


def test_sheddable_is_shed_before_standard_and_critical_last():
    n = 90
    rng = np.random.default_rng(3)
    adm = {c: dict(queue_budget=3) for c in ("critical", "standard", "sheddable")}
    sc = scenario([pool(replicas=1)], router=dict(inflight_cap=2, admission=adm),
                  clients=dict(retry_on_shed=False))
    wl = workload(np.sort(rng.uniform(0, 20, n)).tolist(), 3000, 60, priority=rng.integers(0, 3, n).tolist())
    f = Fleet(sc, workload=wl)
    f.run()
    shed = {c: _cell_sum(f, c, "shed") for c in ("critical", "standard", "sheddable")}
    assert shed["sheddable"] > shed["standard"] > shed["critical"]
    assert shed["sheddable"] > 10


def test_shed_frac_on_other_classes_never_sheds_critical():
    adm = {"standard": dict(shed_frac=1.0), "sheddable": dict(shed_frac=1.0)}
    sc = scenario([pool(replicas=1)], router=dict(admission=adm), clients=dict(retry_on_shed=False))
    wl = workload([0.1 * i for i in range(30)], 300, 10, priority=[i % 3 for i in range(30)])
    f = Fleet(sc, workload=wl)
    s = f.run()
    assert _cell_sum(f, "critical", "shed") == 0
    assert s.slo_attainment["critical"] == 1.0
    assert _cell_sum(f, "standard", "shed") == 10 and _cell_sum(f, "sheddable", "shed") == 10


def test_rate_limit_sheds_with_429():
    sc = scenario([pool(replicas=1)], router=dict(admission={"standard": dict(rate_limit_rps=1.0)}),
                  clients=dict(retry_on_shed=False))
    f = Fleet(sc, workload=workload([0.0, 0.1, 0.2, 1.5, 3.0], 100, 5))
    s = f.run()
    assert s.shed == 2 and s.completed == 3
    assert f.router_stats.cell("standard", 0).errors == {"429": 2.0}


def test_pool_at_zero_holds_requests_then_serves_them():
    sc = scenario([pool(replicas=0, startup_cold_s=30.0)])
    f = Fleet(sc, workload=workload([1.0, 2.0, 3.0, 4.0, 5.0], 500, 10))
    f.run_until(6.0)
    assert f.router_stats.queue_size["p8"] == 5
    assert f.router_stats.ready_endpoints["p8"] == 0
    f.set_pool_target("p8", replicas=1)
    s = f.run()
    rec = f.request_records()
    assert s.completed == 5 and s.failed == 0
    assert (rec["sent_s"] + rec["ttft_s"] >= 36.0).all()  # served once the replica was up
    assert f.router_stats.queue_size["p8"] == 0
    assert f.router_stats.queue_by_priority == {"critical": 0, "standard": 0, "sheddable": 0}


def test_the_held_queue_per_class_counts_live_requests_only():
    """`queue_by_priority` (the flow-control gauge the telemetry reads as a class's queue depth) counts
    the requests held now: a request that leaves the hold by timing out is no longer counted, though
    its entry stays in the pool's deque until popped."""
    sc = scenario([pool(replicas=0)], router=dict(hold_timeout_s=10.0), clients=dict(retry_on_shed=False))
    f = Fleet(sc, workload=workload([1.0, 2.0, 9.0], 500, 10, priority=[0, 1, 1]))
    f.run_until(9.5)
    assert f.router_stats.queue_by_priority == {"critical": 1, "standard": 2, "sheddable": 0}
    assert sum(f.router_stats.queue_by_priority.values()) == f.router_stats.queue_size["p8"]
    f.run_until(12.5)  # the first two timed out at 11 and 12 s
    assert f.router_stats.queue_by_priority == {"critical": 0, "standard": 1, "sheddable": 0}
    assert f.router_stats.queue_size["p8"] == 1


def test_held_requests_get_503_after_the_hold_timeout():
    sc = scenario([pool(replicas=0)], router=dict(hold_timeout_s=10.0), clients=dict(retry_on_shed=False))
    f = Fleet(sc, workload=workload([1.0, 2.0], 500, 10))
    s = f.run()
    assert s.shed == 2 and s.failed == 2
    assert s.duration_s == pytest.approx(12.0)
    assert f.router_stats.cell("standard", 0).errors == {"503": 2.0}


def test_inflight_cap_holds_at_the_router():
    sc = scenario([pool(replicas=1)], router=dict(inflight_cap=1))
    f = Fleet(sc, workload=workload([0.0, 0.0, 0.0], 2000, 100))
    f.run_until(0.05)
    assert f.router_stats.queue_size["p8"] == 2
    assert f.replica_stats()[0].num_requests_running + f.replica_stats()[0].num_requests_waiting == 1
    s = f.run()
    assert s.completed == 3
    assert f.router_stats.cell("standard", 0).queue_time_s.count == 3


def test_critical_requests_pass_the_inflight_cap():
    """The cap holds standard and sheddable requests at the router; a critical one goes to a replica
    at once (as the Gateway API Inference Extension treats Critical under saturation)."""
    sc = scenario([pool(replicas=1)], router=dict(inflight_cap=1))
    f = Fleet(sc, workload=workload([0.0, 0.0, 0.01, 0.02], 2000, 100, priority=[1, 1, 0, 2]))
    f.run_until(0.05)
    assert f.router_stats.queue_size["p8"] == 2  # the second standard and the sheddable one wait
    assert f.router_stats.queue_by_priority == {"critical": 0, "standard": 1, "sheddable": 1}
    rep = f.replica_stats()[0]
    assert rep.num_requests_running + rep.num_requests_waiting == 2  # the first standard and the critical
    s = f.run()
    assert s.completed == 4
    assert f.router_stats.cell("critical", 0).queue_time_s.count == 1  # admitted, never held
    assert f.router_stats.cell("critical", 0).queue_time_s.sum == 0.0


# --------------------------------------------------------------------------- prefill/decode split


def test_disaggregated_path_adds_the_kv_transfer_time():
    def ttft(gbps: float, roles: tuple[str, ...]) -> float:
        pools = [pool(name=f"{r[:3]}-{k}", role=r, group="g") for k, r in enumerate(roles)]
        sc = scenario(pools, router=dict(kv_transfer_gbps=gbps))
        f = Fleet(sc, workload=workload([0.0], 4000, 20))
        s = f.run()
        assert s.completed == 1
        return float(f.request_records()["ttft_s"][0])

    kv_bytes = 4000 * MODELS["llama-3-8b"].kv_bytes_per_token  # 524 MB
    slow, fast = ttft(1.0, ("prefill", "decode")), ttft(1000.0, ("prefill", "decode"))
    assert slow - fast == pytest.approx(kv_bytes * 8 / 1e9 * (1 - 1 / 1000), rel=1e-6)
    mixed = ttft(1000.0, ("mixed",))
    assert fast > mixed  # prefill, then transfer, then the decode pool's first step


def test_disaggregated_pools_do_their_own_part():
    pools = [pool(name="pre", role="prefill", group="g"), pool(name="dec", role="decode", group="g")]
    f = Fleet(scenario(pools), workload=workload([0.0, 1.0], 3000, 50))
    f.run()
    by_pool = {r.pool: r for r in f.replica_stats()}
    assert by_pool["pre"].generation_tokens == 2  # one (discarded) token per prompt
    assert by_pool["dec"].generation_tokens == 100
    assert by_pool["pre"].prefix_cache_queries == 6000 and by_pool["dec"].prefix_cache_queries == 0


# --------------------------------------------------------------------------- cost, stats, determinism


def test_cost_accrues_for_serving_and_standby_replicas():
    sc = scenario([pool(replicas=2, warm_standby=1, usd_per_gpu_hour=3.6)])  # $0.001 per GPU-second
    f = Fleet(sc, workload=workload([5000.0], 100, 10))
    f.run_until(1000.0)
    assert f.cost_usd == pytest.approx(3.0)
    f.set_pool_target("p8", replicas=1, warm_standby=0)  # idle: gone at once
    f.run_until(2000.0)
    assert f.cost_usd == pytest.approx(4.0)
    s = f.summary()
    assert s.gpu_hours == pytest.approx(4000 / 3600)
    assert s.per_pool["p8"].cost_usd == pytest.approx(4.0)
    assert s.scaling_actions == 1


def test_stats_views_follow_vllm_and_dcgm_shapes():
    sc = scenario([pool(replicas=3, tp=2, node_gpus=4, model="llama-3-8b")])
    f = Fleet(sc, workload=workload([0.0, 0.5, 1.0], 2000, 1000))
    f.run_until(3.0)
    reps = f.replica_stats()
    assert sorted(r.replica_id for r in reps) == ["p8-0", "p8-1", "p8-2"]
    nodes = f.node_stats()
    assert [n.node_id for n in nodes] == ["p8-node-0", "p8-node-1"]  # 2 replicas of tp2 per 4-GPU node
    assert all(n.gpus == 4 and n.sku == "a100-80gb" and n.pool == "p8" for n in nodes)
    assert sorted({g for r in reps if r.node_id == "p8-node-0" for g in r.gpu_indices}) == [0, 1, 2, 3]
    busy = [b for n in nodes for b in n.gpu_busy_s]
    assert max(busy) > 0 and busy.count(0.0) == 2  # the third node slot is empty
    assert f.router_stats.ready_endpoints["p8"] == 3
    assert sum(r.num_requests_running for r in reps) == 3
    assert all(0 < r.kv_cache_usage_perc < 0.1 for r in reps)
    s = f.run()
    assert sum(r.generation_tokens for r in f.replica_stats()) == 3000
    assert s.requests == 3
    tl = f.timeline()
    assert [p.t_s for p in tl[:3]] == [10.0, 20.0, 30.0][: len(tl[:3])]
    assert tl[0].pools["p8"].replicas_ready == 3


def _real_trace_scenario(**over):
    path = shared_data_dir() / "traces" / "azure2023_conv.csv"
    data: dict[str, Any] = dict(
        trace=dict(path=str(path), duration_s=240.0, prefixes=dict(groups=8, prefix_tokens=512)),
        pools=[pool(replicas=2, startup_cold_s=30.0)],
        faults=[dict(kind="crash", pool="p8", rate_per_hour=20.0)],
        tasks=dict(kind="workflow", steps_min=1, steps_max=3, think_time_s=2.0))
    data.update(over)
    return scenario(**data)


def test_same_seed_same_summary_different_seed_different():
    sc = _real_trace_scenario()
    a = Fleet(sc).run().to_dict()
    b = Fleet(sc).run().to_dict()
    assert a == b
    c = Fleet(sc, seed=2).run().to_dict()
    assert c != a
    assert a["requests"] > 500 and a["completed"] > 0 and not math.isnan(a["ttft_p95_s"])


def test_control_validation_names_field_and_range():
    f = Fleet(scenario([pool(replicas=1, max_replicas=4)]), workload=workload([0.0], 100, 10))
    cases = [
        (lambda: f.set_pool_target("p8", replicas=9), r"replicas = 9 is outside \[min_replicas, max_replicas\]"),
        (lambda: f.set_pool_target("nope", replicas=1), "unknown pool 'nope'"),
        (lambda: f.set_pool_target("p8", replicas=1, max_num_seqs=0), r"max_num_seqs = 0 is outside \[1, 4096\]"),
        (lambda: f.set_pool_target("p8", replicas=1, max_num_seqs=512, max_num_batched_tokens=256),
         "must be >= max_num_seqs"),
        (lambda: f.set_admission("gold", rate_limit_rps=1, queue_budget=1, shed_frac=0), "unknown priority class"),
        (lambda: f.set_admission("standard", rate_limit_rps=1, queue_budget=1, shed_frac=1.5), "shed_frac = 1.5"),
        (lambda: f.set_pool_routing("p8", inflight_cap=-1), "inflight_cap = -1"),
        (lambda: f.set_pool_routing("p8", prefix_weight=float("nan")), "prefix_weight"),
        (lambda: f.inject_fault("meteor", "p8"), "kind = 'meteor'"),
    ]
    for call, msg in cases:
        with pytest.raises(ValueError, match=msg):
            call()
    assert f.pool_states()["p8"].target_replicas == 1


def test_apply_decision_is_all_or_nothing_and_reset_restores_defaults():
    f = Fleet(scenario([pool(replicas=1, max_replicas=4)]), workload=workload([0.0], 100, 10))
    bad = Decision("d-1", 1, 0.0, 30.0, pools={"p8": PoolDecision(replicas=3), "nope": PoolDecision(replicas=1)})
    with pytest.raises(ValueError, match="unknown pool 'nope'"):
        apply_decision(f, bad)
    assert f.pool_states()["p8"].target_replicas == 1
    good = Decision("d-2", 2, 0.0, 30.0, pools={"p8": PoolDecision(replicas=3, inflight_cap=4, prefix_weight=0.5)},
                    admission={"sheddable": ClassAdmission(rate_limit_rps=2.0, queue_budget=5, shed_frac=0.1)})
    apply_decision(f, good)
    assert f.pool_states()["p8"].target_replicas == 3
    assert f.router.pools["p8"].inflight_cap == 4 and f.router.pools["p8"].prefix_weight == 0.5
    assert f.router.classes[2].queue_budget == 5
    f.reset_controls()
    assert f.pool_states()["p8"].target_replicas == 1
    assert f.router.pools["p8"].inflight_cap == 0 and f.router.pools["p8"].prefix_weight == 3.0
    assert f.router.classes[2].queue_budget == -1 and f.router.classes[2].shed_frac == 0.0


def test_bad_engine_caps_in_the_scenario_are_named():
    sc = scenario([pool(engine=dict(max_num_seqs=512, max_num_batched_tokens=256))])
    with pytest.raises(ValueError, match=r"pools\[p8\]\.engine: max_num_batched_tokens \(256\) must be >= "):
        Fleet(sc, workload=workload([0.0], 100, 10))


def _random_fleet(seed: int) -> tuple[Fleet, np.random.Generator, list[str]]:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(40, 120))
    prompt = rng.integers(10, 6000, n)
    hashes = []
    for i in range(n):
        k = -(-int(prompt[i]) // 512)
        shared = min(k, int(rng.integers(0, 4)))
        g = int(rng.integers(3))
        hashes.append([1000 * g + j for j in range(shared)] + [10**6 + 1000 * i + j for j in range(k - shared)])
    tasks = np.arange(n) // int(rng.integers(1, 4))
    step = np.concatenate([np.arange(c) for c in np.bincount(tasks)])
    eng = dict(max_num_seqs=int(rng.choice([4, 16, 256])), max_num_batched_tokens=int(rng.choice([512, 2048, 8192])),
               gpu_memory_utilization=float(rng.choice([0.26, 0.3, 0.9])))  # 0.26: ~33k tokens of KV, preemptions
    if rng.random() < 0.3:
        pools = [pool(name="pre", role="prefill", group="g", replicas=int(rng.integers(0, 3)), engine=eng),
                 pool(name="dec", role="decode", group="g", replicas=int(rng.integers(1, 3)), engine=eng)]
    else:
        pools = [pool(name="a", replicas=int(rng.integers(0, 4)), engine=eng, warm_standby=int(rng.integers(0, 2)),
                      startup_cold_s=20.0, startup_warm_s=5.0),
                 pool(name="b", sku="h100-80gb", replicas=int(rng.integers(1, 3)), engine=eng, traffic_weight=0.5)]
    names = [p["name"] for p in pools]
    adm = {c: dict(queue_budget=int(rng.choice([-1, 2, 10])), shed_frac=float(rng.choice([0.0, 0.1])),
                   rate_limit_rps=float(rng.choice([0.0, 1.0, 5.0]))) for c in ("critical", "standard", "sheddable")}
    sc = scenario(pools, faults=[dict(kind=str(rng.choice(["crash", "preempt", "slow"])), pool=names[0],
                                      rate_per_hour=30.0)],
                  router=dict(inflight_cap=int(rng.choice([0, 2, 8])), admission=adm, hold_timeout_s=60.0),
                  clients=dict(timeout_s=float(rng.choice([10.0, 120.0])), max_retries=int(rng.integers(0, 3))))
    wl = workload(np.sort(rng.uniform(0, 120, n)).tolist(), prompt.tolist(), rng.integers(1, 800, n).tolist(),
                  priority=rng.integers(0, 3, n).tolist(), task_id=tasks.tolist(), step=step.tolist(), hashes=hashes)
    return Fleet(sc, seed=seed, workload=wl), rng, names


@pytest.mark.parametrize("seed", range(12))
def test_random_operations_keep_the_books_balanced(seed):
    """Faults, scaling, cap changes, routing changes and resets at random times: KV accounting stays
    consistent, every request ends completed or failed, every task resolves, idle engines hold no blocks."""
    f, rng, names = _random_fleet(seed)
    t = 0.0
    while not f.done:
        t += float(rng.uniform(1, 30))
        assert t < 10_000, "the simulation does not terminate"
        f.run_until(t)
        for p in f.pools.values():
            for i in p.insts:
                if i.engine is not None and i.engine.alive:
                    i.engine.cache.check()
        name = str(rng.choice(names))
        x = rng.random()
        if x < 0.15:
            f.set_pool_target(name, replicas=int(rng.integers(0, 4)), warm_standby=int(rng.integers(0, 2)))
        elif x < 0.2:
            f.set_pool_target(name, replicas=int(rng.integers(0, 4)), max_num_seqs=int(rng.choice([8, 64])),
                              max_num_batched_tokens=int(rng.choice([1024, 4096])))
        elif x < 0.25:
            f.inject_fault(str(rng.choice(["crash", "preempt", "slow"])), name)
        elif x < 0.3:
            f.set_pool_routing(name, inflight_cap=int(rng.integers(0, 5)), traffic_weight=float(rng.uniform(0, 2)))
        elif x < 0.33:
            f.reset_controls()
    s = f.summary()
    assert s.completed + s.failed == s.requests <= len(f.workload)  # a failed step's successors are never sent
    assert f._n_resolved == s.tasks
    for p in f.pools.values():
        for i in p.insts:
            e = i.engine
            if e is not None and not e.running and not e.n_waiting:
                assert e.cache.pinned_blocks == 0 and e.dec_blocks == 0
                assert e.cache.free_blocks + e.cache.cached_blocks == e.cache.total_blocks


def test_resolved_attainment_counts_only_tasks_that_are_done():
    # ten requests, one a second; cut at 4.5 s: the later ones have not arrived, so a summary
    # dividing by every task of the trace would read at most 5/10 even if every request was on time
    wl = workload([float(i) for i in range(10)], 200, 20, priority=0)
    fleet = Fleet(scenario(), seed=1, workload=wl)
    fleet.run_until(4.5)
    att, resolved = fleet.resolved_attainment()
    assert 0 < resolved <= 5
    assert att["critical"] == pytest.approx(1.0)
    assert fleet.summary().slo_attainment["critical"] <= 0.5
    fleet.run_until(60.0)
    att, resolved = fleet.resolved_attainment()
    assert resolved == 10 and att["critical"] == pytest.approx(fleet.summary().slo_attainment["critical"])
