"""Dynamo stack: the KV router's cost on our scorer, the SLA planner underneath, load shedding."""

from __future__ import annotations

import pytest

from controller.policies import ReplicaCapacity, build_policy
from controller.policies.dynamo_stack import DynamoStackPolicy, dynamo_weights, kv_capacity_tokens
from controller.policies.sla_planner import SlaPlannerPolicy
from tests.policies.builders import codes, decide, drive, fleet, inp, spec

FL = fleet(spec("p"))
CAP = {"p": ReplicaCapacity(rps=2.0)}


def test_weights_reproduce_dynamos_cost_ordering():
    # cost_i = w × prompt_blocks × (1 − hit_i) + active_i; our score_i = prefix × hit_i − kv × usage_i
    w, prompt, capacity = 1.0, 1200.0, 452_464.0
    rw = dynamo_weights(w, prompt, capacity)
    assert (rw.queue_weight, rw.kv_weight) == (0.0, 1.0)
    assert rw.prefix_weight == pytest.approx(1200 / 452_464)
    workers = [(0.9, 0.40), (0.0, 0.399), (0.5, 0.401)]  # (hit fraction, KV usage)
    cost = [w * prompt * (1 - h) + u * capacity for h, u in workers]
    score = [rw.prefix_weight * h - rw.kv_weight * u for h, u in workers]
    assert min(range(3), key=cost.__getitem__) == max(range(3), key=score.__getitem__)
    assert sorted(range(3), key=cost.__getitem__) == sorted(range(3), key=lambda i: -score[i])
    # weight 0: load only; no prompt known: overlap unused
    assert dynamo_weights(0.0, prompt, capacity).prefix_weight == 0.0
    assert dynamo_weights(1.0, None, capacity).prefix_weight == 0.0


def test_kv_capacity_comes_from_the_engine_table():
    assert kv_capacity_tokens(spec("p")) == pytest.approx(452_464, rel=0.01)  # Llama-3-8B on one A100


def test_routing_reads_the_mean_prompt_and_replicas_are_the_planners():
    pol = build_policy("dynamo-stack", FL, {"capacity": CAP, "adjustment_interval_s": 30.0})
    ref = SlaPlannerPolicy(CAP, adjustment_interval_s=30.0)
    steps = [(15.0 * k, {"p": dict(ready=2, rps=4.0 + k, prompt=1200.0 * (4.0 + k), kv=0.3, ttft=0.5)})
             for k in range(6)]
    ours = drive(pol, FL, steps, start={"p": 2})
    theirs = drive(ref, FL, steps, start={"p": 2})
    assert [o.pools["p"].replicas for o in ours] == [o.pools["p"].replicas for o in theirs]
    assert max(o.pools["p"].replicas for o in ours) > 2  # rising load: the planner scales up
    d = ours[-1].pools["p"]
    assert d.prefix_weight == pytest.approx(1200.0 / kv_capacity_tokens(spec("p")))
    assert (d.queue_weight, d.kv_weight) == (0.0, 1.0)
    assert ours[-1].diagnostics["router"]["p"]["mean_prompt_tokens"] == pytest.approx(1200.0)


def test_sheddable_is_shed_at_high_kv_only():
    pol = DynamoStackPolicy(CAP)
    s, out = decide(pol, pol.initial_state(), inp(0.0, {"p": dict(ready=2, rps=4.0, kv=0.5)}, fl=FL,
                                                   current={"p": 2}))
    assert out.admission == {}
    _, out = decide(pol, s, inp(15.0, {"p": dict(ready=2, rps=4.0, kv=0.95)}, fl=FL, current={"p": 2}))
    assert out.admission["sheddable"].shed_frac == 1.0 and set(out.admission) == {"sheddable"}
    assert "shed_sheddable" in codes(out, None)


def test_prefill_and_decode_pools_are_sized_apart():
    fl = fleet(spec("pre", role="prefill"), spec("dec", role="decode"))
    cap = {"pre": ReplicaCapacity(rps=1.0, prompt_tokens_per_s=4000.0), "dec": ReplicaCapacity(rps=4.0)}
    pol = DynamoStackPolicy(cap, adjustment_interval_s=30.0)
    steps = [(15.0 * k, {"pre": dict(ready=1, rps=8.0, prompt=32000.0), "dec": dict(ready=1, rps=8.0, kv=0.2)})
             for k in range(4)]
    out = drive(pol, fl, steps, start={"pre": 1, "dec": 1})[-1]
    # prefill on prompt tokens: 32000 / 4000 = 8; decode on requests: 8 / 4 = 2
    assert (out.pools["pre"].replicas, out.pools["dec"].replicas) == (8, 2)


def test_kv_capacity_override_and_refusals():
    pol = DynamoStackPolicy(CAP, kv_capacity_tokens={"p": 100_000.0})
    _, out = decide(pol, pol.initial_state(), inp(0.0, {"p": dict(ready=2, rps=2.0, prompt=2000.0)}, fl=FL,
                                                   current={"p": 2}))
    assert out.pools["p"].prefix_weight == pytest.approx(1000.0 / 100_000.0)
    with pytest.raises(ValueError, match="router_temperature"):
        build_policy("dynamo-stack", FL, {"capacity": CAP, "router_temperature": 0.5})
    with pytest.raises(ValueError, match="capacity has no entry"):
        build_policy("dynamo-stack", fleet(spec("p"), spec("q")), {"capacity": CAP})
