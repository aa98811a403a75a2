"""The MPC's reliability dial set live through the real PolicyService, end to end on loopback gRPC.

A daemon (the MPC, a fixed reading of one busy pool, shadow mode) and its PolicyServer: SetOverride
`reliability` is validated and audited like every override, the next tick plans with it, and
`governor status` (GetStatus) and `governor explain` (ExplainDecision) show the setting in force and
where it came from; once the override is deleted the profile's own setting is back.
"""

from __future__ import annotations

import json
import logging

import grpc
import pytest

from controller.actuation.shadow import ShadowActuator
from controller.api.server import PolicyServer
from controller.api.store import StateStore
from controller.clock import VirtualClock
from controller.config import Settings
from controller.gen.governor.v1 import policy_pb2, policy_pb2_grpc
from controller.obs.daemon_metrics import DaemonMetrics
from controller.runtime.daemon import Daemon
from controller.runtime.learning import Learning
from controller.runtime.main import build_controller
from tests.runtime.test_memory_status import POOLS, _Fixed

TOKEN = "dial-token"
AUTH = (("authorization", f"Bearer {TOKEN}"),)


@pytest.fixture
def served(tmp_path):
    settings = Settings(policy="mpc", state_dir=str(tmp_path), pools=POOLS)
    clock = VirtualClock(1000.0)
    learning = Learning(settings.fleet_spec(), tmp_path, clock=clock, logger=logging.getLogger("test"))
    store = StateStore(tmp_path / "governor.db")
    daemon = Daemon(controller=build_controller(settings, learning), source=_Fixed(0.5), actuator=None,
                    shadow=ShadowActuator(clock=clock), store=store, metrics=DaemonMetrics(), clock=clock,
                    logger=logging.getLogger("test"), mode=settings.mode, learning=learning)
    server = PolicyServer(daemon, store, "127.0.0.1:0", token=TOKEN, clock=clock)
    port = server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    yield daemon, policy_pb2_grpc.PolicyServiceStub(channel), clock
    channel.close()
    server.stop(0)
    store.close()


def _status_dial(stub) -> str:
    st = stub.GetStatus(policy_pb2.GetStatusRequest(), metadata=AUTH, timeout=10)
    return {d.name: d.value for d in st.details}["planner.reliability"]


def _explained_dial(stub, decision_id: str) -> dict:
    ex = stub.ExplainDecision(policy_pb2.ExplainDecisionRequest(decision_id=decision_id), metadata=AUTH, timeout=10)
    assert "reliability:" in ex.text  # the rendered account shows it under the predictions
    return json.loads(ex.json)["diagnostics"]["reliability"]


def _tick(daemon, clock) -> str:
    clock.advance(15.0)
    return daemon.tick().result.decision.decision_id


def test_reliability_override_round_trip(served):
    daemon, stub, clock = served
    first = _tick(daemon, clock)
    assert _status_dial(stub).startswith("0.6 (profile balanced): plans for ")
    assert _explained_dial(stub, first)["source"] == "profile balanced"

    req = policy_pb2.Override(kind=policy_pb2.OVERRIDE_KIND_RELIABILITY, value=0.95, ttl_s=600, author="alice",
                              reason="launch day")
    o = stub.SetOverride(policy_pb2.SetOverrideRequest(override=req), metadata=AUTH, timeout=10)
    assert o.kind == policy_pb2.OVERRIDE_KIND_RELIABILITY and o.value == 0.95
    second = _tick(daemon, clock)
    assert _status_dial(stub).startswith("0.95 (override): plans for ")
    dial = _explained_dial(stub, second)
    assert dial["value"] == 0.95 and dial["source"] == "override"
    assert dial["planned_rps"] > dial["median_rps"]
    audit = stub.ListAudit(policy_pb2.ListAuditRequest(limit=10), metadata=AUTH, timeout=10)
    assert any(e.action == "override.set" and "reliability" in e.detail and "value=0.95" in e.detail
               and e.author == "alice" for e in audit.entries)

    stub.DeleteOverride(policy_pb2.DeleteOverrideRequest(id=o.id, author="alice"), metadata=AUTH, timeout=10)
    third = _tick(daemon, clock)
    assert _explained_dial(stub, third)["source"] == "profile balanced"


@pytest.mark.parametrize("value", [0.3, 0.995, float("nan")])
def test_an_out_of_range_reliability_is_refused_and_nothing_is_stored(served, value):
    _, stub, _ = served
    req = policy_pb2.Override(kind=policy_pb2.OVERRIDE_KIND_RELIABILITY, value=value, ttl_s=600, author="alice")
    with pytest.raises(grpc.RpcError) as exc:
        stub.SetOverride(policy_pb2.SetOverrideRequest(override=req), metadata=AUTH, timeout=10)
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (exc.value.details() or "").startswith("override.value: ")
    listed = stub.ListOverrides(policy_pb2.ListOverridesRequest(include_expired=True), metadata=AUTH, timeout=10)
    assert not listed.overrides
