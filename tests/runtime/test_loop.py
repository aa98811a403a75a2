"""The tick loop: one tick at a time, an overrun skips (not stacks) the next, stop() ends it after the tick."""

from __future__ import annotations

import logging
import threading

from controller.runtime.loop import TickLoop
from tests.fixtures.prometheus import wait_until


def test_overrunning_tick_is_skipped_not_stacked_and_stop_waits_for_it():
    release = threading.Event()
    running = threading.Semaphore(0)
    state = {"ticks": 0, "concurrent": 0, "max_concurrent": 0, "skipped": 0, "finished": 0}
    lock = threading.Lock()

    def tick():
        with lock:
            state["ticks"] += 1
            state["concurrent"] += 1
            state["max_concurrent"] = max(state["max_concurrent"], state["concurrent"])
        running.release()
        release.wait(10)  # the first tick overruns until released
        with lock:
            state["concurrent"] -= 1
            state["finished"] += 1

    def skipped():
        with lock:
            state["skipped"] += 1

    loop = TickLoop(tick, interval_s=0.05, logger=logging.getLogger("test"), on_skipped=skipped)
    t = threading.Thread(target=loop.run, kwargs={"install_signals": False})
    t.start()
    assert running.acquire(timeout=10)
    wait_until(lambda: state["skipped"] >= 2, deadline_s=10, what="skipped ticks while the first overruns")
    loop.stop()
    release.set()
    t.join(10)
    assert not t.is_alive()
    assert state["max_concurrent"] == 1
    assert state["finished"] == state["ticks"]  # the running tick was allowed to finish


def test_errors_are_reported_and_the_loop_keeps_ticking():
    calls = []
    errors: list[BaseException] = []

    def tick():
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("boom")

    loop = TickLoop(tick, interval_s=0.02, logger=logging.getLogger("test"), on_error=errors.append)
    t = threading.Thread(target=loop.run, kwargs={"install_signals": False})
    t.start()
    wait_until(lambda: len(calls) >= 3, deadline_s=10, what="ticks after an error")
    loop.stop()
    t.join(10)
    assert isinstance(errors[0], RuntimeError)


def test_stop_after_bounds_the_run():
    calls = []
    loop = TickLoop(lambda: calls.append(1), interval_s=0.05, logger=logging.getLogger("test"))
    loop.run(stop_after_s=0.3, install_signals=False)
    assert calls  # the first tick runs at once


def test_the_daemons_loop_freezes_the_heap_once_after_its_first_completed_tick(monkeypatch):
    """`freeze_heap`: after the first completed tick (not a failed one), collect then freeze once
    (the collector itself is replaced here: freezing the test process's heap would outlive the test)."""
    import controller.runtime.loop as loop_module

    events: list[str] = []

    class _Gc:
        @staticmethod
        def collect() -> int:
            events.append("collect")
            return 0

        @staticmethod
        def freeze() -> None:
            events.append("freeze")

    monkeypatch.setattr(loop_module, "gc", _Gc)

    def tick():
        events.append("tick")
        if events.count("tick") == 1:
            raise RuntimeError("the first tick fails")

    loop = TickLoop(tick, interval_s=0.02, logger=logging.getLogger("test"), on_error=lambda e: None,
                    freeze_heap=True)
    t = threading.Thread(target=loop.run, kwargs={"install_signals": False})
    t.start()
    wait_until(lambda: events.count("tick") >= 4, deadline_s=10, what="ticks after the heap was frozen")
    loop.stop()
    t.join(10)
    assert events[:4] == ["tick", "tick", "collect", "freeze"] and events.count("freeze") == 1
