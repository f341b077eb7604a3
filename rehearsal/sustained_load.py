"""Sustained load on the one deployed app: `make bench`'s own client for LOAD_S and more.

vLLM's bench (tools.bench.bench_command, as `make bench` runs it) in batches of BATCH prompts
at CONCURRENCY, the CPU engines' max_num_seqs, so that decode always holds a full batch and
prefill always has the next prompt, until LOAD_S have passed. vLLM's ready-check request
(vllm/benchmarks/serve.py, wait_for_endpoint) is turned off: it repeats the batch's first prompt.

Required: no failed request; NIXL failures 0; decode's NIXL transfers equal to the requests
completed (the ready checks included); the engines' resident memory (both sides' Serve
replicas and their engine processes) grows by no more than LEAK_BOUND_MIB between the end of
the first batch (caches warm) and the end of the run. Reported: throughput, TTFT and ITL
percentiles over every request, the engine's own inter-token latency, and memory per batch by
process (the Serve replica, vLLM's EngineCore and its Worker).
"""

from __future__ import annotations

import json
import math
import subprocess
import time
from typing import Any

from rehearsal import streams
from rehearsal.context import Context
from rehearsal.disconnects import busy
from rehearsal.engine_deaths import node_namespace
from rehearsal.network import DECODE_METRICS, PREFILL_METRICS, SERVE, metrics_text
from settings.project import ROOT
from tools import bench as tools_bench
from tools import bench_results
from tools.checks import Check
from tools.cluster_access import EngineSnapshot, NixlSnapshot
from tools.polling import poll, settled

# 180 s until 2026-12-05: the pd case's longest phase on a fast machine (196 s of 823 s), for a fixed time on any.
LOAD_S = 120.0
CONCURRENCY = 8  # the CPU delta's max_num_seqs (rehearsal/deploy.py)
INPUT_LEN = 256
OUTPUT_LEN = 64
BATCH = 48
# Resident memory may move with the allocator's arenas and Python's caches; a leak of one KV block
# per request (about 0.2 MiB here at float32) over the ~240 requests after the first batch in 120 s
# would pass 48 MiB, as would a leaked prompt or response object per request. Seen: prefill's grew
# 2-3 MiB a batch, 18.8 MiB over 8 batches (2026-12-05, 180 s; decode's 4.9 MiB).
LEAK_BOUND_MIB = 48.0


def _engine_memory(ctx: Context) -> dict[str, float]:
    """Each side's resident MiB (its Serve replica and every process under it), and the engine's share."""

    found = {}
    for side in ("prefill", "decode"):
        processes = streams.engine_processes(side, node_namespace(ctx, side))
        found[side] = round(streams.rss_mib(processes["replicas"]), 1)
        found[f"{side}_engine"] = round(streams.rss_mib(processes["engines"]), 1)
    return found


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def sustained_load_check(ctx: Context) -> list[Any]:
    out = ctx.work / "sustained-load"
    out.mkdir(parents=True, exist_ok=True)

    def snapshot() -> tuple[NixlSnapshot, EngineSnapshot]:
        text = metrics_text(DECODE_METRICS)
        return NixlSnapshot.of(text), EngineSnapshot.of(text)

    nixl_before, engine_before = settled(snapshot)
    kv_before = _kv(ctx)
    started = time.monotonic()
    results: list[dict[str, Any]] = []
    memory: list[dict[str, float]] = []
    while time.monotonic() - started < LOAD_S:
        name = f"load-{len(results)}.json"
        command = tools_bench.bench_command(
            base_url=SERVE, model=ctx.model_id, point=bench_results.Point(INPUT_LEN, CONCURRENCY),
            output_len=OUTPUT_LEN, num_prompts=BATCH, result_dir=out, result_file=name, tokenizer=str(ctx.model_dir),
        )  # fmt: skip
        # Another seed per batch: a repeated prompt would be a prefix-cache hit on decode, with no transfer.
        command[command.index("--seed") + 1] = str(len(results))
        # No ready check: it sends the batch's first prompt once more, and one of the two is then a
        # prefix-cache hit on decode with no transfer (measured: 816 transfers for 816 requests and 17
        # ready checks), which would make "one transfer per request" ambiguous.
        command += ["--ready-check-timeout-sec", "0"]
        subprocess.run(
            command, check=True, cwd=ROOT, timeout=900, capture_output=True, env=tools_bench.bench_env(ctx.api_key)
        )
        results.append(json.loads((out / name).read_text()))
        memory.append(_engine_memory(ctx))
    elapsed = time.monotonic() - started
    completed = sum(int(r.get("completed") or 0) for r in results)
    failed = sum(int(r.get("failed") or 0) for r in results)
    expected = completed

    def grown(reading: tuple[NixlSnapshot, EngineSnapshot]) -> bool:
        return reading[0].transfers + reading[0].failed - nixl_before.transfers - nixl_before.failed >= expected

    poll(snapshot, grown)
    nixl_after, engine_after = settled(snapshot)
    transfers = nixl_after.transfers - nixl_before.transfers
    nixl_failed = nixl_after.failed - nixl_before.failed
    ttft = [t for r in results for t in r.get("ttfts", []) if t]
    itl = [t for r in results for request in r.get("itls", []) for t in request]
    engine = bench_results.engine_latency(engine_before, engine_after)
    growth = {part: round(memory[-1][part] - memory[0][part], 1) for part in memory[0]}
    output_tokens = sum(sum(r.get("output_lens", [])) for r in results)

    def ms(value: float | None) -> float | None:
        return None if value is None else round(value * 1e3, 1)

    ctx.metrics.update(
        load_seconds=round(elapsed, 1),
        load_requests=float(completed),
        load_failed=float(failed),
        load_nixl_transfers=transfers,
        load_nixl_failed=nixl_failed,
        load_output_tokens_per_s=round(output_tokens / elapsed, 1),
        load_requests_per_s=round(completed / elapsed, 3),
        load_ttft_p50_ms=ms(_percentile(ttft, 0.5)),
        load_ttft_p99_ms=ms(_percentile(ttft, 0.99)),
        load_itl_p50_ms=ms(_percentile(itl, 0.5)),
        load_itl_p99_ms=ms(_percentile(itl, 0.99)),
        load_engine_itl_p50_ms=engine["engine_median_itl_ms"],
        load_engine_itl_p99_ms=engine["engine_p99_itl_ms"],
        load_rss_growth_prefill_mib=growth["prefill"],
        load_rss_growth_decode_mib=growth["decode"],
    )
    ctx.log_lines.append(
        f"sustained load: {len(results)} batches in {elapsed:.0f} s; engine memory MiB per batch {memory}; "
        f"KV use before {kv_before}, after {_kv(ctx)}"
    )
    (out / "memory.json").write_text(json.dumps(memory))
    if ctx.results is not None:
        ctx.results.mkdir(parents=True, exist_ok=True)
        load = {k: v for k, v in ctx.metrics.items() if k.startswith("load_")}
        (ctx.results / "sustained-load.json").write_text(json.dumps({**load, "memory_mib": memory}, indent=2))
    return [
        Check(
            f"sustained load: {LOAD_S:.0f} s or more at concurrency {CONCURRENCY}, no failed request",
            elapsed >= LOAD_S and failed == 0 and completed > 0,
            f"{completed} requests in {elapsed:.0f} s ({len(results)} batches), {failed} failed",
        ),
        Check(
            "sustained load: one NIXL transfer per request, none failed",
            transfers == expected and nixl_failed == 0,
            f"decode NIXL transfers {transfers:g} for {completed} requests; failed {nixl_failed:g}",
        ),
        Check(
            f"sustained load: engine memory grows by at most {LEAK_BOUND_MIB:.0f} MiB",
            len(memory) >= 2 and growth["prefill"] <= LEAK_BOUND_MIB and growth["decode"] <= LEAK_BOUND_MIB,
            f"resident MiB after the first batch {memory[0]}, at the end {memory[-1]}: growth {growth}",
        ),
    ]


def _kv(ctx: Context) -> dict[str, float]:
    return {
        side: busy(metrics_text(url))["ray_vllm_kv_cache_usage_perc"]
        for side, url in (("prefill", PREFILL_METRICS), ("decode", DECODE_METRICS))
    }
