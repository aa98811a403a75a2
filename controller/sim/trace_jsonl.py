"""JSONL trace readers: Mooncake (`timestamp` in ms, `input_length`, `output_length`, `hash_ids` of
512-token blocks) and the generic JSONL (`arrival_s`, `prompt_tokens`, `output_tokens`, optional
`hash_ids`).

Every error names the file, the line and the field. Must not: transform a trace or guess a file's
format (traces.detect_format).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from controller.sim.trace_csv import GENERIC_COLUMNS
from controller.sim.trace_types import FreshIds, Trace, TraceError, open_text, sorted_trace


def _json_int(v: object) -> bool:
    return type(v) is int  # bool is an int subclass; true/false are not token counts


def read_jsonl(path: Path, *, mooncake: bool, hash_block_tokens: int) -> Trace:
    """Mooncake (`timestamp` ms, `input_length`, `output_length`, `hash_ids`) or generic JSONL."""
    if mooncake:
        k_time, k_prompt, k_output = "timestamp", "input_length", "output_length"
    else:
        k_time, k_prompt, k_output = GENERIC_COLUMNS
    allowed = {k_time, k_prompt, k_output, "hash_ids"}
    times: list[float] = []
    prompts: list[int] = []
    outputs: list[int] = []
    hashes: list[tuple[int, ...]] = []
    hashes_present: bool | None = None
    first_line = 0
    with open_text(path) as f:
        for ln, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TraceError(f"{path}:{ln}: not valid JSON: {exc.msg} (column {exc.colno})") from None
            if not isinstance(rec, dict):
                raise TraceError(f"{path}:{ln}: a record must be a JSON object, got {type(rec).__name__}")
            if not mooncake:
                extra = sorted(set(rec) - allowed)
                if extra:
                    raise TraceError(f"{path}:{ln}: {extra[0]}: unknown field; allowed: {sorted(allowed)}")
            for key in (k_time, k_prompt, k_output):
                if key not in rec:
                    raise TraceError(f"{path}:{ln}: {key}: missing")
            t = rec[k_time]
            if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
                raise TraceError(f"{path}:{ln}: {k_time}: must be a finite number >= 0 (got {t!r})")
            for key in (k_prompt, k_output):
                v = rec[key]
                if not _json_int(v):
                    raise TraceError(f"{path}:{ln}: {key}: not an integer ({v!r})")
                if v < 1:
                    raise TraceError(f"{path}:{ln}: {key}: must be an integer >= 1 (got {v})")
            has = "hash_ids" in rec
            if hashes_present is None:
                hashes_present, first_line = has, ln
            elif has != hashes_present:
                raise TraceError(
                    f"{path}:{ln}: hash_ids: present on some records and not others "
                    f"(line {first_line} {'has' if hashes_present else 'has none'}); give it on all or none"
                )
            if has:
                ids = rec["hash_ids"]
                if not isinstance(ids, list) or not all(_json_int(h) and h >= 0 for h in ids):
                    raise TraceError(f"{path}:{ln}: hash_ids: must be a list of integers >= 0")
                if len(ids) > -(-rec[k_prompt] // hash_block_tokens):
                    raise TraceError(
                        f"{path}:{ln}: hash_ids: {len(ids)} blocks of {hash_block_tokens} tokens exceed the "
                        f"{rec[k_prompt]}-token prompt"
                    )
                hashes.append(tuple(ids))
            times.append(t)
            prompts.append(rec[k_prompt])
            outputs.append(rec[k_output])
    if not times:
        raise TraceError(f"{path}: empty trace (no records)")
    arrival = np.asarray(times, dtype=np.float64)
    if mooncake:
        arrival = arrival / 1000.0  # ms → s
    prompt = np.asarray(prompts, dtype=np.int64)
    block_hashes = _complete_hashes(hashes, prompt, hash_block_tokens) if hashes_present else None
    output = np.asarray(outputs, dtype=np.int64)
    return sorted_trace(path.stem, arrival, prompt, output, block_hashes, hash_block_tokens)


def _complete_hashes(hashes: list[tuple[int, ...]], prompt: np.ndarray, block_tokens: int) -> list[tuple[int, ...]]:
    """Append fresh unique ids so request i has ceil(prompt_i / block_tokens) ids (Mooncake already does)."""
    need = -(-prompt // block_tokens)
    short = [i for i, h in enumerate(hashes) if len(h) < need[i]]
    if not short:
        return hashes
    fresh = FreshIds(hashes)
    out = list(hashes)
    for i in short:
        out[i] = hashes[i] + fresh.take(int(need[i]) - len(hashes[i]))
    return out
