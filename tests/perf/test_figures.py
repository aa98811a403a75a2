"""The planner's engine figures: the generated table, its generator, the roofline fallback, and the
performance package's import boundary."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import numpy as np
import pytest

from controller.perf import figures_gen
from controller.perf.engine_figures import EngineFigures, engine_figures_in_units
from controller.perf.figures import PROFILED_FIGURES, figures_for
from controller.perf.figures_table import FITTED_FIGURES
from controller.types import PoolSpec

PERF_DIR = Path(figures_gen.__file__).resolve().parent


def test_the_table_module_is_in_its_generated_form():
    assert figures_gen.TABLE_PATH.read_text() == figures_gen.render(FITTED_FIGURES)
    assert tuple(FITTED_FIGURES) == figures_gen.ENGINES


def test_profiled_figures_are_the_table_in_seconds():
    assert set(PROFILED_FIGURES) == set(FITTED_FIGURES)
    f = PROFILED_FIGURES["llama-3-8b/a100-80gb/tp1"]
    assert f == engine_figures_in_units(9.662, 0.3576, 91.906, 65.41, 3416.1, 452_464)
    assert f.a_s == 9.662 * 1e-3 and f.kv_tokens == 452_464 and f.source == "profile"


def test_the_kv_column_is_the_iteration_models_capacity():
    for key, row in FITTED_FIGURES.items():
        assert figures_gen.fit_engine(key)[5] == row[5], key


def test_the_table_is_what_the_generator_fits():
    assert figures_gen.main(["--check"]) == 0


@pytest.mark.parametrize("key", ["llama-3-70b/h100-80gb/tp4", "llama-3-8b/a100-80gb/tp1"])
def test_the_fit_tracks_decode_and_prefill_steps_alike(key):
    """The two regimes weigh half each: neither the decode step (TPOT) nor the prefill step (TTFT) is
    traded away for the other's many grid rows. Bounds: a few % median, under 10 % at p90."""
    from controller.perf.engine_figures import EngineFigures
    from controller.perf.iteration import IterationModel

    model, sku, tp = key.split("/")
    m = IterationModel.build(model, sku, int(tp.removeprefix("tp")))
    a, b, c, d, e, _ = (v * u for v, u in zip(FITTED_FIGURES[key], (1e-3, 1e-3, 1e-9, 1e-6, 1e-12, 1), strict=True))
    fig = EngineFigures(a, b, c, d, e, 1.0)
    dec, pre = [], []
    for seqs in (1, 16, 64, 128, 256):
        for ctx in (512, 2048, 8192):
            t = fig.a_s + fig.b_s_per_seq * seqs + fig.c_s_per_ctx_token * seqs * ctx
            dec.append(abs(t / m.step_time_s(0, 0.0, seqs, seqs * ctx) - 1))
            for chunk in (256, 2048, 8192):
                work = chunk * (ctx + chunk / 2)
                t_p = t + fig.d_s_per_prefill_token * chunk + fig.e_s_per_attn_work * work
                pre.append(abs(t_p / m.step_time_s(chunk, work, seqs, seqs * ctx) - 1))
    for name, errs in (("decode-only", dec), ("with prefill", pre)):
        assert np.median(errs) < 0.05 and np.quantile(errs, 0.9) < 0.10, (key, name, np.median(errs))


def test_the_render_prints_the_tables_digits():
    text = figures_gen.render({"m/s/tp1": (9.398, 0.3586, 92.671, 65.31, 3368.1, 452_464),
                               "m/s/tp2": (8.272, 0.2843, 367.18, 21.5, 412.5, 1_403_088)})
    assert '"m/s/tp1": (9.398, 0.3586, 92.671, 65.31, 3368.1, 452_464),' in text
    assert '"m/s/tp2": (8.272, 0.2843, 367.18, 21.50, 412.5, 1_403_088),' in text


def test_the_roofline_reads_the_catalogue_with_the_planners_figures():
    # H100 at 79.6 GiB (the catalogue's 81,559 MiB to 0.1 GiB), 3.35 TB/s, 989 TFLOP/s
    f = figures_for(PoolSpec("x", "llama-2-13b", "h100-80gb", gpus_per_replica=2))
    params, tp, bw, flops, mem = 13e9, 2, 3.35e12, 989e12, 79.6 * 2**30
    kv_per_token = 131072.0 * math.sqrt(params / 8e9)
    assert f.source == "roofline"
    assert f.a_s == 2.0 * params / (tp * bw * 0.6) + 0.004
    assert f.d_s_per_prefill_token == 2.0 * params / (tp * flops * 0.5)
    assert f.c_s_per_ctx_token == kv_per_token / (tp * bw * 0.7)
    assert f.kv_tokens == max(1e4, (tp * mem * 0.9 - 2.0 * params - tp * 2 * 2**30) / kv_per_token)
    a100 = figures_for(PoolSpec("x", "llama-2-13b", "a100-80gb", gpus_per_replica=1))
    assert a100.a_s == 2.0 * 13e9 / (2.039e12 * 0.6) + 0.004
    assert a100.kv_tokens == max(1e4, (80 * 2**30 * 0.9 - 2.0 * 13e9 - 2 * 2**30) / (131072.0 * math.sqrt(13 / 8)))
    other = figures_for(PoolSpec("x", "llama-2-13b", "b200", gpus_per_replica=1))
    assert other.a_s == 2.0 * 13e9 / (2.0e12 * 0.6) + 0.004
    with pytest.raises(ValueError, match="missing field"):
        EngineFigures.of({"a_s": 0.01})


FORBIDDEN = ("sim", "core", "policies", "bench", "runtime", "learning", "telemetry", "actuation", "api")


def test_perf_imports_none_of_its_consumers():
    for path in sorted(PERF_DIR.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                parts = name.split(".")
                assert not (parts[0] == "controller" and len(parts) > 1 and parts[1] in FORBIDDEN), (path.name, name)
