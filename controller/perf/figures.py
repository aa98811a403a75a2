"""Where a pool's step-time figures (`EngineFigures`, controller/perf/engine_figures.py) come from: the
fitted table (`PROFILED_FIGURES`, generated into controller/perf/figures_table.py by
`python -m controller.perf.figures_gen --write`) or, for an engine nobody profiled, the roofline
prior (controller/perf/roofline.py) from the model's shapes and the SKU's data sheet
(controller.perf.catalogue), else a guess from the parameter count in the name.

Pure data and arithmetic: must not read files, the clock or randomness (the fit that makes the
table lives in controller.perf.figures_gen).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from controller.perf.catalogue import GIB, MODELS, SKUS
from controller.perf.engine_figures import EngineFigures, engine_figures_in_units
from controller.perf.figures_table import FITTED_FIGURES
from controller.perf.roofline import roofline
from controller.types import PoolSpec

# Fitted step-time figures per "model/sku/tpN" (vLLM-style engine, bf16, gpu_memory_utilization 0.9,
# block 16): see controller.perf.figures_gen for the fit.
PROFILED_FIGURES: Mapping[str, EngineFigures] = {k: engine_figures_in_units(*v) for k, v in FITTED_FIGURES.items()}

# The roofline's figures for a SKU the catalogue does not list: (HBM bytes/s, dense BF16 FLOP/s, memory bytes).
_UNKNOWN_SKU_SHEET = (2.0e12, 300e12, 80 * 2**30)


def _sku_sheet(sku: str) -> tuple[float, float, float]:
    """(HBM bytes/s, dense BF16 FLOP/s, memory bytes) of `sku` from the catalogue, memory to 0.1 GiB
    (H100: 79.6 GiB of its 79.65), the precision the roofline's figures were set at."""
    s = SKUS.get(sku)
    if s is None:
        return _UNKNOWN_SKU_SHEET
    return s.hbm_bytes_per_s, s.dense_bf16_flops, round(s.memory_gib, 1) * GIB


def figures_key(pool: PoolSpec) -> str:
    return f"{pool.model}/{pool.sku}/tp{pool.gpus_per_replica}"


def figures_for(pool: PoolSpec, table: Mapping[str, EngineFigures] = PROFILED_FIGURES) -> EngineFigures:
    """The pool's step-time figures: from the table, else for a catalogue model and SKU the roofline
    prior (controller.perf.roofline), else (a name outside the catalogue, which the daemon's config
    refuses; tests and hand-built specs may use one) a guess from the parameter count in the name:
    a = weight bytes / (tp × HBM × 0.6); d = 2 × params / (tp × FLOPs × 0.5); per-token KV bytes from a Llama-like shape
    (params^0.5 scaling). Example: a 13B model on one A100 → a = 26 GB / 1.22 TB/s = 21 ms.
    """
    key = figures_key(pool)
    if key in table:
        return table[key]
    if pool.model in MODELS and pool.sku in SKUS:
        # a catalogue engine: the roofline prior from its shapes and data sheet (controller.perf.roofline)
        return roofline(MODELS[pool.model], SKUS[pool.sku], max(1, pool.gpus_per_replica)).figures()
    m = re.search(r"(\d+(?:\.\d+)?)b", pool.model.lower())
    params = float(m.group(1)) * 1e9 if m else 8e9
    bw, flops, mem = _sku_sheet(pool.sku)
    tp = max(1, pool.gpus_per_replica)
    weight_bytes = 2.0 * params
    a = weight_bytes / (tp * bw * 0.6) + 0.004
    d = 2.0 * params / (tp * flops * 0.5)
    kv_per_token = 131072.0 * math.sqrt(params / 8e9)
    kv_tokens = max(1e4, (tp * mem * 0.9 - weight_bytes - tp * 2 * 2**30) / kv_per_token)
    c = kv_per_token / (tp * bw * 0.7)
    return EngineFigures(a_s=a, b_s_per_seq=0.35e-3, c_s_per_ctx_token=c, d_s_per_prefill_token=d,
                         e_s_per_attn_work=d * 0.05 / 1000.0, kv_tokens=kv_tokens, source="roofline")
