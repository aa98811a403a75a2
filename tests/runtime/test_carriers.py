"""The MPC plans only the levers a configured actuator carries (issue 32): the carriers of each actuator
kind, the groups held when nobody carries them, the daemon's planner built with them held, and
`governor config validate` naming who carries each lever."""

from __future__ import annotations

import argparse
import logging

from controller.config import parse_settings
from controller.config.carriers import actuator_carriers, carriage, carriage_table, held_levers
from controller.levers import Carrier, carried_by, plan_groups
from controller.policies.mpc.policy import MpcPolicy
from controller.runtime.main import DEMO_SCENARIO, build_controller, demo_settings
from controller.runtime.preflight import cmd_validate
from controller.sim.scenario import load_scenario

POOLS = """\
policy: mpc
pools:
  - {name: chat-h100, model: llama-3-8b, sku: h100-80gb, usd_per_gpu_hour: 3.0, min_replicas: 1, max_replicas: 8}
  - {name: chat-a100, model: llama-3-8b, sku: a100-80gb, usd_per_gpu_hour: 1.5, max_replicas: 4}
"""
KEDA = "actuators:\n  keda: {enabled: true}\n"
ROUTER = "actuators:\n  router: {address: '127.0.0.1:50061'}\n"
AUTOSCALER = "actuators:\n  autoscaler: {address: '127.0.0.1:50062'}\n"
KUBE = """\
actuators:
  kubernetes:
    enabled: true
    pools:
      - {pool: chat-h100, name: vllm-h100}
      - {pool: chat-a100, name: vllm-a100}
    routers:
      - {kind: vllm-router, url: 'http://127.0.0.1:30000'}
      - {kind: sglang-router, url: 'http://127.0.0.1:30001'}
"""


def held_by(ctl) -> tuple[str, ...]:
    policy = ctl.policy
    assert isinstance(policy, MpcPolicy)
    return policy.config.fixed_levers


def settings(actuators: str = "", extra: str = ""):
    return parse_settings(POOLS + actuators + extra)


def test_each_actuator_kind_is_its_carriers():
    assert actuator_carriers(settings(KEDA)) == {"keda 127.0.0.1:50052": {Carrier.KEDA}}
    assert actuator_carriers(settings(ROUTER)) == {"router 127.0.0.1:50061": {Carrier.PICKER}}
    assert actuator_carriers(settings(AUTOSCALER)) == {"autoscaler 127.0.0.1:50062": {Carrier.AUTOSCALER}}
    assert actuator_carriers(settings(KUBE)) == {
        "kubernetes": {Carrier.KUBERNETES}, "vllm-router http://127.0.0.1:30000": {Carrier.VLLM_ROUTER},
        "sglang-router http://127.0.0.1:30001": {Carrier.SGLANG_ROUTER}}
    assert actuator_carriers(settings()) == {}
    # what each carries, per docs/OPERATING.md: the membership routers none of the levers
    assert carried_by([Carrier.VLLM_ROUTER]) == () and carried_by([Carrier.SGLANG_ROUTER]) == ()
    assert [lv.name for lv in carried_by([Carrier.AUTOSCALER])] == [
        "replicas", "warm_standby", "max_num_seqs", "max_num_batched_tokens"]


def test_keda_alone_holds_every_group_and_plans_only_replicas():
    s = settings(KEDA)
    assert held_levers(s) == plan_groups() == (
        "affinity", "inflight_cap", "traffic_split", "standby", "batch_caps", "admission")
    planned = {c.lever.name for c in carriage(s) if c.planned == "yes"}
    assert planned == {"replicas"}


def test_held_groups_follow_what_is_carried():
    assert held_levers(settings(KUBE)) == ("affinity", "inflight_cap", "traffic_split", "admission")
    assert held_levers(settings(ROUTER)) == ("standby", "batch_caps")
    assert held_levers(settings(AUTOSCALER)) == ("affinity", "inflight_cap", "traffic_split", "admission")
    assert held_levers(settings(KUBE + "  router: {address: '127.0.0.1:50061'}\n")) == ()
    assert held_levers(settings()) == ()  # no actuator: decisions only recorded, every lever planned


def test_the_daemons_planner_holds_what_nobody_carries_and_keeps_what_the_operator_holds(caplog):
    with caplog.at_level(logging.INFO, logger="governor"):
        ctl = build_controller(settings(KEDA))
    assert held_by(ctl) == plan_groups()
    assert any("mpc: holding affinity, inflight_cap" in r.getMessage() and "keda" in r.getMessage()
               for r in caplog.records)
    own = "policy_params:\n  planner: {fixed_levers: [affinity]}\n"
    ctl = build_controller(settings(KUBE, own))
    assert held_by(ctl) == ("affinity", "inflight_cap", "traffic_split", "admission")
    ctl = build_controller(settings(ROUTER + "  autoscaler: {address: '127.0.0.1:50062'}\n", own))
    assert held_by(ctl) == ("affinity",)  # everything carried: only the operator's hold


def test_the_demo_plans_every_lever(tmp_path, caplog):
    listening = {"discovery": "http://127.0.0.1:1/sd", "router_control": "127.0.0.1:50061",
                 "autoscaler_control": "127.0.0.1:50062"}
    s = demo_settings(load_scenario(DEMO_SCENARIO), listening, str(tmp_path))
    assert held_levers(s) == ()
    with caplog.at_level(logging.INFO, logger="governor"):
        ctl = build_controller(s)
    assert held_by(ctl) == ()
    assert not any("mpc: holding" in r.getMessage() for r in caplog.records)


def test_config_validate_prints_who_carries_each_lever(tmp_path, capsys):
    path = tmp_path / "g.yaml"
    path.write_text(POOLS + ROUTER + "  keda: {enabled: true}\n")
    assert cmd_validate(argparse.Namespace(file=str(path))) == 0
    lines = {ln.split()[0]: ln for ln in capsys.readouterr().out.splitlines()[1:]}
    assert lines["replicas"].split()[1] == "yes" and lines["replicas"].endswith("keda 127.0.0.1:50052")
    assert lines["prefix_weight"].split()[1] == "yes" and lines["prefix_weight"].endswith("router 127.0.0.1:50061")
    assert lines["warm_standby"].split()[1] == "no" and lines["warm_standby"].endswith("nobody: held at default")
    assert lines["max_num_seqs"].endswith("nobody: held at default")
    assert lines["tenant_weight"].split()[1:4] == ["not", "by", "the"]  # the MPC never plans it

    keda_only = settings(KEDA)
    table = {ln.split()[0]: ln for ln in carriage_table(keda_only).splitlines()[1:]}
    assert table["replicas"].split()[1] == "yes" and table["replicas"].endswith("keda 127.0.0.1:50052")
    assert table["warm_standby"].split()[1] == "no" and table["warm_standby"].endswith("nobody: held at default")
    assert table["shed_frac"].endswith("nobody: held at default")
