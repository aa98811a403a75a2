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
  5. synthetic prefixes, only for traces without their own hash ids (`add_synthetic_prefixes`).

Block-id invariant: when `block_hashes` is not None, request i has exactly
ceil(prompt_tokens[i] / hash_block_tokens) ids (a generic trace with fewer gets fresh unique ids
appended; more is an error). Equal ids mean equal prefix content up to and including that block.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from controller.sim.scenario import ScenarioError, ServeGenSpec, SurgeSpec, SyntheticPrefixSpec, TraceSpec

MOONCAKE_BLOCK_TOKENS = 512
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
GENERIC_COLUMNS = ("arrival_s", "prompt_tokens", "output_tokens")
SERVEGEN_TIERS = ("m-large", "m-mid", "m-small")
SERVEGEN_WINDOW_S = 600.0
SERVEGEN_DAY_S = 86_400.0
SERVEGEN_DAYS = 14

# The per-window CV is clamped to this range before it sets the Gamma shape 1/CV². Below 0.5 the
# arrivals would be nearly a metronome, which no real client mix produces; above 4 the published
# CVs come from windows where a client sent a handful of requests (m-mid reaches 847), and a shape
# of 1/CV² < 1/16 would put a whole window's load into a few instants. For m-small, the default
# diurnal tier, 90% of windows lie below 3.9, so the cap rarely binds there.
SERVEGEN_CV_MIN = 0.5
SERVEGEN_CV_MAX = 4.0
# Step of the grid on which the interpolated ServeGen rate is integrated (seconds of trace time).
_SERVEGEN_GRID_S = 10.0
# Synthetic ServeGen lengths: lognormal around the spec's means with these log-space standard
# deviations (the Azure 2023 conversation trace has 0.99 for prompts and 0.86 for outputs), clipped
# to [1, LENGTH_CLIP_MULT × mean] so a tail draw cannot exceed any model's context.
PROMPT_LOG_SIGMA = 1.0
OUTPUT_LOG_SIGMA = 0.85
LENGTH_CLIP_MULT = 8


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


# --------------------------------------------------------------------------- entry point


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
        return _read_azure(path)
    if fmt == "mooncake":
        return _read_jsonl(path, mooncake=True, hash_block_tokens=MOONCAKE_BLOCK_TOKENS)
    if fmt == "jsonl":
        return _read_jsonl(path, mooncake=False, hash_block_tokens=hash_block_tokens)
    if fmt == "csv":
        return _read_generic_csv(path)
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


# --------------------------------------------------------------------------- readers


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


def _open_text(path: Path):
    try:
        return path.open(encoding="utf-8-sig", newline="")
    except FileNotFoundError:
        raise TraceError(f"{path}: trace file not found") from None
    except OSError as exc:
        raise TraceError(f"{path}: cannot read trace: {exc.strerror}") from None


def _read_csv_rows(path: Path, expected: Sequence[str] | None) -> tuple[list[str], list[list[str]], list[int]]:
    """Header, non-blank rows and their 1-based line numbers. Checks every row has the header's width."""
    with _open_text(path) as f:
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


def _int_column(values: list[str], lines: list[int], path: Path, field: str, minimum: int = 1) -> np.ndarray:
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


def _float_column(values: list[str], lines: list[int], path: Path, field: str) -> np.ndarray:
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


def _sorted_trace(
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


def _read_azure(path: Path) -> Trace:
    _, rows, lines = _read_csv_rows(path, AZURE_COLUMNS)
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
    prompt = _int_column([r[1] for r in rows], lines, path, "ContextTokens")
    output = _int_column([r[2] for r in rows], lines, path, "GeneratedTokens")
    return _sorted_trace(path.stem, arrival_s, prompt, output, None, MOONCAKE_BLOCK_TOKENS)


def _read_generic_csv(path: Path) -> Trace:
    header, rows, lines = _read_csv_rows(path, None)
    unknown = [h for h in header if h not in GENERIC_COLUMNS]
    missing = [c for c in GENERIC_COLUMNS if c not in header]
    if unknown or missing or len(set(header)) != len(header):
        raise TraceError(
            f"{path}:1: header: need exactly the columns {','.join(GENERIC_COLUMNS)} (any order); "
            f"unknown {unknown}, missing {missing}"
        )
    col = {h: i for i, h in enumerate(header)}
    arrival = _float_column([r[col["arrival_s"]] for r in rows], lines, path, "arrival_s")
    prompt = _int_column([r[col["prompt_tokens"]] for r in rows], lines, path, "prompt_tokens")
    output = _int_column([r[col["output_tokens"]] for r in rows], lines, path, "output_tokens")
    return _sorted_trace(path.stem, arrival, prompt, output, None, MOONCAKE_BLOCK_TOKENS)


def _json_int(v: object) -> bool:
    return type(v) is int  # bool is an int subclass; true/false are not token counts


def _read_jsonl(path: Path, *, mooncake: bool, hash_block_tokens: int) -> Trace:
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
    with _open_text(path) as f:
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
    return _sorted_trace(path.stem, arrival, prompt, output, block_hashes, hash_block_tokens)


def _complete_hashes(hashes: list[tuple[int, ...]], prompt: np.ndarray, block_tokens: int) -> list[tuple[int, ...]]:
    """Append fresh unique ids so request i has ceil(prompt_i / block_tokens) ids (Mooncake already does)."""
    need = -(-prompt // block_tokens)
    short = [i for i, h in enumerate(hashes) if len(h) < need[i]]
    if not short:
        return hashes
    fresh = _FreshIds(hashes)
    out = list(hashes)
    for i in short:
        out[i] = hashes[i] + fresh.take(int(need[i]) - len(hashes[i]))
    return out


# --------------------------------------------------------------------------- ServeGen


@dataclass(frozen=True)
class ServeGenRates:
    """The per-window columns of a ServeGen rates file, by tier."""

    window_start_s: np.ndarray  # float64, one entry per 600 s window, ascending from 0
    rate_rps: dict[str, np.ndarray]  # summed client rate per window
    cv: dict[str, np.ndarray]  # rate-weighted CV of inter-arrival times per window
    active_clients: dict[str, np.ndarray]


def read_servegen_rates(path: Path) -> ServeGenRates:
    header, rows, lines = _read_csv_rows(Path(path), None)
    if header[0] != "window_start_s":
        raise TraceError(f"{path}:1: header: first column must be window_start_s, got {header[0]!r}")
    col = {h: i for i, h in enumerate(header)}
    starts = _float_column([r[0] for r in rows], lines, path, "window_start_s")
    steps = np.diff(starts)
    bad = np.flatnonzero(np.abs(steps - SERVEGEN_WINDOW_S) > 1e-6)
    if bad.size or starts[0] != 0.0:
        i = int(bad[0]) + 1 if bad.size else 0
        raise TraceError(
            f"{path}:{lines[i]}: window_start_s: windows must start at 0 and step by {SERVEGEN_WINDOW_S:g} s "
            f"(got {starts[i]:g})"
        )
    rate, cv, clients = {}, {}, {}
    for tier in SERVEGEN_TIERS:
        names = (f"{tier}_rate", f"{tier}_rate_weighted_cv", f"{tier}_active_clients")
        missing = [n for n in names if n not in col]
        if missing:
            raise TraceError(f"{path}:1: header: missing column(s) {missing}")
        rate[tier] = _float_column([r[col[names[0]]] for r in rows], lines, path, names[0])
        cv[tier] = _float_column([r[col[names[1]]] for r in rows], lines, path, names[1])
        clients[tier] = _float_column([r[col[names[2]]] for r in rows], lines, path, names[2])
    return ServeGenRates(starts, rate, cv, clients)


def servegen_arrivals(
    rates: ServeGenRates, spec: ServeGenSpec, rng: np.random.Generator, name: str = "servegen"
) -> Trace:
    """Draw requests whose rate follows a ServeGen tier, rescaled to `spec.mean_rps` (trace seconds).

    Process: a Gamma-renewal process with shape 1/CV² (CV clamped to [0.5, 4]) run in
    "operational time" Λ(t) = ∫ λ, then mapped back to real time. The rate λ(t) is the tier's
    per-window rate, linearly interpolated between window midpoints (so the rate also varies
    inside a window) and multiplied by mean_rps / (its mean over the chosen days). Each 600 s window
    runs its own renewal process with that window's CV, started in its stationary state (first
    point = U × a Gamma(k+1) interval, the length-biased gap) so window edges add no bursts.

    Why renewal and not a doubly stochastic Poisson: the file gives exactly one burstiness number
    per window, the CV of inter-arrival times, and a Gamma renewal with shape k = 1/CV² has
    inter-arrival CV equal to it by construction (Gamma(k, θ) has CV 1/√k), with the mean count
    still λ·Δt; a Cox process would need a modulation timescale the data does not give. Example:
    CV 2 → k = 0.25, i.e. gaps are mostly short with occasional long silences: clumps of about
    1/k = 4 requests. Windows with a zero rate (holes in the source: m-mid has some after day 3.6)
    stay empty.

    Lengths: prompt ~ lognormal(mean prompt_tokens_mean, log-sd 1.0), output ~ lognormal(mean
    output_tokens_mean, log-sd 0.85), each clipped to [1, 8 × mean].
    """
    tier = spec.tier
    begin_s = spec.start_day * SERVEGEN_DAY_S
    end_s = begin_s + spec.days * SERVEGEN_DAY_S
    span_end = float(rates.window_start_s[-1]) + SERVEGEN_WINDOW_S
    if end_s > span_end + 1e-6:
        raise TraceError(
            f"servegen: start_day + days ({spec.start_day:g} + {spec.days:g}) exceeds the "
            f"{span_end / SERVEGEN_DAY_S:g} days in the rates file"
        )
    lam_w = rates.rate_rps[tier]
    mid_s = rates.window_start_s + SERVEGEN_WINDOW_S / 2
    grid_s = np.arange(begin_s, end_s + _SERVEGEN_GRID_S / 2, _SERVEGEN_GRID_S)
    grid_s[-1] = end_s
    lam_grid = np.interp(grid_s, mid_s, lam_w)
    cum = np.concatenate([[0.0], np.cumsum(np.diff(grid_s) * (lam_grid[1:] + lam_grid[:-1]) / 2)])
    if cum[-1] <= 0:
        raise TraceError(
            f"servegen: tier {tier} has zero rate over days [{spec.start_day:g}, {spec.start_day + spec.days:g})"
        )
    # Rescale so the expected count equals mean_rps × span. Example: m-small day 0 averages 985 rps,
    # mean_rps 0.8 → factor 8.1e-4 → ~69,100 requests over the day.
    cum *= spec.mean_rps * (end_s - begin_s) / cum[-1]
    # Keep Λ strictly increasing where the rate is zero so the inverse map stays well defined.
    cum += np.arange(len(cum)) * 1e-9
    points: list[np.ndarray] = []
    first_w = int(begin_s // SERVEGEN_WINDOW_S)
    last_w = int(math.ceil(end_s / SERVEGEN_WINDOW_S)) - 1
    for w in range(first_w, last_w + 1):
        lo = max(begin_s, w * SERVEGEN_WINDOW_S)
        hi = min(end_s, (w + 1) * SERVEGEN_WINDOW_S)
        if hi <= lo or lam_w[w] <= 0:
            continue
        op_lo, op_hi = np.interp([lo, hi], grid_s, cum)
        cv = float(np.clip(rates.cv[tier][w], SERVEGEN_CV_MIN, SERVEGEN_CV_MAX))
        pts = _gamma_renewal(rng, op_hi - op_lo, 1.0 / (cv * cv))
        if pts.size:
            points.append(op_lo + pts)
    op = np.concatenate(points) if points else np.empty(0)
    if op.size == 0:
        raise TraceError(f"servegen: no arrivals drawn (mean_rps {spec.mean_rps:g} is too low for the span)")
    arrival = np.interp(op, cum, grid_s) - begin_s
    n = op.size
    prompt = _lognormal_tokens(rng, spec.prompt_tokens_mean, PROMPT_LOG_SIGMA, n)
    output = _lognormal_tokens(rng, spec.output_tokens_mean, OUTPUT_LOG_SIGMA, n)
    return _sorted_trace(f"{name}:{tier}", np.maximum(arrival, 0.0), prompt, output, None, MOONCAKE_BLOCK_TOKENS)


def _gamma_renewal(rng: np.random.Generator, length: float, shape: float) -> np.ndarray:
    """Points of a stationary unit-rate Gamma(shape) renewal process on [0, length)."""
    if length <= 0:
        return np.empty(0)
    scale = 1.0 / shape  # mean gap shape × scale = 1
    first = rng.uniform() * rng.gamma(shape + 1.0, scale)
    if first >= length:
        return np.empty(0)
    # Count sd of a renewal process is about CV·√length; draw enough gaps in one go, top up if short.
    chunk = int(length + 6.0 * math.sqrt(max(length, 1.0) / shape) + 16)
    pts = [np.array([first])]
    last = first
    while True:
        more = last + np.cumsum(rng.gamma(shape, scale, chunk))
        pts.append(more)
        if more[-1] >= length:
            break
        last = float(more[-1])
    out = np.concatenate(pts)
    return out[out < length]


def _lognormal_tokens(rng: np.random.Generator, mean: float, sigma: float, n: int) -> np.ndarray:
    # mean of lognormal(mu, sigma) is exp(mu + sigma²/2): mean 1024, sigma 1 → mu = ln 1024 − 0.5 = 6.43.
    mu = math.log(mean) - sigma * sigma / 2
    x = np.rint(rng.lognormal(mu, sigma, n))
    return np.clip(x, 1, LENGTH_CLIP_MULT * mean).astype(np.int64)


# --------------------------------------------------------------------------- transforms


def _take(trace: Trace, idx: np.ndarray, arrival_s: np.ndarray | None = None) -> Trace:
    arrival = trace.arrival_s[idx] if arrival_s is None else arrival_s
    hashes = tuple(trace.block_hashes[i] for i in idx) if trace.block_hashes is not None else None
    return Trace(
        name=trace.name,
        arrival_s=np.ascontiguousarray(arrival, dtype=np.float64),
        prompt_tokens=np.ascontiguousarray(trace.prompt_tokens[idx]),
        output_tokens=np.ascontiguousarray(trace.output_tokens[idx]),
        block_hashes=hashes,
        hash_block_tokens=trace.hash_block_tokens,
    )


def window(trace: Trace, start_s: float, duration_s: float | None, source: str = "trace") -> Trace:
    """Keep arrivals in [start_s, start_s + duration_s) and shift them so start_s becomes 0."""
    if start_s <= 0 and duration_s is None:
        return trace
    end_s = math.inf if duration_s is None else start_s + duration_s
    lo, hi = np.searchsorted(trace.arrival_s, [start_s, end_s], side="left")
    if hi <= lo:
        raise TraceError(
            f"{source}: trace.start_s/duration_s: window [{start_s:g}, {end_s:g}) s holds no requests; "
            f"the trace spans [0, {trace.duration_s:g}] s"
        )
    idx = np.arange(lo, hi)
    return _take(trace, idx, trace.arrival_s[idx] - start_s)


def compress(trace: Trace, time_scale: float) -> Trace:
    """arrival_s / time_scale: 24 turns 86,400 s into 3,600 s and multiplies every rate by 24."""
    if time_scale == 1.0:
        return trace
    return _take(trace, np.arange(len(trace)), trace.arrival_s / time_scale)


def scale_rate(trace: Trace, rate_scale: float, rng: np.random.Generator, source: str = "trace") -> Trace:
    """Multiply the arrival rate by `rate_scale`.

    < 1: keep each request independently with probability rate_scale (thinning keeps the rate
    shape and the length mix). > 1: every request gets floor(rate_scale − 1) copies plus one more
    with probability frac(rate_scale − 1) — e.g. 2.5 gives each request 1 or 2 copies, 1.5 on
    average — placed by `_add_copies`.
    """
    if rate_scale == 1.0:
        return trace
    if rate_scale < 1.0:
        keep = np.flatnonzero(rng.random(len(trace)) < rate_scale)
        if keep.size == 0:
            raise TraceError(f"{source}: trace.rate_scale: {rate_scale:g} thinned every request away")
        return _take(trace, keep)
    return _add_copies(trace, np.full(len(trace), rate_scale - 1.0), rng)


def surge_multiplier(t_s: np.ndarray, surge: SurgeSpec) -> np.ndarray:
    """Rate multiplier at times t_s: 1 outside [at_s, at_s + duration_s); inside, it ramps linearly
    from 1 to `factor` over the first ramp_s seconds and holds. Example: at 100, factor 5, ramp 60,
    duration 240 → ×3 at t = 130, ×5 from 160 to 340, ×1 from 340."""
    t = np.asarray(t_s, dtype=np.float64)
    inside = (t >= surge.at_s) & (t < surge.at_s + surge.duration_s)
    ramp = np.ones_like(t) if surge.ramp_s <= 0 else np.clip((t - surge.at_s) / surge.ramp_s, 0.0, 1.0)
    return np.where(inside, 1.0 + (surge.factor - 1.0) * ramp, 1.0)


def add_surge(trace: Trace, surge: SurgeSpec, rng: np.random.Generator) -> Trace:
    """Add copies of requests arriving in the surge so the local rate is multiplied by `surge_multiplier`."""
    extra = surge_multiplier(trace.arrival_s, surge) - 1.0
    if not np.any(extra > 0):
        return trace
    return _add_copies(trace, extra, rng)


def _add_copies(trace: Trace, extra: np.ndarray, rng: np.random.Generator) -> Trace:
    """Request i gets floor(extra_i) copies, plus one with probability frac(extra_i).

    A copy keeps the original's token counts and lands uniformly in the original's neighbourhood
    cell (half-way to the previous and next arrivals), so bursts stay bursts and the local rate
    is multiplied by 1 + extra. Example: arrivals 10.0, 10.2, 11.0 → a copy of the middle one
    lands in [10.1, 10.6).

    Prefix blocks of a copy: ids that another request of the source trace also has (system
    prompts, earlier turns of the conversation) are kept; ids only this request has (its new
    content) are replaced by fresh ids, so a copy is another user's request with the same shared
    context, not a repeat that would hit the cache on its own content.
    """
    base = np.floor(extra).astype(np.int64)
    counts = base + (rng.random(len(extra)) < (extra - base)).astype(np.int64)
    src = np.repeat(np.arange(len(trace)), counts)
    if src.size == 0:
        return trace
    t = trace.arrival_s
    lo_cell = np.concatenate([[t[0]], (t[:-1] + t[1:]) / 2])
    hi_cell = np.concatenate([(t[:-1] + t[1:]) / 2, [t[-1]]])
    copy_t = lo_cell[src] + rng.random(src.size) * (hi_cell[src] - lo_cell[src])
    hashes = None
    if trace.block_hashes is not None:
        all_ids = np.fromiter(itertools.chain.from_iterable(trace.block_hashes), dtype=np.int64)
        ids, uses = np.unique(all_ids, return_counts=True)
        shared = set(ids[uses >= 2].tolist())
        fresh = _FreshIds(trace.block_hashes)
        copies = []
        for i in src.tolist():
            h = trace.block_hashes[i]
            copies.append(tuple(b if b in shared else fresh.next() for b in h))
        hashes = trace.block_hashes + tuple(copies)
    arrival = np.concatenate([t, copy_t])
    order = np.argsort(arrival, kind="stable")  # originals first at equal times
    all_src = np.concatenate([np.arange(len(trace)), src])[order]
    merged = Trace(
        name=trace.name,
        arrival_s=np.ascontiguousarray(arrival[order]),
        prompt_tokens=np.ascontiguousarray(trace.prompt_tokens[all_src]),
        output_tokens=np.ascontiguousarray(trace.output_tokens[all_src]),
        block_hashes=tuple(hashes[i] for i in order) if hashes is not None else None,
        hash_block_tokens=trace.hash_block_tokens,
    )
    return merged


class _FreshIds:
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


def add_synthetic_prefixes(
    trace: Trace, spec: SyntheticPrefixSpec, rng: np.random.Generator, source: str = "trace"
) -> Trace:
    """Give a trace without hash ids block ids with shared prefixes.

    Each request draws a group g with Zipf popularity P(g) ∝ (g + 1)^-zipf_a over `groups`
    groups (64 groups, a = 1.2: group 0 gets ~29% of requests, group 63 ~0.2%). Its first
    floor(min(prefix_tokens, prompt_tokens) / B) blocks are the group's shared blocks (ids
    g·P + k, P = prefix_tokens // B); the rest of its ceil(prompt_tokens / B) blocks get unique
    ids above every group id. Only full blocks are shared: a 700-token prompt with a 1024-token
    group prefix and B = 512 shares 1 block, and its partial second block is its own.
    """
    b = trace.hash_block_tokens
    per_group = spec.prefix_tokens // b
    if spec.prefix_tokens > 0 and per_group == 0:
        raise TraceError(
            f"{source}: trace.prefixes.prefix_tokens ({spec.prefix_tokens}) is below trace.hash_block_tokens ({b}): "
            f"no whole block could be shared"
        )
    weights = (np.arange(spec.groups) + 1.0) ** -spec.zipf_a
    group = rng.choice(spec.groups, size=len(trace), p=weights / weights.sum())
    n_blocks = -(-trace.prompt_tokens // b)
    n_shared = np.minimum(spec.prefix_tokens, trace.prompt_tokens) // b
    n_own = n_blocks - n_shared
    own_start = spec.groups * per_group + np.concatenate([[0], np.cumsum(n_own)[:-1]])
    hashes = tuple(
        tuple(range(g * per_group, g * per_group + s)) + tuple(range(o, o + k))
        for g, s, o, k in zip(group.tolist(), n_shared.tolist(), own_start.tolist(), n_own.tolist(), strict=True)
    )
    return Trace(trace.name, trace.arrival_s, trace.prompt_tokens, trace.output_tokens, hashes, b)
