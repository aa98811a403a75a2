"""What every gRPC server Governor runs shares: health, reflection, and binding its address.

Used by the PolicyService server and the KEDA external scaler so both answer the
standard health and reflection services and fail the same way on a bad address.
"""

from __future__ import annotations

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from controller.api.auth import TlsConfig


def add_health_and_reflection(server: grpc.Server, service_name: str) -> health.HealthServicer:
    """Serve gRPC health (overall and `service_name` SERVING) and reflection; returns the health servicer."""
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    for name in ("", service_name):
        servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    reflection.enable_server_reflection((service_name, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    return servicer


def bind(server: grpc.Server, listen: str, tls: TlsConfig | None, what: str) -> int:
    """Add the listening port (TLS when configured); OSError naming `what` and the address if it cannot."""
    try:
        port = server.add_secure_port(listen, tls.server_credentials()) if tls is not None else server.add_insecure_port(listen)
    except RuntimeError as exc:
        raise OSError(f"{what}: cannot listen on {listen!r}: {exc}") from exc
    if not port:
        raise OSError(f"{what}: cannot listen on {listen!r}")
    return port
