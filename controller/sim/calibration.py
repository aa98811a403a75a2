"""Calibrated iteration time and memory of one vLLM replica (model × GPU SKU × tensor parallelism).

The simulator's engine asks `IterationModel.step_time_s` how long one continuous-batching step
takes, and `kv_capacity_blocks` / `fb_used_mib_per_gpu` how much KV cache a replica holds and what
DCGM would show. This module only computes; it must not read the wall clock, keep mutable state
(the `build` memo is a cache of a pure function of read-only files), or write anywhere.

Where each term comes from (docs/SIMULATOR.md has the calibration table):

1. Non-attention kernels — Vidur profiles (`calibration/vidur/<gpu>_<model>_mlp.csv`): per-layer
   time of every op (norms, QKV/O projections, RoPE, MLP up/act/down, residual add) vs num_tokens
   and TP, median of the repeats, duplicate rows averaged; × layers, plus the once-per-iteration
   embedding gather and final norm (taken equal to one input_layernorm). Piecewise linear over
   num_tokens; past the last profiled point linear with the least-squares slope of the upper half
   of the profile.
   H100 has no Llama-3 profiles: each op is taken from the A100 Llama-3 profile × that op's
   H100/A100 ratio measured on the Llama-2 model of the same hidden size (Llama-3-8B ← Llama-2-7B,
   Llama-3-70B ← Llama-2-70B) at the same num_tokens and TP; past the Llama-2 range (4,096 tokens)
   the ratio is the op's mean ratio over 2,048–4,096 tokens, where GEMMs are compute-bound.
2. LM head — not profiled by Vidur: a roofline, max(read vocab × hidden × 2 B / tp at the achievable
   HBM bandwidth, 2 × rows × vocab × hidden / tp FLOPs at 60 % of peak), rows = decode sequences
   (+1 when the step carries prefill: the last chunk of a prompt samples one token).
3. Attention — first principles. Decode reads every context token's K and V once per layer:
   bytes/GPU = context tokens × layers × ⌈kv_heads/tp⌉ × head_dim × 2 × 2 B, at `HBM_READ_FRAC` of
   peak bandwidth. Prefill: FLOPs/GPU = 4 × layers × heads/tp × head_dim × Σ chunk × (context_before
   + chunk/2) at `SKU.attention_flops_frac` of peak dense BF16.
4. TP collectives — two all-reduces per layer of num_tokens × hidden × 2 B, time from
   `<gpu>_dgx_all_reduce.csv` (num_workers = devices_per_node = tp), interpolated over size, plus
   Vidur's NCCL CPU launch cost (20 µs) and a CPU skew cost `collective_skew_s × tp^1.25` (Vidur's
   form) per collective. The all-reduce profile is noisy at small sizes (10 µs and 40 µs runs
   alternate), so it is made non-decreasing by an isotonic (pool-adjacent-violators) fit.
5. Serving-stack overhead — fitted (`fit_stack_overhead`) to splitwise's end-to-end Llama2-70B TP8
   measurements, the only whole-stack timings we have on both SKUs: the collective skew above, a
   host cost per decoding sequence per step, and for a step that carries prefill a per-layer cost
   and a per-layer floor (the host enqueues kernels layer by layer; short prefills are host-bound).
   They carry splitwise's 2023 serving stack, so TP > 1 steps are conservative against a current
   vLLM with CUDA graphs and custom all-reduce (see the calibration table).

Not modelled: FP8/quantised weights, CUDA-graph padding of batch sizes, KV-cache writes, sampling
cost beyond the per-sequence host cost, speculative decoding, pipeline parallelism, multi-node TP,
swap/recompute cost of preemption (the engine charges recompute as prefill).
"""

from __future__ import annotations

import argparse
import csv
import functools
import math
import sys
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from controller.sim.paths import shared_data_dir

GIB = 1024**3

# ---------------------------------------------------------------------------------------------
# GPU SKUs


@dataclass(frozen=True, slots=True)
class GpuSku:
    """One GPU model as the simulator prices and times it.

    Prices: AWS EC2 On-Demand list price, Linux, US East (N. Virginia), per instance-hour divided by
    the 8 GPUs of the instance, as listed through 2024 and until AWS's June 2025 P4/P5 price cut:
    p4de.24xlarge (8× A100-SXM4-80GB) $40.96/h → $5.12 per GPU-hour; p5.48xlarge (8× H100-SXM
    80GB) $98.32/h → $12.29 per GPU-hour. Scenarios override with `usd_per_gpu_hour`.
    """

    name: str
    dcgm_model_name: str  # DCGM exporter `modelName` label
    memory_gib: float  # framebuffer total as nvidia-smi / DCGM report it
    hbm_bytes_per_s: float  # peak HBM bandwidth
    usd_per_gpu_hour: float
    price_source: str
    dense_bf16_flops: float  # peak dense BF16 tensor FLOP/s (no sparsity)
    attention_flops_frac: float  # achievable share of dense_bf16_flops in prefill attention kernels
    vidur_prefix: str  # file prefix in calibration/vidur

    @property
    def memory_bytes(self) -> float:
        return self.memory_gib * GIB


SKUS: Mapping[str, GpuSku] = MappingProxyType(
    {
        "a100-80gb": GpuSku(
            name="a100-80gb",
            dcgm_model_name="NVIDIA A100-SXM4-80GB",
            memory_gib=80.0,  # 81,920 MiB
            hbm_bytes_per_s=2.039e12,  # HBM2e, NVIDIA A100 datasheet (SXM4 80GB)
            usd_per_gpu_hour=5.12,
            price_source="AWS EC2 On-Demand, us-east-1, p4de.24xlarge $40.96/h ÷ 8 GPUs (list price 2024, "
            "before the June 2025 P4/P5 price cut)",
            dense_bf16_flops=312e12,
            attention_flops_frac=0.50,  # FlashAttention-2 forward reaches ~50-70 % of peak on A100
            vidur_prefix="a100",
        ),
        "h100-80gb": GpuSku(
            name="h100-80gb",
            dcgm_model_name="NVIDIA H100 80GB HBM3",
            memory_gib=81559 / 1024,  # 81,559 MiB
            hbm_bytes_per_s=3.35e12,  # HBM3, NVIDIA H100 SXM datasheet
            usd_per_gpu_hour=12.29,
            price_source="AWS EC2 On-Demand, us-east-1, p5.48xlarge $98.32/h ÷ 8 GPUs (list price 2024, "
            "before the June 2025 P4/P5 price cut)",
            dense_bf16_flops=989e12,
            attention_flops_frac=0.40,  # FlashAttention-2 on Hopper ~35-45 % of peak (FA3 reaches more)
            vidur_prefix="h100",
        ),
    }
)

# Share of peak HBM bandwidth a streaming read reaches. The Vidur profiles themselves reach it for
# weight reads at 1 token: A100 Llama-3-8B reads 13.96 GB of layer weights in 9.70 ms = 1.44 TB/s
# = 0.71 of 2.039 TB/s; H100 Llama-2-7B 12.95 GB in 5.60 ms = 2.31 TB/s = 0.69 of 3.35 TB/s.
HBM_READ_FRAC = 0.70
GEMM_FLOPS_FRAC = 0.60  # LM-head GEMM when compute-bound (large batches)
NCCL_LAUNCH_S = 20e-6  # Vidur's default nccl_cpu_launch_overhead_ms = 0.02, per collective

# ---------------------------------------------------------------------------------------------
# Models


@dataclass(frozen=True, slots=True)
class ModelArch:
    """Architecture constants from the public model cards / config.json (Meta Llama on Hugging Face)."""

    name: str
    served_name: str  # what vLLM reports as model_name
    params: int
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    weight_bytes_per_param: int
    max_model_len: int
    intermediate: int  # MLP hidden size (n_expanded_embd in Vidur)
    vidur_name: str  # file stem in calibration/vidur
    ratio_proxy: str  # model whose H100/A100 ratio derives missing profiles (same hidden size)

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of one token over all layers in fp16. Llama-3-8B: 32 × 8 × 128 × 2 × 2 = 131,072 (128 KiB)."""
        return self.layers * self.kv_heads * self.head_dim * 2 * 2

    @property
    def weight_bytes(self) -> float:
        return float(self.params * self.weight_bytes_per_param)

    def counted_params(self) -> int:
        """Parameters implied by the shapes (untied embedding and LM head, RMSNorm weights)."""
        q = self.heads * self.head_dim
        kv = self.kv_heads * self.head_dim
        per_layer = self.hidden * (q + 2 * kv) + q * self.hidden + 3 * self.hidden * self.intermediate + 2 * self.hidden
        return self.layers * per_layer + 2 * self.vocab * self.hidden + self.hidden


MODELS: Mapping[str, ModelArch] = MappingProxyType(
    {
        "llama-3-8b": ModelArch(
            name="llama-3-8b", served_name="meta-llama/Meta-Llama-3-8B-Instruct", params=8_030_261_248,
            layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128, vocab=128_256,
            weight_bytes_per_param=2, max_model_len=8192, intermediate=14_336,
            vidur_name="Meta-Llama-3-8B", ratio_proxy="llama-2-7b",
        ),
        "llama-3-70b": ModelArch(
            name="llama-3-70b", served_name="meta-llama/Meta-Llama-3-70B-Instruct", params=70_553_706_496,
            layers=80, hidden=8192, heads=64, kv_heads=8, head_dim=128, vocab=128_256,
            weight_bytes_per_param=2, max_model_len=8192, intermediate=28_672,
            vidur_name="Meta-Llama-3-70B", ratio_proxy="llama-2-70b",
        ),
        "llama-2-7b": ModelArch(
            name="llama-2-7b", served_name="meta-llama/Llama-2-7b-chat-hf", params=6_738_415_616,
            layers=32, hidden=4096, heads=32, kv_heads=32, head_dim=128, vocab=32_000,
            weight_bytes_per_param=2, max_model_len=4096, intermediate=11_008,
            vidur_name="Llama-2-7b-hf", ratio_proxy="llama-2-7b",
        ),
        "llama-2-70b": ModelArch(
            name="llama-2-70b", served_name="meta-llama/Llama-2-70b-chat-hf", params=68_976_648_192,
            layers=80, hidden=8192, heads=64, kv_heads=8, head_dim=128, vocab=32_000,
            weight_bytes_per_param=2, max_model_len=4096, intermediate=28_672,
            vidur_name="Llama-2-70b-hf", ratio_proxy="llama-2-70b",
        ),
    }
)

# Memory vLLM keeps outside the KV cache on every GPU (it profiles this; we estimate it):
# CUDA context, NCCL buffers and CUDA graphs ≈ 1 GiB, plus the activation peak of the profiling
# forward pass (PROFILE_TOKENS tokens through the widest layer) and the sampler's fp32 logits for
# PROFILE_SEQS sequences. Llama-3-8B, tp=1: 1 GiB + 8192 × (2·14336 + 4·4096) × 2 B (0.69 GiB)
# + 256 × 128256 × 4 B (0.12 GiB) = 1.81 GiB.
NON_TORCH_GIB_PER_GPU = 1.0
PROFILE_TOKENS = 8192  # scenario default max_num_batched_tokens
PROFILE_SEQS = 256  # scenario default max_num_seqs


@dataclass(frozen=True, slots=True)
class StackOverhead:
    """Serving-stack (host) costs on top of the GPU kernels, per SKU.

    Fitted by `fit_stack_overhead` to splitwise's Llama2-70B TP8 measurements after subtracting the
    modelled kernel and collective time: the first two terms by least squares on decode steps at
    batch 1–64, the last two by the smallest worst-case relative error on batch-1 prefill of
    128–2,048 tokens. A step with prefill takes max(GPU work + prefill_step, prefill_floor): the
    host enqueues every layer's kernels one by one (eager mode), which bounds short prefills from
    below while the GPU work overlaps it.
    """

    collective_skew_s: float  # per all-reduce, × tp^1.25 (Vidur's nccl_cpu_skew_overhead_per_device form)
    per_decode_seq_s: float  # host cost per decoding sequence per step (scheduling, sampling, output)
    prefill_floor_per_layer_s: float  # a step with prefill takes at least this × layers
    prefill_step_per_layer_s: float  # added to a step with prefill, × layers


# Values from `python -m controller.sim.calibration --fit` (rounded); tests re-fit and compare.
# Llama-3-8B (32 layers) on A100: a step with prefill takes at least 32 × 0.815 ms = 26.1 ms
# (SageServe measures 23-24 ms for 128-256-token Llama-3.1-8B prompts on A100 TP2, 29 ms on TP4).
STACK_OVERHEADS: Mapping[str, StackOverhead] = MappingProxyType(
    {
        "a100-80gb": StackOverhead(collective_skew_s=9.49e-6, per_decode_seq_s=0.312e-3,
                                   prefill_floor_per_layer_s=0.815e-3, prefill_step_per_layer_s=0.0),
        "h100-80gb": StackOverhead(collective_skew_s=6.39e-6, per_decode_seq_s=0.261e-3,
                                   prefill_floor_per_layer_s=0.680e-3, prefill_step_per_layer_s=0.140e-3),
    }
)
ZERO_OVERHEAD = StackOverhead(0.0, 0.0, 0.0, 0.0)

# ---------------------------------------------------------------------------------------------
# Profile loading (build time only; the hot path never touches these)

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
        return _interp(self.tokens, self.ops_ms[op], n)


def _isotonic(ys: Sequence[float]) -> list[float]:
    """Least-squares non-decreasing fit (pool adjacent violators): removes timing noise dips."""
    blocks: list[list[float]] = []  # [sum, count]
    for y in ys:
        blocks.append([y, 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            s, c = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += c
    out: list[float] = []
    for s, c in blocks:
        out.extend([s / c] * int(c))
    return out


def _tail_slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope over the upper half of the x range (the linear, compute/bandwidth-bound part)."""
    lo = xs[-1] / 2
    pts = [(x, y) for x, y in zip(xs, ys) if x >= lo]
    if len(pts) < 2:
        pts = list(zip(xs[-2:], ys[-2:]))
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    sxx = sum((p[0] - mx) ** 2 for p in pts)
    if sxx == 0:
        return 0.0
    return max(0.0, sum((p[0] - mx) * (p[1] - my) for p in pts) / sxx)


def _interp(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Piecewise linear; flat below the first point; linear with the tail slope past the last."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1] + _tail_slope(xs, ys) * (x - xs[-1])
    i = bisect_right(xs, x)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


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
    times = _isotonic([sum(by_size[int(s)]) / len(by_size[int(s)]) for s in sizes])
    return sizes, tuple(times)


def _vidur_path(data_dir: Path, sku: GpuSku, arch: ModelArch) -> Path:
    return data_dir / "calibration" / "vidur" / f"{sku.vidur_prefix}_{arch.vidur_name}_mlp.csv"


def _kernel_profile(data_dir: Path, sku: GpuSku, arch: ModelArch,
                    tp: int) -> tuple[tuple[int, ...], list[float], list[float], str]:
    """(tokens, per-layer seconds, once-per-iteration seconds, provenance) for one model/SKU/tp.

    Uses the SKU's own profile when present; otherwise derives it from the A100 profile of the same
    model × the per-op H100/A100 ratio of `arch.ratio_proxy` (see the module docstring).
    """
    own = _vidur_path(data_dir, sku, arch)
    if sku.name == "a100-80gb" and not own.exists():
        raise ValueError(f"missing Vidur profile {own} (is data_dir {data_dir} the shared data directory?)")
    if own.exists():
        prof = _read_op_profiles(own, arch)
        if tp not in prof:
            raise ValueError(f"{own}: no rows for tp={tp}; profiled tp: {sorted(prof)}")
        p = prof[tp]
        op_at = {op: (lambda n, op=op, p=p: p.op_at(op, n)) for op in _ALL_OPS}
        tokens = p.tokens
        provenance = f"Vidur {own.name}"
    else:
        base_sku = SKUS["a100-80gb"]
        proxy = MODELS[arch.ratio_proxy]
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

        op_at = {op: (lambda n, op=op: derived(n, op)) for op in _ALL_OPS}
        tokens = b.tokens
        provenance = (f"derived: Vidur {base_path.name} × per-op ratio {num_path.name} / {den_path.name}")
    per_layer = [sum(op_at[op](n) for op in _PER_LAYER_OPS) * 1e-3 for n in tokens]
    # once per iteration: embedding gather + final RMSNorm (profiled shape = input_layernorm)
    per_iter = [(op_at["emb"](n) + op_at["input_layernorm"](n)) * 1e-3 for n in tokens]
    return tokens, per_layer, per_iter, provenance


# ---------------------------------------------------------------------------------------------
# The model


@dataclass(frozen=True, slots=True)
class StepBreakdown:
    """Components of one step, in seconds (for the calibration table and debugging; not the hot path)."""

    non_attention_s: float  # layers × profiled per-layer ops (Vidur's definition)
    per_iteration_s: float  # embedding + final norm
    lm_head_s: float
    collectives_s: float  # all-reduce kernels + NCCL launch + skew
    decode_attention_s: float
    prefill_attention_s: float
    host_s: float  # per-sequence host cost + prefill-step cost + what the prefill floor adds

    @property
    def total_s(self) -> float:
        return (self.non_attention_s + self.per_iteration_s + self.lm_head_s + self.collectives_s
                + self.decode_attention_s + self.prefill_attention_s + self.host_s)


class IterationModel:
    """Step time, KV capacity and framebuffer use of one replica. Immutable once built."""

    __slots__ = (
        "model", "sku", "tp", "overhead", "provenance", "reserve_bytes_per_gpu", "kv_bytes_per_token_per_gpu",
        "_grid_n", "_grid_s", "_grid_slope", "_n_last", "_s_last", "_tail_slope_s",
        "_lm_mem_s", "_lm_row_s", "_decode_ctx_s", "_prefill_work_s", "_seq_s", "_prefill_step_s", "_prefill_floor_s",
        "_layer_tokens", "_layer_s", "_iter_s", "_coll_grid_s", "_tails",
    )

    def __init__(self, model: ModelArch, sku: GpuSku, tp: int, data_dir: Path, overhead: StackOverhead) -> None:
        _check_fits(model, sku, tp)
        tokens, per_layer, per_iter, provenance = _kernel_profile(data_dir, sku, model, tp)
        if tp > 1:
            ar_path = data_dir / "calibration" / "vidur" / f"{sku.vidur_prefix}_dgx_all_reduce.csv"
            sizes, ar_s = _read_all_reduce(ar_path, tp)
            coll_fixed = NCCL_LAUNCH_S + overhead.collective_skew_s * tp**1.25
        else:
            sizes, ar_s, coll_fixed = (), (), 0.0
        n_coll = 2 * model.layers  # after attention (O projection) and after the MLP (down projection)

        def coll_at(n: float) -> float:
            return n_coll * (_interp(sizes, ar_s, n * model.hidden * 2) + coll_fixed) if tp > 1 else 0.0

        # Each component on the token grid, with its own slope past the last point; the hot path
        # interpolates their sum, `breakdown` each one, so the two agree exactly.
        coll_grid = [coll_at(n) for n in tokens]
        tails = (model.layers * _tail_slope(tokens, per_layer), _tail_slope(tokens, per_iter),
                 n_coll * _tail_slope(sizes, ar_s) * model.hidden * 2 if tp > 1 else 0.0)
        grid_s = [model.layers * pl + pi + c for pl, pi, c in zip(per_layer, per_iter, coll_grid)]
        s = object.__setattr__
        s(self, "model", model)
        s(self, "sku", sku)
        s(self, "tp", tp)
        s(self, "overhead", overhead)
        s(self, "provenance", provenance)
        s(self, "_layer_tokens", tokens)
        s(self, "_layer_s", tuple(per_layer))
        s(self, "_iter_s", tuple(per_iter))
        s(self, "_coll_grid_s", tuple(coll_grid))
        s(self, "_tails", tails)
        s(self, "_grid_n", tuple(tokens))
        s(self, "_grid_s", tuple(grid_s))
        s(self, "_grid_slope", tuple((grid_s[i + 1] - grid_s[i]) / (tokens[i + 1] - tokens[i])
                                     for i in range(len(tokens) - 1)))
        s(self, "_n_last", tokens[-1])
        s(self, "_s_last", grid_s[-1])
        s(self, "_tail_slope_s", sum(tails))
        # LM head: Llama-3-8B tp=1 on A100 reads 128256 × 4096 × 2 B = 1.05 GB at 0.70 × 2.039 TB/s = 0.74 ms;
        # each sampled row adds 2 × 128256 × 4096 FLOPs = 1.05 GFLOP at 0.6 × 312 TFLOP/s = 5.6 µs.
        lm_params = model.vocab * model.hidden / tp
        s(self, "_lm_mem_s", lm_params * model.weight_bytes_per_param / (sku.hbm_bytes_per_s * HBM_READ_FRAC))
        s(self, "_lm_row_s", 2 * lm_params / (sku.dense_bf16_flops * GEMM_FLOPS_FRAC))
        kv_heads_per_gpu = math.ceil(model.kv_heads / tp)  # KV heads are replicated when tp > kv_heads
        kv_gpu = model.layers * kv_heads_per_gpu * model.head_dim * 2 * 2
        s(self, "kv_bytes_per_token_per_gpu", kv_gpu)
        # Decode: Llama-3-8B tp=1 on A100, 131,072 B per context token at 1.43 TB/s → 91.8 ns per token
        # (a batch of 64 sequences × 2,000 tokens of context = 11.7 ms).
        s(self, "_decode_ctx_s", kv_gpu / (sku.hbm_bytes_per_s * HBM_READ_FRAC))
        # Prefill: 4 × 32 × 32 × 128 = 524,288 FLOPs per unit of work on Llama-3-8B; a 2,048-token prompt
        # (work = 2048 × 1024) is 1.1 TFLOP → 7.0 ms at 0.5 × 312 TFLOP/s.
        s(self, "_prefill_work_s", 4 * model.layers * (model.heads / tp) * model.head_dim
          / (sku.dense_bf16_flops * sku.attention_flops_frac))
        s(self, "_seq_s", overhead.per_decode_seq_s)
        s(self, "_prefill_step_s", overhead.prefill_step_per_layer_s * model.layers)
        s(self, "_prefill_floor_s", overhead.prefill_floor_per_layer_s * model.layers)
        act = PROFILE_TOKENS * (2 * model.intermediate / tp + 4 * model.hidden) * 2
        logits = PROFILE_SEQS * model.vocab * 4
        s(self, "reserve_bytes_per_gpu", NON_TORCH_GIB_PER_GPU * GIB + act + logits)
        if model.weight_bytes / tp + self.reserve_bytes_per_gpu >= sku.memory_bytes:
            raise ValueError(
                f"{model.name} on tp={tp} × {sku.name}: weights {model.weight_bytes / tp / GIB:.1f} GiB per GPU + "
                f"reserve {self.reserve_bytes_per_gpu / GIB:.1f} GiB exceed the {sku.memory_gib:.1f} GiB of one GPU"
            )

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"IterationModel is immutable (tried to set {name})")

    def __repr__(self) -> str:
        return f"IterationModel({self.model.name!r}, {self.sku.name!r}, tp={self.tp})"

    @classmethod
    def build(cls, model: str, sku: str, tp: int, data_dir: Path | None = None) -> IterationModel:
        """The calibrated model for (model, sku, tp); cached per key. ValueError names a bad argument."""
        return cls.build_with_overhead(model, sku, tp, STACK_OVERHEADS.get(sku, ZERO_OVERHEAD), data_dir)

    @classmethod
    def build_with_overhead(cls, model: str, sku: str, tp: int, overhead: StackOverhead,
                            data_dir: Path | None = None) -> IterationModel:
        """As `build`, with other serving-stack terms (ZERO_OVERHEAD = GPU kernels only)."""
        if model not in MODELS:
            raise ValueError(f"unknown model {model!r}; known models: {sorted(MODELS)}")
        if sku not in SKUS:
            raise ValueError(f"unknown sku {sku!r}; known SKUs: {sorted(SKUS)}")
        if isinstance(tp, bool) or not isinstance(tp, int):
            raise ValueError(f"tp must be an int, got {tp!r}")
        root = Path(data_dir) if data_dir is not None else shared_data_dir()
        return _build_cached(model, sku, tp, root.resolve(), overhead)

    # -- hot path ------------------------------------------------------------------------------

    def step_time_s(self, prefill_tokens: int, prefill_attention_work: float,
                    decode_seqs: int, decode_context_tokens: int) -> float:
        """Seconds for one engine step.

        prefill_tokens: new prompt tokens computed this step (sum of chunks);
        prefill_attention_work: Σ over prefill chunks of chunk_len × (context_before + chunk_len / 2);
        decode_seqs: sequences decoding one token; decode_context_tokens: Σ of their context lengths.
        Pure arithmetic and one bisect. A step with nothing to do takes 0 s.
        """
        n = prefill_tokens + decode_seqs
        if n < 1 or prefill_tokens < 0 or decode_seqs < 0 or prefill_attention_work < 0 or decode_context_tokens < 0:
            if n == 0 and prefill_tokens == 0 and prefill_attention_work == 0 and decode_context_tokens == 0:
                return 0.0
            raise ValueError(
                f"step_time_s: bad step (prefill_tokens={prefill_tokens}, prefill_attention_work="
                f"{prefill_attention_work}, decode_seqs={decode_seqs}, decode_context_tokens={decode_context_tokens})"
            )
        if n >= self._n_last:
            t = self._s_last + self._tail_slope_s * (n - self._n_last)
        else:
            i = bisect_right(self._grid_n, n) - 1
            t = self._grid_s[i] + self._grid_slope[i] * (n - self._grid_n[i])
        t += decode_context_tokens * self._decode_ctx_s + prefill_attention_work * self._prefill_work_s
        if prefill_tokens:
            lm = (decode_seqs + 1) * self._lm_row_s
            t += (lm if lm > self._lm_mem_s else self._lm_mem_s) + self._prefill_step_s
            if t < self._prefill_floor_s:  # host-bound: enqueueing the layers takes longer than the GPU work
                t = self._prefill_floor_s
        else:
            lm = decode_seqs * self._lm_row_s
            t += lm if lm > self._lm_mem_s else self._lm_mem_s
        return t + decode_seqs * self._seq_s

    # -- memory --------------------------------------------------------------------------------

    def kv_capacity_blocks(self, gpu_memory_utilization: float, block_size: int) -> int:
        """KV blocks of `block_size` tokens the replica holds (each block spans all tp GPUs).

        Per GPU: memory × utilization − weights / tp − reserve, divided by the block's bytes on that GPU.
        Equivalent to the replica form (tp × mem × util − weights − tp × reserve) / (kv_bytes_per_token ×
        block_size) when tp ≤ kv_heads.
        """
        _check_util(gpu_memory_utilization)
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be an int >= 1, got {block_size!r}")
        free = self._kv_bytes_per_gpu(gpu_memory_utilization)
        blocks = int(free // (self.kv_bytes_per_token_per_gpu * block_size))
        if blocks < 1:
            raise ValueError(self._no_room(gpu_memory_utilization, f"not even one block of {block_size} tokens fits"))
        return blocks

    def fb_used_mib_per_gpu(self, gpu_memory_utilization: float) -> float:
        """DCGM_FI_DEV_FB_USED of each GPU of a running replica: vLLM claims its whole budget
        (weights + activations/graphs + pre-allocated KV blocks) up front, whatever the load."""
        _check_util(gpu_memory_utilization)
        if self._kv_bytes_per_gpu(gpu_memory_utilization) <= 0:
            raise ValueError(self._no_room(gpu_memory_utilization, "no memory left for the KV cache"))
        return self.sku.memory_gib * 1024 * gpu_memory_utilization

    def _kv_bytes_per_gpu(self, util: float) -> float:
        return self.sku.memory_bytes * util - self.model.weight_bytes / self.tp - self.reserve_bytes_per_gpu

    def _no_room(self, util: float, what: str) -> str:
        return (
            f"{self.model.name} on tp={self.tp} × {self.sku.name} at gpu_memory_utilization={util}: {what} "
            f"(budget {self.sku.memory_gib * util:.1f} GiB per GPU, "
            f"weights {self.model.weight_bytes / self.tp / GIB:.1f} GiB, "
            f"reserve {self.reserve_bytes_per_gpu / GIB:.1f} GiB); raise tp or gpu_memory_utilization"
        )

    # -- inspection (not the hot path) ------------------------------------------------------------

    def non_attention_s(self, num_tokens: float) -> float:
        """layers × Σ profiled per-layer op times at num_tokens: Vidur's 'non-attention time per iteration'."""
        return self.model.layers * _grid_interp(self._layer_tokens, self._layer_s, self._tails[0] / self.model.layers,
                                                num_tokens)

    def breakdown(self, prefill_tokens: int, prefill_attention_work: float,
                  decode_seqs: int, decode_context_tokens: int) -> StepBreakdown:
        """The same step as `step_time_s`, split into its terms."""
        n = prefill_tokens + decode_seqs
        if n < 1:
            return StepBreakdown(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
        rows = decode_seqs + (1 if prefill_tokens else 0)
        parts = StepBreakdown(
            non_attention_s=self.non_attention_s(n),
            per_iteration_s=_grid_interp(self._layer_tokens, self._iter_s, self._tails[1], n),
            lm_head_s=max(self._lm_mem_s, rows * self._lm_row_s),
            collectives_s=_grid_interp(self._layer_tokens, self._coll_grid_s, self._tails[2], n),
            decode_attention_s=decode_context_tokens * self._decode_ctx_s,
            prefill_attention_s=prefill_attention_work * self._prefill_work_s,
            host_s=0.0,
        )
        gpu = parts.total_s
        host = decode_seqs * self._seq_s
        if prefill_tokens:
            host += self._prefill_step_s + max(0.0, self._prefill_floor_s - gpu - self._prefill_step_s)
        return StepBreakdown(parts.non_attention_s, parts.per_iteration_s, parts.lm_head_s, parts.collectives_s,
                             parts.decode_attention_s, parts.prefill_attention_s, host)


def _grid_interp(xs: Sequence[float], ys: Sequence[float], tail_slope: float, x: float) -> float:
    """Piecewise linear over the token grid, flat below it, `tail_slope` past it (as the hot path)."""
    if x >= xs[-1]:
        return ys[-1] + tail_slope * (x - xs[-1])
    if x <= xs[0]:
        return ys[0]
    i = bisect_right(xs, x) - 1
    return ys[i] + (ys[i + 1] - ys[i]) * (x - xs[i]) / (xs[i + 1] - xs[i])


def _check_util(util: float) -> None:
    if not (isinstance(util, (int, float)) and 0.0 < util <= 1.0):
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {util!r}")


def _check_fits(model: ModelArch, sku: GpuSku, tp: int) -> None:
    if tp not in (1, 2, 4, 8):
        raise ValueError(f"tp must be one of 1, 2, 4, 8 (the profiled degrees), got {tp}")
    if model.heads % tp:
        raise ValueError(f"tp={tp} does not divide the {model.heads} attention heads of {model.name}")
    per_gpu = model.weight_bytes / tp
    if per_gpu >= sku.memory_bytes:
        need = next((t for t in (1, 2, 4, 8) if model.weight_bytes / t < sku.memory_bytes), None)
        raise ValueError(
            f"{model.name} does not fit on tp={tp} × {sku.name}: {per_gpu / GIB:.1f} GiB of weights per GPU "
            f"> {sku.memory_gib:.1f} GiB of GPU memory" + (f"; use tp >= {need}" if need else "")
        )


@functools.lru_cache(maxsize=64)
def _build_cached(model: str, sku: str, tp: int, data_dir: Path, overhead: StackOverhead) -> IterationModel:
    return IterationModel(MODELS[model], SKUS[sku], tp, data_dir, overhead)


# ---------------------------------------------------------------------------------------------
# Fitting the serving-stack overhead to splitwise (run by tests and `--fit`; not at build time)

# splitwise's batched decode rows all use a 512-token prompt and 128 output tokens, so a decoding
# sequence holds 512 + 64 = 576 tokens of context on average over its 128 steps.
SPLITWISE_DECODE_CONTEXT_TOKENS = 576
_FIT_PREFILL_TOKENS = (128, 256, 512, 1024, 2048)
_FIT_DECODE_BATCHES = (1, 2, 4, 8, 16, 32, 64)


@dataclass(frozen=True, slots=True)
class FitPoint:
    kind: str  # "prefill" | "decode"
    tp: int
    size: int  # prompt tokens (prefill) or batch size (decode)
    measured_ms: float
    kernels_ms: float  # modelled, before stack overhead


def _splitwise_medians(data_dir: Path,
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
    return {k: (_median([v[0] for v in vs]), _median([v[1] for v in vs])) for k, vs in groups.items()}


def _median(xs: Sequence[float]) -> float:
    ys = sorted(xs)
    m = len(ys) // 2
    return ys[m] if len(ys) % 2 else (ys[m - 1] + ys[m]) / 2


def fit_points(sku: str, data_dir: Path | None = None, tps: Sequence[int] = (8,)) -> list[FitPoint]:
    """splitwise Llama2-70B points on `sku` with the kernel-only model's time for each."""
    root = (Path(data_dir) if data_dir is not None else shared_data_dir()).resolve()
    med = _splitwise_medians(root)
    pts: list[FitPoint] = []
    for tp in tps:
        raw = IterationModel.build_with_overhead("llama-2-70b", sku, tp, ZERO_OVERHEAD, root)
        for p in _FIT_PREFILL_TOKENS:
            key = (sku, tp, p, 1, 128)
            if key in med:
                k = raw.step_time_s(p, p * p / 2, 0, 0)
                pts.append(FitPoint("prefill", tp, p, med[key][0], k * 1e3))
        for b in _FIT_DECODE_BATCHES:
            key = (sku, tp, 512, b, 128)
            if key in med:
                k = raw.step_time_s(0, 0.0, b, b * SPLITWISE_DECODE_CONTEXT_TOKENS)
                pts.append(FitPoint("decode", tp, b, med[key][1], k * 1e3))
    if not pts:
        raise ValueError(f"no splitwise llama2-70b rows for {sku} at tp {list(tps)}")
    return pts


def fit_stack_overhead(sku: str, data_dir: Path | None = None, tps: Sequence[int] = (8,)) -> StackOverhead:
    """Fit the four serving-stack terms to splitwise Llama2-70B on `sku` (see StackOverhead).

    Decode: measured ≈ kernels + skew × 2·layers·tp^1.25 + per_seq × batch, non-negative least squares
    on relative error. Prefill (given the skew): measured ≈ max(kernels + skew term + step × layers,
    floor × layers); (floor, step) is the point of a 5 µs × 2 µs grid with the smallest worst-case
    relative error, ties broken by the smallest sum of squares.
    """
    import numpy as np  # fitting only
    from scipy.optimize import nnls

    layers = MODELS["llama-2-70b"].layers
    pts = fit_points(sku, data_dir, tps)
    dec = [p for p in pts if p.kind == "decode"]
    pre = [p for p in pts if p.kind == "prefill"]
    if not dec or not pre:
        raise ValueError(f"splitwise data for {sku} lacks decode or prefill points at tp {list(tps)}")
    meas = np.array([p.measured_ms for p in dec]) * 1e-3
    a = np.array([[2 * layers * p.tp**1.25, p.size] for p in dec]) / meas[:, None]
    b = np.array([p.measured_ms - p.kernels_ms for p in dec]) * 1e-3 / meas
    scale = np.array([1e-5, 1e-3])  # condition the columns (unknowns are ~10 µs and ~0.3 ms)
    x, _ = nnls(a * scale, b)
    skew, per_seq = (x * scale).tolist()

    meas_p = np.array([p.measured_ms for p in pre]) * 1e-3
    base_p = np.array([p.kernels_ms * 1e-3 + skew * 2 * layers * p.tp**1.25 for p in pre])
    floors = np.arange(0, 301) * 5e-6  # per layer, 0–1.5 ms
    steps = np.arange(0, 201) * 2e-6  # per layer, 0–0.4 ms
    model_s = np.maximum(base_p[None, None, :] + steps[None, :, None] * layers, floors[:, None, None] * layers)
    rel = model_s / meas_p[None, None, :] - 1
    worst = np.abs(rel).max(axis=2)
    sse = (rel**2).sum(axis=2)
    cand = worst <= worst.min() + 1e-9
    i, j = np.unravel_index(np.where(cand, sse, np.inf).argmin(), sse.shape)
    return StackOverhead(collective_skew_s=skew, per_decode_seq_s=per_seq,
                         prefill_floor_per_layer_s=float(floors[i]), prefill_step_per_layer_s=float(steps[j]))


# ---------------------------------------------------------------------------------------------
# Published figures and the calibration table


@dataclass(frozen=True, slots=True)
class ReferenceFigure:
    """A published figure and the step that reproduces it. quantity: "non_attention" (Vidur's
    definition, `non_attention_s(prefill_tokens)`) or "step" (`step_time_s`)."""

    source: str
    label: str
    model: str
    sku: str
    tp: int
    quantity: str
    prefill_tokens: int
    decode_seqs: int
    context_tokens_per_seq: int  # decode context per sequence (decode) or prior context (prefill)
    reference_ms: float
    covered: bool = True
    note: str = ""

    @property
    def prefill_attention_work(self) -> float:
        p = self.prefill_tokens
        return p * (self.context_tokens_per_seq + p / 2) if p else 0.0

    def simulate_ms(self, model: IterationModel) -> float:
        if self.quantity == "non_attention":
            return model.non_attention_s(self.prefill_tokens) * 1e3
        return model.step_time_s(self.prefill_tokens, self.prefill_attention_work, self.decode_seqs,
                                 self.decode_seqs * self.context_tokens_per_seq if self.decode_seqs else 0) * 1e3


def _vidur(label: str, model: str, sku: str, n: int, ms: float) -> ReferenceFigure:
    return ReferenceFigure("Vidur", label, model, sku, 1, "non_attention", n, 0, 0, ms)


def _sw_prefill(sku: str, n: int, ms: float) -> ReferenceFigure:
    return ReferenceFigure("splitwise", f"prefill {n} tokens", "llama-2-70b", sku, 8, "step", n, 0, 0, ms)


def _sw_decode(sku: str, b: int, ms: float) -> ReferenceFigure:
    return ReferenceFigure("splitwise", f"decode step, batch {b}", "llama-2-70b", sku, 8, "step", 0, b,
                           SPLITWISE_DECODE_CONTEXT_TOKENS, ms)


REFERENCE_FIGURES: tuple[ReferenceFigure, ...] = (
    *(_vidur(f"non-attention, {n} token{'s' if n > 1 else ''}", "llama-3-8b", "a100-80gb", n, ms)
      for n, ms in ((1, 9.7), (128, 13.2), (512, 34.7), (2048, 141.9))),
    *(_vidur(f"non-attention, {n} token{'s' if n > 1 else ''}", "llama-2-7b", "h100-80gb", n, ms)
      for n, ms in ((1, 5.6), (128, 6.4), (512, 12.0), (2048, 40.6))),
    _sw_prefill("h100-80gb", 128, 58.0), _sw_prefill("h100-80gb", 2048, 137.0),
    _sw_decode("h100-80gb", 1, 30.0), _sw_decode("h100-80gb", 16, 34.0), _sw_decode("h100-80gb", 64, 50.0),
    _sw_prefill("a100-80gb", 128, 65.0), _sw_prefill("a100-80gb", 2048, 274.0),
    _sw_decode("a100-80gb", 1, 43.0), _sw_decode("a100-80gb", 16, 50.0), _sw_decode("a100-80gb", 64, 72.0),
    # Not covered: nearest comparison we can make.
    ReferenceFigure("NVIDIA NIM", "Llama-3.3-70B FP8 2×H100, 5000 in, concurrency 1: TTFT", "llama-3-70b",
                    "h100-80gb", 2, "step", 5000, 0, 0, 407.0, False,
                    "FP8 not modelled; nearest: BF16 Llama-3-70B TP2, one 5,000-token prefill step"),
    ReferenceFigure("NVIDIA NIM", "Llama-3.3-70B FP8 2×H100, concurrency 1: ITL", "llama-3-70b",
                    "h100-80gb", 2, "step", 0, 1, 5250, 18.6, False,
                    "FP8 not modelled (halves weight bytes); nearest: BF16 TP2 decode, batch 1, 5,250-token context"),
    ReferenceFigure("NVIDIA NIM", "Llama-3.3-70B FP8 2×H100, concurrency 50: ITL", "llama-3-70b",
                    "h100-80gb", 2, "step", 0, 50, 5250, 59.7, False,
                    "nearest: BF16 TP2 decode, batch 50 × 5,250 tokens; in BF16 that KV does not fit on 2 GPUs"),
    ReferenceFigure("vLLM CI (H200)", "Llama-8B TP1 decode step, batch 8", "llama-3-8b", "h100-80gb", 1, "step",
                    0, 8, 96, 6.5, False,
                    "H200 not modelled (4.8 TB/s vs 3.35); nearest: H100, batch 8, ~96-token context"),
    ReferenceFigure("vLLM CI (H200)", "Llama-70B TP4 decode step, batch 8", "llama-3-70b", "h100-80gb", 4, "step",
                    0, 8, 96, 16.2, False,
                    "H200 not modelled; nearest: H100 TP4, batch 8, ~96-token context"),
)


@dataclass(frozen=True, slots=True)
class TableRow:
    figure: ReferenceFigure
    simulated_ms: float

    @property
    def error_frac(self) -> float:
        return (self.simulated_ms - self.figure.reference_ms) / self.figure.reference_ms


def reference_rows(data_dir: Path | None = None) -> list[TableRow]:
    return [TableRow(f, f.simulate_ms(IterationModel.build(f.model, f.sku, f.tp, data_dir))) for f in REFERENCE_FIGURES]


def _sageserve_rows(root: Path) -> list[tuple[str, float, float]]:
    """(label, measured ms per decode step, simulated ms) for SageServe Llama-3.1-8B on A100, TP 2/4."""
    out = []
    for tp in (2, 4):
        path = root / "calibration" / "sageserve" / f"Llama-3.1-8B-tp-{tp}.csv"
        if not path.exists():
            continue
        groups: dict[tuple[int, int, int], list[float]] = {}
        with path.open(newline="") as f:
            for row in csv.DictReader(f):
                key = (int(row["prompt_size"]), int(row["batch_size"]), int(row["token_size"]))
                groups.setdefault(key, []).append(float(row["token_time"]) / key[2] * 1e3)
        m = IterationModel.build("llama-3-8b", "a100-80gb", tp, root)
        for b in (1, 8, 32):
            key = (512, b, 128)
            if key in groups:
                sim = m.step_time_s(0, 0.0, b, b * (512 + 64)) * 1e3
                out.append((f"Llama-3.1-8B A100 TP{tp} decode step, batch {b}", _median(groups[key]), sim))
    return out


def calibration_table_markdown(data_dir: Path | None = None) -> str:
    root = (Path(data_dir) if data_dir is not None else shared_data_dir()).resolve()
    rows = reference_rows(root)
    lines = [
        "# Simulator calibration table",
        "",
        "Generated by `python -m controller.sim.calibration --table <file>` from `controller/sim/calibration.py`",
        "and the shared calibration data. Reference figures are those listed in the shared data README.",
        "",
        "## Figures we check (tests require |error| ≤ 10 %)",
        "",
        "| source | model | SKU | TP | figure | reference ms | simulated ms | error |",
        "|---|---|---|---:|---|---:|---:|---:|",
    ]
    for r in rows:
        f = r.figure
        if f.covered:
            lines.append(f"| {f.source} | {f.model} | {f.sku} | {f.tp} | {f.label} | {f.reference_ms:g} | "
                         f"{r.simulated_ms:.1f} | {r.error_frac * 100:+.1f} % |")
    lines += [
        "",
        "Vidur rows compare `non_attention_s` (layers × the profiled per-layer ops; the H100 Llama-2-7B",
        "profile is measured, not derived). splitwise rows compare a whole `step_time_s`; decode rows use",
        f"{SPLITWISE_DECODE_CONTEXT_TOKENS} tokens of context per sequence, because every batched row of",
        "splitwise's perf_model.csv has a 512-token prompt and 128 output tokens (512 + 128/2). The",
        "splitwise rows are partly in-sample: the stack-overhead terms below are fitted to the same data",
        "(TP8, decode at batch 1–64, prefill of 128–2,048 tokens).",
        "",
        "## Figures for models or SKUs we do not model",
        "",
        "| source | figure | reference ms | nearest comparison | simulated ms | difference |",
        "|---|---|---:|---|---:|---:|",
    ]
    for r in rows:
        f = r.figure
        if not f.covered:
            lines.append(f"| {f.source} | {f.label} | {f.reference_ms:g} | {f.note} | {r.simulated_ms:.1f} | "
                         f"{r.error_frac * 100:+.0f} % |")
    extra = _sageserve_rows(root)
    med = _splitwise_medians(root)
    lines += [
        "",
        "## Further comparisons (informational, not tested)",
        "",
        "| source | figure | measured ms | simulated ms | error |",
        "|---|---|---:|---:|---:|",
    ]
    for label, meas, sim in extra:
        lines.append(f"| SageServe | {label} | {meas:.1f} | {sim:.1f} | {(sim - meas) / meas * 100:+.0f} % |")
    for sku in SKUS:
        for tp in (2, 4):
            m = IterationModel.build("llama-2-70b", sku, tp, root)
            for kind, key, sim in (
                ("decode step, batch 1", (sku, tp, 512, 1, 128),
                 m.step_time_s(0, 0.0, 1, SPLITWISE_DECODE_CONTEXT_TOKENS)),
                ("decode step, batch 32", (sku, tp, 512, 32, 128),
                 m.step_time_s(0, 0.0, 32, 32 * SPLITWISE_DECODE_CONTEXT_TOKENS)),
                ("prefill 2048 tokens", (sku, tp, 2048, 1, 128), m.step_time_s(2048, 2048 * 1024.0, 0, 0)),
            ):
                if key in med:
                    meas = med[key][1] if kind.startswith("decode") else med[key][0]
                    lines.append(f"| splitwise | Llama2-70B {sku} TP{tp} {kind} | {meas:.1f} | {sim * 1e3:.1f} | "
                                 f"{(sim * 1e3 - meas) / meas * 100:+.0f} % |")
    lines += ["", "## Fitted serving-stack overhead", "",
              "| SKU | collective skew (µs × tp^1.25 per all-reduce) | per decoding sequence (ms) | "
              "prefill floor (ms per layer) | prefill step (ms per layer) |", "|---|---:|---:|---:|---:|"]
    for name, o in STACK_OVERHEADS.items():
        lines.append(f"| {name} | {o.collective_skew_s * 1e6:.1f} | {o.per_decode_seq_s * 1e3:.3f} | "
                     f"{o.prefill_floor_per_layer_s * 1e3:.3f} | {o.prefill_step_per_layer_s * 1e3:.3f} |")
    lines += ["", "## Memory", "",
              "| model | SKU | TP | weights GiB/GPU | reserve GiB/GPU | KV blocks (util 0.9, block 16) | KV tokens |",
              "|---|---|---:|---:|---:|---:|---:|"]
    for mname, sname, tp in (("llama-3-8b", "a100-80gb", 1), ("llama-3-8b", "h100-80gb", 1),
                             ("llama-3-70b", "a100-80gb", 4), ("llama-3-70b", "h100-80gb", 8),
                             ("llama-2-70b", "h100-80gb", 8)):
        m = IterationModel.build(mname, sname, tp, root)
        blocks = m.kv_capacity_blocks(0.9, 16)
        lines.append(f"| {mname} | {sname} | {tp} | {m.model.weight_bytes / tp / GIB:.2f} | "
                     f"{m.reserve_bytes_per_gpu / GIB:.2f} | {blocks:,} | {blocks * 16:,} |")
    lines += ["", _METHOD_TEXT]
    return "\n".join(lines) + "\n"


_METHOD_TEXT = """## Method

A step costs: the Vidur-profiled non-attention kernels (layers × the per-layer op times at the step's
token count, plus embedding and final norm; piecewise linear over tokens, linear past the profile);
an LM-head roofline (Vidur does not profile it); attention from first principles (decode reads the
whole context's K and V once at 70 % of peak HBM bandwidth, the share Vidur's own GEMV profiles
reach; prefill does 4 × layers × heads/tp × head_dim × Σ chunk × (context + chunk/2) FLOPs at 50 %
of peak BF16 on A100, 40 % on H100); two all-reduces per layer from Vidur's DGX collective profiles
(devices = tp); and four serving-stack terms fitted to splitwise Llama2-70B TP8 (a CPU skew per
collective growing as tp^1.25, a host cost per decoding sequence, and for steps with prefill a
per-layer cost and a per-layer floor, since short eager-mode prefills are bound by the host
enqueueing every layer's kernels). H100 Llama-3 profiles are the A100 Llama-3 profile × the per-op
H100/A100 ratio of the Llama-2 model with the same hidden size at the same tokens and TP (ratio of
2,048–4,096 tokens beyond 4,096); the derived H100 Llama-3-70B lands within 6 % of the measured
H100 Llama-2-70B (whose layers have the same shapes) at every TP and token count. KV capacity is per
GPU: memory × utilisation − weights/tp − a reserve (1 GiB for CUDA context, NCCL and graphs, the
activation peak of an 8,192-token profiling pass, fp32 logits of 256 sequences), divided by the
block's bytes.

What this means for users of the simulator. The stack terms reproduce splitwise's 2023 serving
stack, so they are pessimistic against a current vLLM (CUDA graphs, custom all-reduce, V1 engine):
TP > 1 steps carry 0.13–0.38 ms of collective cost per layer (we simulate SageServe's Llama-3.1-8B
TP2/TP4 decode 7–44 % slower than measured; the vLLM CI H200 TP4 figure is half ours), every decoding
sequence adds ~0.26–0.31 ms of host time per step, and a step with prefill takes at least
0.68–0.82 ms per layer (26 ms for Llama-3-8B on A100). TP1 steps have no collective terms; the vLLM
CI Llama-8B TP1 batch-8 figure on H200 is within the H200/H100 bandwidth ratio of ours. The tightest
tested figure is the H100 2,048-token prefill (splitwise's H100 prefill grows faster with prompt
length than Vidur's H100 kernels; at TP2/TP4 the gap reaches 15–19 %).
`IterationModel.build_with_overhead(..., ZERO_OVERHEAD)` gives the kernels-only model for comparison.

Not modelled: FP8 or other quantisation; H200 and other SKUs; CUDA-graph batch-size padding;
KV-cache write kernels; sampling cost beyond the per-sequence host term; speculative decoding;
pipeline or multi-node parallelism; the cost of swapping on preemption (the engine re-prefills);
attention-kernel efficiency that varies with batch or chunk shape."""


# ---------------------------------------------------------------------------------------------
# Benchmark and command line (`python -m controller.sim.calibration --table FILE | --fit | --bench`)


def benchmark_step_time(calls: int = 300_000, data_dir: Path | None = None) -> float:
    """Mean seconds per `step_time_s` call over a mix of decode, mixed and long-prefill steps.

    A benchmark, so it reads a timer; nothing else in this module does.
    """
    import time

    m = IterationModel.build("llama-3-8b", "h100-80gb", 1, data_dir)
    steps = [(0, 0.0, 64, 64 * 1500), (512, 512 * 2000.0, 120, 120 * 900), (8192, 8192 * 4096.0, 0, 0),
             (0, 0.0, 1, 300), (40_000, 4e8, 10, 10_000)]
    work = (steps * (calls // len(steps) + 1))[:calls]
    f = m.step_time_s
    t0 = time.perf_counter()
    for p, w, d, c in work:
        f(p, w, d, c)
    return (time.perf_counter() - t0) / calls


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m controller.sim.calibration", description=__doc__.split("\n")[0])
    ap.add_argument("--table", metavar="FILE", help="write the Markdown calibration table to FILE ('-' = stdout)")
    ap.add_argument("--fit", action="store_true", help="re-fit the serving-stack overhead to splitwise and print it")
    ap.add_argument("--bench", action="store_true", help="time step_time_s")
    ap.add_argument("--data-dir", default=None, help="shared data directory (default: shared_data_dir())")
    args = ap.parse_args(argv)
    data_dir = Path(args.data_dir) if args.data_dir else None
    if args.fit:
        for sku in SKUS:
            print(f"{sku}: {fit_stack_overhead(sku, data_dir)}")
            for tps in ((4, 8), (2, 4, 8)):
                print(f"  fitted on tp {tps}: {fit_stack_overhead(sku, data_dir, tps)}")
    if args.table:
        text = calibration_table_markdown(data_dir)
        if args.table == "-":
            sys.stdout.write(text)
        else:
            Path(args.table).write_text(text)
            print(f"wrote {args.table}")
    if args.bench:
        per_call = benchmark_step_time(data_dir=data_dir)
        print(f"step_time_s: {per_call * 1e6:.2f} µs per call")
    if not (args.fit or args.table or args.bench):
        ap.print_help()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
