"""Clock: the only module outside the simulator's event loop that reads the wall clock.

Edges hold a Clock; the pure core receives `now_s` as a value. WallClock is for
production, VirtualClock for replay and tests (time moves only when told to).
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    def now_s(self) -> float:
        """Seconds since the Unix epoch (wall) or since the start of a replay (virtual)."""
        ...

    def monotonic_s(self) -> float:
        """A clock that never goes backwards, for measuring durations."""
        ...

    def sleep(self, seconds: float) -> None: ...


class WallClock:
    def now_s(self) -> float:
        return time.time()

    def monotonic_s(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


class VirtualClock:
    """Time that only moves when `advance` (or `sleep`) is called. Thread-safe."""

    def __init__(self, start_s: float = 0.0) -> None:
        self._now_s = float(start_s)
        self._lock = threading.Lock()

    def now_s(self) -> float:
        with self._lock:
            return self._now_s

    def monotonic_s(self) -> float:
        return self.now_s()

    def advance(self, seconds: float) -> float:
        if seconds < 0:
            raise ValueError(f"cannot move a clock backwards (advance by {seconds})")
        with self._lock:
            self._now_s += seconds
            return self._now_s

    def sleep(self, seconds: float) -> None:
        self.advance(max(0.0, seconds))
