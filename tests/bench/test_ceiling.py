"""The capacity ceiling (controller/bench/ceiling.py): its decision as a table, and its replay through
`bench policies` on the tiny scenario: every pool at max_replicas, the sheddable class refused, the
classes the SLO bar counts served."""

from __future__ import annotations

import contextlib
import io
import json

import numpy as np
import pytest

from controller.bench.ceiling import CeilingPolicy, ceiling_policy
from controller.cli import main
from controller.policies.common import RoutingWeights
from controller.sim.scenario import load_scenario
from controller.types import FleetObservation, FleetSpec, PolicyInput, PoolSpec, SloSpec

SLOS = {"critical": SloSpec(2.5, 0.1), "standard": SloSpec(5.0, 0.15), "sheddable": SloSpec(10.0, 0.3)}


def decide(pools: tuple[PoolSpec, ...], slos: dict[str, SloSpec]):
    fleet = FleetSpec(pools=pools, slos=slos)
    policy = CeilingPolicy({p.name: RoutingWeights(3.0, 2.0, 2.0) for p in pools}, {pools[0].name: 0.6})
    inp = PolicyInput(now_s=15.0, observation=FleetObservation(at_s=15.0, pools={}), fleet=fleet, current=None)
    return policy.decide(None, inp, np.random.default_rng(0))[1]


@pytest.mark.parametrize(("label", "pools", "slos", "replicas", "weights", "shed"), [
    ("one pool, three classes", (PoolSpec("a", "llama-3-8b", "a100-80gb", max_replicas=6),), SLOS,
     {"a": 6}, {"a": 0.6}, {"sheddable": 1.0}),
    ("two pools: each at its own maximum, the scenario's split", (
        PoolSpec("a", "llama-3-8b", "a100-80gb", max_replicas=3),
        PoolSpec("b", "llama-3-8b", "h100-80gb", max_replicas=8)), SLOS,
     {"a": 3, "b": 8}, {"a": 0.6, "b": 1.0}, {"sheddable": 1.0}),
    ("no sheddable class: nothing is shed", (PoolSpec("a", "llama-3-8b", "a100-80gb", max_replicas=4),),
     {c: s for c, s in SLOS.items() if c != "sheddable"}, {"a": 4}, {"a": 0.6}, {}),
])
def test_every_pool_at_its_maximum_and_the_sheddable_class_shed(label, pools, slos, replicas, weights, shed) -> None:
    out = decide(pools, slos)
    assert {p: d.replicas for p, d in out.pools.items()} == replicas, label
    assert {p: d.traffic_weight for p, d in out.pools.items()} == weights, label
    assert {c: a.shed_frac for c, a in out.admission.items()} == shed, label
    assert {r.code for r in out.reasons} == {"ceiling"}


def test_the_ceiling_takes_the_scenarios_router_and_split(tiny_scenario) -> None:
    sc = load_scenario(tiny_scenario)
    policy = ceiling_policy(sc)
    assert set(policy.routing) == {p.name for p in sc.pools}
    r = policy.routing["small"]
    assert (r.prefix_weight, r.queue_weight, r.kv_weight) == (sc.router.prefix_weight, sc.router.queue_weight,
                                                              sc.router.kv_weight)


def test_bench_policies_replays_the_ceiling(tiny_scenario, tmp_path) -> None:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["bench", "policies", "--scenario", str(tiny_scenario), "--policies", "static,ceiling",
                     "--out", str(tmp_path), "--json"])
    assert code == 0, err.getvalue()
    pols = json.loads(out.getvalue())["policies"]
    ceiling, static = pols["ceiling"], pols["static"]
    assert ceiling["replicas_peak"] == {"small": 8}  # the tiny pool's max_replicas
    att = ceiling["slo_attainment"]
    assert att["critical"] >= 0.99 and att["standard"] >= 0.99  # at the maximum, what the bar counts is served
    assert att["sheddable"] < 0.05 and ceiling["shed"] > 0  # and the sheddable class is refused
    assert ceiling["gpu_hours"] > static["gpu_hours"]
