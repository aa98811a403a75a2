"""Prometheus as users run it: the daemon reads a real Prometheus started with its own
`--web.config.file` (basic auth checked against a bcrypt hash, TLS with a test CA, client
certificates verified when given), and a wrong password is one clear telemetry error, in the status
and the metrics, not a crash. Secrets stay out of logs and status."""

from __future__ import annotations

import io
import logging

import pytest

from controller.clock import WallClock
from controller.config import Settings
from controller.runtime.main import build_services
from controller.sim.live import LiveFleet
from controller.sim.scenario import load_scenario
from tests.fakes.live_scenario import write_scenario
from tests.fixtures.prometheus import wait_until
from tests.fixtures.tls import SERVER_NAME, make_pki

pytestmark = pytest.mark.e2e

USER = "governor"
PASSWORD = "governor-test-password"
# bcrypt of PASSWORD at cost 4 (the lowest; Prometheus checks it on every request). Made with
# crypt.crypt(PASSWORD, crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=16)); a hash is data, not a secret.
PASSWORD_BCRYPT = "$2b$04$VmqBWGThLwTi2CYJBuGxnuBtpMLVQT44dj09eZ93VxzdTiQNvR9Z."


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    """A live fleet, and a Prometheus behind basic auth + TLS scraping it."""
    from controller.bench.prometheus_server import PrometheusServer

    tmp = tmp_path_factory.mktemp("secured")
    pki = make_pki(tmp / "pki")
    scenario = load_scenario(write_scenario(tmp, n=4000, rps=10.0, replicas=1, max_replicas=2))
    fleet = LiveFleet(scenario, speed=1.0)
    info = fleet.start()
    web = {"basic_auth_users": {USER: PASSWORD_BCRYPT},
           "tls_server_config": {"cert_file": str(pki.server_cert), "key_file": str(pki.server_key),
                                 "client_auth_type": "VerifyClientCertIfGiven", "client_ca_file": str(pki.ca)}}
    prom = PrometheusServer(tmp / "prom", http_sd_url=info["discovery"], web_config=web, ca_file=pki.ca,
                            basic_auth=(USER, PASSWORD))
    try:
        prom.wait_for("sum by (pool) (vllm:num_requests_running)", deadline_s=30)
        yield tmp, pki, prom, info
    finally:
        prom.stop()
        fleet.stop()


def _settings(tmp, pki, prom, info, password: str, *, server_name: str = SERVER_NAME) -> Settings:
    pw = tmp / f"password-{len(password)}-{server_name}"
    pw.write_text(password + "\n")
    return Settings(
        mode="shadow", tick_interval_s=1.0, state_dir=str(tmp / f"state-{pw.name}"),
        telemetry={"source": "prometheus", "window_s": 10, "stale_after_s": 30,
                   "prometheus": {"url": prom.url, "timeout_s": 5,
                                  "basic_auth": {"username": USER, "password_file": str(pw)},
                                  "headers": {"X-Scope-OrgID": "tenant-a"},
                                  "tls": {"ca": str(pki.ca), "cert": str(pki.client_cert),
                                          "key": str(pki.client_key), "server_name": server_name}}},
        pools=[{"name": "small", "model": "llama-3-8b", "sku": "a100-80gb", "usd_per_gpu_hour": 5.0,
                "min_replicas": 0, "max_replicas": 2}],
        api={"listen": "127.0.0.1:0"}, metrics={"listen": "127.0.0.1:0"}, log={"format": "json"})


def _logger() -> tuple[logging.Logger, io.StringIO]:
    buf = io.StringIO()
    log = logging.getLogger(f"test-auth-{id(buf)}")
    log.addHandler(logging.StreamHandler(buf))
    log.setLevel(logging.DEBUG)
    return log, buf


def test_the_daemon_reads_prometheus_behind_basic_auth_and_tls(secured):
    tmp, pki, prom, info = secured
    log, buf = _logger()
    services = build_services(_settings(tmp, pki, prom, info, PASSWORD), clock=WallClock(), logger=log)
    try:
        def read_ok():
            rep = services.daemon.tick()
            p = rep.observation.pools["small"]
            return rep if p.replicas_ready.ok and p.kv_usage_frac.ok else None

        rep = wait_until(read_ok, deadline_s=30, interval_s=0.5, what="a tick read through auth + TLS")
        assert rep.observation.source == "prometheus" and not rep.observation.errors
        assert rep.observation.pools["small"].replicas_ready.value == 1
        tel = next(c for c in services.daemon.status().components if c.name == "telemetry:prometheus")
        assert tel.healthy, tel.detail
        assert PASSWORD not in buf.getvalue() and PASSWORD not in repr(services.daemon.status())
    finally:
        services.close()


def test_a_wrong_password_is_a_clear_telemetry_error_in_status_and_metrics(secured):
    import urllib.request

    tmp, pki, prom, info = secured
    log, buf = _logger()
    services = build_services(_settings(tmp, pki, prom, info, "not-the-password"), clock=WallClock(), logger=log)
    try:
        rep = services.daemon.tick()  # does not raise
        assert rep.observation.errors == (
            f"prometheus {prom.url}: authentication refused (HTTP 401): check telemetry.prometheus "
            "basic_auth / bearer_token_file / headers",), rep.observation.errors
        assert not rep.observation.pools["small"].replicas_ready.ok
        tel = next(c for c in services.daemon.status().components if c.name == "telemetry:prometheus")
        assert not tel.healthy and "authentication refused (HTTP 401)" in tel.detail
        assert services.metrics_url is not None
        with urllib.request.urlopen(services.metrics_url, timeout=5) as r:
            text = r.read().decode()
        assert 'governor_telemetry_status{pool="small",status="missing"} 1.0' in text
        errors = [ln for ln in text.splitlines() if ln.startswith("governor_telemetry_errors_total ")]
        assert errors and float(errors[0].split()[1]) >= 1
        assert "not-the-password" not in buf.getvalue() + text + repr(services.daemon.status())
    finally:
        services.close()


def test_the_certificate_is_checked_against_the_server_name(secured):
    tmp, pki, prom, info = secured
    log, _ = _logger()
    services = build_services(_settings(tmp, pki, prom, info, PASSWORD, server_name="other.test"),
                              clock=WallClock(), logger=log)
    try:
        rep = services.daemon.tick()
        assert rep.observation.errors and "other.test" in rep.observation.errors[0], rep.observation.errors
    finally:
        services.close()
