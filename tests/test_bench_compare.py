"""bench compare's verdict on crafted request sets on both sides of the line: noise, margin, counts."""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from tools import bench, bench_compare, bench_results

GOOD_TTFT, SLOW_TTFT = 0.5, 3.0  # against the default 2 s SLO
TOKENS = 16


def _folder(
    folder: Path,
    mode: str,
    points: dict[tuple[int, int], Sequence[float]],
    duration: float = 10.0,
    local_prefill_max_tokens: int = 0,
) -> Path:
    """A bench result folder whose points hold these per-request TTFTs (s), each 16 tokens at 40 ms."""
    folder.mkdir(parents=True)
    metadata = {"serving_mode": mode, "local_prefill_max_tokens": local_prefill_max_tokens}
    (folder / "metadata.json").write_text(json.dumps(metadata))
    rows = []
    for (n, c), ttfts in points.items():
        result = {
            "duration": duration,
            "completed": len(ttfts),
            "ttfts": list(ttfts),
            "itls": [[0.04] * (TOKENS - 1)] * len(ttfts),
            "output_lens": [TOKENS] * len(ttfts),
            "errors": [""] * len(ttfts),
        }
        (folder / f"run-{n}-{c}.json").write_text(json.dumps(result))
        ordered = sorted(ttfts)
        rows.append({
            "input_len": n, "concurrency": c, "completed": len(ttfts),
            "median_ttft_ms": ordered[len(ordered) // 2] * 1e3, "p99_ttft_ms": ordered[-1] * 1e3,
            "median_itl_ms": 0.012, "p99_itl_ms": 60.0, "output_throughput": 100.0,
        })  # fmt: skip
    bench_results.write_csv(rows, folder / "results.csv")
    return folder


def _verdict(tmp_path: Path, capsys: pytest.CaptureFixture[str], a: Path, b: Path, *args: str) -> str:
    assert bench.main(["compare", str(a), str(b), *args]) == 0
    out = capsys.readouterr().out
    (line,) = [line for line in out.splitlines() if line.startswith("verdict: ")]
    assert (a / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return line.removeprefix("verdict: ")


def _mix(good: int, slow: int) -> list[float]:
    return [GOOD_TTFT] * good + [SLOW_TTFT] * slow


# --- noise is not a verdict ---------------------------------------------------
def test_two_noisy_runs_of_the_same_thing_no_longer_give_opposite_verdicts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Four requests a point, 3 of 4 vs 2 of 4 within the SLO, then the other way round: before,
    one run said one side wins and the other the opposite; now both say no difference shown."""
    for run, (ga, gb) in enumerate(((3, 2), (2, 3))):
        a = _folder(tmp_path / f"{run}/pd", "disaggregated", {(128, 1): _mix(ga, 4 - ga)})
        b = _folder(tmp_path / f"{run}/agg", "aggregated", {(128, 1): _mix(gb, 4 - gb)})
        line = _verdict(tmp_path, capsys, a, b)
        assert line == "no difference shown at any load point: 128 tokens x 1 (4 vs 4 requests)"


def test_the_same_proportions_on_enough_requests_are_a_difference(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = _folder(tmp_path / "pd", "disaggregated", {(128, 1): _mix(30, 10)})
    b = _folder(tmp_path / "agg", "aggregated", {(128, 1): _mix(10, 30)})
    assert _verdict(tmp_path, capsys, a, b) == "disaggregated wins at every load point"


def test_a_large_difference_shows_even_on_four_requests(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = _folder(tmp_path / "pd", "disaggregated", {(128, 1): _mix(4, 0), (512, 2): _mix(1, 3)})
    b = _folder(tmp_path / "agg", "aggregated", {(128, 1): _mix(0, 4), (512, 2): _mix(2, 2)})
    line = _verdict(tmp_path, capsys, a, b)
    assert line == "disaggregated wins at 128 tokens x 1; no difference shown at 512 tokens x 2 (4 vs 4 requests)"
    with (a / "compare.csv").open() as handle:
        rows = {(r["input_len"], r["concurrency"]): r for r in csv.DictReader(handle)}
    noisy = rows[("512", "2")]
    assert float(noisy["a_goodput_lo"]) < float(noisy["b_goodput_hi"])  # the overlap, written down
    assert noisy["a_requests"] == "4.0" and noisy["b_requests"] == "4.0"
    assert float(noisy["b_p99_ttft_s_lo"]) <= float(noisy["b_p99_ttft_s_hi"])


def test_too_few_requests_get_no_verdict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = _folder(tmp_path / "pd", "disaggregated", {(128, 1): _mix(3, 0)})
    b = _folder(tmp_path / "agg", "aggregated", {(128, 1): _mix(0, 3)})
    assert _verdict(tmp_path, capsys, a, b) == "too few requests (under 4) at 128 tokens x 1 (3 vs 3 requests)"


def test_where_neither_meets_the_slos_latency_decides_with_its_interval(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = _folder(tmp_path / "pd", "disaggregated", {(128, 1): [3.0] * 20, (512, 1): [3.0, 3.1, 9.0, 3.2]})
    b = _folder(tmp_path / "agg", "aggregated", {(128, 1): [4.0] * 20, (512, 1): [3.4, 3.5, 3.3, 9.5]})
    line = _verdict(tmp_path, capsys, a, b)
    assert line == "disaggregated wins at 128 tokens x 1; no difference shown at 512 tokens x 1 (4 vs 4 requests)"


def test_tpot_counts_tokens_not_streamed_messages() -> None:
    """Ray may carry several tokens in one message: 16 tokens in 3 messages over 0.6 s is 40 ms a token."""
    requests = bench_compare.requests_of(
        {"duration": 1.0, "ttfts": [0.1], "itls": [[0.0, 0.6]], "output_lens": [16], "errors": [""]}
    )
    assert requests is not None and requests.tpot[0] == pytest.approx(0.04)


# --- the margin is honoured -----------------------------------------------------
@pytest.mark.parametrize(
    ("b_duration", "expected"),
    [
        (10.3, "no difference beyond 5% at any load point"),  # goodput 1.0 vs 0.971: 3%
        (10.8, "disaggregated wins at every load point"),  # 1.0 vs 0.926: 8%
    ],
    ids=["within-margin", "beyond-margin"],
)
def test_a_difference_inside_the_margin_is_a_tie(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], b_duration: float, expected: str
) -> None:
    """Every request meets the SLOs on both sides (intervals of zero width): only the margin can
    tell a 3% difference from an 8% one."""
    a = _folder(tmp_path / "pd", "disaggregated", {(128, 1): _mix(20, 0)})
    b = _folder(tmp_path / "agg", "aggregated", {(128, 1): _mix(20, 0)}, duration=b_duration)
    assert _verdict(tmp_path, capsys, a, b) == expected


# --- a third result: each pair on its own ----------------------------------------
def test_three_results_are_compared_pair_by_pair(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Always-split, aggregated and selective P/D: three verdicts, each like with like, each with its own chart."""
    split = _folder(tmp_path / "pd", "disaggregated", {(128, 1): _mix(10, 30)})
    aggregated = _folder(tmp_path / "agg", "aggregated", {(128, 1): _mix(30, 10)})
    selective = _folder(tmp_path / "sel", "disaggregated", {(128, 1): _mix(31, 9)}, local_prefill_max_tokens=4096)
    assert bench.main(["compare", str(split), str(aggregated), str(selective)]) == 0
    out = capsys.readouterr().out
    verdicts = [line.removeprefix("verdict: ") for line in out.splitlines() if line.startswith("verdict: ")]
    assert verdicts == [
        "aggregated wins at every load point",
        "selective P/D (<= 4096) wins at every load point",
        "no difference beyond 5% at any load point",
    ]
    charts = sorted(p.name for p in split.glob("compare-*.png"))
    assert charts == [
        "compare-aggregated-vs-selective-P-D-4096.png",
        "compare-disaggregated-vs-aggregated.png",
        "compare-disaggregated-vs-selective-P-D-4096.png",
    ]
