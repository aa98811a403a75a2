"""sd_notify: the datagrams systemd would get, on a Unix datagram socket the test owns.

The loop-level tests drive TickLoop with a tick the test controls (a hung tick is an Event that is
not set); the end-to-end test starts `governor run --demo --headless` with NOTIFY_SOCKET set.
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
import uuid
from pathlib import Path

import pytest

from controller.runtime.loop import TickLoop
from controller.runtime.systemd import SystemdNotifier
from tests.fixtures.prometheus import wait_until


class NotifySocket:
    """A bound AF_UNIX datagram socket collecting every message (a dict of its assignments)."""

    def __init__(self, address: str) -> None:
        self.env_value = address
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(b"\0" + address[1:].encode() if address.startswith("@") else address)
        self.sock.settimeout(0.2)
        self.messages: list[dict[str, str]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._recv, daemon=True)
        self._thread.start()

    def _recv(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            fields = dict(line.split("=", 1) for line in data.decode().split("\n") if line)
            with self._lock:
                self.messages.append(fields)

    def snapshot(self) -> list[dict[str, str]]:
        with self._lock:
            return list(self.messages)

    def count(self, key: str) -> int:
        return sum(1 for m in self.snapshot() if key in m)

    def mark(self) -> None:
        """Send a marker and wait for it: whatever was sent to the socket before has been received."""
        n = self.count("MARK") + 1
        sender = SystemdNotifier({"NOTIFY_SOCKET": self.env_value})
        try:
            assert sender.notify(MARK=n)
        finally:
            sender.close()
        wait_until(lambda: self.count("MARK") == n, deadline_s=10, what=f"marker {n}")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


@pytest.fixture
def notify_socket(tmp_path):
    s = NotifySocket(str(tmp_path / "notify.sock"))
    yield s
    s.close()


def test_notifier_speaks_the_datagram_protocol_on_a_path_and_the_abstract_namespace(notify_socket):
    n = SystemdNotifier({"NOTIFY_SOCKET": notify_socket.env_value})
    assert n.ready("first\nline") and n.watchdog() and n.reloading() and n.stopping()
    wait_until(lambda: len(notify_socket.snapshot()) == 4, deadline_s=5, what="four datagrams")
    ready, watchdog, reloading, stopping = notify_socket.snapshot()
    assert ready == {"READY": "1", "STATUS": "first line"}  # a newline would start a new assignment
    assert watchdog == {"WATCHDOG": "1"}
    assert reloading["RELOADING"] == "1" and int(reloading["MONOTONIC_USEC"]) > 0
    assert stopping == {"STOPPING": "1"}

    abstract = NotifySocket(f"@governor-test-{uuid.uuid4().hex}")
    try:
        assert SystemdNotifier({"NOTIFY_SOCKET": abstract.env_value}).ready()
        wait_until(lambda: abstract.count("READY") == 1, deadline_s=5, what="READY on the abstract socket")
    finally:
        abstract.close()


def test_notifier_without_systemd_does_nothing_and_rejects_bad_settings():
    assert not SystemdNotifier({}).enabled and not SystemdNotifier({}).ready()
    with pytest.raises(ValueError, match="NOTIFY_SOCKET must be an absolute path"):
        SystemdNotifier({"NOTIFY_SOCKET": "relative.sock"})
    with pytest.raises(ValueError, match="WATCHDOG_USEC"):
        SystemdNotifier({"NOTIFY_SOCKET": "/x", "WATCHDOG_USEC": "2s"})
    n = SystemdNotifier({"NOTIFY_SOCKET": "/x", "WATCHDOG_USEC": "120000000", "WATCHDOG_PID": str(os.getpid())})
    assert n.watchdog_s == 120.0
    assert SystemdNotifier({"NOTIFY_SOCKET": "/x", "WATCHDOG_USEC": "1", "WATCHDOG_PID": "1"}).watchdog_s is None


def test_loop_is_ready_after_the_first_tick_pings_every_tick_and_a_hung_tick_stops_the_pings(notify_socket):
    hang = threading.Event()  # set: the next tick hangs until released
    release = threading.Event()
    hung = threading.Event()
    ticks = {"n": 0, "skipped": 0}

    def tick():
        if hang.is_set():
            hung.set()
            release.wait(30)
        ticks["n"] += 1
        return ticks["n"]

    def skipped():
        ticks["skipped"] += 1

    n = SystemdNotifier({"NOTIFY_SOCKET": notify_socket.env_value})
    loop = TickLoop(tick, interval_s=0.05, logger=logging.getLogger("test"), on_skipped=skipped,
                    notifier=n, status_of=lambda r: f"tick {r}")
    t = threading.Thread(target=loop.run, kwargs={"install_signals": False})
    t.start()
    try:
        wait_until(lambda: notify_socket.count("WATCHDOG") >= 3, deadline_s=10, what="watchdog pings")
        msgs = notify_socket.snapshot()
        assert msgs[0] == {"READY": "1", "STATUS": "tick 1"}  # ready comes first, with the first tick's status
        assert sum(1 for m in msgs if "READY" in m) == 1
        pings = [m for m in msgs if "WATCHDOG" in m]
        assert [m["STATUS"] for m in pings] == [f"tick {i}" for i in range(1, len(pings) + 1)]  # one per tick

        hang.set()
        assert hung.wait(10)
        # A marker through the same socket: every ping sent before the hang is queued ahead of it.
        notify_socket.mark()
        before = notify_socket.count("WATCHDOG")
        # While the tick hangs the scheduler keeps firing (and skipping): many intervals pass, no ping comes.
        skipped_at_hang = ticks["skipped"]
        wait_until(lambda: ticks["skipped"] >= skipped_at_hang + 5, deadline_s=10, what="intervals during the hang")
        notify_socket.mark()
        assert notify_socket.count("WATCHDOG") == before

        hang.clear()
        release.set()
        wait_until(lambda: notify_socket.count("WATCHDOG") >= before + 3, deadline_s=10,
                   what="pings after the hung tick returned")
    finally:
        release.set()
        loop.stop()
        t.join(10)
    assert not t.is_alive()
    notify_socket.mark()
    assert sum(1 for m in notify_socket.snapshot() if m == {"STOPPING": "1"}) == 1


def test_a_failing_tick_sends_no_ping_and_reload_is_bracketed(notify_socket):
    calls = {"n": 0}
    reloads = []

    def tick():
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("tick failed")
        return calls["n"]

    n = SystemdNotifier({"NOTIFY_SOCKET": notify_socket.env_value})
    loop = TickLoop(tick, interval_s=0.05, logger=logging.getLogger("test"), on_error=lambda e: None,
                    notifier=n, status_of=str)
    t = threading.Thread(target=loop.run, kwargs={"install_signals": False})
    t.start()
    try:
        wait_until(lambda: calls["n"] >= 4, deadline_s=10, what="four ticks")
        loop._reload(lambda: reloads.append(1))  # what the SIGHUP handler calls
        loop._reload(lambda: (_ for _ in ()).throw(ValueError("bad file")))  # a bad reload: still READY after
    finally:
        loop.stop()
        t.join(10)
    notify_socket.mark()
    statuses = [m["STATUS"] for m in notify_socket.snapshot() if "WATCHDOG" in m]
    assert "2" not in statuses and {"1", "3"} <= set(statuses)
    seq = [next(iter(m)) for m in notify_socket.snapshot() if "RELOADING" in m or m == {"READY": "1"}]
    assert seq == ["RELOADING", "READY", "RELOADING", "READY"] and reloads == [1]


@pytest.mark.e2e
def test_daemon_notifies_ready_then_watchdog_per_tick_then_reloading_and_stopping(notify_socket, tmp_path):
    env = {**os.environ, "NOTIFY_SOCKET": notify_socket.env_value, "PYTHONPATH": str(Path.cwd())}
    proc = subprocess.Popen([sys.executable, "-m", "controller", "run", "--demo", "--headless", "--for", "60"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: notify_socket.count("WATCHDOG") >= 2 or proc.poll() is not None, deadline_s=45,
                   what="READY and two watchdog pings from the daemon")
        assert proc.poll() is None, "the daemon exited early"
        proc.send_signal(signal.SIGHUP)
        wait_until(lambda: notify_socket.count("RELOADING") == 1, deadline_s=20, what="RELOADING after SIGHUP")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=40)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-2000:]
    notify_socket.mark()  # everything the daemon sent has been received
    msgs = [m for m in notify_socket.snapshot() if "MARK" not in m]
    assert "READY" in msgs[0] and "mode active: d-" in msgs[0]["STATUS"]  # the first decision, then ready
    logs = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    ticks = [e for e in logs if e.get("event") == "tick"]
    pings = [m for m in msgs if "WATCHDOG" in m]
    assert len(pings) == len(ticks) >= 2  # one ping per completed tick
    assert [p["STATUS"].split()[2] for p in pings] == [t["decision_id"] for t in ticks]
    kinds = [k for m in msgs for k in m if k in ("READY", "RELOADING", "STOPPING")]
    assert kinds == ["READY", "RELOADING", "READY", "STOPPING"]
