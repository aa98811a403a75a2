"""Pool physics for the coupling priors, tabulated from the calibrated step-time model.

The edge probes the one performance model, `controller.perf.iteration.IterationModel` (Vidur
profiles + first-principles attention; the simulator's engine times its steps with the same
model), once per replica type and hands the core a `PoolPhysics` value: decode and prefill step
times on `TOKEN_GRID`, the per-context-token decode cost, the attention cost per unit of prefill
work and the KV capacity. A real fleet of a known model × SKU × TP uses the same table; its errors are what
the learned corrections absorb.

Must not: keep state between calls beyond IterationModel's own per-key cache, or import the simulator.
"""

from __future__ import annotations

from pathlib import Path

from controller.core.coupling import TOKEN_GRID, PoolPhysics
from controller.perf.iteration import IterationModel

DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
DEFAULT_BLOCK_SIZE = 16


def physics_key(model: str, sku: str, tp: int) -> str:
    return f"{model}/{sku}/tp{tp}"


def build_physics(model: str, sku: str, tp: int, *, gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
                  block_size: int = DEFAULT_BLOCK_SIZE, max_num_seqs: int = 256, max_num_batched_tokens: int = 8192,
                  data_dir: Path | None = None) -> PoolPhysics:
    """Probe the calibrated IterationModel on TOKEN_GRID. ValueError names an unknown model/SKU/TP.

    Example (Llama-3-8B, A100, TP1): decode_step_s at 64 seqs = 32 ms; prefill_step_s at 2,048
    tokens = 145 ms; decode context 92 ns per token; KV capacity ≈ 452k tokens at util 0.9.
    """
    im = IterationModel.build(model, sku, int(tp), data_dir)
    decode = tuple(im.step_time_s(0, 0.0, int(n), 0) for n in TOKEN_GRID)
    prefill = tuple(im.step_time_s(int(n), 0.0, 0, 0) for n in TOKEN_GRID)
    ctx_probe = 100_000
    ctx = (im.step_time_s(0, 0.0, 8, ctx_probe) - im.step_time_s(0, 0.0, 8, 0)) / ctx_probe
    work = 1024.0 * 2048.0
    attn = (im.step_time_s(1024, work, 0, 0) - im.step_time_s(1024, 0.0, 0, 0)) / work
    kv_tokens = im.kv_capacity_blocks(gpu_memory_utilization, block_size) * block_size
    seq = (im.step_time_s(512, 0.0, 64, 0) - im.step_time_s(576, 0.0, 0, 0)) / 64
    return PoolPhysics(key=physics_key(model, sku, tp), decode_step_s=decode, prefill_step_s=prefill,
                       decode_ctx_s_per_token=max(ctx, 0.0), prefill_attn_s_per_work=max(attn, 0.0),
                       kv_capacity_tokens=float(kv_tokens), mixed_seq_s=max(seq, 0.0), max_num_seqs=int(max_num_seqs),
                       max_num_batched_tokens=int(max_num_batched_tokens))


def physics_for_scenario_pool(pool) -> PoolPhysics:
    """PoolPhysics of a scenario pool (controller.sim.scenario.PoolSpecModel)."""
    e = pool.engine
    return build_physics(pool.model, pool.sku, pool.tp, gpu_memory_utilization=e.gpu_memory_utilization,
                         block_size=e.block_size, max_num_seqs=e.max_num_seqs,
                         max_num_batched_tokens=e.max_num_batched_tokens)


def physics_for_pool_spec(pool) -> PoolPhysics:
    """PoolPhysics of a daemon pool (controller.types.PoolSpec or config PoolSettings): TP = GPUs per replica."""
    return build_physics(pool.model, pool.sku, int(pool.gpus_per_replica), max_num_seqs=pool.max_num_seqs,
                         max_num_batched_tokens=pool.max_num_batched_tokens)
