"""The tick loop: APScheduler runs `Daemon.tick` every interval, one at a time.

An overrunning tick is never stacked: APScheduler refuses a second concurrent
run (max_instances=1) and we log it as skipped. SIGTERM/SIGINT let the running
tick finish and then stop; SIGHUP calls the reload callback. `stop_after_s`
bounds the run (the demo's --for).

With a systemd notifier (runtime/systemd.py) the loop tells systemd READY=1 after
the first completed tick, WATCHDOG=1 (and STATUS=, the tick's summary) after every
completed tick, RELOADING=1 … READY=1 around a SIGHUP reload and STOPPING=1 when it
stops. Pings come only from completed ticks, so a hung tick lets the watchdog fire.

With `freeze_heap` (the daemon's), what the process holds after its first completed tick is moved
out of the garbage collector's full passes (`settle_heap`).
"""

from __future__ import annotations

import gc
import logging
import signal
import threading
from collections.abc import Callable
from typing import Any

from apscheduler.events import EVENT_JOB_ERROR, EVENT_JOB_MAX_INSTANCES, EVENT_JOB_MISSED, JobExecutionEvent
from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler

from controller.runtime.systemd import SystemdNotifier


def settle_heap() -> None:
    """Collect, then freeze (`gc.freeze`) what the process holds now: its modules, the planner's compiled
    loops, caches and models, which live as long as it does. CPython's full collection walks every
    tracked object and runs when the survivors of younger collections exceed a quarter of the old
    generation; in a process that has imported numpy, numba, scikit-learn and the like, that walk took
    70-80 ms every 15-20 ticks of the 100-pool planner, landing in whatever the tick was doing (mostly the
    work after the search, which allocates the decisions and reasons): the ticks past the budget at p99
    (`governor bench planner`). Frozen objects are never collected: call it once, after the first tick
    has built what lives for the process's lifetime, not in a loop."""
    gc.collect()
    gc.freeze()


class TickLoop:
    def __init__(self, tick: Callable[[], object], interval_s: float, logger: logging.Logger,
                 on_skipped: Callable[[], None] | None = None,
                 on_error: Callable[[BaseException], None] | None = None,
                 notifier: SystemdNotifier | None = None,
                 status_of: Callable[[object], str] | None = None, freeze_heap: bool = False) -> None:
        if interval_s <= 0:
            raise ValueError(f"tick interval must be > 0 s (got {interval_s})")
        self._tick = tick
        self.interval_s = interval_s
        self.log = logger
        self._on_skipped = on_skipped
        self._on_error = on_error
        self._notifier = notifier
        self._status_of = status_of
        self._ready = False
        self._freeze_heap = freeze_heap  # settle_heap after the first completed tick
        self._stop = threading.Event()
        self._scheduler = BackgroundScheduler(executors={"default": ThreadPoolExecutor(1)},
                                              job_defaults={"max_instances": 1, "coalesce": True,
                                                            "misfire_grace_time": None})
        self._scheduler.add_listener(self._on_event, EVENT_JOB_MAX_INSTANCES | EVENT_JOB_MISSED | EVENT_JOB_ERROR)

    def _on_event(self, event: JobExecutionEvent) -> None:
        if event.code in (EVENT_JOB_MAX_INSTANCES, EVENT_JOB_MISSED):
            self.log.warning("tick skipped: the previous tick is still running", extra={"event": "tick_skipped"})
            if self._on_skipped:
                self._on_skipped()
        elif event.code == EVENT_JOB_ERROR:
            self.log.error(f"tick failed: {event.exception!r}", extra={"event": "tick_error"})
            if self._on_error:
                self._on_error(event.exception)

    def stop(self) -> None:
        self._stop.set()

    def _run_tick(self) -> None:
        result = self._tick()  # an exception reaches the scheduler's EVENT_JOB_ERROR listener: no ping
        if self._freeze_heap:
            self._freeze_heap = False
            settle_heap()
        n = self._notifier
        if n is None:
            return
        status = self._status_of(result) if self._status_of is not None else None
        if not self._ready:
            # the API listens before the loop starts (composition root), so one completed tick is "ready"
            n.ready(status)
            self._ready = True
        n.watchdog(status)

    def _reload(self, reload: Callable[[], None]) -> None:
        if self._notifier is not None:
            self._notifier.reloading()
        try:
            reload()
        except Exception as exc:  # noqa: BLE001 - a bad reload keeps the running config
            self.log.error(f"config reload failed, keeping the running config: {exc}", extra={"event": "reload"})
        finally:
            if self._notifier is not None:
                self._notifier.ready()

    def run(self, *, stop_after_s: float | None = None, reload: Callable[[], None] | None = None,
            install_signals: bool = True) -> None:
        """Block until stopped (signal, stop(), or stop_after_s). The first tick runs at once."""
        previous: dict[signal.Signals, Any] = {}  # signal → the handler it had (a callable, SIG_DFL/SIG_IGN or None)
        if install_signals and threading.current_thread() is threading.main_thread():
            def _term(signum, _frame):
                self.log.info(f"signal {signal.Signals(signum).name}: finishing the current tick and stopping",
                              extra={"event": "shutdown"})
                self._stop.set()

            def _hup(_signum, _frame):
                if reload is not None:
                    self._reload(reload)

            for sig, handler in ((signal.SIGTERM, _term), (signal.SIGINT, _term), (signal.SIGHUP, _hup)):
                previous[sig] = signal.signal(sig, handler)
        self._scheduler.add_job(self._run_tick, "interval", seconds=self.interval_s, id="tick", next_run_time=_now())
        self._scheduler.start()
        try:
            self._stop.wait(timeout=stop_after_s)
        finally:
            if self._notifier is not None:
                self._notifier.stopping()
            self._scheduler.shutdown(wait=True)  # lets a running tick finish
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def _now():
    from datetime import UTC, datetime

    return datetime.now(UTC)
