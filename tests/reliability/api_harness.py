"""A PolicyService (fake daemon, real StateStore, real gRPC on loopback) and a KEDA scaler for the bad-input,
auth and fuzz tests under tests/reliability, plus a snapshot of everything a request could change."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from controller.api.server import PolicyServer
from controller.api.store import StateStore
from controller.clock import VirtualClock
from controller.gen.governor.v1 import policy_pb2, policy_pb2_grpc
from tests.fakes.act_daemon import FakeDaemon

TOKEN = "reliability-token-0123456789"
T0 = 1_700_000_000.0
POOLS = ("pool-a", "pool-b")


@dataclass
class RunningApi:
    server: PolicyServer
    store: StateStore
    daemon: FakeDaemon
    clock: VirtualClock
    address: str
    channel: grpc.Channel
    stub: policy_pb2_grpc.PolicyServiceStub
    metadata: tuple[tuple[str, str], ...]

    def snapshot(self) -> tuple[Any, ...]:
        """Overrides (expired included), the whole audit trail, the persisted mode and the daemon's mode calls."""
        return (tuple(self.store.list_overrides(self.clock.now_s(), include_expired=True)),
                tuple(self.store.list_audit(10**9)), self.store.get_mode(), tuple(self.daemon.mode_calls),
                self.store.peek_generation())


@contextmanager
def running_api(tmp: Path, *, token: str | None = TOKEN, max_overrides: int = 200, channel_options=(),
                **server_kw: Any) -> Iterator[RunningApi]:
    store = StateStore(tmp / "state.db", max_overrides=max_overrides)
    daemon = FakeDaemon(POOLS)
    clock = VirtualClock(T0)
    server = PolicyServer(daemon, store, "127.0.0.1:0", token=token, clock=clock, **server_kw)
    port = server.start()
    address = f"127.0.0.1:{port}"
    channel = grpc.insecure_channel(address, options=list(channel_options))
    try:
        yield RunningApi(server, store, daemon, clock, address, channel, policy_pb2_grpc.PolicyServiceStub(channel),
                         (("authorization", f"Bearer {token}"),) if token else ())
    finally:
        channel.close()
        server.stop(0)
        store.close()


def code_of(call, *args, **kwargs) -> tuple[grpc.StatusCode, str]:
    """(status code, details) of one unary call; OK and "" when it succeeds."""
    try:
        call(*args, **kwargs)
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


def override(**kw: Any) -> policy_pb2.SetOverrideRequest:
    fields: dict[str, Any] = {"kind": policy_pb2.OVERRIDE_KIND_MIN_REPLICAS, "pool": "pool-a", "value": 2.0,
                              "ttl_s": 600.0, "author": "alice", "reason": "test"}
    fields.update(kw)
    return policy_pb2.SetOverrideRequest(override=policy_pb2.Override(**fields))
