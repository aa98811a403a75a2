"""Auth (issue 21): named tokens with roles, mTLS identities, the audit trail's authenticated caller, and the
listeners that refuse to go beyond loopback without authentication (API and KEDA scaler)."""

from __future__ import annotations

import shutil

import grpc
import pytest

from controller.actuation.keda import KedaScalerServer
from controller.api.server import PolicyServer
from controller.api.store import StateStore
from controller.clock import VirtualClock
from controller.config import ConfigError, parse_settings
from controller.gen.externalscaler import externalscaler_pb2, externalscaler_pb2_grpc
from controller.gen.governor.v1 import policy_pb2, policy_pb2_grpc
from controller.rpc.transport import (
    Authenticator,
    ClientTls,
    InsecureListenError,
    TlsConfig,
    load_tokens_file,
    make_channel,
)
from tests.fakes.act_daemon import FakeDaemon
from tests.fixtures.tls import make_pki
from tests.reliability.api_harness import T0, code_of, override, running_api

WRITER = "writer-token-aaaaaaaaaaaaaaaa"
READER = "reader-token-bbbbbbbbbbbbbbbb"


@pytest.fixture
def tokens(tmp_path):
    path = tmp_path / "tokens.yaml"
    path.write_text(f"tokens:\n  - {{name: alice, token: {WRITER}, role: write}}\n"
                    f"  - {{name: grafana, token: {READER}, role: read}}\n")
    return tuple(load_tokens_file(str(path)))


@pytest.fixture
def pki(tmp_path):
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    return make_pki(tmp_path / "pki")


def _md(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


def test_roles_and_the_authenticated_caller_in_the_audit_trail(tmp_path, tokens):
    with running_api(tmp_path, token=None, tokens=tokens) as api:
        # read role: reads yes, writes PERMISSION_DENIED and nothing changes
        assert api.stub.GetStatus(policy_pb2.GetStatusRequest(), metadata=_md(READER), timeout=5).generation == 7
        before = api.snapshot()
        for rpc, req in ((api.stub.SetOverride, override()),
                         (api.stub.SetMode, policy_pb2.SetModeRequest(mode=policy_pb2.MODE_PAUSED, author="x")),
                         (api.stub.DeleteOverride, policy_pb2.DeleteOverrideRequest(id="ov-000001", author="x"))):
            code, details = code_of(rpc, req, metadata=_md(READER), timeout=5)
            assert code == grpc.StatusCode.PERMISSION_DENIED
            assert details.startswith("token:grafana has the read role")
        assert api.snapshot() == before
        # write role: the declared author is kept, the token's name is recorded as the caller
        api.stub.SetOverride(override(author="bob"), metadata=_md(WRITER), timeout=5)
        api.stub.SetMode(policy_pb2.SetModeRequest(mode=policy_pb2.MODE_SHADOW, author="bob", reason="drill"),
                         metadata=_md(WRITER), timeout=5)
        entries = api.stub.ListAudit(policy_pb2.ListAuditRequest(), metadata=_md(READER), timeout=5).entries
        assert [(e.action, e.author, e.caller) for e in entries] == [("mode.set", "bob", "token:alice"),
                                                                      ("override.set", "bob", "token:alice")]


@pytest.mark.parametrize("metadata", [(), _md("wrong-token-cccccccccccccccc"), _md(""), (("authorization", WRITER),)],
                         ids=["none", "wrong", "empty", "no scheme"])
def test_missing_or_wrong_credentials_are_unauthenticated_on_every_rpc(tmp_path, tokens, metadata):
    with running_api(tmp_path, token=None, tokens=tokens) as api:
        before = api.snapshot()
        calls = [(api.stub.GetStatus, policy_pb2.GetStatusRequest()),
                 (api.stub.ListDecisions, policy_pb2.ListDecisionsRequest()),
                 (api.stub.ExplainDecision, policy_pb2.ExplainDecisionRequest(decision_id="d-1")),
                 (api.stub.SetOverride, override()), (api.stub.ListOverrides, policy_pb2.ListOverridesRequest()),
                 (api.stub.DeleteOverride, policy_pb2.DeleteOverrideRequest(id="ov-000001", author="a")),
                 (api.stub.SetMode, policy_pb2.SetModeRequest(mode=policy_pb2.MODE_PAUSED, author="a")),
                 (api.stub.ListAudit, policy_pb2.ListAuditRequest())]
        for rpc, req in calls:
            code, details = code_of(rpc, req, metadata=metadata, timeout=5)
            assert code == grpc.StatusCode.UNAUTHENTICATED, (rpc, code)
            assert WRITER not in details and READER not in details
        assert api.snapshot() == before


def _mtls_api(tmp_path, pki, **kw):
    store = StateStore(tmp_path / "m.db")
    tls = TlsConfig(str(pki.server_cert), str(pki.server_key), client_ca_file=str(pki.ca))
    server = PolicyServer(FakeDaemon(("pool-a",)), store, "127.0.0.1:0", token=None, tls=tls,
                          clock=VirtualClock(T0), **kw)
    return store, server, server.start()


def test_mtls_identity_from_the_certificate_goes_into_the_audit_trail(tmp_path, pki):
    store, server, port = _mtls_api(tmp_path, pki)
    client = ClientTls(ca_file=str(pki.ca), cert_file=str(pki.client_cert), key_file=str(pki.client_key))
    try:
        with make_channel(f"127.0.0.1:{port}", client) as ch:
            stub = policy_pb2_grpc.PolicyServiceStub(ch)
            stub.SetOverride(override(author="declared-bob"), timeout=5)
            (entry,) = stub.ListAudit(policy_pb2.ListAuditRequest(), timeout=5).entries
            assert (entry.author, entry.caller) == ("declared-bob", "cert:governor test client")
            # a stray token (e.g. $GOVERNOR_API_TOKEN) does not hide the certificate where no tokens are configured
            assert stub.GetStatus(policy_pb2.GetStatusRequest(), metadata=_md("stray-token-dddddddddddd"),
                                  timeout=5).generation == 7
        # a TLS client without a certificate does not get through the handshake
        with make_channel(f"127.0.0.1:{port}", ClientTls(ca_file=str(pki.ca))) as ch:
            code, _ = code_of(policy_pb2_grpc.PolicyServiceStub(ch).GetStatus, policy_pb2.GetStatusRequest(),
                              timeout=5)
            assert code == grpc.StatusCode.UNAVAILABLE
    finally:
        server.stop(0)
        store.close()


def test_a_certificate_mapped_to_the_read_role_cannot_write(tmp_path, pki):
    store, server, port = _mtls_api(tmp_path, pki, cert_roles={"governor test client": "read"})
    client = ClientTls(ca_file=str(pki.ca), cert_file=str(pki.client_cert), key_file=str(pki.client_key))
    try:
        with make_channel(f"127.0.0.1:{port}", client) as ch:
            stub = policy_pb2_grpc.PolicyServiceStub(ch)
            assert stub.GetStatus(policy_pb2.GetStatusRequest(), timeout=5).generation == 7
            code, details = code_of(stub.SetMode, policy_pb2.SetModeRequest(mode=policy_pb2.MODE_PAUSED, author="a"),
                                    timeout=5)
            assert code == grpc.StatusCode.PERMISSION_DENIED
            assert details.startswith("cert:governor test client has the read role")
        assert store.list_audit() == []
    finally:
        server.stop(0)
        store.close()


@pytest.mark.parametrize("listen", ["0.0.0.0:0", "[::]:0", "10.1.2.3:50051", "governor.example:1"])
def test_non_loopback_listeners_need_authentication(tmp_path, listen, tokens):
    store = StateStore(tmp_path / "s.db")
    with pytest.raises(InsecureListenError, match="refusing to listen .* for the API without authentication"):
        PolicyServer(FakeDaemon(), store, listen, token=None, clock=VirtualClock(T0))
    with pytest.raises(InsecureListenError, match="for the KEDA scaler without authentication"):
        KedaScalerServer(dict, listen)
    with pytest.raises(InsecureListenError):
        KedaScalerServer(dict, listen, tls=TlsConfig("c", "k"))  # TLS alone authenticates nobody
    # named tokens or mTLS: allowed (constructed only: tests stay on loopback)
    PolicyServer(FakeDaemon(), store, listen, token=None, tokens=tokens, clock=VirtualClock(T0))
    KedaScalerServer(dict, listen, authenticator=Authenticator(tokens))
    KedaScalerServer(dict, listen, tls=TlsConfig("c", "k", client_ca_file="ca"))
    store.close()


def test_config_refuses_a_keda_scaler_beyond_loopback_without_auth():
    base = ("pools: [{name: a, model: llama-3.1-8b, sku: a100-80gb, usd_per_gpu_hour: 2}]\n"
            "actuators: {keda: {enabled: true, listen: '0.0.0.0:50052'%s}}\n")
    with pytest.raises(ConfigError, match=r"actuators\.keda\.listen: 0\.0\.0\.0:50052 is not a loopback address"):
        parse_settings(base % "")
    parse_settings(base % ", tls: {cert: c, key: k, client_ca: ca}")  # KEDA's mTLS: accepted


def _keda(tmp_path, **kw):
    server = KedaScalerServer(lambda: {"pool-a": 3}, "127.0.0.1:0", **kw)
    return server, server.start()


def _ref(pool="pool-a"):
    return externalscaler_pb2.ScaledObjectRef(name="so", namespace="ns", scalerMetadata={"pool": pool})


def test_keda_scaler_with_a_token(tmp_path, tokens):
    server, port = _keda(tmp_path, authenticator=Authenticator(tokens))
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = externalscaler_pb2_grpc.ExternalScalerStub(ch)
            code, _ = code_of(stub.IsActive, _ref(), timeout=5)
            assert code == grpc.StatusCode.UNAUTHENTICATED
            code, _ = code_of(stub.IsActive, _ref(), metadata=_md("nope-nope-nope-nope"), timeout=5)
            assert code == grpc.StatusCode.UNAUTHENTICATED
            assert stub.IsActive(_ref(), metadata=_md(READER), timeout=5).result is True  # reading needs no write role
            stream = stub.StreamIsActive(_ref(), timeout=5)
            with pytest.raises(grpc.RpcError) as info:
                next(stream)
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        server.stop(0)


def test_keda_scaler_over_mtls_as_keda_connects(tmp_path, pki):
    """KEDA's TriggerAuthentication gives caCert, tlsClientCert and tlsClientKey: that is what this client has."""
    tls = TlsConfig(str(pki.server_cert), str(pki.server_key), client_ca_file=str(pki.ca))
    server, port = _keda(tmp_path, tls=tls)
    try:
        keda = ClientTls(ca_file=str(pki.ca), cert_file=str(pki.client_cert), key_file=str(pki.client_key))
        with make_channel(f"127.0.0.1:{port}", keda) as ch:
            stub = externalscaler_pb2_grpc.ExternalScalerStub(ch)
            resp = stub.GetMetrics(externalscaler_pb2.GetMetricsRequest(scaledObjectRef=_ref(),
                                                                        metricName="governor-replicas-pool-a"),
                                   timeout=5)
            assert resp.metricValues[0].metricValue == 3
        with make_channel(f"127.0.0.1:{port}", ClientTls(ca_file=str(pki.ca))) as ch:  # no client certificate
            code, _ = code_of(externalscaler_pb2_grpc.ExternalScalerStub(ch).IsActive, _ref(), timeout=5)
            assert code == grpc.StatusCode.UNAVAILABLE
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:  # plaintext to a TLS port
            code, _ = code_of(externalscaler_pb2_grpc.ExternalScalerStub(ch).IsActive, _ref(), timeout=5)
            assert code == grpc.StatusCode.UNAVAILABLE
    finally:
        server.stop(0)


def test_a_tokens_file_never_echoes_a_token(tmp_path):
    path = tmp_path / "t.yaml"
    secret = "very-secret-token-0123456789"
    for body in (f"tokens:\n  - {{name: a, token: {secret}, role: root}}\n",
                 f"tokens:\n  - {{name: a, token: {secret}}}\n  - {{name: b, token: {secret}}}\n",
                 f"tokens:\n  - {{name: a, token: {secret}, extra: 1}}\n", f"tokens: {secret}\n"):
        path.write_text(body)
        with pytest.raises(ValueError) as info:
            load_tokens_file(str(path))
        assert secret not in str(info.value)
        assert str(info.value).startswith("api.tokens_file:")
