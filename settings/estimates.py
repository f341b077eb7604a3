"""Estimates derived from the settings and the tables: hourly cost and the KV-transfer plan.

Every constant has its source beside it. These are estimates for planning,
printed at synth; none is a measurement.
"""

from __future__ import annotations

from dataclasses import dataclass

from serve_config.deployments import ingress_replicas
from settings import catalog, sizing
from settings.model import Settings

# --- Prices ---------------------------------------------------------------------
PRICE_REGION = "us-east-1"
PRICE_DATE = "2026-07-20"
PRICE_SOURCE = "AWS price list file for us-east-1, 2026-07-20, on-demand, Linux"
# USD per hour, from the instance table (settings/catalog.py): g6.8xlarge and m7i.xlarge from the
# price file; the other m7i sizes scale linearly with size within the family, as EC2 on-demand
# prices do; the multi-GPU types' prices name their own source (catalog.INSTANCE_PRICE_SOURCES).
INSTANCE_PRICES_PER_HOUR = {
    name: spec.price_per_hour for name, spec in catalog.INSTANCE_TYPES.items() if spec.price_per_hour is not None
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


def hourly_cost(s: Settings, gpu_nodes: int | None = None) -> list[CostLine]:
    """What the stack runs per hour at its desired sizes, on demand; gpu_nodes: the GPU group at that
    many nodes instead of its minimum (settings/sizing/root_volume.py gpu_node_bounds)."""
    if gpu_nodes is None:
        gpu_nodes = sizing.gpu_node_bounds(s)[0]
    nat_gateways = 0 if s.vpc_id else s.max_azs
    disks_gb = s.system_nodes_desired * s.system_volume_gib + gpu_nodes * s.gpu_root_volume_gib
    return [
        CostLine(f"{s.gpu_instance_type} GPU nodes", gpu_nodes, INSTANCE_PRICES_PER_HOUR.get(s.gpu_instance_type)),
        CostLine(
            f"{s.system_instance_type} system nodes",
            s.system_nodes_desired,
            INSTANCE_PRICES_PER_HOUR.get(s.system_instance_type),
        ),
        CostLine("NAT gateways", nat_gateways, NAT_GATEWAY_PER_HOUR),
        CostLine("EKS control plane", 1, EKS_CONTROL_PLANE_PER_HOUR),
        CostLine(f"gp3 root volumes ({disks_gb} GB)", disks_gb, GP3_PER_GB_MONTH / HOURS_PER_MONTH),
        *gcs_store_cost(s),
    ]


def gcs_store_cost(s: Settings) -> list[CostLine]:
    """The GCS store's two ElastiCache nodes, with GCS fault tolerance (prices: catalog.GCS_STORE_PRICE_SOURCE)."""
    if not s.gcs_fault_tolerance:
        return []
    price = catalog.GCS_STORE_NODE_PRICES[s.gcs_store_node_type]
    return [CostLine(f"{s.gcs_store_node_type} GCS store nodes (ElastiCache for Valkey)", 2, price)]


def priced_per_hour(s: Settings, gpu_nodes: int) -> float:
    """The priced lines summed with the GPU group at that many nodes (a line without a price counts nothing)."""
    return sum(line.per_hour for line in hourly_cost(s, gpu_nodes) if line.per_hour is not None)


def hourly_cost_range(s: Settings) -> tuple[float, float]:
    """The priced lines summed with the GPU group at its minimum and at its maximum."""
    low, high = sizing.gpu_node_bounds(s)
    return priced_per_hour(s, low), priced_per_hour(s, high)


def cost_summary(s: Settings) -> str:
    lines = hourly_cost(s)
    unknown = [line.item for line in lines if line.per_hour is None]
    low_nodes, high_nodes = sizing.gpu_node_bounds(s)
    low, high = hourly_cost_range(s)
    warm = f", {s.gpu_warm_nodes} of them warm" if s.gpu_warm_nodes else ""
    if high_nodes == low_nodes:
        nodes = f" with {low_nodes} GPU nodes{warm}" if warm else ""
        text = f"~${low:.2f}/h{nodes} on demand ({PRICE_REGION} prices of {PRICE_DATE}"
    else:
        text = (
            f"~${low:.2f}/h at the minimum ({low_nodes} GPU nodes{warm}) to ~${high:.2f}/h at the maximum "
            f"({high_nodes} GPU nodes) on demand ({PRICE_REGION} prices of {PRICE_DATE}"
        )
    if s.effective_region not in (None, PRICE_REGION):
        text += f"; the stack is in {s.effective_region}, whose prices differ"
    text += "; data transfer and logs extra"
    if unknown:
        text += f"; no price for {', '.join(unknown)}"
    source = catalog.INSTANCE_PRICE_SOURCES.get(s.gpu_instance_type, "")
    if s.gpu_instance_type in INSTANCE_PRICES_PER_HOUR and not source.startswith("AWS price list file"):
        text += f"; {s.gpu_instance_type} at ${INSTANCE_PRICES_PER_HOUR[s.gpu_instance_type]:g}/h from {source}"
    return text + ")"


# --- Observability, per month ---------------------------------------------
# Series the Ray pods export, measured: the pd rehearsal's scrape of both nodes on 2026-12-04
# (tests/data/observability_scrape_*.prom.gz). Node B, one decode worker: 1231, of them 367 vLLM's
# engine series (`ray_vllm_*`). Node A, one Ray node holding the head, the ingress replica and a
# prefill worker: 2564. On EKS each of those is a pod of its own, and every pod is a Ray node the
# collector scrapes: each exports its own raylet, agent and worker series.
RAY_SERIES_PER_ENGINE_POD = 1231
RAY_ENGINE_SERIES = 367
# Node A beyond one worker: the head's GCS and Serve controller, and the ingress replica's own series.
RAY_SERIES_HEAD = 2564 - RAY_SERIES_PER_ENGINE_POD
# The ingress pod: a Ray node without an engine (estimated from node B, not measured on its own).
RAY_SERIES_PER_INGRESS_POD = RAY_SERIES_PER_ENGINE_POD - RAY_ENGINE_SERIES
# Amazon Managed Service for Prometheus pricing, us-east-1: ingestion, first 2 billion samples a
# month; storage (a sample is 1-2 bytes, say 2, metadata extra).
AMP_PER_10M_SAMPLES = 0.90
AMP_STORAGE_PER_GB_MONTH = 0.03
# UNVERIFIED (not in the dated price file, not read from the pricing page here): the managed
# collector's hourly charge; its per-sample charge is not counted.
AMP_COLLECTOR_PER_HOUR = 0.04
# UNVERIFIED as above: Container Insights with enhanced observability is billed per observation,
# tiered; this is an assumed first-tier price. Observations: about 30 a minute per node and per pod
# and 12 per container (the agent's metric declarations), GPU and EFA extra.
CONTAINER_INSIGHTS_PER_1M_OBSERVATIONS = 0.21
# CloudWatch pricing, us-east-1: logs ingested, a standard alarm (a Metrics Insights query alarm
# may cost more), a composite alarm, a dashboard beyond an account's first three.
LOGS_PER_GB = 0.50
ALARM_PER_MONTH = 0.10
COMPOSITE_ALARM_PER_MONTH = 0.50
DASHBOARD_PER_MONTH = 3.00
# Container logs Fluent Bit ships: the containers' stdout and stderr only. Ray, vLLM and NIXL
# (NIXL_LOG_LEVEL=INFO) write their logs to files under the pod's /tmp/ray, which are not shipped;
# the pd rehearsal wrote 0.74 MB of them in 166 s, start-up included. Assumed: 2 GB a month.
CONTAINER_LOGS_GB_PER_MONTH = 2.0
OBSERVED_PODS_PER_NODE = 10  # system pods, device plugins, the add-on's, Ray's: about


def scraped_ray_pods(s: Settings) -> dict[str, int]:
    """The RayService's pods at its starting size, by kind: the head, the ingress group's pods (on the
    system nodes) and one pod per engine replica of each side."""
    return {
        "head": 1,
        "ingress": ingress_replicas(),
        "engine": sum(s.side_replicas(side) for side in sizing.SIDES),
    }


def ray_series(s: Settings) -> int:
    pods = scraped_ray_pods(s)
    return (
        RAY_SERIES_HEAD * pods["head"]
        + RAY_SERIES_PER_INGRESS_POD * pods["ingress"]
        + RAY_SERIES_PER_ENGINE_POD * pods["engine"]
    )


def observability_monthly_cost(s: Settings) -> list[CostLine]:
    """What observability adds per month (as CostLine per hour, to sit beside hourly_cost), or nothing when off."""
    if not s.observability:
        return []
    seconds = HOURS_PER_MONTH * 3600
    samples = ray_series(s) * seconds / s.observability_scrape_interval_seconds
    nodes = s.system_nodes_desired + s.gpu_nodes
    observations = (nodes * 30 + nodes * OBSERVED_PODS_PER_NODE * (30 + 12)) * seconds / 60
    # The GCS store's alarm is a metric-math alarm over its two nodes: billed as two metrics.
    alarms = 3 + (2 if s.gcs_fault_tolerance else 0)
    per_month = {
        f"managed Prometheus ingestion ({samples / 1e6:.0f}M samples)": samples / 1e7 * AMP_PER_10M_SAMPLES,
        "managed Prometheus storage": samples * 2 / 2**30 * AMP_STORAGE_PER_GB_MONTH,
        "managed Prometheus collector (price unverified)": AMP_COLLECTOR_PER_HOUR * HOURS_PER_MONTH,
        f"Container Insights ({observations / 1e6:.0f}M observations, price unverified)": (
            observations / 1e6 * CONTAINER_INSIGHTS_PER_1M_OBSERVATIONS
        ),
        f"container logs ({CONTAINER_LOGS_GB_PER_MONTH:g} GB assumed)": CONTAINER_LOGS_GB_PER_MONTH * LOGS_PER_GB,
        f"{alarms} alarms, 1 composite, 1 dashboard": alarms * ALARM_PER_MONTH
        + COMPOSITE_ALARM_PER_MONTH
        + DASHBOARD_PER_MONTH,
    }
    return [CostLine(item, 1, cost / HOURS_PER_MONTH) for item, cost in per_month.items()]


def observability_summary(s: Settings) -> str:
    lines = observability_monthly_cost(s)
    if not lines:
        return "observability off"
    total = sum(line.per_hour or 0.0 for line in lines) * HOURS_PER_MONTH
    interval = s.observability_scrape_interval_seconds
    return f"observability ~${total:.0f}/month ({ray_series(s)} Ray series every {interval} s)"


# --- The KV-transfer plan and whether P/D pays ---------------------------------------
def _gb_per_s(bounds: tuple[float, float]) -> str:
    return f"{bounds[0] / 1e9:g}-{bounds[1] / 1e9:g} GB/s"


def _local_prefill_cost(s: Settings, threshold: int) -> str:
    """What decode pays for a prompt it prefills itself, at the threshold: aggregated's stall, on decode's GPU."""
    p = sizing.transfer_plan(s, threshold)
    return (
        f"; a {threshold}-token prompt prefilled on decode stalls its other streams for {p.aggregated_chunks}x"
        f"{p.aggregated_stall_seconds * 1e3:.0f}ms (agg stall) where split adds {p.efa_seconds * 1e3:.0f}ms to its TTFT"
    )


def plan_table(s: Settings) -> str:
    """The KV-transfer plan and the per-length verdict, for `make plan` and synth (numbers from settings.sizing)."""
    gpu = s.gpu_instance
    per_token = sizing.kv_cache_bytes_per_token(s.model)
    step = sizing.prefill_max_num_batched_tokens(s) or sizing.vllm_default_max_num_batched_tokens(s)
    mfu = sizing.PREFILL_MFU_RANGE
    prefill_tp, decode_tp = s.prefill_tensor_parallel_size, s.decode_tensor_parallel_size
    pods = {side: s.replicas_per_node(side) for side in sizing.SIDES}
    if gpu.efa_interfaces == 1 and set(pods.values()) == {1}:
        network = f"{gpu.network_gbps:g} Gbps EFA"
    else:
        # Summed across the cards each pod holds (the slower pod of the pair decides).
        network = ", ".join(
            f"{side} pod {sizing.pod_efa_gbps(s, side):g} Gbps EFA over {gpu.efa_interfaces // pods[side]} card(s)"
            for side in sizing.SIDES
        )
    streams = sizing.transfer_streams(s)
    nixl = _gb_per_s(sizing.NIXL_IN_VLLM_BYTES_PER_S_RANGE)
    if streams > 1:
        nixl += f" per TP worker, {streams} at once"
    engine = f"one {gpu.gpu_model}" if prefill_tp == 1 else f"{prefill_tp} x {gpu.gpu_model} per prefill replica"
    rows = [
        f"KV cache: {per_token:,} bytes per prompt token ({s.model_id}); {s.gpu_instance_type}: "
        f"{network} (NIXL in vLLM at most {nixl}), "
        f"{engine} at {gpu.gpu_bf16_tflops:g} BF16 TFLOPS x {mfu[0]:.0%}-{mfu[1]:.0%} MFU"
        + (
            "; GPUDirect RDMA: the KV moves GPU to GPU, no staging"
            if gpu.gpudirect_rdma
            else f"; KV staged through pageable host memory at {_gb_per_s(sizing.PAGEABLE_COPY_BYTES_PER_S_RANGE)} "
            "each way (no GPUDirect RDMA)"
        ),
        f"Decode's KV cache: {sizing.kv_cache_tokens(s):,} tokens per "
        + ("GPU" if decode_tp == 1 else f"decode replica ({decode_tp} GPUs)")
        + f"; prefill step {step} tokens "
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
    if s.serving_mode != "aggregated":
        threshold = sizing.local_prefill_threshold(s)
        source = (
            "set"
            if s.local_prefill_max_tokens is not None
            else f"the default: the guidance above, splitting pays only from {sizing.MIN_PROMPT_TOKENS_THAT_PAY} "
            "tokens (SageMaker HyperPod; Mooncake on A10 at 1k)"
            + (f", at most max_model_len {s.max_model_len}" if threshold < sizing.MIN_PROMPT_TOKENS_THAT_PAY else "")
        )
        rows.append(
            f"Which requests are split (local_prefill_max_tokens = {threshold}, {source}): "
            + (
                f"prompts of at most {threshold} tokens prefill on decode, longer ones go through prefill"
                if threshold
                else "every one"
            )
            + (
                "; no prompt can be longer, so none is split: serving_mode aggregated does the same on the same nodes"
                if threshold >= s.max_model_len
                else ""
            )
            + (_local_prefill_cost(s, threshold) if threshold else "")
            + ' (docs/architecture.md, "Which requests are split")'
        )
    start = sizing.cold_start(s)
    source = s.model_source or s.model_id
    rows.append(
        f"Cold start ({start.weights_bytes / 1e9:.1f} GB of weights from {source}): first download "
        f">= {start.first_download_seconds:.0f} s at {sizing.download_gbps(s):g} Gbps; after a pod restart "
        f"{start.restart_seconds:.0f} s"
        + (
            f" (re-read from the NVMe cache at {sizing.NVME_READ_BYTES_PER_S / 1e9:g} GB/s)"
            if start.nvme_reload_seconds is not None and start.restart_seconds == start.nvme_reload_seconds
            else " (downloaded again)"
        )
        + "; engine start and GPU load extra"
    )
    rows.append(
        'Calibrated on public numbers (docs/architecture.md, "Should I disaggregate?"): pageable copies '
        "5-10 GB/s, NIXL 4-5 GB/s inside vLLM, Mooncake on A10, SageMaker HyperPod's 4k-prompt/70B guidance; "
        "prefill MFU 30-50% is assumed. "
        "A verdict that differs between the ends of these ranges is printed as inconclusive. Measure yours: "
        "python -m tools.bench compare <disaggregated results> <aggregated results>"
    )
    return "\n".join(rows)


# --- The cost of a burst: one more replica on a new GPU node (numbers from settings.sizing) --------
def _seconds(low: float, high: float, floor: bool) -> str:
    if floor:
        return f">= {low:.0f} s"
    return f"{low:.0f} s" if low == high else f"{low:.0f}-{high:.0f} s"


def _budget_rows(s: Settings, case: str) -> list[str]:
    terms = sizing.scale_up_budget(s, case)
    width = max(len(t.what) for t in terms)
    rows = [f"  {t.what:<{width}}  {_seconds(t.low_seconds, t.high_seconds, t.floor):>11}  {t.source}" for t in terms]
    low, high = sizing.scale_up_seconds(s, case)
    floors = any(t.floor for t in terms)
    total = f"{low / 60:.1f}-{high / 60:.1f} min" + (" (a floor term included: longer if it is)" if floors else "")
    rows.append(f"  {'total':<{width}}  {total}")
    largest = max(terms, key=lambda t: t.high_seconds)
    rows.append(f"  {'largest term':<{width}}  {largest.what}")
    return rows


def scale_up_table(s: Settings) -> str:
    """For `make plan`: the time to add one replica, term by term with its source, on a new GPU node (with
    the parallel pull the stack turns on, and what a standard pull would add) and on a warm node; and
    the hourly cost at the GPU group's minimum and maximum, warm nodes included."""
    rows = [f"One more replica on a new GPU node ({s.gpu_instance_type}), term by term:"]
    rows += _budget_rows(s, sizing.COLD)
    floor_low, floor_high = sizing.seconds_before_any_pull(s)
    rows.append(
        f"  before any pull: {floor_low / 60:.1f}-{floor_high / 60:.1f} min (Serve, the autoscalers, the launch), "
        "which no measure on the image or the weights shortens; only a warm node skips it"
    )
    standard_low, standard_high = sizing.scale_up_seconds(s, sizing.COLD_STANDARD_PULL)
    (standard,) = [t for t in sizing.scale_up_budget(s, sizing.COLD_STANDARD_PULL) if t.what.startswith("image pull")]
    rows.append(
        f"  with a standard image pull ({standard.low_seconds:.0f}-{standard.high_seconds:.0f} s): "
        f"{standard_low / 60:.1f}-{standard_high / 60:.1f} min ({standard.source})"
    )
    node_price = INSTANCE_PRICES_PER_HOUR.get(s.gpu_instance_type)
    each = f"; each GPU node ${node_price:.2f}/h" if node_price is not None else ""
    warm = f"gpu_warm_nodes={s.gpu_warm_nodes}" + (f", ${node_price:.2f}/h each" if node_price is not None else "")
    rows.append(f"On a warm node ({warm}), term by term:")
    rows += _budget_rows(s, sizing.WARM)
    rows.append('  (docs/operations.md, "The cost of a burst": what each term depends on)')
    low_nodes, high_nodes = sizing.gpu_node_bounds(s)
    low_cost, high_cost = hourly_cost_range(s)
    warm_nodes = f", {s.gpu_warm_nodes} of them warm" if s.gpu_warm_nodes else ""
    rows.append(
        f"Hourly cost: ~${low_cost:.2f} at the minimum ({low_nodes} GPU nodes{warm_nodes}), ~${high_cost:.2f} at the "
        f"maximum ({high_nodes} GPU nodes){each} (on demand, {PRICE_REGION} prices of {PRICE_DATE})"
    )
    return "\n".join(rows)
