"""bench compare through its command: failed requests never make a side's latency, and each side's figures stay
under its own columns in compare.csv."""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from tools import bench, bench_results

TOKENS = 16
GAP_S = 0.04  # each token after the first


def _folder(folder: Path, mode: str, ttfts: Sequence[float], failed: int = 0, duration: float = 10.0) -> Path:
    """A result folder with one point (128 tokens x 1): these served requests, then `failed` that errored.

    A failed request is what vLLM's bench writes for one: an error, a zero TTFT, no tokens."""
    folder.mkdir(parents=True)
    (folder / "metadata.json").write_text(json.dumps({"serving_mode": mode, "local_prefill_max_tokens": 0}))
    result = {
        "duration": duration,
        "completed": len(ttfts),
        "ttfts": [*ttfts, *[0.0] * failed],
        "itls": [*[[GAP_S] * (TOKENS - 1)] * len(ttfts), *[[]] * failed],
        "output_lens": [*[TOKENS] * len(ttfts), *[0] * failed],
        "errors": [*[""] * len(ttfts), *["Internal Server Error"] * failed],
    }
    (folder / "run-128-1.json").write_text(json.dumps(result))
    ordered = sorted(ttfts)
    row = {
        "input_len": 128, "concurrency": 1, "completed": len(ttfts),
        "median_ttft_ms": ordered[len(ordered) // 2] * 1e3, "p99_ttft_ms": ordered[-1] * 1e3,
    }  # fmt: skip
    bench_results.write_csv([row], folder / "results.csv")
    return folder


def _compare(capsys: pytest.CaptureFixture[str], a: Path, b: Path) -> tuple[str, dict[str, str]]:
    assert bench.main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    (line,) = [line for line in out.splitlines() if line.startswith("verdict: ")]
    with (a / "compare.csv").open() as handle:
        (row,) = list(csv.DictReader(handle))
    return line.removeprefix("verdict: "), row


def test_a_side_whose_requests_fail_does_not_win_on_latency(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Neither side meets the 2 s TTFT SLO, so latency decides. Disaggregated served 4 requests at 5 s and failed
    16 (TTFT 0); aggregated served 20 at 3 s. Counted, the failures would make disaggregated's median 0 s: the
    side that failed most would win."""
    a = _folder(tmp_path / "pd", "disaggregated", [5.0] * 4, failed=16)
    b = _folder(tmp_path / "agg", "aggregated", [3.0] * 20)
    line, row = _compare(capsys, a, b)
    assert line == "aggregated wins at every load point"
    assert float(row["a_median_ttft_s"]) == pytest.approx(5.0)
    assert float(row["a_p99_ttft_s"]) == pytest.approx(5.0)
    assert float(row["a_median_e2el_s"]) == pytest.approx(5.0 + GAP_S * (TOKENS - 1))
    assert float(row["a_requests"]) == 20  # every request sent, the failed ones too


def test_each_sides_figures_are_under_its_own_columns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A (the first folder) is faster and has more requests: every a_ column holds A's figure, every b_ B's."""
    a = _folder(tmp_path / "pd", "disaggregated", [0.5] * 12)
    b = _folder(tmp_path / "agg", "aggregated", [1.5] * 6)
    line, row = _compare(capsys, a, b)
    assert line == "disaggregated wins at every load point"
    assert (row["a"], row["b"], row["winner"]) == ("disaggregated", "aggregated", "disaggregated")
    assert (float(row["a_median_ttft_ms"]), float(row["b_median_ttft_ms"])) == (500.0, 1500.0)
    assert (float(row["a_requests"]), float(row["b_requests"])) == (12.0, 6.0)
    assert (float(row["a_goodput"]), float(row["b_goodput"])) == pytest.approx((1.2, 0.6))
    assert float(row["a_median_ttft_s_hi"]) < float(row["b_median_ttft_s_lo"])
