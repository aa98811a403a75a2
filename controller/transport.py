"""The gRPC plumbing Governor's servers and clients share: TLS, bearer tokens, channels, health, binding.

Servers (the PolicyService in `api/`, the KEDA external scaler in `actuation/`):
- `TlsConfig` builds server credentials; with `client_ca_file` set, clients must present a certificate
  signed by that CA (mTLS).
- `BearerTokenInterceptor` requires `authorization: Bearer <token>` metadata on every call except gRPC
  health and reflection, and answers UNAUTHENTICATED otherwise (constant-time compare).
- `check_listen_safe` refuses a non-loopback listen address unless the callers are authenticated.
- `add_health_and_reflection` and `bind` give every server the standard health and reflection services
  and the same error on a bad address.

Clients (the actuator to the fleet, the CLI to the daemon):
- `ClientTls` and `make_channel` build a channel (plaintext, TLS or mTLS);
- `bearer_metadata` is the call metadata that carries a token.

This is a neutral edge module: `actuation/` and `api/` both import it and never each other. It holds no
Governor logic and must not log or echo tokens.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

# Health checks and reflection carry no secrets and must answer for probes (kubelet, grpcurl) without a token.
EXEMPT_METHOD_PREFIXES: tuple[str, ...] = (
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1alpha.ServerReflection/",
    "/grpc.reflection.v1.ServerReflection/",
)


class InsecureListenError(ValueError):
    """Listening beyond loopback without any authentication was requested."""


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """Server TLS. client_ca_file set → mutual TLS: a client certificate signed by that CA is required."""

    cert_file: str
    key_file: str
    client_ca_file: str | None = None

    @property
    def mutual(self) -> bool:
        return self.client_ca_file is not None

    def server_credentials(self) -> grpc.ServerCredentials:
        key = _read(self.key_file, "tls.key_file")
        cert = _read(self.cert_file, "tls.cert_file")
        ca = _read(self.client_ca_file, "tls.client_ca_file") if self.client_ca_file else None
        return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=ca is not None)


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"{what}: cannot read {path!r}: {exc.strerror or exc}") from exc


def _read_optional(path: str | None, what: str) -> bytes | None:
    return None if path is None else _read(path, what)


def split_host_port(listen: str) -> tuple[str, str]:
    """'127.0.0.1:50051' → ('127.0.0.1', '50051'); '[::1]:0' → ('::1', '0'); ':50051' → ('', '50051')."""
    if listen.startswith("["):
        host, sep, rest = listen[1:].partition("]")
        if not sep or not rest.startswith(":"):
            raise ValueError(f"listen address {listen!r}: expected [IPv6]:port")
        return host, rest[1:]
    host, sep, port = listen.rpartition(":")
    if not sep:
        raise ValueError(f"listen address {listen!r}: expected host:port")
    return host, port


def is_loopback_address(listen: str) -> bool:
    """True only for addresses reachable from this host alone: 127.0.0.0/8, ::1, localhost, unix sockets."""
    if listen.startswith(("unix:", "unix-abstract:")):
        return True
    host, _ = split_host_port(listen)
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name (or "" / "*" = every interface): reachable from elsewhere


def check_listen_safe(listen: str, token: str | None, tls: TlsConfig | None) -> None:
    """Raise InsecureListenError for a non-loopback address without a token (or mTLS, which authenticates too)."""
    if is_loopback_address(listen):
        return
    if token or (tls is not None and tls.mutual):
        return
    raise InsecureListenError(
        f"refusing to listen on {listen!r} without authentication: anyone who can reach it could change the "
        "fleet. Set an API token (api.token / $GOVERNOR_API_TOKEN), configure mTLS, or listen on 127.0.0.1."
    )


def bearer_token_ok(metadata, token: str) -> bool:
    """Constant-time check of `authorization: Bearer <token>` among the call's metadata."""
    expected = token.encode()
    ok = False
    for key, value in metadata or ():
        if key.lower() != "authorization":
            continue
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        scheme, _, given = value.partition(" ")
        if scheme.lower() == "bearer":
            # compare_digest on every candidate: no early exit that would leak timing.
            ok |= hmac.compare_digest(given.strip().encode(), expected)
    return ok


class BearerTokenInterceptor(grpc.ServerInterceptor):
    def __init__(self, token: str, exempt_prefixes: tuple[str, ...] = EXEMPT_METHOD_PREFIXES) -> None:
        if not token:
            raise ValueError("BearerTokenInterceptor needs a non-empty token")
        self._token = token
        self._exempt = exempt_prefixes

    def intercept_service(self, continuation: Callable, handler_call_details: grpc.HandlerCallDetails):
        method = handler_call_details.method or ""
        if method.startswith(self._exempt) or bearer_token_ok(handler_call_details.invocation_metadata, self._token):
            return continuation(handler_call_details)
        handler = continuation(handler_call_details)
        if handler is None:
            return None  # unknown method: let gRPC answer UNIMPLEMENTED
        return _denying_handler(handler)


def _deny(request_or_iterator, context: grpc.ServicerContext):
    context.abort(grpc.StatusCode.UNAUTHENTICATED,
                  "missing or invalid credentials: send metadata 'authorization: Bearer <token>'")


def _denying_handler(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """A handler of the same shape as `handler` that rejects the call."""
    kwargs = {"request_deserializer": handler.request_deserializer, "response_serializer": handler.response_serializer}
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(_deny, **kwargs)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(_deny, **kwargs)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(_deny, **kwargs)
    return grpc.stream_stream_rpc_method_handler(_deny, **kwargs)


# --------------------------------------------------------------------------- servers


def add_health_and_reflection(server: grpc.Server, service_name: str) -> health.HealthServicer:
    """Serve gRPC health (overall and `service_name` SERVING) and reflection; returns the health servicer."""
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    for name in ("", service_name):
        servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    reflection.enable_server_reflection((service_name, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    return servicer


def bind(server: grpc.Server | grpc.aio.Server, listen: str, tls: TlsConfig | None, what: str) -> int:
    """Add the listening port (TLS when configured); OSError naming `what` and the address if it cannot."""
    try:
        if tls is not None:
            port = server.add_secure_port(listen, tls.server_credentials())
        else:
            port = server.add_insecure_port(listen)
    except RuntimeError as exc:
        raise OSError(f"{what}: cannot listen on {listen!r}: {exc}") from exc
    if not port:
        raise OSError(f"{what}: cannot listen on {listen!r}")
    return port


# --------------------------------------------------------------------------- clients

# gRPC's own transparent retries are off so that a caller's `attempts` counts real calls; reconnection
# backoff is kept short so a restarted peer is reached again within a tick.
_CHANNEL_OPTIONS = (
    ("grpc.enable_retries", 0),
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 5000),
)


@dataclass(frozen=True, slots=True)
class ClientTls:
    """Client TLS. ca_file verifies the server; cert_file + key_file give mTLS."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    server_name: str | None = None  # overrides the name checked against the server certificate

    def credentials(self) -> grpc.ChannelCredentials:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("tls: cert_file and key_file must be given together (client certificate for mTLS)")
        return grpc.ssl_channel_credentials(
            root_certificates=_read_optional(self.ca_file, "tls.ca_file"),
            private_key=_read_optional(self.key_file, "tls.key_file"),
            certificate_chain=_read_optional(self.cert_file, "tls.cert_file"),
        )


def make_channel(address: str, tls: ClientTls | None = None) -> grpc.Channel:
    """A channel to `address`: plaintext without `tls`, else TLS (mTLS when it has a client certificate)."""
    options: list[tuple[str, int | str]] = list(_CHANNEL_OPTIONS)
    if tls is None:
        return grpc.insecure_channel(address, options=options)
    if tls.server_name:
        options.append(("grpc.ssl_target_name_override", tls.server_name))
    return grpc.secure_channel(address, tls.credentials(), options=options)


def bearer_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """The call metadata that carries `token` (none without one): (("authorization", "Bearer <token>"),)."""
    return (("authorization", f"Bearer {token}"),) if token else ()


# --------------------------------------------------------------------------- requests that are not messages
# gRPC answers INTERNAL ("Exception deserializing request!") when a request's bytes do not parse as its message
# type. That is the caller's mistake, not the server's: `CheckedRequestsInterceptor` (and its asyncio twin) parse
# with a deserializer that does not raise and answer INVALID_ARGUMENT naming the method, before the servicer runs.

UNDECODABLE_DETAIL_CHARS = 200  # of the parser's own message: enough for the type and the reason, never the bytes


class _Undecodable:
    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _lenient(deserialize: Callable[[bytes], object] | None) -> Callable[[bytes], object] | None:
    if deserialize is None:
        return None

    def parse(data: bytes) -> object:
        try:
            return deserialize(data)
        except Exception as exc:  # noqa: BLE001 - DecodeError, or whatever a deserializer raises on foreign bytes
            return _Undecodable(str(exc)[:UNDECODABLE_DETAIL_CHARS] or type(exc).__name__)

    return parse


def _undecodable_details(method: str, u: _Undecodable) -> str:
    return f"request: the bytes sent to {method} are not its request message ({u.reason}); nothing was changed"


def _rebuild(handler: grpc.RpcMethodHandler, **behaviours) -> grpc.RpcMethodHandler:
    des, ser = _lenient(handler.request_deserializer), handler.response_serializer
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(behaviours["unary_unary"], des, ser)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(behaviours["unary_stream"], des, ser)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(behaviours["stream_unary"], des, ser)
    return grpc.stream_stream_rpc_method_handler(behaviours["stream_stream"], des, ser)


class CheckedRequestsInterceptor(grpc.ServerInterceptor):
    """A synchronous server's undecodable requests → INVALID_ARGUMENT (see above)."""

    def intercept_service(self, continuation: Callable, handler_call_details: grpc.HandlerCallDetails):
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method or "?"

        def check(request, context):
            if isinstance(request, _Undecodable):
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, _undecodable_details(method, request))
            return request

        def checked_iter(it, context):
            for request in it:
                yield check(request, context)

        def uu(request, context):
            return handler.unary_unary(check(request, context), context)

        def us(request, context):
            yield from handler.unary_stream(check(request, context), context)

        def su(it, context):
            return handler.stream_unary(checked_iter(it, context), context)

        def ss(it, context):
            yield from handler.stream_stream(checked_iter(it, context), context)

        return _rebuild(handler, unary_unary=uu, unary_stream=us, stream_unary=su, stream_stream=ss)


class AioCheckedRequestsInterceptor(grpc.aio.ServerInterceptor):
    """An asyncio server's undecodable requests → INVALID_ARGUMENT (see above). Handlers are coroutines or async
    generators, as the servicers of grpc.aio are."""

    async def intercept_service(self, continuation, handler_call_details: grpc.HandlerCallDetails):
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method or "?"

        async def check(request, context):
            if isinstance(request, _Undecodable):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, _undecodable_details(method, request))
            return request

        async def checked_iter(it, context):
            async for request in it:
                yield await check(request, context)

        async def uu(request, context):
            return await handler.unary_unary(await check(request, context), context)

        async def us(request, context):
            gen = handler.unary_stream(await check(request, context), context)
            try:
                async for resp in gen:
                    yield resp
            finally:
                await gen.aclose()

        async def su(it, context):
            return await handler.stream_unary(checked_iter(it, context), context)

        async def ss(it, context):
            gen = handler.stream_stream(checked_iter(it, context), context)
            try:
                async for resp in gen:
                    yield resp
            finally:
                await gen.aclose()  # the servicer's own clean-up runs now, not when the generator is collected

        return _rebuild(handler, unary_unary=uu, unary_stream=us, stream_unary=su, stream_stream=ss)


class AioBearerTokenInterceptor(grpc.aio.ServerInterceptor):
    """`BearerTokenInterceptor` for grpc.aio servers (the picker's control port): UNAUTHENTICATED without the token."""

    def __init__(self, token: str, exempt_prefixes: tuple[str, ...] = EXEMPT_METHOD_PREFIXES) -> None:
        if not token:
            raise ValueError("AioBearerTokenInterceptor needs a non-empty token")
        self._token = token
        self._exempt = exempt_prefixes

    async def intercept_service(self, continuation, handler_call_details: grpc.HandlerCallDetails):
        handler = await continuation(handler_call_details)
        method = handler_call_details.method or ""
        if handler is None or method.startswith(self._exempt) or bearer_token_ok(
                handler_call_details.invocation_metadata, self._token):
            return handler

        async def deny(request_or_iterator, context):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                                "missing or invalid credentials: send metadata 'authorization: Bearer <token>'")

        kwargs = {"request_deserializer": handler.request_deserializer,
                  "response_serializer": handler.response_serializer}
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(deny, **kwargs)
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(deny, **kwargs)
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(deny, **kwargs)
        return grpc.stream_stream_rpc_method_handler(deny, **kwargs)
