"""KEDA external scaler: serves Governor's replica targets to KEDA-managed deployments.

A ScaledObject trigger of type `external` (or `external-push`) names this server
as `scalerAddress` and the pool in its metadata (`pool: <name>`). KEDA then reads:

- GetMetricSpec → one metric `governor-replicas-<pool>` with target 1 (both the
  deprecated int64 `targetSize` and `targetSizeFloat`);
- GetMetrics → the desired replicas as the metric value (int64 `metricValue` and
  `metricValueFloat`). With metricType AverageValue the HPA computes
  ceil(value / target) = ceil(desired / 1) = desired replicas; e.g. desired 7 → 7.
- IsActive → desired > 0 (KEDA handles 0 ↔ 1 itself);
- StreamIsActive → the activity flag, pushed whenever it changes;
- StreamMetricSpec → UNIMPLEMENTED (KEDA falls back to polling GetMetricSpec).

The targets come from a callable the runtime supplies (the last decision's replicas).
This module must not compute targets itself.

Security: TLS with `tls` (transport.TlsConfig); callers are authenticated by mTLS (KEDA's
TriggerAuthentication `caCert`/`tlsClientCert`/`tlsClientKey`) and/or bearer tokens (transport.
Authenticator), UNAUTHENTICATED otherwise. A non-loopback listen address without either is refused
(InsecureListenError): the replica targets tell anyone who asks the shape of the fleet, and a spoofed
scaler address is how KEDA would be fed someone else's numbers. Requests are capped at
MAX_REQUEST_BYTES and a bad pool name is quoted back at most MAX_ECHO characters.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent import futures

import grpc
from grpc_health.v1 import health

from controller.gen.externalscaler import externalscaler_pb2, externalscaler_pb2_grpc
from controller.rpc.transport import (
    Authenticator,
    AuthInterceptor,
    TlsConfig,
    add_health_and_reflection,
    bind,
    check_listen_safe,
    server_options,
)

POOL_KEY = "pool"
# "externalscaler.ExternalScaler"
SERVICE_NAME = externalscaler_pb2.DESCRIPTOR.services_by_name["ExternalScaler"].full_name


# Largest request: a ScaledObjectRef's name, namespace and trigger metadata (a few short strings); 64 KiB is
# generous for that and far below gRPC's 4 MiB default.
MAX_REQUEST_BYTES = 64 * 1024
MAX_ECHO = 64  # characters of a bad value quoted back
MAX_POOL = 253  # a pool name is a DNS-style name (the config allows 63)


def _shown(value: str) -> str:
    text = repr(value)
    return text if len(text) <= MAX_ECHO else text[: MAX_ECHO - 3] + "..."


def metric_name(pool: str, prefix: str = "governor-replicas-") -> str:
    return f"{prefix}{pool}"


class _Scaler(externalscaler_pb2_grpc.ExternalScalerServicer):
    def __init__(self, owner: KedaScalerServer) -> None:
        self._owner = owner

    # ---- helpers

    def _pool(self, ref: externalscaler_pb2.ScaledObjectRef, context: grpc.ServicerContext) -> str:
        pool = ref.scalerMetadata.get(POOL_KEY, "").strip()
        if not pool:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"scalerMetadata.{POOL_KEY} is required: set `{POOL_KEY}: <pool name>` in the ScaledObject "
                          f"trigger metadata (ScaledObject {_shown(ref.namespace)}/{_shown(ref.name)})")
        if len(pool) > MAX_POOL or not pool.isprintable():
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"scalerMetadata.{POOL_KEY}: {_shown(pool)} is not a pool name (printable, at most "
                          f"{MAX_POOL} characters)")
        return pool

    def _desired(self, pool: str, context: grpc.ServicerContext) -> int:
        try:
            targets = self._owner.targets()
        except Exception as exc:  # noqa: BLE001 - the runtime's problem becomes a clear UNAVAILABLE for KEDA
            context.abort(grpc.StatusCode.UNAVAILABLE, f"replica targets are not available: {exc}")
        if pool not in targets:
            known = ", ".join(sorted(targets)) or "none yet"
            context.abort(grpc.StatusCode.NOT_FOUND, f"pool {_shown(pool)} is not governed here (known pools: {known})")
        return max(0, int(targets[pool]))

    # ---- RPCs

    def IsActive(self, request, context):  # noqa: N802 - gRPC method name
        pool = self._pool(request, context)
        return externalscaler_pb2.IsActiveResponse(result=self._desired(pool, context) > 0)

    def StreamIsActive(self, request, context) -> Iterator[externalscaler_pb2.IsActiveResponse]:  # noqa: N802 - gRPC method name
        pool = self._pool(request, context)
        self._desired(pool, context)  # fail before holding a stream slot
        if not self._owner._acquire_stream():
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"too many StreamIsActive streams open (limit {self._owner.max_streams}); "
                          "poll IsActive instead")
        try:
            context.add_callback(self._owner.notify)  # wake the loop at once when the client goes away
            yield from self._owner._activity_stream(pool, context, self._desired)
        finally:
            self._owner._release_stream()

    def GetMetricSpec(self, request, context):  # noqa: N802 - gRPC method name
        pool = self._pool(request, context)
        # an unknown pool is NOT_FOUND here too, so a typo shows up when KEDA builds the HPA
        self._desired(pool, context)
        spec = externalscaler_pb2.MetricSpec(metricName=self._owner.metric_name(pool), targetSize=1,
                                             targetSizeFloat=1.0)
        return externalscaler_pb2.GetMetricSpecResponse(metricSpecs=[spec])

    def GetMetrics(self, request, context):  # noqa: N802 - gRPC method name
        pool = self._pool(request.scaledObjectRef, context)
        desired = self._desired(pool, context)
        # KEDA strips its "s<index>-" prefix before asking; answer under the name it asked for.
        name = request.metricName or self._owner.metric_name(pool)
        value = externalscaler_pb2.MetricValue(metricName=name, metricValue=desired, metricValueFloat=float(desired))
        return externalscaler_pb2.GetMetricsResponse(metricValues=[value])

    def StreamMetricSpec(self, request, context):  # noqa: N802 - gRPC method name
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "StreamMetricSpec is not implemented; poll GetMetricSpec")


class KedaScalerServer:
    """The externalscaler.ExternalScaler gRPC service, with health and reflection.

    `targets()` must be cheap and thread-safe: it is called on every request. Call `notify()` after a new
    decision so open StreamIsActive streams re-read at once instead of at their next poll.
    """

    def __init__(self, targets: Callable[[], Mapping[str, int]], listen: str, *, tls: TlsConfig | None = None,
                 authenticator: Authenticator | None = None,
                 metric_prefix: str = "governor-replicas-", stream_poll_s: float = 1.0,
                 stream_max_s: float = 3600.0, max_streams: int = 16) -> None:
        """`authenticator` None: mTLS callers only when `tls` names a client CA, else nobody is checked
        (loopback only). InsecureListenError for a non-loopback `listen` without authentication."""
        if stream_poll_s <= 0 or stream_max_s <= 0 or max_streams < 1:
            raise ValueError(f"stream_poll_s and stream_max_s must be > 0 and max_streams >= 1 "
                             f"(got {stream_poll_s}, {stream_max_s}, {max_streams})")
        self.authenticator = authenticator or Authenticator(mtls=tls is not None and tls.mutual)
        check_listen_safe(listen, "token" if self.authenticator.required else None, tls, what="the KEDA scaler",
                          how="actuators.keda.token_file")
        self.targets = targets
        self.listen = listen
        self.max_streams = max_streams
        self._tls = tls
        self._prefix = metric_prefix
        self._poll_s = float(stream_poll_s)
        # A stream ends after stream_max_s (KEDA reopens it within 2 s), so no stream lives forever.
        self._max_polls = max(1, int(stream_max_s / stream_poll_s))
        self._cond = threading.Condition()
        self._version = 0
        self._stopping = False
        self._streams = 0
        self._server: grpc.Server | None = None
        self._health: health.HealthServicer | None = None
        self.port: int | None = None

    def metric_name(self, pool: str) -> str:
        return metric_name(pool, self._prefix)

    def notify(self) -> None:
        """The targets may have changed: wake the open streams."""
        with self._cond:
            self._version += 1
            self._cond.notify_all()

    def _acquire_stream(self) -> bool:
        with self._cond:
            if self._streams >= self.max_streams:
                return False
            self._streams += 1
            return True

    def _release_stream(self) -> None:
        with self._cond:
            self._streams -= 1

    def _activity_stream(self, pool: str, context: grpc.ServicerContext,
                         desired: Callable[[str, grpc.ServicerContext], int],
                         ) -> Iterator[externalscaler_pb2.IsActiveResponse]:
        last: bool | None = None
        for _ in range(self._max_polls):
            with self._cond:
                if self._stopping:
                    return
                seen = self._version
            if not context.is_active():
                return
            active = desired(pool, context) > 0
            if active != last:
                last = active
                yield externalscaler_pb2.IsActiveResponse(result=active)
            with self._cond:
                self._cond.wait_for(lambda: self._version != seen or self._stopping,  # noqa: B023 - called in this iteration
                                    timeout=self._poll_s)

    def start(self) -> int:
        if self._server is not None:
            raise RuntimeError("KedaScalerServer already started")
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=self.max_streams + 4, thread_name_prefix="keda"),
                             interceptors=[AuthInterceptor(self.authenticator)],
                             options=server_options(MAX_REQUEST_BYTES))
        externalscaler_pb2_grpc.add_ExternalScalerServicer_to_server(_Scaler(self), server)
        self._health = add_health_and_reflection(server, SERVICE_NAME)
        port = bind(server, self.listen, self._tls, "KEDA scaler")
        server.start()
        self._server = server
        self.port = port
        return port

    def stop(self, grace_s: float = 1.0) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._health is not None:
            self._health.enter_graceful_shutdown()
        if self._server is not None:
            self._server.stop(grace_s).wait()
            self._server = None
