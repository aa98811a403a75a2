"""KEDA external scaler: wire compatibility with KEDA's proto, streaming, errors, health and reflection.

The compatibility test compiles a proto with KEDA's package, service, message names and field numbers
(docs/TELEMETRY.md §6) at test time, and calls every RPC from a separate Python process that imports
only those stubs (a second definition of `externalscaler.*` could not share this process's descriptor
pool with controller.gen), exactly as KEDA's Go client would reach us: by names and field numbers.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_tools import protoc

from controller.actuation.keda import KedaScalerServer
from controller.gen.externalscaler import externalscaler_pb2 as pb
from controller.gen.externalscaler import externalscaler_pb2_grpc as pb_grpc
from tests.fixtures.prometheus import wait_until

KEDA_PROTO = """\
syntax = "proto3";
package externalscaler;
option go_package = ".;externalscaler";

service ExternalScaler {
  rpc IsActive(ScaledObjectRef) returns (IsActiveResponse) {}
  rpc StreamIsActive(ScaledObjectRef) returns (stream IsActiveResponse) {}
  rpc GetMetricSpec(ScaledObjectRef) returns (GetMetricSpecResponse) {}
  rpc GetMetrics(GetMetricsRequest) returns (GetMetricsResponse) {}
  rpc StreamMetricSpec(ScaledObjectRef) returns (stream GetMetricSpecResponse) {}
}
message ScaledObjectRef { string name = 1; string namespace = 2; map<string, string> scalerMetadata = 3; }
message IsActiveResponse { bool result = 1; }
message GetMetricSpecResponse { repeated MetricSpec metricSpecs = 1; }
message MetricSpec { string metricName = 1; int64 targetSize = 2 [deprecated = true]; double targetSizeFloat = 3; }
message GetMetricsRequest { ScaledObjectRef scaledObjectRef = 1; string metricName = 2; }
message GetMetricsResponse { repeated MetricValue metricValues = 1; }
message MetricValue { string metricName = 1; int64 metricValue = 2 [deprecated = true]; double metricValueFloat = 3; }
"""

KEDA_CLIENT = """\
import json, sys
sys.path.insert(0, sys.argv[1])
import grpc
import keda_externalscaler_pb2 as pb
import keda_externalscaler_pb2_grpc as pb_grpc

stub = pb_grpc.ExternalScalerStub(grpc.insecure_channel(sys.argv[2]))
def ref(**md):
    return pb.ScaledObjectRef(name="llm-pool", namespace="inference", scalerMetadata=md)
def error(call):
    try:
        call()
    except grpc.RpcError as exc:
        return [exc.code().name, exc.details()]
    return None

out = {"module": pb.__name__}
spec = stub.GetMetricSpec(ref(pool="pool-a"), timeout=5).metricSpecs
out["spec"] = [[s.metricName, s.targetSize, s.targetSizeFloat] for s in spec]
values = stub.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=ref(pool="pool-a"), metricName=spec[0].metricName),
                         timeout=5)
out["metrics"] = [[v.metricName, v.metricValue, v.metricValueFloat] for v in values.metricValues]
out["active"] = {p: stub.IsActive(ref(pool=p), timeout=5).result for p in ("pool-a", "pool-idle")}
stream = stub.StreamIsActive(ref(pool="pool-a"), timeout=5)
out["stream_first"] = next(stream).result
stream.cancel()
out["stream_metric_spec"] = error(lambda: next(stub.StreamMetricSpec(ref(pool="pool-a"), timeout=5)))
out["missing_pool"] = error(lambda: stub.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=ref(model="x")), timeout=5))
out["unknown_pool"] = error(lambda: stub.IsActive(ref(pool="nope"), timeout=5))
print(json.dumps(out))
"""


class Targets:
    """A thread-safe mutable targets mapping, as the runtime would provide."""

    def __init__(self, **targets: int) -> None:
        self._lock = threading.Lock()
        self._targets = dict(targets)

    def set(self, pool: str, n: int) -> None:
        with self._lock:
            self._targets[pool] = n

    def __call__(self) -> dict[str, int]:
        with self._lock:
            return dict(self._targets)


@pytest.fixture
def scaler():
    targets = Targets(**{"pool-a": 7, "pool-idle": 0})
    server = KedaScalerServer(targets, "127.0.0.1:0", stream_poll_s=0.05, max_streams=2)
    port = server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    yield server, targets, channel
    channel.close()
    server.stop(0)


def _ref(**md) -> pb.ScaledObjectRef:
    return pb.ScaledObjectRef(name="llm-pool", namespace="inference", scalerMetadata=md)


def test_keda_client_from_kedas_proto_calls_every_rpc(scaler, tmp_path):
    server, _, _ = scaler
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    (tmp_path / "keda_externalscaler.proto").write_text(KEDA_PROTO)
    rc = protoc.main(["protoc", f"-I{tmp_path}", f"--python_out={stubs}", f"--grpc_python_out={stubs}",
                      str(tmp_path / "keda_externalscaler.proto")])
    assert rc == 0
    (tmp_path / "client.py").write_text(KEDA_CLIENT)
    proc = subprocess.run([sys.executable, str(tmp_path / "client.py"), str(stubs), f"127.0.0.1:{server.port}"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)

    assert out["module"] == "keda_externalscaler_pb2"
    assert out["spec"] == [["governor-replicas-pool-a", 1, 1.0]]  # deprecated int64 targetSize and targetSizeFloat
    assert out["metrics"] == [["governor-replicas-pool-a", 7, 7.0]]  # deprecated int64 metricValue and the float
    assert out["active"] == {"pool-a": True, "pool-idle": False}
    assert out["stream_first"] is True
    assert out["stream_metric_spec"][0] == "UNIMPLEMENTED"
    assert out["missing_pool"][0] == "INVALID_ARGUMENT" and "scalerMetadata.pool" in out["missing_pool"][1]
    assert out["unknown_pool"][0] == "NOT_FOUND" and "'nope'" in out["unknown_pool"][1]


def test_stream_is_active_pushes_changes_and_ends_on_cancel(scaler):
    server, targets, channel = scaler
    stub = pb_grpc.ExternalScalerStub(channel)
    stream = stub.StreamIsActive(_ref(pool="pool-a"), timeout=30)
    assert next(stream).result is True
    targets.set("pool-a", 0)
    server.notify()  # the runtime calls this after a decision
    assert next(stream).result is False
    targets.set("pool-a", 2)  # no notify: the stream's poll picks it up
    assert next(stream).result is True
    assert server._streams == 1
    stream.cancel()
    wait_until(lambda: server._streams == 0, deadline_s=10, interval_s=0.02, what="stream released after cancel")


def test_stream_count_is_bounded(scaler):
    server, _, channel = scaler
    stub = pb_grpc.ExternalScalerStub(channel)
    streams = [stub.StreamIsActive(_ref(pool="pool-a"), timeout=30) for _ in range(server.max_streams)]
    for s in streams:
        assert next(s).result is True
    extra = stub.StreamIsActive(_ref(pool="pool-a"), timeout=30)
    with pytest.raises(grpc.RpcError) as err:
        next(extra)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    for s in streams:
        s.cancel()
    wait_until(lambda: server._streams == 0, deadline_s=10, interval_s=0.02, what="streams released")


def test_stop_ends_open_streams(scaler):
    server, _, channel = scaler
    stream = pb_grpc.ExternalScalerStub(channel).StreamIsActive(_ref(pool="pool-a"), timeout=30)
    assert next(stream).result is True
    server.stop(grace_s=5)
    with pytest.raises((StopIteration, grpc.RpcError)):
        next(stream)


def test_targets_failure_is_unavailable_and_negative_is_zero():
    def broken() -> dict[str, int]:
        raise RuntimeError("no decision yet")

    for targets, check in ((broken, "error"), (lambda: {"p": -3}, "zero")):
        server = KedaScalerServer(targets, "127.0.0.1:0")
        port = server.start()
        try:
            with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
                stub = pb_grpc.ExternalScalerStub(ch)
                req = pb.GetMetricsRequest(scaledObjectRef=_ref(pool="p"))
                if check == "error":
                    with pytest.raises(grpc.RpcError) as err:
                        stub.GetMetrics(req, timeout=5)
                    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
                    assert "no decision yet" in (err.value.details() or "")
                else:
                    [v] = stub.GetMetrics(req, timeout=5).metricValues
                    assert (v.metricValue, v.metricValueFloat) == (0, 0.0)
                    assert stub.IsActive(_ref(pool="p"), timeout=5).result is False
        finally:
            server.stop(0)


def test_health_and_reflection(scaler):
    _, _, channel = scaler
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", "externalscaler.ExternalScaler"):
        # the stubs declare no RPCs on HealthStub
        resp = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)  # type: ignore[attr-defined]
        assert resp.status == health_pb2.HealthCheckResponse.SERVING
    refl = reflection_pb2_grpc.ServerReflectionStub(channel)
    requests = iter([reflection_pb2.ServerReflectionRequest(list_services="")])
    [resp] = list(refl.ServerReflectionInfo(requests, timeout=5))  # type: ignore[operator]  # stubs: Incomplete
    names = {s.name for s in resp.list_services_response.service}
    assert "externalscaler.ExternalScaler" in names and "grpc.health.v1.Health" in names
