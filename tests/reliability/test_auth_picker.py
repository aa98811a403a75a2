"""The picker's control port (RouterControl): no listening beyond loopback without auth; a missing or wrong token
refused; mTLS with a CA the test makes (tests/fixtures/tls.py); the health service open for probes; --follow
carrying the follower's own credentials. Real gRPC on loopback.
"""

from __future__ import annotations

import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from controller.cli import build_parser
from controller.dataplane.cli import config_from_args
from controller.dataplane.policy_store import PoolSettings, Settings
from controller.dataplane.server import PickerConfig, PickerService, PickerThread
from controller.gen.governor.v1 import control_pb2 as pb
from controller.gen.governor.v1 import control_pb2_grpc as pb_grpc
from controller.rpc.transport import ClientTls, InsecureListenError, TlsConfig, bearer_metadata, make_channel
from tests.fixtures.tls import make_pki

TOKEN = "picker-test-token-0123456789"


def _cfg(**kw) -> PickerConfig:
    return PickerConfig(groups={"chat": ["a"]}, defaults=Settings({"a": PoolSettings()}), **kw)


def _policy(gen: int) -> pb.RoutingPolicy:
    return pb.RoutingPolicy(meta=pb.CommandMeta(decision_id=f"auth-{gen}", generation=gen,
                                                valid_until_unix_s=time.time() + 600, issuer="tests"),
                            pools=[pb.PoolRouting(pool="a", traffic_weight=2.0)])


def _svc(t: PickerThread) -> PickerService:
    assert t.running is not None
    return t.running.svc


def _code(fn, *args, **kw) -> grpc.StatusCode:
    try:
        fn(*args, timeout=5, **kw)
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


@pytest.fixture
def running():
    started: list[PickerThread] = []

    def start(cfg: PickerConfig) -> PickerThread:
        t = PickerThread(cfg)
        started.append(t)
        t.start()
        return t

    yield start
    for t in reversed(started):
        t.stop()


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "picker.example"])
def test_no_control_port_beyond_loopback_without_auth(host, tmp_path):
    with pytest.raises(InsecureListenError, match="--control-token-file, or mTLS"):
        _cfg(host=host)
    with pytest.raises(InsecureListenError):  # TLS without client certificates authenticates nobody
        _cfg(host=host, control_tls=TlsConfig("c", "k"))
    _cfg(host=host, control_token=TOKEN)  # either one is enough (nothing is bound here)
    _cfg(host=host, control_tls=TlsConfig("c", "k", "ca"))
    _cfg(host="127.0.0.1")
    _cfg(host="::1")


def test_the_cli_refuses_it_too_and_reads_the_token_from_a_file(tmp_path, monkeypatch):
    parser = build_parser()
    monkeypatch.delenv("GOVERNOR_PICKER_TOKEN", raising=False)
    with pytest.raises(InsecureListenError, match="refusing to serve RouterControl on 0.0.0.0:9003"):
        config_from_args(parser.parse_args(["picker", "--pool", "a=127.0.0.1:8000", "--host", "0.0.0.0"]))
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    cfg = config_from_args(parser.parse_args(["picker", "--pool", "a=127.0.0.1:8000", "--host", "0.0.0.0",
                                              "--control-token-file", str(token_file)]))
    assert cfg.control_token == TOKEN
    monkeypatch.setenv("GOVERNOR_PICKER_TOKEN", TOKEN)
    assert config_from_args(parser.parse_args(["picker", "--pool", "a=127.0.0.1:8000", "--host", "0.0.0.0"])
                            ).control_token == TOKEN
    (tmp_path / "empty").write_text("\n")
    for flags, needle in [(["--control-token-file", str(tmp_path / "missing")], "cannot read a token"),
                          (["--control-token-file", str(tmp_path / "empty")], "cannot read a token"),
                          (["--tls-cert", "x"], "--tls-cert and --tls-key: give both"),
                          (["--tls-client-ca", "x"], "--tls-client-ca: mTLS needs")]:
        with pytest.raises(ValueError, match=needle):
            config_from_args(parser.parse_args(["picker", "--pool", "a=127.0.0.1:8000", *flags]))


def test_a_missing_or_wrong_token_is_refused_and_changes_nothing(running):
    t = running(_cfg(control_token=TOKEN))
    with grpc.insecure_channel(t.running.control_address) as ch:
        stub = pb_grpc.RouterControlStub(ch)
        for metadata in (None, bearer_metadata("wrong"), (("authorization", TOKEN),), bearer_metadata(TOKEN + "x")):
            assert _code(stub.ApplyRoutingPolicy, _policy(1), metadata=metadata) == grpc.StatusCode.UNAUTHENTICATED
            assert _code(stub.GetRoutingPolicy, pb.GetRoutingPolicyRequest(),
                         metadata=metadata) == grpc.StatusCode.UNAUTHENTICATED
        assert t.call(lambda: _svc(t).store.generation) == 0  # nothing a refused call sent was applied
        # undecodable bytes without a token: refused for the token first (nothing is parsed for a stranger)
        raw: grpc.UnaryUnaryMultiCallable = ch.unary_unary("/governor.v1.RouterControl/ApplyRoutingPolicy")
        assert _code(raw, b"\x0a\x05\xff\xfe\xfd\xfc\xfb") == grpc.StatusCode.UNAUTHENTICATED
        ack = stub.ApplyRoutingPolicy(_policy(1), timeout=5, metadata=bearer_metadata(TOKEN))
        assert ack.status == pb.ACK_STATUS_APPLIED
        got = stub.GetRoutingPolicy(pb.GetRoutingPolicyRequest(), timeout=5, metadata=bearer_metadata(TOKEN))
        assert got.meta.generation == 1
        # probes (kubelet's gRPC probe, grpc_health_probe) carry no token
        health = health_pb2_grpc.HealthStub(ch).Check(  # type: ignore[attr-defined]  # the stubs declare no RPCs
            health_pb2.HealthCheckRequest(), timeout=5)
        assert health.status == health_pb2.HealthCheckResponse.SERVING


def test_mtls_with_a_ca_the_test_makes(running, tmp_path):
    pki = make_pki(tmp_path / "pki")
    t = running(_cfg(control_tls=TlsConfig(str(pki.server_cert), str(pki.server_key), str(pki.ca))))
    address = t.running.control_address
    good = make_channel(address, ClientTls(ca_file=str(pki.ca), cert_file=str(pki.client_cert),
                                           key_file=str(pki.client_key)))
    no_cert = make_channel(address, ClientTls(ca_file=str(pki.ca)))
    plain = grpc.insecure_channel(address)
    try:
        assert _code(pb_grpc.RouterControlStub(no_cert).ApplyRoutingPolicy, _policy(1)) == grpc.StatusCode.UNAVAILABLE
        assert _code(pb_grpc.RouterControlStub(plain).ApplyRoutingPolicy, _policy(1)) == grpc.StatusCode.UNAVAILABLE
        assert t.call(lambda: _svc(t).store.generation) == 0
        ack = pb_grpc.RouterControlStub(good).ApplyRoutingPolicy(_policy(1), timeout=5)
        assert ack.status == pb.ACK_STATUS_APPLIED
    finally:
        for ch in (good, no_cert, plain):
            ch.close()


def _wait_generation(t: PickerThread, gen: int, deadline_s: float = 10.0) -> int:
    end = time.monotonic() + deadline_s
    g = t.call(lambda: _svc(t).store.generation)
    while g != gen and time.monotonic() < end:
        time.sleep(0.02)  # polling a condition with a deadline
        g = t.call(lambda: _svc(t).store.generation)
    return g


def test_follow_carries_the_followers_token_and_certificate(running, tmp_path):
    leader = running(_cfg(control_token=TOKEN))
    with grpc.insecure_channel(leader.running.control_address) as ch:
        ack = pb_grpc.RouterControlStub(ch).ApplyRoutingPolicy(_policy(3), timeout=5,
                                                               metadata=bearer_metadata(TOKEN))
        assert ack.status == pb.ACK_STATUS_APPLIED
    wrong = running(_cfg(follow=leader.running.control_address, control_token="other", scrape_interval_s=0.05))
    right = running(_cfg(follow=leader.running.control_address, control_token=TOKEN, scrape_interval_s=0.05))
    assert _wait_generation(right, 3) == 3
    errors_end = time.monotonic() + 10
    while wrong.call(lambda: _svc(wrong).scrape_errors) < 2 and time.monotonic() < errors_end:
        time.sleep(0.02)  # polling a condition with a deadline
    assert wrong.call(lambda: _svc(wrong).scrape_errors) >= 2
    assert wrong.call(lambda: _svc(wrong).store.generation) == 0  # refused: nothing copied

    pki = make_pki(tmp_path / "pki")
    tls_leader = running(_cfg(control_tls=TlsConfig(str(pki.server_cert), str(pki.server_key), str(pki.ca))))
    good = make_channel(tls_leader.running.control_address,
                        ClientTls(ca_file=str(pki.ca), cert_file=str(pki.client_cert), key_file=str(pki.client_key)))
    try:
        assert pb_grpc.RouterControlStub(good).ApplyRoutingPolicy(_policy(5), timeout=5).status == pb.ACK_STATUS_APPLIED
    finally:
        good.close()
    # the follower presents its own certificate (here the CA's client certificate) and checks the leader's
    port = tls_leader.running.control_address.rsplit(":", 1)[1]
    follower = running(_cfg(follow=f"localhost:{port}", scrape_interval_s=0.05,
                            control_tls=TlsConfig(str(pki.client_cert), str(pki.client_key), str(pki.ca))))
    assert _wait_generation(follower, 5) == 5
