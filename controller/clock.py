"""Clock: the only module outside the simulator's event loop that reads the wall clock.

Edges hold a Clock; the pure core receives `now_s` as a value. WallClock is for
production, VirtualClock for replay and tests (time moves only when told to).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
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


BUDGET_CLOCKS = ("wall", "cpu")


def budget_timer(kind: str) -> Callable[[], float]:
    """The clock a planner's time budget counts (`policy_params.budget_clock`): "wall", monotonic wall
    time (the tick ends within its budget; on a loaded machine the search gets less done), or "cpu",
    the calling thread's CPU time (the search gets its budget's worth of work whatever else the machine
    runs; the tick may then take longer in wall time)."""
    if kind == "wall":
        return WallClock().monotonic_s
    if kind == "cpu":
        return time.thread_time
    raise ValueError(f"budget_clock must be one of {', '.join(BUDGET_CLOCKS)} (got {kind!r})")


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
