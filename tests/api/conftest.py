"""A running PolicyService on a loopback port with a fake daemon and a real StateStore."""

from __future__ import annotations

import shutil
from dataclasses import dataclass

import grpc
import pytest

from controller.api.server import PolicyServer
from controller.api.store import StateStore
from controller.clock import VirtualClock
from controller.gen.governor.v1 import policy_pb2_grpc
from tests.fakes.act_daemon import FakeDaemon
from tests.fixtures.tls import make_pki

TOKEN = "s3cret-token"
T0 = 1_700_000_000.0


@dataclass
class Api:
    server: PolicyServer
    store: StateStore
    daemon: FakeDaemon
    clock: VirtualClock
    address: str
    channel: grpc.Channel

    @property
    def stub(self) -> policy_pb2_grpc.PolicyServiceStub:
        return policy_pb2_grpc.PolicyServiceStub(self.channel)

    @property
    def auth(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {TOKEN}"),)


@pytest.fixture
def api_start_s() -> float:
    """Where the server's virtual clock starts (the CLI tests start it at wall time)."""
    return T0


@pytest.fixture
def api(tmp_path, api_start_s):
    store = StateStore(tmp_path / "state.db")
    daemon = FakeDaemon()
    clock = VirtualClock(api_start_s)
    server = PolicyServer(daemon, store, "127.0.0.1:0", token=TOKEN, clock=clock)
    port = server.start()
    address = f"127.0.0.1:{port}"
    channel = grpc.insecure_channel(address)
    yield Api(server, store, daemon, clock, address, channel)
    channel.close()
    server.stop(0)
    store.close()


@pytest.fixture
def certs(tmp_path):
    """A CA, a server certificate for 127.0.0.1/localhost and a client certificate (tests/fixtures/tls.py)."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    make_pki(tmp_path / "pki")
    return tmp_path / "pki"
