"""Pool physics for the coupling priors, tabulated from the calibrated step-time model.

The edge probes the one performance model, `controller.perf.iteration.IterationModel` (Vidur
profiles + first-principles attention; the simulator's engine times its steps with the same
model), once per replica type and hands the core a `PoolPhysics` value: decode and prefill step
times on `TOKEN_GRID`, the per-context-token decode cost, the attention cost per unit of prefill
work and the KV capacity. A real fleet of a known model × SKU × TP uses the same table; its errors are what
the learned corrections absorb.

The daemon (`physics_for_pool_spec`) reads no file: a calibrated engine's values come from the
packaged table `controller.perf.physics_table` (exactly what probing gives; `make perf-tables`
regenerates it from ../shared/data), any other engine's from the roofline prior
(`controller.perf.roofline`). The simulator's training runs (`physics_for_scenario_pool`) probe the
model itself, at the scenario's engine settings.

Must not: keep state between calls beyond IterationModel's own per-key cache, or import the simulator.
"""

from __future__ import annotations

from pathlib import Path

from controller.core.coupling import PoolPhysics
from controller.perf.engines import Catalogue, Engine, resolve_engine
from controller.perf.iteration import IterationModel
from controller.perf.physics_gen import BLOCK_SIZE, GPU_MEMORY_UTILIZATION, PhysicsRow, probe

DEFAULT_GPU_MEMORY_UTILIZATION = GPU_MEMORY_UTILIZATION
DEFAULT_BLOCK_SIZE = BLOCK_SIZE


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
    return physics_from_row(physics_key(model, sku, tp), probe(im, gpu_memory_utilization, block_size),
                            max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens)


def physics_from_row(key: str, row: PhysicsRow, *, max_num_seqs: int = 256,
                     max_num_batched_tokens: int = 8192) -> PoolPhysics:
    decode, prefill, ctx, attn, seq, kv_tokens = row
    return PoolPhysics(key=key, decode_step_s=tuple(decode), prefill_step_s=tuple(prefill),
                       decode_ctx_s_per_token=ctx, prefill_attn_s_per_work=attn,
                       kv_capacity_tokens=float(kv_tokens), mixed_seq_s=seq, max_num_seqs=int(max_num_seqs),
                       max_num_batched_tokens=int(max_num_batched_tokens))


def physics_for_scenario_pool(pool) -> PoolPhysics:
    """PoolPhysics of a scenario pool (controller.sim.scenario.PoolSpecModel)."""
    e = pool.engine
    return build_physics(pool.model, pool.sku, pool.tp, gpu_memory_utilization=e.gpu_memory_utilization,
                         block_size=e.block_size, max_num_seqs=e.max_num_seqs,
                         max_num_batched_tokens=e.max_num_batched_tokens)


def physics_for_pool_spec(pool, engine: Engine | None = None) -> PoolPhysics:
    """PoolPhysics of a daemon pool (controller.types.PoolSpec or config PoolSettings): TP = GPUs per
    replica. `engine` is the pool's resolved engine (`Settings.engines()`, which knows the config's
    declared models and SKUs); without it the built-in catalogue resolves the pool. A calibrated engine
    gets the packaged table's values, any other the roofline's. ValueError names what does not resolve."""
    if engine is None:
        engine = resolve_engine(Catalogue.builtin(), pool.model, pool.sku, int(pool.gpus_per_replica))
    return physics_from_row(engine.key, engine.physics, max_num_seqs=pool.max_num_seqs,
                            max_num_batched_tokens=pool.max_num_batched_tokens)
