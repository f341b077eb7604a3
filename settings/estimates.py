"""Estimates derived from the settings and the tables: hourly cost and the KV-transfer budget.

Every constant has its source beside it. These are estimates for planning,
printed at synth; none is a measurement.
"""

from __future__ import annotations

from dataclasses import dataclass

from settings.model import Settings, kv_cache_bytes_per_token

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
    disks_gb = s.system_nodes_desired * s.system_volume_gib + s.gpu_nodes * s.gpu_volume_gib
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


# --- KV-transfer budget -----------------------------------------------------------
# EC2 network bandwidth: one flow (one TCP connection, as UCX over TCP uses per
# peer) is limited to 5 Gbps outside a cluster placement group and 10 Gbps inside
# one (EC2 user guide, "Amazon EC2 instance network bandwidth"); EFA's SRD spreads
# one transfer over many paths and reaches the instance's full bandwidth.
SINGLE_FLOW_GBPS_IN_PLACEMENT_GROUP = 10.0
# Without GPUDirect RDMA (G6, G5, G6e) NIXL stages KV blocks in host memory:
# one GPU-to-host copy on prefill and one host-to-GPU copy on decode. PCIe Gen4
# x16 (NVIDIA L4, A10G, L40S datasheets) moves ~25 GB/s per direction in practice
# (an assumption; 32 GB/s is the link's peak).
PCIE_STAGING_BYTES_PER_S = 25e9
# Share of peak BF16 tensor throughput a prefill reaches (model FLOPs utilization);
# 40% is a common planning figure for dense prefill on one GPU (an assumption).
PREFILL_MFU = 0.40
# Disaggregation pays when moving the KV cache costs well under the prefill it
# saves decode from doing; flag transfers above this share of the prefill time.
TRANSFER_BUDGET_SHARE = 0.25
PROMPT_LENGTHS = (1024, 8192, 32768)


@dataclass(frozen=True)
class TransferPlan:
    prompt_tokens: int
    kv_bytes: int
    efa_seconds: float
    tcp_seconds: float
    prefill_seconds: float

    @property
    def efa_share(self) -> float:
        return self.efa_seconds / self.prefill_seconds

    @property
    def tcp_share(self) -> float:
        return self.tcp_seconds / self.prefill_seconds

    @property
    def fits_budget(self) -> bool:
        return self.efa_share <= TRANSFER_BUDGET_SHARE


def transfer_plan(s: Settings, prompt_tokens: int) -> TransferPlan:
    """KV bytes for one prompt, their transfer time over EFA and over one TCP flow, and the prefill time.

    Transfer times include the two PCIe copies through host memory where the
    instance has no GPUDirect RDMA.
    Prefill FLOPs are 2 x parameters x tokens (the attention term, quadratic in
    length, is left out: it makes long prompts slower to prefill, so the shares
    below are upper bounds).
    """
    model, gpu = s.model, s.gpu_instance
    kv_bytes = kv_cache_bytes_per_token(model) * prompt_tokens
    efa_bytes_per_s = gpu.network_gbps * 1e9 / 8
    tcp_bytes_per_s = min(gpu.network_gbps, SINGLE_FLOW_GBPS_IN_PLACEMENT_GROUP) * 1e9 / 8
    staging = 0.0 if gpu.gpudirect_rdma else 2 * kv_bytes / PCIE_STAGING_BYTES_PER_S
    flops = 2 * model.parameters_billion * 1e9 * prompt_tokens
    prefill_seconds = flops / (gpu.gpu_bf16_tflops * 1e12 * PREFILL_MFU)
    return TransferPlan(
        prompt_tokens,
        kv_bytes,
        kv_bytes / efa_bytes_per_s + staging,
        kv_bytes / tcp_bytes_per_s + staging,
        prefill_seconds,
    )


def plan_table(s: Settings) -> str:
    """The KV-transfer budget as a table, for `make plan` and synth."""
    per_token = kv_cache_bytes_per_token(s.model)
    gpu = s.gpu_instance
    rows = [
        f"KV cache: {per_token:,} bytes per prompt token ({s.model_id}); "
        f"{s.gpu_instance_type}: {gpu.network_gbps:g} Gbps EFA, one {gpu.gpu_model} at "
        f"{gpu.gpu_bf16_tflops:g} BF16 TFLOPS x {PREFILL_MFU:.0%} MFU"
        + ("" if gpu.gpudirect_rdma else "; KV staged through host memory (no GPUDirect RDMA)"),
        f"{'prompt':>8} {'KV MB':>9} {'EFA ms':>8} {'TCP ms':>8} {'prefill ms':>11} {'EFA/prefill':>12} "
        f"{'TCP/prefill':>12}  verdict",
    ]
    for tokens in PROMPT_LENGTHS:
        p = transfer_plan(s, tokens)
        verdict = "ok" if p.fits_budget else f"over {TRANSFER_BUDGET_SHARE:.0%} of prefill: disaggregation may not pay"
        if tokens > s.max_model_len:
            verdict += f" (beyond max_model_len {s.max_model_len})"
        rows.append(
            f"{tokens:>8} {p.kv_bytes / 1e6:>9.1f} {p.efa_seconds * 1e3:>8.1f} {p.tcp_seconds * 1e3:>8.1f} "
            f"{p.prefill_seconds * 1e3:>11.1f} {p.efa_share:>12.1%} {p.tcp_share:>12.1%}  {verdict}"
        )
    return "\n".join(rows)
