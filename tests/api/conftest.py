"""A running PolicyService on a loopback port with a fake daemon and a real StateStore."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

import grpc
import pytest

from controller.api.server import PolicyServer
from controller.api.store import StateStore
from controller.clock import VirtualClock
from controller.gen.governor.v1 import policy_pb2_grpc
from tests.fakes.act_daemon import FakeDaemon

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


def _openssl(*args: str, cwd) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=30)


@pytest.fixture
def certs(tmp_path):
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    d = tmp_path / "pki"
    d.mkdir()
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=governor-test-ca",
             cwd=d)
    (d / "server.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name in ("server", "client"):
        _openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d)
        extra = ["-extfile", "server.ext"] if name == "server" else []
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.crt", "-days", "2", *extra, cwd=d)
    return d
