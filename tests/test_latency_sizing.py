"""Latency targets in sizing and `make plan`: one replica's floors, the replicas and cost a request rate needs,
checked by hand for the defaults (Qwen3-8B on g6.8xlarge's one L4) with both sides ranged and targeted.

Inputs, from the catalog and settings/sizing/ (each asserted below, so a change there is named here):
- Qwen3-8B: 8.19e9 parameters in BF16, so 16.38e9 bytes of weights; KV 2 x 36 layers x 8 heads x 128 x 2 B
  = 147,456 bytes per token.
- L4: 121 dense BF16 TFLOPS, 300 GB/s (catalog.GPU_MEMORY_BYTES_PER_S); PREFILL_MFU_RANGE 30-50%, midpoint 40%.
- Decode's KV cache 26,921 tokens; max_ongoing_requests(decode) = 26,921 // 2,048 = 13;
  local_prefill_max_tokens (default) 4,096.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest

from ray_pods import latency_stats
from settings import catalog, sizing
from settings.estimates import HOURS_PER_MONTH, INSTANCE_PRICES_PER_HOUR, hourly_cost, priced_per_hour
from settings.model import Settings
from tests.conftest import ROOT, require_serve_deps
from tools import plan

TARGETS: dict[str, Any] = {
    "prefill_max_replicas": 4,
    "decode_max_replicas": 6,
    "prefill_ttft_target_ms": 5000,
    "decode_itl_target_ms": 100,
}
Z90 = 1.2815515655446004  # the standard normal's 90th percentile


def _targeted(**changes: Any) -> Settings:
    return replace(Settings(), **{**TARGETS, **changes})


def test_the_inputs_the_hand_arithmetic_uses() -> None:
    s = _targeted()
    assert (s.model.parameters_billion, s.model.dtype_bytes) == (8.19, 2)
    assert sizing.kv_cache_bytes_per_token(s.model) == 147_456
    assert (s.gpu_instance.gpu_bf16_tflops, catalog.GPU_MEMORY_BYTES_PER_S["L4"]) == (121.0, 300e9)
    assert sizing.PREFILL_MFU_RANGE == (0.30, 0.50)
    assert sizing.kv_cache_tokens(s) == 26_921
    assert sizing.max_ongoing_requests(s, "decode") == 13
    assert sizing.local_prefill_threshold(s) == 4096


def test_the_floors_by_hand() -> None:
    s = _targeted()
    # Prefill is sent prompts past the 4,096-token threshold only: 4,097 tokens at 50% MFU.
    # 2 x 8.19e9 x 4,097 / (121e12 x 0.5) = 6.7108860e13 / 6.05e13 = 1.109237 s
    assert sizing.prefill_floor_prompt_tokens(s) == 4097
    assert sizing.prefill_ttft_floor_ms(s) == pytest.approx(1109.237, abs=1e-3)
    # Decode at 13 sequences of 2,048 tokens: (16.38e9 + 13 x 2,048 x 147,456) / 300e9
    # = (16.38e9 + 3,925,868,544) / 300e9 = 0.0676862 s
    assert sizing.decode_itl_floor_ms(s) == pytest.approx(67.6862, abs=1e-4)


def test_the_replicas_and_cost_by_hand() -> None:
    """1 request/s of 7,680 prompt + 256 output tokens (8,192 in all, max_model_len): split (past the threshold),
    so prefill serves it."""
    s = _targeted()
    sized = sizing.replicas_for_latency_targets(s, 1.0, 7680, 256)
    prefill, decode = sized.sides

    # Prefill: S = 2 x 8.19e9 x 7,680 / (121e12 x 0.4) = 1.257984e14 / 4.84e13 = 2.599140 s; slack
    # (5 - S) / S = 0.923713. rho x exp(-2 (1 - rho) 0.923713) at 0.3390 is 0.099968 (<= 0.1), at 0.3391 0.100016:
    # rho_max is between, so a replica takes about 0.339 / 2.59914 = 0.1304 requests/s, and 1 request/s needs
    # ceil(2.59914 / 0.3391 = 7.665) = 8 replicas (7.667 at 0.3390: still 8).
    service = 2 * 8.19e9 * 7680 / (121e12 * 0.4)
    assert service == pytest.approx(2.599140, abs=1e-6)
    slack = 5 / service - 1
    assert 0.3390 * math.exp(-2 * (1 - 0.3390) * slack) <= 0.1 < 0.3391 * math.exp(-2 * (1 - 0.3391) * slack)
    assert prefill.service_ms == pytest.approx(service * 1e3)
    assert 0.3390 <= prefill.per_replica_rate * service <= 0.3391
    assert prefill.replicas == 8

    # Decode: context 7,680 + 256 / 2 = 7,808; weights 16.38e9 / 300e9 = 0.0546 s a step; each sequence's KV
    # 7,808 x 147,456 / 300e9 = 0.00383779 s; the split request's host-to-GPU copy 7,680 x 147,456 / 7.5e9 =
    # 0.1509949 s over 256 tokens = 0.00058982 s. So gap(n) = 0.0546 + n x 0.0044276; the target allows
    # (0.1 - 0.0546) / 0.0044276 = 10.25 -> 10, the KV cache 26,921 // 7,936 = 3, the admission bound 13: n_max 3.
    # N + 1.28155 sqrt(N) = 3: sqrt(N) = (-1.28155 + sqrt(1.64237 + 12)) / 2 = 1.2060035, N = 1.454444.
    # gap(N) = 0.0546 + 1.454444 x 0.0044276 = 0.0610397 s; a replica takes 1.454444 / (256 x 0.0610397)
    # = 0.093077 requests/s; 1 request/s needs ceil(10.744) = 11.
    per_sequence = 7808 * 147_456 / 300e9 + 7680 * 147_456 / 7.5e9 / 256
    assert per_sequence == pytest.approx(0.0044276, abs=1e-7)
    mean = ((-Z90 + math.sqrt(Z90**2 + 4 * 3)) / 2) ** 2
    assert mean == pytest.approx(1.454444, abs=1e-6)
    gap = 0.0546 + mean * per_sequence
    assert decode.service_ms == pytest.approx(gap * 1e3) == pytest.approx(61.040, abs=1e-3)
    assert decode.per_replica_rate == pytest.approx(mean / (256 * gap)) == pytest.approx(0.093077, abs=1e-6)
    assert decode.replicas == 11
    assert "(the KV cache at 7936 tokens)" in decode.why

    # Cost: 8 + 11 one-GPU nodes, 19 in all; beyond the minimum's 2, each of the 17 adds its price and its root
    # volume: 17 x (2.0144 + 50 GB x 0.08 / 730) = 17 x 2.019879 = 34.33795 $/h.
    assert sized.replicas == {"prefill": 8, "decode": 11}
    assert sized.gpu_nodes == 19
    assert (INSTANCE_PRICES_PER_HOUR["g6.8xlarge"], s.gpu_root_volume_gib) == (2.0144, 50)
    minimum = sum(line.per_hour or 0.0 for line in hourly_cost(s, 2))
    cost = priced_per_hour(s, sized.gpu_nodes)
    assert cost == pytest.approx(minimum + 17 * (2.0144 + 50 * 0.08 / HOURS_PER_MONTH))
    assert cost - minimum == pytest.approx(34.33795, abs=1e-4)


def test_a_short_prompt_sends_prefill_nothing_and_stalls_decode_by_hand() -> None:
    """2,048 + 128 tokens: decode prefills it (under the 4,096 threshold), and every stream waits for that."""
    s = _targeted()
    prefill, decode = sizing.replicas_for_latency_targets(s, 2.0, 2048, 128).sides
    assert prefill.replicas == 0 and "prefilled on decode" in prefill.why
    # Local prefill 2 x 8.19e9 x 2,048 / 4.84e13 = 0.693104 s over 128 tokens = 0.0054149; KV step at context
    # 2,112: 2,112 x 147,456 / 300e9 = 0.0010381. gap(n) = 0.0546 + n x 0.0064530; (0.1 - 0.0546) / 0.006453
    # = 7.04 -> 7 (the cache holds 26,921 // 2,176 = 12, the bound 13): n_max 7 from the target.
    per_sequence = 2 * 8.19e9 * 2048 / 4.84e13 / 128 + 2112 * 147_456 / 300e9
    assert per_sequence == pytest.approx(0.0064530, abs=1e-7)
    mean = ((-Z90 + math.sqrt(Z90**2 + 4 * 7)) / 2) ** 2
    gap = 0.0546 + mean * per_sequence
    assert decode.per_replica_rate == pytest.approx(mean / (128 * gap))
    assert decode.replicas == math.ceil(2.0 / (mean / (128 * gap))) == 5
    assert "(the target)" in decode.why


def test_no_replica_count_meets_a_target_below_one_request_alone() -> None:
    s = _targeted()
    prefill, decode = sizing.replicas_for_latency_targets(
        _targeted(prefill_ttft_target_ms=2000, decode_itl_target_ms=58),
        1.0,
        7680,
        256,
    ).sides
    assert prefill.replicas is None and "2599 ms" in prefill.why
    # 0.0546 + 0.0044276 = 59.0 ms for one sequence alone.
    assert decode.replicas is None and "59 ms" in decode.why
    assert s.side_max_replicas("decode") == 6


def test_the_floors_move_the_way_they_must() -> None:
    base = Settings()
    # Longer prompts prefill longer; a higher threshold sends prefill only longer prompts.
    floors = [
        sizing.prefill_ttft_floor_ms(Settings(typical_request_tokens=n, local_prefill_max_tokens=0))
        for n in (512, 1024, 2048, 4096, 8192)
    ]
    assert floors == sorted(floors) and len(set(floors)) == len(floors)
    by_threshold = [sizing.prefill_ttft_floor_ms(Settings(local_prefill_max_tokens=t)) for t in (0, 2048, 4096, 6000)]
    assert by_threshold == sorted(by_threshold)
    # A faster GPU (L40S: 362 TFLOPS, 864 GB/s) lowers both; a bigger model raises both.
    faster = Settings(gpu_instance_type="g6e.8xlarge")
    assert sizing.prefill_ttft_floor_ms(faster) < sizing.prefill_ttft_floor_ms(base)
    assert sizing.decode_itl_floor_ms(faster) < sizing.decode_itl_floor_ms(base)
    # A step with more sequences reads more KV.
    steps = [sizing.latency.decode_step_seconds(base, n, 2048) for n in range(0, 14)]
    assert steps == sorted(steps) and len(set(steps)) == len(steps)


def test_replicas_rise_with_the_rate_and_fall_as_a_target_loosens() -> None:
    s = _targeted()

    def replicas(settings: Settings, rate: float) -> tuple[int, ...]:
        sides = sizing.replicas_for_latency_targets(settings, rate, 7680, 256).sides
        assert all(side.replicas is not None for side in sides)
        return tuple(side.replicas or 0 for side in sides)

    by_rate = [replicas(s, rate) for rate in (0.1, 0.5, 1, 2, 4)]
    assert by_rate == sorted(by_rate) and by_rate[0] < by_rate[-1]
    looser = _targeted(prefill_ttft_target_ms=8000, decode_itl_target_ms=300)
    assert all(a <= b for a, b in zip(replicas(looser, 1.0), replicas(s, 1.0), strict=True))


def test_plan_prints_nothing_new_without_a_target(capsys: pytest.CaptureFixture[str]) -> None:
    assert plan.main([]) == 0
    assert "Latency targets" not in capsys.readouterr().out


def test_plan_prints_the_floors_replicas_cost_and_breach_time(capsys: pytest.CaptureFixture[str]) -> None:
    args = [arg for key, value in TARGETS.items() for arg in ("-c", f"{key}={value}")]
    assert plan.main([*args, "--rate", "1", "--prompt-tokens", "7680", "--output-tokens", "256"]) == 0
    out = capsys.readouterr().out
    section = out.split("Latency targets at 1 requests/s of 7680 prompt + 256 output tokens", 1)[1].splitlines()
    prefill, decode, runs, breach = section[1:5]
    # Rounded up, as the settings refuse below them: 1,109.24 ms and 67.69 ms (test_the_floors_by_hand).
    assert prefill.startswith("  prefill: p90 TTFT at the prefill replica <= 5000 ms, floor 1110 ms")
    assert "8 replicas (0.13 requests/s each" in prefill and "above prefill_max_replicas = 4: raise it" in prefill
    assert decode.startswith("  decode: p90 ITL <= 100 ms, floor 68 ms (one step at 13 sequences)")
    assert "11 replicas (0.0931 requests/s each" in decode and "mean ITL 61 ms at that load" in decode
    minimum = sum(line.per_hour or 0.0 for line in hourly_cost(_targeted(), 2))
    assert f"runs prefill 8, decode 11 replicas on 19 GPU nodes: ~${minimum + 34.33795:.2f}/h" in runs
    low, high = sizing.scale_up_seconds(_targeted(), sizing.COLD)
    assert f"{low / 60:.1f}-{high / 60:.1f} min on a new GPU node (the scale-up budget above)" in breach
    with pytest.raises(SystemExit) as stopped:
        plan.main([*args, "--prompt-tokens", "7680", "--output-tokens", "256", "--rate", "0"])
    assert stopped.value.code == 2
    with pytest.raises(SystemExit) as stopped:
        plan.main([*args, "--prompt-tokens", "8000", "--output-tokens", "256"])
    assert stopped.value.code == 2


def _section(page: str, heading: str) -> str:
    return page.split(f"\n{heading}\n", 1)[1].split("\n## ", 1)[0]


def test_the_operations_page_quotes_the_floors_and_the_report_window_as_sizing() -> None:
    """docs/operations.md, "Scaling to a latency target": its figures are the functions' on the defaults."""
    text = " ".join(_section((ROOT / "docs" / "operations.md").read_text(), "## Scaling to a latency target").split())
    s = Settings()
    # Rounded up, as plan prints them and the settings refuse below them.
    tokens = sizing.prefill_floor_prompt_tokens(s)
    prefill = f"{math.ceil(sizing.prefill_ttft_floor_ms(s)):,} ms for prefill (a {tokens:,}-token"
    sequences = sizing.max_ongoing_requests(s, "decode")
    decode = f"{math.ceil(sizing.decode_itl_floor_ms(s))} ms for decode ({sequences} sequences)"
    assert prefill in text and decode in text
    assert f"requests finished in its last {latency_stats.WINDOW_S:.0f} s" in text
    assert 'make plan PLAN_ARGS="--rate 2 --prompt-tokens 7680 --output-tokens 256"' in text
    # The page's command: make hands PLAN_ARGS to plan, and plan takes them.
    assert "$(BIN)/python -m tools.plan $(SETTINGS_ARGS) $(PLAN_ARGS)" in (ROOT / "Makefile").read_text()
    assert plan.main(["--rate", "2", "--prompt-tokens", "7680", "--output-tokens", "256"]) == 0


def test_the_operations_page_quotes_the_policys_kv_bound() -> None:
    require_serve_deps()
    from ray_pods import latency_autoscaling  # imports Ray: only with the serving stack installed

    text = " ".join(_section((ROOT / "docs" / "operations.md").read_text(), "## Scaling to a latency target").split())
    assert f"its KV cache is {latency_autoscaling.KV_FULL:.0%} used" in text
    assert latency_autoscaling.UNDER_SHARE == 0.5 and "one less when it is under half of it" in text
