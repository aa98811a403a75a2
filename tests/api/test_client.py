"""The operator CLI commands against a running PolicyService (real loopback gRPC), called with parsed args."""

from __future__ import annotations

import json
from datetime import datetime

import pytest
import yaml

from controller.api import client
from controller.api.client import UsageError, parse_since, parse_ttl
from controller.cli import build_parser
from controller.clock import WallClock
from controller.types import Mode
from tests.api.conftest import TOKEN
from tests.fixtures.prometheus import free_port


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    args = build_parser().parse_args(argv)
    func = {
        "status": client.cmd_status, "decisions": client.cmd_decisions, "explain": client.cmd_explain,
        "mode": client.cmd_mode,
    }.get(args.command) or {"set": client.cmd_override_set, "list": client.cmd_override_list,
                            "delete": client.cmd_override_delete}[args.override_command]
    rc = func(args)
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture
def api_start_s() -> float:
    """The CLI shows expiry relative to the wall clock, so the server's virtual clock starts there."""
    return WallClock().now_s()


@pytest.fixture(autouse=True)
def _no_env_token(monkeypatch):
    monkeypatch.delenv("GOVERNOR_API_TOKEN", raising=False)


def test_status_table_and_json(api, capsys):
    rc, out, _ = run(["status", "--api", api.address, "--token", TOKEN], capsys)
    assert rc == 0
    assert "mode: active" in out and "profile: balanced" in out and "generation: 7" in out
    assert "pool-a" in out and "FAILING" in out and "telemetry:prometheus" in out
    assert "FB used" in out and "93%" in out  # memory headroom: DCGM framebuffer of the fullest GPU
    rc, out, _ = run(["status", "--api", api.address, "--token", TOKEN, "--json"], capsys)
    data = json.loads(out)
    assert rc == 0 and data["mode"] == "MODE_ACTIVE" and data["generation"] == "7" and len(data["pools"]) == 2


def test_override_set_list_delete(api, capsys):
    base = ["--api", api.address, "--token", TOKEN]
    rc, out, _ = run(["override", *base, "set", "min", "--pool", "pool-a", "--value", "4", "--ttl", "15m",
                      "--author", "ana", "--reason", "launch"], capsys)
    assert rc == 0 and "ov-000001" in out
    [o] = api.store.active_overrides(api.clock.now_s())
    assert (o.kind, o.pool, o.value, o.expires_s - o.created_s, o.author, o.reason) == (
        "min_replicas", "pool-a", 4.0, 900.0, "ana", "launch")
    rc, out, _ = run(["override", *base, "set", "profile", "--value", "cost", "--ttl", "2h", "--author", "bo"], capsys)
    assert rc == 0 and api.store.active_overrides(api.clock.now_s())[1].text == "cost"

    rc, out, _ = run(["override", *base, "list"], capsys)
    assert rc == 0 and "ov-000001" in out and "min_replicas(pool-a) = 4" in out and "profile = cost" in out
    rc, out, _ = run(["override", *base, "--json", "list"], capsys)
    assert [o["ttl_s"] for o in json.loads(out)["overrides"]] == [900.0, 7200.0]

    rc, out, _ = run(["override", *base, "delete", "ov-000001", "--author", "cy"], capsys)
    assert rc == 0 and "deleted" in out
    rc, _, err = run(["override", *base, "delete", "ov-000001", "--author", "cy"], capsys)
    assert rc == 1 and "no override" in err
    assert [o.override_id for o in api.store.active_overrides(api.clock.now_s())] == ["ov-000002"]


def test_override_rejected_by_the_server_exits_1_naming_the_field(api, capsys):
    rc, _, err = run(["override", "--api", api.address, "--token", TOKEN, "set", "pin", "--pool", "pool-zz",
                      "--value", "3", "--ttl", "900", "--author", "ana"], capsys)
    assert rc == 1 and "override.pool" in err
    assert api.store.active_overrides(api.clock.now_s()) == ()


@pytest.mark.parametrize("argv,needle", [
    (["set", "min", "--pool", "pool-a", "--ttl", "15m"], "--value"),
    (["set", "min", "--pool", "pool-a", "--value", "four", "--ttl", "15m"], "--value"),
    (["set", "min", "--pool", "pool-a", "--value", "4", "--ttl", "soon"], "--ttl"),
    (["set", "profile", "--ttl", "15m"], "--value"),
])
def test_bad_cli_values_exit_2_without_calling(api, capsys, argv, needle):
    rc, _, err = run(["override", "--api", api.address, "--token", TOKEN, *argv], capsys)
    assert rc == 2 and needle in err
    assert api.store.list_audit() == []


def test_mode_calls_the_daemon(api, capsys):
    rc, out, _ = run(["mode", "--api", api.address, "--token", TOKEN, "shadow", "--author", "ana", "--reason", "try"],
                     capsys)
    assert rc == 0 and "active → shadow" in out
    assert api.daemon.mode_calls == [(Mode.SHADOW, "ana", "try")]


def test_decisions_and_explain(api, capsys):
    now = datetime.now().timestamp()
    for i, at in enumerate((now - 7200, now - 60), start=1):
        api.store.record_decision({"decision_id": f"d-{i}", "generation": i, "at_s": at, "mode": "active",
                                   "summary": f"step {i}", "outcome": "applied",
                                   "pools": ["pool-a"] if i == 1 else ["pool-b"],
                                   "reasons": [{"code": "slo_breach", "message": "too slow", "pool": "pool-a"}]})
    base = ["--api", api.address, "--token", TOKEN]
    rc, out, _ = run(["decisions", *base], capsys)
    assert rc == 0 and "d-1" in out and "d-2" in out and "step 2" in out
    since = datetime.fromtimestamp(now - 3600).strftime("%H:%M")
    rc, out, _ = run(["decisions", *base, "--since", since], capsys)
    assert rc == 0 and "d-2" in out and "d-1" not in out
    rc, out, _ = run(["decisions", *base, "--pool", "pool-a", "--json"], capsys)
    assert [d["decision_id"] for d in json.loads(out)["decisions"]] == ["d-1"]
    rc, out, _ = run(["decisions", *base, "--pool", "pool-q"], capsys)
    assert rc == 0 and "no decisions" in out

    rc, out, _ = run(["explain", *base, "d-1"], capsys)
    assert rc == 0 and "Decision d-1 (generation 1)" in out and "[pool-a] slo_breach: too slow" in out
    rc, out, _ = run(["explain", *base, "d-1", "--json"], capsys)
    assert json.loads(out)["summary"] == "step 1"
    rc, _, err = run(["explain", *base, "d-404"], capsys)
    assert rc == 1 and "not found" in err


def test_wrong_or_missing_token_is_a_clear_error(api, capsys):
    rc, _, err = run(["status", "--api", api.address, "--token", "nope"], capsys)
    assert rc == 1 and "not authorized" in err and "refused" in err
    rc, _, err = run(["status", "--api", api.address], capsys)
    assert rc == 1 and "no token was sent" in err


def test_unreachable_daemon_is_a_clear_error(capsys):
    address = f"127.0.0.1:{free_port()}"
    rc, _, err = run(["status", "--api", address], capsys)
    assert rc == 1 and "cannot reach the Governor API at " + address in err


def test_address_and_token_from_config_and_env(api, capsys, tmp_path, monkeypatch):
    host, port = api.address.rsplit(":", 1)
    cfg = tmp_path / "governor.yaml"
    cfg.write_text(yaml.safe_dump({"api": {"listen": f"0.0.0.0:{port}", "token": TOKEN}, "tick_s": 15}))
    rc, out, _ = run(["status", "--config", str(cfg)], capsys)
    assert rc == 0 and "generation: 7" in out

    (tmp_path / "token").write_text(TOKEN + "\n")
    cfg.write_text(yaml.safe_dump({"api": {"listen": api.address, "token_file": str(tmp_path / "token")}}))
    rc, out, _ = run(["status", "--config", str(cfg)], capsys)
    assert rc == 0

    cfg.write_text(yaml.safe_dump({"api": {"listen": api.address}}))
    monkeypatch.setenv("GOVERNOR_API_TOKEN", TOKEN)
    rc, _, _ = run(["status", "--config", str(cfg)], capsys)
    assert rc == 0
    monkeypatch.setenv("GOVERNOR_API_TOKEN", "stale")
    rc, _, _ = run(["status", "--config", str(cfg), "--token", TOKEN], capsys)  # --token wins
    assert rc == 0

    rc, _, err = run(["status", "--config", str(tmp_path / "missing.yaml")], capsys)
    assert rc == 2 and "missing.yaml" in err


@pytest.mark.parametrize("text,seconds", [("900", 900), ("15m", 900), ("2h", 7200), ("1h30m", 5400), ("1d", 86400),
                                          ("45s", 45), ("0.5h", 1800)])
def test_parse_ttl(text, seconds):
    assert parse_ttl(text) == seconds


@pytest.mark.parametrize("text", ["", "0", "15x", "m", "-5", "2h-"])
def test_parse_ttl_rejects(text):
    with pytest.raises(UsageError):
        parse_ttl(text)


def test_parse_since():
    noon = datetime(2024, 5, 10, 12, 0).timestamp()
    assert parse_since(None, noon) == 0.0
    assert parse_since("1700000000", noon) == 1_700_000_000.0
    assert parse_since("09:30", noon) == datetime(2024, 5, 10, 9, 30).timestamp()
    assert parse_since("23:15", noon) == datetime(2024, 5, 9, 23, 15).timestamp()  # later today → yesterday
    for bad in ("25:00", "12:61", "yesterday", "-3"):
        with pytest.raises(UsageError):
            parse_since(bad, noon)


@pytest.fixture
def mtls_api(tmp_path, certs):
    from controller.api.server import PolicyServer
    from controller.api.store import StateStore
    from controller.clock import VirtualClock
    from controller.rpc.transport import TlsConfig
    from tests.fakes.act_daemon import FakeDaemon

    store = StateStore(tmp_path / "tls.db")
    tls = TlsConfig(str(certs / "server.crt"), str(certs / "server.key"), client_ca_file=str(certs / "ca.crt"))
    server = PolicyServer(FakeDaemon(), store, "127.0.0.1:0", token=None, tls=tls,
                          clock=VirtualClock(WallClock().now_s()))
    port = server.start()
    yield f"127.0.0.1:{port}"
    server.stop(0)
    store.close()


def test_cli_over_mtls(mtls_api, certs, capsys, tmp_path):
    ca, cert, key = (str(certs / f) for f in ("ca.crt", "client.crt", "client.key"))
    rc, out, _ = run(["status", "--api", mtls_api, "--tls-ca", ca, "--tls-cert", cert, "--tls-key", key], capsys)
    assert rc == 0 and "generation: 7" in out
    # Plaintext against a TLS daemon: a clear error that says which flag is missing.
    rc, _, err = run(["status", "--api", mtls_api], capsys)
    assert rc == 1 and "--tls-ca" in err
    # TLS without the client certificate the daemon requires.
    rc, _, err = run(["status", "--api", mtls_api, "--tls-ca", ca], capsys)
    assert rc == 1 and "--tls-cert" in err
    # The config file's api.tls.cert switches TLS on; the CA still comes from --tls-ca.
    cfg = tmp_path / "governor.yaml"
    cfg.write_text(yaml.safe_dump({"api": {"listen": mtls_api, "tls": {"cert": str(certs / "server.crt")}}}))
    rc, out, _ = run(["status", "--config", str(cfg), "--tls-ca", ca, "--tls-cert", cert, "--tls-key", key], capsys)
    assert rc == 0 and "generation: 7" in out


@pytest.mark.parametrize("argv, needle", [
    (["--tls-cert", "c.crt"], "--tls-cert and --tls-key must be given together"),
    (["--tls-ca", "/nonexistent/ca.crt"], "--tls-ca: no such file"),
])
def test_bad_tls_flags_exit_2(argv, needle, capsys):
    rc, _, err = run(["status", "--api", "127.0.0.1:1", *argv], capsys)
    assert rc == 2 and needle in err
