"""Readers of the profiled performance data in the shared data directory: Vidur's per-op kernel
and all-reduce profiles, splitwise's end-to-end Llama2-70B timings, SageServe's decode timings.

The only part of controller.perf that reads files; every reader takes the data directory as an
argument and raises ValueError naming the file (and line) it cannot use. Parsed profiles are
memoised (pure functions of read-only files). Must not: write anywhere, read the clock, or import
anything outside controller.perf.
"""

from __future__ import annotations

import csv
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from controller.perf.catalogue import MODELS, SKUS, GpuSku, ModelArch
from controller.perf.curves import interp, isotonic

_PER_LAYER_OPS = ("input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "post_attention_layernorm",
                  "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")
_ALL_OPS = ("emb",) + _PER_LAYER_OPS
_RATIO_TAIL_TOKENS = (2048, 4096)  # the ratio window used past the proxy profile's range


@dataclass(frozen=True, slots=True)
class _OpProfile:
    """One (gpu, model, tp) profile: per-op median ms at each num_tokens (duplicates averaged)."""

    tokens: tuple[int, ...]
    ops_ms: Mapping[str, tuple[float, ...]]

    def op_at(self, op: str, n: float) -> float:
        return interp(self.tokens, self.ops_ms[op], n)


@functools.lru_cache(maxsize=32)
def _read_op_profiles(path: Path, arch: ModelArch) -> Mapping[int, _OpProfile]:
    """All TP degrees of one Vidur `_mlp.csv`, checked against the architecture it claims to profile."""
    try:
        f = path.open(newline="")
    except OSError as exc:
        raise ValueError(f"{path}: cannot read Vidur profile: {exc.strerror}") from None
    acc: dict[int, dict[int, dict[str, list[float]]]] = {}
    with f:
        for line_no, row in enumerate(csv.DictReader(f), start=2):
            try:
                shape = (int(row["n_head"]), int(row["n_kv_head"]), int(row["n_embd"]), int(row["n_expanded_embd"]))
                tp = int(row["num_tensor_parallel_workers"])
                n = int(row["num_tokens"])
                vals = {op: float(row[f"time_stats.{op}.median"]) for op in _ALL_OPS}
            except KeyError as exc:
                raise ValueError(f"{path}:{line_no}: missing column {exc}") from None
            except (TypeError, ValueError) as exc:
                raise ValueError(f"{path}:{line_no}: bad value: {exc}") from None
            if shape != (arch.heads, arch.kv_heads, arch.hidden, arch.intermediate):
                raise ValueError(
                    f"{path}:{line_no}: profile shape (heads, kv_heads, hidden, intermediate) = {shape} "
                    f"does not match {arch.name} {(arch.heads, arch.kv_heads, arch.hidden, arch.intermediate)}"
                )
            if n < 1 or any(v <= 0 or math.isnan(v) for v in vals.values()):
                raise ValueError(f"{path}:{line_no}: num_tokens must be >= 1 and op times > 0 (got {n}, {vals})")
            per_n = acc.setdefault(tp, {}).setdefault(n, {op: [] for op in _ALL_OPS})
            for op, v in vals.items():
                per_n[op].append(v)
    out: dict[int, _OpProfile] = {}
    for tp, by_n in acc.items():
        tokens = tuple(sorted(by_n))
        ops = {op: tuple(sum(by_n[n][op]) / len(by_n[n][op]) for n in tokens) for op in _ALL_OPS}
        out[tp] = _OpProfile(tokens, MappingProxyType(ops))
    return MappingProxyType(out)


@functools.lru_cache(maxsize=16)
def _read_all_reduce(path: Path, tp: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(size_bytes, seconds) of all_reduce with num_workers = devices_per_node = tp, isotonic-smoothed."""
    try:
        f = path.open(newline="")
    except OSError as exc:
        raise ValueError(f"{path}: cannot read all-reduce profile: {exc.strerror}") from None
    by_size: dict[int, list[float]] = {}
    with f:
        for line_no, row in enumerate(csv.DictReader(f), start=2):
            try:
                if row["collective"] != "all_reduce":
                    continue
                if int(row["num_workers"]) != tp or int(row["devices_per_node"]) != tp:
                    continue
                by_size.setdefault(int(row["size"]), []).append(float(row["time_stats.all_reduce.median"]) * 1e-3)
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"{path}:{line_no}: bad all-reduce row: {exc}") from None
    if not by_size:
        raise ValueError(f"{path}: no all_reduce rows with num_workers = devices_per_node = {tp}")
    sizes = tuple(float(s) for s in sorted(by_size))
    times = isotonic([sum(by_size[int(s)]) / len(by_size[int(s)]) for s in sizes])
    return sizes, tuple(times)


def all_reduce_profile(data_dir: Path, sku: GpuSku, tp: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(size_bytes, seconds) of `sku`'s DGX all-reduce at num_workers = devices_per_node = tp."""
    return _read_all_reduce(data_dir / "calibration" / "vidur" / f"{sku.vidur_prefix}_dgx_all_reduce.csv", tp)


def _vidur_path(data_dir: Path, sku: GpuSku, arch: ModelArch) -> Path:
    return data_dir / "calibration" / "vidur" / f"{sku.vidur_prefix}_{arch.vidur_name}_mlp.csv"


def kernel_profile(data_dir: Path, sku: GpuSku, arch: ModelArch,
                    tp: int) -> tuple[tuple[int, ...], list[float], list[float], str]:
    """(tokens, per-layer seconds, once-per-iteration seconds, provenance) for one model/SKU/tp.

    Uses the SKU's own profile when present; otherwise derives it from the A100 profile of the same
    model × the per-op H100/A100 ratio of `arch.ratio_proxy` (see controller.perf.iteration).
    """
    own = _vidur_path(data_dir, sku, arch)
    op_at: dict[str, Callable[[float], float]]  # op name -> per-layer milliseconds at n tokens
    if sku.name == "a100-80gb" and not own.exists():
        raise ValueError(f"missing Vidur profile {own} (is data_dir {data_dir} the shared data directory?)")
    if own.exists():
        prof = _read_op_profiles(own, arch)
        if tp not in prof:
            raise ValueError(f"{own}: no rows for tp={tp}; profiled tp: {sorted(prof)}")
        p = prof[tp]
        op_at = {op: functools.partial(p.op_at, op) for op in _ALL_OPS}
        tokens = p.tokens
        provenance = f"Vidur {own.name}"
    else:
        base_sku = SKUS["a100-80gb"]
        proxy = MODELS[arch.ratio_proxy or arch.name]
        base_path = _vidur_path(data_dir, base_sku, arch)
        num_path = _vidur_path(data_dir, sku, proxy)
        den_path = _vidur_path(data_dir, base_sku, proxy)
        for path in (base_path, num_path, den_path):
            if not path.exists():
                raise ValueError(
                    f"no Vidur profile for {arch.name} on {sku.name} and cannot derive one: {path} is missing")
        base = _read_op_profiles(base_path, arch)
        num = _read_op_profiles(num_path, proxy)
        den = _read_op_profiles(den_path, proxy)
        for name, prof in ((base_path, base), (num_path, num), (den_path, den)):
            if tp not in prof:
                raise ValueError(f"{name}: no rows for tp={tp}; profiled tp: {sorted(prof)}")
        b, nu, de = base[tp], num[tp], den[tp]
        lo, hi = _RATIO_TAIL_TOKENS

        def tail_ratio(op: str) -> float:
            ns = [n for n in nu.tokens if lo <= n <= hi]
            return sum(nu.op_at(op, n) / de.op_at(op, n) for n in ns) / len(ns)

        tails = {op: tail_ratio(op) for op in _ALL_OPS}
        last = nu.tokens[-1]

        def derived(n: float, op: str) -> float:
            ratio = nu.op_at(op, n) / de.op_at(op, n) if n <= last else tails[op]
            return b.op_at(op, n) * ratio

        op_at = {op: functools.partial(derived, op=op) for op in _ALL_OPS}
        tokens = b.tokens
        provenance = (f"derived: Vidur {base_path.name} × per-op ratio {num_path.name} / {den_path.name}")
    per_layer = [sum(op_at[op](n) for op in _PER_LAYER_OPS) * 1e-3 for n in tokens]
    # once per iteration: embedding gather + final RMSNorm (profiled shape = input_layernorm)
    per_iter = [(op_at["emb"](n) + op_at["input_layernorm"](n)) * 1e-3 for n in tokens]
    return tokens, per_layer, per_iter, provenance


def splitwise_medians(data_dir: Path,
                       model: str = "llama2-70b") -> dict[tuple[str, int, int, int, int], tuple[float, float]]:
    """(hardware, tp, prompt, batch, tokens) → (median prompt_time ms, median token_time ms)."""
    path = data_dir / "calibration" / "splitwise" / "perf_model.csv"
    groups: dict[tuple[str, int, int, int, int], list[tuple[float, float]]] = {}
    try:
        f = path.open(newline="")
    except OSError as exc:
        raise ValueError(f"{path}: cannot read splitwise profile: {exc.strerror}") from None
    with f:
        for line_no, row in enumerate(csv.DictReader(f), start=2):
            if row.get("model") != model:
                continue
            try:
                key = (row["hardware"], int(row["tensor_parallel"]), int(row["prompt_size"]),
                       int(row["batch_size"]), int(row["token_size"]))
                groups.setdefault(key, []).append((float(row["prompt_time"]), float(row["token_time"])))
            except (KeyError, TypeError, ValueError) as exc:
                raise ValueError(f"{path}:{line_no}: bad row: {exc}") from None
    return {k: (median([v[0] for v in vs]), median([v[1] for v in vs])) for k, vs in groups.items()}


def median(xs: Sequence[float]) -> float:
    ys = sorted(xs)
    m = len(ys) // 2
    return ys[m] if len(ys) % 2 else (ys[m - 1] + ys[m]) / 2


def sageserve_decode_ms(data_dir: Path, tp: int) -> dict[tuple[int, int, int], float]:
    """SageServe Llama-3.1-8B on A100 at `tp`: (prompt, batch, output tokens) → median ms per decode
    step. Empty when the file is absent (the comparison is informational)."""
    path = data_dir / "calibration" / "sageserve" / f"Llama-3.1-8B-tp-{tp}.csv"
    if not path.exists():
        return {}
    groups: dict[tuple[int, int, int], list[float]] = {}
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            key = (int(row["prompt_size"]), int(row["batch_size"]), int(row["token_size"]))
            groups.setdefault(key, []).append(float(row["token_time"]) / key[2] * 1e3)
    return {k: median(v) for k, v in groups.items()}
