"""The cost and KV-transfer estimates, against hand calculations."""

from __future__ import annotations

from typing import Any

import pytest

from settings import Settings
from settings.estimates import PRICE_DATE, cost_summary, hourly_cost, plan_table, transfer_plan


def test_kv_transfer_plan_matches_hand_calculation_for_default() -> None:
    # Qwen3-8B: 2 (K,V) x 36 layers x 8 KV heads x 128 dims x 2 bytes = 147,456 B per token.
    # 8192 tokens: 1,207,959,552 B. EFA 25 Gbps = 3.125e9 B/s -> 0.38655 s, plus two PCIe
    # copies at 25e9 B/s -> 0.09664 s: 0.48318 s. One TCP flow at 10 Gbps: 0.96637 + 0.09664 s.
    # Prefill: 2 x 8.19e9 x 8192 FLOPs / (121e12 x 0.40) = 2.77243 s.
    plan = transfer_plan(Settings(), 8192)
    assert plan.kv_bytes == 1_207_959_552
    assert plan.efa_seconds == pytest.approx(0.48318, rel=0.05)
    assert plan.tcp_seconds == pytest.approx(1.06301, rel=0.05)
    assert plan.prefill_seconds == pytest.approx(2.77243, rel=0.05)
    assert plan.fits_budget


def test_slow_network_relative_to_prefill_is_flagged() -> None:
    # An 8B model on an H100 prefills 8x faster than on an L4, over the same 25 Gbps.
    fast_gpu = Settings(gpu_instance_type="p5.48xlarge")
    plan = transfer_plan(fast_gpu, 8192)
    assert plan.prefill_seconds < transfer_plan(Settings(), 8192).prefill_seconds / 5
    table = plan_table(Settings(gpu_instance_type="g6e.8xlarge", model_id="Qwen/Qwen3-4B"))
    assert "disaggregation may not pay" in table


def test_cost_matches_hand_calculation() -> None:
    # 2 x 2.0144 + 2 x 0.2016 + 2 NAT x 0.045 + 0.10 EKS + (2 x 100 + 2 x 300) GB x 0.08 / 730 = 4.7097 $/h
    total = sum(line.per_hour or 0 for line in hourly_cost(Settings()))
    assert total == pytest.approx(4.7097, abs=0.001)
    assert cost_summary(Settings()).startswith("~$4.71/h")
    assert PRICE_DATE in cost_summary(Settings())


def test_cost_names_what_it_cannot_price() -> None:
    assert "no price for p5.48xlarge" in cost_summary(Settings(gpu_instance_type="p5.48xlarge"))


def test_cost_is_a_stack_output(template: dict[str, Any]) -> None:
    assert template["Outputs"]["EstimatedCostPerHour"]["Value"].startswith("~$4.71/h")
