"""ShadowActuator: records the exact commands GrpcActuator would send, and sends nothing."""

from __future__ import annotations

from google.protobuf.json_format import MessageToDict

from controller.actuation.grpc_actuator import GrpcActuator
from controller.actuation.shadow import ShadowActuator
from controller.clock import VirtualClock
from controller.types import ClassAdmission, Decision, PoolDecision
from tests.fakes.act_fleet import FakeFleetServer

T0 = 1_700_000_000.0


def _decision(generation: int) -> Decision:
    return Decision(decision_id=f"d-{generation}", generation=generation, at_s=T0, valid_until_s=T0 + 60,
                    pools={"a": PoolDecision(replicas=generation, inflight_cap=4), "b": PoolDecision(replicas=0)},
                    admission={"standard": ClassAdmission(shed_frac=0.1)})


def _as_dict(msg) -> dict:
    return MessageToDict(msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)


def test_shadow_sends_nothing_and_records_the_exact_messages():
    with FakeFleetServer() as shadow_fleet, FakeFleetServer() as real_fleet:
        shadow = ShadowActuator(clock=VirtualClock(T0), issuer="governor/test")
        outcomes = [shadow.apply(_decision(g)) for g in (1, 2)]
        assert shadow_fleet.total_calls == 0  # nothing left the process
        assert shadow.fleet_state() is None

        real = GrpcActuator(real_fleet.address, real_fleet.address, clock=VirtualClock(T0), issuer="governor/test")
        for g in (1, 2):
            assert real.apply(_decision(g)).status == "applied"
        real.close()

    assert [o.status for o in outcomes] == ["shadow", "shadow"]
    assert all(o.attempts == 0 and o.ok for o in outcomes)
    records = shadow.sent()
    assert [r["generation"] for r in records] == [1, 2]
    for record, rp, sp in zip(records, real_fleet.router.calls, real_fleet.autoscaler.calls, strict=True):
        assert record["router"] == _as_dict(rp)
        assert record["autoscaler"] == _as_dict(sp)
    assert records[0]["router"]["meta"]["valid_until_unix_s"] == T0 + 60
    assert records[1]["autoscaler"]["pools"][0] == {"pool": "a", "replicas": 2, "warm_standby": 0, "max_num_seqs": 0,
                                                   "max_num_batched_tokens": 0, "replace_replicas": []}


def test_shadow_keeps_a_bounded_number_of_records():
    shadow = ShadowActuator(keep=3)
    for g in range(1, 8):
        shadow.apply(_decision(g))
    assert [r["decision_id"] for r in shadow.sent()] == ["d-5", "d-6", "d-7"]
    assert shadow.health()[0] is True
