"""controller/rpc/transport.py: the gRPC plumbing shared by actuation/ and api/ (addresses, tokens, channels)."""

from __future__ import annotations

import grpc
import pytest

from controller.rpc.transport import (
    ClientTls,
    InsecureListenError,
    TlsConfig,
    bearer_metadata,
    bearer_token_ok,
    check_listen_safe,
    is_loopback_address,
    make_channel,
    split_host_port,
)


@pytest.mark.parametrize("listen,loopback", [("127.0.0.1:1", True), ("127.0.0.2:1", True), ("localhost:1", True),
                                             ("[::1]:1", True), ("unix:/tmp/g.sock", True), ("0.0.0.0:1", False),
                                             ("192.168.1.2:1", False)])
def test_is_loopback_address(listen: str, loopback: bool) -> None:
    assert is_loopback_address(listen) is loopback


@pytest.mark.parametrize("listen,expected", [("127.0.0.1:50051", ("127.0.0.1", "50051")), ("[::1]:0", ("::1", "0")),
                                             (":50051", ("", "50051"))])
def test_split_host_port(listen: str, expected: tuple[str, str]) -> None:
    assert split_host_port(listen) == expected


def test_split_host_port_names_a_bad_address() -> None:
    with pytest.raises(ValueError, match="expected host:port"):
        split_host_port("nocolon")


def test_bearer_token_check() -> None:
    assert bearer_token_ok([("authorization", "Bearer abc")], "abc")
    assert bearer_token_ok([("Authorization", "bearer abc")], "abc")
    assert not bearer_token_ok([("authorization", "Bearer abcd")], "abc")
    assert not bearer_token_ok([("x-token", "abc")], "abc")
    assert not bearer_token_ok(None, "abc")


def test_bearer_metadata_round_trips_through_the_check() -> None:
    assert bearer_metadata(None) == ()
    assert bearer_metadata("") == ()
    assert bearer_token_ok(bearer_metadata("s3cret"), "s3cret")


def test_check_listen_safe_needs_a_token_or_mtls_beyond_loopback() -> None:
    check_listen_safe("127.0.0.1:1", None, None)
    check_listen_safe("0.0.0.0:1", "t", None)
    check_listen_safe("0.0.0.0:1", None, TlsConfig("c", "k", client_ca_file="ca"))
    with pytest.raises(InsecureListenError, match="0.0.0.0:1"):
        check_listen_safe("0.0.0.0:1", None, TlsConfig("c", "k"))


def test_client_tls_needs_cert_and_key_together() -> None:
    with pytest.raises(ValueError, match="together"):
        ClientTls(cert_file="c.crt").credentials()


def test_client_tls_names_an_unreadable_file(tmp_path) -> None:
    with pytest.raises(ValueError, match="tls.ca_file"):
        ClientTls(ca_file=str(tmp_path / "missing.crt")).credentials()


def test_make_channel_plaintext() -> None:
    channel = make_channel("127.0.0.1:1")
    assert isinstance(channel, grpc.Channel)
    channel.close()
