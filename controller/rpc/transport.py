"""The gRPC plumbing Governor's servers and clients share: TLS, bearer tokens, channels, health, binding.

Servers (the PolicyService in `api/`, the KEDA external scaler in `actuation/`):
- `TlsConfig` builds server credentials; with `client_ca_file` set, clients must present a certificate
  signed by that CA (mTLS).
- `Authenticator` says who a caller is: a named bearer token (`authorization: Bearer <token>`, compared in
  constant time; `load_tokens_file` reads the name → token → role table) or the subject of a verified
  mTLS client certificate (CN, else the first SAN). Each has a role: `read` or `write`.
- `AuthInterceptor` applies it to every call except gRPC health and reflection: no or a wrong credential
  is UNAUTHENTICATED, a read-only caller calling a write method is PERMISSION_DENIED, and the servicer
  reads the authenticated `Caller` with `current_caller()` (for the audit trail).
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

import contextvars
import hmac
import ipaddress
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import yaml
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
    except ValueError as exc:  # a NUL in the path
        raise ValueError(f"{what}: cannot read {path!r}: {exc}") from None


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


def check_listen_safe(listen: str, token: str | None, tls: TlsConfig | None, *, what: str = "the API",
                      how: str = "an API token (api.token, api.tokens_file / $GOVERNOR_API_TOKEN)") -> None:
    """Raise InsecureListenError for a non-loopback address without a token (or mTLS, which authenticates too)."""
    if is_loopback_address(listen):
        return
    if token or (tls is not None and tls.mutual):
        return
    raise InsecureListenError(
        f"refusing to listen on {listen!r} for {what} without authentication: anyone who can reach it could "
        f"read or change the fleet. Set {how}, configure mTLS (tls.client_ca), or listen on 127.0.0.1."
    )


# --------------------------------------------------------------------------- callers, tokens and roles

ROLES: tuple[str, ...] = ("read", "write")
MAX_TOKENS_FILE_BYTES = 1 << 20  # a table of tokens is a few KB; anything near 1 MiB is not one


@dataclass(frozen=True, slots=True)
class TokenEntry:
    """One bearer token: who holds it (`name`, recorded in the audit trail) and what it may do."""

    name: str
    token: str = field(repr=False)  # never in a repr, a log line or an error message
    role: str = "write"


@dataclass(frozen=True, slots=True)
class Caller:
    """An authenticated caller: `identity` is "token:<name>", "cert:<CN or SAN>" or "anonymous" (a loopback
    server without auth); `role` is "read" or "write"."""

    identity: str
    role: str

    @property
    def may_write(self) -> bool:
        return self.role == "write"


ANONYMOUS = Caller("anonymous", "write")
_CALLER: contextvars.ContextVar[Caller] = contextvars.ContextVar("governor_caller", default=ANONYMOUS)


def current_caller() -> Caller:
    """The caller of the RPC this thread is serving (set by AuthInterceptor; ANONYMOUS without one)."""
    return _CALLER.get()


def load_tokens_file(path: str, what: str = "api.tokens_file") -> list[TokenEntry]:
    """Read a tokens file: YAML `tokens: [{name, token, role}]` (role read or write, default write).
    ValueError names the file and the entry that is wrong, never a token."""
    try:
        p = Path(path)
        size = p.stat().st_size
        text = p.read_text() if size <= MAX_TOKENS_FILE_BYTES else None
    except OSError as exc:
        raise ValueError(f"{what}: cannot read {path!r}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{what}: {path!r} is not a text file") from None
    except ValueError as exc:  # a NUL in the path
        raise ValueError(f"{what}: cannot read {path!r}: {exc}") from None
    if text is None:
        raise ValueError(f"{what}: {path!r} is larger than {MAX_TOKENS_FILE_BYTES} bytes; not a tokens file")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"{what}: {path!r} is not valid YAML ({type(exc).__name__})") from None
    entries = data.get("tokens") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{what}: {path!r} must be a mapping with a non-empty list `tokens:` of "
                         "{name, token, role} entries")
    out: list[TokenEntry] = []
    for i, e in enumerate(entries):
        where = f"{what}: {path}: tokens[{i}]"
        if not isinstance(e, dict) or set(e) - {"name", "token", "role"}:
            raise ValueError(f"{where}: must be a mapping with keys name, token and role")
        name, token, role = e.get("name"), e.get("token"), e.get("role", "write")
        if not isinstance(name, str) or not name.strip() or len(name) > 128 or not name.isprintable():
            raise ValueError(f"{where}.name: a printable name of 1..128 characters is required")
        if not isinstance(token, str) or len(token.strip()) < 16 or not token.isprintable():
            raise ValueError(f"{where}.token: a printable token of at least 16 characters is required "
                             "(e.g. `openssl rand -hex 32`)")
        if role not in ROLES:
            raise ValueError(f"{where}.role: must be read or write")
        if any(x.name == name for x in out):
            raise ValueError(f"{where}.name: {name!r} is named twice")
        if any(hmac.compare_digest(x.token.encode(), token.strip().encode()) for x in out):
            raise ValueError(f"{where}.token: the same token is given to two names")
        out.append(TokenEntry(name.strip(), token.strip(), role))
    return out


class Authenticator:
    """Who is calling: a bearer token from `tokens`, else (with `mtls`) the verified client certificate, else
    nobody. `cert_roles` maps a certificate subject (CN or a SAN) to its role; others get `cert_role`.
    With neither tokens nor mTLS every caller is ANONYMOUS (only allowed on loopback: check_listen_safe)."""

    def __init__(self, tokens: Sequence[TokenEntry] = (), *, mtls: bool = False,
                 cert_roles: Mapping[str, str] | None = None, cert_role: str = "write") -> None:
        for role in (cert_role, *(cert_roles or {}).values()):
            if role not in ROLES:
                raise ValueError(f"role must be read or write (got {role!r})")
        self._tokens = tuple(tokens)
        self._mtls = mtls
        self._cert_roles = dict(cert_roles or {})
        self._cert_role = cert_role

    @property
    def required(self) -> bool:
        return bool(self._tokens) or self._mtls

    def caller(self, metadata, auth_context: Mapping[str, Any] | None) -> Caller | None:
        """The authenticated caller, or None (refuse). Where tokens are configured, a token that is sent but
        wrong is refused even when a certificate would do (the caller meant that token); without tokens
        configured, a stray authorization header is ignored and the certificate decides."""
        if not self.required:
            return ANONYMOUS
        presented = _bearer_tokens(metadata) if self._tokens else []
        if presented:
            for given in presented:
                match = None
                for entry in self._tokens:  # every entry compared: no early exit that would leak timing
                    if hmac.compare_digest(given.encode(), entry.token.encode()) and match is None:
                        match = entry
                if match is not None:
                    return Caller(f"token:{match.name}", match.role)
            return None
        if self._mtls and auth_context:
            names = [v.decode("utf-8", "replace") for key in ("x509_common_name", "x509_subject_alternative_name")
                     for v in auth_context.get(key, ())]
            if names:
                role = next((self._cert_roles[n] for n in names if n in self._cert_roles), self._cert_role)
                return Caller(f"cert:{names[0]}", role)
        return None


def _bearer_tokens(metadata) -> list[str]:
    out = []
    for key, value in metadata or ():
        if key.lower() != "authorization":
            continue
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        scheme, _, given = value.partition(" ")
        if scheme.lower() == "bearer":
            out.append(given.strip())
        else:
            out.append("")  # an authorization header we cannot use still counts as a (wrong) credential
    return out


def bearer_token_ok(metadata, token: str) -> bool:
    """Constant-time check of `authorization: Bearer <token>` among the call's metadata."""
    expected = token.encode()
    ok = False
    for given in _bearer_tokens(metadata):
        # compare_digest on every candidate: no early exit that would leak timing.
        ok |= hmac.compare_digest(given.encode(), expected)
    return ok


class AuthInterceptor(grpc.ServerInterceptor):
    """Authenticate every call (but health and reflection) with `authenticator`; `write_methods` (bare method
    names, e.g. "SetMode") need the write role. The behaviour runs with current_caller() set."""

    def __init__(self, authenticator: Authenticator, write_methods: Collection[str] = (),
                 exempt_prefixes: tuple[str, ...] = EXEMPT_METHOD_PREFIXES) -> None:
        self._auth = authenticator
        self._write = frozenset(write_methods)
        self._exempt = exempt_prefixes

    def intercept_service(self, continuation: Callable, handler_call_details: grpc.HandlerCallDetails):
        method = handler_call_details.method or ""
        handler = continuation(handler_call_details)
        if handler is None or method.startswith(self._exempt):
            return handler  # unknown method: gRPC answers UNIMPLEMENTED
        return _guarded(handler, self._auth, method.rpartition("/")[2] in self._write)


def _admit(auth: Authenticator, context: grpc.ServicerContext, write: bool) -> Caller:
    caller = auth.caller(context.invocation_metadata(), context.auth_context())
    if caller is None:
        context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or invalid credentials: send metadata "
                      "'authorization: Bearer <token>' (or a client certificate the server trusts)")
    if write and not caller.may_write:
        context.abort(grpc.StatusCode.PERMISSION_DENIED,
                      f"{caller.identity} has the read role; this call changes the fleet and needs the write role")
    return caller


def _guarded(handler: grpc.RpcMethodHandler, auth: Authenticator, write: bool) -> grpc.RpcMethodHandler:
    """A handler of the same shape as `handler` that authenticates first."""
    kwargs = {"request_deserializer": handler.request_deserializer, "response_serializer": handler.response_serializer}
    if handler.unary_unary is not None:
        inner = handler.unary_unary

        def unary(request, context):
            token = _CALLER.set(_admit(auth, context, write))
            try:
                return inner(request, context)
            finally:
                _CALLER.reset(token)

        return grpc.unary_unary_rpc_method_handler(unary, **kwargs)
    if handler.unary_stream is not None:
        inner_stream = handler.unary_stream

        def stream(request, context):
            _admit(auth, context, write)
            yield from inner_stream(request, context)

        return grpc.unary_stream_rpc_method_handler(stream, **kwargs)

    def refuse(request_or_iterator, context):  # no streaming-request RPC is served; refuse rather than guess
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "streaming requests are not served")

    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(refuse, **kwargs)
    return grpc.stream_stream_rpc_method_handler(refuse, **kwargs)


# --------------------------------------------------------------------------- servers


def add_health_and_reflection(server: grpc.Server, service_name: str) -> health.HealthServicer:
    """Serve gRPC health (overall and `service_name` SERVING) and reflection; returns the health servicer."""
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    for name in ("", service_name):
        servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    reflection.enable_server_reflection((service_name, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    return servicer


def server_options(max_receive_bytes: int) -> list[tuple[str, int]]:
    """gRPC server options: requests above `max_receive_bytes` are refused by gRPC (RESOURCE_EXHAUSTED) before
    any handler sees them."""
    return [("grpc.max_receive_message_length", int(max_receive_bytes))]


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
