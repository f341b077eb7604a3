"""Sizing: what one replica's latency can be, and the replicas a latency target needs at a request rate.

Estimates, not measurements: the prefill rate is sizing's (prefill_seconds, an assumed MFU), the
decode step is the memory-bandwidth bound from the GPU's datasheet bandwidth, and the queueing
models below are textbook ones that real traffic only approximates. The policy that scales on a
target measures the real latency (ray_pods/latency_autoscaling.py); these numbers say where to start.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import TYPE_CHECKING

from settings import catalog
from settings.sizing.admission import max_ongoing_requests
from settings.sizing.calibration import PREFILL_MFU_RANGE
from settings.sizing.memory import SIDES, kv_cache_bytes_per_token_per_gpu, kv_cache_tokens, prefill_seconds
from settings.sizing.root_volume import gpu_nodes_for
from settings.sizing.transfer import local_prefill_threshold, transfer_plan

if TYPE_CHECKING:
    from settings.model import Settings

# Bisection steps for the prefill queue's utilization bound: 2^-60 of the unit interval, far below any
# difference a replica count can show.
_BISECTION_STEPS = 60


# --- One replica's floors -------------------------------------------------------------------------
def prefill_floor_prompt_tokens(s: Settings) -> int:
    """The shortest prompt the prefill side is sent: typical_request_tokens, or past local_prefill_max_tokens when
    that is longer (decode prefills the shorter ones itself: ray_pods/selective_pd.py), at most max_model_len."""
    return min(s.max_model_len, max(s.typical_request_tokens, local_prefill_threshold(s) + 1))


def prefill_ttft_floor_ms(s: Settings) -> float:
    """The least time to first token one prefill replica can give, in ms (an estimate).

    floor = prefill_seconds(prefill_floor_prompt_tokens) at the fast end of PREFILL_MFU_RANGE
          = 2 x parameters x tokens / (GPU BF16 TFLOPS x tensor-parallel size x 0.50)

    tokens: typical_request_tokens, or the shortest prompt prefill is sent when local_prefill_max_tokens keeps
    shorter ones on decode. The fast end of the MFU range, the attention term left out (sizing's
    prefill_seconds) and no queue wait or host staging: each would only add, so no number of replicas meets
    a lower target.
    """
    return prefill_seconds(s, prefill_floor_prompt_tokens(s), mfu=PREFILL_MFU_RANGE[1]) * 1e3


def decode_step_seconds(s: Settings, sequences: int, context_tokens: float) -> float:
    """One decode step of one replica running `sequences` sequences of `context_tokens` tokens each (an
    estimate): decode is bound by memory bandwidth, and every step reads each GPU's share of the weights
    and of the running sequences' KV cache once.

    step = (parameters x dtype bytes / TP + sequences x context_tokens x KV bytes per token per GPU)
           / GPU memory bandwidth (catalog.GPU_MEMORY_BYTES_PER_S, datasheet peak)

    Peak bandwidth, and no compute, sampler or scheduling time: a real step is longer.
    """
    model = s.model
    tp = s.tensor_parallel_size("decode")
    weights = model.parameters_billion * 1e9 * model.dtype_bytes / tp
    kv = sequences * context_tokens * kv_cache_bytes_per_token_per_gpu(model, tp)
    return (weights + kv) / catalog.GPU_MEMORY_BYTES_PER_S[s.gpu_instance.gpu_model]


def decode_itl_floor_ms(s: Settings) -> float:
    """The inter-token latency one decode replica gives at its admission bound, in ms (an estimate).

    floor = decode_step_seconds(max_ongoing_requests(decode), typical_request_tokens)
          = (weights per GPU + admitted x typical_request_tokens x KV bytes per token per GPU)
            / GPU memory bandwidth

    At the admission bound every admitted request holds a typical request's KV, so the step reads about
    the whole KV cache besides the weights. A replica Serve fills to its bound streams at this pace, so a
    target below it is one a busy replica breaches by design; the step with one sequence (the weights
    alone) is lower, but only a replica kept nearly idle gives it.
    """
    return decode_step_seconds(s, max_ongoing_requests(s, "decode"), s.typical_request_tokens) * 1e3


# --- Replicas for a request rate ------------------------------------------------------------------
@dataclass(frozen=True)
class SideLatencySizing:
    """One side at a request rate, against its target (an estimate: the models are in
    replicas_for_latency_targets)."""

    side: str
    target_ms: int
    percentile: int
    floor_ms: float
    # Prefill: one prompt's prefill time; decode: the inter-token latency at the mean load one replica is given.
    service_ms: float
    # Requests per second one replica takes with the percentile held; 0: the target cannot be met at this length.
    per_replica_rate: float
    # Replicas the rate needs (None: the target cannot be met); 0 when the side is sent none of the requests.
    replicas: int | None
    why: str


@dataclass(frozen=True)
class LatencySizing:
    rate: float
    prompt_tokens: int
    output_tokens: int
    sides: tuple[SideLatencySizing, ...]
    # Replicas each side runs: the sized ones (at least the side's minimum), its minimum where it has no target.
    replicas: dict[str, int]
    # The GPU group at those replicas, warm nodes included: estimates.priced_per_hour prices it.
    gpu_nodes: int


def _prefill_utilization_bound(slack: float, allowed_over: float) -> float:
    """The largest utilization rho at which P(wait > slack service times) <= allowed_over in prefill's queue:
    rho x exp(-2 x (1 - rho) x slack) = allowed_over, by bisection (it rises with rho past rho = allowed_over)."""
    low, high = allowed_over, 1.0
    for _ in range(_BISECTION_STEPS):
        mid = (low + high) / 2
        if mid * math.exp(-2 * (1 - mid) * slack) <= allowed_over:
            low = mid
        else:
            high = mid
    return low


def _prefill_side(s: Settings, rate: float, prompt_tokens: int, target: tuple[int, int]) -> SideLatencySizing:
    ms, percentile = target
    floor = prefill_ttft_floor_ms(s)
    service = prefill_seconds(s, prompt_tokens)
    if prompt_tokens <= local_prefill_threshold(s):
        why = f"a {prompt_tokens}-token prompt is prefilled on decode (local_prefill_max_tokens): prefill gets none"
        return SideLatencySizing("prefill", ms, percentile, floor, service * 1e3, 0.0, 0, why)
    slack = ms / 1e3 / service - 1
    if slack < 0:
        why = f"one {prompt_tokens}-token prefill alone takes {service * 1e3:.0f} ms"
        return SideLatencySizing("prefill", ms, percentile, floor, service * 1e3, 0.0, None, why)
    rho = _prefill_utilization_bound(slack, 1 - percentile / 100)
    per_replica = rho / service
    why = f"each replica at most {rho:.0%} busy"
    return SideLatencySizing(
        "prefill", ms, percentile, floor, service * 1e3, per_replica, math.ceil(rate / per_replica), why
    )


def _decode_side(
    s: Settings, rate: float, prompt_tokens: int, output_tokens: int, target: tuple[int, int]
) -> SideLatencySizing:
    ms, percentile = target
    floor = decode_itl_floor_ms(s)
    # A sequence's KV grows from its prompt to prompt + output: on average the middle.
    context = prompt_tokens + output_tokens / 2
    weights_step = decode_step_seconds(s, 0, context)
    per_sequence_step = decode_step_seconds(s, 1, context) - weights_step
    # Every request stalls every stream on its replica once: decode prefills a short prompt itself, and copies a
    # split one's KV from host memory (none with GPUDirect RDMA). Spread over each stream's output tokens, each
    # running sequence adds its stall's share to every gap.
    stall = (
        prefill_seconds(s, prompt_tokens, side="decode")
        if prompt_tokens <= local_prefill_threshold(s)
        else transfer_plan(s, prompt_tokens).decode_copy_stall_seconds
    )
    per_sequence = per_sequence_step + stall / output_tokens
    admitted = max_ongoing_requests(s, "decode")
    held = kv_cache_tokens(s) // (prompt_tokens + output_tokens)
    fits = min(admitted, held)
    n_max = min(fits, math.floor((ms / 1e3 - weights_step) / per_sequence))
    if n_max < 1:
        why = (
            f"one sequence alone streams at {(weights_step + per_sequence) * 1e3:.0f} ms a token"
            if fits >= 1
            else f"no {prompt_tokens + output_tokens}-token sequence fits decode's KV cache"
        )
        return SideLatencySizing("decode", ms, percentile, floor, 0.0, 0.0, None, why)
    z = NormalDist().inv_cdf(percentile / 100)
    mean = ((-z + math.sqrt(z * z + 4 * n_max)) / 2) ** 2
    gap = weights_step + mean * per_sequence
    per_replica = mean / (output_tokens * gap)
    limit = (
        "the target"
        if n_max < fits
        else ("the admission bound" if admitted <= held else f"the KV cache at {prompt_tokens + output_tokens} tokens")
    )
    why = f"at most {n_max} sequences a replica at the {percentile}th percentile ({limit}), {mean:.1f} on average"
    return SideLatencySizing(
        "decode", ms, percentile, floor, gap * 1e3, per_replica, math.ceil(rate / per_replica), why
    )


def replicas_for_latency_targets(s: Settings, rate: float, prompt_tokens: int, output_tokens: int) -> LatencySizing:
    """Replicas per side and GPU nodes (estimates.priced_per_hour gives their cost) for `rate` requests per second
    of `prompt_tokens` in and `output_tokens` out, for each side's latency target (an estimate; Poisson arrivals,
    spread evenly).

    Prefill: each replica an M/D/1 queue (one prompt at a time, since prefill is compute-bound and batching adds
    no rate; every prompt of this length takes the same S = prefill_seconds(prompt_tokens), at the MFU's
    midpoint). An arrival waits with probability rho (exact for Poisson arrivals), and the wait, when there is
    one, is taken as exponential with Pollaczek-Khinchine's mean for deterministic service, S / (2 x (1 - rho))
    (Kingman's approximation): P(W > t) = rho x exp(-2 x (1 - rho) x t / S). TTFT = S + W, so the percentile p
    holds while
        rho x exp(-2 x (1 - rho) x (target - S) / S) <= 1 - p/100
    A replica then takes rho_max / S requests a second: replicas = ceil(rate x S / rho_max).

    Decode: every step reads the weights and each running sequence's KV once (decode_step_seconds, at the mean
    context prompt + output/2), and each request stalls every stream on its replica once, for P: its prefill when
    decode prefills it itself (at most local_prefill_max_tokens), else the host-to-GPU copy of its KV
    (transfer_plan; none with GPUDirect RDMA). So with n sequences running
        gap(n) = weights step + n x (one sequence's KV step + P / output)
    and n_max = the most with gap(n) <= target, within the admission bound and the KV cache. Running sequences
    on a replica are Poisson (an M/G/inf occupancy) with mean N; the normal approximation of its p-th
    percentile, N + z_p x sqrt(N) = n_max, gives N, and Little's law a replica's rate: N / (output x gap(N)).

    A side with no target runs its minimum (it scales on ongoing requests, which no target sizes); a sized side
    at least its minimum, past its maximum when the rate needs more; warm nodes are added to the GPU nodes.
    """
    sides: list[SideLatencySizing] = []
    replicas = {side: s.side_replicas(side) for side in SIDES}
    for side in SIDES:
        target = s.side_latency_target(side)
        if target is None:
            continue
        sized = (
            _prefill_side(s, rate, prompt_tokens, target)
            if side == "prefill"
            else _decode_side(s, rate, prompt_tokens, output_tokens, target)
        )
        sides.append(sized)
        # Past its maximum too: the cost of meeting the target, which plan flags. A target no replica count meets
        # is priced at the side's maximum, where the policy would hold it.
        needed = s.side_max_replicas(side) if sized.replicas is None else sized.replicas
        replicas[side] = max(s.side_replicas(side), needed)
    nodes = gpu_nodes_for(s, replicas) + s.gpu_warm_nodes
    return LatencySizing(rate, prompt_tokens, output_tokens, tuple(sides), replicas, nodes)
