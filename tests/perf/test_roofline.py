"""The roofline prior: its terms from the data sheets, its capacity within 25 % of the calibrated
model's on the calibrated pairs (docs/BENCHMARKS.md), and the catalogue entries it times."""

from __future__ import annotations

import pytest

from controller.perf import roofline as rl_mod
from controller.perf.catalogue import HBM_READ_FRAC, MODELS, SKUS
from controller.perf.engines import Catalogue, EngineError, declared_model, declared_sku, resolve_engine
from controller.perf.iteration import IterationModel
from controller.perf.roofline import capacity, compare, fit_problem, reserve_bytes_per_gpu, roofline


def test_capacity_is_within_25_percent_of_the_calibrated_model_on_every_calibrated_pair():
    rows = compare()
    assert {r["engine"] for r in rows} == set(rl_mod.COMPARE_PAIRS) and len(rows) == 8
    for r in rows:
        assert abs(float(str(r["error"]))) < 0.25, r
        assert abs(float(str(r["generic_error"]))) < 0.25, r


def test_the_terms_come_from_the_data_sheet():
    qwen, l40s = MODELS["qwen-2.5-7b"], SKUS["l40s-48gb"]
    r = roofline(qwen, l40s, 1)
    assert r.weights_read_s == qwen.params * 2 / (864e9 * HBM_READ_FRAC)
    assert r.kv_read_s_per_token == 28 * 4 * 128 * 4 / (864e9 * HBM_READ_FRAC)  # 56 KiB of K and V per token
    assert r.collective_s == 0.0 and r.collective_s_per_token == 0.0
    # Mixtral prefill goes through 2 of 8 experts: the active parameters, not all 46.7B
    mix = roofline(MODELS["mixtral-8x7b"], SKUS["h100-80gb"], 2)
    assert mix.gemm_s_per_token == pytest.approx(2 * 12_879_925_248 / 2 / (989e12 * 0.6))
    assert mix.collective_s > 0 and mix.weights_read_s == pytest.approx(46_702_792_704 * 2 / 2 / (3.35e12 * 0.7))


def test_l40s_llama_8b_figures_quoted_by_the_mixed_sku_scenario():
    """scenarios/mixed-sku.yaml sizes its L40S pool with these figures (data sheet: 864 GB/s GDDR6,
    362 TFLOPS dense BF16, 48 GB; PCIe, no NVLink) and compares them with the calibrated A100."""
    l40s = SKUS["l40s-48gb"]
    assert (l40s.hbm_bytes_per_s, l40s.dense_bf16_flops, l40s.usd_per_gpu_hour) == (864e9, 362.05e12, 1.86)
    r = roofline(MODELS["llama-3-8b"], l40s, 1)
    a100 = IterationModel.build("llama-3-8b", "a100-80gb", 1)
    prefill = 1024 / r.step_time_s(1024, 1024 * 1000.0, 0, 0)  # a 1,024-token chunk at ~2k context
    decode = 64 / r.step_time_s(0, 0.0, 64, 64 * 2000)  # batch 64 at 2k context
    assert prefill == pytest.approx(9_700, rel=0.03) and decode == pytest.approx(830, rel=0.03)
    assert 1024 / r.step_time_s(1024, 1024 * 1000.0, 0, 0) < 1024 / a100.step_time_s(1024, 1024 * 1000.0, 0, 0)
    # a 1,024-token chunk is over the 100 ms critical TPOT, a 512-token one under it (why the pool runs 512)
    assert r.step_time_s(1024, 1024 * 1000.0, 0, 0) > 0.1 > r.step_time_s(512, 512 * 1000.0, 0, 0)


def test_the_reserve_is_the_calibrated_models():
    for model, sku, tp in (("llama-3-8b", "a100-80gb", 1), ("llama-3-70b", "h100-80gb", 4)):
        im = IterationModel.build(model, sku, tp)
        assert reserve_bytes_per_gpu(MODELS[model], tp) == im.reserve_bytes_per_gpu


def test_what_cannot_run_says_why():
    assert "use tp >= 4" in str(fit_problem(MODELS["qwen-2.5-72b"], SKUS["l40s-48gb"], 2))
    assert "does not divide" in str(fit_problem(MODELS["qwen-2.5-7b"], SKUS["h100-80gb"], 8))  # 28 heads
    assert fit_problem(MODELS["qwen-2.5-72b"], SKUS["mi300x-192gb"], 1) is None
    with pytest.raises(ValueError, match="batch"):
        capacity(lambda *a: 1.0, 1e6, 100, 100, tpot_slo_s=0.1)


def test_resolve_uses_the_table_for_calibrated_pairs_and_the_roofline_elsewhere():
    cat = Catalogue.builtin()
    assert resolve_engine(cat, "llama-3-8b", "a100", 1).source == "calibrated"
    assert resolve_engine(cat, "llama-3-8b", "a100", 1).figures.source == "profile"
    e = resolve_engine(cat, "llama-3.3-70b", "h200", 4)
    assert (e.key, e.source, e.figures.source) == ("llama-3.1-70b/h200-141gb/tp4", "roofline", "roofline")
    with pytest.raises(EngineError, match="unknown sku 'b300'") as err:
        resolve_engine(cat, "llama-3-8b", "b300", 1)
    assert err.value.field == "sku"


def test_a_declared_model_gets_the_width_its_parameter_count_implies():
    m = declared_model("x", params=8_030_261_248, layers=32, hidden=4096, kv_heads=8, head_dim=128)
    assert m.intermediate == 14_336 and m.heads == 32  # Llama-3-8B's shapes back from its count
    sku = declared_sku("g", hbm_tb_per_s=2.0, dense_bf16_tflops=400, memory_gib=64)
    cat = Catalogue.builtin().with_declared([m], [sku])
    assert resolve_engine(cat, "x", "g", 1).source == "roofline"
    with pytest.raises(ValueError, match="already in the catalogue"):
        Catalogue.builtin().with_declared([declared_model("mistral-7b", params=7e9, layers=32, hidden=4096,
                                                          kv_heads=8, head_dim=128)])
