"""The Prometheus HTTP session's auth and headers, against a loopback server that records what it is sent,
and the config's checks on `telemetry.prometheus` auth and TLS."""

from __future__ import annotations

import http.server
import os
import threading

import pytest

from controller.config import ConfigError, parse_settings
from controller.telemetry.http_client import CredentialError, build_session

POOLS = "pools: [{name: a, model: llama-3-8b, sku: a100, usd_per_gpu_hour: 1}]\n"


@pytest.fixture
def recorder():
    seen: list[dict[str, str]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append(dict(self.headers))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_port}/", seen
    srv.shutdown()
    srv.server_close()


def test_bearer_token_is_read_from_its_file_and_follows_a_rotation(recorder, tmp_path):
    url, seen = recorder
    token = tmp_path / "token"
    token.write_text("first-token\n")
    session, auth = build_session(bearer_token_file=str(token), headers={"X-Scope-OrgID": "tenant-a"})
    session.get(url, auth=auth, timeout=5)
    token.write_text("second-token\n")
    os.utime(token, (1, 1))  # a different mtime even within the filesystem's resolution
    session.get(url, auth=auth, timeout=5)
    assert [h["Authorization"] for h in seen] == ["Bearer first-token", "Bearer second-token"]
    assert all(h["X-Scope-OrgID"] == "tenant-a" for h in seen)
    assert "token" not in repr(auth).replace(str(token), "")


def test_basic_auth_reads_the_password_file_and_a_missing_one_is_named(recorder, tmp_path):
    url, seen = recorder
    pw = tmp_path / "pw"
    pw.write_text("s3cret\nignored\n")
    session, auth = build_session(basic_auth=("gov", str(pw)))
    session.get(url, auth=auth, timeout=5)
    assert seen[0]["Authorization"] == "Basic Z292OnMzY3JldA=="  # base64("gov:s3cret")
    with pytest.raises(CredentialError, match=r"basic_auth.password_file: cannot read '.*nope'"):
        build_session(basic_auth=("gov", str(tmp_path / "nope")))
    with pytest.raises(CredentialError, match="tls.ca"):
        build_session(ca=str(tmp_path / "no-ca.pem"))


@pytest.mark.parametrize(("prom", "message"), [
    ("{url: 'https://u:p@prom:9090'}", "credentials in the URL would be logged"),
    ("{bearer_token_file: /t, basic_auth: {username: u, password_file: /p}}", "not both"),
    ("{headers: {Authorization: 'Bearer x'}}", "use bearer_token_file or basic_auth"),
    ("{url: 'http://prom:9090', tls: {ca: /ca.pem}}", "is not https://"),
    ("{url: 'https://prom:9090', tls: {cert: /c.pem}}", "cert and key must be set together"),
])
def test_the_config_refuses_auth_that_would_leak_or_cannot_work(prom, message):
    with pytest.raises(ConfigError, match=message):
        parse_settings(POOLS + f"telemetry: {{prometheus: {prom}}}\n")


def test_a_secured_prometheus_config_validates_and_shows_no_secret():
    s = parse_settings(POOLS + "telemetry: {prometheus: {url: 'https://mimir:8080/prometheus', "
                       "basic_auth: {username: u, password_file: /run/secrets/pw}, "
                       "headers: {X-Scope-OrgID: tenant-a}, "
                       "tls: {ca: /etc/ca.pem, server_name: mimir.internal}}}\n")
    assert s.telemetry.prometheus.tls.server_name == "mimir.internal"
    assert "pw" not in s.summary() and "tenant-a" not in s.summary()
