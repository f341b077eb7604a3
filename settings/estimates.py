"""Estimates derived from the settings and the tables: hourly cost and the KV-transfer plan.

Every constant has its source beside it. These are estimates for planning,
printed at synth; none is a measurement.
"""

from __future__ import annotations

from dataclasses import dataclass

from settings import sizing
from settings.model import Settings

# --- Prices ---------------------------------------------------------------------
PRICE_REGION = "us-east-1"
PRICE_DATE = "2026-07-20"
PRICE_SOURCE = "AWS price list file for us-east-1 (../shared/FACTS.md), on-demand, Linux"
# USD per hour. g6.8xlarge and m7i.xlarge from the price file; the other m7i
# sizes scale linearly with size within the family, as EC2 on-demand prices do.
INSTANCE_PRICES_PER_HOUR = {
    "g6.8xlarge": 2.0144,
    "m7i.xlarge": 0.2016,
    "m7i.2xlarge": 0.4032,
    "m7i.4xlarge": 0.8064,
}
# AWS pricing pages for us-east-1 (unchanged for years; not in the dated file):
NAT_GATEWAY_PER_HOUR = 0.045  # Amazon VPC pricing, per NAT gateway hour (data processing extra)
EKS_CONTROL_PLANE_PER_HOUR = 0.10  # Amazon EKS pricing, standard support ($0.60 in extended support)
GP3_PER_GB_MONTH = 0.08  # Amazon EBS pricing, gp3 storage
HOURS_PER_MONTH = 730


@dataclass(frozen=True)
class CostLine:
    item: str
    count: int
    unit_per_hour: float | None

    @property
    def per_hour(self) -> float | None:
        return None if self.unit_per_hour is None else self.count * self.unit_per_hour


def hourly_cost(s: Settings) -> list[CostLine]:
    """What the stack runs per hour at its desired sizes, on demand."""
    nat_gateways = 0 if s.vpc_id else s.max_azs
    disks_gb = s.system_nodes_desired * s.system_volume_gib + s.gpu_nodes * s.gpu_root_volume_gib
    return [
        CostLine(f"{s.gpu_instance_type} GPU nodes", s.gpu_nodes, INSTANCE_PRICES_PER_HOUR.get(s.gpu_instance_type)),
        CostLine(
            f"{s.system_instance_type} system nodes",
            s.system_nodes_desired,
            INSTANCE_PRICES_PER_HOUR.get(s.system_instance_type),
        ),
        CostLine("NAT gateways", nat_gateways, NAT_GATEWAY_PER_HOUR),
        CostLine("EKS control plane", 1, EKS_CONTROL_PLANE_PER_HOUR),
        CostLine(f"gp3 root volumes ({disks_gb} GB)", disks_gb, GP3_PER_GB_MONTH / HOURS_PER_MONTH),
    ]


def cost_summary(s: Settings) -> str:
    lines = hourly_cost(s)
    known = [line.per_hour for line in lines if line.per_hour is not None]
    unknown = [line.item for line in lines if line.per_hour is None]
    text = f"~${sum(known):.2f}/h on demand ({PRICE_REGION} prices of {PRICE_DATE}"
    if s.effective_region not in (None, PRICE_REGION):
        text += f"; the stack is in {s.effective_region}, whose prices differ"
    text += "; data transfer and logs extra"
    if unknown:
        text += f"; no price for {', '.join(unknown)}"
    return text + ")"


# --- The KV-transfer plan and whether P/D pays ---------------------------------------
def _gb_per_s(bounds: tuple[float, float]) -> str:
    return f"{bounds[0] / 1e9:g}-{bounds[1] / 1e9:g} GB/s"


def plan_table(s: Settings) -> str:
    """The KV-transfer plan and the per-length verdict, for `make plan` and synth (numbers from settings.sizing)."""
    gpu = s.gpu_instance
    per_token = sizing.kv_cache_bytes_per_token(s.model)
    step = sizing.prefill_max_num_batched_tokens(s) or sizing.DEFAULT_MAX_NUM_BATCHED_TOKENS
    mfu = sizing.PREFILL_MFU_RANGE
    rows = [
        f"KV cache: {per_token:,} bytes per prompt token ({s.model_id}); {s.gpu_instance_type}: "
        f"{gpu.network_gbps:g} Gbps EFA (NIXL in vLLM at most {_gb_per_s(sizing.NIXL_IN_VLLM_BYTES_PER_S_RANGE)}), "
        f"one {gpu.gpu_model} at {gpu.gpu_bf16_tflops:g} BF16 TFLOPS x {mfu[0]:.0%}-{mfu[1]:.0%} MFU"
        + (
            ""
            if gpu.gpudirect_rdma
            else f"; KV staged through pageable host memory at {_gb_per_s(sizing.PAGEABLE_COPY_BYTES_PER_S_RANGE)} "
            "each way (no GPUDirect RDMA)"
        ),
        f"Decode's KV cache: {sizing.kv_cache_tokens(s):,} tokens per GPU; prefill step {step} tokens "
        f"({'set on the prefill engine' if sizing.prefill_max_num_batched_tokens(s) else 'vLLM default'})",
        "Times at the midpoints of the ranges; EFA/prefill also at both ends. agg stall: the prefill chunks that "
        "stall every co-running decode when aggregated; P/D stall: decode's one host-to-GPU copy when split",
        f"{'prompt':>7} {'KV MB':>8} {'staging':>8} {'EFA wire':>8} {'TCP wire':>8} {'prefill':>8} {'chunks':>6} "
        f"{'EFA/prefill (range)':>20} {'agg stall':>10} {'P/D stall':>9} {'seqs fit':>8}  P/D pays?",
    ]
    reasons = []
    for tokens in sizing.PROMPT_LENGTHS:
        p = sizing.transfer_plan(s, tokens)
        low, high = sizing.transfer_share_range(s, tokens)
        verdict, why = sizing.disaggregation_verdict(s, tokens)
        beyond = " (beyond max_model_len)" if tokens > s.max_model_len else ""
        share = f"{p.efa_share:.1%} ({low * 100:.0f}-{high:.0%})"
        stall = f"{p.aggregated_chunks}x{p.aggregated_stall_seconds * 1e3:.0f}ms"
        rows.append(
            f"{tokens:>7} {p.kv_bytes / 1e6:>8.1f} {p.staging_seconds * 1e3:>6.0f}ms "
            f"{p.efa_wire_seconds * 1e3:>6.0f}ms {p.tcp_wire_seconds * 1e3:>6.0f}ms "
            f"{p.prefill_seconds * 1e3:>6.0f}ms {p.prefill_chunks:>6} "
            f"{share:>20} {stall:>10} {p.decode_copy_stall_seconds * 1e3:>7.0f}ms {p.decode_sequences:>8}  "
            f"{verdict}{beyond}"
        )
        reasons.append(f"  {tokens}: {verdict}: {why}")
    rows += reasons
    start = sizing.cold_start(s)
    source = s.model_source or s.model_id
    rows.append(
        f"Cold start ({start.weights_bytes / 1e9:.1f} GB of weights from {source}): first download "
        f">= {start.first_download_seconds:.0f} s at {gpu.network_gbps:g} Gbps; after a pod restart "
        f"{start.restart_seconds:.0f} s"
        + (
            f" (re-read from the NVMe cache at {sizing.NVME_READ_BYTES_PER_S / 1e9:g} GB/s)"
            if start.nvme_reload_seconds is not None and start.restart_seconds == start.nvme_reload_seconds
            else " (downloaded again)"
        )
        + "; engine start and GPU load extra"
    )
    rows.append(
        "Calibrated on public numbers (../shared/FACTS.md): pageable copies 5-10 GB/s, NIXL 4-5 GB/s inside "
        "vLLM, Mooncake on A10, SageMaker HyperPod's 4k-prompt/70B guidance; prefill MFU 30-50% is assumed. "
        "A verdict that differs between the ends of these ranges is printed as inconclusive. Measure yours: "
        "python -m tools.bench compare <disaggregated results> <aggregated results>"
    )
    return "\n".join(rows)
