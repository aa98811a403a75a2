"""OpenTelemetry for the daemon: a trace per tick and the governor_* metrics, exported over OTLP/gRPC.

`TickTelemetry.record_tick` turns one tick's timings (the daemon measures them anyway, on its
Clock) into a `governor.tick` span with one child span per phase (`governor.read`, `.step`,
`.actuate`, `.learn`), placed at the tick's own times, so spans agree with the tick log line
and replay under a virtual clock. The tick's phase durations also go into an OTel histogram.
`bridge_registry` exposes the daemon's prometheus_client registry (obs/daemon_metrics.py) as
observable OTel instruments of the same names, so an OpenTelemetry Collector receives the same
series /metrics serves; histograms other than the tick duration stay on /metrics.

Built from the `otel:` config section by the composition root; with no endpoint nothing is
built and the Prometheus endpoint is the only export. This module must not decide anything or
read the daemon's state: it is given values.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opentelemetry.metrics import CallbackOptions, Meter, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanProcessor
from opentelemetry.trace import Status, StatusCode, set_span_in_context
from prometheus_client import CollectorRegistry

from controller.obs.daemon_metrics import TICK_BUCKETS_S

SCOPE = "governor"
TICK_SPAN = "governor.tick"
TICK_HISTOGRAM = "governor_tick_duration_seconds"
AttrValue = str | bool | int | float


@dataclass(frozen=True, slots=True)
class Phase:
    name: str  # read | step | actuate | learn
    start_s: float  # seconds after the tick's start
    end_s: float
    attributes: Mapping[str, AttrValue]


def _ns(seconds: float) -> int:
    return int(round(seconds * 1e9))


class TickTelemetry:
    """Spans and the tick histogram; `tracer_provider`/`meter_provider` are the SDK's (None: that
    signal is off)."""

    def __init__(self, tracer_provider: TracerProvider | None, meter_provider: MeterProvider | None) -> None:
        self.tracer_provider = tracer_provider
        self.meter_provider = meter_provider
        self._tracer = tracer_provider.get_tracer(SCOPE) if tracer_provider is not None else None
        self._histogram = (meter_provider.get_meter(SCOPE).create_histogram(
            TICK_HISTOGRAM, unit="s", description="Time per tick phase") if meter_provider is not None else None)

    def record_tick(self, start_wall_s: float, phases: Sequence[Phase], attributes: Mapping[str, AttrValue],
                    error: str | None = None) -> None:
        end_s = max((p.end_s for p in phases), default=0.0)
        if self._histogram is not None:
            for p in phases:
                self._histogram.record(max(0.0, p.end_s - p.start_s), {"phase": p.name})
        if self._tracer is None:
            return
        base = _ns(start_wall_s)  # offsets added in integer ns: epoch seconds + 0.25 s lose bits as floats
        root = self._tracer.start_span(TICK_SPAN, start_time=base, attributes=dict(attributes))
        ctx = set_span_in_context(root)
        for p in phases:
            child = self._tracer.start_span(f"governor.{p.name}", context=ctx, start_time=base + _ns(p.start_s),
                                            attributes={"governor.phase": p.name, **p.attributes})
            child.end(end_time=base + _ns(p.end_s))
        if error:
            root.set_status(Status(StatusCode.ERROR, error))
        root.end(end_time=base + _ns(end_s))

    def shutdown(self) -> None:
        for provider in (self.tracer_provider, self.meter_provider):
            if provider is not None:
                provider.shutdown()

    def force_flush(self, timeout_s: float = 10.0) -> None:
        for provider in (self.tracer_provider, self.meter_provider):
            if provider is not None:
                provider.force_flush(int(timeout_s * 1000))


# --------------------------------------------------------------------------- the registry bridge


def _samples(registry: CollectorRegistry, family: str, suffix: str) -> Iterable[Observation]:
    for metric in registry.collect():
        if metric.name != family:
            continue
        for s in metric.samples:
            if s.name == family + suffix and s.value == s.value:  # NaN: not observed, no point
                yield Observation(s.value, dict(s.labels))


def bridge_registry(registry: CollectorRegistry, meter: Meter) -> list[str]:
    """One observable instrument per counter and gauge family of `registry`, read at each export.
    Returns the names bridged."""
    names = []
    for metric in registry.collect():
        if metric.type == "counter":
            def counter_cb(_: CallbackOptions, family: str = metric.name) -> Iterable[Observation]:
                return list(_samples(registry, family, "_total"))

            meter.create_observable_counter(metric.name, callbacks=[counter_cb], description=metric.documentation)
        elif metric.type == "gauge":
            def gauge_cb(_: CallbackOptions, family: str = metric.name) -> Iterable[Observation]:
                return list(_samples(registry, family, ""))

            meter.create_observable_gauge(metric.name, callbacks=[gauge_cb], description=metric.documentation)
        else:
            continue
        names.append(metric.name)
    return names


# --------------------------------------------------------------------------- construction


def _credentials(ca: str | None, cert: str | None, key: str | None) -> Any:
    import grpc

    def read(path: str | None) -> bytes | None:
        return Path(path).read_bytes() if path else None

    return grpc.ssl_channel_credentials(root_certificates=read(ca), private_key=read(key),
                                        certificate_chain=read(cert))


def build_tick_telemetry(otel: Any, registry: CollectorRegistry, *,
                         span_exporter: SpanExporter | None = None,
                         metric_reader: MetricReader | None = None) -> TickTelemetry | None:
    """From the `otel:` section (config.OtlpSettings). The exporter and reader can be replaced (tests use
    the SDK's in-memory ones); by default they are OTLP/gRPC to `otel.endpoint`. None when there is no
    endpoint and nothing was passed in."""
    if otel.endpoint is None and span_exporter is None and metric_reader is None:
        return None
    resource = Resource.create({"service.name": otel.service_name})
    kwargs: dict[str, Any] = {}
    if otel.endpoint is not None:
        tls = otel.endpoint.startswith("https://")
        kwargs = {"endpoint": otel.endpoint.split("://", 1)[1], "insecure": not tls,
                  "headers": dict(otel.headers) or None, "timeout": otel.timeout_s}
        if tls:
            kwargs["credentials"] = _credentials(otel.tls.ca, otel.tls.cert, otel.tls.key)
    tracer_provider = None
    if otel.traces:
        if span_exporter is None:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

            span_exporter = OTLPSpanExporter(**kwargs)
        tracer_provider = TracerProvider(resource=resource)
        processor: SpanProcessor = BatchSpanProcessor(span_exporter)
        tracer_provider.add_span_processor(processor)
    meter_provider = None
    if otel.metrics:
        if metric_reader is None:
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

            metric_reader = PeriodicExportingMetricReader(OTLPMetricExporter(**kwargs),
                                                          export_interval_millis=otel.export_interval_s * 1000)
        view = View(instrument_name=TICK_HISTOGRAM,
                    aggregation=ExplicitBucketHistogramAggregation(boundaries=TICK_BUCKETS_S))
        meter_provider = MeterProvider(resource=resource, metric_readers=[metric_reader], views=[view])
        bridge_registry(registry, meter_provider.get_meter(SCOPE))
    return TickTelemetry(tracer_provider, meter_provider)
