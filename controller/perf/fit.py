"""Fitting the serving-stack overhead (`StackOverhead`) to splitwise's end-to-end Llama2-70B timings.

Run by the tests and `python -m controller.perf.report --fit`, never when a model is built: the
fitted values are pinned in `controller.perf.catalogue.STACK_OVERHEADS`. Must not: write anywhere or
read the clock (it reads the splitwise CSV through controller.perf.profiles).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from controller.paths import shared_data_dir
from controller.perf.catalogue import MODELS, ZERO_OVERHEAD, StackOverhead
from controller.perf.iteration import IterationModel
from controller.perf.profiles import splitwise_medians

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


def fit_points(sku: str, data_dir: Path | None = None, tps: Sequence[int] = (8,)) -> list[FitPoint]:
    """splitwise Llama2-70B points on `sku` with the kernel-only model's time for each."""
    root = (Path(data_dir) if data_dir is not None else shared_data_dir()).resolve()
    med = splitwise_medians(root)
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
