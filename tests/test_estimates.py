"""The cost and KV-transfer estimates, against hand calculations."""

from __future__ import annotations

import dataclasses
import gzip
from pathlib import Path
from typing import Any

import pytest

from settings import Settings, catalog, sizing
from settings.estimates import (
    PRICE_DATE,
    cost_summary,
    hourly_cost,
    hourly_cost_range,
    plan_table,
    ray_series,
    scale_up_table,
)
from settings.loading import settings_from
from tests.conftest import PROJECT_CONTEXT, rayservice_from, synth


def test_plan_matches_a_hand_calculation_for_the_defaults() -> None:
    """Worked by hand, not with the module's formulas (Qwen3-8B on one L4 of a g6.8xlarge, 8192-token prompt).

    KV per token: 2 (K, V) x 36 layers x 8 KV heads x 128 dims x 2 bytes = 147,456 B; x 8192 = 1,207,959,552 B.
    Staging, pageable copies at 7.5e9 B/s: GPU->host on prefill 0.16106 s + host->GPU on decode 0.16106 s = 0.32212 s.
    EFA: 25 Gbps = 3.125e9 B/s (under NIXL's 4.5e9 in-vLLM ceiling): 0.38655 s. One TCP flow, 10 Gbps: 0.96637 s.
    Prefill: 2 x 8.19e9 x 8192 = 1.34185e14 FLOPs at 121e12 x 0.40 = 4.84e13 FLOP/s: 2.77243 s.
    Overhead share: (0.32212 + 0.38655) / 2.77243 = 0.2556 of the prefill, at the midpoints of the ranges.
    Decode's KV cache: 22.5 GiB x 0.90 = 20.25 GiB; weights 16.38e9 B = 15.2550 GiB; decode's 2048-token step
    sets aside 0.4 GiB non-torch + 0.52 GiB CUDA graphs + its sampler's 2048 x 4096 x 2 B + 256 x 151,936 x 10 B
    = 0.3779 GiB; KV left 3.6972 GiB = 3.9698e9 B / 147,456 = 26,922 tokens; (8192 + 128) tokens per sequence
    -> 3 sequences at once; (1024 + 128) -> 23.
    Prefill step: the whole 8192-token prompt in one step (1 chunk); aggregated engines keep vLLM's 2048 -> 4 chunks,
    each stalling the GPU's decodes 2 x 8.19e9 x 2048 / 4.84e13 = 0.69311 s.
    """
    plan = sizing.transfer_plan(Settings(), 8192)
    assert plan.kv_bytes == 1_207_959_552
    assert plan.staging_seconds == pytest.approx(0.32212, rel=0.05)
    assert plan.efa_wire_seconds == pytest.approx(0.38655, rel=0.05)
    assert plan.tcp_wire_seconds == pytest.approx(0.96637, rel=0.05)
    assert plan.prefill_seconds == pytest.approx(2.77243, rel=0.05)
    assert plan.efa_share == pytest.approx(0.2556, rel=0.05)
    assert plan.decode_sequences == 3 and sizing.transfer_plan(Settings(), 1024).decode_sequences == 23
    assert sizing.kv_cache_tokens(Settings()) == pytest.approx(26_922, abs=2)
    assert plan.prefill_chunks == 1
    aggregated = sizing.transfer_plan(Settings(serving_mode="aggregated"), 8192)
    assert aggregated.prefill_chunks == 4
    assert aggregated.aggregated_stall_seconds == pytest.approx(0.69311, rel=0.05)
    assert sizing.disaggregation_verdict(Settings(), 8192)[0] == "maybe"


def test_the_verdict_follows_the_public_guidance() -> None:
    # Short prompts: aggregated with chunked prefill wins (Mooncake at 1k, HyperPod), at either end of the ranges.
    assert sizing.disaggregation_verdict(Settings(), 1024)[0] == "no"
    # A long prompt with a transfer well under the prefill: "maybe" for an 8B model, "likely" for 70B.
    assert sizing.disaggregation_verdict(Settings(), 8192)[0] == "maybe"
    big = dataclasses.replace(catalog.MODELS["Qwen/Qwen3-8B"], parameters_billion=70.0)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(catalog, "MODELS", {**catalog.MODELS, "Qwen/Qwen3-8B": big})
        assert sizing.disaggregation_verdict(Settings(), 8192)[0] == "likely"
    # GPUDirect RDMA (p5): no staging, and decode no longer stalls for a host-to-GPU copy.
    p5 = sizing.transfer_plan(Settings(gpu_instance_type="p5.48xlarge"), 8192)
    assert p5.staging_seconds == 0 and p5.decode_copy_stall_seconds == 0


def test_cold_start_matches_a_hand_calculation() -> None:
    """Qwen3-8B: 8.19e9 x 2 bytes = 16.38e9 B. g6.8xlarge: 25 Gbps = 3.125e9 B/s -> 5.2416 s at the floor.

    Its 900 GB of NVMe at the assumed 2e9 B/s: 8.19 s to read back. An s3:// source: Ray downloads it again, 5.2416 s.
    """
    start = sizing.cold_start(Settings())
    assert start.weights_bytes == pytest.approx(16.38e9, rel=0.05)
    assert start.first_download_seconds == pytest.approx(5.2416, rel=0.05)
    assert start.nvme_reload_seconds == pytest.approx(8.19, rel=0.05)
    assert start.restart_seconds == pytest.approx(8.19, rel=0.05)
    s3 = sizing.cold_start(Settings(model_source="s3://acme-models/approved/qwen3-8b"))
    assert s3.restart_seconds == pytest.approx(5.2416, rel=0.05)


def test_the_plan_table_says_why() -> None:
    table = plan_table(Settings())
    assert "8192: maybe: only under concurrent load, for inter-token latency: split adds 709 ms to TTFT" in table
    assert "Calibrated on public numbers" in table and "tools.bench compare" in table


def test_cost_matches_hand_calculation() -> None:
    # 2 x 2.0144 + 2 x 0.2016 + 2 NAT x 0.045 + 0.10 EKS + (2 x 100 + 2 x 50) GB x 0.08 / 730
    # + 2 GCS store nodes x 0.0128 = 4.6805 $/h
    total = sum(line.per_hour or 0 for line in hourly_cost(Settings()))
    assert total == pytest.approx(4.6805, abs=0.001)
    assert cost_summary(Settings()).startswith("~$4.68/h")
    without_store = sum(line.per_hour or 0 for line in hourly_cost(Settings(gcs_fault_tolerance=False)))
    assert without_store == pytest.approx(4.6549, abs=0.001)
    assert PRICE_DATE in cost_summary(Settings())


def test_cost_names_what_it_cannot_price() -> None:
    assert "no price for g5.8xlarge" in cost_summary(Settings(gpu_instance_type="g5.8xlarge"))


def test_cost_is_a_stack_output(template: dict[str, Any]) -> None:
    assert template["Outputs"]["EstimatedCostPerHour"]["Value"].startswith("~$4.68/h")


# --- The verdict across the calibrated ranges, and both sides of the trade ----------------------------------
def test_the_transfer_share_is_computed_at_both_ends_of_the_calibrated_ranges() -> None:
    """Qwen3-8B on g6.8xlarge, 8192 tokens (KV 1,207,959,552 B; EFA 3.125e9 B/s, under NIXL's 4-5e9 in vLLM).

    Best case for P/D: pageable copies at 10e9 B/s (0.24159 s both ways), prefill at 30% MFU
    (1.34185e14 / 3.63e13 = 3.69655 s): (0.24159 + 0.38655) / 3.69655 = 0.16993.
    Worst case: copies at 5e9 B/s (0.48318 s), prefill at 50% MFU (2.21794 s): (0.48318 + 0.38655) / 2.21794 = 0.39213.
    """
    low, high = sizing.transfer_share_range(Settings(), 8192)
    assert low == pytest.approx(0.16993, rel=1e-3)
    assert high == pytest.approx(0.39213, rel=1e-3)


def test_where_the_verdict_flips_inside_the_ranges_it_says_inconclusive() -> None:
    """g6e.8xlarge (L40S, 362 TFLOPS), 8192 tokens: moving the KV costs 50.8% of the prefill at one end of the ranges.

    (0.24159 + 0.38655) / (1.34185e14 / 1.086e14 = 1.23559 s) = 0.50837, and 117.3% at the other:
    (0.48318 + 0.38655) / 0.74135 = 1.17316, where decode would recompute the prompt faster than receive it.
    """
    l40s = Settings(gpu_instance_type="g6e.8xlarge")
    verdict, why = sizing.disaggregation_verdict(l40s, 8192)
    assert verdict == "inconclusive"
    assert "51%-117%" in why
    # Outside the ranges' reach the verdict is firm: an L40S's 1024-token prompt is short either way.
    assert sizing.disaggregation_verdict(l40s, 1024)[0] == "no"


def test_the_verdict_shows_what_pd_buys_and_rests_on_no_unsourced_budget() -> None:
    """Defaults, 8192 tokens: aggregated, the prompt prefills in 4 chunks of 2048 tokens, each stalling every
    co-running decode 2 x 8.19e9 x 2048 / 4.84e13 = 0.69311 s; split, decode stalls once for its host-to-GPU copy of
    the KV, 1,207,959,552 / 7.5e9 = 0.16106 s. The transfer costs 25.6% of the prefill at the midpoints (17%-39% over
    the ranges): once no budget stands in, the verdict is the public guidance's, "maybe" for an 8B model.
    """
    plan = sizing.transfer_plan(Settings(), 8192)
    assert plan.aggregated_chunks == 4
    assert plan.aggregated_stall_seconds == pytest.approx(0.69311, rel=1e-3)
    assert plan.decode_copy_stall_seconds == pytest.approx(0.16106, rel=1e-3)
    verdict, why = sizing.disaggregation_verdict(Settings(), 8192)
    assert verdict == "maybe"
    assert "4 steps of 693 ms" in why and "161 ms" in why and "17%-39%" in why
    table = plan_table(Settings())
    assert "4x693ms" in table and "17-39%" in table
    assert "budget" not in table


# --- the cost range and the scale-up budget -----------------------------------------------
def _range() -> Settings:
    return Settings(decode_max_replicas=3, decode_target_ongoing_requests=8.0)


def test_cost_gives_a_range_from_the_minimum_to_the_maximum() -> None:
    """Decode 1 -> 3: 2 GPU nodes at the minimum, 4 at the maximum (settings/sizing/root_volume.py gpu_node_bounds).

    Minimum: the defaults' 4.6805 $/h. Maximum: 2 more g6.8xlarge (2 x 2.0144) and their 50 GB roots
    (100 GB x 0.08 / 730 = 0.01096): 4.6805 + 4.0288 + 0.01096 = 8.72026 $/h.
    """
    s = _range()
    low, high = hourly_cost_range(s)
    assert low == pytest.approx(4.6805, abs=0.001)
    assert high == pytest.approx(8.7203, abs=0.001)
    assert cost_summary(s).startswith("~$4.68/h at the minimum (2 GPU nodes) to ~$8.72/h at the maximum (4 GPU nodes)")
    # A fixed group keeps the one figure (the stack output and README's block are unchanged).
    assert hourly_cost_range(Settings()) == pytest.approx((4.6805, 4.6805), abs=0.001)
    assert "maximum" not in cost_summary(Settings())


def test_the_stack_output_gives_the_range() -> None:
    value = synth(decode_max_replicas=3, decode_target_ongoing_requests=8)["Outputs"]["EstimatedCostPerHour"]["Value"]
    assert value.startswith("~$4.68/h at the minimum (2 GPU nodes) to ~$8.72/h at the maximum (4 GPU nodes)")


def test_the_scale_up_budget_matches_a_hand_calculation() -> None:
    """One replica on a new g6.8xlarge, seconds: Serve's upscale delay 30; Ray's 5 s loop and Cluster
    Autoscaler's < 30 s, 0-35; launch and join 180-240; the 20 GB image 240-360 by a standard pull, that
    over 2.2 by the parallel pull the stack turns on, 109.09-163.64; the weights, 16.38e9 B at 25 Gbps
    (3.125e9 B/s) = 5.2416, a floor (a new node's NVMe cache is empty); engine start 60-180.
    Parallel: low 30 + 0 + 180 + 109.09 + 5.2416 + 60 = 384.33 s; high 30 + 35 + 240 + 163.64 + 5.2416 + 180 = 653.88 s.
    Standard: low 515.24 s, high 850.24 s. A warm node: 30, Ray's loop 0-5, preemption and start 0-10, the
    weights from the NVMe at 2 GB/s 8.19, engine start 60-180: low 98.19 s, high 233.19 s.
    """
    s = Settings()
    terms = sizing.scale_up_budget(s)
    low, high = sizing.scale_up_seconds(s)
    assert low == pytest.approx(384.33, abs=0.01)
    assert high == pytest.approx(653.88, abs=0.01)
    assert sizing.scale_up_seconds(s, sizing.COLD_STANDARD_PULL) == pytest.approx((515.24, 850.24), abs=0.01)
    assert sizing.scale_up_seconds(s, sizing.WARM) == pytest.approx((98.19, 233.19), abs=0.01)
    # The weights term is the cold start's first download, read from its one home, not recomputed.
    (weights,) = [t for t in terms if t.what.startswith("weights")]
    assert weights.floor and weights.low_seconds == sizing.cold_start(s).first_download_seconds
    (warm_weights,) = [t for t in sizing.scale_up_budget(s, sizing.WARM) if t.what.startswith("weights")]
    assert warm_weights.low_seconds == sizing.cold_start(s).nvme_reload_seconds
    # With the parallel pull the launch dominates; with a standard pull the pull does; on a warm node the engine.
    largest = {
        case: max(sizing.scale_up_budget(s, case), key=lambda t: t.high_seconds).what for case in sizing.SCALE_UP_CASES
    }
    assert largest[sizing.COLD].endswith("launch and node join")
    assert largest[sizing.COLD_STANDARD_PULL].startswith("image pull")
    assert largest[sizing.WARM] == "engine start"
    # Below the launch nothing the image or weights measures do reaches: Serve, the autoscalers, the launch.
    assert sizing.seconds_before_any_pull(s) == (210.0, 305.0)


def test_an_s3_source_is_downloaded_again_on_a_warm_node() -> None:
    """Ray fetches an s3:// source at every engine start: the warm node's cache does not hold it."""
    s = Settings(model_source="s3://acme-models/approved/qwen3-8b")
    (weights,) = [t for t in sizing.scale_up_budget(s, sizing.WARM) if t.what.startswith("weights")]
    assert weights.floor and weights.low_seconds == sizing.cold_start(s).first_download_seconds


@pytest.mark.parametrize("case", sizing.SCALE_UP_CASES)
def test_every_scale_up_term_names_its_source_or_says_measured_or_assumed(case: str) -> None:
    for term in sizing.scale_up_budget(Settings(), case):
        assert term.source, term
        assert term.low_seconds <= term.high_seconds, term
        cited = any(mark in term.source for mark in (".py", "FAQ", "Blog", "measured", "assumed", "cold_start"))
        assert cited, term


def test_the_scale_up_table_prints_every_term_and_the_cost_at_both_ends() -> None:
    table = scale_up_table(_range())
    for case in (sizing.COLD, sizing.WARM):
        for term in sizing.scale_up_budget(_range(), case):
            assert term.what in table and term.source in table
    (standard,) = [t for t in sizing.scale_up_budget(_range(), sizing.COLD_STANDARD_PULL) if "standard" in t.what]
    assert standard.source in table
    assert (
        "total" in table and "6.4-10.9 min" in table and "with a standard image pull (240-360 s): 8.6-14.2 min" in table
    )
    assert "before any pull: 3.5-5.1 min" in table and "1.6-3.9 min" in table
    assert "~$4.68 at the minimum (2 GPU nodes), ~$8.72 at the maximum (4 GPU nodes)" in table


# --- The observability estimate: every Ray pod the collector scrapes ----------------------------------------
SCRAPES = Path(__file__).parent / "data"


def _scraped_series(name: str, prefix: str = "") -> int:
    """Series in a recorded scrape of one Ray node (tests/data), optionally only those whose name starts so."""
    with gzip.open(SCRAPES / f"observability_scrape_{name}.prom.gz", "rt") as f:
        return sum(1 for line in f if line.strip() and not line.startswith("#") and line.startswith(prefix))


@pytest.mark.parametrize(
    "overrides", [{}, {"prefill_replicas": "2", "decode_replicas": "3"}], ids=["defaults", "more replicas"]
)
def test_the_observability_estimate_counts_every_ray_pod_the_rayservice_runs(overrides: dict[str, str]) -> None:
    """Every pod of the synthesized RayService is a Ray node the collector scrapes on 8080, the ingress
    group's on the system nodes too. Per pod, from the pd rehearsal's recorded scrapes: an engine pod
    exports what the decode node did; the ingress pod, a Ray node without an engine, that less vLLM's
    `ray_vllm_*` series; the head, what the other node (head, ingress replica and a prefill worker in
    one Ray node there) exported beyond a worker."""

    config = rayservice_from(synth(**overrides))["spec"]["rayClusterConfig"]
    pods = {"headgroup": 1, **{g["groupName"]: g["replicas"] for g in config["workerGroupSpecs"]}}
    assert pods.get("ingress", 0) >= 1
    engine_pod = _scraped_series("decode")
    per_pod = {
        "headgroup": _scraped_series("prefill") - engine_pod,
        "prefill": engine_pod,
        "decode": engine_pod,
        "ingress": engine_pod - _scraped_series("decode", "ray_vllm_"),
    }
    expected = sum(per_pod[group] * count for group, count in pods.items())
    assert ray_series(settings_from({**PROJECT_CONTEXT, **overrides})) == expected
