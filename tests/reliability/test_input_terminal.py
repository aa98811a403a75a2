"""Terminal injection (issue 21): control characters are refused at the API, and the CLI escapes every stored
string it prints (text written before the check, or by another writer, is not trusted to be clean)."""

from __future__ import annotations

import dataclasses

import grpc
import pytest

from controller.api.server import ComponentStatus
from controller.cli import main
from controller.gen.governor.v1 import policy_pb2
from tests.reliability.api_harness import TOKEN, code_of, override, running_api

NASTY = {"ESC": "\x1b[2J\x1b]0;pwned\x07", "CR": "ok\rforged line", "NUL": "a\x00b", "RLO": "abc\u202edcba",
         "NEL": "x\x85y", "LS": "x\u2028y"}


@pytest.mark.parametrize("name", sorted(NASTY))
def test_control_characters_are_refused_naming_the_field(tmp_path, name):
    bad = NASTY[name]
    with running_api(tmp_path) as api:
        api.stub.SetOverride(override(), metadata=api.metadata, timeout=5)
        before = api.snapshot()
        calls = [
            ("override.author", api.stub.SetOverride, override(author=bad)),
            ("override.reason", api.stub.SetOverride, override(reason=bad)),
            ("override.pool", api.stub.SetOverride, override(pool=bad)),
            ("author", api.stub.SetMode, policy_pb2.SetModeRequest(mode=policy_pb2.MODE_SHADOW, author=bad)),
            ("reason", api.stub.SetMode, policy_pb2.SetModeRequest(mode=policy_pb2.MODE_SHADOW, author="a",
                                                                    reason=bad)),
            ("author", api.stub.DeleteOverride, policy_pb2.DeleteOverrideRequest(id="ov-000001", author=bad)),
            ("pool", api.stub.ListDecisions, policy_pb2.ListDecisionsRequest(pool=bad)),
            ("decision_id", api.stub.ExplainDecision, policy_pb2.ExplainDecisionRequest(decision_id=bad)),
        ]
        for field, rpc, req in calls:
            code, details = code_of(rpc, req, metadata=api.metadata, timeout=5)
            assert code == grpc.StatusCode.INVALID_ARGUMENT, (field, code, details)
            assert details.startswith(f"{field}: contains control character U+"), details
            assert not any(ch in details for ch in "\x1b\r\x00\u202e\x85\u2028")
        assert api.snapshot() == before


def _cli(capsys, *argv: str) -> str:
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def test_the_cli_escapes_stored_strings_it_prints(tmp_path, capsys):
    with running_api(tmp_path) as api:
        # as a file written before the API refused them would hold them
        now = api.clock.now_s()
        with api.store._tx() as c:
            c.execute("INSERT INTO overrides (id, kind, pool, priority_class, value, text, author, reason, created_s, "
                      "expires_s) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                      ("ov-000001", "min_replicas", "pool-a", "", 2.0, "", "mallory\x1b[2J", "fine\rFORGED\x00\u202e",
                       now, now + 600))
        status = api.daemon.status()
        api.daemon._status = dataclasses.replace(status, components=(
            ComponentStatus("telemetry:\x1b]0;title\x07", False, "detail\x1b[31m", 0.0),), details=(("k\r", "v\x00"),))
        conn = ("--api", api.address, "--token", TOKEN)
        printed = _cli(capsys, "override", "list", *conn) + _cli(capsys, "status", *conn)
        for raw in ("\x1b", "\r", "\x00", "\u202e", "\x07"):
            assert raw not in printed
        for escaped in ("mallory\\x1b[2J", "fine\\rFORGED\\x00\\u202e", "telemetry:\\x1b]0;title\\x07",
                        "detail\\x1b[31m"):
            assert escaped in printed
        # --json: JSON escapes them itself
        as_json = _cli(capsys, "override", "list", *conn, "--json")
        assert "\x1b" not in as_json and "\\u001b[2J" in as_json


def test_readme_override_example_takes_api_after_the_action(tmp_path, capsys):
    """README.md: `governor override set pin --pool ... --reason "load test" --api 127.0.0.1:PORT`."""
    with running_api(tmp_path) as api:
        out = _cli(capsys, "override", "set", "pin", "--pool", "pool-a", "--value", "4", "--ttl", "10m",
                   "--reason", "load test", "--api", api.address, "--token", TOKEN)
        assert "override ov-000001 set: pin_replicas(pool-a) = 4" in out
        listed = _cli(capsys, "override", "list", "--api", api.address, "--token", TOKEN, "--json")
        assert '"reason": "load test"' in listed
        # before the action still works, and the action's flag wins when both are given
        assert "ov-000001" in _cli(capsys, "override", "--api", "127.0.0.1:1", "list", "--api", api.address,
                                   "--token", TOKEN)
