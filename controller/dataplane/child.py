"""A `governor` subcommand run as a child process that announces itself with one JSON line.

`governor sim`, `governor picker` print {"event": "listening", ...} as their first stdout line;
`governor replay` prints its summary as its last. The bench and the demo run the parts of the data
plane as separate processes (so that none competes for another's GIL) through `GovernorChild`.

Must not: outlive `stop()` (terminate, then kill after a grace period) or detach from its parent.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys

from controller.paths import PROJECT_ROOT


class GovernorChild:
    """`python -m controller ARGS...` with stdout piped; `info` is its first JSON line if `wait_listening`."""

    def __init__(self, args: list[str], *, wait_listening: bool = True) -> None:
        self.args = args
        self.proc = subprocess.Popen([sys.executable, "-m", "controller", *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, cwd=PROJECT_ROOT,
                                     text=True)
        self.info: dict = {}
        if wait_listening:
            assert self.proc.stdout is not None
            line = self.proc.stdout.readline()  # the child prints it as soon as it listens
            if not line:
                self.stop()
                raise RuntimeError(f"governor {args[0]} exited before listening (code {self.proc.poll()})")
            self.info = json.loads(line)

    def last_json(self, timeout_s: float = 30.0) -> dict | None:
        """Ask the child to finish (SIGINT), wait for it and return its last JSON stdout line."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            out, _ = self.proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.stop()
            return None
        lines = [ln for ln in (out or "").splitlines() if ln.startswith("{")]
        return json.loads(lines[-1]) if lines else None

    def stop(self, grace_s: float = 10.0) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
