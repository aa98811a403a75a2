"""Under leader election a follower's PolicyService refuses writes (mode, overrides) and names the
leader; reads still work. The refusal comes from DaemonHandle.write_refusal (runtime/daemon.py)."""

from __future__ import annotations

import grpc

from controller.gen.governor.v1 import policy_pb2 as pb

REFUSAL = "this daemon (governor-1) does not lead shard 'governor': the leader is governor-0"


def _code(call):
    try:
        call()
    except grpc.RpcError as exc:
        return exc.code(), exc.details()
    return grpc.StatusCode.OK, ""


def test_a_follower_refuses_every_write_and_stores_nothing(api):
    api.daemon.refusal = REFUSAL
    writes = [
        lambda: api.stub.SetMode(pb.SetModeRequest(mode=pb.MODE_PAUSED, author="ana"), metadata=api.auth),
        lambda: api.stub.SetOverride(pb.SetOverrideRequest(override=pb.Override(
            kind=pb.OVERRIDE_KIND_PIN_REPLICAS, pool="pool-a", value=3, ttl_s=60, author="ana")), metadata=api.auth),
        lambda: api.stub.DeleteOverride(pb.DeleteOverrideRequest(id="o-1", author="ana"), metadata=api.auth),
    ]
    for call in writes:
        code, details = _code(call)
        assert code == grpc.StatusCode.FAILED_PRECONDITION and details == REFUSAL
    assert api.daemon.mode_calls == [] and api.store.get_mode() is None and api.store.list_audit() == []
    assert api.stub.GetStatus(pb.GetStatusRequest(), metadata=api.auth).mode == pb.MODE_ACTIVE  # reads still work

    api.daemon.refusal = None  # it became the leader
    assert _code(writes[0])[0] == grpc.StatusCode.OK
