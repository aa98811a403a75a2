"""Tenant limits and step admission set by an operator override, end to end on loopback gRPC.

A daemon (the MPC, a fixed reading of one busy pool, shadow mode) and its PolicyServer: SetOverride
`tenant_max_inflight` / `tenant_weight` / `step_admission` is validated and audited like every override, the next
tick's decision carries the limits (and the reason naming the override), the RoutingPolicy the gRPC actuator sends
for it carries them as TenantLimits, and the picker's PolicyStore applies them over its own; once the override is
deleted the decision says nothing of tenants and the router's own limits are back.
"""

from __future__ import annotations

import json

import grpc
import pytest

from controller.actuation.grpc_actuator import routing_policy_for
from controller.dataplane.policy_store import PolicyStore, PoolSettings, Settings
from controller.dataplane.task_book import TenantSettings
from controller.gen.governor.v1 import control_pb2 as pb
from controller.gen.governor.v1 import policy_pb2
from controller.types import TenantLimits
from tests.runtime.test_reliability_override import AUTH, _tick, served  # noqa: F401 - the fixture

OWN = TenantSettings(rate_limit_rps=40.0, max_inflight=8, weight=2.0)


def _set(stub, kind, **kw) -> policy_pb2.Override:
    req = policy_pb2.Override(kind=kind, ttl_s=600, author="alice", reason="noisy tenant", **kw)
    return stub.SetOverride(policy_pb2.SetOverrideRequest(override=req), metadata=AUTH, timeout=10)


def test_tenant_overrides_become_part_of_the_decision_and_reach_the_pickers_settings(served):  # noqa: F811
    daemon, stub, clock = served
    _tick(daemon, clock)
    inflight = _set(stub, policy_pb2.OVERRIDE_KIND_TENANT_MAX_INFLIGHT, text="acme", value=2)
    weight = _set(stub, policy_pb2.OVERRIDE_KIND_TENANT_WEIGHT, text="acme", value=0.5)
    blind = _set(stub, policy_pb2.OVERRIDE_KIND_STEP_ADMISSION, text="blind")
    assert (inflight.text, inflight.value, blind.text) == ("acme", 2.0, "blind")
    clock.advance(15.0)
    d = daemon.tick().result.decision
    assert dict(d.tenants) == {"acme": TenantLimits(rate_limit_rps=0.0, max_inflight=2, weight=0.5)}
    assert d.step_aware is False
    assert {r.code for r in d.reasons} >= {"guard_override_tenant", "guard_override_step_admission"}
    ex = stub.ExplainDecision(policy_pb2.ExplainDecisionRequest(decision_id=d.decision_id), metadata=AUTH, timeout=10)
    record = json.loads(ex.json)
    assert record["tenants"] == {"acme": {"rate_limit_rps": 0.0, "max_inflight": 2, "weight": 0.5}}
    assert record["step_aware"] is False
    assert "Tenant limits at the router" in ex.text and "Step-aware admission at the router" in ex.text
    audit = stub.ListAudit(policy_pb2.ListAuditRequest(limit=10), metadata=AUTH, timeout=10)
    assert any(e.action == "override.set" and "tenant_max_inflight" in e.detail and "tenant=acme value=2" in e.detail
               for e in audit.entries)

    # on the wire, and into the picker's settings over its own --tenant limits
    msg = routing_policy_for(d, "tests")
    assert [(t.tenant, t.max_inflight, t.weight) for t in msg.tenants] == [("acme", 2, 0.5)]
    assert msg.HasField("step_aware") and msg.step_aware is False
    store = PolicyStore(Settings({"a": PoolSettings()}, tenants={"acme": OWN, "beta": OWN}, step_aware=True))
    msg.ClearField("pools")  # the picker routes its own pools; the tenants are what this test follows
    assert store.apply(msg, d.at_s).status == pb.ACK_STATUS_APPLIED
    s = store.settings(d.at_s).settings
    assert s.tenant_limits("acme") == TenantSettings(0.0, 2, 0.5) and s.tenant_limits("beta") == OWN
    assert s.step_aware is False

    for o in (inflight, weight, blind):
        stub.DeleteOverride(policy_pb2.DeleteOverrideRequest(id=o.id, author="alice"), metadata=AUTH, timeout=10)
    clock.advance(15.0)
    d = daemon.tick().result.decision
    assert dict(d.tenants) == {} and d.step_aware is None
    msg = routing_policy_for(d, "tests")
    assert list(msg.tenants) == [] and not msg.HasField("step_aware")


@pytest.mark.parametrize(("kind", "fields", "said"), [
    (policy_pb2.OVERRIDE_KIND_TENANT_MAX_INFLIGHT, {"value": 2}, "override.text: the tenant of a tenant_max_inflight "
                                                                  "override must be non-empty"),
    (policy_pb2.OVERRIDE_KIND_TENANT_RATE_LIMIT, {"text": "a b", "value": 1}, "override.text: the tenant of a "
                                                                              "tenant_rate_limit override 'a b' has"),
    (policy_pb2.OVERRIDE_KIND_TENANT_WEIGHT, {"text": "acme", "value": 0}, "override.value: tenant fair-share weight "
                                                                           "must be a finite number > 0"),
    (policy_pb2.OVERRIDE_KIND_TENANT_MAX_INFLIGHT, {"text": "acme", "value": 1.5}, "override.value: tenant requests "
                                                                                   "in flight must be >= 0"),
    (policy_pb2.OVERRIDE_KIND_TENANT_RATE_LIMIT, {"text": "acme", "value": -1}, "override.value: tenant rate limit"),
    (policy_pb2.OVERRIDE_KIND_STEP_ADMISSION, {"text": "maybe"}, "override.text: step admission must be one of "
                                                                 "aware, blind"),
])
def test_a_bad_tenant_or_step_override_is_refused_naming_the_field_and_nothing_is_stored(served, kind, fields,  # noqa: F811
                                                                                         said):
    _, stub, _ = served
    with pytest.raises(grpc.RpcError) as exc:
        _set(stub, kind, **fields)
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (exc.value.details() or "").startswith(said), exc.value.details()
    listed = stub.ListOverrides(policy_pb2.ListOverridesRequest(include_expired=True), metadata=AUTH, timeout=10)
    assert not listed.overrides


def test_the_command_line_builds_the_tenant_and_step_overrides_and_refuses_a_missing_tenant():
    from controller.api.client import UsageError, _describe, _override_request
    from controller.cli import build_parser

    def parse(*argv: str):
        return build_parser().parse_args(["override", "set", *argv, "--ttl", "15m", "--author", "alice"])

    o = _override_request(parse("tenant-inflight", "--tenant", "acme", "--value", "2"))
    assert (o.kind, o.text, o.value) == (policy_pb2.OVERRIDE_KIND_TENANT_MAX_INFLIGHT, "acme", 2.0)
    assert _describe(o) == "tenant_max_inflight(acme) = 2"
    o = _override_request(parse("step-admission", "--value", "blind"))
    assert (o.kind, o.text) == (policy_pb2.OVERRIDE_KIND_STEP_ADMISSION, "blind")
    with pytest.raises(UsageError, match="--tenant: required for a tenant-weight override"):
        _override_request(parse("tenant-weight", "--value", "2"))
    with pytest.raises(UsageError, match="--tenant: not used by a pin override"):
        _override_request(parse("pin", "--pool", "a", "--tenant", "acme", "--value", "2"))
    with pytest.raises(UsageError, match="aware or blind"):
        _override_request(parse("step-admission", "--value", "on"))
