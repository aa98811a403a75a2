"""The catalogue of what an inference engine runs on and runs: GPU SKUs, model architectures, and
the serving-stack overheads fitted per SKU.

Data only: every figure cites its data sheet, model card or fit. Consumers: the step-time model
(`controller.perf.iteration`), the planner's roofline fallback (`controller.perf.figures`), the
simulator's prices and DCGM labels. Must not: read files, import anything outside controller.perf,
or hold mutable state.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

GIB = 1024**3

# ---------------------------------------------------------------------------------------------
# GPU SKUs


@dataclass(frozen=True, slots=True)
class GpuSku:
    """One GPU model as the simulator prices and times it.

    Prices: AWS EC2 On-Demand list price, Linux, US East (N. Virginia), per instance-hour divided by
    the 8 GPUs of the instance, as listed through 2024 and until AWS's June 2025 P4/P5 price cut:
    p4de.24xlarge (8× A100-SXM4-80GB) $40.96/h → $5.12 per GPU-hour; p5.48xlarge (8× H100-SXM
    80GB) $98.32/h → $12.29 per GPU-hour. Scenarios override with `usd_per_gpu_hour`.
    """

    name: str
    dcgm_model_name: str  # DCGM exporter `modelName` label
    memory_gib: float  # framebuffer total as nvidia-smi / DCGM report it
    hbm_bytes_per_s: float  # peak HBM bandwidth
    usd_per_gpu_hour: float
    price_source: str
    dense_bf16_flops: float  # peak dense BF16 tensor FLOP/s (no sparsity)
    attention_flops_frac: float  # achievable share of dense_bf16_flops in prefill attention kernels
    vidur_prefix: str | None = None  # file prefix in calibration/vidur; None: not profiled (roofline only)
    interconnect_bytes_per_s: float = 0.0  # GPU-to-GPU bandwidth per GPU (NVLink / Infinity Fabric / PCIe)

    @property
    def memory_bytes(self) -> float:
        return self.memory_gib * GIB


SKUS: Mapping[str, GpuSku] = MappingProxyType(
    {
        "a100-80gb": GpuSku(
            name="a100-80gb",
            dcgm_model_name="NVIDIA A100-SXM4-80GB",
            memory_gib=80.0,  # 81,920 MiB
            hbm_bytes_per_s=2.039e12,  # HBM2e, NVIDIA A100 datasheet (SXM4 80GB)
            usd_per_gpu_hour=5.12,
            price_source="AWS EC2 On-Demand, us-east-1, p4de.24xlarge $40.96/h ÷ 8 GPUs (list price 2024, "
            "before the June 2025 P4/P5 price cut)",
            dense_bf16_flops=312e12,
            attention_flops_frac=0.50,  # FlashAttention-2 forward reaches ~50-70 % of peak on A100
            vidur_prefix="a100",
            interconnect_bytes_per_s=600e9,  # NVLink 3, A100 datasheet
        ),
        "h100-80gb": GpuSku(
            name="h100-80gb",
            dcgm_model_name="NVIDIA H100 80GB HBM3",
            memory_gib=81559 / 1024,  # 81,559 MiB
            hbm_bytes_per_s=3.35e12,  # HBM3, NVIDIA H100 SXM datasheet
            usd_per_gpu_hour=12.29,
            price_source="AWS EC2 On-Demand, us-east-1, p5.48xlarge $98.32/h ÷ 8 GPUs (list price 2024, "
            "before the June 2025 P4/P5 price cut)",
            dense_bf16_flops=989e12,
            attention_flops_frac=0.40,  # FlashAttention-2 on Hopper ~35-45 % of peak (FA3 reaches more)
            vidur_prefix="h100",
            interconnect_bytes_per_s=900e9,  # NVLink 4, H100 SXM datasheet
        ),
        # The SKUs below are not profiled: the planner and the learned models' prior time them with the
        # roofline (controller.perf.roofline). Figures from the vendors' data sheets; prices are
        # indicative (a pool always states its own usd_per_gpu_hour in the daemon's config).
        "h200-141gb": GpuSku(
            name="h200-141gb",
            dcgm_model_name="NVIDIA H200",
            memory_gib=143771 / 1024,  # 141 GB HBM3e; nvidia-smi reports 143,771 MiB
            hbm_bytes_per_s=4.8e12,  # NVIDIA H200 SXM datasheet
            usd_per_gpu_hour=5.41,
            price_source="AWS EC2 Capacity Blocks, p5e.48xlarge (8x H200) effective rate $43.26/h / 8 GPUs "
            "(US East (Ohio), rates to January 2025); indicative",
            dense_bf16_flops=989e12,  # same Hopper tensor cores as H100 SXM (1,979 TFLOPS with sparsity)
            attention_flops_frac=0.40,
            interconnect_bytes_per_s=900e9,  # NVLink 4
        ),
        "l40s-48gb": GpuSku(
            name="l40s-48gb",
            dcgm_model_name="NVIDIA L40S",
            memory_gib=46068 / 1024,  # 48 GB GDDR6 with ECC; nvidia-smi reports 46,068 MiB
            hbm_bytes_per_s=864e9,  # GDDR6, NVIDIA L40S datasheet
            usd_per_gpu_hour=1.86,
            price_source="AWS EC2 On-Demand, us-east-1, g6e.xlarge (1x L40S) about $1.86/h; indicative",
            dense_bf16_flops=362.05e12,  # datasheet BF16 tensor 362.05 TFLOPS dense (733 with sparsity)
            attention_flops_frac=0.40,
            interconnect_bytes_per_s=32e9,  # no NVLink: PCIe Gen4 x16, 64 GB/s bidirectional
        ),
        "l4-24gb": GpuSku(
            name="l4-24gb",
            dcgm_model_name="NVIDIA L4",
            memory_gib=23034 / 1024,  # 24 GB GDDR6; nvidia-smi reports 23,034 MiB
            hbm_bytes_per_s=300e9,  # GDDR6, NVIDIA L4 datasheet
            usd_per_gpu_hour=0.80,
            price_source="AWS EC2 On-Demand, us-east-1, g6.xlarge (1x L4) about $0.80/h; indicative",
            dense_bf16_flops=121e12,  # datasheet BF16 tensor 242 TFLOPS with sparsity, half dense
            attention_flops_frac=0.40,
            interconnect_bytes_per_s=32e9,  # PCIe Gen4 x16, 64 GB/s bidirectional
        ),
        "mi300x-192gb": GpuSku(
            name="mi300x-192gb",
            dcgm_model_name="AMD Instinct MI300X",  # AMD's device-metrics exporter, not DCGM
            memory_gib=192.0,  # 8 stacks x 24 GiB HBM3, AMD Instinct MI300X data sheet
            hbm_bytes_per_s=5.3e12,  # AMD Instinct MI300X data sheet
            usd_per_gpu_hour=6.00,
            price_source="no AWS instance; indicative cloud rate for one MI300X, set usd_per_gpu_hour",
            dense_bf16_flops=1307.4e12,  # data sheet peak BF16 dense (2,614.9 with sparsity)
            attention_flops_frac=0.40,
            interconnect_bytes_per_s=896e9,  # 7 Infinity Fabric links x 128 GB/s per GPU
        ),
    }
)
# Short names an operator may write in a config ("l40s" for "l40s-48gb").
SKU_ALIASES: Mapping[str, str] = MappingProxyType({
    "a100": "a100-80gb", "h100": "h100-80gb", "h200": "h200-141gb", "l40s": "l40s-48gb", "l4": "l4-24gb",
    "mi300x": "mi300x-192gb",
})

# Share of peak HBM bandwidth a streaming read reaches. The Vidur profiles themselves reach it for
# weight reads at 1 token: A100 Llama-3-8B reads 13.96 GB of layer weights in 9.70 ms = 1.44 TB/s
# = 0.71 of 2.039 TB/s; H100 Llama-2-7B 12.95 GB in 5.60 ms = 2.31 TB/s = 0.69 of 3.35 TB/s.
HBM_READ_FRAC = 0.70
GEMM_FLOPS_FRAC = 0.60  # LM-head GEMM when compute-bound (large batches)
NCCL_LAUNCH_S = 20e-6  # Vidur's default nccl_cpu_launch_overhead_ms = 0.02, per collective

# ---------------------------------------------------------------------------------------------
# Models


@dataclass(frozen=True, slots=True)
class ModelArch:
    """Architecture constants from the public model cards / config.json on Hugging Face."""

    name: str
    served_name: str  # what vLLM reports as model_name
    params: int
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    weight_bytes_per_param: float
    max_model_len: int
    intermediate: int  # MLP hidden size per expert (n_expanded_embd in Vidur)
    vidur_name: str | None = None  # file stem in calibration/vidur; None: not profiled (roofline only)
    ratio_proxy: str | None = None  # model whose H100/A100 ratio derives missing profiles (same hidden size)
    experts: int = 1  # MLP experts per layer (mixture of experts)
    experts_per_token: int = 1  # experts each token goes through
    qkv_bias: bool = False  # Qwen2 carries biases on the Q, K and V projections

    @property
    def active_params(self) -> int:
        """Parameters one token goes through (all of them, unless mixture of experts)."""
        return self.params - self.layers * (self.experts - self.experts_per_token) * 3 * self.hidden * self.intermediate

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of one token over all layers in fp16. Llama-3-8B: 32 × 8 × 128 × 2 × 2 = 131,072 (128 KiB)."""
        return self.layers * self.kv_heads * self.head_dim * 2 * 2

    def activation_bytes_per_token(self, tp: int) -> float:
        """Activation memory one more token of a batch holds on each of `tp` GPUs at a layer's peak, in
        bf16: the MLP's gate and up outputs (2 × intermediate, split across the tp GPUs, once per expert
        the token goes through) and four hidden-size tensors (input, residual, attention output, norm),
        the widest layer's shapes as the NON_TORCH_GIB_PER_GPU note sizes the profiling pass.
        Llama-3-8B, tp=1: (2·14336 + 4·4096) × 2 B = 90,112 B (88 KiB)."""
        return (2 * self.intermediate * self.experts_per_token / tp + 4 * self.hidden) * 2

    @property
    def weight_bytes(self) -> float:
        return float(self.params * self.weight_bytes_per_param)

    def counted_params(self) -> int:
        """Parameters implied by the shapes (untied embedding and LM head, RMSNorm weights)."""
        q = self.heads * self.head_dim
        kv = self.kv_heads * self.head_dim
        per_layer = (self.hidden * (q + 2 * kv) + q * self.hidden + self.experts * 3 * self.hidden * self.intermediate
                     + 2 * self.hidden + (q + 2 * kv if self.qkv_bias else 0)
                     + (self.hidden * self.experts if self.experts > 1 else 0))  # the router
        return self.layers * per_layer + 2 * self.vocab * self.hidden + self.hidden


MODELS: Mapping[str, ModelArch] = MappingProxyType(
    {
        "llama-3-8b": ModelArch(
            name="llama-3-8b", served_name="meta-llama/Meta-Llama-3-8B-Instruct", params=8_030_261_248,
            layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128, vocab=128_256,
            weight_bytes_per_param=2, max_model_len=8192, intermediate=14_336,
            vidur_name="Meta-Llama-3-8B", ratio_proxy="llama-2-7b",
        ),
        "llama-3-70b": ModelArch(
            name="llama-3-70b", served_name="meta-llama/Meta-Llama-3-70B-Instruct", params=70_553_706_496,
            layers=80, hidden=8192, heads=64, kv_heads=8, head_dim=128, vocab=128_256,
            weight_bytes_per_param=2, max_model_len=8192, intermediate=28_672,
            vidur_name="Meta-Llama-3-70B", ratio_proxy="llama-2-70b",
        ),
        "llama-2-7b": ModelArch(
            name="llama-2-7b", served_name="meta-llama/Llama-2-7b-chat-hf", params=6_738_415_616,
            layers=32, hidden=4096, heads=32, kv_heads=32, head_dim=128, vocab=32_000,
            weight_bytes_per_param=2, max_model_len=4096, intermediate=11_008,
            vidur_name="Llama-2-7b-hf", ratio_proxy="llama-2-7b",
        ),
        "llama-2-70b": ModelArch(
            name="llama-2-70b", served_name="meta-llama/Llama-2-70b-chat-hf", params=68_976_648_192,
            layers=80, hidden=8192, heads=64, kv_heads=8, head_dim=128, vocab=32_000,
            weight_bytes_per_param=2, max_model_len=4096, intermediate=28_672,
            vidur_name="Llama-2-70b-hf", ratio_proxy="llama-2-70b",
        ),
        # Not profiled (roofline only). Shapes from each model's config.json on Hugging Face; every
        # `params` equals `counted_params()` (tests/perf check it) and the published parameter counts.
        "llama-3.1-8b": ModelArch(  # meta-llama/Llama-3.1-8B-Instruct: Llama-3-8B's shapes, 128k context
            name="llama-3.1-8b", served_name="meta-llama/Llama-3.1-8B-Instruct", params=8_030_261_248,
            layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128, vocab=128_256,
            weight_bytes_per_param=2, max_model_len=131_072, intermediate=14_336,
        ),
        "llama-3.1-70b": ModelArch(  # meta-llama/Llama-3.1-70B-Instruct (Llama 3.3 70B has the same shapes)
            name="llama-3.1-70b", served_name="meta-llama/Llama-3.1-70B-Instruct", params=70_553_706_496,
            layers=80, hidden=8192, heads=64, kv_heads=8, head_dim=128, vocab=128_256,
            weight_bytes_per_param=2, max_model_len=131_072, intermediate=28_672,
        ),
        "qwen-2.5-7b": ModelArch(  # Qwen/Qwen2.5-7B-Instruct (7.61B parameters)
            name="qwen-2.5-7b", served_name="Qwen/Qwen2.5-7B-Instruct", params=7_615_616_512,
            layers=28, hidden=3584, heads=28, kv_heads=4, head_dim=128, vocab=152_064,
            weight_bytes_per_param=2, max_model_len=32_768, intermediate=18_944, qkv_bias=True,
        ),
        "qwen-2.5-72b": ModelArch(  # Qwen/Qwen2.5-72B-Instruct (72.7B parameters)
            name="qwen-2.5-72b", served_name="Qwen/Qwen2.5-72B-Instruct", params=72_706_203_648,
            layers=80, hidden=8192, heads=64, kv_heads=8, head_dim=128, vocab=152_064,
            weight_bytes_per_param=2, max_model_len=32_768, intermediate=29_568, qkv_bias=True,
        ),
        "mistral-7b": ModelArch(  # mistralai/Mistral-7B-Instruct-v0.3 (7.25B parameters, 32,768 vocab)
            name="mistral-7b", served_name="mistralai/Mistral-7B-Instruct-v0.3", params=7_248_023_552,
            layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128, vocab=32_768,
            weight_bytes_per_param=2, max_model_len=32_768, intermediate=14_336,
        ),
        "mixtral-8x7b": ModelArch(  # mistralai/Mixtral-8x7B-Instruct-v0.1: 46.7B parameters, 12.9B active
            name="mixtral-8x7b", served_name="mistralai/Mixtral-8x7B-Instruct-v0.1", params=46_702_792_704,
            layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128, vocab=32_000,
            weight_bytes_per_param=2, max_model_len=32_768, intermediate=14_336, experts=8, experts_per_token=2,
        ),
    }
)
# Names an operator may write in a config for the same architecture.
MODEL_ALIASES: Mapping[str, str] = MappingProxyType({
    "llama-3.3-70b": "llama-3.1-70b", "mistral-7b-v0.3": "mistral-7b", "mixtral-8x7b-v0.1": "mixtral-8x7b",
})

# Memory vLLM keeps outside the KV cache on every GPU (it profiles this; we estimate it):
# CUDA context, NCCL buffers and CUDA graphs ≈ 1 GiB, plus the activation peak of the profiling
# forward pass (PROFILE_TOKENS tokens through the widest layer) and the sampler's fp32 logits for
# PROFILE_SEQS sequences. Llama-3-8B, tp=1: 1 GiB + 8192 × (2·14336 + 4·4096) × 2 B (0.69 GiB)
# + 256 × 128256 × 4 B (0.12 GiB) = 1.81 GiB.
NON_TORCH_GIB_PER_GPU = 1.0
PROFILE_TOKENS = 8192  # scenario default max_num_batched_tokens
PROFILE_SEQS = 256  # scenario default max_num_seqs


@dataclass(frozen=True, slots=True)
class StackOverhead:
    """Serving-stack (host) costs on top of the GPU kernels, per SKU.

    Fitted by `fit_stack_overhead` to splitwise's Llama2-70B TP8 measurements after subtracting the
    modelled kernel and collective time: the first two terms by least squares on decode steps at
    batch 1–64, the last two by the smallest worst-case relative error on batch-1 prefill of
    128–2,048 tokens. A step with prefill takes max(GPU work + prefill_step, prefill_floor): the
    host enqueues every layer's kernels one by one (eager mode), which bounds short prefills from
    below while the GPU work overlaps it.
    """

    collective_skew_s: float  # per all-reduce, × tp^1.25 (Vidur's nccl_cpu_skew_overhead_per_device form)
    per_decode_seq_s: float  # host cost per decoding sequence per step (scheduling, sampling, output)
    prefill_floor_per_layer_s: float  # a step with prefill takes at least this × layers
    prefill_step_per_layer_s: float  # added to a step with prefill, × layers


# Values from `python -m controller.perf.report --fit` (rounded); tests re-fit and compare.
# Llama-3-8B (32 layers) on A100: a step with prefill takes at least 32 × 0.815 ms = 26.1 ms
# (SageServe measures 23-24 ms for 128-256-token Llama-3.1-8B prompts on A100 TP2, 29 ms on TP4).
STACK_OVERHEADS: Mapping[str, StackOverhead] = MappingProxyType(
    {
        "a100-80gb": StackOverhead(collective_skew_s=9.49e-6, per_decode_seq_s=0.312e-3,
                                   prefill_floor_per_layer_s=0.815e-3, prefill_step_per_layer_s=0.0),
        "h100-80gb": StackOverhead(collective_skew_s=6.39e-6, per_decode_seq_s=0.261e-3,
                                   prefill_floor_per_layer_s=0.680e-3, prefill_step_per_layer_s=0.140e-3),
    }
)
ZERO_OVERHEAD = StackOverhead(0.0, 0.0, 0.0, 0.0)

# The SKUs and models with Vidur profiles: the calibrated step-time model (controller.perf.iteration)
# builds these; the roofline (controller.perf.roofline) times every other pair.
CALIBRATED_SKUS: tuple[str, ...] = tuple(k for k, v in SKUS.items() if v.vidur_prefix is not None)
CALIBRATED_MODELS: tuple[str, ...] = tuple(k for k, v in MODELS.items() if v.vidur_name is not None)
