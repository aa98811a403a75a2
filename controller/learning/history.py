"""The daemon's telemetry history: a bounded ring buffer of ObservationRecords, persisted as JSON lines.

`HistoryBuffer.append` is called on the tick path, so it is O(1) plus one short line appended to
`<state_dir>/history.jsonl`; the file is compacted (rewritten atomically with the newest
`capacity` records) once it holds twice as many lines. On start the buffer reloads the newest
`capacity` records from the file; a corrupt line (a crash mid-write) is skipped and counted, not
fatal. The refit job takes a `snapshot()` (a tuple copy) and never holds the lock while fitting.

Must not: fit anything or block on the refit job.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import deque
from pathlib import Path

from controller.core.observations import ObservationRecord
from controller.learning.records import RecordError, dumps, record_from_dict, record_to_dict

HISTORY_FILE = "history.jsonl"
DEFAULT_CAPACITY = 5760  # one day of 15 s ticks


class HistoryBuffer:
    def __init__(self, capacity: int = DEFAULT_CAPACITY, state_dir: str | Path | None = None,
                 logger: logging.Logger | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"HistoryBuffer: capacity must be >= 1 (got {capacity})")
        self.capacity = int(capacity)
        self.path = Path(state_dir) / HISTORY_FILE if state_dir is not None else None
        self.log = logger or logging.getLogger("governor.history")
        self._lock = threading.Lock()
        self._buf: deque[ObservationRecord] = deque(maxlen=self.capacity)
        self._lines_on_disk = 0
        self.skipped_lines = 0
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._load()

    # ------------------------------------------------------------------ persistence

    def _load(self) -> None:
        assert self.path is not None
        if not self.path.exists():
            return
        recs: deque[ObservationRecord] = deque(maxlen=self.capacity)
        lines = 0
        try:
            f = self.path.open()
        except OSError as exc:
            self.log.warning(f"history: cannot read {self.path}: {exc.strerror}; starting empty",
                             extra={"event": "history_unreadable"})
            return
        with f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                lines += 1
                try:
                    recs.append(record_from_dict(json.loads(line), f"{self.path}:{lineno}"))
                except (json.JSONDecodeError, RecordError) as exc:
                    self.skipped_lines += 1
                    self.log.warning(f"history: skipping a bad line: {exc}", extra={"event": "history_bad_line"})
        self._buf = recs
        self._lines_on_disk = lines

    def _compact_locked(self) -> None:
        assert self.path is not None
        tmp = self.path.with_name(self.path.name + ".tmp")
        with tmp.open("w") as f:
            for rec in self._buf:
                f.write(dumps(record_to_dict(rec)) + "\n")
        tmp.replace(self.path)
        self._lines_on_disk = len(self._buf)

    # ------------------------------------------------------------------ API

    def append(self, rec: ObservationRecord) -> None:
        line = dumps(record_to_dict(rec)) + "\n" if self.path is not None else ""
        with self._lock:
            self._buf.append(rec)
            if self.path is None:
                return
            try:
                with self.path.open("a") as f:
                    f.write(line)
                self._lines_on_disk += 1
                if self._lines_on_disk >= 2 * self.capacity:
                    self._compact_locked()
            except OSError as exc:
                self.log.warning(f"history: cannot write {self.path}: {exc.strerror}",
                                 extra={"event": "history_write_failed"})

    def snapshot(self) -> tuple[ObservationRecord, ...]:
        with self._lock:
            return tuple(self._buf)

    def __len__(self) -> int:
        with self._lock:
            return len(self._buf)

    def span_s(self) -> float:
        with self._lock:
            return self._buf[-1].at_s - self._buf[0].at_s if len(self._buf) > 1 else 0.0
