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


def setup_logging(level: str = "info", fmt: str = "json", stream=None) -> logging.Logger:
    """Configure the `governor` logger (not the root logger) and return it."""
    logger = logging.getLogger("governor")
    logger.handlers.clear()
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    logger.addHandler(handler)
    logger.setLevel(level.upper())
    logger.propagate = False
    return logger
