"""Real vllm-router and sglang-router follow the replicas through a scale-up and a drain, with no failed request.

The whole chain runs on loopback: FleetActuator → the Kubernetes adapter → the real `kubernetes` client →
tests/fakes/kube_api.py (its controller creates and terminates pods) → a test "kubelet" that starts one
tiny OpenAI-like replica per pod on its own loopback address (127.0.0.N, the pod IP) and stops it
gracefully when the pod terminates. Traffic goes client → the real router → replicas, in a bounded loop
that counts failures; the router runs with retries off, so a request routed to a stopped replica fails.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections.abc import Callable

import pytest

from controller.actuation.kube import KubernetesAutoscaler, KubeTarget, api_client
from controller.actuation.kube_actuator import FleetActuator
from controller.actuation.routers.membership import MembershipRouter
from controller.actuation.routers.sglang_router import SglangRouter
from controller.actuation.routers.vllm_router import VllmRouter
from controller.clock import VirtualClock
from controller.types import Decision, PoolDecision
from tests.fakes.kube_api import FakeKubeApi
from tests.fakes.openai_backend import OpenAIBackend
from tests.fixtures.routers import RouterProcess, binary

pytestmark = pytest.mark.e2e
T0 = 1_700_000_000.0
MAX_REQUESTS = 3000  # the load loop's bound, whatever happens


def wait_for(cond: Callable[[], bool], what: str, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(0.02)


def shared_port(hosts: list[str]) -> int:
    """A port free on every one of the loopback addresses (each "pod" listens on its own IP, same port)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind((hosts[0], 0))
            port = s.getsockname()[1]
        try:
            for h in hosts:
                with socket.socket() as s:
                    s.bind((h, port))
            return port
        except OSError:
            continue
    raise RuntimeError("no port free on every loopback address")


class Kubelet:
    """Plays the kubelet for the fake API: a replica per pod, ready on demand, stopped on termination."""

    def __init__(self, api: FakeKubeApi, port: int, router: MembershipRouter) -> None:
        self.api, self.port, self.router = api, port, router
        self.ips = [f"127.0.0.{i}" for i in range(11, 21)]
        self.backends: dict[str, OpenAIBackend] = {}
        self.listed_at_stop: dict[str, bool] = {}
        api.on_pod_created = self.created
        api.on_pod_terminating = self.terminating

    def created(self, pod: dict) -> None:
        ip = self.ips.pop(0)
        self.backends[pod["metadata"]["name"]] = OpenAIBackend(ip, self.port, delay_s=0.01)

    def make_ready(self) -> None:
        for name, b in self.backends.items():
            if not b.stopped:
                self.api.set_ready(name, b.url.split("//")[1].rsplit(":", 1)[0])

    def terminating(self, pod: dict) -> None:
        b = self.backends[pod["metadata"]["name"]]
        # The adapter must have taken the pod out of the router before the scale-down reached the API.
        self.listed_at_stop[b.url] = b.url in self.router.workers()
        b.stop()  # graceful: the requests in flight finish, new connections are refused

    def close(self) -> None:
        for b in self.backends.values():
            b.stop()


class Load:
    """A bounded request loop through the router: `threads` clients, counting answers and failures."""

    def __init__(self, router_url: str, threads: int = 3) -> None:
        self.host, self.port = router_url.split("//")[1].split(":")
        self.ok = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def _run(self) -> None:
        body = json.dumps({"model": "m", "prompt": "hello", "max_tokens": 1})
        while not self._stop.is_set():
            with self._lock:
                if self.ok + len(self.failures) >= MAX_REQUESTS:
                    return
            try:
                conn = http.client.HTTPConnection(self.host, int(self.port), timeout=10)
                conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
                resp = conn.getresponse()
                text = resp.read()
                conn.close()
                outcome = None if resp.status == 200 else f"HTTP {resp.status}: {text[:200]!r}"
            except OSError as exc:
                outcome = f"{type(exc).__name__}: {exc}"
            with self._lock:
                if outcome is None:
                    self.ok += 1
                else:
                    self.failures.append(outcome)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=15)


def decision(gen: int, replicas: int) -> Decision:
    return Decision(decision_id=f"d-{gen}", generation=gen, at_s=T0, valid_until_s=T0 + 60,
                    pools={"chat": PoolDecision(replicas=replicas)})


@pytest.mark.parametrize("kind", ["vllm-router", "sglang-router"])
def test_router_follows_scale_up_and_drain_without_a_failed_request(kind, tmp_path):
    if binary(kind) is None:
        pytest.fail(f"{kind} is not installed: `make test` installs it with the dev extra")
    router_proc = RouterProcess(kind, tmp_path / f"{kind}.log")
    api = FakeKubeApi()
    cls = VllmRouter if kind == "vllm-router" else SglangRouter
    router = cls(router_proc.url, metrics_url=router_proc.metrics_url, pools=("chat",), timeout_s=10.0)
    kubelet = Kubelet(api, shared_port([f"127.0.0.{i}" for i in range(11, 21)]), router)
    load = Load(router_proc.url)
    try:
        api.add_workload("Deployment", "vllm-chat", replicas=1)
        kubelet.make_ready()
        kube = KubernetesAutoscaler({"chat": KubeTarget("chat", "Deployment", "vllm-chat", "inference", "vllm",
                                                        kubelet.port)}, api_client(host=api.url))
        act = FleetActuator(kube, [router], clock=VirtualClock(T0))
        assert act.sync_membership() == [] and router.workers() == set()  # no plan applied yet: hands off
        out = act.apply(decision(1, 1))  # the first plan: the router gets the ready replica
        assert out.status == "applied", out.detail
        first = next(iter(kubelet.backends.values()))
        assert router.workers() == {first.url}
        load.start()
        wait_for(lambda: first.served >= 20, "traffic through the router to the first replica")

        # scale up: the new pods start, and the router gets them only once they are ready
        out = act.apply(decision(2, 3))
        assert out.status == "applied", out.detail
        assert router.workers() == {first.url}
        kubelet.make_ready()
        assert act.sync_membership() == []
        backends = list(kubelet.backends.values())
        assert router.workers() == {b.url for b in backends} and len(backends) == 3
        wait_for(lambda: all(b.served >= 10 for b in backends), "traffic on all three replicas")

        # drain: two pods go; they leave the router before the scale-down, then stop gracefully
        out = act.apply(decision(3, 1))
        assert out.status == "applied", out.detail
        stopped = [b for b in backends if b.stopped]
        assert len(stopped) == 2
        assert kubelet.listed_at_stop == {b.url: False for b in stopped}
        [survivor] = [b for b in backends if not b.stopped]
        assert router.workers() == {survivor.url}
        after = survivor.served
        wait_for(lambda: survivor.served >= after + 20, "traffic on the surviving replica after the drain")
        state = act.fleet_state()
        assert state is not None and state.pools["chat"].target_replicas == 1
    finally:
        load.stop()
        kubelet.close()
        api.close()
        router_proc.stop()
    assert load.failures == [], f"{len(load.failures)} failed of {load.ok + len(load.failures)}: {load.failures[:3]}"
    assert load.ok >= 80
    # every answer came from a replica (no retries, nothing lost or answered by the router itself)
    assert sum(b.served for b in kubelet.backends.values()) == load.ok


def test_router_readings_come_from_its_metrics(tmp_path):
    if binary("vllm-router") is None:
        pytest.fail("vllm-router is not installed: `make test` installs it with the dev extra")
    proc = RouterProcess("vllm-router", tmp_path / "vllm-router.log")
    backend = OpenAIBackend("127.0.0.1", 0)
    try:
        router = VllmRouter(proc.url, metrics_url=proc.metrics_url, timeout_s=10.0)
        router.add(backend.url)
        router.add(backend.url)  # already there: idempotent
        conn = http.client.HTTPConnection("127.0.0.1", proc.port, timeout=10)
        for _ in range(3):
            conn.request("POST", "/v1/completions", json.dumps({"model": "m", "prompt": "x"}),
                         {"Content-Type": "application/json"})
            assert conn.getresponse().read()
        conn.close()
        reading = router.reading()
        assert reading.requests_total.get(backend.url) == 3.0
        assert reading.healthy.get(backend.url) is True
        router.remove(backend.url)
        assert router.workers() == set()
    finally:
        backend.stop()
        proc.stop()
