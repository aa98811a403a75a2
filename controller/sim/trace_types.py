"""What every trace reader and transform shares: the `Trace` record, `TraceError`, opening a file,
sorting requests into arrival order, and fresh block ids.

Must not: know any file format (trace_csv, trace_jsonl, trace_servegen do), draw random numbers, or
keep state between calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import numpy as np

from controller.sim.scenario import ScenarioError

# Tokens per prefix-hash block of Mooncake's hash_ids, and the default for traces without ids.
MOONCAKE_BLOCK_TOKENS = 512


class TraceError(ScenarioError):
    """A trace file is missing or malformed, or a transform cannot apply. Names file, line and field."""


@dataclass(frozen=True)
class Trace:
    """Requests in arrival order. Arrays are read-only; index i is one request everywhere."""

    name: str
    arrival_s: np.ndarray  # float64, ascending, first arrival >= 0 (seconds from trace start)
    prompt_tokens: np.ndarray  # int64 >= 1
    output_tokens: np.ndarray  # int64 >= 1
    block_hashes: tuple[tuple[int, ...], ...] | None  # per request, prefix-block ids; None = unknown
    hash_block_tokens: int  # tokens per hash block (Mooncake: 512)

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        if len(self.prompt_tokens) != n or len(self.output_tokens) != n:
            raise ValueError("Trace: arrival_s, prompt_tokens and output_tokens must have the same length")
        if self.block_hashes is not None and len(self.block_hashes) != n:
            raise ValueError("Trace: block_hashes must have one entry per request")
        for a in (self.arrival_s, self.prompt_tokens, self.output_tokens):
            a.setflags(write=False)

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def duration_s(self) -> float:
        """Time of the last arrival (0 for a one-request trace)."""
        return float(self.arrival_s[-1]) if len(self) else 0.0


def open_text(path: Path) -> TextIO:
    try:
        return path.open(encoding="utf-8-sig", newline="")
    except FileNotFoundError:
        raise TraceError(f"{path}: trace file not found") from None
    except OSError as exc:
        raise TraceError(f"{path}: cannot read trace: {exc.strerror}") from None


def sorted_trace(
    name: str,
    arrival_s: np.ndarray,
    prompt: np.ndarray,
    output: np.ndarray,
    hashes: list[tuple[int, ...]] | None,
    hash_block_tokens: int,
) -> Trace:
    """Sort by arrival (stable: equal times keep file order); out-of-order files are not errors."""
    if np.any(np.diff(arrival_s) < 0):
        order = np.argsort(arrival_s, kind="stable")
        arrival_s, prompt, output = arrival_s[order], prompt[order], output[order]
        if hashes is not None:
            hashes = [hashes[i] for i in order]
    return Trace(
        name=name,
        arrival_s=np.ascontiguousarray(arrival_s, dtype=np.float64),
        prompt_tokens=np.ascontiguousarray(prompt, dtype=np.int64),
        output_tokens=np.ascontiguousarray(output, dtype=np.int64),
        block_hashes=tuple(hashes) if hashes is not None else None,
        hash_block_tokens=hash_block_tokens,
    )


class FreshIds:
    """Hands out block ids above every id already in use."""

    def __init__(self, hashes: Sequence[Sequence[int]]) -> None:
        self._next = 1 + max((max(h) for h in hashes if h), default=-1)

    def next(self) -> int:
        v = self._next
        self._next += 1
        return v

    def take(self, n: int) -> tuple[int, ...]:
        v = self._next
        self._next += n
        return tuple(range(v, v + n))
