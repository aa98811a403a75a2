"""`governor picker`: the endpoint picker as a gRPC ext_proc server for Envoy, with RouterControl.

Envoy's `ext_proc` filter (request headers SEND, request body BUFFERED, response headers
SEND) opens one gRPC stream per HTTP request. For each one the picker reads the priority
class from a header (`x-governor-class` by default; unknown or absent → standard), the route
group from another (`x-governor-route-group`; absent → the first group) and the prompt from the
buffered JSON body (`prompt`, or the chat `messages`), asks the pure `Picker` (picker.py) and
answers with either

- a header mutation setting `x-gateway-destination-endpoint: primary[,fallback]` (the Gateway API
  Inference Extension's convention: the chosen replica, then another replica of the same pool when it has one),
  with the same value as dynamic metadata `envoy.lb` / `x-gateway-destination-endpoint` for gateways that
  route on metadata; Envoy's override_host policy sends the request to the primary and retries it once on the
  fallback only if it never reached the primary (deploy/envoy/loopback.yaml), or
- an ImmediateResponse: 429 (shed, rate limit) or 503 (queue budget, hold timeout, no
  endpoint) with `retry-after`.

A held request's stream simply waits: Envoy's `message_timeout` must exceed the hold timeout.
The request's slot is freed when Envoy closes the stream (the HTTP exchange is over). Its tenant and task come
from headers (tasks.py; a header that breaks the convention is 400 `bad_header`); its step's outcome from the
response status, and from Envoy's access log (`AccessLogServicer` on the ext_proc port), whose entry says whether
the stream was cut after its first byte — the ext_proc stream ends the same way either way. Which replica served it
comes back on the response headers (metadata `envoy.lb` / `x-gateway-destination-endpoint-served`, the GIE
convention): when the fallback did, the request's slot moves there (`Picker.moved`); it stays one step.
Envoy learns the replicas it may send to from the picker itself: EDS on the ext_proc port (eds.py).

Beside it: `governor.v1.RouterControl` (policy.py's semantics) and the gRPC health service on
a control port — beyond loopback only with a bearer token (`control_token`) or mTLS (`control_tls`),
RouterControl calls without them refused UNAUTHENTICATED, health exempt for probes. (With
`--follow HOST:PORT` the picker also copies another picker's policy every scrape interval, with
its own credentials, so several pickers obey the one that Governor commands.) Prometheus metrics on
an HTTP port; a loop that scrapes each engine's /metrics and refreshes the replica list
(`--discovery` HTTP SD JSON, or `dns:NAME:PORT` pools: every address a headless Service's name
resolves to) every `--scrape-interval`. Everything runs on one asyncio loop, so the Picker is
never touched from two threads (scrapes run in worker threads and hand their results back).

Bad input: a message whose bytes do not parse is answered INVALID_ARGUMENT on either port (gRPC itself
would say INTERNAL); messages are capped (CONTROL_MAX_MESSAGE_BYTES, EXTPROC_MAX_MESSAGE_BYTES →
RESOURCE_EXHAUSTED); an ext_proc stream decides once (a repeated headers or body message passes through,
so no slot is taken twice) and a ProcessingRequest that sets nothing is INVALID_ARGUMENT; a body that is
not JSON, or nested too deep to parse, has no prompt. tests/reliability/test_fuzz_dataplane.py fuzzes both.

Must not: decide what Governor decides (it only applies RoutingPolicy), or block the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import math
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field

import cachetools
import grpc
from envoy.config.core.v3 import base_pb2
from envoy.data.accesslog.v3 import accesslog_pb2 as al_pb
from envoy.service.accesslog.v3 import als_pb2, als_pb2_grpc
from envoy.service.endpoint.v3 import eds_pb2_grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep_pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc
from envoy.type.v3 import http_status_pb2
from google.protobuf import struct_pb2
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from controller.dataplane.eds import EndpointDiscovery
from controller.dataplane.model_routing import (
    InferencePoolMembership,
    ModelNotServedError,
    ModelRoutes,
    PoolRef,
    request_model,
    served_names,
)
from controller.dataplane.picker import ColdStart, Endpoint, HeldRequest, Picker
from controller.dataplane.policy_store import PolicyStore, PoolSettings, Settings
from controller.dataplane.scrape import ScrapeError, fetch, parse_engine_metrics, parse_http_sd
from controller.dataplane.task_book import (
    PROFILE_STEPS,
    Identity,
    IdentityError,
    StepTicket,
    TaskBook,
    TenantSettings,
    parse_identity,
)
from controller.gen.governor.v1 import control_pb2 as pb
from controller.gen.governor.v1 import control_pb2_grpc as pb_grpc
from controller.rpc.transport import (
    AioBearerTokenInterceptor,
    AioCheckedRequestsInterceptor,
    InsecureListenError,
    TlsConfig,
    bearer_metadata,
    bind,
    is_loopback_address,
)
from controller.types import PRIORITY_CLASSES

log = logging.getLogger(__name__)

DESTINATION_HEADER = "x-gateway-destination-endpoint"
LB_NAMESPACE = "envoy.lb"  # the GIE's metadata namespace for the destination (and the served endpoint)
SERVED_KEY = "x-gateway-destination-endpoint-served"  # set by Envoy's override_host policy (selected_host_key)
POOL_HEADER = "x-governor-pool"
PICK_BUCKETS = (0.000025, 0.00005, 0.000075, 0.0001, 0.0002, 0.0003, 0.0004, 0.0005, 0.00075, 0.001, 0.0015,
                0.002, 0.003, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25)
# the others (queue budget, hold timeout, no endpoint, cold start timeout): 503
REJECT_CODES = {"shed": "429", "rate_limit": "429", "cold_queue_full": "429", "model_not_found": "404",
                "tenant_rate_limit": "429", "tenant_concurrency": "429", "bad_header": "400"}
REQUEST_ID_HEADER = "x-request-id"  # Envoy's own, set before the filters run; the access log carries it too
# How long a finished step waits for Envoy's access log entry (which says whether its stream was cut) before the
# response status alone settles it: several of the bootstrap's flush intervals (deploy/envoy/loopback.yaml, 0.2 s).
ACCESS_LOG_WAIT_S = 5.0
PENDING_MAX = 100_000  # finished steps waiting for their access log entry (the same bound as streams in flight)
# The estimate of a request's tokens the tenants' fair share weighs: its prompt at ~4 characters a token (the
# usual figure for English BPE vocabularies) plus its max_tokens (a request that gives none: this many).
CHARS_PER_TOKEN = 4.0
DEFAULT_MAX_TOKENS = 256
HOLD_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# A RoutingPolicy costs ~60 bytes a pool and ~30 a class: 1 MiB is ~15,000 pools, far beyond any fleet, and keeps
# one oversized command from costing the picker's loop more than a millisecond or two to parse.
CONTROL_MAX_MESSAGE_BYTES = 1 << 20
# ext_proc carries the buffered request body; gRPC's own default (4 MiB) is kept, explicitly: a prompt of a 128k-token
# context is ~0.5 MB of text, and only its first --affinity-blocks × --block-chars characters are read.
EXTPROC_MAX_MESSAGE_BYTES = 4 << 20
EXTPROC_MAX_STREAMS = 100_000  # requests in flight through one Envoy; see start_picker for the pending-call limits


@dataclass
class PickerConfig:
    groups: dict[str, list[str]]  # route group → pools
    endpoints: dict[str, list[str]] = field(default_factory=dict)  # pool → host:port (static membership)
    # pool → (DNS name, port): every address the name resolves to (a headless Service lists its ready pods)
    dns: dict[str, tuple[str, int]] = field(default_factory=dict)
    discovery_url: str = ""  # Prometheus HTTP SD JSON (replaces static membership when set)
    follow: str = ""  # host:port of another picker's RouterControl whose policy this one copies
    defaults: Settings | None = None  # in force before Governor speaks and after its command expires
    class_header: str = "x-governor-class"
    group_header: str = "x-governor-route-group"
    hold_timeout_s: float = 30.0
    scrape_interval_s: float = 1.0
    block_chars: int = 256
    affinity_blocks: int = 4
    host: str = "127.0.0.1"
    extproc_port: int = 0
    control_port: int = 0
    metrics_port: int = 0
    # RouterControl's callers (and the leader this one follows) authenticate with this bearer token and/or
    # mTLS; beyond loopback one of the two is required (anyone who reaches the port could steer the traffic)
    control_token: str | None = None
    control_tls: TlsConfig | None = None
    # model-aware routing (models.py): pool → the model names it serves (served model name, LoRA adapters)
    models: dict[str, list[str]] = field(default_factory=dict)
    models_interval_s: float = 10.0  # how often each replica's GET /v1/models is read
    # pool → (namespace, InferencePool name): membership from the InferencePool and its EndpointSlices
    inferencepools: dict[str, tuple[str, str]] = field(default_factory=dict)
    kubeconfig: str | None = None  # for inferencepools; None: the pod's service account
    cold: ColdStart | None = None  # holding requests while a route group has no ready replica (picker.py)
    # tasks and tenants (tasks.py): tenant → limits ("*": every tenant not named), step-aware admission, the book
    tenants: dict[str, TenantSettings] = field(default_factory=dict)
    step_aware: bool = True
    max_tasks: int = 100_000
    task_ttl_s: float = 600.0
    max_tenants: int = 64

    def __post_init__(self) -> None:
        pools = [p for ps in self.groups.values() for p in ps]
        unknown = sorted((set(self.endpoints) | set(self.dns) | set(self.inferencepools) | set(self.models))
                         - set(pools))
        if unknown:
            raise ValueError(f"endpoints: pools {unknown} are in no route group ({self.groups})")
        if not (math.isfinite(self.hold_timeout_s) and self.hold_timeout_s > 0):
            raise ValueError(f"hold_timeout_s: {self.hold_timeout_s!r} must be > 0")
        if not (math.isfinite(self.scrape_interval_s) and self.scrape_interval_s > 0):
            raise ValueError(f"scrape_interval_s: {self.scrape_interval_s!r} must be > 0")
        if self.defaults is None:
            self.defaults = Settings({p: PoolSettings() for p in pools}, tenants=dict(self.tenants),
                                     step_aware=self.step_aware)
        missing = sorted(set(pools) - set(self.defaults.pools))
        if missing:
            raise ValueError(f"defaults: no settings for pools {missing}")
        listen = _hp(self.host, self.control_port)
        if not is_loopback_address(listen) and not self.control_token and not (
                self.control_tls is not None and self.control_tls.mutual):
            raise InsecureListenError(
                f"refusing to serve RouterControl on {listen} without authentication: anyone who can reach it "
                "could change routing and admission. Give --control-token-file, or mTLS (--tls-cert, --tls-key "
                "and --tls-client-ca), or listen on 127.0.0.1 (--host).")


def _follow_channel(cfg: PickerConfig) -> grpc.aio.Channel:
    """The channel to the leader picker, with this picker's own credentials: the pickers of one fleet share a
    token, and with TLS the leader is verified with the CA of --tls-client-ca and sees this picker's certificate."""
    tls = cfg.control_tls
    if tls is None:
        return grpc.aio.insecure_channel(cfg.follow)
    from pathlib import Path

    ca = Path(tls.client_ca_file).read_bytes() if tls.client_ca_file else None
    creds = grpc.ssl_channel_credentials(root_certificates=ca, private_key=Path(tls.key_file).read_bytes(),
                                         certificate_chain=Path(tls.cert_file).read_bytes())
    return grpc.aio.secure_channel(cfg.follow, creds)


def _served(msg: ep_pb.ProcessingRequest) -> str:
    """The replica Envoy sent the request to (its last attempt), from the metadata ext_proc forwards, or ""."""
    ns = msg.metadata_context.filter_metadata.get(LB_NAMESPACE)
    if ns is None:
        return ""
    v = ns.fields.get(SERVED_KEY)
    return v.string_value if v is not None else ""


def _header(headers: ep_pb.HttpHeaders, name: str) -> str | None:
    for h in headers.headers.headers:
        if h.key.lower() == name:
            return h.raw_value.decode("utf-8", "replace") if h.raw_value else h.value
    return None


def resolve(name: str, port: int) -> list[str]:
    """host:port for every address `name` resolves to, sorted (blocking: run in a worker thread)."""
    import socket

    infos = socket.getaddrinfo(name, port, type=socket.SOCK_STREAM)
    return sorted({_hp(str(i[4][0]), port) for i in infos})


def body_fields(body: bytes) -> tuple[str, str | None]:
    """(the prompt text, the `model`) of an OpenAI request body, parsed once."""
    prompt, model, _ = body_request(body)
    return prompt, model


def body_request(body: bytes) -> tuple[str, str | None, float]:
    """(the prompt text, the `model`, the estimated tokens: prompt and output) of an OpenAI request body."""
    if not body:
        return "", None, 0.0
    try:
        req = json.loads(body)
    except (ValueError, RecursionError):  # not JSON (or not UTF-8), or nested deeper than the parser recurses
        return "", None, 0.0
    prompt = _prompt_of(req)
    out = req.get("max_tokens", req.get("max_completion_tokens")) if isinstance(req, dict) else None
    out_tokens = float(out) if isinstance(out, int) and not isinstance(out, bool) and out >= 0 else DEFAULT_MAX_TOKENS
    return prompt, request_model(req), len(prompt) / CHARS_PER_TOKEN + out_tokens


def prompt_text(body: bytes) -> str:
    """The text affinity hashes: `prompt` of a completion, the chat messages' `role: content` lines."""
    return body_fields(body)[0]


def _prompt_of(req: object) -> str:
    if not isinstance(req, dict):
        return ""
    prompt = req.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        return prompt[0]
    msgs = req.get("messages")
    if isinstance(msgs, list):
        return "\n".join(f"{m.get('role', '')}: {m.get('content', '')}" for m in msgs if isinstance(m, dict))
    return ""


def _set_header(key: str, value: str) -> base_pb2.HeaderValueOption:
    return base_pb2.HeaderValueOption(
        header=base_pb2.HeaderValue(key=key, raw_value=value.encode()),
        append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD)


def immediate(status: int, retry_after_s: int, reason: str, message: str = "") -> ep_pb.ProcessingResponse:
    if reason == "model_not_found":  # OpenAI's own answer to an unknown model
        body = json.dumps({"error": {"message": message, "type": "invalid_request_error", "param": "model",
                                     "code": "model_not_found"}})
    else:
        body = json.dumps({"error": {"message": f"governor picker: {message or reason}", "type": reason,
                                     "code": status}})
    return ep_pb.ProcessingResponse(immediate_response=ep_pb.ImmediateResponse(
        status=http_status_pb2.HttpStatus(code=status),
        headers=ep_pb.HeaderMutation(set_headers=[_set_header("retry-after", str(retry_after_s)),
                                                  _set_header("content-type", "application/json")]),
        body=body.encode(), details=f"governor_{reason}"))


class PickerService:
    """The picker's state on its event loop: Picker, PolicyStore, held futures, the scrape loop."""

    def __init__(self, cfg: PickerConfig) -> None:
        self.cfg = cfg
        assert cfg.defaults is not None  # set by PickerConfig
        self.picker = Picker(cfg.groups, block_chars=cfg.block_chars, affinity_blocks=cfg.affinity_blocks,
                             cold=cfg.cold, book=TaskBook(max_tasks=cfg.max_tasks, task_ttl_s=cfg.task_ttl_s,
                                                          max_tenants=cfg.max_tenants))
        # finished steps waiting for their access log entry, and entries that came before their step finished
        self._pending: cachetools.TTLCache = _Pending(PENDING_MAX, ACCESS_LOG_WAIT_S, self._settle_pending)
        self.access_log = False  # set once Envoy's access log stream connects: outcomes then wait for its entries
        self.models = ModelRoutes(cfg.groups, declared={p: set(names) for p, names in cfg.models.items()})
        self.membership = (InferencePoolMembership.from_kubeconfig(
            {p: PoolRef(ns, name) for p, (ns, name) in cfg.inferencepools.items()}, cfg.kubeconfig)
            if cfg.inferencepools else None)
        self._models_read_at: dict[str, float] = {}  # endpoint → when its /v1/models was last read
        self.store = PolicyStore(cfg.defaults)
        for pool, addrs in cfg.endpoints.items():
            self.picker.set_endpoints(pool, addrs)
        self.eds = EndpointDiscovery()  # the replicas Envoy may send to (eds.py)
        self.publish_endpoints()
        self.registry = CollectorRegistry(auto_describe=True)
        self.pick_latency = Histogram("governor_picker_pick_latency_seconds",
                                      "Time to decide one request (body parsed to answer sent), held ones excluded",
                                      buckets=PICK_BUCKETS, registry=self.registry)
        self.hold_time = Histogram("governor_picker_hold_seconds", "Time requests spent held before a replica",
                                   buckets=HOLD_BUCKETS, registry=self.registry)
        self.registry.register(_Collector(self))
        self._fallback = True
        self._stop = asyncio.Event()
        self._follow_channel: grpc.aio.Channel | None = None
        self.scrape_errors = 0

    # ------------------------------------------------------------------ policy

    def settings(self) -> Settings:
        a = self.store.settings(time.time())
        if a.fallback != self._fallback:
            self._fallback = a.fallback
            if a.fallback:
                log.warning("policy generation %d (%s) expired at %.3f: the picker's defaults are in force",
                            a.generation, a.decision_id, a.valid_until_unix_s)
        return a.settings

    def apply_policy(self, msg: pb.RoutingPolicy) -> pb.Ack:
        ack = self.store.apply(msg, time.time())
        if ack.status == pb.ACK_STATUS_APPLIED:
            self._fallback = False
            log.info("applied routing policy generation %d (%s)", msg.meta.generation, msg.meta.decision_id)
            self._wake(self.picker.dispatch_held(self.settings()))
        return ack

    # ------------------------------------------------------------------ requests

    async def decide(self, cls: str, group: str | None, prompt: str, model: str | None = None,
                     ident: Identity | None = None, tokens: float = 0.0
                     ) -> tuple[Endpoint | None, ep_pb.ProcessingResponse, StepTicket | None]:
        """The endpoint (or None), the answer for the body (or headers) message, and the step's ticket."""
        t0 = time.perf_counter()
        try:
            group = self.models.group_for(model, group)
        except ModelNotServedError as exc:
            c = self.picker.counters
            c.rejected[(cls, "model_not_found")] = c.rejected.get((cls, "model_not_found"), 0) + 1
            return None, immediate(404, 0, "model_not_found", str(exc)), None
        try:
            r = self.picker.route(cls, prompt, self.settings(), time.monotonic(), group, ident, tokens)
        except ValueError as exc:
            return None, immediate(400, 0, str(exc)), None
        for h in self.picker.take_evicted():  # held requests that gave their place up to this one's tenant
            fut = h.token
            if isinstance(fut, asyncio.Future) and not fut.done():
                fut.set_result(None)
        if r.endpoint is not None:
            resp = self._route_to(r.endpoint, r.fallback)
            self.pick_latency.observe(time.perf_counter() - t0)
            return r.endpoint, resp, r.ticket
        if r.held is None:
            self.pick_latency.observe(time.perf_counter() - t0)
            return None, immediate(r.status, r.retry_after_s, r.reason), None
        ep, resp = await self._hold(r.held)
        return ep, resp, r.held.ticket if ep is not None else None

    def bad_header(self, cls: str, exc: IdentityError) -> ep_pb.ProcessingResponse:
        c = self.picker.counters
        c.arrive(cls, time.monotonic())
        c.rejected[(cls, "bad_header")] = c.rejected.get((cls, "bad_header"), 0) + 1
        return immediate(400, 0, "bad_header", str(exc))

    async def _hold(self, h: HeldRequest) -> tuple[Endpoint | None, ep_pb.ProcessingResponse]:
        fut: asyncio.Future[Endpoint | None] = asyncio.get_running_loop().create_future()
        h.token = fut
        t0 = time.monotonic()
        cold = not h.pool  # held for a route group with no ready replica: its class's bound, not the hold timeout
        try:
            ep = await asyncio.wait_for(asyncio.shield(fut), h.wait_s if cold and h.wait_s else self.cfg.hold_timeout_s)
        except TimeoutError:
            if self.picker.abandon(h):
                if cold:
                    return None, immediate(503, max(1, min(60, round(h.wait_s or 1))), "cold_start_timeout")
                return None, immediate(503, 1, "hold_timeout")
            ep = fut.result()  # dispatched in the same instant
        except asyncio.CancelledError:
            if not self.picker.abandon(h, "client_gone") and h.endpoint is not None:
                self.release(h.endpoint, h.ticket)  # dispatched as the client left: a failed step
            raise
        if ep is None:  # it gave its place in the queue budget up to another tenant (picker.py `_displace`)
            return None, immediate(503, 1, h.rejected or "queue_budget")
        self.hold_time.observe(time.monotonic() - t0)
        return ep, self._route_to(ep, h.fallback)

    @staticmethod
    def _route_to(ep: Endpoint, fallback: Endpoint | None = None) -> ep_pb.ProcessingResponse:
        dest = ep.address if fallback is None else f"{ep.address},{fallback.address}"
        mutation = ep_pb.HeaderMutation(set_headers=[_set_header(DESTINATION_HEADER, dest),
                                                     _set_header(POOL_HEADER, ep.pool)])
        # the same value as dynamic metadata (namespace envoy.lb), which Gateway API implementations read
        meta = struct_pb2.Struct()
        meta.update({LB_NAMESPACE: {DESTINATION_HEADER: dest}})
        return ep_pb.ProcessingResponse(request_body=ep_pb.BodyResponse(
            response=ep_pb.CommonResponse(header_mutation=mutation)), dynamic_metadata=meta)

    def served_by(self, ep: Endpoint, served: str) -> Endpoint:
        """The replica that served a request sent to `ep` (Envoy's word, from the response headers' metadata): `ep`,
        or its fallback after a retry — then the request's slot moves there. An address that is not another replica
        of the same pool (membership changed meanwhile) leaves the slot where it was."""
        if not served or served == ep.address:
            return ep
        other = next((e for e in self.picker.endpoints.get(ep.pool, ()) if e.address == served), None)
        if other is None:
            return ep
        self.picker.moved(ep, other)
        return other

    def publish_endpoints(self) -> None:
        """Every replica the picker routes, to Envoy's EDS stream (a new version only when the set changed)."""
        self.eds.publish(e.address for es in self.picker.endpoints.values() for e in es)

    def set_membership(self, pool: str, addrs: list[str]) -> None:
        """A pool's replicas now, to the picker and at once to Envoy (a replica the picker may name is one Envoy
        has, but for the moment Envoy takes to apply the new version)."""
        self.picker.set_endpoints(pool, addrs)
        self.publish_endpoints()

    def release(self, ep: Endpoint, ticket: StepTicket | None = None, status: int = 0,
                request_id: str | None = None) -> None:
        """The request's stream ended: free its slot; settle its step by its response status (2xx ok), or, when
        Envoy's access log is connected, by the log entry that says whether the stream was cut (`access_logged`)."""
        ok: bool | None = 200 <= status < 300
        if ticket is not None and self.access_log and request_id:
            seen = self._pending.pop(request_id, None)
            if isinstance(seen, bool):
                ok = ok and seen  # the entry came first
            else:
                if seen is not None:  # a request id seen twice: the earlier step settles by its status
                    self._settle_pending(request_id, seen)
                self._pending[request_id] = (ticket, ok)  # its entry comes later (or the wait settles it)
                ok = None
        self._wake(self.picker.finish(ep, self.settings(), ticket, ok))

    def access_logged(self, entry: al_pb.HTTPAccessLogEntry) -> None:
        """One request's access log entry: whether its stream completed (an upstream reset or termination after
        the first byte, or a client that went away, is a failed step, never replayed)."""
        rid = entry.request.request_id
        if not rid:
            return
        f = entry.common_properties.response_flags
        ok = (200 <= entry.response.response_code.value < 300 and not (
            f.upstream_remote_reset or f.upstream_connection_termination or f.upstream_connection_failure
            or f.local_reset or f.downstream_connection_termination or f.downstream_remote_reset
            or f.upstream_request_timeout or f.stream_idle_timeout or f.upstream_protocol_error))
        seen = self._pending.pop(rid, None)
        if seen is None:
            self._pending[rid] = ok  # its stream has not ended at the picker yet
        elif not isinstance(seen, bool):
            ticket, status_ok = seen
            self.picker.settle(ticket, status_ok and ok)

    def _settle_pending(self, rid: str, value: object) -> None:
        """An entry that waited past ACCESS_LOG_WAIT_S (or was pushed out): a step settles by its status."""
        if isinstance(value, tuple):
            ticket, ok = value
            self.picker.settle(ticket, ok)

    def expire_pending(self) -> None:
        for rid, value in self._pending.expire():
            self._settle_pending(rid, value)

    @staticmethod
    def _wake(dispatched: list[HeldRequest]) -> None:
        for h in dispatched:
            fut = h.token
            if isinstance(fut, asyncio.Future) and not fut.done() and h.endpoint is not None:
                fut.set_result(h.endpoint)

    # ------------------------------------------------------------------ readings

    async def scrape_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._stop.is_set():
            t0 = loop.time()
            try:
                await self.scrape_once()
            except Exception:  # a bad reading must not stop the loop; it is logged and counted
                self.scrape_errors += 1
                log.exception("scrape failed")
            with_deadline = max(0.0, self.cfg.scrape_interval_s - (loop.time() - t0))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), with_deadline)

    async def follow_once(self) -> None:
        """Copy the leader picker's policy (same generation and id: a replay; expired there: refused here)."""
        if not self.cfg.follow:
            return
        if self._follow_channel is None:
            self._follow_channel = _follow_channel(self.cfg)
        stub = pb_grpc.RouterControlStub(self._follow_channel)
        try:
            msg = await stub.GetRoutingPolicy(pb.GetRoutingPolicyRequest(), timeout=1.0,
                                              metadata=bearer_metadata(self.cfg.control_token) or None)
        except grpc.aio.AioRpcError as exc:
            self.scrape_errors += 1
            log.warning("follow %s: %s", self.cfg.follow, exc.code().name)
            return
        if msg.HasField("meta") and msg.meta.generation > 0 and msg.meta.valid_until_unix_s > time.time():
            ack = self.apply_policy(msg)
            if ack.status == pb.ACK_STATUS_INVALID:
                log.warning("follow %s: the leader's policy is not valid here: %s", self.cfg.follow, ack.message)

    async def scrape_once(self) -> None:
        loop = asyncio.get_running_loop()
        await self.follow_once()
        timeout = min(1.0, self.cfg.scrape_interval_s)
        if self.cfg.discovery_url:
            try:
                body = await loop.run_in_executor(None, fetch, self.cfg.discovery_url, timeout)
                for pool, addrs in parse_http_sd(body, self.picker.endpoints).items():
                    self.set_membership(pool, addrs)
            except ScrapeError as exc:
                self.scrape_errors += 1
                log.warning("discovery: %s", exc)
        for pool, (name, port) in self.cfg.dns.items():
            try:
                addrs = await loop.run_in_executor(None, resolve, name, port)
                self.set_membership(pool, addrs)
            except OSError as exc:
                self.scrape_errors += 1
                log.warning("pool %s: cannot resolve %s: %s (keeping the last membership)", pool, name, exc)
        self.expire_pending()
        await self._read_inferencepools(loop)
        eps = [e for es in self.picker.endpoints.values() for e in es]
        await self._read_models(loop, [e for e in eps if e.healthy], timeout)

        def read(e: Endpoint) -> tuple[Endpoint, tuple[float, float] | None]:
            try:
                return e, parse_engine_metrics(fetch(f"http://{e.address}/metrics", timeout).decode())
            except (ScrapeError, UnicodeDecodeError):
                return e, None

        results = await asyncio.gather(*(loop.run_in_executor(None, read, e) for e in eps))
        for e, reading in results:
            if reading is None:
                self.scrape_errors += 1
                e.healthy = False  # unreachable: no new requests until it answers again
            else:
                e.engine_queue, e.kv_usage = reading
                e.healthy = True
        self._wake(self.picker.dispatch_held(self.settings()))

    async def _read_inferencepools(self, loop: asyncio.AbstractEventLoop) -> None:
        """Membership (and declared model names) from each pool's InferencePool and its EndpointSlices."""
        if self.membership is None:
            return
        for pool in self.membership.refs:
            try:
                addrs, declared = await loop.run_in_executor(None, self.membership.read, pool)
            except Exception as exc:  # noqa: BLE001 - an API error keeps the last membership; logged and counted
                self.scrape_errors += 1
                log.warning("pool %s: cannot read its InferencePool: %s (keeping the last membership)", pool, exc)
                continue
            self.set_membership(pool, addrs)
            if declared:
                self.models.declared[pool] = set(self.cfg.models.get(pool, ())) | declared

    async def _read_models(self, loop: asyncio.AbstractEventLoop, eps: list[Endpoint], timeout: float) -> None:
        """Each replica's GET /v1/models (base model and LoRA adapters), every models_interval_s per replica."""
        now = time.monotonic()
        due = [e for e in eps if now - self._models_read_at.get(e.address, -math.inf) >= self.cfg.models_interval_s]

        def read(e: Endpoint) -> tuple[Endpoint, set[str]]:
            try:
                return e, served_names(fetch(f"http://{e.address}/v1/models", timeout))
            except ScrapeError:
                return e, set()

        found: dict[str, set[str]] = {}
        for e, names in await asyncio.gather(*(loop.run_in_executor(None, read, e) for e in due)):
            self._models_read_at[e.address] = now
            found.setdefault(e.pool, set()).update(names)
        for pool, names in found.items():
            self.models.report(pool, names)

    def stop(self) -> None:
        self._stop.set()

    async def close(self) -> None:
        if self._follow_channel is not None:
            await self._follow_channel.close()


class _Pending(cachetools.TTLCache):
    """Request id → a finished step waiting for its access log entry (or an entry waiting for its step); what the
    LRU pushes out of a full map is settled like an expired one."""

    def __init__(self, maxsize: int, ttl: float, on_out) -> None:
        super().__init__(maxsize, ttl, timer=time.monotonic)
        self._on_out = on_out

    def popitem(self):
        key, value = super().popitem()
        self._on_out(key, value)
        return key, value


class _Collector:
    """Arrivals per class (total and the last whole second), held, rejections, endpoints, policy."""

    def __init__(self, svc: PickerService) -> None:
        self.svc = svc

    def describe(self) -> list:
        return []

    def collect(self):  # prometheus_client's collector protocol
        p = self.svc.picker
        c = p.counters
        now = time.monotonic()
        arrivals = CounterMetricFamily("governor_picker_arrivals", "Requests that reached the picker",
                                       labels=["class"])
        rate = GaugeMetricFamily("governor_picker_arrivals_last_second",
                                 "Arrivals in the last whole second (requests/s, finer than a scrape)",
                                 labels=["class"])
        held_total = CounterMetricFamily("governor_picker_held", "Requests held for a replica with room",
                                         labels=["class"])
        held_now = GaugeMetricFamily("governor_picker_held_now", "Requests held right now", labels=["class"])
        cold = GaugeMetricFamily("governor_picker_cold_held_now",
                                 "Requests held for a route group with no ready replica (scale from zero)")
        cold.add_metric([], p.cold_count())
        for cls in PRIORITY_CLASSES:
            arrivals.add_metric([cls], c.arrivals[cls])
            rate.add_metric([cls], c.last_second_rate(cls, now))
            held_total.add_metric([cls], c.held[cls])
            held_now.add_metric([cls], p.held_count(cls))
        rejected = CounterMetricFamily("governor_picker_rejected", "Requests rejected (shed, rate limit, queue "
                                       "budget, hold timeout, no endpoint)", labels=["class", "reason"])
        for (cls, reason), n in sorted(c.rejected.items()):
            rejected.add_metric([cls, reason], n)
        inflight = GaugeMetricFamily("governor_picker_endpoint_inflight", "Requests in flight per replica",
                                     labels=["pool", "endpoint"])
        picks = CounterMetricFamily("governor_picker_picks", "Requests sent per replica", labels=["pool", "endpoint"])
        for pool, eps in list(p.endpoints.items()):
            for e in list(eps):
                inflight.add_metric([pool, e.address], e.inflight)
                picks.add_metric([pool, e.address], e.picks)
        fallbacks = CounterMetricFamily("governor_picker_fallback_retries", "Requests that never reached the "
                                        "replica picked first and went to the pool's fallback replica (Envoy's one "
                                        "retry, or a primary Envoy's EDS did not list yet)", labels=["pool"])
        for pool in p.endpoints:
            fallbacks.add_metric([pool], c.fallbacks.get(pool, 0))
        epp = self._epp_families(p)
        a = self.svc.store.settings(time.time())
        fallback = GaugeMetricFamily("governor_picker_policy_fallback",
                                     "1 while the picker's defaults are in force (no live RoutingPolicy)")
        fallback.add_metric([], 1.0 if a.fallback else 0.0)
        gen = GaugeMetricFamily("governor_picker_policy_generation", "Generation of the last applied RoutingPolicy")
        gen.add_metric([], a.generation)
        return [arrivals, rate, held_total, held_now, cold, rejected, inflight, picks, fallbacks, fallback, gen, *epp,
                *self._task_families(p)]

    @staticmethod
    def _task_families(p: Picker) -> list:
        """Task outcomes per class and tenant, their tokens, steps by kind and outcome, the book's size."""
        book = p.book
        c = book.counters
        tasks = CounterMetricFamily("governor_picker_tasks", "Tasks by outcome (started, completed, failed, "
                                    "abandoned, evicted); an unlabelled request is a task of one step",
                                    labels=["class", "tenant", "outcome"])
        for (cls, tenant, outcome), n in sorted(c.tasks.items()):
            tasks.add_metric([cls, tenant, outcome], n)
        tokens = CounterMetricFamily("governor_picker_task_tokens", "Estimated tokens (prompt and max output) of "
                                     "the tasks settled, by outcome", labels=["outcome"])
        for outcome, v in sorted(c.tokens.items()):
            tokens.add_metric([outcome], v)
        steps = CounterMetricFamily("governor_picker_steps", "Steps by kind (first: a new task's, later: a task "
                                    "under way's) and outcome (ok, failed, rejected)", labels=["kind", "outcome"])
        for (kind, outcome), n in sorted(c.steps.items()):
            steps.add_metric([kind, outcome], n)
        unlabelled = CounterMetricFamily("governor_picker_unlabelled_requests", "Admitted requests without a task "
                                         "id (each counted as a task of one step)")
        unlabelled.add_metric([], c.unlabelled)
        tracked = GaugeMetricFamily("governor_picker_tasks_tracked", "Tasks in the picker's book (bounded)")
        tracked.add_metric([], len(book))
        tin = GaugeMetricFamily("governor_picker_tenant_inflight", "Requests of the tenant in flight or held",
                                labels=["tenant"])
        for tenant, st in sorted(book.tenants.items()):
            tin.add_metric([tenant], st.inflight)
        return [tasks, tokens, steps, unlabelled, tracked, tin, *_Collector._profile_families(c)]

    @staticmethod
    def _profile_families(c) -> list:
        """The step profile (controller/dataplane/task_book.py) the daemon hands the planner, and tenants' tokens."""
        sreq = CounterMetricFamily("governor_picker_step_requests", "Steps of labelled tasks that reached admission "
                                   f"(admitted or refused) by class and step index (0-based; {PROFILE_STEPS - 1}: "
                                   "that index or later)",
                                   labels=["class", "step"])
        stok = CounterMetricFamily("governor_picker_step_tokens", "Estimated tokens (prompt and max output) of those "
                                   "steps by class and step index", labels=["class", "step"])
        for (cls, idx), n in sorted(c.step_requests.items()):
            sreq.add_metric([cls, str(idx)], n)
            stok.add_metric([cls, str(idx)], c.step_tokens.get((cls, idx), 0.0))
        tsteps = CounterMetricFamily("governor_picker_task_steps", "Labelled tasks settled by class and the steps "
                                     f"they ran (declared, else seen; {PROFILE_STEPS}: that many or more)",
                                     labels=["class", "steps"])
        for (cls, n_steps), n in sorted(c.task_steps.items()):
            tsteps.add_metric([cls, str(n_steps)], n)
        ttok = CounterMetricFamily("governor_picker_tenant_tokens", "Estimated tokens (prompt and max output) each "
                                   "tenant offered, admitted or refused", labels=["tenant"])
        for tenant, v in sorted(c.tenant_tokens.items()):
            ttok.add_metric([tenant], v)
        return [sreq, stok, tsteps, ttok]

    @staticmethod
    def _epp_families(p: Picker) -> list:
        """The same counts under the llm-d EPP names Governor's telemetry reads from a router target
        (controller/telemetry/window.py), labelled by `priority`, so the daemon scrapes the picker as a router."""
        c = p.counters
        total = CounterMetricFamily("llm_d_epp_request_total", "Requests received by the picker.",
                                    labels=["priority"])
        shed = CounterMetricFamily("llm_d_epp_governor_shed_total", "Governor extension: requests rejected "
                                   "(429 or 503).", labels=["priority"])
        admitted = CounterMetricFamily("llm_d_epp_governor_admitted_total", "Governor extension: requests admitted.",
                                       labels=["priority"])
        errors = CounterMetricFamily("llm_d_epp_request_error_total", "Requests rejected, by code.",
                                     labels=["priority", "error_code"])
        queue = GaugeMetricFamily("llm_d_epp_flow_control_queue_size", "Requests held by the picker.",
                                  labels=["priority"])
        for cls in PRIORITY_CLASSES:
            rej = dict.fromkeys(("429", "503"), 0)
            for (k, reason), n in list(c.rejected.items()):
                if k == cls:
                    code = REJECT_CODES.get(reason, "503")
                    rej[code] = rej.get(code, 0) + n
            total.add_metric([cls], c.arrivals[cls])
            shed.add_metric([cls], sum(rej.values()))
            admitted.add_metric([cls], c.arrivals[cls] - sum(rej.values()))
            for code, n in rej.items():
                errors.add_metric([cls, code], n)
            queue.add_metric([cls], p.held_count(cls))
        return [total, shed, admitted, errors, queue]


# =========================================================================== gRPC


class ExtProcServicer(ep_grpc.ExternalProcessorServicer):
    def __init__(self, svc: PickerService) -> None:
        self.svc = svc

    async def Process(self, request_iterator: AsyncIterator[ep_pb.ProcessingRequest],  # noqa: N802 - gRPC name
                      context: grpc.aio.ServicerContext) -> AsyncIterator[ep_pb.ProcessingResponse]:
        svc = self.svc
        cfg = svc.cfg
        ep: Endpoint | None = None
        ticket: StepTicket | None = None
        decided = False  # one decision per stream: a repeated headers or body message passes through
        cls, group = "standard", None
        ident: Identity | None = None
        request_id: str | None = None
        status = 0
        try:
            async for msg in request_iterator:
                kind = msg.WhichOneof("request")
                if kind == "request_headers":
                    if not decided:
                        hdrs = msg.request_headers
                        raw = _header(hdrs, cfg.class_header)
                        request_id = _header(hdrs, REQUEST_ID_HEADER)
                        try:
                            ident = parse_identity(functools.partial(_header, hdrs))
                        except IdentityError as exc:
                            decided = True
                            yield svc.bad_header(cls, exc)
                            continue
                        raw_cls = (raw if raw is not None else (ident.objective or "standard")).strip().lower()
                        cls = raw_cls if raw_cls in PRIORITY_CLASSES else "standard"
                        group = _header(msg.request_headers, cfg.group_header)
                    if decided or not msg.request_headers.end_of_stream:
                        yield ep_pb.ProcessingResponse(request_headers=ep_pb.HeadersResponse())
                        continue
                    decided = True  # no body (a GET): decide now
                    ep, resp, ticket = await svc.decide(cls, group, "", None, ident)
                    if resp.HasField("request_body"):
                        resp = ep_pb.ProcessingResponse(request_headers=ep_pb.HeadersResponse(
                            response=resp.request_body.response), dynamic_metadata=resp.dynamic_metadata)
                    yield resp
                elif kind == "request_body":
                    if decided or not msg.request_body.end_of_stream:
                        yield ep_pb.ProcessingResponse(request_body=ep_pb.BodyResponse())
                        continue
                    decided = True
                    prompt, model, tokens = body_request(msg.request_body.body)
                    ep, resp, ticket = await svc.decide(cls, group, prompt, model, ident, tokens)
                    yield resp
                elif kind == "response_headers":
                    raw_status = _header(msg.response_headers, ":status") or ""
                    status = int(raw_status) if raw_status.isdigit() else 0
                    if ep is not None:
                        ep = svc.served_by(ep, _served(msg))
                    yield ep_pb.ProcessingResponse(response_headers=ep_pb.HeadersResponse())
                elif kind == "response_body":
                    yield ep_pb.ProcessingResponse(response_body=ep_pb.BodyResponse())
                elif kind == "request_trailers":
                    yield ep_pb.ProcessingResponse(request_trailers=ep_pb.TrailersResponse())
                elif kind == "response_trailers":
                    yield ep_pb.ProcessingResponse(response_trailers=ep_pb.TrailersResponse())
                else:  # Envoy always sets one; answering nothing would leave the caller waiting
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                        "request: a ProcessingRequest must set one of request_headers, request_body, "
                                        "request_trailers, response_headers, response_body, response_trailers")
        finally:
            if ep is not None:
                svc.release(ep, ticket, status, request_id)


class AccessLogServicer(als_pb2_grpc.AccessLogServiceServicer):
    """Envoy's access log (deploy/envoy/loopback.yaml sends it to the picker): each request's outcome as Envoy saw
    it, which the ext_proc stream alone cannot tell (a stream cut after its first byte ends it like a finished one)."""

    def __init__(self, svc: PickerService) -> None:
        self.svc = svc

    async def StreamAccessLogs(self, request_iterator: AsyncIterator[als_pb2.StreamAccessLogsMessage],  # noqa: N802
                               context: grpc.aio.ServicerContext) -> als_pb2.StreamAccessLogsResponse:
        self.svc.access_log = True
        async for msg in request_iterator:
            for entry in msg.http_logs.log_entry:
                self.svc.access_logged(entry)
        return als_pb2.StreamAccessLogsResponse()


class RouterControlServicer(pb_grpc.RouterControlServicer):
    def __init__(self, svc: PickerService) -> None:
        self.svc = svc

    async def ApplyRoutingPolicy(self, request: pb.RoutingPolicy,  # noqa: N802 - gRPC method name
                                 context: grpc.aio.ServicerContext) -> pb.Ack:
        return self.svc.apply_policy(request)

    async def GetRoutingPolicy(self, request: pb.GetRoutingPolicyRequest,  # noqa: N802 - gRPC method name
                               context: grpc.aio.ServicerContext) -> pb.RoutingPolicy:
        return self.svc.store.to_message(time.time())


@dataclass
class RunningPicker:
    """A started picker: its addresses and how to stop it (from the loop it runs on)."""

    svc: PickerService
    extproc: grpc.aio.Server
    control: grpc.aio.Server
    extproc_address: str
    control_address: str
    metrics_url: str
    metrics_server: object
    scrape_task: asyncio.Task

    async def stop(self, grace_s: float = 0.5) -> None:
        self.svc.stop()
        await self.scrape_task
        await self.svc.close()
        await self.extproc.stop(grace_s)
        await self.control.stop(grace_s)
        shutdown = getattr(self.metrics_server, "shutdown", None)
        if shutdown is not None:
            await asyncio.get_running_loop().run_in_executor(None, shutdown)

    def listening(self) -> Mapping[str, str]:
        return {"extproc": self.extproc_address, "router_control": self.control_address,
                "metrics": self.metrics_url}


def _hp(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def start_picker(cfg: PickerConfig) -> RunningPicker:
    """Start the ext_proc server, RouterControl (+ health), the metrics endpoint and the scrape loop."""
    from prometheus_client import start_http_server

    svc = PickerService(cfg)
    # gRPC's server core queues the streams this event loop has not yet asked for and, by default, cancels what
    # overflows a few thousand of them: a loop starved of CPU for a moment turned a burst into 500s at Envoy, past the
    # picker's own admission. The queue may hold every stream the server accepts; a backlog is then latency
    # (bounded by Envoy's message timeout) and the queue budget and hold timeout stay the only rejections.
    options = [("grpc.so_reuseport", 0), ("grpc.max_concurrent_streams", EXTPROC_MAX_STREAMS),
               ("grpc.server.max_pending_requests", EXTPROC_MAX_STREAMS),
               ("grpc.server.max_pending_requests_hard_limit", EXTPROC_MAX_STREAMS),
               ("grpc.max_receive_message_length", EXTPROC_MAX_MESSAGE_BYTES)]
    extproc = grpc.aio.server(options=options, interceptors=[AioCheckedRequestsInterceptor()])
    ep_grpc.add_ExternalProcessorServicer_to_server(ExtProcServicer(svc), extproc)
    als_pb2_grpc.add_AccessLogServiceServicer_to_server(AccessLogServicer(svc), extproc)
    eds_pb2_grpc.add_EndpointDiscoveryServiceServicer_to_server(svc.eds, extproc)
    port = extproc.add_insecure_port(_hp(cfg.host, cfg.extproc_port))
    interceptors: list[grpc.aio.ServerInterceptor] = [AioCheckedRequestsInterceptor()]
    if cfg.control_token:
        interceptors.insert(0, AioBearerTokenInterceptor(cfg.control_token))  # outermost: refused before parsed
    control = grpc.aio.server(options=[("grpc.so_reuseport", 0),
                                       ("grpc.max_receive_message_length", CONTROL_MAX_MESSAGE_BYTES)],
                              interceptors=interceptors)
    pb_grpc.add_RouterControlServicer_to_server(RouterControlServicer(svc), control)
    hs = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(hs, control)
    cport = bind(control, _hp(cfg.host, cfg.control_port), cfg.control_tls, "RouterControl")
    if port == 0 or cport == 0:
        raise OSError(f"cannot listen for gRPC on {cfg.host}")
    server, _thread = start_http_server(cfg.metrics_port, addr=cfg.host, registry=svc.registry)
    mport = server.server_address[1]
    await extproc.start()
    await control.start()
    for name in ("", "governor.v1.RouterControl"):
        await hs.set(name, health_pb2.HealthCheckResponse.SERVING)
    await svc.scrape_once()
    task = asyncio.create_task(svc.scrape_loop())
    return RunningPicker(svc, extproc, control, _hp(cfg.host, port), _hp(cfg.host, cport),
                         f"http://{_hp(cfg.host, mport)}/metrics", server, task)


class PickerThread:
    """A picker on its own event loop in a background thread (tests, benches and the demo embed it this way)."""

    def __init__(self, cfg: PickerConfig) -> None:
        import threading

        self.cfg = cfg
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="picker", daemon=True)
        self.running: RunningPicker | None = None

    def start(self, timeout_s: float = 10.0) -> RunningPicker:
        self._thread.start()
        self.running = asyncio.run_coroutine_threadsafe(start_picker(self.cfg), self.loop).result(timeout_s)
        return self.running

    def __enter__(self) -> PickerThread:
        """Started; stopped on exit (and if starting fails: the loop's thread is not left behind)."""
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def call(self, fn, timeout_s: float = 5.0):
        """Run `fn()` on the picker's loop (the only thread that may touch its state) and return its result."""
        async def run():
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout_s)

    def stop(self) -> None:
        if self.running is not None:
            asyncio.run_coroutine_threadsafe(self.running.stop(), self.loop).result(10.0)
            self.running = None
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(5.0)
        self.loop.close()
