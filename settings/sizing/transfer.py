"""Sizing: the KV transfer and whether splitting prefill from decode is expected to pay."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from settings.sizing.calibration import (
    BEST_FOR_SPLIT,
    MIDPOINT,
    MIN_PARAMETERS_BILLION_THAT_PAY,
    MIN_PROMPT_TOKENS_THAT_PAY,
    SINGLE_FLOW_GBPS_IN_PLACEMENT_GROUP,
    WORST_FOR_SPLIT,
    Calibration,
)
from settings.sizing.memory import (
    SIDES,
    concurrent_sequences,
    kv_cache_bytes_per_token,
    prefill_max_num_batched_tokens,
    prefill_seconds,
    vllm_default_max_num_batched_tokens,
)

if TYPE_CHECKING:
    from settings.model import Settings


# --- The KV transfer ----------------------------------------------------------------------------------
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


def local_prefill_threshold(s: Settings) -> int:
    """The prompt length at or below which decode prefills a request itself (ray_pods/selective_pd.py); 0 splits every
    request. Unset: the public guidance's MIN_PROMPT_TOKENS_THAT_PAY in disaggregated mode, below which splitting does
    not pay, at most max_model_len; aggregated mode splits nothing and has no threshold."""
    if s.local_prefill_max_tokens is not None:
        return s.local_prefill_max_tokens
    if s.serving_mode == "aggregated":
        return 0
    return min(MIN_PROMPT_TOKENS_THAT_PAY, s.max_model_len)


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
