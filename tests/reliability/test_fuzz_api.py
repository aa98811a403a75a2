"""Fuzz every PolicyService RPC and every KEDA external-scaler RPC over real gRPC on loopback (issue 21).

Properties, per request: the server answers (no crash, never UNKNOWN or INTERNAL: no unhandled exception);
an invalid request is INVALID_ARGUMENT whose message starts with the field it names and stays short; a
rejected request (and every read) leaves the state as it was (overrides, audit trail, mode, generation).

Default run: FUZZ_CASES (seeded, derandomized) per RPC. GOVERNOR_FUZZ_FULL=1: 10,000 per RPC, e.g.
    GOVERNOR_FUZZ_FULL=1 PYTHONPATH=$PWD .venv/bin/python -m pytest -q -p no:timeout tests/reliability/test_fuzz_api.py
(-p no:timeout: a full run is longer than the suite's 300 s per-test timeout)
"""

from __future__ import annotations

import os
import time

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controller.actuation.keda import KedaScalerServer
from controller.api.server import MAX_ERROR_CHARS
from controller.gen.externalscaler import externalscaler_pb2, externalscaler_pb2_grpc
from controller.gen.governor.v1 import policy_pb2
from tests.reliability.api_harness import T0, running_api

FULL = os.environ.get("GOVERNOR_FUZZ_FULL") == "1"
FUZZ_CASES = 10_000 if FULL else 60
FUZZ = settings(max_examples=FUZZ_CASES, derandomize=True, database=None, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.data_too_large])

NAMES = ["", "pool-a", "pool-b", "critical", "standard", "sheddable", "balanced", "cost", "ov-000001",
         "d-00000001", " ", "alice"]
texts = st.one_of(st.sampled_from(NAMES), st.text(max_size=24),
                  st.text(alphabet=st.characters(max_codepoint=0x9F), max_size=8),  # C0/C1 controls often
                  st.text(min_size=250, max_size=600))
floats = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, 0.5, 1.0, 2.0, 600.0, -1.0]))
int32 = st.one_of(st.integers(-2, 10), st.integers(-(2**31), 2**31 - 1))
random_overrides = st.builds(policy_pb2.Override, id=texts, kind=int32, pool=texts, priority_class=texts,
                             value=floats, text=texts, ttl_s=floats, author=texts, reason=texts,
                             created_unix_s=floats, expires_unix_s=floats)
valid_overrides = st.builds(policy_pb2.Override, kind=st.sampled_from([1, 2, 3, 4]),
                            pool=st.sampled_from(["pool-a", "pool-b"]), value=st.integers(0, 50).map(float),
                            ttl_s=st.floats(1.0, 3600.0), author=st.sampled_from(["alice", "bob"]),
                            reason=st.text(alphabet=st.characters(categories=["L", "N", "Zs"]), max_size=40))
FUZZ_FIELD = {"id": texts, "kind": int32, "pool": texts, "priority_class": texts, "value": floats, "text": texts,
              "ttl_s": floats, "author": texts, "reason": texts}


@st.composite
def one_field_off(draw) -> policy_pb2.Override:
    """A valid override with one field replaced by a fuzzed value: reaches every check, not just the first."""
    o = draw(valid_overrides)
    name = draw(st.sampled_from(sorted(FUZZ_FIELD)))
    setattr(o, name, draw(FUZZ_FIELD[name]))
    return o


overrides = st.one_of(valid_overrides, random_overrides, one_field_off())

REQUESTS = {
    "GetStatus": st.just(policy_pb2.GetStatusRequest()),
    "ListDecisions": st.builds(policy_pb2.ListDecisionsRequest, limit=int32, since_unix_s=floats, pool=texts),
    "ExplainDecision": st.builds(policy_pb2.ExplainDecisionRequest, decision_id=texts),
    "SetOverride": st.one_of(st.just(policy_pb2.SetOverrideRequest()),
                             st.builds(policy_pb2.SetOverrideRequest, override=overrides)),
    "ListOverrides": st.builds(policy_pb2.ListOverridesRequest, include_expired=st.booleans()),
    "DeleteOverride": st.builds(policy_pb2.DeleteOverrideRequest, id=texts, author=texts),
    "SetMode": st.builds(policy_pb2.SetModeRequest, mode=int32, author=texts, reason=texts),
    "ListAudit": st.builds(policy_pb2.ListAuditRequest, limit=int32),
}
WRITES = {"SetOverride", "DeleteOverride", "SetMode"}
# RPCs whose generated requests must include both accepted and refused ones: a fuzz that only ever hits the
# first check proves nothing about the rest
MIXED = {"SetOverride", "DeleteOverride", "SetMode", "ListDecisions", "ListAudit", "ExplainDecision"}
FIELDS = {"limit", "since_unix_s", "pool", "decision_id", "override", "id", "author", "reason", "mode"}


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    with running_api(tmp_path_factory.mktemp("fuzz-api"), max_overrides=50) as a:
        for i in range(1, 4):
            a.store.record_decision({"decision_id": f"d-{i:08d}", "generation": i, "at_s": T0 + i, "mode": "active",
                                     "summary": "ok", "pools": {"pool-a": {"replicas": 2}}})
        yield a


@pytest.mark.parametrize("rpc", sorted(REQUESTS))
def test_policy_service_rpc(api, rpc):
    call = getattr(api.stub, rpc)
    seen: set[grpc.StatusCode] = set()

    @FUZZ
    @given(REQUESTS[rpc])
    def one(request):
        before = api.snapshot()
        try:
            call(request, metadata=api.metadata, timeout=10)
            code, details = grpc.StatusCode.OK, ""
        except grpc.RpcError as exc:
            code, details = exc.code(), exc.details() or ""
        seen.add(code)
        assert code in (grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND), \
            (code, details[:200])
        if code == grpc.StatusCode.INVALID_ARGUMENT:
            field = details.split(":", 1)[0]
            assert field.split(".")[0] in FIELDS, details[:200]
            assert len(details) <= MAX_ERROR_CHARS
        if code != grpc.StatusCode.OK or rpc not in WRITES:
            assert api.snapshot() == before, (rpc, code, details[:200])

    one()
    if rpc in MIXED:
        assert grpc.StatusCode.INVALID_ARGUMENT in seen and (seen - {grpc.StatusCode.INVALID_ARGUMENT}), seen
    assert api.stub.GetStatus(policy_pb2.GetStatusRequest(), metadata=api.metadata, timeout=5).generation == 7


# --------------------------------------------------------------------------- the KEDA external scaler

refs = st.builds(externalscaler_pb2.ScaledObjectRef, name=texts, namespace=texts,
                 scalerMetadata=st.one_of(st.dictionaries(texts, texts, max_size=3),
                                          st.builds(lambda p: {"pool": p}, texts)))
KEDA_REQUESTS = {
    "IsActive": refs,
    "StreamIsActive": refs,
    "GetMetricSpec": refs,
    "GetMetrics": st.builds(externalscaler_pb2.GetMetricsRequest, scaledObjectRef=refs, metricName=texts),
    "StreamMetricSpec": refs,
}


@pytest.fixture(scope="module")
def keda():
    server = KedaScalerServer(lambda: {"pool-a": 3, "pool-b": 0}, "127.0.0.1:0", stream_poll_s=0.02)
    port = server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    yield server, externalscaler_pb2_grpc.ExternalScalerStub(channel)
    channel.close()
    server.stop(0)


@pytest.mark.parametrize("rpc", sorted(KEDA_REQUESTS))
def test_keda_scaler_rpc(keda, rpc):
    server, stub = keda
    call = getattr(stub, rpc)
    streaming = rpc.startswith("Stream")

    @FUZZ
    @given(KEDA_REQUESTS[rpc])
    def one(request):
        try:
            if streaming:
                stream = call(request, timeout=10)
                try:
                    next(stream)
                finally:
                    stream.cancel()
            else:
                call(request, timeout=10)
            code, details = grpc.StatusCode.OK, ""
        except grpc.RpcError as exc:
            code, details = exc.code(), exc.details() or ""
        allowed = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND}
        if rpc == "StreamMetricSpec":
            allowed = {grpc.StatusCode.UNIMPLEMENTED}
        if streaming and code == grpc.StatusCode.CANCELLED:
            code = grpc.StatusCode.OK  # our own cancel after the first answer
        assert code in allowed, (code, details[:200])
        if code == grpc.StatusCode.INVALID_ARGUMENT:
            assert details.startswith("scalerMetadata.pool"), details[:200]
            assert len(details) < 400
        if streaming:  # the stream slot is given back (no slow leak that would end in RESOURCE_EXHAUSTED)
            deadline = time.monotonic() + 5
            while server._streams and time.monotonic() < deadline:
                time.sleep(0.005)
            assert server._streams == 0

    one()
