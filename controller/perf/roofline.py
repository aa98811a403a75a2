"""The roofline prior: step time, KV capacity and capacity of any model × SKU × TP from data-sheet
figures alone, for the engines nobody profiled (every pair but the calibrated Llama ones on A100/H100).

Decode is bound by memory: every step reads the weights once and every context token's K and V once
per layer, at `HBM_READ_FRAC` of the SKU's peak bandwidth. Prefill is bound by compute: 2 × the active
parameters FLOPs per prompt token at `GEMM_FLOPS_FRAC` of the SKU's dense BF16 peak, plus attention
(4 × layers × heads × head_dim FLOPs per unit of Σ chunk × (context + chunk / 2)) at the SKU's
`attention_flops_frac`. With TP > 1 each layer adds two all-reduces, each a launch, a host skew and
a latency term plus the message over the SKU's interconnect. On top, the serving stack's host costs:
per decoding sequence and a floor for a step that carries prefill.

The efficiency factors are the calibrated model's (controller.perf.catalogue), and the host terms
the median of the calibrated SKUs' fitted serving-stack overheads; `python -m controller.perf.roofline`
prints the roofline's capacity next to the calibrated model's for the calibrated pairs
(docs/BENCHMARKS.md, "The roofline prior"). The learned models correct what it gets wrong from
telemetry, as they correct the calibrated figures.

Pure arithmetic on catalogue values: must not read files, the clock or randomness.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

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
    GpuSku,
    ModelArch,
)
from controller.perf.engine_figures import EngineFigures

# Host costs of the serving stack, for a SKU without a fitted StackOverhead: the mean of the two
# fitted SKUs' (A100, H100) terms. The host, not the GPU, sets them (scheduling, sampling, kernel
# enqueueing), so they carry over to another GPU of a similar host better than any GPU figure would.
_FITTED = tuple(STACK_OVERHEADS.values())
HOST_S_PER_DECODE_SEQ = sum(o.per_decode_seq_s for o in _FITTED) / len(_FITTED)
PREFILL_FLOOR_S_PER_LAYER = sum(o.prefill_floor_per_layer_s for o in _FITTED) / len(_FITTED)
COLLECTIVE_SKEW_S = sum(o.collective_skew_s for o in _FITTED) / len(_FITTED)
# Latency of one small all-reduce beyond launch and skew (the Vidur DGX profiles' floor is 10-40 µs).
ALL_REDUCE_LATENCY_S = 20e-6
# A ring all-reduce moves 2 (tp - 1) / tp of the message over each GPU's link.
_RING = 2.0


@dataclass(frozen=True, slots=True)
class Roofline:
    """One engine's roofline terms (seconds, bytes) and the `EngineFigures` they make."""

    arch: ModelArch
    sku: GpuSku
    tp: int
    weights_read_s: float  # weights per GPU / achievable bandwidth, once per step
    collective_s: float  # fixed part of the TP all-reduces, per step
    collective_s_per_token: float  # the messages over the interconnect, per token in the step
    kv_read_s_per_token: float  # one context token's K and V per GPU / achievable bandwidth
    gemm_s_per_token: float  # 2 × active params / tp FLOPs at the achievable GEMM rate
    attn_s_per_work: float
    host_s_per_seq: float
    prefill_floor_s: float
    kv_bytes_per_token_per_gpu: int
    reserve_bytes_per_gpu: float

    def step_time_s(self, prefill_tokens: int, prefill_attention_work: float,
                    decode_seqs: int, decode_context_tokens: int) -> float:
        """One step, the arguments as `IterationModel.step_time_s`'s; 0 s for an empty step."""
        n = prefill_tokens + decode_seqs
        if n <= 0:
            return 0.0
        t = (self.weights_read_s + self.collective_s + self.collective_s_per_token * n
             + self.kv_read_s_per_token * decode_context_tokens
             + self.gemm_s_per_token * n + self.attn_s_per_work * prefill_attention_work)
        if prefill_tokens:
            t = max(t, self.prefill_floor_s)
        return t + self.host_s_per_seq * decode_seqs

    def kv_capacity_blocks(self, gpu_memory_utilization: float, block_size: int) -> int:
        free = self.sku.memory_bytes * gpu_memory_utilization - self.arch.weight_bytes / self.tp \
            - self.reserve_bytes_per_gpu
        blocks = int(free // (self.kv_bytes_per_token_per_gpu * block_size))
        if blocks < 1:
            raise ValueError(f"{self.arch.name} on tp={self.tp} × {self.sku.name} at gpu_memory_utilization="
                             f"{gpu_memory_utilization}: no room for one KV block of {block_size} tokens "
                             f"(weights {self.arch.weight_bytes / self.tp / GIB:.1f} GiB per GPU of "
                             f"{self.sku.memory_gib:.1f} GiB); raise tp")
        return blocks

    def fb_used_mib_per_gpu(self, gpu_memory_utilization: float) -> float:
        """What DCGM shows per GPU: vLLM claims its whole budget up front."""
        return self.sku.memory_gib * 1024 * gpu_memory_utilization

    def figures(self, gpu_memory_utilization: float = 0.9, block_size: int = 16) -> EngineFigures:
        """The planner's linear step-time model: t = a + b·seqs + c·Σcontext + d·prefill + e·work."""
        a = self.weights_read_s + self.collective_s
        per_token = self.gemm_s_per_token + self.collective_s_per_token
        return EngineFigures(a_s=a, b_s_per_seq=self.host_s_per_seq + per_token,
                             c_s_per_ctx_token=self.kv_read_s_per_token, d_s_per_prefill_token=per_token,
                             e_s_per_attn_work=self.attn_s_per_work,
                             kv_tokens=float(self.kv_capacity_blocks(gpu_memory_utilization, block_size) * block_size),
                             source="roofline")


def reserve_bytes_per_gpu(arch: ModelArch, tp: int) -> float:
    """What vLLM keeps outside weights and KV per GPU (catalogue's NON_TORCH_GIB_PER_GPU note)."""
    act = PROFILE_TOKENS * (2 * arch.intermediate / tp + 4 * arch.hidden) * 2
    return NON_TORCH_GIB_PER_GPU * GIB + act + PROFILE_SEQS * arch.vocab * 4


def fit_problem(arch: ModelArch, sku: GpuSku, tp: int) -> str | None:
    """Why `arch` cannot run on tp × `sku` (None if it can): TP must divide the heads, weights must fit."""
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        return f"tp must be an int >= 1 (got {tp!r})"
    if arch.heads % tp or (arch.kv_heads % tp and tp % arch.kv_heads):
        return f"tp={tp} does not divide the {arch.heads} attention heads ({arch.kv_heads} KV heads) of {arch.name}"
    per_gpu = arch.weight_bytes / tp + reserve_bytes_per_gpu(arch, tp)
    if per_gpu >= sku.memory_bytes * 0.9:
        need = next((t for t in (1, 2, 4, 8, 16, 32, 64)
                     if arch.weight_bytes / t + reserve_bytes_per_gpu(arch, t) < sku.memory_bytes * 0.9), None)
        return (f"{arch.name} does not fit on tp={tp} × {sku.name}: {arch.weight_bytes / tp / GIB:.1f} GiB of "
                f"weights per GPU + {reserve_bytes_per_gpu(arch, tp) / GIB:.1f} GiB reserve > 90 % of "
                f"{sku.memory_gib:.1f} GiB" + (f"; use tp >= {need}" if need else ""))
    return None


def roofline(arch: ModelArch, sku: GpuSku, tp: int, *, fitted_host: bool = True) -> Roofline:
    """The roofline of one engine. ValueError says why it cannot run (see `fit_problem`). A SKU with a
    fitted StackOverhead uses its host terms (unless `fitted_host` is False); any other the means.

    Example: Qwen2.5-7B on one L40S reads 15.2 GB of weights per step at 0.7 × 864 GB/s = 25 ms.
    """
    why = fit_problem(arch, sku, tp)
    if why:
        raise ValueError(why)
    overhead = STACK_OVERHEADS.get(sku.name) if fitted_host else None
    bw = sku.hbm_bytes_per_s * HBM_READ_FRAC
    kv_gpu = arch.layers * math.ceil(arch.kv_heads / tp) * arch.head_dim * 2 * 2
    n_coll = 2 * arch.layers if tp > 1 else 0
    skew = overhead.collective_skew_s if overhead else COLLECTIVE_SKEW_S
    link = sku.interconnect_bytes_per_s or 32e9  # PCIe Gen4 x16 when the catalogue names none
    per_msg_token = arch.hidden * 2 * _RING * (tp - 1) / tp / link if tp > 1 else 0.0
    return Roofline(
        arch=arch, sku=sku, tp=tp,
        weights_read_s=arch.weight_bytes / tp / bw,
        collective_s=n_coll * (NCCL_LAUNCH_S + skew * tp**1.25 + ALL_REDUCE_LATENCY_S),
        collective_s_per_token=n_coll * per_msg_token,
        kv_read_s_per_token=kv_gpu / bw,
        gemm_s_per_token=2.0 * arch.active_params / tp / (sku.dense_bf16_flops * GEMM_FLOPS_FRAC),
        attn_s_per_work=4 * arch.layers * (arch.heads / tp) * arch.head_dim
        / (sku.dense_bf16_flops * sku.attention_flops_frac),
        host_s_per_seq=overhead.per_decode_seq_s if overhead else HOST_S_PER_DECODE_SEQ,
        prefill_floor_s=(overhead.prefill_floor_per_layer_s if overhead else PREFILL_FLOOR_S_PER_LAYER) * arch.layers,
        kv_bytes_per_token_per_gpu=kv_gpu,
        reserve_bytes_per_gpu=reserve_bytes_per_gpu(arch, tp),
    )


# --------------------------------------------------------------------------- capacity


StepFn = Callable[[int, float, int, int], float]


@dataclass(frozen=True, slots=True)
class Capacity:
    """What one replica sustains on a workload of `prompt` in / `output` out tokens per request."""

    batch: int  # decoding sequences per step
    decode_step_s: float  # step time at that batch (the TPOT it serves)
    prefill_s: float  # one prompt's prefill
    requests_per_s: float
    output: int  # output tokens per request

    @property
    def output_tokens_per_s(self) -> float:
        return self.requests_per_s * self.output


def capacity(step: StepFn, kv_tokens: float, prompt: int, output: int, *, tpot_slo_s: float,
             max_num_seqs: int = 256) -> Capacity:
    """The replica's sustainable rate: the largest batch whose decode step meets `tpot_slo_s` and whose
    KV fits (each sequence holds prompt + output tokens), and per request one prefill plus `output`
    decode steps shared by the batch: rate = 1 / (prefill + output × step / batch)."""
    best = 0
    for b in range(1, max_num_seqs + 1):
        if b * (prompt + output) > kv_tokens or step(0, 0.0, b, b * (prompt + output // 2)) > tpot_slo_s:
            break
        best = b
    if best == 0:
        raise ValueError(f"no batch meets TPOT {tpot_slo_s:g} s with {kv_tokens:.0f} KV tokens")
    t_dec = step(0, 0.0, best, best * (prompt + output // 2))
    t_pf = step(prompt, prompt * prompt / 2, 0, 0)
    return Capacity(best, t_dec, t_pf, 1.0 / (t_pf + output * t_dec / best), output)


# Workloads of the comparison: the mean request of the two Azure 2023 traces (docs/SIMULATOR.md).
WORKLOADS = {"azure-conv": (1155, 211), "azure-code": (2048, 28)}
COMPARE_PAIRS = ("llama-3-8b/a100-80gb/tp1", "llama-3-8b/h100-80gb/tp1",
                 "llama-3-70b/a100-80gb/tp4", "llama-3-70b/h100-80gb/tp4")


def compare(tpot_slo_s: float = 0.1) -> list[dict[str, object]]:
    """Per calibrated pair and workload: the roofline's capacity next to the calibrated model's."""
    from controller.perf.iteration import IterationModel  # the calibrated model (reads the profiles)

    rows: list[dict[str, object]] = []
    for key in COMPARE_PAIRS:
        model, sku, tp_s = key.split("/")
        tp = int(tp_s.removeprefix("tp"))
        im = IterationModel.build(model, sku, tp)
        rl = roofline(MODELS[model], SKUS[sku], tp)
        generic = roofline(MODELS[model], SKUS[sku], tp, fitted_host=False)
        kv_cal = im.kv_capacity_blocks(0.9, 16) * 16
        kv_rl = rl.kv_capacity_blocks(0.9, 16) * 16
        for wl, (p, o) in WORKLOADS.items():
            cal = capacity(im.step_time_s, kv_cal, p, o, tpot_slo_s=tpot_slo_s)
            est = capacity(rl.step_time_s, kv_rl, p, o, tpot_slo_s=tpot_slo_s)
            gen = capacity(generic.step_time_s, kv_rl, p, o, tpot_slo_s=tpot_slo_s)
            rows.append({"engine": key, "workload": wl, "calibrated_rps": cal.requests_per_s,
                         "roofline_rps": est.requests_per_s, "error": est.requests_per_s / cal.requests_per_s - 1,
                         "generic_rps": gen.requests_per_s,
                         "generic_error": gen.requests_per_s / cal.requests_per_s - 1,
                         "calibrated_batch": cal.batch, "roofline_batch": est.batch})
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m controller.perf.roofline",
                                 description="the roofline prior's capacity vs the calibrated model's")
    ap.add_argument("--tpot-slo", type=float, default=0.1, help="TPOT the batch must meet, s (default 0.1)")
    ap.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout")
    args = ap.parse_args(argv)
    if args.json:
        rows = [{**r, "prompt_tokens": WORKLOADS[str(r["workload"])][0],
                 "output_tokens": WORKLOADS[str(r["workload"])][1]} for r in compare(args.tpot_slo)]
        print(json.dumps({"tpot_slo_s": args.tpot_slo, "rows": rows}, sort_keys=True))
        return 0
    print("| engine | workload (in/out tokens) | calibrated req/s | roofline req/s | vs calibrated | "
          "roofline, generic host terms | vs calibrated |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in compare(args.tpot_slo):
        p, o = WORKLOADS[str(r["workload"])]
        print(f"| {r['engine']} | {r['workload']} ({p}/{o}) | {r['calibrated_rps']:.2f} | {r['roofline_rps']:.2f} | "
              f"{float(str(r['error'])) * 100:+.1f} % | {r['generic_rps']:.2f} | "
              f"{float(str(r['generic_error'])) * 100:+.1f} % |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
