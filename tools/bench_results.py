"""One bench sweep's results: a CSV row per load point from vLLM's result and the counters around it,
and the chart of the sweep (tools/bench.py runs the sweep).

Two inter-token latencies, because they differ: Ray Serve LLM streams tokens to
the client in batches (LLMConfig experimental_configs.stream_batching_interval_ms,
default RAYLLM_MODEL_RESPONSE_BATCH_TIMEOUT_MS = 50 ms), so most gaps the client
sees are ~0 and its p99 is about the interval. median_itl_ms / p99_itl_ms are
those client gaps; engine_*_itl_ms and engine_*_tpot_ms are vLLM's own
histograms (vllm:inter_token_latency_seconds, vllm:request_time_per_output_token_seconds),
scraped from the decoding workers before and after the point and interpolated
within their buckets as Prometheus's histogram_quantile does.

nixl_ms_per_transfer is NIXL's own transfer time (vllm:nixl_xfer_time_seconds):
it excludes the GPU<->host staging copies that kv_buffer_device: cpu adds on both
sides. A disaggregated point with fewer NIXL transfers than completed requests
is flagged: a request whose prefill returned no kv_transfer_params is prefilled
again on decode, silently.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tools.cluster_access import EngineSnapshot, NixlSnapshot

FIELDS = (
    "input_len",
    "concurrency",
    "completed",
    "median_ttft_ms",
    "p99_ttft_ms",
    "median_itl_ms",
    "p99_itl_ms",
    "median_tpot_ms",
    "p99_tpot_ms",
    "engine_median_itl_ms",
    "engine_p99_itl_ms",
    "engine_mean_itl_ms",
    "engine_median_tpot_ms",
    "engine_p99_tpot_ms",
    "output_throughput",
    "request_throughput",
    "nixl_transfers",
    "nixl_ms_per_transfer",
    "nixl_failed",
    "requests_without_transfer",
    "notes",
)
# Said in the CSV itself, on every row that has a transfer time.
STAGING_NOTE = "nixl_ms_per_transfer excludes the GPU-host staging copies (kv_buffer_device cpu)"


@dataclass(frozen=True)
class Point:
    input_len: int
    concurrency: int


def engine_latency(before: EngineSnapshot | None, after: EngineSnapshot | None) -> dict[str, float | None]:
    """The engines' own ITL and TPOT over one point (ms), from the histograms' change."""
    if after is None:
        return dict.fromkeys(("engine_median_itl_ms", "engine_p99_itl_ms", "engine_mean_itl_ms",
                              "engine_median_tpot_ms", "engine_p99_tpot_ms"))  # fmt: skip
    itl = after.itl.minus(before.itl if before else None) if after.itl else None
    tpot = after.tpot.minus(before.tpot if before else None) if after.tpot else None

    def ms(value: float | None) -> float | None:
        return None if value is None else value * 1e3

    return {
        "engine_median_itl_ms": ms(itl.quantile(0.5)) if itl else None,
        "engine_p99_itl_ms": ms(itl.quantile(0.99)) if itl else None,
        "engine_mean_itl_ms": ms(itl.mean) if itl else None,
        "engine_median_tpot_ms": ms(tpot.quantile(0.5)) if tpot else None,
        "engine_p99_tpot_ms": ms(tpot.quantile(0.99)) if tpot else None,
    }


def row(
    point: Point,
    result: dict[str, Any],
    before: NixlSnapshot,
    after: NixlSnapshot,
    engine_before: EngineSnapshot | None = None,
    engine_after: EngineSnapshot | None = None,
    *,
    serving_mode: str | None = None,
    local_prefill_max_tokens: int = 0,
    prompt_lens: Sequence[int] = (),
) -> dict[str, Any]:
    """One CSV row from a `vllm bench serve` result file and the counters around it.

    serving_mode "disaggregated": a point with fewer NIXL transfers than completed requests is
    flagged (None: the mode is unknown, nothing is flagged), unless its prompts are at most
    local_prefill_max_tokens, which decode prefills itself and moves no KV for. prompt_lens: each
    request's prompt length when they differ (the mixed workload), else every prompt is point.input_len;
    only the prompts longer than the threshold are expected to move KV.
    """
    transfers = after.transfers - before.transfers
    seconds = after.transfer_seconds - before.transfer_seconds
    completed = result.get("completed") or 0
    lens = list(prompt_lens) or [point.input_len]
    short = sum(n <= local_prefill_max_tokens for n in lens)
    local = serving_mode == "disaggregated" and short == len(lens)
    # Of a mix, the short requests' share of those completed are prefilled on decode by design.
    expected = completed - round(completed * short / len(lens)) if serving_mode == "disaggregated" else 0
    missing = max(0, int(expected - transfers)) if serving_mode == "disaggregated" and not local else None
    notes = []
    if local:
        notes.append(f"prefilled on decode: prompts of at most local_prefill_max_tokens = {local_prefill_max_tokens}")
    elif serving_mode == "disaggregated" and short:
        notes.append(
            f"prefilled on decode: {short} of {len(lens)} prompts of at most local_prefill_max_tokens = "
            f"{local_prefill_max_tokens}"
        )
    if missing:
        notes.append(
            f"{missing} of {completed} requests had no NIXL transfer: prefilled again on decode (local recompute)"
        )
    if transfers:
        notes.append(STAGING_NOTE)
    return {
        "input_len": point.input_len,
        "concurrency": point.concurrency,
        "completed": result.get("completed"),
        "median_ttft_ms": result.get("median_ttft_ms"),
        "p99_ttft_ms": result.get("p99_ttft_ms"),
        "median_itl_ms": result.get("median_itl_ms"),
        "p99_itl_ms": result.get("p99_itl_ms"),
        "median_tpot_ms": result.get("median_tpot_ms"),
        "p99_tpot_ms": result.get("p99_tpot_ms"),
        **engine_latency(engine_before, engine_after),
        "output_throughput": result.get("output_throughput"),
        "request_throughput": result.get("request_throughput"),
        "nixl_transfers": transfers,
        "nixl_ms_per_transfer": (seconds / transfers * 1e3) if transfers else None,
        "nixl_failed": after.failed - before.failed,
        "requests_without_transfer": missing,
        "notes": "; ".join(notes),
    }


def write_csv(rows: Sequence[dict[str, Any]], path: Path) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)


def write_chart(rows: Sequence[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = (
        ("median_ttft_ms", "TTFT p50 (ms)"),
        # The engine's: the client's gaps are Ray's stream batches (mostly 0).
        ("engine_median_itl_ms", "engine inter-token latency p50 (ms)"),
        ("output_throughput", "output tokens/s"),
        ("nixl_ms_per_transfer", "NIXL ms per KV transfer (excl. staging)"),
    )
    figure, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4))
    for ax, (field, label) in zip(axes, panels, strict=True):
        for concurrency in sorted({r["concurrency"] for r in rows}):
            points = [
                (r["input_len"], r[field]) for r in rows if r["concurrency"] == concurrency and r.get(field) is not None
            ]
            if points:
                xs, ys = zip(*sorted(points), strict=True)
                ax.plot(xs, ys, marker="o", label=f"concurrency {concurrency}")
        ax.set_xlabel("prompt tokens")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend()
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
