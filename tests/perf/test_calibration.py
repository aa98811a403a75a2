"""The calibrated iteration-time and memory model against published figures and physical sanity."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from controller.paths import shared_data_dir
from controller.perf import report
from controller.perf.catalogue import (
    HBM_READ_FRAC,
    MODELS,
    SKUS,
    STACK_OVERHEADS,
    ZERO_OVERHEAD,
)
from controller.perf.fit import fit_stack_overhead
from controller.perf.iteration import IterationModel

TOLERANCE_FRAC = 0.10


@dataclass(frozen=True)
class Figure:
    """One published figure (shared data README) and the step that should reproduce it."""

    label: str
    model: str
    sku: str
    tp: int
    quantity: str  # "non_attention" | "step"
    prefill_tokens: int
    decode_seqs: int
    context_per_seq: int
    reference_ms: float


def _nonattn(model: str, sku: str, n: int, ms: float) -> Figure:
    return Figure(f"Vidur {model} {sku} non-attention {n} tok", model, sku, 1, "non_attention", n, 0, 0, ms)


# splitwise's batched rows all have 512-token prompts and 128 output tokens: context 512 + 64.
CTX = 576
FIGURES = [
    _nonattn("llama-3-8b", "a100-80gb", 1, 9.7),
    _nonattn("llama-3-8b", "a100-80gb", 128, 13.2),
    _nonattn("llama-3-8b", "a100-80gb", 512, 34.7),
    _nonattn("llama-3-8b", "a100-80gb", 2048, 141.9),
    _nonattn("llama-2-7b", "h100-80gb", 1, 5.6),
    _nonattn("llama-2-7b", "h100-80gb", 128, 6.4),
    _nonattn("llama-2-7b", "h100-80gb", 512, 12.0),
    _nonattn("llama-2-7b", "h100-80gb", 2048, 40.6),
    Figure("splitwise H100 TP8 prefill 128", "llama-2-70b", "h100-80gb", 8, "step", 128, 0, 0, 58.0),
    Figure("splitwise H100 TP8 prefill 2048", "llama-2-70b", "h100-80gb", 8, "step", 2048, 0, 0, 137.0),
    Figure("splitwise H100 TP8 decode b1", "llama-2-70b", "h100-80gb", 8, "step", 0, 1, CTX, 30.0),
    Figure("splitwise H100 TP8 decode b16", "llama-2-70b", "h100-80gb", 8, "step", 0, 16, CTX, 34.0),
    Figure("splitwise H100 TP8 decode b64", "llama-2-70b", "h100-80gb", 8, "step", 0, 64, CTX, 50.0),
    Figure("splitwise A100 TP8 prefill 128", "llama-2-70b", "a100-80gb", 8, "step", 128, 0, 0, 65.0),
    Figure("splitwise A100 TP8 prefill 2048", "llama-2-70b", "a100-80gb", 8, "step", 2048, 0, 0, 274.0),
    Figure("splitwise A100 TP8 decode b1", "llama-2-70b", "a100-80gb", 8, "step", 0, 1, CTX, 43.0),
    Figure("splitwise A100 TP8 decode b16", "llama-2-70b", "a100-80gb", 8, "step", 0, 16, CTX, 50.0),
    Figure("splitwise A100 TP8 decode b64", "llama-2-70b", "a100-80gb", 8, "step", 0, 64, CTX, 72.0),
]


@pytest.mark.parametrize("fig", FIGURES, ids=lambda f: f.label)
def test_published_figure_within_tolerance(fig: Figure):
    m = IterationModel.build(fig.model, fig.sku, fig.tp)
    if fig.quantity == "non_attention":
        sim_ms = m.non_attention_s(fig.prefill_tokens) * 1e3
    else:
        p = fig.prefill_tokens
        sim_ms = m.step_time_s(p, p * p / 2, fig.decode_seqs, fig.decode_seqs * fig.context_per_seq) * 1e3
    err = (sim_ms - fig.reference_ms) / fig.reference_ms
    assert abs(err) <= TOLERANCE_FRAC, f"{fig.label}: simulated {sim_ms:.2f} ms vs {fig.reference_ms} ms ({err:+.1%})"


def test_report_table_lists_exactly_the_tested_figures():
    # the Markdown table (REFERENCE_FIGURES) must not drift from the figures tested above
    covered = sorted((f.model, f.sku, f.tp, f.prefill_tokens, f.decode_seqs, f.reference_ms)
                     for f in report.REFERENCE_FIGURES if f.covered)
    tested = sorted((f.model, f.sku, f.tp, f.prefill_tokens, f.decode_seqs, f.reference_ms) for f in FIGURES)
    assert covered == tested
    rows = report.reference_rows()
    assert all(abs(r.error_frac) <= TOLERANCE_FRAC for r in rows if r.figure.covered)
    uncovered = [r for r in rows if not r.figure.covered]
    assert {r.figure.source for r in uncovered} == {"NVIDIA NIM", "vLLM CI (H200)"}
    assert all(r.simulated_ms > 0 and r.figure.note for r in uncovered)


def test_markdown_table_has_every_section():
    text = report.calibration_table_markdown()
    for heading in ("## Figures we check", "## Figures for models or SKUs we do not model", "## Method",
                    "## Fitted serving-stack overhead", "## Memory"):
        assert heading in text
    assert text.count("| Vidur |") == 8 and text.count("| splitwise | llama-2-70b |") == 10


# ------------------------------------------------------------------------------------------------
# monotonicity: decode grows with context, prefill with chunk × context

CONFIGS = [("llama-3-8b", "a100-80gb", 1), ("llama-3-8b", "h100-80gb", 1), ("llama-3-70b", "h100-80gb", 4),
           ("llama-3-70b", "a100-80gb", 8), ("llama-2-7b", "a100-80gb", 2), ("llama-2-70b", "h100-80gb", 8)]


@pytest.mark.parametrize("model,sku,tp", CONFIGS)
def test_decode_step_grows_with_context_and_batch(model, sku, tp):
    m = IterationModel.build(model, sku, tp)
    by_ctx = [m.step_time_s(0, 0.0, 32, 32 * ctx) for ctx in (16, 512, 2048, 8192, 32768)]
    assert all(b > a for a, b in zip(by_ctx, by_ctx[1:], strict=False)), by_ctx
    by_batch = [m.step_time_s(0, 0.0, b, b * 1000) for b in (1, 8, 64, 256)]
    assert all(b > a for a, b in zip(by_batch, by_batch[1:], strict=False)), by_batch


@pytest.mark.parametrize("model,sku,tp", CONFIGS)
def test_prefill_step_grows_with_chunk_times_context(model, sku, tp):
    m = IterationModel.build(model, sku, tp)
    chunk = 2048  # above the host floor for every config, so attention growth shows
    by_ctx = [m.step_time_s(chunk, chunk * (before + chunk / 2), 0, 0) for before in (0, 2048, 8192, 30000)]
    assert all(b > a for a, b in zip(by_ctx, by_ctx[1:], strict=False)), by_ctx
    by_chunk = [m.step_time_s(c, c * (4096 + c / 2), 0, 0) for c in (1024, 2048, 4096, 8192)]
    assert all(b > a for a, b in zip(by_chunk, by_chunk[1:], strict=False)), by_chunk
    # a short prefill is bounded below by the host floor, never cheaper than a longer one
    short = [m.step_time_s(c, c * c / 2, 0, 0) for c in (1, 16, 128, 512, 2048)]
    assert all(b >= a for a, b in zip(short, short[1:], strict=False)), short


def test_attention_terms_follow_the_formulas():
    m = IterationModel.build("llama-3-8b", "a100-80gb", 1)
    sku = SKUS["a100-80gb"]
    # decode: 1,000 extra context tokens read 1000 × 131072 B at 0.70 × 2.039 TB/s = 91.8 µs
    d = m.step_time_s(0, 0.0, 4, 5000) - m.step_time_s(0, 0.0, 4, 4000)
    assert d == pytest.approx(1000 * 131072 / (sku.hbm_bytes_per_s * HBM_READ_FRAC), rel=1e-9)
    # prefill: 1e6 more work units cost 4 × 32 × 32 × 128 × 1e6 FLOPs at 0.5 × 312 TFLOP/s = 3.36 ms
    p = m.step_time_s(1024, 2e6, 0, 0) - m.step_time_s(1024, 1e6, 0, 0)
    assert p == pytest.approx(4 * 32 * 32 * 128 * 1e6 / (312e12 * 0.5), rel=1e-9)


@pytest.mark.parametrize("args", [(0, 0.0, 1, 700), (512, 512 * 900.0, 40, 40_000), (4096, 4096 * 2048.0, 0, 0),
                                  (20, 20 * 3000.0, 200, 200 * 1200), (50_000, 50_000 * 25_000.0, 0, 0)])
@pytest.mark.parametrize("model,sku,tp", CONFIGS)
def test_breakdown_adds_up_to_step_time(model, sku, tp, args):
    m = IterationModel.build(model, sku, tp)
    assert m.breakdown(*args).total_s == pytest.approx(m.step_time_s(*args), rel=1e-9)


@pytest.mark.parametrize("model,sku,tp", CONFIGS)
def test_extrapolation_past_the_profile_is_continuous_and_increasing(model, sku, tp):
    m = IterationModel.build(model, sku, tp)
    last = m._grid_n[-1]
    at, after, far = (m.step_time_s(n, 0.0, 0, 0) for n in (last, last + 1, 4 * last))
    assert at <= after < at * 1.01  # no jump at the last profiled point
    assert far > 2.5 * at  # and still linear-ish well past it


def test_an_empty_step_takes_no_time_and_a_bad_step_is_rejected():
    m = IterationModel.build("llama-3-8b", "a100-80gb", 1)
    assert m.step_time_s(0, 0.0, 0, 0) == 0.0
    with pytest.raises(ValueError, match="decode_seqs=-1"):
        m.step_time_s(0, 0.0, -1, 0)
    with pytest.raises(ValueError, match="decode_context_tokens=50"):
        m.step_time_s(0, 0.0, 0, 50)
    with pytest.raises(ValueError, match="prefill_attention_work=-5"):
        m.step_time_s(10, -5.0, 1, 100)


# ------------------------------------------------------------------------------------------------
# H100 Llama-3: derived profiles


def test_h100_llama3_profiles_are_derived_and_consistent():
    a3 = IterationModel.build("llama-3-70b", "a100-80gb", 8)
    h3 = IterationModel.build("llama-3-70b", "h100-80gb", 8)
    h2 = IterationModel.build("llama-2-70b", "h100-80gb", 8)
    assert h3.provenance.startswith("derived") and not a3.provenance.startswith("derived")
    for n in (1, 64, 512, 2048, 4096, 16384):
        assert h3.non_attention_s(n) < a3.non_attention_s(n)
        # Llama-3-70B and Llama-2-70B layers have the same shapes: the derived profile must land on
        # the measured Llama-2-70B one
        assert h3.non_attention_s(n) == pytest.approx(h2.non_attention_s(n), rel=0.10)
    h8 = IterationModel.build("llama-3-8b", "h100-80gb", 1)
    assert h8.provenance.startswith("derived")
    # Llama-3-8B layers are ~8 % larger than Llama-2-7B's (MLP 14336 vs 11008, GQA vs MHA)
    h7 = IterationModel.build("llama-2-7b", "h100-80gb", 1)
    for n in (1, 512, 2048):
        assert 0.95 < h8.non_attention_s(n) / h7.non_attention_s(n) < 1.35


def test_fitted_stack_overhead_matches_the_pinned_constants():
    for sku, pinned in STACK_OVERHEADS.items():
        fit = fit_stack_overhead(sku)
        for field in ("collective_skew_s", "per_decode_seq_s", "prefill_floor_per_layer_s", "prefill_step_per_layer_s"):
            got, want = getattr(fit, field), getattr(pinned, field)
            assert got == pytest.approx(want, rel=0.02, abs=2e-6), f"{sku}.{field}: fit {got} vs pinned {want}"


def test_zero_overhead_model_is_the_kernels_only():
    full = IterationModel.build("llama-2-70b", "h100-80gb", 8)
    bare = IterationModel.build_with_overhead("llama-2-70b", "h100-80gb", 8, ZERO_OVERHEAD)
    assert bare.step_time_s(0, 0.0, 1, 576) < 0.6 * full.step_time_s(0, 0.0, 1, 576)
    assert IterationModel.build("llama-2-70b", "h100-80gb", 8) is full  # cached per key


# ------------------------------------------------------------------------------------------------
# memory


def test_kv_capacity_llama3_8b_a100():
    m = IterationModel.build("llama-3-8b", "a100-80gb", 1)
    # budget 0.9 × 80 GiB = 77,309,411,328 B
    # weights 8,030,261,248 params × 2 B = 16,060,522,496 B (14.96 GiB)
    # reserve 1 GiB + 8192 × (2·14336 + 4·4096) × 2 B + 256 × 128256 × 4 B
    #       = 1,073,741,824 + 738,197,504 + 131,334,144 = 1,943,273,472 B (1.81 GiB)
    # free 59,305,615,360 B / (131,072 B × 16 tokens) = 28,279.05 → 28,279 blocks (452,464 tokens)
    assert m.kv_capacity_blocks(0.9, 16) == 28_279
    assert m.kv_capacity_blocks(0.9, 32) == 14_139
    assert m.kv_capacity_blocks(0.5, 16) < m.kv_capacity_blocks(0.9, 16)


def test_kv_capacity_matches_the_replica_formula_when_tp_divides_kv_heads():
    m = IterationModel.build("llama-3-70b", "a100-80gb", 4)
    arch, sku = MODELS["llama-3-70b"], SKUS["a100-80gb"]
    free = 4 * sku.memory_bytes * 0.9 - arch.weight_bytes - 4 * m.reserve_bytes_per_gpu
    assert m.kv_capacity_blocks(0.9, 16) == math.floor(free / (arch.kv_bytes_per_token * 16))


def test_fb_used_is_the_claimed_budget():
    m = IterationModel.build("llama-3-70b", "h100-80gb", 8)
    assert m.fb_used_mib_per_gpu(0.9) == pytest.approx(81559 * 0.9)


@pytest.mark.parametrize("model,sku,tp,match", [
    ("llama-3-70b", "a100-80gb", 1, r"llama-3-70b does not fit on tp=1 .*131\.4 GiB.*use tp >= 2"),
    ("llama-2-70b", "h100-80gb", 1, r"llama-2-70b does not fit on tp=1"),
    ("llama-3-8b", "a100-80gb", 3, r"tp must be one of 1, 2, 4, 8.*got 3"),
    ("llama-3-8b", "a100-80gb", 16, r"got 16"),
    ("llama-3-9b", "a100-80gb", 1, r"unknown model 'llama-3-9b'"),
    ("llama-3-8b", "b200", 1, r"unknown sku 'b200'"),
])
def test_bad_model_sku_or_tp_is_rejected(model, sku, tp, match):
    with pytest.raises(ValueError, match=match):
        IterationModel.build(model, sku, tp)


def test_bad_memory_arguments_are_rejected():
    m = IterationModel.build("llama-3-70b", "h100-80gb", 2)  # 65.7 GiB of weights per GPU
    assert m.kv_capacity_blocks(0.9, 16) > 0
    with pytest.raises(ValueError, match=r"gpu_memory_utilization=0\.8: not even one block.*raise tp"):
        m.kv_capacity_blocks(0.8, 16)
    with pytest.raises(ValueError, match="gpu_memory_utilization=0.8"):
        m.fb_used_mib_per_gpu(0.8)
    with pytest.raises(ValueError, match=r"gpu_memory_utilization must be in \(0, 1\], got 1.5"):
        m.kv_capacity_blocks(1.5, 16)
    with pytest.raises(ValueError, match="block_size must be an int >= 1, got 0"):
        m.kv_capacity_blocks(0.9, 0)


def test_a_profile_of_the_wrong_model_is_rejected_naming_file_and_line(tmp_path):
    # a Llama-2-7B profile (32 KV heads, MLP 11008) under the Llama-3-8B name
    src = shared_data_dir() / "calibration" / "vidur" / "a100_Llama-2-7b-hf_mlp.csv"
    vidur = tmp_path / "calibration" / "vidur"
    vidur.mkdir(parents=True)
    lines = src.read_text().splitlines()[:3]
    (vidur / "a100_Meta-Llama-3-8B_mlp.csv").write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"a100_Meta-Llama-3-8B_mlp\.csv:2: profile shape .* not match llama-3-8b"):
        IterationModel.build("llama-3-8b", "a100-80gb", 1, data_dir=tmp_path)


def test_missing_data_dir_names_the_file(tmp_path):
    with pytest.raises(ValueError, match=r"a100_Meta-Llama-3-8B_mlp\.csv"):
        IterationModel.build("llama-3-8b", "a100-80gb", 1, data_dir=tmp_path)


# ------------------------------------------------------------------------------------------------
# constants


def test_architecture_constants():
    for arch in MODELS.values():
        assert arch.counted_params() == arch.params, arch.name
        assert arch.heads * arch.head_dim == arch.hidden
    assert MODELS["llama-3-8b"].kv_bytes_per_token == 128 * 1024
    assert MODELS["llama-3-70b"].kv_bytes_per_token == 320 * 1024


def test_sku_constants():
    a, h = SKUS["a100-80gb"], SKUS["h100-80gb"]
    assert (a.dcgm_model_name, h.dcgm_model_name) == ("NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3")
    assert a.hbm_bytes_per_s == pytest.approx(2.0e12, rel=0.03) and h.hbm_bytes_per_s == pytest.approx(3.35e12)
    for sku in (a, h):
        assert sku.usd_per_gpu_hour > 0 and "On-Demand" in sku.price_source and "2024" in sku.price_source


def test_the_vidur_profiles_read_are_the_shared_ones():
    m = IterationModel.build("llama-3-8b", "a100-80gb", 1)
    assert (shared_data_dir() / "calibration" / "vidur" / m.provenance.split()[-1]).exists()
