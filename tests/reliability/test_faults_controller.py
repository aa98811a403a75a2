"""Faults of the controller itself: SIGKILL at every phase of a tick, config reload (SIGHUP) with a bad file and
with a new pool, and a state store that refuses writes (read-only, full).

Expected (issue 21): no override, audit entry or generation lost; no decision applied twice and never a
stale generation sent after a restart; a bad config rejected whole (the running one kept, the error in
status and metrics); a new pool seen by the telemetry and the learning parts; a store that cannot persist
the generation stops the sending (a restart could otherwise reuse it) but the daemon keeps ticking.

The kill loop runs `governor run --once` as a subprocess with GOVERNOR_FAULT_KILL_AT=PHASE (the daemon's
fault-injection point, controller/runtime/daemon.py), then restarts the daemon on the same state
directory. The default run kills at the two phases around the send (persist, actuate);
GOVERNOR_RELIABILITY_FULL=1 loops over every phase.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from argparse import Namespace
from pathlib import Path

import grpc
import pytest
import yaml

from controller.api.store import StateStore
from controller.clock import VirtualClock
from controller.gen.governor.v1 import policy_pb2, policy_pb2_grpc
from controller.runtime.daemon import KILL_PHASES
from controller.runtime.main import build_services, cmd_run, reload_settings, reloaded_parts
from tests.fakes.fault_fleet import FaultFleet, Governed, fault_settings

ROOT = Path(__file__).resolve().parents[2]
FULL = os.environ.get("GOVERNOR_RELIABILITY_FULL") == "1"
PHASES = KILL_PHASES if FULL else ("persist", "actuate")
NOW = 1_800_000_000.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_config(path: Path, fleet: FaultFleet, state_dir: Path, *, pools: tuple[str, ...] | None = None,
                  tick_s: float = 3.0, api_port: int = 0) -> Path:
    # a 1 s tick needs tight timeouts to pass the tick budget (controller/config/tick_budget.py):
    # 0.7 s read + 0.1 s send
    fast = tick_s < 2
    s = fault_settings(fleet, state_dir, tick_s=tick_s, scrape_timeout_s=0.1 if fast else 0.2,
                       act=(0.1, 0, 0.0) if fast else (0.5, 1, 0.1))
    data = s.model_dump(mode="json", exclude_none=True)
    if pools is not None:
        data["pools"] = [p for p in data["pools"] if p["name"] in pools]
    data["api"] = {"listen": f"127.0.0.1:{api_port}"}
    data["log"] = {"format": "json", "level": "info"}
    path.write_text(yaml.safe_dump(data))
    return path


# A warm `governor` process that forks one child per run: the imports (scipy, skops, grpc: ~5-12 s on a
# loaded CI host) are paid once, and each child is a real process running `controller.cli.main`, killed for
# real. The zygote never creates a gRPC object itself, so its children may (gRPC must not cross a fork).
ZYGOTE = r"""
import json, os, sys, traceback
import controller.runtime.main, controller.cli
from controller.cli import main
for line in sys.stdin:
    job = json.loads(line)
    pid = os.fork()
    if pid == 0:
        os.environ.update(job["env"])
        fd = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        try:
            code = main(job["argv"])
        except BaseException:
            traceback.print_exc()
            code = 99
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    rc = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    print(json.dumps({"rc": rc}), flush=True)
"""


class Zygote:
    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", ZYGOTE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT)

    def run(self, argv: list[str], log: Path, env: dict[str, str] | None = None) -> tuple[int, str]:
        """(exit code, negative for a signal; what the run wrote on stdout and stderr)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"argv": argv, "log": str(log), "env": env or {}}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()  # the child's exit; a hung child fails the test's own timeout
        assert line, "the zygote died"
        return json.loads(line)["rc"], log.read_text()

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(30)


@pytest.fixture(scope="module")
def zygote():
    z = Zygote()
    yield z
    z.close()


def _sent(fleet: FaultFleet) -> list[tuple[int, str]]:
    return [(c.meta.generation, c.meta.decision_id) for c in fleet.control.autoscaler.calls]


@pytest.mark.parametrize("phase", PHASES)
def test_sigkill_at_a_phase_loses_nothing_and_applies_nothing_twice(tmp_path, zygote, phase):
    with FaultFleet({"a": (4, 4.0), "b": (2, 6.0)}, seed=5) as fleet:
        state = tmp_path / "state"
        config = _write_config(tmp_path / "governor.yaml", fleet, state)
        with StateStore(state / "governor.db") as store:  # what an operator left before the crash
            store.advance_generation_to(41)
            store.add_override("min_replicas", ttl_s=3600, author="oncall", now_s=time.time(), value=3, pool="a",
                               known_pools=["a", "b"], reason="launch day")
            store.set_mode("active", author="oncall", now_s=time.time(), reason="go")
            audit_before = [(e.author, e.action, e.detail) for e in store.list_audit(100)]
        fleet.advance(3.0)
        rc, out = zygote.run(["run", "--config", str(config), "--once", "--headless"], tmp_path / "run.log",
                             {"GOVERNOR_FAULT_KILL_AT": phase})
        assert rc == -signal.SIGKILL, (rc, out[-2000:])
        assert f"SIGKILL at phase {phase}" in out
        sent_before = _sent(fleet)
        if phase in ("read", "step", "persist"):
            assert sent_before == []  # killed before the send
        else:
            assert sent_before and sent_before[-1][0] == 42

        # restart on the same state directory (as `governor run` builds it) and tick once
        fleet.advance(3.0)
        with Governed(fleet, state, start_s=time.time(), tick_s=3.0) as g:
            store = g.services.store
            assert store.peek_generation() >= 41
            assert [o.kind for o in store.active_overrides(g.clock.now_s())] == ["min_replicas"]
            audit_after = [(e.author, e.action, e.detail) for e in store.list_audit(100)]
            assert all(e in audit_after for e in audit_before)
            assert g.daemon.mode.value == "active"
            rep = g.tick()
        assert rep.outcome.status == "applied"
        sent = _sent(fleet)
        gens = [gen for gen, _ in sent]
        assert gens == sorted(gens) and len(set(gens)) == len(gens), sent  # nothing sent twice, never backwards
        assert all(did == f"d-{gen:08d}" for gen, did in sent)
        assert rep.result.decision.generation > max([41, *gens[:-1]])
        assert fleet.control.autoscaler.gate.applied_generation == rep.result.decision.generation
        assert rep.result.decision.pools["a"].replicas >= 3  # the floor survived the crash


def _status(port: int) -> policy_pb2.Status:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        return policy_pb2_grpc.PolicyServiceStub(ch).GetStatus(policy_pb2.GetStatusRequest(), timeout=2)


def _wait(what: str, check, deadline_s: float = 20.0):
    end = time.monotonic() + deadline_s
    last = None
    while time.monotonic() < end:
        try:
            last = check()
        except grpc.RpcError as exc:
            last = exc
        if last is True or (last and not isinstance(last, grpc.RpcError | bool)):
            return last
        time.sleep(0.05)  # polling a condition with a deadline, not a fixed wait
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


def test_sighup_keeps_the_running_config_on_a_bad_file_and_adds_a_new_pool(tmp_path):
    """`governor run` in this process (its own signal handlers): SIGHUP with a broken file is rejected whole
    and reported in status; SIGHUP with a third pool makes it governed, with telemetry, from the next ticks."""
    port = _free_port()
    with FaultFleet({"a": (3, 4.0), "b": (2, 4.0), "c": (2, 4.0)}, seed=6) as fleet:
        config = _write_config(tmp_path / "governor.yaml", fleet, tmp_path / "state", pools=("a", "b"),
                               tick_s=1.0, api_port=port)
        good = config.read_text()
        errors: list[BaseException] = []

        def plant() -> None:  # the fleet moves in wall time here: the daemon runs on the wall clock
            while not stop.is_set():
                fleet.advance(0.25)
                stop.wait(0.25)

        def operator() -> None:
            try:
                _wait("the first tick", lambda: _status(port).last_decision_id != "")
                config.write_text(good.replace("tick_interval_s: 1.0", "tick_interval_s: -5"))
                os.kill(os.getpid(), signal.SIGHUP)
                st = _wait("the failed reload in status", lambda: next(
                    (d.value for d in _status(port).details if d.name == "config.reload"), None))
                assert st.startswith("failed, running config kept") and "tick_interval_s" in st, st
                assert [p.pool for p in _status(port).pools] == ["a", "b"]
                data = yaml.safe_load(good)
                data["pools"].append({**data["pools"][0], "name": "c"})
                config.write_text(yaml.safe_dump(data))
                os.kill(os.getpid(), signal.SIGHUP)
                _wait("pool c governed with its telemetry ok", lambda: any(
                    p.pool == "c" and p.telemetry == "ok" and p.replicas_desired > 0 for p in _status(port).pools))
                st = next(d.value for d in _status(port).details if d.name == "config.reload")
                assert st.startswith("ok") and "'c'" in st, st
            except BaseException as exc:  # noqa: BLE001 - handed to the test thread
                errors.append(exc)
            finally:
                os.kill(os.getpid(), signal.SIGTERM)

        stop = threading.Event()
        threads = [threading.Thread(target=plant, daemon=True), threading.Thread(target=operator, daemon=True)]
        for t in threads:
            t.start()
        try:
            rc = cmd_run(Namespace(config=str(config), demo=False, for_s=40.0, once=False, mode=None, policy=None,
                                   headless=True, dataplane=None))
        finally:
            stop.set()
            for t in threads:
                t.join(10)
        if errors:
            raise errors[0]
        assert rc == 0


def test_a_reload_with_a_new_pool_reaches_the_telemetry_and_the_learning(tmp_path):
    with FaultFleet({"a": (3, 4.0), "c": (2, 4.0)}, seed=8) as fleet:
        config = _write_config(tmp_path / "two.yaml", fleet, tmp_path / "state", pools=("a", "c"))
        with Governed(fleet, tmp_path / "state", pools_only=("a",)) as g:
            rep = g.tick()
            assert set(rep.result.decision.pools) == {"a"}
            assert any("'c' is not configured" in e for e in rep.observation.errors)
            physics, controller = reloaded_parts(reload_settings(str(config), None), g.daemon.learning)
            g.daemon.reload(controller, physics)
            assert g.daemon.source.pools == ("a", "c")
            learning = g.daemon.learning
            assert set(learning.tracker.physics_by_pool) == {"a", "c"}
            assert set(learning.job.physics_by_pool) == {"a", "c"}
            assert len(learning.slot.get().coupling.physics) == 2
            g.tick()
            rep = g.tick()
            assert set(rep.result.decision.pools) == {"a", "c"}
            assert rep.result.telemetry["c"] == "ok"
            assert not any("not configured" in e for e in rep.observation.errors)


@pytest.mark.parametrize("fault", ["read-only", "full"])
def test_a_state_store_that_refuses_writes_stops_the_send_not_the_daemon(tmp_path, fault):
    with FaultFleet({"a": (3, 4.0)}, seed=9) as fleet:
        fleet.advance(3.0)
        with Governed(fleet, tmp_path / "state", tick_s=3.0) as g:
            store = g.services.store
            store.add_override("min_replicas", ttl_s=3600, author="oncall", now_s=g.clock.now_s(), value=2, pool="a",
                               known_pools=["a"])
            g.tick()
            g.tick()
            gen_before = store.peek_generation()
            sent_before = len(fleet.control.autoscaler.calls)
            conn = store._conn
            if fault == "read-only":
                conn.execute("PRAGMA query_only = ON")  # every write: "attempt to write a readonly database"
            else:
                pages = conn.execute("PRAGMA page_count").fetchone()[0]
                conn.execute(f"PRAGMA max_page_count = {pages}")  # no page can be added: SQLITE_FULL
                for _ in range(50):  # fill the free pages, so the next write needs a new one
                    try:
                        store.record_decision({"decision_id": f"pad-{_}", "generation": 0, "at_s": 0.0,
                                               "mode": "active", "summary": "x" * 4000})
                    except Exception:  # noqa: BLE001 - the store is full: that is the point
                        break
            for _ in range(2):
                rep = g.tick()  # never raises: the daemon keeps ticking
                status = g.daemon.status()
                comp = next(c for c in status.components if c.name == "state:store")
                if fault == "read-only":
                    assert rep.outcome.status == "failed" and "cannot persist generation" in rep.outcome.detail
                    assert not comp.healthy and "readonly" in comp.detail
                else:  # the generation is updated in place (no new page): persisted, so sent; the record is not
                    assert rep.outcome.status == "applied"
                    assert not comp.healthy and comp.detail.startswith("decision record") and "full" in comp.detail
            assert sum(v or 0.0 for v in (g.metric("governor_state_store_errors_total", {"write": w})
                                          for w in ("generation", "decision record", "override expiry"))) >= 2
            if fault == "read-only":
                assert len(fleet.control.autoscaler.calls) == sent_before  # nothing sent it could not persist
            conn.execute("PRAGMA query_only = OFF")
            conn.execute("PRAGMA max_page_count = 1073741823")
            rep = g.tick()
            assert rep.outcome.status == "applied"
            assert next(c for c in g.daemon.status().components if c.name == "state:store").healthy
            assert store.peek_generation() >= rep.result.decision.generation > gen_before
            gens = [c.meta.generation for c in fleet.control.autoscaler.calls]
            assert gens == sorted(gens) and len(set(gens)) == len(gens)
            assert [o.kind for o in store.active_overrides(g.clock.now_s())] == ["min_replicas"]


def test_start_up_refuses_a_state_directory_it_cannot_use(tmp_path, zygote):
    with FaultFleet({"a": (2, 4.0)}, seed=1) as fleet:
        blocker = tmp_path / "not-a-dir"
        blocker.write_text("a file where the state directory should be")
        settings = fault_settings(fleet, blocker)
        with pytest.raises(OSError):
            build_services(settings, clock=VirtualClock(NOW), logger=logging.getLogger("test"))
        config = _write_config(tmp_path / "governor.yaml", fleet, blocker)
        rc, out = zygote.run(["run", "--config", str(config), "--once", "--headless"], tmp_path / "run.log")
        assert rc == 2, out[-2000:]
        assert "not-a-dir" in out and "Traceback" not in out
