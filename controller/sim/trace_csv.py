"""CSV trace readers: Azure LLM inference 2023 (`TIMESTAMP,ContextTokens,GeneratedTokens`) and the
generic `arrival_s,prompt_tokens,output_tokens` CSV, plus the row and column parsers the ServeGen
rates reader uses too.

Every error names the file, the 1-based line and the field. Must not: transform a trace (window,
scale: trace_transforms) or guess a file's format (traces.detect_format).
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from controller.sim.trace_types import MOONCAKE_BLOCK_TOKENS, Trace, TraceError, open_text, sorted_trace

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
GENERIC_COLUMNS = ("arrival_s", "prompt_tokens", "output_tokens")


def read_csv_rows(path: Path, expected: Sequence[str] | None) -> tuple[list[str], list[list[str]], list[int]]:
    """Header, non-blank rows and their 1-based line numbers. Checks every row has the header's width."""
    with open_text(path) as f:
        reader = csv.reader(f)
        header = next(reader, None)
        while header is not None and not any(h.strip() for h in header):
            header = next(reader, None)
        if header is None:
            raise TraceError(f"{path}: empty trace (no header)")
        header = [h.strip() for h in header]
        if expected is not None and tuple(header) != tuple(expected):
            raise TraceError(f"{path}:{reader.line_num}: header: expected {','.join(expected)}, got {','.join(header)}")
        rows: list[list[str]] = []
        lines: list[int] = []
        width = len(header)
        for row in reader:
            if not row or (len(row) == 1 and not row[0].strip()):
                continue
            if len(row) != width:
                raise TraceError(
                    f"{path}:{reader.line_num}: expected {width} fields ({','.join(header)}), got {len(row)}"
                )
            rows.append(row)
            lines.append(reader.line_num)
    if not rows:
        raise TraceError(f"{path}: empty trace (a header but no requests)")
    return header, rows, lines


def int_column(values: list[str], lines: list[int], path: Path, field: str, minimum: int = 1) -> np.ndarray:
    try:
        arr = np.array(values).astype(np.int64)
    except (ValueError, OverflowError):
        for v, ln in zip(values, lines, strict=True):
            try:
                int(v)
            except ValueError:
                raise TraceError(f"{path}:{ln}: {field}: not an integer ({v!r})") from None
        arr = np.array([int(v) for v in values], dtype=np.int64)
    bad = np.flatnonzero(arr < minimum)
    if bad.size:
        i = int(bad[0])
        raise TraceError(f"{path}:{lines[i]}: {field}: must be an integer >= {minimum} (got {int(arr[i])})")
    return arr


def float_column(values: list[str], lines: list[int], path: Path, field: str) -> np.ndarray:
    try:
        arr = np.array(values).astype(np.float64)
    except ValueError:
        for v, ln in zip(values, lines, strict=True):
            try:
                float(v)
            except ValueError:
                raise TraceError(f"{path}:{ln}: {field}: not a number ({v!r})") from None
        arr = np.array([float(v) for v in values], dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(arr) | (arr < 0))
    if bad.size:
        i = int(bad[0])
        raise TraceError(f"{path}:{lines[i]}: {field}: must be a finite number >= 0 (got {values[i].strip()!r})")
    return arr


def read_azure(path: Path) -> Trace:
    _, rows, lines = read_csv_rows(path, AZURE_COLUMNS)
    stamps = [r[0].strip() for r in rows]
    try:
        t_ns = np.array(stamps, dtype="datetime64[ns]")
    except ValueError:
        t_ns = None
    if t_ns is None or np.isnat(t_ns).any():
        for s, ln in zip(stamps, lines, strict=True):
            try:
                if np.isnat(np.datetime64(s, "ns")):
                    raise ValueError
            except ValueError:
                raise TraceError(
                    f"{path}:{ln}: TIMESTAMP: not a timestamp like 2023-11-16 18:15:46.6805900 ({s!r})"
                ) from None
        raise TraceError(f"{path}: TIMESTAMP: cannot parse the timestamps")
    ns = t_ns.astype(np.int64)
    arrival_s = (ns - ns.min()) / 1e9  # ns integers first: float64 of epoch-ns would lose sub-µs digits
    prompt = int_column([r[1] for r in rows], lines, path, "ContextTokens")
    output = int_column([r[2] for r in rows], lines, path, "GeneratedTokens")
    return sorted_trace(path.stem, arrival_s, prompt, output, None, MOONCAKE_BLOCK_TOKENS)


def read_generic_csv(path: Path) -> Trace:
    header, rows, lines = read_csv_rows(path, None)
    unknown = [h for h in header if h not in GENERIC_COLUMNS]
    missing = [c for c in GENERIC_COLUMNS if c not in header]
    if unknown or missing or len(set(header)) != len(header):
        raise TraceError(
            f"{path}:1: header: need exactly the columns {','.join(GENERIC_COLUMNS)} (any order); "
            f"unknown {unknown}, missing {missing}"
        )
    col = {h: i for i, h in enumerate(header)}
    arrival = float_column([r[col["arrival_s"]] for r in rows], lines, path, "arrival_s")
    prompt = int_column([r[col["prompt_tokens"]] for r in rows], lines, path, "prompt_tokens")
    output = int_column([r[col["output_tokens"]] for r in rows], lines, path, "output_tokens")
    return sorted_trace(path.stem, arrival, prompt, output, None, MOONCAKE_BLOCK_TOKENS)
