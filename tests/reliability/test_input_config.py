"""`governor config validate` refuses what `governor run` refuses (issue 21), strict scalars, the state database's
permissions and corruption, and the JSON log carrying every library's lines."""

from __future__ import annotations

import io
import json
import logging
import os
import sqlite3
import stat

import pytest

from controller.api.store import StateStore, StoreError
from controller.cli import main
from controller.obs.logs import setup_logging

BASE = """\
state_dir: {state}
pools:
  - name: a
    model: llama-3.1-8b
    sku: a100-80gb
    usd_per_gpu_hour: 2.5
    max_replicas: 4
"""


def _both(tmp_path, capsys, text: str) -> tuple[str, str]:
    """(validate's stderr, run's stderr) for a config, both asserted to exit 2."""
    path = tmp_path / "g.yaml"
    path.write_text(text)
    assert main(["config", "validate", str(path)]) == 2
    validate_err = capsys.readouterr().err
    assert main(["run", "--config", str(path), "--once", "--headless"]) == 2
    return validate_err, capsys.readouterr().err


def test_the_base_config_validates(tmp_path, capsys):
    path = tmp_path / "g.yaml"
    path.write_text(BASE.format(state=tmp_path / "state"))
    assert main(["config", "validate", str(path)]) == 0
    assert not (tmp_path / "state").exists()  # validate creates nothing


@pytest.mark.parametrize("case", ["state_dir_is_a_file", "token_file_missing", "tokens_file_bad_role",
                                  "tls_cert_missing", "corrupt_database", "foreign_database", "mpc_params"])
def test_validate_refuses_what_run_refuses(tmp_path, capsys, case):
    state = tmp_path / "state"
    text = BASE.format(state=state)
    expected = {
        "state_dir_is_a_file": f"state_dir: '{state}' is not a directory",
        "token_file_missing": f"api.token_file: cannot read '{tmp_path}/nope'",
        "tokens_file_bad_role": "tokens[0].role: must be read or write",
        "tls_cert_missing": f"api.tls.cert: cannot read '{tmp_path}/server.crt'",
        "corrupt_database": f"state_dir: {state}/governor.db is not a valid state database (file is not a database)",
        "foreign_database": "is not a valid state database (no table(s)",
        "mpc_params": "policy 'mpc' with policy_params: policy mpc: unknown parameter(s) ['horizon']",
    }[case]
    if case == "state_dir_is_a_file":
        state.write_text("")
    elif case == "token_file_missing":
        text += f"api:\n  token_file: {tmp_path}/nope\n"
    elif case == "tokens_file_bad_role":
        (tmp_path / "tokens.yaml").write_text("tokens:\n  - {name: a, token: abcdefghijklmnop0123, role: admin}\n")
        text += f"api:\n  tokens_file: {tmp_path}/tokens.yaml\n"
    elif case == "tls_cert_missing":
        (tmp_path / "server.key").write_text("k")
        text += f"api:\n  tls:\n    cert: {tmp_path}/server.crt\n    key: {tmp_path}/server.key\n"
    elif case == "corrupt_database":
        state.mkdir()
        (state / "governor.db").write_bytes(b"this is not sqlite" * 100)
    elif case == "foreign_database":
        state.mkdir()
        sqlite3.connect(state / "governor.db").execute("CREATE TABLE t (x)").connection.commit()
    elif case == "mpc_params":
        text += "policy: mpc\npolicy_params: {horizon: 5}\n"
    validate_err, run_err = _both(tmp_path, capsys, text)
    assert expected in validate_err
    assert expected in run_err
    assert "Traceback" not in validate_err + run_err
    assert "abcdefghijklmnop0123" not in validate_err + run_err  # a token is never echoed


@pytest.mark.parametrize("line,value,expected", [
    ("    max_replicas: 4", "    max_replicas: true", "pools[0].max_replicas: True is a boolean, not a whole number"),
    ("    usd_per_gpu_hour: 2.5", '    usd_per_gpu_hour: "2.0"',
     "pools[0].usd_per_gpu_hour: '2.0' is a string, not a number: write a number without quotes"),
    ("    max_replicas: 4", "    max_replicas: 4.5", "pools[0].max_replicas: 4.5 is not a whole number"),
    ("    usd_per_gpu_hour: 2.5", "    usd_per_gpu_hour: .nan",
     "pools[0].usd_per_gpu_hour: nan is not a finite number"),
    ("    usd_per_gpu_hour: 2.5", "    usd_per_gpu_hour: .inf",
     "pools[0].usd_per_gpu_hour: inf is not a finite number"),
])
def test_strict_scalars(tmp_path, capsys, line, value, expected):
    path = tmp_path / "g.yaml"
    path.write_text(BASE.format(state=tmp_path / "state").replace(line, value))
    assert main(["config", "validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"g.yaml:{7 if 'max' in line else 6}: {expected}" in err
    assert "should be" not in err and "less than" not in err  # not a range message on top


def test_tick_from_the_environment_is_still_a_string_that_parses(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("GOVERNOR_TICK_INTERVAL_S", "20")
    path = tmp_path / "g.yaml"
    path.write_text(BASE.format(state=tmp_path / "state"))
    assert main(["config", "validate", str(path)]) == 0
    assert "tick=20s" in capsys.readouterr().out


def test_the_state_database_is_private(tmp_path):
    d = tmp_path / "state" / "inner"
    store = StateStore(d / "governor.db")
    store.add_audit("a", "test", "x", now_s=1.0)
    for p in [d / "governor.db", *d.glob("governor.db-*")]:
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    store.close()
    os.chmod(d / "governor.db", 0o644)  # a file from before: tightened when opened
    StateStore(d / "governor.db").close()
    assert stat.S_IMODE((d / "governor.db").stat().st_mode) == 0o600


def test_a_corrupt_database_is_a_clear_store_error(tmp_path):
    db = tmp_path / "governor.db"
    db.write_bytes(b"\x00garbage" * 512)
    with pytest.raises(StoreError, match=rf"^{db} is not a valid state database \(file is not a database\)$"):
        StateStore(db)


def test_apscheduler_lines_go_through_the_json_formatter(restore_logging):
    stream = io.StringIO()
    setup_logging("info", "json", stream=stream)
    logging.getLogger("apscheduler.scheduler").warning("Run time of job was missed by 0:00:01")
    logging.getLogger("apscheduler.scheduler").info("Added job")  # under its WARNING floor: dropped
    logging.getLogger("controller.api.server").error("on_overrides_changed failed")
    lines = stream.getvalue().splitlines()
    records = [json.loads(line) for line in lines]  # every line is JSON
    assert [(r["logger"], r["msg"]) for r in records] == [
        ("apscheduler.scheduler", "Run time of job was missed by 0:00:01"),
        ("controller.api.server", "on_overrides_changed failed")]


@pytest.fixture
def restore_logging():
    yield
    for name in ("governor", "controller", "apscheduler"):  # what setup_logging configured
        lg = logging.getLogger(name)
        lg.handlers.clear()
        lg.propagate = True
        lg.setLevel(logging.NOTSET)


def test_start_up_on_a_corrupt_database_stops_with_cannot_start(tmp_path, capsys, monkeypatch, restore_logging):
    """`governor run` past preflight (the file turned bad after validation): a clear exit, not a traceback."""
    from controller.runtime import main as runtime_main

    state = tmp_path / "state"
    path = tmp_path / "g.yaml"
    path.write_text(BASE.format(state=state))
    real_preflight = runtime_main.preflight

    def preflight_then_corrupt(p):
        settings = real_preflight(p)
        state.mkdir()
        (state / "governor.db").write_bytes(b"corrupted after validation" * 64)
        return settings

    monkeypatch.setattr(runtime_main, "preflight", preflight_then_corrupt)
    assert main(["run", "--config", str(path), "--once", "--headless"]) == 2
    err = capsys.readouterr().err
    assert f"governor: cannot start: {state}/governor.db is not a valid state database (file is not a database)" \
        in err
    assert "Traceback" not in err


@pytest.mark.parametrize("extra,expected", [
    ("1: 2\n", "1: a key must be a string"),
    ('state_dir: "a\\0b"\n', "state_dir: 'a\\x00b' is not a usable path"),
    ('api: {token_file: "\\0"}\n', "api.token_file: cannot read '\\x00': embedded null byte"),
    ('api: {tokens_file: "\\0"}\n', "api.tokens_file: cannot read '\\x00': embedded null byte"),
])
def test_what_the_config_fuzz_found(tmp_path, capsys, extra, expected):
    """Two tracebacks the full config fuzz found (a non-string top-level key; a NUL in a path)."""
    text = BASE.format(state=tmp_path / "state").replace(f"state_dir: {tmp_path / 'state'}\n", "") + extra
    validate_err, run_err = _both(tmp_path, capsys, text)
    assert expected in validate_err and expected in run_err
    assert "Traceback" not in validate_err + run_err
