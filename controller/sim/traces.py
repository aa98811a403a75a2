"""Request traces for the simulator: read a trace file, then window, compress, scale and shape it.

Role: turn a scenario's `trace:` section into a `Trace` (arrival times and token counts, plus
prefix-block ids when known). Every random choice uses the `numpy.random.Generator` passed in,
so a seed gives the same trace. This module must not simulate anything, read the wall clock or
keep state between calls; bad files raise `TraceError` naming the file, the line and the field.

Formats (`trace.format: auto` picks one from the header or the first record):

- Azure LLM inference 2023 CSV: `TIMESTAMP,ContextTokens,GeneratedTokens`, absolute timestamps
  (`2023-11-16 18:15:46.6805900`) → seconds from the first request.
- Mooncake JSONL: `timestamp` (ms from the trace start), `input_length`, `output_length`,
  `hash_ids` (ids of 512-token prompt blocks; an id names the whole prefix up to its block).
- ServeGen 14-day rates CSV: one row per 600 s window with, per model tier, the summed client
  rate, the rate-weighted coefficient of variation (CV) of inter-arrival times and the active
  clients. `servegen_arrivals` turns it into requests (see there).
- Generic JSONL: one object per line, `{"arrival_s": 0.25, "prompt_tokens": 812,
  "output_tokens": 64, "hash_ids": [7, 8]}` (`hash_ids` optional, all-or-none).
- Generic CSV: header `arrival_s,prompt_tokens,output_tokens` (any column order).

Transforms, applied in this order by `load_trace`:
  1. window: keep arrivals in [start_s, start_s + duration_s) (trace seconds), shift to 0;
  2. time_scale: arrival_s /= time_scale (24 turns a day into an hour, and multiplies the rate by 24);
  3. rate_scale: < 1 keeps each request with that probability; > 1 adds copies (see `scale_rate`);
  4. surge: extra copies so the rate is multiplied by a ramped factor for a while (`add_surge`);
  5. mix shift: resample (prompt, output) pairs so the length mix moves over time (`mix_shift`);
  6. synthetic prefixes, only for traces without their own hash ids (`add_synthetic_prefixes`).

Block-id invariant: when `block_hashes` is not None, request i has exactly
ceil(prompt_tokens[i] / hash_block_tokens) ids (a generic trace with fewer gets fresh unique ids
appended; more is an error). Equal ids mean equal prefix content up to and including that block.

Modules: trace_types (Trace, TraceError, shared helpers), trace_csv (Azure, generic CSV),
trace_jsonl (Mooncake, generic JSONL), trace_servegen (rates and arrivals), trace_transforms
(the transforms listed above); this one picks the format and applies the transforms.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

from controller.sim.scenario import ServeGenSpec, TraceSpec
from controller.sim.trace_csv import AZURE_COLUMNS, GENERIC_COLUMNS, read_azure, read_generic_csv
from controller.sim.trace_jsonl import read_jsonl
from controller.sim.trace_servegen import read_servegen_rates, servegen_arrivals
from controller.sim.trace_transforms import add_surge, add_synthetic_prefixes, compress, mix_shift, scale_rate, window
from controller.sim.trace_types import MOONCAKE_BLOCK_TOKENS, Trace, TraceError


def load_trace(spec: TraceSpec, base_dir: Path, rng: np.random.Generator) -> Trace:
    """Read the file `spec.path` (relative to `base_dir`) and apply the spec's transforms, seeded by `rng`."""
    path = Path(spec.path)
    if not path.is_absolute():
        path = Path(base_dir) / path
    fmt = spec.format if spec.format != "auto" else detect_format(path)
    if spec.servegen is not None and fmt != "servegen":
        raise TraceError(f"{path}: trace.servegen is set but the file is a {fmt!r} trace, not ServeGen rates")
    if fmt == "mooncake" and spec.hash_block_tokens != MOONCAKE_BLOCK_TOKENS:
        raise TraceError(
            f"{path}: trace.hash_block_tokens: Mooncake hash_ids cover {MOONCAKE_BLOCK_TOKENS}-token blocks "
            f"(got {spec.hash_block_tokens})"
        )
    trace = read_trace_file(path, fmt, hash_block_tokens=spec.hash_block_tokens, servegen=spec.servegen, rng=rng)
    if spec.prefixes is not None and trace.block_hashes is not None:
        raise TraceError(f"{path}: trace.prefixes: the trace has its own hash_ids; remove the prefixes section")
    trace = window(trace, spec.start_s, spec.duration_s, source=str(path))
    trace = compress(trace, spec.time_scale)
    trace = scale_rate(trace, spec.rate_scale, rng, source=str(path))
    if spec.surge is not None:
        trace = add_surge(trace, spec.surge, rng)
    if spec.mix_shift is not None:
        trace = mix_shift(trace, spec.mix_shift, rng, source=str(path))
    if spec.prefixes is not None:
        trace = add_synthetic_prefixes(trace, spec.prefixes, rng, source=str(path))
    return trace


def detect_format(path: Path) -> str:
    """Pick the format from the file's first line: header for CSV, keys of the first record for JSONL."""
    first = _first_line(path)
    if first.lstrip().startswith("{"):
        try:
            rec = json.loads(first)
        except json.JSONDecodeError as exc:
            raise TraceError(f"{path}:1: not valid JSON: {exc.msg}") from None
        if isinstance(rec, dict) and "input_length" in rec:
            return "mooncake"
        if isinstance(rec, dict) and "arrival_s" in rec:
            return "jsonl"
        raise TraceError(
            f"{path}:1: unknown JSONL trace: expected Mooncake keys (timestamp, input_length, output_length, "
            f"hash_ids) or generic keys ({', '.join(GENERIC_COLUMNS)}[, hash_ids])"
        )
    header = [h.strip() for h in next(csv.reader([first]), [])]
    if tuple(header) == AZURE_COLUMNS:
        return "azure"
    if header and header[0] == "window_start_s":
        return "servegen"
    if set(header) == set(GENERIC_COLUMNS):
        return "csv"
    raise TraceError(
        f"{path}:1: unknown CSV trace header {first.strip()!r}: expected {','.join(AZURE_COLUMNS)} (Azure 2023), "
        f"window_start_s,... (ServeGen rates) or {','.join(GENERIC_COLUMNS)} (generic)"
    )


def read_trace_file(
    path: Path,
    fmt: str,
    *,
    hash_block_tokens: int = MOONCAKE_BLOCK_TOKENS,
    servegen: ServeGenSpec | None = None,
    rng: np.random.Generator | None = None,
) -> Trace:
    """Read one file in format `fmt` without transforms (ServeGen needs `rng` to draw arrivals)."""
    path = Path(path)
    if fmt == "azure":
        return read_azure(path)
    if fmt == "mooncake":
        return read_jsonl(path, mooncake=True, hash_block_tokens=MOONCAKE_BLOCK_TOKENS)
    if fmt == "jsonl":
        return read_jsonl(path, mooncake=False, hash_block_tokens=hash_block_tokens)
    if fmt == "csv":
        return read_generic_csv(path)
    if fmt == "servegen":
        if rng is None:
            raise ValueError("read_trace_file: a ServeGen rates file needs rng to draw arrivals")
        return servegen_arrivals(read_servegen_rates(path), servegen or ServeGenSpec(), rng, name=path.stem)
    raise TraceError(f"{path}: trace.format: unknown format {fmt!r}; allowed: azure, mooncake, servegen, jsonl, csv")


def save_trace(trace: Trace, path: Path) -> None:
    """Write a trace in the generic JSONL format (reads back with format jsonl)."""
    with Path(path).open("w") as f:
        for i in range(len(trace)):
            rec: dict[str, object] = {
                "arrival_s": float(trace.arrival_s[i]),
                "prompt_tokens": int(trace.prompt_tokens[i]),
                "output_tokens": int(trace.output_tokens[i]),
            }
            if trace.block_hashes is not None:
                rec["hash_ids"] = list(trace.block_hashes[i])
            f.write(json.dumps(rec) + "\n")


def _first_line(path: Path) -> str:
    try:
        with path.open(encoding="utf-8-sig") as f:
            for line in f:
                if line.strip():
                    return line
    except FileNotFoundError:
        raise TraceError(f"{path}: trace file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"{path}: cannot read trace: {exc}") from None
    raise TraceError(f"{path}: empty trace (no lines)")
