"""Sizing: GPU memory, KV bytes, host staging, the KV transfer, prefill time and chunks, decode capacity,
and whether splitting prefill from decode is expected to pay.

One home for these numbers: validation (settings/model.py), `plan` and synth
(settings/estimates.py) and the serve builder (serve_config) read them here.
Every constant has its source beside it; these are planning estimates, and
`tools.bench compare` measures the real answer on the user's own cluster.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from settings import catalog

if TYPE_CHECKING:
    from settings.model import Settings

# --- Public numbers the plan is calibrated on (../shared/FACTS.md) -------------------------
# Each calibrated rate is a range: every verdict is worked out at both ends
# (Calibration.BEST_FOR_SPLIT and WORST_FOR_SPLIT) and the midpoints are printed.
#
# vLLM with kv_buffer_device cpu copies KV blocks through pageable host memory,
# synchronously: GPU to host on prefill, host to GPU on decode (inside
# get_finished, so every decode on that GPU waits). Such copies run at roughly
# 5-10 GB/s (an estimate, unmeasured).
PAGEABLE_COPY_BYTES_PER_S_RANGE = (5e9, 10e9)
# NIXL over EFA with GPUDirect on p5 reaches 10-12 GB/s in microbenchmarks but
# 4-5 GB/s inside vLLM (Anyscale): the effective KV rate is capped there even
# where the link is faster.
NIXL_IN_VLLM_BYTES_PER_S_RANGE = (4e9, 5e9)
# One TCP flow (UCX falling back to TCP) is limited to 10 Gbps inside a cluster
# placement group (EC2 user guide, "Amazon EC2 instance network bandwidth").
SINGLE_FLOW_GBPS_IN_PLACEMENT_GROUP = 10.0
# Share of peak dense BF16 tensor throughput a prefill reaches on one GPU: 30-50%,
# around the common planning figure of 40% (an assumption, unmeasured here). A
# faster prefill makes the transfer's share larger.
PREFILL_MFU_RANGE = (0.30, 0.50)
# No share of the prefill is set as the transfer's budget: none has a public
# source. The one firm bound is the prefill itself: a transfer that takes longer
# than the prefill it spares decode is beaten by decode recomputing the prompt.
# SageMaker HyperPod's guidance: disaggregation pays from 4k-token prompts and
# 70B-parameter models (with 2+ requests/s and 256+ output tokens); llm-d's: not
# for 8B models with 200/200-token traffic; Mooncake on A10 (7B, 1k prompts,
# 2 QPS): aggregated TTFT 461 ms vs 1,273 ms split, and aggregated with chunked
# prefill the best TPOT p99 (136 ms vs 524 ms split).
MIN_PROMPT_TOKENS_THAT_PAY = 4096
MIN_PARAMETERS_BILLION_THAT_PAY = 70.0
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
# Reading the weights back from the node's NVMe RAID0: 2 GB/s, an assumption
# (unmeasured; EC2 publishes instance-store IOPS, not a sequential read rate).
NVME_READ_BYTES_PER_S = 2e9
OUTPUT_TOKENS = 128


# --- The GPU node's root volume ----------------------------------------------------------------------
# The AL2023 EKS AMIs' root snapshot is 20 GiB (amazon-eks-ami templates/al2023/template.pkr.hcl,
# ami_block_device_mappings): the OS, the NVIDIA and EFA drivers, CUDA's user-space libraries.
AMI_ROOT_SNAPSHOT_GIB = 20
# systemd-journald keeps at most 10% of its filesystem, capped at 4 GiB (journald.conf(5), SystemMaxUse).
JOURNAL_MAX_GIB = 4
# On a type with instance store, nodeadm's localStorage RAID0 (amazon-eks-ami setup-local-disks)
# bind-mounts /var/lib/kubelet, /var/lib/containerd, /var/lib/soci-snapshotter-grpc and /var/log/pods
# onto the array before containerd and kubelet start: images, container layers, emptyDirs, pod logs
# and the model cache (a hostPath under the array) all live there. The root keeps the AMI, the
# journal and the rest of /var/log, /tmp and /opt: the snapshot, the journal's cap and 6 GiB of room.
GPU_ROOT_MIN_GIB_WITH_INSTANCE_STORE = AMI_ROOT_SNAPSHOT_GIB + JOURNAL_MAX_GIB + 6
# The default leaves room for AMIs that grow (each driver branch adds a few GB) and for node-level logs.
GPU_ROOT_GIB_WITH_INSTANCE_STORE = 50
# Without instance store the root also holds the ~20 GB serving image, a second copy while an
# upgrade pulls the next one, and the weights in the Hugging Face cache (16 GB for 8B in BF16, kept
# twice while downloading): 100 GiB at least, and 300 GiB by default leaves room for a model twice
# the default's size.
GPU_ROOT_MIN_GIB_WITHOUT_INSTANCE_STORE = 100
GPU_ROOT_GIB_WITHOUT_INSTANCE_STORE = 300
# EBS gp3's largest volume.
GPU_ROOT_MAX_GIB = 16384


def gpu_root_volume_gib(s: Settings) -> int:
    """The GPU nodes' root volume: the setting if given, else the default for the type's instance store."""
    if s.gpu_volume_gib is not None:
        return s.gpu_volume_gib
    if s.gpu_instance.instance_store_gb > 0:
        return GPU_ROOT_GIB_WITH_INSTANCE_STORE
    return GPU_ROOT_GIB_WITHOUT_INSTANCE_STORE


def gpu_root_volume_floor(s: Settings) -> tuple[int, str]:
    """(smallest root volume in GiB, what it holds) for the GPU instance type."""
    if s.gpu_instance.instance_store_gb > 0:
        return GPU_ROOT_MIN_GIB_WITH_INSTANCE_STORE, (
            f"the AMI's {AMI_ROOT_SNAPSHOT_GIB} GiB and the journal: kubelet, containerd and the model cache "
            f"live on its {s.gpu_instance.instance_store_gb} GB NVMe"
        )
    return GPU_ROOT_MIN_GIB_WITHOUT_INSTANCE_STORE, (
        "no instance store: the ~20 GB image twice during an upgrade, plus the model weights"
    )


# --- GPU nodes -----------------------------------------------------------------------------------------
def gpu_nodes_for(s: Settings, replicas: Mapping[str, int]) -> int:
    """GPU nodes that hold these replicas of each side, every side on nodes of its own (a node holds
    replicas_per_node of one side: its GPUs over the side's tensor-parallel size)."""
    return sum(math.ceil(replicas[side] / s.replicas_per_node(side)) for side in SIDES)


def gpu_node_bounds(s: Settings) -> tuple[int, int]:
    """The GPU node group's (minimum, maximum): the nodes of every side's minimum and of every side's
    maximum replicas. Equal while no side has a range; the minimum is also the group's first size."""
    low = gpu_nodes_for(s, {side: s.side_replicas(side) for side in SIDES})
    high = gpu_nodes_for(s, {side: s.side_max_replicas(side) for side in SIDES})
    return low, high


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


# --- The KV transfer ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Calibration:
    """One point in the calibrated ranges."""

    pageable_copy_bytes_per_s: float
    nixl_in_vllm_bytes_per_s: float
    prefill_mfu: float


def _mid(bounds: tuple[float, float]) -> float:
    return (bounds[0] + bounds[1]) / 2


MIDPOINT = Calibration(
    _mid(PAGEABLE_COPY_BYTES_PER_S_RANGE), _mid(NIXL_IN_VLLM_BYTES_PER_S_RANGE), _mid(PREFILL_MFU_RANGE)
)
# The transfer's share of the prefill falls with faster copies and NIXL and rises with a faster prefill.
BEST_FOR_SPLIT = Calibration(
    PAGEABLE_COPY_BYTES_PER_S_RANGE[1], NIXL_IN_VLLM_BYTES_PER_S_RANGE[1], PREFILL_MFU_RANGE[0]
)
WORST_FOR_SPLIT = Calibration(
    PAGEABLE_COPY_BYTES_PER_S_RANGE[0], NIXL_IN_VLLM_BYTES_PER_S_RANGE[0], PREFILL_MFU_RANGE[1]
)


@dataclass(frozen=True)
class TransferPlan:
    """One prompt length: the KV it moves, what moving it costs, and what splitting buys."""

    prompt_tokens: int
    kv_bytes: int
    # Both synchronous pageable copies: GPU to host on prefill, host to GPU on decode.
    staging_seconds: float
    efa_wire_seconds: float
    tcp_wire_seconds: float
    prefill_seconds: float
    # Split: the prefill engine's steps for this prompt.
    prefill_chunks: int
    # Aggregated: the prompt prefills in this many default-size chunks, and each
    # stalls every decode on that GPU for one chunk's prefill (the ITL cost splitting removes).
    aggregated_chunks: int
    aggregated_stall_seconds: float
    # Split: decode copies the KV host to GPU once, synchronously, stalling its
    # decodes for that long (none with GPUDirect RDMA).
    decode_copy_stall_seconds: float
    decode_sequences: int

    @property
    def efa_seconds(self) -> float:
        return self.staging_seconds + self.efa_wire_seconds

    @property
    def tcp_seconds(self) -> float:
        return self.staging_seconds + self.tcp_wire_seconds

    @property
    def efa_share(self) -> float:
        return self.efa_seconds / self.prefill_seconds

    @property
    def tcp_share(self) -> float:
        return self.tcp_seconds / self.prefill_seconds


def pod_efa_gbps(s: Settings, side: str) -> float:
    """EFA bandwidth summed across the cards one pod of a side holds: the node's, split evenly across its pods."""
    return s.gpu_instance.network_gbps / s.replicas_per_node(side)


def transfer_streams(s: Settings) -> int:
    """NIXL agents moving one request's KV at once. Each TP worker has its own agent and moves its own
    heads; the smaller side's workers each take a whole share, so min of the two sizes run in parallel.
    An assumption: the 4-5 GB/s inside vLLM is taken as one agent's rate."""
    return min(s.prefill_tensor_parallel_size, s.decode_tensor_parallel_size)


def transfer_plan(s: Settings, prompt_tokens: int, calibration: Calibration = MIDPOINT) -> TransferPlan:
    gpu = s.gpu_instance
    kv_bytes = kv_cache_bytes_per_token(s.model) * prompt_tokens
    # The slower of the two pods' EFA (summed across the cards each holds) bounds the wire.
    line_bytes_per_s = min(pod_efa_gbps(s, side) for side in SIDES) * 1e9 / 8
    efa_bytes_per_s = min(line_bytes_per_s, calibration.nixl_in_vllm_bytes_per_s * transfer_streams(s))
    tcp_bytes_per_s = min(gpu.network_gbps, SINGLE_FLOW_GBPS_IN_PLACEMENT_GROUP) * 1e9 / 8
    # Each TP worker stages its own heads, in parallel; nothing is staged where GPUDirect RDMA reads GPU memory.
    copies = {
        side: 0.0
        if gpu.gpudirect_rdma
        else kv_bytes / s.tensor_parallel_size(side) / calibration.pageable_copy_bytes_per_s
        for side in SIDES
    }
    step = prefill_max_num_batched_tokens(s) or vllm_default_max_num_batched_tokens(s)
    aggregated_step = vllm_default_max_num_batched_tokens(s)
    return TransferPlan(
        prompt_tokens=prompt_tokens,
        kv_bytes=kv_bytes,
        staging_seconds=copies["prefill"] + copies["decode"],
        efa_wire_seconds=kv_bytes / efa_bytes_per_s,
        tcp_wire_seconds=kv_bytes / tcp_bytes_per_s,
        prefill_seconds=prefill_seconds(s, prompt_tokens, calibration.prefill_mfu),
        prefill_chunks=math.ceil(prompt_tokens / step),
        aggregated_chunks=math.ceil(prompt_tokens / aggregated_step),
        aggregated_stall_seconds=prefill_seconds(
            s, min(prompt_tokens, aggregated_step), calibration.prefill_mfu, side="decode"
        ),
        decode_copy_stall_seconds=copies["decode"],
        decode_sequences=concurrent_sequences(s, prompt_tokens),
    )


def transfer_share_range(s: Settings, prompt_tokens: int) -> tuple[float, float]:
    """The transfer's share of the prefill at both ends of the calibrated ranges (best, worst for splitting)."""
    return (
        transfer_plan(s, prompt_tokens, BEST_FOR_SPLIT).efa_share,
        transfer_plan(s, prompt_tokens, WORST_FOR_SPLIT).efa_share,
    )


def _verdict(s: Settings, plan: TransferPlan) -> str:
    if plan.efa_share >= 1:
        return "no"
    if plan.prompt_tokens < MIN_PROMPT_TOKENS_THAT_PAY:
        return "no"
    if s.model.parameters_billion < MIN_PARAMETERS_BILLION_THAT_PAY:
        return "maybe"
    return "likely"


def disaggregation_verdict(s: Settings, prompt_tokens: int) -> tuple[str, str]:
    """('no' | 'maybe' | 'likely' | 'inconclusive', why) for one prompt length.

    Worked out at both ends of the calibrated ranges: where they disagree, 'inconclusive'.
    """
    mid = transfer_plan(s, prompt_tokens)
    best, worst = (transfer_plan(s, prompt_tokens, c) for c in (BEST_FOR_SPLIT, WORST_FOR_SPLIT))
    share_range = f"{best.efa_share:.0%}-{worst.efa_share:.0%}"
    verdicts = {_verdict(s, best), _verdict(s, worst)}
    if len(verdicts) > 1:
        return "inconclusive", (
            f"moving the KV takes {share_range} of the prefill over the calibrated ranges: under 100% decode gains "
            "from receiving it, over 100% recomputing the prompt is faster; measure it (tools.bench compare)"
        )
    (verdict,) = verdicts
    if worst.efa_share >= 1:
        return verdict, (
            f"moving the KV takes {share_range} of the prefill: "
            "decode would recompute the prompt faster than receive it"
        )
    steps = mid.aggregated_chunks
    replaced = (
        f"replaces with one {mid.decode_copy_stall_seconds * 1e3:.0f} ms host-to-GPU copy on decode"
        if mid.decode_copy_stall_seconds
        else "removes (GPUDirect RDMA: decode copies nothing)"
    )
    trade = (
        f"split adds {mid.efa_seconds * 1e3:.0f} ms to TTFT ({share_range} of the prefill); aggregated, its prefill "
        f"stalls every co-running decode for {steps} step{'s' if steps > 1 else ''} of "
        f"{mid.aggregated_stall_seconds * 1e3:.0f} ms, which split {replaced}"
    )
    if verdict == "no":
        return verdict, (
            f"short prompts: aggregated with chunked prefill wins below {MIN_PROMPT_TOKENS_THAT_PAY} tokens "
            f"(Mooncake A10 at 1k, HyperPod); {trade}"
        )
    if verdict == "maybe":
        return verdict, (
            f"only under concurrent load, for inter-token latency: {trade}; public gains start at "
            f"{MIN_PARAMETERS_BILLION_THAT_PAY:g}B models (HyperPod)"
        )
    return verdict, f"long prompts on a large model: {trade}"


# --- Cold start ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ColdStart:
    """Getting the weights onto a node: the first time, and after a pod restart."""

    weights_bytes: float
    # At the instance's network bandwidth: a floor, since neither the Hugging Face
    # CDN nor one S3 connection fills it (Ray's S3 path opens many in parallel).
    first_download_seconds: float
    # From the NVMe cache (instance-store types); None where there is none.
    nvme_reload_seconds: float | None
    # Ray 2.58 re-downloads an s3:// source on every start (it skips no file), so a
    # restart costs the first download again; a Hugging Face source is found in the cache.
    restart_seconds: float


def download_gbps(s: Settings) -> float:
    """What the weights download through: the ENA interface on network card 0, one card's share of the
    node's bandwidth (EFA-only interfaces on the other cards carry no IP traffic)."""
    return s.gpu_instance.network_gbps / s.gpu_instance.network_cards


def cold_start(s: Settings) -> ColdStart:
    weights = s.model.parameters_billion * 1e9 * s.model.dtype_bytes
    download = weights / (download_gbps(s) * 1e9 / 8)
    nvme = weights / NVME_READ_BYTES_PER_S if s.gpu_instance.instance_store_gb > 0 else None
    from_s3 = (s.model_source or "").startswith("s3://")
    restart = download if from_s3 or nvme is None else nvme
    return ColdStart(weights, download, nvme, restart)


# --- Admission, backpressure and draining (README "Scaling") -------------------------------------
# Ray Serve bounds every deployment twice: max_ongoing_requests per replica (Ray LLM's default is
# 1e9, constants.py DEFAULT_MAX_ONGOING_REQUESTS) and max_queued_requests per caller (a proxy or
# a replica holding a handle; -1, no limit, by default). Past the queue the router raises
# BackPressureError (serve/_private/router.py), which reaches the client as the deployment's
# backpressure_config.status_code with Retry-After (serve/_private/http_util.py).
#
# vLLM 0.26 keeps a prefill's KV blocks leased for 30 s after its one-token response, renewed by
# decode's heartbeats while decode still waits to read them (nixl/base_scheduler.py,
# kv_lease_duration).
PREFILL_KV_LEASE_S = 30
# Serve drops a stopping replica from its callers' routers through a long poll; the replicas
# still routed to in that window get a request or two more (an allowance, unmeasured).
ROUTER_UPDATE_ALLOWANCE_S = 5


def _engine_side(side: str) -> str:
    """The memory plan an engine follows: an aggregated engine steps like decode."""
    return "prefill" if side == "prefill" else "decode"


def max_ongoing_requests(s: Settings, side: str) -> int:
    """Requests one engine replica ('prefill', 'decode' or 'aggregated') takes at once: as many
    typical_request_tokens sequences as its KV cache holds, at most vLLM's max_num_seqs, at least one.

    More would wait inside vLLM, out of Serve's sight: they would count as ongoing, so neither
    Serve's queue bound nor its 503 would ever meet them, and a burst would wait there unbounded.
    """
    fits = kv_cache_tokens(s, _engine_side(side)) // s.typical_request_tokens
    return max(1, min(vllm_default_max_num_seqs(s), fits))


def max_queued_requests(s: Settings, side: str) -> int:
    """Requests each caller holds for a side beyond what its replicas take: one replica's worth, so a
    queued request waits for about one request's duration at most before a slot frees."""
    return max_ongoing_requests(s, side)


def engine_admits(s: Settings, side: str) -> int:
    """Requests a side takes at its maximum, running and queued at one caller."""
    return max_ongoing_requests(s, side) * s.side_max_replicas(_engine_side(side)) + max_queued_requests(s, side)


def aggregated_max_ongoing(s: Settings) -> int:
    """Requests aggregated mode's engines take at their maximum, queued at one caller included."""
    replicas = s.side_max_replicas("prefill") + s.side_max_replicas("decode")
    return max_ongoing_requests(s, "aggregated") * replicas + max_queued_requests(s, "aggregated")


def ingress_max_ongoing_requests(s: Settings) -> int:
    """The ingress replica takes everything the engines behind it can hold or queue (the client-facing
    engines: decode, or the aggregated ones), so the bound that refuses a burst is theirs, once."""
    if s.serving_mode == "aggregated":
        return aggregated_max_ongoing(s)
    return engine_admits(s, "decode")


def graceful_shutdown(s: Settings, side: str) -> tuple[float, float]:
    """(graceful_shutdown_wait_loop_s, graceful_shutdown_timeout_s) of a deployment.

    A stopping replica sleeps the wait loop, then checks its ongoing requests, again and again
    until none are left, and is killed at the timeout (serve/_private/replica.py,
    _drain_ongoing_requests). Decode, aggregated and the ingress hold a request for its whole
    generation, which Serve's proxy ends at request_timeout_seconds: the timeout covers that
    (Serve's 20 s default would cut a long stream). Prefill's requests end at their first token,
    but the KV they leave behind is leased for PREFILL_KV_LEASE_S: prefill's first sleep covers
    the lease after the longest prefill that could still be running when it was told to stop, so
    the KV of every request it answered is read or expired before it exits.
    """
    if side != "prefill":
        return 2.0, float(s.request_timeout_seconds + ROUTER_UPDATE_ALLOWANCE_S)
    longest = prefill_seconds(s, s.max_model_len, mfu=PREFILL_MFU_RANGE[0])
    wait = float(math.ceil(PREFILL_KV_LEASE_S + longest + ROUTER_UPDATE_ALLOWANCE_S))
    # A second loop for a request that arrived in the router update window.
    return wait, 2 * wait


# --- One more replica on a new GPU node: the scale-up budget (README "The cost of a burst") -------
# Each term is a range in seconds with where it comes from; nothing here was timed on AWS.
# Serve scales up only after the load has stayed above the target this long (Ray 2.58
# serve/config.py, AutoscalingConfig.upscale_delay_s, default 30.0; serve_config keeps the default).
SERVE_UPSCALE_DELAY_S = 30.0
# Ray's autoscaler looks at pending bundles every 5 s (ray/autoscaler/_private/constants.py,
# AUTOSCALER_UPDATE_INTERVAL_S); Cluster Autoscaler reacts to the pending pod "less than 30 seconds
# in most cases" (kubernetes/autoscaler cluster-autoscaler/FAQ.md, "How fast is Cluster Autoscaler?").
RAY_AUTOSCALER_INTERVAL_S = 5.0
CLUSTER_AUTOSCALER_REACTION_S = 30.0
# From Cluster Autoscaler's request to a node pods can be scheduled on: "on GCE it usually takes 3 to
# 4 minutes" (the same FAQ). No AWS figure is published; the GPU node also waits for the NVIDIA and
# EFA device plugins before the worker pod fits.
NODE_LAUNCH_AND_JOIN_S = (180.0, 240.0)
# The serving image: AWS's Deep Learning Containers are 15-20 GB, and a standard pull of one "can
# take 4-6 minutes per instance" (AWS Machine Learning Blog, "Reducing container cold start times
# using SOCI index on DLAMI and DLC", 2026-06). The Ray LLM DLC's own size is not published and its
# registry cannot be reached from here: 20 GB, the top of that range, is assumed.
SERVING_IMAGE_GB = 20
IMAGE_PULL_S = (240.0, 360.0)
# vLLM's start after the weights are on disk: the load into GPU memory, torch.compile and CUDA-graph
# capture with an empty compile cache (a new node's instance store is empty). The low end is
# measured on CPU: the rehearsal's new decode replica, engine start and pre-warm, about 60 s
# (rehearsal/node_loss.py), a floor without compilation, CUDA graphs or a GPU. The high end is an
# assumption, unmeasured.
ENGINE_START_S = (60.0, 180.0)


@dataclass(frozen=True)
class BudgetTerm:
    """One step between "a side needs another replica" and that replica serving."""

    what: str
    low_seconds: float
    high_seconds: float
    # Where the numbers come from: a source, "measured ...", or "assumed".
    source: str
    # The term is a lower bound only (the real time has no published upper end).
    floor: bool = False


def scale_up_budget(s: Settings) -> list[BudgetTerm]:
    """The time to add one replica of a side on a new GPU node, term by term.

    A new node's NVMe is empty, so its weights come from the source (Hugging Face or S3), not the
    node's cache; the download is a floor at the ENA card's line rate (cold_start).
    """
    start = cold_start(s)
    source = s.model_source or s.model_id
    return [
        BudgetTerm(
            "Serve sees the load",
            SERVE_UPSCALE_DELAY_S,
            SERVE_UPSCALE_DELAY_S,
            "Ray 2.58 serve/config.py: upscale_delay_s default",
        ),
        BudgetTerm(
            "Ray adds the pod, Cluster Autoscaler the node",
            0.0,
            RAY_AUTOSCALER_INTERVAL_S + CLUSTER_AUTOSCALER_REACTION_S,
            "ray autoscaler constants.py (5 s loop); kubernetes/autoscaler FAQ (< 30 s)",
        ),
        BudgetTerm(
            f"{s.gpu_instance_type} launch and node join",
            *NODE_LAUNCH_AND_JOIN_S,
            "kubernetes/autoscaler FAQ: 3-4 min on GCE; no AWS figure, unmeasured here",
        ),
        BudgetTerm(
            f"image pull (~{SERVING_IMAGE_GB} GB)",
            *IMAGE_PULL_S,
            "AWS ML Blog, SOCI on DLAMI and DLC (2026-06): 15-20 GB DLC images, 4-6 min a standard pull",
        ),
        BudgetTerm(
            f"weights ({start.weights_bytes / 1e9:.1f} GB)",
            start.first_download_seconds,
            start.first_download_seconds,
            f"from {source} at {download_gbps(s):g} Gbps, a floor (cold_start): a new node's NVMe cache is empty",
            floor=True,
        ),
        BudgetTerm(
            "engine start",
            *ENGINE_START_S,
            "GPU load, torch.compile, CUDA graphs: ~60 s measured on CPU (the rehearsal's new decode replica, "
            "no compile, no GPU), 180 s assumed",
        ),
    ]


def scale_up_seconds(s: Settings) -> tuple[float, float]:
    """The scale-up budget summed: (low, high)."""
    terms = scale_up_budget(s)
    return sum(t.low_seconds for t in terms), sum(t.high_seconds for t in terms)
