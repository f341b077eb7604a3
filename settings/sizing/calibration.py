"""Sizing: the public rates the plan is calibrated on, as ranges, and the points in them."""

from __future__ import annotations

from dataclasses import dataclass

# --- Public numbers the plan is calibrated on, each with its source -------------------------
# Each calibrated rate is a range: every verdict is worked out at both ends
# (Calibration.BEST_FOR_SPLIT and WORST_FOR_SPLIT) and the midpoints are printed.
#
# vLLM with kv_buffer_device cpu copies KV blocks through pageable host memory,
# synchronously: GPU to host on prefill, host to GPU on decode (inside
# get_finished, so every decode on that GPU waits): vLLM 0.26's NixlConnector,
# https://github.com/vllm-project/vllm/tree/v0.26.0/vllm/distributed/kv_transfer/kv_connector/v1/nixl
# (base_worker.py). Such copies run at roughly 5-10 GB/s (an estimate, unmeasured).
PAGEABLE_COPY_BYTES_PER_S_RANGE = (5e9, 10e9)
# NIXL over EFA with GPUDirect on p5 reaches 10-12 GB/s in microbenchmarks but
# 4-5 GB/s inside vLLM, as Anyscale reported it (no public page found to cite;
# unconfirmed here): the effective KV rate is capped there even where the link is faster.
NIXL_IN_VLLM_BYTES_PER_S_RANGE = (4e9, 5e9)
# One TCP flow (UCX falling back to TCP) is limited to 10 Gbps inside a cluster
# placement group (EC2 user guide, "Amazon EC2 instance network bandwidth",
# https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-instance-network-bandwidth.html).
SINGLE_FLOW_GBPS_IN_PLACEMENT_GROUP = 10.0
# Share of peak dense BF16 tensor throughput a prefill reaches on one GPU: 30-50%,
# around the common planning figure of 40% (an assumption, unmeasured here). A
# faster prefill makes the transfer's share larger.
PREFILL_MFU_RANGE = (0.30, 0.50)
# No share of the prefill is set as the transfer's budget: none has a public
# source. The one firm bound is the prefill itself: a transfer that takes longer
# than the prefill it spares decode is beaten by decode recomputing the prompt.
# SageMaker HyperPod's guidance: disaggregation pays from 4k-token prompts and
# 70B-parameter models (with 2+ requests/s and 256+ output tokens), "When DPD helps" in
# https://docs.aws.amazon.com/sagemaker/latest/dg/sagemaker-hyperpod-model-deployment-dpd.html;
# llm-d's: not for 8B models with 200/200-token traffic ("P/D Best Practices",
# https://llm-d.ai/docs/guide/Installation/pd-disaggregation); Mooncake on A10 (7B, 1k prompts,
# 2 QPS): aggregated TTFT 461 ms vs 1,273 ms split, and aggregated with chunked
# prefill the best TPOT p99 (136 ms vs 524 ms split), Mooncake's "Benchmark performance on NVIDIA A10",
# https://github.com/kvcache-ai/Mooncake/blob/c9fad6c84305e595e498b46ed69b02b247285062/doc/en/vllm-benchmark-results-v0.1.md
MIN_PROMPT_TOKENS_THAT_PAY = 4096
MIN_PARAMETERS_BILLION_THAT_PAY = 70.0


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
