"""Sizing: GPU memory, KV bytes per token, the engines' step sizes and prefill time."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from settings import catalog
from settings.sizing.calibration import MIDPOINT

if TYPE_CHECKING:
    from settings.model import Settings

# vLLM's OpenAI-server usage context sets max_num_batched_tokens to 2048 on GPUs
# under 70 GiB (vllm/engine/arg_utils.py): a longer prompt prefills in chunks.
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048
# On GPUs of 70 GiB and more, A100s excepted, the same context sets 8192 tokens and 1024
# sequences (vllm/engine/arg_utils.py, _get_default_max_num_batched_tokens_and_seqs).
LARGE_GPU_GIB = 70
LARGE_GPU_MAX_NUM_BATCHED_TOKENS = 8192
LARGE_GPU_MAX_NUM_SEQS = 1024
# The largest step set on the prefill engine: activation memory grows with it.
PREFILL_STEP_CAP_TOKENS = 8192
PROMPT_LENGTHS = (1024, 8192, 32768)
# The engines of a deployment, by step size: aggregated engines take the decode side's.
SIDES = ("prefill", "decode")
OUTPUT_TOKENS = 128


# --- GPU memory -------------------------------------------------------------------------------------
def kv_cache_bytes_per_token(model: catalog.ModelSpec) -> int:
    """K and V, for every layer and KV head, in the model's dtype."""
    return 2 * model.layers * model.kv_heads * model.head_dim * model.dtype_bytes


# What vLLM 0.26 sets aside before the KV cache (vllm/v1/worker/gpu_worker.py,
# determine_available_memory): total memory x gpu_memory_utilization, minus the weights,
# minus the memory torch did not allocate ("non-torch": cuBLAS and NCCL workspaces),
# minus profile_run's torch peak (one forward pass of max_num_batched_tokens tokens,
# then the sampler on max_num_seqs rows), minus the CUDA-graph estimate
# (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS, on by default since 0.21). vLLM then
# refuses to start unless the rest holds one max_model_len sequence
# (vllm/v1/core/kv_cache_utils.py, check_enough_kv_cache_memory).
#
# Non-torch memory: vLLM logs 0.28 and 0.33 GiB on one GPU in public reports
# ("non_torch_memory takes", vllm-project/vllm#15039 and #14452); 0.4 GiB, rounded up.
NON_TORCH_GIB = 0.4
# vLLM's CUDA-graph estimate for Qwen3-8B on a 24 GB GPU with the default capture
# sizes (PIECEWISE 51 up to 512 tokens, FULL 35 up to 256): "Estimated CUDA graph
# memory: 0.52 GiB total" (LMCache/LMCache#3430). The sizes stop at 512 tokens, below
# every step here, so the estimate does not grow with the step; other models in the
# catalog have 28-40 layers against Qwen3-8B's 36, and keep this figure (an estimate).
CUDA_GRAPH_GIB = 0.52
# vLLM's OpenAI-server usage context on GPUs under 70 GiB (vllm/engine/arg_utils.py):
# the sampler's dummy run in profile_run takes this many rows.
DEFAULT_MAX_NUM_SEQS = 256
# One logit on the sampler's path: the lm_head's output in the model's dtype (2 B), its
# float32 copy (vllm/v1/sample/sampler.py "Use float32 for the logits") and the float32
# probabilities of the top-k/top-p sampler: 10 bytes.
SAMPLER_BYTES_PER_LOGIT = 10
# The largest gpu_memory_utilization accepted: vLLM refuses a share above the memory free at startup
# (vllm/v1/worker/utils.py, request_memory), and the CUDA context has taken some by then.
MAX_GPU_MEMORY_UTILIZATION = 0.95


def _large_gpu(gpu: catalog.InstanceSpec) -> bool:
    # vLLM compares the device's total memory (H100: 79.6 GiB) with 70 GiB; the table holds what CUDA
    # can allocate, a little less.
    return gpu.gpu_memory_gib >= LARGE_GPU_GIB - 1 and not gpu.gpu_model.startswith("A100")


def vllm_default_max_num_batched_tokens(s: Settings) -> int:
    """vLLM 0.26's default step under Ray's OpenAI-server usage context, for the GPU."""
    return LARGE_GPU_MAX_NUM_BATCHED_TOKENS if _large_gpu(s.gpu_instance) else DEFAULT_MAX_NUM_BATCHED_TOKENS


def vllm_default_max_num_seqs(s: Settings) -> int:
    return LARGE_GPU_MAX_NUM_SEQS if _large_gpu(s.gpu_instance) else DEFAULT_MAX_NUM_SEQS


def engine_max_num_batched_tokens(s: Settings, side: str) -> int:
    """The step size of one engine: 'prefill' or 'decode' ('decode' also names an aggregated engine)."""
    if side == "prefill":
        return prefill_max_num_batched_tokens(s) or vllm_default_max_num_batched_tokens(s)
    return vllm_default_max_num_batched_tokens(s)


def activation_peak_bytes(
    model: catalog.ModelSpec, step_tokens: int, tensor_parallel_size: int = 1, max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
) -> int:
    """profile_run's torch peak on one GPU: the larger of one step's forward pass and the sampler after it.

    Forward: inside the MLP, the gate_up output (2 x intermediate) and the activated half
    (1 x intermediate) are alive beside the hidden states and the residual (2 x hidden), per
    token, in the model's dtype; attention's q, k, v are narrower in every catalog model.
    Tensor parallelism splits the MLP's width across GPUs; the hidden states stay whole.
    Sampler: the step's hidden states are still held while max_num_seqs rows of logits (the
    whole vocabulary, gathered) go through SAMPLER_BYTES_PER_LOGIT each.
    """
    mlp = 3 * model.intermediate_size // tensor_parallel_size
    forward = step_tokens * (2 * model.hidden_size + mlp) * model.dtype_bytes
    logits = max_num_seqs * model.vocab_size * SAMPLER_BYTES_PER_LOGIT
    sampler = step_tokens * model.hidden_size * model.dtype_bytes + logits
    return max(forward, sampler)


@dataclass(frozen=True)
class GpuMemoryPlan:
    """One engine's GPU memory in GiB, as vLLM 0.26 divides it at startup."""

    step_tokens: int
    budget: float  # total x gpu_memory_utilization
    weights: float
    non_torch: float
    activations: float
    cuda_graphs: float
    one_sequence_kv: float  # KV for one max_model_len sequence: vLLM's floor

    @property
    def before_kv(self) -> float:
        return self.weights + self.non_torch + self.activations + self.cuda_graphs

    @property
    def kv_cache(self) -> float:
        return self.budget - self.before_kv

    @property
    def starts(self) -> bool:
        return self.kv_cache >= self.one_sequence_kv


def gpu_memory_plan(
    s: Settings, side: str = "prefill", utilization: float | None = None, tensor_parallel_size: int | None = None
) -> GpuMemoryPlan:
    """One GPU of one engine at the settings' (or the given) gpu_memory_utilization.

    With tensor parallelism (the side's own size unless given) each GPU holds its share of the
    weights and of the KV heads (vLLM replicates a KV head rather than split it, so the share
    stops at one head).
    """
    model = s.model
    if tensor_parallel_size is None:
        tensor_parallel_size = s.tensor_parallel_size(side)
    step = engine_max_num_batched_tokens(s, side)
    gpu_gib = s.gpu_instance.gpu_memory_gib
    kv_heads_per_gpu = max(1, model.kv_heads // tensor_parallel_size)
    return GpuMemoryPlan(
        step_tokens=step,
        budget=gpu_gib * (s.gpu_memory_utilization if utilization is None else utilization),
        weights=model.parameters_billion * 1e9 * model.dtype_bytes / tensor_parallel_size / 2**30,
        non_torch=NON_TORCH_GIB,
        activations=activation_peak_bytes(model, step, tensor_parallel_size, vllm_default_max_num_seqs(s)) / 2**30,
        cuda_graphs=CUDA_GRAPH_GIB,
        one_sequence_kv=kv_cache_bytes_per_token(model) * kv_heads_per_gpu / model.kv_heads * s.max_model_len / 2**30,
    )


def min_gpu_memory_utilization(s: Settings, tensor_parallel_sizes: Mapping[str, int] | None = None) -> float:
    """The smallest gpu_memory_utilization at which every engine holds one max_model_len sequence.

    With one GPU per engine prefill's step is the larger (up to PREFILL_STEP_CAP_TOKENS), so
    prefill decides; tensor_parallel_sizes (per side, default 1) can move that to decode.
    """
    sizes = tensor_parallel_sizes or {}
    plans = [gpu_memory_plan(s, side, tensor_parallel_size=sizes.get(side, 1)) for side in SIDES]
    return max(plan.before_kv + plan.one_sequence_kv for plan in plans) / s.gpu_instance.gpu_memory_gib


def kv_cache_bytes_per_token_per_gpu(model: catalog.ModelSpec, tensor_parallel_size: int) -> float:
    """One GPU's share of a token's KV: its KV heads, one at least (vLLM replicates past the model's heads)."""
    return kv_cache_bytes_per_token(model) * max(1, model.kv_heads // tensor_parallel_size) / model.kv_heads


def kv_cache_tokens(s: Settings, side: str = "decode") -> int:
    """Tokens of KV cache one engine holds: each GPU's budget left after everything vLLM sets aside first,
    over each GPU's share of a token (the side's tensor-parallel size)."""
    per_gpu = kv_cache_bytes_per_token_per_gpu(s.model, s.tensor_parallel_size(side))
    return int(gpu_memory_plan(s, side).kv_cache * 2**30 // per_gpu)


def concurrent_sequences(s: Settings, prompt_tokens: int, output_tokens: int = OUTPUT_TOKENS) -> int:
    """How many sequences of this length decode's KV cache holds at once."""
    return kv_cache_tokens(s) // (prompt_tokens + output_tokens)


# --- Prefill ------------------------------------------------------------------------------------------
def prefill_max_num_batched_tokens(s: Settings) -> int | None:
    """The step size set on the prefill engine, or None for vLLM's default.

    A prefill-only engine has no decodes whose inter-token latency small chunks
    would protect (the reason for vLLM's 2048 on small GPUs), so one step takes
    a whole prompt up to max_model_len: fewer steps, each re-reading the weights
    once. Capped at PREFILL_STEP_CAP_TOKENS, since the activation peak vLLM
    reserves grows with the step. Aggregated engines keep vLLM's default:
    their steps are shared with decodes.
    """
    if s.serving_mode != "disaggregated":
        return None
    return min(s.max_model_len, PREFILL_STEP_CAP_TOKENS)


def prefill_seconds(s: Settings, tokens: int, mfu: float | None = None, side: str = "prefill") -> float:
    """2 x parameters x tokens FLOPs at an MFU (the midpoint of PREFILL_MFU_RANGE) of the dense BF16 peak
    of the engine's GPUs: one GPU's times the side's tensor-parallel size.

    The attention term (quadratic in length) is left out: it makes long prompts
    slower, so every share of prefill time below is an upper bound. TP's all-reduce
    after every layer is taken to sit inside the MFU range (unmeasured).
    """
    flops = 2 * s.model.parameters_billion * 1e9 * tokens
    peak = s.gpu_instance.gpu_bf16_tflops * 1e12 * s.tensor_parallel_size(side)
    return flops / (peak * (MIDPOINT.prefill_mfu if mfu is None else mfu))
