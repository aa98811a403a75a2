"""Calibrated iteration time and memory of one vLLM replica (model × GPU SKU × tensor parallelism).

The simulator's engine asks `IterationModel.step_time_s` how long one continuous-batching step
takes, and `kv_capacity_blocks` / `fb_used_mib_per_gpu` how much KV cache a replica holds and what
DCGM would show; the learned models' prior physics and the planner's fitted step-time figures are
probed from the same model. This module only computes (the profiles come through
controller.perf.profiles, or, without the shared data, from the packaged compact grids of
controller.perf.steps_table); it must not read the wall clock, keep mutable state (the `build` memo
is a cache of a pure function of read-only files), or write anywhere.

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

import functools
import math
from bisect import bisect_right
from dataclasses import dataclass
from pathlib import Path

from controller.paths import shared_data_dir
from controller.perf.catalogue import (
    GEMM_FLOPS_FRAC,
    GIB,
    HBM_READ_FRAC,
    MODELS,
    NCCL_LAUNCH_S,
    NON_TORCH_GIB_PER_GPU,
    PROFILE_SEQS,
    PROFILE_TOKENS,
    SKUS,
    STACK_OVERHEADS,
    ZERO_OVERHEAD,
    GpuSku,
    ModelArch,
    StackOverhead,
)
from controller.perf.curves import grid_interp, interp, tail_slope
from controller.perf.profiles import all_reduce_profile, kernel_profile
from controller.perf.steps_table import STEP_GRIDS


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
    # The slots' types (annotations only: no class attributes, so `__slots__` stays as it is).
    model: ModelArch
    sku: GpuSku
    tp: int
    overhead: StackOverhead
    provenance: str
    reserve_bytes_per_gpu: float
    kv_bytes_per_token_per_gpu: int
    _grid_n: tuple[int, ...]
    _grid_s: tuple[float, ...]
    _grid_slope: tuple[float, ...]
    _n_last: int
    _s_last: float
    _tail_slope_s: float
    _lm_mem_s: float
    _lm_row_s: float
    _decode_ctx_s: float
    _prefill_work_s: float
    _seq_s: float
    _prefill_step_s: float
    _prefill_floor_s: float
    _layer_tokens: tuple[int, ...]
    _layer_s: tuple[float, ...]
    _iter_s: tuple[float, ...]
    _coll_grid_s: tuple[float, ...]
    _tails: tuple[float, float, float]

    def __init__(self, model: ModelArch, sku: GpuSku, tp: int, data_dir: Path | None,
                 overhead: StackOverhead) -> None:
        _check_fits(model, sku, tp)
        if data_dir is None:
            # The packaged compact grid (controller/perf/steps_table.py): the summed step time of the
            # profiles on fewer knots. `breakdown` then shows it all as non-attention time.
            tokens, summed, tail, provenance = packaged_grid(model.name, sku.name, tp)
            per_layer = [g / model.layers for g in summed]
            per_iter = [0.0] * len(tokens)
            coll_grid = [0.0] * len(tokens)
            tails = (tail, 0.0, 0.0)
        else:
            tokens, per_layer, per_iter, provenance = kernel_profile(data_dir, sku, model, tp)
            if tp > 1:
                sizes, ar_s = all_reduce_profile(data_dir, sku, tp)
                coll_fixed = NCCL_LAUNCH_S + overhead.collective_skew_s * tp**1.25
            else:
                sizes, ar_s, coll_fixed = (), (), 0.0
            n_coll = 2 * model.layers  # after attention (O projection) and after the MLP (down projection)

            def coll_at(n: float) -> float:
                return n_coll * (interp(sizes, ar_s, n * model.hidden * 2) + coll_fixed) if tp > 1 else 0.0

            # Each component on the token grid, with its own slope past the last point; the hot path
            # interpolates their sum, `breakdown` each one, so the two agree exactly.
            coll_grid = [coll_at(n) for n in tokens]
            tails = (model.layers * tail_slope(tokens, per_layer), tail_slope(tokens, per_iter),
                     n_coll * tail_slope(sizes, ar_s) * model.hidden * 2 if tp > 1 else 0.0)
        grid_s = [model.layers * pl + pi + c for pl, pi, c in zip(per_layer, per_iter, coll_grid, strict=True)]
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
        if MODELS[model].vidur_name is None or SKUS[sku].vidur_prefix is None:
            raise ValueError(f"{model} on {sku} is in the catalogue but not calibrated (no Vidur profile); "
                             f"calibrated: {calibrated_names()}; controller.perf.roofline times the others")
        if data_dir is not None:
            return _build_cached(model, sku, tp, Path(data_dir).resolve(), overhead)
        try:
            root = shared_data_dir()
        except FileNotFoundError as exc:
            # An installed package without the shared data: the packaged grid, made with the default overheads.
            if overhead != STACK_OVERHEADS.get(sku, ZERO_OVERHEAD):
                raise ValueError(f"{model} on {sku} with other serving-stack overheads needs the profiles: "
                                 f"{exc}") from None
            return _build_cached(model, sku, tp, None, overhead)
        return _build_cached(model, sku, tp, root, overhead)

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
        return self.model.layers * grid_interp(self._layer_tokens, self._layer_s, self._tails[0] / self.model.layers,
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
            per_iteration_s=grid_interp(self._layer_tokens, self._iter_s, self._tails[1], n),
            lm_head_s=max(self._lm_mem_s, rows * self._lm_row_s),
            collectives_s=grid_interp(self._layer_tokens, self._coll_grid_s, self._tails[2], n),
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


def packaged_grid(model: str, sku: str, tp: int) -> tuple[tuple[int, ...], tuple[float, ...], float, str]:
    """(tokens, summed step time of the kernels and collectives, slope past the last knot, provenance)
    of one calibrated engine from the packaged table; ValueError names an engine it lacks."""
    key = f"{model}/{sku}/tp{tp}"
    row = STEP_GRIDS.get(key)
    if row is None:
        raise ValueError(f"no packaged step-time grid for {key} (and no shared data); packaged: {sorted(STEP_GRIDS)}")
    tokens, summed, tail = row
    return tokens, summed, tail, "packaged grid controller/perf/steps_table.py (compact fit of the Vidur profiles)"


def calibrated_names() -> str:
    """The profiled models and SKUs, for messages."""
    models = sorted(k for k, m in MODELS.items() if m.vidur_name is not None)
    skus = sorted(k for k, g in SKUS.items() if g.vidur_prefix is not None)
    return f"models {models}, SKUs {skus}"


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
def _build_cached(model: str, sku: str, tp: int, data_dir: Path | None, overhead: StackOverhead) -> IterationModel:
    return IterationModel(MODELS[model], SKUS[sku], tp, data_dir, overhead)
