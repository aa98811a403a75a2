"""Structured logs: JSON lines (or plain text) on stderr, one line per tick.

The tick line carries: event="tick", decision_id, generation, mode, summary,
per-pool replicas and telemetry status, reason codes, guardrail codes, outcome
and the duration of each phase (read, step, actuate) in milliseconds.
docs/OPERATING.md lists every field.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

RESERVED = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        out.update({k: v for k, v in record.__dict__.items() if k not in RESERVED and not k.startswith("_")})
        if record.exc_info:
            out["error"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, separators=(",", ":"))


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        extra = {k: v for k, v in record.__dict__.items() if k not in RESERVED and not k.startswith("_")}
        stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
        tail = " ".join(f"{k}={json.dumps(v, default=str) if not isinstance(v, str) else v}" for k, v in extra.items())
        return f"{stamp} {record.levelname:<7} {record.getMessage()}" + (f" {tail}" if tail else "")


# Libraries and modules that log under their own names. Without a handler their records reach Python's
# last-resort handler and land on stderr as plain text in the middle of the JSON lines; APScheduler (the
# tick loop) is the one that did. Its INFO lines ("Running job ...") come every tick, so it logs WARNING+.
ROUTED_LOGGERS: tuple[tuple[str, str | None], ...] = (("controller", None), ("apscheduler", "WARNING"))


def setup_logging(level: str = "info", fmt: str = "json", stream=None) -> logging.Logger:
    """Configure the `governor` logger (not the root logger) and return it; ROUTED_LOGGERS write through
    the same handler and format."""
    logger = logging.getLogger("governor")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    for name, floor in (("governor", None), *ROUTED_LOGGERS):
        lg = logging.getLogger(name)
        lg.handlers.clear()
        lg.addHandler(handler)
        lg.setLevel(max(logging.getLevelName(level.upper()), logging.getLevelName(floor)) if floor else level.upper())
        lg.propagate = False
    return logger
