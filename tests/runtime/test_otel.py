"""OpenTelemetry: a real Daemon's tick exported over OTLP/gRPC to a loopback collector (the OTLP
trace and metrics services from opentelemetry-proto, served by grpcio), and to the SDK's in-memory
exporter and reader. Checks span names, parentage, times (on the virtual clock) and attributes, and
the metric names and attributes the collector receives."""

from __future__ import annotations

import logging
import threading
from concurrent import futures

import grpc
import pytest
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from controller.actuation.shadow import ShadowActuator
from controller.api.store import StateStore
from controller.clock import VirtualClock
from controller.config import Settings
from controller.config.sections import OtlpSettings
from controller.obs.daemon_metrics import DaemonMetrics
from controller.obs.otel import build_tick_telemetry
from controller.runtime.daemon import Daemon
from controller.runtime.main import build_controller
from controller.types import Mode
from tests.fakes.observations import fleet_obs, pool_obs

POOLS = [{"name": "chat", "model": "llama-3-8b", "sku": "h100-80gb", "usd_per_gpu_hour": 2.0, "min_replicas": 1,
          "max_replicas": 8}]
PHASES = ("read", "step", "actuate", "learn")
T0 = 1_800_000_000.0


class SlowSource:
    """Reads take 0.25 s of virtual time, so the read span has a known length."""

    name = "fixed"

    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock

    def read(self, now_s: float):
        self.clock.advance(0.25)
        return fleet_obs(now_s, pool_obs("chat", ready=2, arrival=5.0, ttft=0.5))

    def health(self):
        return True, "ok"


class Collector(trace_service_pb2_grpc.TraceServiceServicer, metrics_service_pb2_grpc.MetricsServiceServicer):
    """An OTLP/gRPC receiver on 127.0.0.1 that keeps what it is sent (and the request metadata)."""

    def __init__(self, credentials: grpc.ServerCredentials | None = None) -> None:
        self.spans: list = []
        self.metrics: list = []
        self.metadata: list[dict[str, str]] = []
        self.lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self.server)
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(self, self.server)
        self.port = (self.server.add_secure_port("127.0.0.1:0", credentials) if credentials is not None
                     else self.server.add_insecure_port("127.0.0.1:0"))

    def Export(self, request, context):  # noqa: N802 - the OTLP services' method name
        with self.lock:
            self.metadata.append(dict(context.invocation_metadata()))
            if isinstance(request, trace_service_pb2.ExportTraceServiceRequest):
                for rs in request.resource_spans:
                    for ss in rs.scope_spans:
                        self.spans.extend((rs.resource, s) for s in ss.spans)
                return trace_service_pb2.ExportTraceServiceResponse()
            for rm in request.resource_metrics:
                for sm in rm.scope_metrics:
                    self.metrics.extend(sm.metrics)
            return metrics_service_pb2.ExportMetricsServiceResponse()


def _attrs(kvs) -> dict:
    out = {}
    for kv in kvs:
        v = kv.value
        out[kv.key] = getattr(v, v.WhichOneof("value"))
    return out


def _daemon(tmp_path, otel):
    clock = VirtualClock(T0)
    settings = Settings(mode="active", policy="slo-feedback", state_dir=str(tmp_path), pools=POOLS)
    store = StateStore(tmp_path / "governor.db")
    daemon = Daemon(controller=build_controller(settings), source=SlowSource(clock), actuator=None,
                    shadow=ShadowActuator(clock=clock), store=store, metrics=DaemonMetrics(), clock=clock,
                    logger=logging.getLogger("test"), mode=Mode.ACTIVE, otel=otel)
    return daemon, store, clock


@pytest.fixture
def collector():
    c = Collector()
    c.server.start()
    yield c
    c.server.stop(0)


def test_a_tick_is_exported_over_otlp_grpc_to_a_loopback_collector(tmp_path, collector):
    metrics = DaemonMetrics()
    otel_cfg = OtlpSettings(endpoint=f"http://127.0.0.1:{collector.port}", headers={"x-tenant": "team-a"},
                            service_name="governor-test")
    otel = build_tick_telemetry(otel_cfg, metrics.registry)
    assert otel is not None
    daemon, store, clock = _daemon(tmp_path, otel)
    daemon.metrics = metrics  # the registry the bridge reads
    try:
        rep = daemon.tick()
        otel.force_flush()
    finally:
        otel.shutdown()
        store.close()
    d = rep.result.decision
    assert d is not None
    spans = {s.name: (res, s) for res, s in collector.spans}
    assert set(spans) == {"governor.tick", *(f"governor.{p}" for p in PHASES)}
    res, root = spans["governor.tick"]
    assert _attrs(res.attributes)["service.name"] == "governor-test"
    a = _attrs(root.attributes)
    assert a["governor.decision_id"] == d.decision_id and a["governor.generation"] == d.generation
    assert a["governor.mode"] == "active" and a["governor.policy"] == "slo-feedback"
    assert a["governor.outcome"] == "shadow" and a["governor.leader"] is True  # no actuator configured
    assert root.start_time_unix_nano == int(T0 * 1e9)
    for p in PHASES:
        _, child = spans[f"governor.{p}"]
        assert child.parent_span_id == root.span_id and child.trace_id == root.trace_id
        assert _attrs(child.attributes)["governor.phase"] == p
    _, read = spans["governor.read"]
    assert read.end_time_unix_nano - read.start_time_unix_nano == 250_000_000  # the virtual clock's 0.25 s
    assert _attrs(read.attributes)["governor.telemetry.source"] == "test"
    assert all(m.get("x-tenant") == "team-a" for m in collector.metadata)

    by_name = {m.name: m for m in collector.metrics}
    assert {"governor_ticks", "governor_generation", "governor_replicas_desired",
            "governor_tick_duration_seconds"} <= set(by_name)
    ticks = by_name["governor_ticks"].sum
    assert ticks.is_monotonic and [(_attrs(p.attributes), p.as_double) for p in ticks.data_points] == [
        ({"result": "decided"}, 1.0)]
    gen = by_name["governor_generation"].gauge.data_points
    assert [p.as_double for p in gen] == [float(d.generation)]
    hist = by_name["governor_tick_duration_seconds"].histogram.data_points
    assert {_attrs(p.attributes)["phase"] for p in hist} == set(PHASES)
    read_point = next(p for p in hist if _attrs(p.attributes)["phase"] == "read")
    assert read_point.count == 1 and read_point.sum == pytest.approx(0.25)


def test_in_memory_exporter_and_reader_see_the_same_names(tmp_path):
    spans = InMemorySpanExporter()
    reader = InMemoryMetricReader()
    metrics = DaemonMetrics()
    otel = build_tick_telemetry(OtlpSettings(), metrics.registry, span_exporter=spans, metric_reader=reader)
    assert otel is not None
    daemon, store, clock = _daemon(tmp_path, otel)
    daemon.metrics = metrics
    try:
        daemon.tick()
        clock.advance(15)
        daemon.tick()
        otel.force_flush()
        data = reader.get_metrics_data()
    finally:
        otel.shutdown()
        store.close()
    finished = spans.get_finished_spans()
    roots = [s for s in finished if s.name == "governor.tick"]
    assert len(roots) == 2 and len(finished) == 2 * (1 + len(PHASES))
    assert [(r.attributes or {})["governor.generation"] for r in roots] == [1, 2]
    assert data is not None
    names = {m.name for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    assert {"governor_ticks", "governor_mode", "governor_tick_duration_seconds"} <= names


def test_no_endpoint_builds_nothing_and_a_bad_endpoint_is_named():
    from controller.config import ConfigError, parse_settings

    assert build_tick_telemetry(OtlpSettings(), DaemonMetrics().registry) is None
    with pytest.raises(ConfigError, match=r"otel.endpoint.*must start with http:// \(plaintext\) or https://"):
        parse_settings("pools: [{name: a, model: m, sku: h100-80gb, usd_per_gpu_hour: 1}]\n"
                       "otel: {endpoint: 'collector:4317'}\n")


@pytest.fixture
def pki(tmp_path):
    """A CA, a server certificate for 127.0.0.1 and a client certificate (tests/fixtures/tls.py)."""
    import shutil

    from tests.fixtures.tls import make_pki

    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    make_pki(tmp_path / "pki")
    return tmp_path / "pki"


def test_export_over_mutual_tls(tmp_path, pki):
    creds = grpc.ssl_server_credentials([((pki / "server.key").read_bytes(), (pki / "server.crt").read_bytes())],
                                        root_certificates=(pki / "ca.crt").read_bytes(),
                                        require_client_auth=True)  # mTLS: no client certificate, no export
    c = Collector(creds)
    port = c.port
    c.server.start()
    try:
        cfg = OtlpSettings(endpoint=f"https://127.0.0.1:{port}", metrics=False,
                           tls={"ca": str(pki / "ca.crt"), "cert": str(pki / "client.crt"),
                                "key": str(pki / "client.key")})
        otel = build_tick_telemetry(cfg, DaemonMetrics().registry)
        assert otel is not None and otel.meter_provider is None
        daemon, store, _ = _daemon(tmp_path, otel)
        try:
            daemon.tick()
            otel.force_flush()
        finally:
            otel.shutdown()
            store.close()
    finally:
        c.server.stop(0)
    assert {s.name for _, s in c.spans} == {"governor.tick", *(f"governor.{p}" for p in PHASES)}
