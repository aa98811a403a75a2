"""Kill the leader: the follower takes the Lease and serves the same overrides, mode and audit trail (issue 34, part 2).

Two `governor run` processes under leader election, their Lease and their GovernorState in the in-process API
server (tests/fakes/kube_api.py) reached through the official client from a kubeconfig, as in a cluster. Each
cycle: overrides and a mode are set on the leader through its PolicyService; the leader is SIGKILLed (no release,
no last tick); the follower takes the Lease after the lease duration and must serve the same active overrides,
the same mode and every audit entry the leader had, once each; the killed replica restarts on an empty state
directory (an `emptyDir` lost with its pod) and becomes the next follower.

The default run does FAILOVER_CYCLES (2); `GOVERNOR_RELIABILITY_FULL=1` runs 20 (docs/RELIABILITY.md).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
import yaml

from controller.api.kube_store import GROUP, PLURAL
from controller.gen.governor.v1 import policy_pb2, policy_pb2_grpc
from tests.fakes.kube_api import FakeKubeApi
from tests.fixtures.prometheus import wait_until
from tests.runtime.test_actuators import kubeconfig

pytestmark = pytest.mark.e2e
FULL = os.environ.get("GOVERNOR_RELIABILITY_FULL") == "1"
FAILOVER_CYCLES = 20 if FULL else 2
ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Replica:
    name: str
    port: int
    config: Path
    log: Path
    proc: subprocess.Popen | None = None
    starts: int = 0
    channel: grpc.Channel | None = None
    stub: policy_pb2_grpc.PolicyServiceStub = field(init=False)

    def start(self, tmp: Path, kube: str) -> None:
        self.starts += 1
        state = tmp / f"{self.name}-state-{self.starts}"  # a new pod's emptyDir: nothing on disk
        self.config.write_text(yaml.safe_dump({
            "mode": "shadow", "policy": "slo-feedback", "tick_interval_s": 1.0, "state_dir": str(state),
            "telemetry": {"source": "scrape", "window_s": 10, "stale_after_s": 10, "scrape": {
                "timeout_s": 0.1, "targets": [{"url": "http://127.0.0.1:9/metrics", "pool": "chat"}]}},
            "pools": [{"name": "chat", "model": "llama-3-8b", "sku": "h100-80gb", "usd_per_gpu_hour": 2.5,
                       "min_replicas": 1, "max_replicas": 64}],
            "api": {"listen": f"127.0.0.1:{self.port}"}, "metrics": {"listen": None},
            "leader_election": {"enabled": True, "identity": self.name, "namespace": "inference",
                                "lease_name": "governor", "kubeconfig": kube, "address": f"127.0.0.1:{self.port}",
                                "lease_duration_s": 3, "renew_deadline_s": 1.5, "retry_period_s": 0.5,
                                "clock_skew_margin_s": 1.0, "timeout_s": 1.0},
        }))
        env = {k: v for k, v in os.environ.items() if not k.startswith("GOVERNOR_")}
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "controller.cli", "run", "--config", str(self.config),
                                          "--headless"], stdout=subprocess.DEVNULL, stderr=log, cwd=tmp, env=env)
        if self.channel is not None:
            self.channel.close()
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")
        self.stub = policy_pb2_grpc.PolicyServiceStub(self.channel)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        if self.channel is not None:
            self.channel.close()

    def status(self) -> dict[str, str] | None:
        try:
            st = self.stub.GetStatus(policy_pb2.GetStatusRequest(), timeout=2)
        except grpc.RpcError:
            return None
        return {d.name: d.value for d in st.details} | {"mode": policy_pb2.Mode.Name(st.mode)}

    def leading(self) -> bool:
        st = self.status()
        return st is not None and st.get("leader.leading") == "true"

    def overrides(self) -> list[tuple]:
        out = self.stub.ListOverrides(policy_pb2.ListOverridesRequest(), timeout=5).overrides
        return sorted((o.id, o.kind, o.pool, o.value, o.author, o.reason, o.expires_unix_s) for o in out)

    def audit(self) -> list[tuple]:
        out = self.stub.ListAudit(policy_pb2.ListAuditRequest(limit=500), timeout=5).entries
        return [(e.at_unix_s, e.author, e.action, e.detail, e.caller) for e in out][::-1]  # oldest first


@pytest.fixture
def cluster(tmp_path):
    api = FakeKubeApi()
    kube = kubeconfig(tmp_path, api.url)
    replicas = [Replica(n, _free_port(), tmp_path / f"{n}.yaml", tmp_path / f"{n}.log") for n in ("pod-a", "pod-b")]
    yield api, kube, replicas
    for r in replicas:
        r.stop()
    api.close()


def _tail(r: Replica) -> str:
    return r.log.read_text()[-3000:] if r.log.exists() else ""


def test_kill_the_leader_and_the_follower_serves_the_same_overrides_mode_and_audit(tmp_path, cluster):
    api, kube, (a, b) = cluster
    a.start(tmp_path, kube)
    wait_until(a.leading, deadline_s=60, what=f"pod-a leading\n{_tail(a)}")
    b.start(tmp_path, kube)  # after pod-a leads: the first cycle's leader is known
    wait_until(lambda: b.status() is not None, deadline_s=60, what=f"pod-b answering\n{_tail(b)}")
    leader, follower = a, b
    lost = duplicated = 0
    takeovers: list[float] = []
    modes = [policy_pb2.MODE_ACTIVE, policy_pb2.MODE_PAUSED, policy_pb2.MODE_SHADOW]
    for cycle in range(FAILOVER_CYCLES):
        kinds = [policy_pb2.OVERRIDE_KIND_MAX_REPLICAS, policy_pb2.OVERRIDE_KIND_MIN_REPLICAS]
        for k, kind in enumerate(kinds):
            leader.stub.SetOverride(policy_pb2.SetOverrideRequest(override=policy_pb2.Override(
                kind=kind, pool="chat", value=float(2 + cycle + k), ttl_s=3600, author="alice",
                reason=f"cycle {cycle}")), timeout=10)
        mode = modes[cycle % len(modes)]
        leader.stub.SetMode(policy_pb2.SetModeRequest(mode=mode, author="alice", reason=f"cycle {cycle}"), timeout=10)
        # a follower refuses writes, naming the leader
        with pytest.raises(grpc.RpcError) as refused:
            follower.stub.SetMode(policy_pb2.SetModeRequest(mode=mode, author="mallory"), timeout=10)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert f"the leader is {leader.name}" in (refused.value.details() or "")
        want_overrides, want_audit = leader.overrides(), leader.audit()
        assert len(want_overrides) == 2 * (cycle + 1)
        leader.kill()
        t0 = time.monotonic()
        wait_until(follower.leading, deadline_s=30, what=f"{follower.name} taking over\n{_tail(follower)}")
        takeovers.append(time.monotonic() - t0)

        def claimed(name: str = follower.name) -> bool:  # its first tick as leader marks the object with its term
            obj = api.get_object(GROUP, PLURAL, "governor")
            return obj is not None and obj["spec"].get("writer", {}).get("identity") == name

        wait_until(claimed, deadline_s=10, what=f"{follower.name} claiming the shared state\n{_tail(follower)}")
        seen = len(want_audit)
        wait_until(lambda r=follower, n=seen: len(r.audit()) > n, deadline_s=10, what="the claim synced")
        # what the new leader serves: the same overrides and mode, every audit entry once, plus its own claim
        got_overrides, got_audit = follower.overrides(), follower.audit()
        assert got_overrides == want_overrides, (cycle, got_overrides, want_overrides)
        st = follower.status()
        assert st is not None and st["mode"] == policy_pb2.Mode.Name(mode)
        lost += sum(1 for e in want_audit if e not in got_audit)
        duplicated += len(got_audit) - len(set(got_audit))
        assert got_audit[:len(want_audit)] == want_audit, (cycle, got_audit[-5:], want_audit[-5:])
        assert [e[2] for e in got_audit[len(want_audit):]] == ["leader.claim"], (cycle, got_audit[len(want_audit) - 2:])
        if cycle == FAILOVER_CYCLES - 1:
            break
        # the killed pod comes back, on an empty disk, as the next follower
        leader.start(tmp_path, kube)
        wait_until(lambda r=leader: r.status() is not None, deadline_s=60, what=f"{leader.name} back\n{_tail(leader)}")
        leader, follower = follower, leader
    assert lost == 0 and duplicated == 0
    print(f"\nfailover: {FAILOVER_CYCLES} kill-the-leader cycles, overrides/mode/audit lost {lost}, duplicated "
          f"{duplicated}; takeover after the kill: min {min(takeovers):.1f} s, max {max(takeovers):.1f} s")
