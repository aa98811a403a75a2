"""The config's `catalogue:` section: models and GPU SKUs a fleet runs that the built-in catalogue
(controller/perf/catalogue.py) does not list, and the check that every pool's engine resolves.

A declared model gives its shape (parameters, layers, hidden size, KV heads, head dim, dtype,
context); a declared SKU its data-sheet figures (HBM bandwidth, dense BF16 FLOP/s, memory,
interconnect, price). The roofline prior (controller/perf/roofline.py) times both. `pool_problems`
is what `Settings`' cross-field check runs, so `governor config validate` and `governor run` refuse
the same pools with the same messages. Must not: read files or open anything.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from controller.perf.engines import Catalogue, Engine, EngineError, declared_model, declared_sku, resolve_engine

EngineName = Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,62}$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelDeclSettings(_Strict):
    name: str = EngineName
    params: float = Field(gt=1e6, le=1e13)  # total parameters (all experts)
    layers: int = Field(ge=1, le=1024)
    hidden: int = Field(ge=64, le=131072)  # hidden size
    kv_heads: int = Field(ge=1, le=1024)
    head_dim: int = Field(ge=8, le=1024)
    dtype: Literal["bf16", "fp16", "fp8", "int8", "int4"] = "bf16"  # of the weights
    context: int = Field(default=8192, ge=128, le=10_000_000)  # max model length, tokens
    heads: int | None = Field(default=None, ge=1, le=4096)  # default hidden / head_dim
    vocab: int = Field(default=128_256, ge=1000, le=10_000_000)
    intermediate: int | None = Field(default=None, ge=1)  # MLP width; default what params implies
    experts: int = Field(default=1, ge=1, le=1024)
    experts_per_token: int = Field(default=1, ge=1, le=1024)
    served_name: str | None = None  # the engine's model_name label, if not `name`


class SkuDeclSettings(_Strict):
    name: str = EngineName
    hbm_tb_per_s: float = Field(gt=0, le=100)  # peak memory bandwidth, TB/s
    dense_bf16_tflops: float = Field(gt=0, le=100_000)  # peak dense BF16 (no sparsity), TFLOP/s
    memory_gib: float = Field(gt=0, le=10_000)  # GPU memory as the driver reports it
    interconnect_gb_per_s: float = Field(default=32.0, gt=0, le=100_000)  # GPU-to-GPU per GPU (PCIe Gen4: 32)
    usd_per_gpu_hour: float = Field(default=0.0, ge=0, le=1000)  # informational: pools state their price
    dcgm_model_name: str | None = None


class CatalogueSettings(_Strict):
    models: list[ModelDeclSettings] = Field(default_factory=list)
    skus: list[SkuDeclSettings] = Field(default_factory=list)

    def build(self) -> Catalogue:
        """The built-in catalogue plus these declarations. ValueError names a bad or clashing one."""
        models = []
        for m in self.models:
            models.append(declared_model(**m.model_dump()))
        skus = [declared_sku(**s.model_dump()) for s in self.skus]
        return Catalogue.builtin().with_declared(models, skus)


def catalogue_problems(cat: CatalogueSettings) -> list[tuple[tuple[str | int, ...], str]]:
    """(location, message) for each declaration that does not hold together."""
    out: list[tuple[tuple[str | int, ...], str]] = []
    for i, m in enumerate(cat.models):
        try:
            declared_model(**m.model_dump())
        except ValueError as exc:
            out.append((("catalogue", "models", i), f"{m.name}: {exc}"))
        if m.experts_per_token > m.experts:
            out.append((("catalogue", "models", i, "experts_per_token"),
                        f"{m.experts_per_token} must be <= experts ({m.experts})"))
    for kind, items in (("models", cat.models), ("skus", cat.skus)):
        names = [x.name for x in items]
        for i, n in enumerate(names):
            if names.index(n) != i:
                out.append((("catalogue", kind, i, "name"), f"{n!r} duplicates catalogue.{kind}[{names.index(n)}]"))
    if not out:
        try:
            cat.build()
        except ValueError as exc:
            out.append((("catalogue",), str(exc)))
    return out


def pool_engines(cat: CatalogueSettings, pools) -> tuple[dict[str, Engine], list[tuple[tuple[str | int, ...], str]]]:
    """Each pool's engine by pool name, and (location, message) for each pool whose engine does not resolve."""
    catalogue = cat.build()
    engines: dict[str, Engine] = {}
    problems: list[tuple[tuple[str | int, ...], str]] = []
    for i, pool in enumerate(pools):
        try:
            engines[pool.name] = resolve_engine(catalogue, pool.model, pool.sku, pool.gpus_per_replica)
        except EngineError as exc:
            problems.append((("pools", i, exc.field), str(exc)))
    return engines, problems
