"""Fuzzing the data plane's gRPC servers over real loopback gRPC: the picker's RouterControl and ext_proc, and the
simulator's RouterControl and AutoscalerControl (controller/sim/control_plane.py).

(The router adapters in controller/actuation/routers/ are clients of the routers' HTTP APIs, not servers: there is
nothing of theirs to fuzz here.)

Properties, per generated request:
- the answer is never UNKNOWN or INTERNAL (an exception in a servicer, or bytes gRPC could not parse): a command is
  answered with an Ack, bytes that are not the request message with INVALID_ARGUMENT naming the method;
- a command is INVALID exactly when it breaks control.proto's rules (an independent statement of them below,
  `routing_problem` / `scaling_problem`), and an INVALID Ack names the field (`pools[1].traffic_weight: …`) in a
  bounded message (a rejected megabyte never comes back);
- a command that was not applied (INVALID, STALE_GENERATION, REPLAY, undecodable) leaves the state as it was: the
  server's Get* answer is the same before and after;
- ext_proc: each stream is answered message for message (or INVALID_ARGUMENT for a message that sets nothing), and
  when it ends no replica slot is left taken;
- after all of it the servers still answer their health checks.

Seeded (derandomize=True, no example database): the default run tries a few hundred cases per RPC in a few
seconds; `GOVERNOR_FUZZ_FULL=1 pytest --timeout 0 tests/reliability/test_fuzz_dataplane.py` runs FULL_CASES
(10,000) per RPC (minutes; pytest-timeout's 300 s per test would cut it). Figures: docs/RELIABILITY.md.
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep_pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.configuration import set_hypothesis_home_dir

from controller.clock import VirtualClock
from controller.dataplane.policy_store import PoolSettings, Settings
from controller.dataplane.server import CONTROL_MAX_MESSAGE_BYTES, PickerConfig, PickerThread
from controller.gen.governor.v1 import control_pb2 as pb
from controller.gen.governor.v1 import control_pb2_grpc as pb_grpc
from controller.paths import PROJECT_ROOT
from controller.sim.control_plane import ControlPlane, serve_control
from controller.sim.fleet import Fleet
from controller.sim.scenario import MAX_NUM_BATCHED_TOKENS_RANGE, MAX_NUM_SEQS_RANGE, load_scenario
from controller.types import PRIORITY_CLASSES
from tests.fakes.idle_engines import idle_engines

FULL = os.environ.get("GOVERNOR_FUZZ_FULL") == "1"
FULL_CASES = 10_000
COMMANDS = FULL_CASES if FULL else 200  # structured commands per Apply* RPC
RAW = FULL_CASES if FULL else 100  # raw byte strings per RPC
STREAMS = FULL_CASES if FULL else 150  # ext_proc streams

FUZZ = settings(derandomize=True, database=None, deadline=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def fuzz(cases: int) -> settings:
    return settings(FUZZ, max_examples=cases)

FIELD = re.compile(r"^(meta(\.\w+)?|pools(\[\d+\](\.\w+)+)?|admission(\[\d+\](\.\w+)+)?): ")
MAX_ANSWER_CHARS = 1000  # an Ack or a status detail: a field, the value cut short, the allowed range
ACK = {pb.ACK_STATUS_APPLIED, pb.ACK_STATUS_REPLAY, pb.ACK_STATUS_STALE_GENERATION, pb.ACK_STATUS_INVALID}
T0 = 1_800_000_000.0  # the simulator's virtual Unix time
SCENARIO = PROJECT_ROOT / "scenarios" / "dataplane" / "fleet.yaml"
PICKER_POOLS = ("a100", "h100")
SIM_POOLS = ("llama8b-a100", "llama8b-h100")
MAX_NAME = 253  # a pool name's longest (command_rules.MAX_POOL_CHARS: a DNS-1123 subdomain)
MAX_ID = 256  # decision_id and issuer (command_rules.MAX_ID_CHARS)
RPC_TIMEOUT_S = 10.0


# =========================================================================== what control.proto allows


def _finite_nonneg(x: float) -> bool:
    return math.isfinite(x) and x >= 0


def meta_problem(m: pb.CommandMeta | None, now: float) -> bool:
    """True when the meta of a command newer than the applied one is invalid."""
    return (m is None or not m.decision_id or len(m.decision_id) > MAX_ID or len(m.issuer) > MAX_ID
            or m.generation < 1 or not (math.isfinite(m.valid_until_unix_s) and m.valid_until_unix_s > now))


def routing_problem(msg: pb.RoutingPolicy, pools: tuple[str, ...]) -> bool:
    names = [p.pool for p in msg.pools]
    if len(names) != len(set(names)) or any(n not in pools for n in names):
        return True
    for p in msg.pools:
        if not _finite_nonneg(p.traffic_weight) or p.inflight_cap < 0:
            return True
        if p.HasField("weights") and not all(_finite_nonneg(v) for v in (p.weights.prefix, p.weights.queue,
                                                                          p.weights.kv_usage)):
            return True
    classes = [a.priority_class for a in msg.admission]
    if len(classes) != len(set(classes)) or any(c not in PRIORITY_CLASSES for c in classes):
        return True
    return any(not _finite_nonneg(a.rate_limit_rps) or a.queue_budget < -1
               or not (math.isfinite(a.shed_fraction) and 0 <= a.shed_fraction <= 1) for a in msg.admission)


def scaling_problem(msg: pb.ScalingPlan, spec: dict[str, tuple[int, int]],
                    in_force: dict[str, tuple[int, int]]) -> bool:
    """`spec`: pool → (min, max replicas); `in_force`: pool → (max_num_seqs, max_num_batched_tokens)."""
    names = [p.pool for p in msg.pools]
    if len(names) != len(set(names)) or any(n not in spec for n in names):
        return True
    for p in msg.pools:
        lo, hi = spec[p.pool]
        if not (lo <= p.replicas <= hi and 0 <= p.warm_standby <= hi):
            return True
        if p.max_num_seqs and not MAX_NUM_SEQS_RANGE[0] <= p.max_num_seqs <= MAX_NUM_SEQS_RANGE[1]:
            return True
        if p.max_num_batched_tokens and not (MAX_NUM_BATCHED_TOKENS_RANGE[0] <= p.max_num_batched_tokens
                                             <= MAX_NUM_BATCHED_TOKENS_RANGE[1]):
            return True
        if (p.max_num_batched_tokens or in_force[p.pool][1]) < (p.max_num_seqs or in_force[p.pool][0]):
            return True
    return False


# =========================================================================== generated requests

int32 = st.integers(-(2**31), 2**31 - 1)
odd_floats = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, -0.0, 1.0, 0.5, 1e-300]),
                       st.floats(0, 10))
long_text = st.integers(MAX_NAME - 2, 5000).map(lambda n: "p" * n)
words = st.one_of(st.text(max_size=12), long_text, st.sampled_from(["", " ", "\x00", "é", "\x1b[2J"]))


def names(known: tuple[str, ...]):
    return st.one_of(st.sampled_from(known), st.sampled_from(known), words)


@st.composite
def metas(draw) -> tuple[dict | None, int]:
    """(CommandMeta fields with a placeholder generation, offset from the applied generation) or (None, 0)."""
    if draw(st.integers(0, 19)) == 0:
        return None, 0
    offset = draw(st.sampled_from([1, 1, 1, 1, 2, 0, -1, -5]))  # mostly the next generation: the body is checked
    valid = draw(st.one_of(st.floats(3600, 1e7).map(lambda d: ("future", d)),
                           st.floats(0, 1e7).map(lambda d: ("past", d)),
                           st.sampled_from([("abs", math.nan), ("abs", math.inf), ("abs", -math.inf), ("abs", 0.0)])))
    did = draw(st.one_of(st.text(min_size=1, max_size=20), st.just(""), st.integers(MAX_ID - 1, 3000).map(
        lambda n: "d" * n)))
    issuer = draw(st.one_of(st.just("fuzz"), st.integers(MAX_ID - 1, 3000).map(lambda n: "i" * n)))
    return {"decision_id": did, "issuer": issuer, "valid": valid}, offset


def build_meta(fields: dict | None, offset: int, applied: int, now: float) -> pb.CommandMeta | None:
    if fields is None:
        return None
    kind, v = fields["valid"]
    until = now + v if kind == "future" else now - v if kind == "past" else v
    return pb.CommandMeta(decision_id=fields["decision_id"], generation=max(0, applied + offset),
                          valid_until_unix_s=until, issuer=fields["issuer"])


def pool_routings(known: tuple[str, ...]):
    return st.lists(st.builds(
        lambda pool, w, cap, weights: pb.PoolRouting(pool=pool, traffic_weight=w, inflight_cap=cap,
                                                     weights=weights),
        names(known), odd_floats, st.one_of(st.integers(0, 64), int32),
        st.one_of(st.none(), st.builds(pb.ScorerWeights, prefix=odd_floats, queue=odd_floats, kv_usage=odd_floats))),
        max_size=4)


admissions = st.lists(st.builds(
    pb.ClassAdmission, priority_class=names(PRIORITY_CLASSES), rate_limit_rps=odd_floats,
    queue_budget=st.one_of(st.integers(-2, 16), int32), shed_fraction=odd_floats), max_size=4)


def pool_scalings(known: tuple[str, ...]):
    small = st.integers(-1, 8)
    return st.lists(st.builds(pb.PoolScaling, pool=names(known), replicas=st.one_of(small, int32),
                              warm_standby=st.one_of(small, int32),
                              max_num_seqs=st.one_of(st.just(0), st.integers(0, 2048), int32),
                              max_num_batched_tokens=st.one_of(st.just(0), st.integers(0, 300_000), int32)),
                    max_size=4)


# =========================================================================== the servers


@pytest.fixture(scope="module", autouse=True)
def _hypothesis_home(tmp_path_factory):
    """Hypothesis caches (its Unicode tables) in a tmp dir, not in the checkout."""
    set_hypothesis_home_dir(tmp_path_factory.mktemp("hypothesis"))
    yield
    set_hypothesis_home_dir(None)


@pytest.fixture(scope="module")
def picker() -> Iterator[PickerThread]:
    with idle_engines(3) as addr, PickerThread(PickerConfig(
            groups={"chat": list(PICKER_POOLS)}, endpoints={"a100": addr[:2], "h100": addr[2:]},
            defaults=Settings({p: PoolSettings() for p in PICKER_POOLS}), scrape_interval_s=3600.0,
            hold_timeout_s=1.0)) as t:
        yield t


class SimRig:
    """The simulator's control plane over a real Fleet (not advanced) on a virtual clock, served on loopback."""

    def __init__(self) -> None:
        self.clock = VirtualClock(T0)
        scenario = load_scenario(SCENARIO)
        self.fleet = Fleet(scenario, seed=0, record_requests=False)
        self.plane = ControlPlane(self.fleet, threading.RLock(), self.clock)
        self.router_ep, self.autoscaler_ep = serve_control(self.plane, "127.0.0.1")
        self.spec = {p.name: (p.min_replicas, p.max_replicas) for p in scenario.pools}

    def stop(self) -> None:
        self.router_ep.stop(0)
        self.autoscaler_ep.stop(0)


@pytest.fixture(scope="module")
def sim() -> Iterator[SimRig]:
    r = SimRig()
    yield r
    r.stop()


def _channel(address: str) -> grpc.Channel:
    return grpc.insecure_channel(address, options=[("grpc.max_send_message_length", 64 << 20)])


def _raw(ch: grpc.Channel, method: str):
    """A callable sending bytes as they are to `method` (no serialisation), answering the response's bytes."""
    return ch.unary_unary(method, request_serializer=None, response_deserializer=None)


def _code(fn, *args) -> tuple[grpc.StatusCode, Any, str]:
    try:
        return grpc.StatusCode.OK, fn(*args, timeout=RPC_TIMEOUT_S), ""
    except grpc.RpcError as exc:
        return exc.code(), None, exc.details() or ""


def _check_ack(ack: pb.Ack, problem: bool, fresh: bool) -> None:
    assert ack.status in ACK, ack
    assert len(ack.message) <= MAX_ANSWER_CHARS, ack.message[:200]
    if ack.status == pb.ACK_STATUS_INVALID and not ack.message.startswith("rejected by the fleet"):
        assert FIELD.match(ack.message), ack.message
    if fresh:  # a generation above the applied one: only the content decides
        assert (ack.status == pb.ACK_STATUS_INVALID) == problem or (
            problem is False and ack.message.startswith("rejected by the fleet")), (problem, ack)


# =========================================================================== RouterControl (picker and simulator)


def _fuzz_routing(address: str, known: tuple[str, ...], now) -> None:
    with _channel(address) as ch:
        stub = pb_grpc.RouterControlStub(ch)
        applied = stub.GetRoutingPolicy(pb.GetRoutingPolicyRequest(), timeout=RPC_TIMEOUT_S).meta.generation

        @fuzz(COMMANDS)
        @given(meta=metas(), pools=pool_routings(known), admission=admissions)
        def case(meta, pools, admission):
            nonlocal applied
            fields, offset = meta
            m = build_meta(fields, offset, applied, now())
            msg = pb.RoutingPolicy(pools=pools, admission=admission)
            if m is not None:
                msg.meta.CopyFrom(m)
            before = stub.GetRoutingPolicy(pb.GetRoutingPolicyRequest(), timeout=RPC_TIMEOUT_S)
            code, ack, details = _code(stub.ApplyRoutingPolicy, msg)
            assert code == grpc.StatusCode.OK, (code, details)
            fresh = m is not None and m.generation > applied
            problem = (m is None or m.generation < 1 or meta_problem(m, now())) or routing_problem(msg, known)
            _check_ack(ack, problem, fresh or m is None)
            after = stub.GetRoutingPolicy(pb.GetRoutingPolicyRequest(), timeout=RPC_TIMEOUT_S)
            if ack.status == pb.ACK_STATUS_APPLIED:
                assert m is not None
                assert after.meta.generation == m.generation and after.meta.decision_id == m.decision_id
                applied = m.generation
            else:
                assert after.SerializeToString(deterministic=True) == before.SerializeToString(deterministic=True)

        case()


def test_picker_router_control_commands(picker):
    _fuzz_routing(picker.running.control_address, PICKER_POOLS, time.time)


def test_sim_router_control_commands(sim):
    _fuzz_routing(sim.router_ep.address, SIM_POOLS, sim.clock.now_s)


def test_sim_autoscaler_control_commands(sim):
    with _channel(sim.autoscaler_ep.address) as ch:
        stub = pb_grpc.AutoscalerControlStub(ch)
        applied = stub.GetFleetState(pb.GetFleetStateRequest(), timeout=RPC_TIMEOUT_S).applied_generation

        @fuzz(COMMANDS)
        @given(meta=metas(), pools=pool_scalings(SIM_POOLS))
        def case(meta, pools):
            nonlocal applied
            fields, offset = meta
            now = sim.clock.now_s()
            m = build_meta(fields, offset, applied, now)
            msg = pb.ScalingPlan(pools=pools)
            if m is not None:
                msg.meta.CopyFrom(m)
            before = stub.GetFleetState(pb.GetFleetStateRequest(), timeout=RPC_TIMEOUT_S)
            in_force = {p.pool: (p.max_num_seqs, p.max_num_batched_tokens) for p in before.pools}
            code, ack, details = _code(stub.ApplyScalingPlan, msg)
            assert code == grpc.StatusCode.OK, (code, details)
            fresh = m is not None and m.generation > applied
            problem = m is None or meta_problem(m, now) or scaling_problem(msg, sim.spec, in_force)
            _check_ack(ack, problem, fresh or m is None)
            after = stub.GetFleetState(pb.GetFleetStateRequest(), timeout=RPC_TIMEOUT_S)
            if ack.status == pb.ACK_STATUS_APPLIED:
                assert m is not None
                assert after.applied_generation == m.generation
                applied = m.generation
                for p in msg.pools:
                    assert next(s for s in after.pools if s.pool == p.pool).target_replicas == p.replicas
            else:
                assert after.SerializeToString(deterministic=True) == before.SerializeToString(deterministic=True)

        case()


# =========================================================================== bytes that are not messages


def _state(ch: grpc.Channel, kind: str) -> bytes:
    if kind == "router":
        return pb_grpc.RouterControlStub(ch).GetRoutingPolicy(pb.GetRoutingPolicyRequest(),
                                                              timeout=RPC_TIMEOUT_S).SerializeToString(
            deterministic=True)
    return pb_grpc.AutoscalerControlStub(ch).GetFleetState(pb.GetFleetStateRequest(),
                                                           timeout=RPC_TIMEOUT_S).SerializeToString(deterministic=True)


# bytes that often break a parser: truncated varints and lengths, wrong wire types, invalid UTF-8 in a string field
RAW_BYTES = st.one_of(st.binary(max_size=64), st.sampled_from([
    b"\x0a\x05\xff\xfe\xfd\xfc\xfb",  # field 1 (meta) holding a string field with invalid UTF-8 → DecodeError
    b"\x0a\x03\x0a\x01\xff", b"\x12\x02\x0a\x80", b"\x08", b"\x0a\xff\xff\xff\xff\x0f", b"\x0f", b"\x12\x7f",
]))


@pytest.mark.parametrize("server,service,method,kind", [
    ("picker", "RouterControl", "ApplyRoutingPolicy", "router"),
    ("picker", "RouterControl", "GetRoutingPolicy", "router"),
    ("sim", "RouterControl", "ApplyRoutingPolicy", "router"),
    ("sim", "RouterControl", "GetRoutingPolicy", "router"),
    ("sim", "AutoscalerControl", "ApplyScalingPlan", "autoscaler"),
    ("sim", "AutoscalerControl", "GetFleetState", "autoscaler"),
])
def test_undecodable_bytes_are_invalid_argument_and_change_nothing(request, server, service, method, kind):
    rig = request.getfixturevalue(server)
    if server == "picker":
        address = rig.running.control_address
    else:
        address = rig.router_ep.address if kind == "router" else rig.autoscaler_ep.address
    with _channel(address) as ch:
        call = _raw(ch, f"/governor.v1.{service}/{method}")
        seen = {"invalid": 0}

        @fuzz(RAW)
        @given(data=RAW_BYTES)
        def case(data):
            before = _state(ch, kind)
            code, _resp, details = _code(call, data)
            assert code in (grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT), (code, details)
            if code == grpc.StatusCode.INVALID_ARGUMENT:
                seen["invalid"] += 1
                assert details.startswith(f"request: the bytes sent to /governor.v1.{service}/{method} are not")
                assert len(details) <= MAX_ANSWER_CHARS
                assert _state(ch, kind) == before

        case()
        assert seen["invalid"] > 0  # the fixed samples include bytes that do not parse


@pytest.mark.parametrize("server", ["picker", "sim"])
def test_an_oversized_command_is_refused_by_size_and_changes_nothing(request, server):
    rig = request.getfixturevalue(server)
    address = rig.running.control_address if server == "picker" else rig.router_ep.address
    with _channel(address) as ch:
        before = _state(ch, "router")
        msg = pb.RoutingPolicy(meta=pb.CommandMeta(decision_id="big", generation=10**9, valid_until_unix_s=4e9),
                               pools=[pb.PoolRouting(pool="x" * 1000) for _ in range(CONTROL_MAX_MESSAGE_BYTES // 900)])
        code, _, details = _code(pb_grpc.RouterControlStub(ch).ApplyRoutingPolicy, msg)
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, (code, details)
        assert _state(ch, "router") == before
        # just under the limit: parsed, refused by count (more entries than pools), the message short
        msg = pb.RoutingPolicy(meta=msg.meta, pools=[pb.PoolRouting(pool="x" * 1000) for _ in range(50)])
        code, ack, _ = _code(pb_grpc.RouterControlStub(ch).ApplyRoutingPolicy, msg)
        assert code == grpc.StatusCode.OK and ack.status == pb.ACK_STATUS_INVALID
        assert ack.message.startswith("pools: 50 entries") and len(ack.message) < 300
        assert _state(ch, "router") == before


# =========================================================================== ext_proc


def _headers(pairs: list[tuple[str, bytes]], eos: bool) -> ep_pb.ProcessingRequest:
    return ep_pb.ProcessingRequest(request_headers=ep_pb.HttpHeaders(
        headers=base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(key=k, raw_value=v) for k, v in pairs]),
        end_of_stream=eos))


header_pairs = st.lists(st.tuples(
    st.sampled_from(["x-governor-class", "x-governor-route-group", ":path", "content-type", "X-Governor-Class"]),
    st.one_of(st.sampled_from([b"critical", b"standard", b"sheddable", b"chat", b"", b"CRITICAL ", b"\xff\xfe"]),
              st.binary(max_size=40), st.integers(200, 5000).map(lambda n: b"g" * n))), max_size=4)
bodies = st.one_of(
    st.binary(max_size=200),
    st.sampled_from([b'{"prompt": "hello"}', b'{"messages": [{"role": "user", "content": "hi"}]}', b"[]", b"null",
                     b'{"prompt": ["a", 1]}', b'{"messages": [1, {"role": 2}]}', b'{"prompt": "\\ud800"}',
                     b"[" * 100_000 + b"]" * 100_000, b'{"prompt": ' + b"[" * 50_000]),
    st.text(max_size=2000).map(lambda t: json.dumps({"prompt": t}).encode()))
messages = st.one_of(
    st.builds(_headers, header_pairs, st.booleans()),
    st.builds(lambda b, eos: ep_pb.ProcessingRequest(request_body=ep_pb.HttpBody(body=b, end_of_stream=eos)),
              bodies, st.booleans()),
    st.just(ep_pb.ProcessingRequest(request_trailers=ep_pb.HttpTrailers())),
    st.just(ep_pb.ProcessingRequest(response_headers=ep_pb.HttpHeaders())),
    st.builds(lambda b: ep_pb.ProcessingRequest(response_body=ep_pb.HttpBody(body=b)), st.binary(max_size=50)),
    st.just(ep_pb.ProcessingRequest(response_trailers=ep_pb.HttpTrailers())),
    st.just(ep_pb.ProcessingRequest()),  # sets nothing
)


def _slots_taken(picker: PickerThread) -> int:
    assert picker.running is not None
    p = picker.running.svc.picker
    return picker.call(lambda: sum(e.inflight for es in p.endpoints.values() for e in es)
                       + sum(p.held_count(c) for c in PRIORITY_CLASSES))


def _wait_free(picker: PickerThread, deadline_s: float = 5.0) -> int:
    """Slots still taken once the stream's clean-up had up to `deadline_s` to run (it runs on the picker's loop)."""
    end = time.monotonic() + deadline_s
    n = _slots_taken(picker)
    while n and time.monotonic() < end:
        time.sleep(0.005)  # polling a condition with a deadline, not waiting a fixed time
        n = _slots_taken(picker)
    return n


def test_ext_proc_streams_of_malformed_requests(picker):
    kinds = {"request_headers", "request_body", "request_trailers", "response_headers", "response_body",
             "response_trailers"}
    with _channel(picker.running.extproc_address) as ch:
        stub = ep_grpc.ExternalProcessorStub(ch)
        assert _slots_taken(picker) == 0

        @fuzz(STREAMS)
        @given(stream=st.lists(messages, min_size=1, max_size=6))
        def case(stream):
            try:
                responses = list(stub.Process(iter(stream), timeout=RPC_TIMEOUT_S))
                code, details = grpc.StatusCode.OK, ""
            except grpc.RpcError as exc:
                responses, code, details = [], exc.code(), exc.details() or ""
            empty = any(m.WhichOneof("request") is None for m in stream)
            if empty:  # answered up to the message that sets nothing, then INVALID_ARGUMENT naming the field
                assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("request: "), (code, details)
            else:
                assert code == grpc.StatusCode.OK, (code, details)
                assert len(responses) == len(stream)
                decided = False
                for req, resp in zip(stream, responses, strict=True):
                    kind = req.WhichOneof("request")
                    answer = resp.WhichOneof("response")
                    if answer == "immediate_response":  # a decision (400 unknown group, 503 no endpoint)
                        assert not decided and kind in ("request_headers", "request_body"), (kind, resp)
                        assert resp.immediate_response.status.code in (400, 429, 503)
                        decided = True
                    else:
                        assert answer == kind, (kind, answer)
                        if resp.HasField("dynamic_metadata") and resp.dynamic_metadata.fields:
                            assert not decided
                            decided = True
                    assert kind in kinds
            assert _wait_free(picker) == 0  # no replica slot left taken by the stream

        case()


def test_servers_stay_up_after_the_fuzzing(picker, sim):
    for address in (picker.running.control_address, sim.router_ep.address, sim.autoscaler_ep.address):
        with _channel(address) as ch:
            # the stubs declare no RPCs on HealthStub
            resp = health_pb2_grpc.HealthStub(ch).Check(  # type: ignore[attr-defined]
                health_pb2.HealthCheckRequest(), timeout=RPC_TIMEOUT_S)
            assert resp.status == health_pb2.HealthCheckResponse.SERVING
    with _channel(picker.running.extproc_address) as ch:
        out = list(ep_grpc.ExternalProcessorStub(ch).Process(iter([
            _headers([("x-governor-class", b"standard")], False),
            ep_pb.ProcessingRequest(request_body=ep_pb.HttpBody(body=b'{"prompt": "ok"}', end_of_stream=True))]),
            timeout=RPC_TIMEOUT_S))
    dest = [h.header.key for h in out[1].request_body.response.header_mutation.set_headers]
    assert "x-gateway-destination-endpoint" in dest
