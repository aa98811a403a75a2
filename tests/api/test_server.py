"""PolicyService over real loopback gRPC: auth, validation, overrides, mode, decisions, explain, status, mTLS."""

from __future__ import annotations

import json
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from controller.api.server import PolicyServer, render_explanation
from controller.api.store import StateStore
from controller.clock import VirtualClock
from controller.gen.governor.v1 import policy_pb2 as pb
from controller.gen.governor.v1 import policy_pb2_grpc
from controller.rpc.transport import InsecureListenError, TlsConfig
from controller.types import Mode
from tests.api.conftest import T0, TOKEN
from tests.fakes.act_daemon import FakeDaemon


def _code(call) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as err:
        call()
    return err.value.code(), err.value.details() or ""


# ---------------------------------------------------------------- auth


@pytest.mark.parametrize("metadata", [(), (("authorization", "Bearer wrong"),), (("authorization", TOKEN),),
                                      (("authorization", f"Basic {TOKEN}"),)],
                         ids=["no token", "wrong token", "no scheme", "wrong scheme"])
def test_calls_without_the_right_token_are_unauthenticated(api, metadata):
    for call in (lambda: api.stub.GetStatus(pb.GetStatusRequest(), metadata=metadata, timeout=5),
                 lambda: api.stub.SetMode(pb.SetModeRequest(mode=pb.MODE_PAUSED, author="x"), metadata=metadata,
                                          timeout=5)):
        code, _ = _code(call)
        assert code == grpc.StatusCode.UNAUTHENTICATED
    assert api.daemon.mode_calls == []
    assert api.store.list_audit() == []


def test_health_and_reflection_answer_without_a_token(api):
    health = health_pb2_grpc.HealthStub(api.channel)
    for service in ("", "governor.v1.PolicyService"):
        # the stubs declare no RPCs on HealthStub
        resp = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)  # type: ignore[attr-defined]
        assert resp.status == health_pb2.HealthCheckResponse.SERVING
    refl = reflection_pb2_grpc.ServerReflectionStub(api.channel)
    requests = iter([reflection_pb2.ServerReflectionRequest(list_services="")])
    [resp] = list(refl.ServerReflectionInfo(requests, timeout=5))  # type: ignore[operator]  # stubs: Incomplete
    assert "governor.v1.PolicyService" in {s.name for s in resp.list_services_response.service}


def test_status_with_the_token(api):
    st = api.stub.GetStatus(pb.GetStatusRequest(), metadata=api.auth, timeout=5)
    assert (st.mode, st.profile, st.policy, st.generation, st.last_decision_id) == (
        pb.MODE_ACTIVE, "balanced", "first", 7, "d-00000007")
    assert [(c.name, c.healthy) for c in st.components] == [("telemetry:prometheus", True), ("actuator:router", False)]
    assert [(p.pool, p.replicas_desired, p.replicas_ready, p.telemetry) for p in st.pools] == [
        ("pool-a", 3, 2, "ok"), ("pool-b", 3, 2, "ok")]
    assert st.pools[0].ttft_p95_s == pytest.approx(0.42)
    assert st.version


@pytest.mark.parametrize("listen", ["0.0.0.0:50051", "[::]:50051", ":50051", "governor.example.com:50051",
                                    "10.0.0.5:1"])
def test_refuses_non_loopback_without_a_token(tmp_path, listen):
    store = StateStore(tmp_path / "s.db")
    for token in (None, ""):
        with pytest.raises(InsecureListenError) as err:
            PolicyServer(FakeDaemon(), store, listen, token=token, clock=VirtualClock(T0))
        assert listen in str(err.value)
    # with a token, or with mTLS, it may listen there (not started: tests stay on loopback)
    PolicyServer(FakeDaemon(), store, listen, token="t", clock=VirtualClock(T0))
    mtls = TlsConfig("c", "k", client_ca_file="ca")
    PolicyServer(FakeDaemon(), store, listen, token=None, tls=mtls, clock=VirtualClock(T0))
    with pytest.raises(InsecureListenError):  # TLS without client certificates does not authenticate callers
        PolicyServer(FakeDaemon(), store, listen, token=None, tls=TlsConfig("c", "k"), clock=VirtualClock(T0))
    store.close()


def test_no_token_on_loopback_serves_without_auth(tmp_path):
    store = StateStore(tmp_path / "s.db")
    server = PolicyServer(FakeDaemon(), store, "127.0.0.1:0", token=None, clock=VirtualClock(T0))
    port = server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            assert policy_pb2_grpc.PolicyServiceStub(ch).GetStatus(pb.GetStatusRequest(), timeout=5).generation == 7
    finally:
        server.stop(0)
        store.close()


# ---------------------------------------------------------------- validation


def _ov(**kw) -> pb.Override:
    base: dict[str, Any] = dict(kind=pb.OVERRIDE_KIND_MIN_REPLICAS, pool="pool-a", value=2, ttl_s=600, author="ana")
    base.update(kw)
    return pb.Override(**base)


def _set_override(**kw):
    """The SetOverride call of a validation row: `_ov(**kw)`, sent with the row's metadata."""
    return lambda s, md: s.SetOverride(pb.SetOverrideRequest(override=_ov(**kw)), metadata=md)


ADMISSION = pb.OVERRIDE_KIND_ADMISSION
BAD_REQUESTS = [
    ("kind unspecified", _set_override(kind=pb.OVERRIDE_KIND_UNSPECIFIED), "override.kind"),
    ("no override", lambda s, md: s.SetOverride(pb.SetOverrideRequest(), metadata=md), "override"),
    ("ttl zero", _set_override(ttl_s=0), "override.ttl_s"),
    ("ttl over 7 days", _set_override(ttl_s=8 * 86400), "override.ttl_s"),
    ("missing author", _set_override(author=""), "override.author"),
    ("unknown pool", _set_override(pool="pool-z"), "override.pool"),
    ("bad class", _set_override(kind=ADMISSION, pool="", priority_class="vip", value=0.5), "override.priority_class"),
    ("shed above 1", _set_override(kind=ADMISSION, pool="", priority_class="sheddable", value=1.2), "override.value"),
    ("unknown profile", _set_override(kind=pb.OVERRIDE_KIND_PROFILE, pool="", text="warp"), "override.text"),
    ("negative replicas", _set_override(kind=pb.OVERRIDE_KIND_PIN_REPLICAS, value=-2), "override.value"),
    ("mode unspecified", lambda s, md: s.SetMode(pb.SetModeRequest(author="ana"), metadata=md), "mode"),
    ("mode without author", lambda s, md: s.SetMode(pb.SetModeRequest(mode=pb.MODE_SHADOW), metadata=md), "author"),
    ("delete without id", lambda s, md: s.DeleteOverride(pb.DeleteOverrideRequest(author="ana"), metadata=md), "id"),
    ("delete without author", lambda s, md: s.DeleteOverride(pb.DeleteOverrideRequest(id="ov-000001"), metadata=md),
     "author"),
    ("decisions limit", lambda s, md: s.ListDecisions(pb.ListDecisionsRequest(limit=5000), metadata=md), "limit"),
    ("decisions negative since", lambda s, md: s.ListDecisions(pb.ListDecisionsRequest(since_unix_s=-1), metadata=md),
     "since_unix_s"),
    ("audit limit", lambda s, md: s.ListAudit(pb.ListAuditRequest(limit=-1), metadata=md), "limit"),
    ("explain without id", lambda s, md: s.ExplainDecision(pb.ExplainDecisionRequest(), metadata=md), "decision_id"),
]


@pytest.mark.parametrize("label,call,field", BAD_REQUESTS, ids=[r[0] for r in BAD_REQUESTS])
def test_bad_requests_are_invalid_argument_naming_the_field_and_change_nothing(api, label, call, field):
    api.store.add_override("freeze", ttl_s=600, author="seed", now_s=T0, pool="pool-b")
    audit_before = api.store.list_audit()
    code, details = _code(lambda: call(api.stub, api.auth))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert details.startswith(field + ":"), details
    assert [o.override_id for o in api.store.list_overrides(T0, include_expired=True)] == ["ov-000001"]
    assert api.store.list_audit() == audit_before
    assert api.store.get_mode() is None
    assert api.daemon.mode_calls == [] and api.daemon.override_changes == 0


# ---------------------------------------------------------------- overrides, mode, audit


def test_set_list_expire_and_delete_overrides(api):
    stub, md = api.stub, api.auth
    o = stub.SetOverride(pb.SetOverrideRequest(override=_ov(reason="launch", id="ignored", created_unix_s=1)),
                         metadata=md)
    assert (o.id, o.kind, o.pool, o.value, o.ttl_s) == ("ov-000001", pb.OVERRIDE_KIND_MIN_REPLICAS, "pool-a", 2, 600)
    assert (o.created_unix_s, o.expires_unix_s, o.author, o.reason) == (T0, T0 + 600, "ana", "launch")
    p = stub.SetOverride(pb.SetOverrideRequest(override=pb.Override(
        kind=pb.OVERRIDE_KIND_PROFILE, text="cost", ttl_s=1200, author="bo")), metadata=md)
    assert api.daemon.override_changes == 2
    assert [x.id for x in stub.ListOverrides(pb.ListOverridesRequest(), metadata=md).overrides] == ["ov-000001", p.id]

    api.clock.advance(600)
    assert [x.id for x in stub.ListOverrides(pb.ListOverridesRequest(), metadata=md).overrides] == [p.id]
    assert [x.id for x in stub.ListOverrides(pb.ListOverridesRequest(include_expired=True), metadata=md).overrides] == [
        "ov-000001", p.id]

    assert stub.DeleteOverride(pb.DeleteOverrideRequest(id=p.id, author="cy"), metadata=md).deleted is True
    assert stub.DeleteOverride(pb.DeleteOverrideRequest(id=p.id, author="cy"), metadata=md).deleted is False
    assert api.daemon.override_changes == 3
    assert stub.ListOverrides(pb.ListOverridesRequest(), metadata=md).overrides == []

    audit = stub.ListAudit(pb.ListAuditRequest(), metadata=md).entries
    assert [(e.action, e.author) for e in audit] == [("override.delete", "cy"), ("override.expired", "governor"),
                                                     ("override.set", "bo"), ("override.set", "ana")]
    assert "launch" in audit[-1].detail


def test_repeated_lists_follow_every_write_and_expiry(api):
    """The lists are answered from a cache (api/server.py _ReadCache): a write or an expiry shows in the next call."""
    stub, md = api.stub, api.auth

    def lists():
        return (stub.ListOverrides(pb.ListOverridesRequest(), metadata=md),
                stub.ListOverrides(pb.ListOverridesRequest(include_expired=True), metadata=md),
                stub.ListAudit(pb.ListAuditRequest(limit=5), metadata=md),
                stub.ListDecisions(pb.ListDecisionsRequest(limit=5), metadata=md))

    first = lists()
    assert lists() == first and [len(x.overrides) for x in first[:2]] == [0, 0]
    o = stub.SetOverride(pb.SetOverrideRequest(override=_ov(ttl_s=60)), metadata=md)
    active, everything, audit, decisions = lists()
    assert [x.id for x in active.overrides] == [o.id] == [x.id for x in everything.overrides]
    assert [e.action for e in audit.entries] == ["override.set"] and decisions.decisions == []
    api.store.record_decision({"decision_id": "d-1", "generation": 1, "at_s": T0, "mode": "active"})
    assert [d.decision_id for d in lists()[3].decisions] == ["d-1"]
    api.clock.advance(59.9)
    assert [x.id for x in lists()[0].overrides] == [o.id]
    api.clock.advance(0.1)  # its expiry: off the active list, kept in the full one, audited once
    active, everything, audit, _ = lists()
    assert active.overrides == [] and [x.id for x in everything.overrides] == [o.id]
    assert [e.action for e in audit.entries] == ["override.expired", "override.set"]
    assert [e.action for e in lists()[2].entries] == ["override.expired", "override.set"]


def test_set_mode_calls_the_daemon_and_persists(api):
    resp = api.stub.SetMode(pb.SetModeRequest(mode=pb.MODE_SHADOW, author="ana", reason="canary"), metadata=api.auth)
    assert (resp.previous, resp.mode) == (pb.MODE_ACTIVE, pb.MODE_SHADOW)
    assert api.daemon.mode_calls == [(Mode.SHADOW, "ana", "canary")]
    assert api.store.get_mode() == "shadow"
    [entry] = api.stub.ListAudit(pb.ListAuditRequest(limit=10), metadata=api.auth).entries
    assert (entry.action, entry.author, entry.at_unix_s) == ("mode.set", "ana", T0)


def test_set_mode_refused_by_the_daemon_is_not_persisted(api):
    api.daemon.refuse_modes = (Mode.PAUSED,)
    request = pb.SetModeRequest(mode=pb.MODE_PAUSED, author="ana")
    code, details = _code(lambda: api.stub.SetMode(request, metadata=api.auth))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "not allowed" in details
    assert api.store.get_mode() is None and api.store.list_audit() == []


# ---------------------------------------------------------------- decisions and explain

RECORD = {
    "decision_id": "d-00000042", "generation": 42, "at_s": T0 - 30, "valid_until_s": T0 + 90, "mode": "active",
    "changed": True, "frozen": False, "summary": "scale pool-a 3→5", "outcome": "applied",
    "pools": {"pool-a": {"replicas": 5, "warm_standby": 1}, "pool-b": {"replicas": 2, "warm_standby": 0}},
    "inputs": {"pools": {"pool-a": {"arrival_rps": 41.5, "ttft_p95_s": 1.9, "hit_rate": "missing"}}},
    "policy": "first",
    "reasons": [{"code": "slo_breach", "message": "TTFT p95 1.9 s > SLO 1.0 s", "pool": "pool-a", "data": {}}],
    "guard_adjustments": [{"code": "max_step_up", "message": "capped +4 to +2", "pool": "pool-a", "data": {"cap": 2}}],
    "overrides": [{"override_id": "ov-000003", "kind": "min_replicas", "value": 5.0, "pool": "pool-a",
                   "priority_class": "", "text": "", "author": "ana", "reason": "launch"}],
    "diagnostics": {"predicted_ttft_p95_s": {"pool-a": 0.8}, "binding_constraint": "slo_ttft:critical"},
    "explanation": "d-00000042 [active] scale pool-a 3→5\n  pool-a: 5 replicas (telemetry ok)",
}


def test_list_and_explain_decisions(api):
    api.store.record_decision(RECORD)
    api.store.record_decision({**RECORD, "decision_id": "d-00000043", "generation": 43, "at_s": T0,
                               "pools": {"pool-b": {"replicas": 2}}, "summary": "no change"})
    stub, md = api.stub, api.auth

    def ids(**kw):
        return [d.decision_id for d in stub.ListDecisions(pb.ListDecisionsRequest(**kw), metadata=md).decisions]

    assert ids() == ["d-00000043", "d-00000042"]
    assert ids(pool="pool-a") == ["d-00000042"]
    assert ids(since_unix_s=T0 - 1) == ["d-00000043"]

    ex = stub.ExplainDecision(pb.ExplainDecisionRequest(decision_id="d-00000042"), metadata=md)
    assert (ex.decision.generation, ex.decision.summary, ex.decision.outcome) == (42, "scale pool-a 3→5", "applied")
    assert json.loads(ex.json) == RECORD
    for expected in ("Decision d-00000042 (generation 42)", "outcome applied", "arrival_rps=41.5",
                     "[pool-a] slo_breach: TTFT p95 1.9 s > SLO 1.0 s", "Guardrail adjustments",
                     "[pool-a] max_step_up: capped +4 to +2", "Overrides applied",
                     "ov-000003 min_replicas(pool-a) = 5 by ana",
                     "binding_constraint: slo_ttft:critical", "Policy\n  first", "pool-a: replicas=5, warm_standby=1"):
        assert expected in ex.text, (expected, ex.text)

    code, details = _code(lambda: stub.ExplainDecision(pb.ExplainDecisionRequest(decision_id="d-nope"), metadata=md))
    assert code == grpc.StatusCode.NOT_FOUND and "d-nope" in details


def test_render_explanation_of_a_sparse_record():
    text = render_explanation({"decision_id": "d-1", "generation": 1, "extra_key": {"a": 1}})
    assert text.startswith("Decision d-1 (generation 1)")
    assert "Extra key" in text and "a: 1" in text


# ---------------------------------------------------------------- mTLS


def test_mtls_requires_a_client_certificate(tmp_path, certs):
    store = StateStore(tmp_path / "s.db")
    tls = TlsConfig(str(certs / "server.crt"), str(certs / "server.key"), client_ca_file=str(certs / "ca.crt"))
    server = PolicyServer(FakeDaemon(), store, "127.0.0.1:0", token=None, tls=tls, clock=VirtualClock(T0))
    port = server.start()
    ca = (certs / "ca.crt").read_bytes()
    try:
        good = grpc.ssl_channel_credentials(ca, (certs / "client.key").read_bytes(),
                                            (certs / "client.crt").read_bytes())
        with grpc.secure_channel(f"127.0.0.1:{port}", good) as ch:
            assert policy_pb2_grpc.PolicyServiceStub(ch).GetStatus(pb.GetStatusRequest(), timeout=10).generation == 7
        with grpc.secure_channel(f"127.0.0.1:{port}", grpc.ssl_channel_credentials(ca)) as ch:
            code, _ = _code(lambda: policy_pb2_grpc.PolicyServiceStub(ch).GetStatus(pb.GetStatusRequest(), timeout=10))
            assert code == grpc.StatusCode.UNAVAILABLE  # the handshake fails without a client certificate
    finally:
        server.stop(0)
        store.close()


def test_unreadable_tls_file_names_it(tmp_path):
    with pytest.raises(ValueError) as err:
        TlsConfig(str(tmp_path / "missing.crt"), str(tmp_path / "missing.key")).server_credentials()
    assert "tls.key_file" in str(err.value) or "tls.cert_file" in str(err.value)
