"""Which engine a pool runs and what the daemon plans it with: the catalogue (built-in models and SKUs
plus those a config declares) and `resolve_engine`, the one place a model × SKU × TP becomes figures.

`resolve_engine` gives a calibrated engine (Llama on A100/H100, every TP that fits) the packaged
calibrated figures (controller.perf.figures_table, physics_table), and any other the roofline prior
(controller.perf.roofline). `governor config validate` and `governor run` both reach it through
`Settings` (controller.config), so what validates is what starts. Errors are `EngineError`, naming
the pool field at fault and the unknown name, with the known ones.

Pure values and arithmetic: must not read files or hold mutable state.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from controller.perf.catalogue import (
    CALIBRATED_MODELS,
    CALIBRATED_SKUS,
    MODEL_ALIASES,
    MODELS,
    SKU_ALIASES,
    SKUS,
    GpuSku,
    ModelArch,
)
from controller.perf.engine_figures import EngineFigures
from controller.perf.figures import PROFILED_FIGURES
from controller.perf.iteration import IterationModel
from controller.perf.physics_gen import TOKEN_GRID, PhysicsRow
from controller.perf.physics_table import PHYSICS
from controller.perf.roofline import Roofline, roofline

# Bytes per weight of the dtypes a declared model may name.
DTYPE_BYTES: Mapping[str, float] = MappingProxyType({"bf16": 2, "fp16": 2, "fp8": 1, "int8": 1, "int4": 0.5})


class EngineError(ValueError):
    """A pool's engine cannot be resolved; `field` is the pool field at fault (model, sku, gpus_per_replica)."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(message)


@dataclass(frozen=True)
class Catalogue:
    """Models and SKUs by name, with the short names an operator may write."""

    models: Mapping[str, ModelArch]
    skus: Mapping[str, GpuSku]
    model_aliases: Mapping[str, str] = field(default_factory=lambda: MODEL_ALIASES)
    sku_aliases: Mapping[str, str] = field(default_factory=lambda: SKU_ALIASES)

    @staticmethod
    def builtin() -> Catalogue:
        return Catalogue(MODELS, SKUS)

    def with_declared(self, models: Iterable[ModelArch] = (), skus: Iterable[GpuSku] = ()) -> Catalogue:
        """This catalogue plus declared entries. ValueError if a declared name is a built-in one or an alias."""
        new_models = dict(self.models)
        new_skus = dict(self.skus)
        for m in models:
            if m.name in new_models or m.name in self.model_aliases:
                raise ValueError(f"model {m.name!r} is already in the catalogue; declare it under another name")
            new_models[m.name] = m
        for s in skus:
            if s.name in new_skus or s.name in self.sku_aliases:
                raise ValueError(f"sku {s.name!r} is already in the catalogue; declare it under another name")
            new_skus[s.name] = s
        return Catalogue(MappingProxyType(new_models), MappingProxyType(new_skus), self.model_aliases,
                         self.sku_aliases)

    def model(self, name: str) -> ModelArch:
        canonical = self.model_aliases.get(name, name)
        if canonical not in self.models:
            known = ", ".join(sorted(self.models))
            raise EngineError("model", f"unknown model {name!r}: not in the catalogue ({known}) "
                              "and not declared under catalogue.models")
        return self.models[canonical]

    def sku(self, name: str) -> GpuSku:
        canonical = self.sku_aliases.get(name, name)
        if canonical not in self.skus:
            known = ", ".join(sorted(self.skus))
            raise EngineError("sku", f"unknown sku {name!r}: not in the catalogue ({known}) "
                              "and not declared under catalogue.skus")
        return self.skus[canonical]


@dataclass(frozen=True)
class Engine:
    """One pool's engine as the daemon plans it."""

    key: str  # "model/sku/tpN", canonical names
    arch: ModelArch
    sku: GpuSku
    tp: int
    source: Literal["calibrated", "roofline"]  # where the priors' physics comes from
    figures: EngineFigures  # the planner's step-time figures
    physics: PhysicsRow  # the learned models' prior physics (controller.learning.physics)


def resolve_engine(catalogue: Catalogue, model: str, sku: str, tp: int) -> Engine:
    """The engine of `model` on `tp` × `sku`. EngineError names what is unknown or does not fit."""
    arch = catalogue.model(model)
    gpu = catalogue.sku(sku)
    key = f"{arch.name}/{gpu.name}/tp{tp}"
    calibrated = MODELS.get(arch.name) is arch and SKUS.get(gpu.name) is gpu and key in PHYSICS
    try:
        rl = roofline(arch, gpu, tp)
        figures = PROFILED_FIGURES[key] if calibrated and key in PROFILED_FIGURES else rl.figures()
    except ValueError as exc:
        raise EngineError("gpus_per_replica", str(exc)) from None
    if calibrated:
        return Engine(key, arch, gpu, tp, "calibrated", figures, PHYSICS[key])
    return Engine(key, arch, gpu, tp, "roofline", figures, roofline_physics(rl))


def step_model(arch: ModelArch, sku: GpuSku, tp: int) -> IterationModel | Roofline:
    """What the simulator times a replica with: the calibrated model of a calibrated pair, the
    roofline of any other (both give step_time_s, kv_capacity_blocks, fb_used_mib_per_gpu)."""
    if arch.name in CALIBRATED_MODELS and MODELS[arch.name] is arch and sku.name in CALIBRATED_SKUS \
            and SKUS[sku.name] is sku:
        return IterationModel.build(arch.name, sku.name, tp)
    return roofline(arch, sku, tp)


def roofline_physics(rl: Roofline) -> PhysicsRow:
    """The priors' physics of a roofline engine, probed as physics_gen probes the calibrated model."""
    decode = tuple(rl.step_time_s(0, 0.0, n, 0) for n in TOKEN_GRID)
    prefill = tuple(rl.step_time_s(n, 0.0, 0, 0) for n in TOKEN_GRID)
    seq = (rl.step_time_s(512, 0.0, 64, 0) - rl.step_time_s(576, 0.0, 0, 0)) / 64
    kv = rl.kv_capacity_blocks(0.9, 16) * 16
    return decode, prefill, rl.kv_read_s_per_token, rl.attn_s_per_work, max(seq, 0.0), int(kv)


def declared_model(name: str, *, params: float, layers: int, hidden: int, kv_heads: int, head_dim: int,
                   dtype: str = "bf16", context: int = 8192, heads: int | None = None, vocab: int = 128_256,
                   intermediate: int | None = None, experts: int = 1, experts_per_token: int = 1,
                   served_name: str | None = None) -> ModelArch:
    """A ModelArch from a config's declaration. Without `intermediate`, the MLP width the parameter count
    implies (it only sizes the activation reserve). ValueError names a field that does not add up."""
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype {dtype!r}: one of {', '.join(DTYPE_BYTES)}")
    q_heads = heads if heads is not None else hidden // head_dim
    if q_heads < 1 or q_heads % kv_heads:
        raise ValueError(f"heads ({q_heads}) must be a multiple of kv_heads ({kv_heads})")
    if intermediate is None:
        attn = hidden * (q_heads + 2 * kv_heads) * head_dim + q_heads * head_dim * hidden
        rest = params - 2 * vocab * hidden - layers * (attn + 2 * hidden)
        intermediate = int(rest / (layers * experts * 3 * hidden)) if rest > 0 else 0
        if intermediate < 1:
            raise ValueError(f"params ({params:g}) is too small for {layers} layers of hidden size {hidden} "
                             f"and a {vocab}-token vocabulary")
    return ModelArch(name=name, served_name=served_name or name, params=int(params), layers=layers, hidden=hidden,
                     heads=q_heads, kv_heads=kv_heads, head_dim=head_dim, vocab=vocab,
                     weight_bytes_per_param=DTYPE_BYTES[dtype], max_model_len=context, intermediate=intermediate,
                     experts=experts, experts_per_token=experts_per_token)


def declared_sku(name: str, *, hbm_tb_per_s: float, dense_bf16_tflops: float, memory_gib: float,
                 interconnect_gb_per_s: float = 32.0, usd_per_gpu_hour: float = 0.0,
                 dcgm_model_name: str | None = None) -> GpuSku:
    """A GpuSku from a config's declaration (data-sheet units: TB/s, TFLOP/s, GiB, GB/s)."""
    return GpuSku(name=name, dcgm_model_name=dcgm_model_name or name, memory_gib=memory_gib,
                  hbm_bytes_per_s=hbm_tb_per_s * 1e12, usd_per_gpu_hour=usd_per_gpu_hour,
                  price_source="declared in the config", dense_bf16_flops=dense_bf16_tflops * 1e12,
                  attention_flops_frac=0.40, interconnect_bytes_per_s=interconnect_gb_per_s * 1e9)
