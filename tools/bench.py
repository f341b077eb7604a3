"""After `cdk deploy`: sweep prompt length and concurrency against the endpoint with `vllm bench serve`,
and compare two such sweeps.

    python -m tools.bench [-c key=value ...] [--input-lens 512,2048,6144] [--concurrency 1,4,16]
                          [--output-len 128] [--prompts-per-run 64] [--out bench-results]
                          [--workload random|shared-prefix|mixed]
    python -m tools.bench compare A B [--ttft-slo-ms 2000] [--itl-slo-ms 100] [--out compare.png]

For each point it runs vLLM's own load generator (random prompts, the model's
tokenizer), reads decode's NIXL counters and the engines' latency histograms
before and after, and writes results.csv and results.png (TTFT, inter-token
latency, throughput, KV transfer time per request) to --out, with each point's
vLLM result (every request's TTFT and inter-token latencies) and metadata.json:
the serving mode and settings read from the live RayService. Progress is
printed as it goes.

What each column means is in tools/bench_results.py.

With endpoint_api_keys_secret_name set, the key (OPENAI_API_KEY, else the
endpoint's Secret) reaches vLLM's bench through OPENAI_API_KEY in its
environment, never its command line.

`compare` puts two result folders side by side per load point (TTFT and
inter-token latency p50/p99, throughput, goodput under the SLOs), names the
winner of each point and overall, and writes a PNG and a CSV.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from serve_config import DECODE, SERVE_PORT, ingress_service_name
from serve_config.deployments import LOCAL_PREFILL_KEY, NAME_PREFIXES
from settings import Settings
from settings.cli import USAGE_EXIT, cli_settings
from tools.bench_compare import main as compare_main
from tools.bench_compare import mode_label
from tools.bench_mixed import (
    TRACE_CHUNK_TOKENS,
    mixed_input_len,
    mixed_requests_path,
    write_mixed_requests,
)
from tools.bench_results import Point, row, write_chart, write_csv
from tools.cluster_access import (
    ClusterUnreachableError,
    EndpointKeyError,
    EngineSnapshot,
    NixlSnapshot,
    endpoint_key,
    kubectl_json,
    metrics_text,
    port_forward,
    unreachable_message,
    worker_pods,
)
from tools.polling import settled

# The workloads: each prompt new, prompts that share a few long prefixes, or short and long prompts mixed.
RANDOM, SHARED_PREFIX, MIXED = "random", "shared-prefix", "mixed"
WORKLOADS = (RANDOM, SHARED_PREFIX, MIXED)
SHARED_PREFIXES = 4
SHARED_PREFIX_SHARE = 0.75


def bench_command(
    *,
    base_url: str,
    model: str,
    point: Point,
    output_len: int,
    num_prompts: int,
    result_dir: Path,
    result_file: str,
    tokenizer: str | None = None,
    workload: str = RANDOM,
) -> list[str]:
    """The `vllm bench serve` invocation for one point of the sweep (tokenizer: a local copy, else the model's).

    workload: `random`, each prompt new; `shared-prefix`, vLLM's prefix_repetition dataset: SHARED_PREFIXES
    prefixes of SHARED_PREFIX_SHARE of the point's length, each with its own random suffixes, shuffled; what a shared
    system prompt or a conversation's earlier turns look like to the prefix caches and the router; or `mixed`,
    vLLM's timed_trace dataset reading each request's prompt and output lengths from the file write_mixed_requests
    writes (mixed_requests_path), sent at the point's concurrency, not at the file's timestamps (--no-self-timed);
    the point's length and output_len do not apply."""
    extra = ["--tokenizer", tokenizer] if tokenizer else []
    if workload == MIXED:
        dataset = [
            "--dataset-name", "timed_trace",
            "--dataset-path", str(mixed_requests_path(result_dir, result_file)),
            "--timed-trace-chunk-hash-size", str(TRACE_CHUNK_TOKENS),
            "--no-self-timed",
        ]  # fmt: skip
    elif workload == SHARED_PREFIX:
        prefix = int(point.input_len * SHARED_PREFIX_SHARE)
        dataset = [
            "--dataset-name", "prefix_repetition",
            "--prefix-repetition-prefix-len", str(prefix),
            "--prefix-repetition-suffix-len", str(point.input_len - prefix),
            "--prefix-repetition-num-prefixes", str(SHARED_PREFIXES),
            "--prefix-repetition-output-len", str(output_len),
        ]  # fmt: skip
    else:
        dataset = [
            "--dataset-name", "random",
            "--random-input-len", str(point.input_len),
            "--random-output-len", str(output_len),
        ]  # fmt: skip
    return [
        sys.executable, "-m", "tools.vllm_bench",
        "--backend", "openai-chat",
        "--endpoint", "/v1/chat/completions",
        "--base-url", base_url,
        "--model", model,
        *dataset,
        "--ignore-eos",
        "--num-prompts", str(num_prompts),
        "--max-concurrency", str(point.concurrency),
        "--percentile-metrics", "ttft,tpot,itl,e2el",
        "--metric-percentiles", "50,99",
        "--seed", "0",
        "--save-result",
        # Every request's TTFT and inter-token latencies: compare computes goodput under any SLOs from them.
        "--save-detailed",
        "--result-dir", str(result_dir),
        "--result-filename", result_file,
        *extra,
    ]  # fmt: skip


def bench_env(api_key: str | None, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment vLLM's bench runs in: OPENAI_API_KEY is what it sends as `Authorization: Bearer`
    (vllm/benchmarks/lib/endpoint_request_func.py, _get_headers)."""
    env = dict(os.environ if base is None else base)
    if api_key:
        env["OPENAI_API_KEY"] = api_key
    return env


# --- What was measured: the live RayService ---------------------------------------------------------
def _replicas(app: Mapping[str, Any], mode: str) -> dict[str, Any]:
    """Each engine deployment's replica count, or its autoscaling range, from the app's `deployments` list."""
    sides = {"prefill": "prefill", "decode": "decode"} if mode == "disaggregated" else {"replica": "aggregated"}
    entries = {d["name"]: d for d in app.get("deployments", [])}
    found: dict[str, Any] = {}
    for key, side in sides.items():
        entry: Mapping[str, Any] = next((e for n, e in entries.items() if n.startswith(NAME_PREFIXES[side])), {})
        scaling = entry.get("autoscaling_config")
        found[key] = f"{scaling['min_replicas']}-{scaling['max_replicas']}" if scaling else entry.get("num_replicas")
    return found


def describe_serve_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The serving mode and the settings that shape performance, read from a deployed serve config."""
    (app,) = config["applications"]
    args = app.get("args", {})
    if app["import_path"].endswith("build_pd_openai_app"):
        mode, llms = "disaggregated", {side: args[f"{side}_config"] for side in ("prefill", "decode")}
    else:
        mode, llms = "aggregated", {"replica": args["llm_configs"][0]}
    decode: Mapping[str, Any] = next(
        (d for d in app.get("deployments", []) if d["name"].startswith(NAME_PREFIXES[DECODE])), {}
    )
    return {
        "serving_mode": mode,
        # Decode prefills prompts of at most this many tokens itself (ray_pods/selective_pd.py); 0: every one split.
        "local_prefill_max_tokens": (decode.get("user_config") or {}).get(LOCAL_PREFILL_KEY, 0),
        "model_id": next(iter(llms.values()))["model_loading_config"]["model_id"],
        "replicas": _replicas(app, mode),
        "engine_kwargs": {
            k: {
                name: v["engine_kwargs"].get(name)
                for name in (
                    "max_model_len",
                    "max_num_batched_tokens",
                    "max_num_seqs",
                    "gpu_memory_utilization",
                    "tensor_parallel_size",
                )
            }
            for k, v in llms.items()
        },
    }


def live_metadata(settings: Settings) -> dict[str, Any]:
    """describe_serve_config of the RayService running now (not of the local settings)."""
    import yaml

    doc = kubectl_json("get", "rayservice", "-n", settings.serving_namespace, settings.service_name)
    return {
        "source": f"live RayService {settings.serving_namespace}/{settings.service_name}",
        **describe_serve_config(yaml.safe_load(doc["spec"]["serveConfigV2"])),
    }


def _csv_ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def progress(point: Mapping[str, Any]) -> str:
    """One line per point: TTFT, and the engine's ITL beside the client's (Ray's batches)."""

    def ms(name: str) -> str:
        value = point.get(name)
        return "-" if value is None else f"{value:.0f}" if value >= 10 else f"{value:.2g}"

    return (
        f"TTFT p50 {ms('median_ttft_ms')} ms; ITL p50 engine {ms('engine_median_itl_ms')} ms, "
        f"client {ms('median_itl_ms')} ms (Ray's stream batches)"
    )


def scrape(namespace: str, pods: Sequence[str]) -> tuple[NixlSnapshot, EngineSnapshot]:
    """NIXL counters and engine histograms, summed over the pods that decode."""
    texts = [metrics_text(namespace, pod) for pod in pods]
    nixl = [NixlSnapshot.of(text) for text in texts]
    summed = NixlSnapshot(
        sum(n.transfers for n in nixl), sum(n.transfer_seconds for n in nixl), sum(n.failed for n in nixl)
    )
    return summed, EngineSnapshot.of(*texts)


def sweep(
    settings: Settings,
    points: list[Point],
    output_len: int,
    num_prompts: int,
    out: Path,
    serving_mode: str | None = None,
    local_prefill_max_tokens: int = 0,
    workload: str = RANDOM,
) -> list[dict[str, Any]]:
    groups = worker_pods(settings)
    # Decode decodes in P/D mode; in aggregated mode every replica does both.
    sides = [DECODE] if serving_mode != "aggregated" else sorted(groups)
    pods = [p["metadata"]["name"] for side in sides for p in groups.get(side, [])]

    def snapshot() -> tuple[NixlSnapshot, EngineSnapshot]:
        # Ray exports every 10 s: a reading is complete once it has held still for longer.
        return settled(lambda: scrape(settings.serving_namespace, pods))

    env = bench_env(endpoint_key(settings))
    rows = []
    with port_forward(settings, ingress_service_name(settings), SERVE_PORT) as base:
        for index, point in enumerate(points, 1):
            started = time.monotonic()
            print(
                f"[{index}/{len(points)}] prompt {point.input_len} tokens, concurrency {point.concurrency} ...",
                flush=True,
            )
            name = f"run-{point.input_len}-{point.concurrency}.json"
            prompt_lens: list[int] = []
            if workload == MIXED:
                prompt_lens = write_mixed_requests(mixed_requests_path(out, name), num_prompts, settings.max_model_len)
            before, engine_before = snapshot()
            command = bench_command(
                base_url=base, model=settings.model_id, point=point, output_len=output_len,
                num_prompts=num_prompts, result_dir=out, result_file=name, workload=workload,
            )  # fmt: skip
            subprocess.run(command, check=True, env=env)  # vLLM's own progress bar shows here
            result = json.loads((out / name).read_text())
            after, engine_after = snapshot()
            rows.append(
                row(
                    point, result, before, after, engine_before, engine_after,
                    serving_mode=serving_mode, local_prefill_max_tokens=local_prefill_max_tokens,
                    prompt_lens=prompt_lens,
                )
            )  # fmt: skip
            print(
                f"    done in {time.monotonic() - started:.0f}s: {progress(rows[-1])}",
                flush=True,
            )
            if rows[-1]["requests_without_transfer"]:
                print(f"    WARNING: {rows[-1]['notes'].split(';')[0]}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    raw = sys.argv[1:] if argv is None else argv
    if raw[:1] == ["compare"]:
        return compare_main(raw[1:])
    parser = argparse.ArgumentParser(description="Benchmark the deployed endpoint with vllm bench serve")
    parser.add_argument("-c", "--context", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--input-lens", type=_csv_ints, default=[512, 2048, 6144])
    parser.add_argument("--concurrency", type=_csv_ints, default=[1, 4, 16])
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--prompts-per-run", type=int, default=64)
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    parser.add_argument(
        "--workload",
        choices=WORKLOADS,
        default=RANDOM,
        help=f"random: each prompt new; shared-prefix: {SHARED_PREFIXES} prefixes of "
        f"{SHARED_PREFIX_SHARE:.0%} of the prompt, for the prefix caches and the prefix-aware router; "
        "mixed: short, medium and long prompts and outputs in the proportions of Azure's 2023 conversation "
        "trace (--input-lens and --output-len do not apply)",
    )
    args = parser.parse_args(raw)
    settings = cli_settings(args.context)
    if args.workload == MIXED:
        # One point per concurrency: the lengths are the trace's, cut to max_model_len.
        points = [Point(mixed_input_len(settings.max_model_len), c) for c in args.concurrency]
    else:
        too_long = [n for n in args.input_lens if n + args.output_len > settings.max_model_len]
        if too_long:
            print(
                f"error: prompt lengths {too_long} + output exceed max_model_len {settings.max_model_len}",
                file=sys.stderr,
            )
            return 1
        points = [Point(n, c) for n in args.input_lens for c in args.concurrency]
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        metadata = live_metadata(settings)
        print(f"measuring the {mode_label(metadata)} deployment ({metadata['source']})", flush=True)
        rows = sweep(
            settings, points, args.output_len, args.prompts_per_run, args.out,
            metadata["serving_mode"], metadata.get("local_prefill_max_tokens") or 0, args.workload,
        )  # fmt: skip
        metadata["workload"] = args.workload
    except ClusterUnreachableError as err:
        print(unreachable_message(settings, err), file=sys.stderr)
        return USAGE_EXIT
    except EndpointKeyError as err:
        print(f"error: no endpoint key: {err}", file=sys.stderr)
        return 1
    write_csv(rows, args.out / "results.csv")
    title = (
        f"{settings.model_id} on {settings.gpu_instance_type}: "
        f"prefill x{settings.prefill_replicas}, decode x{settings.decode_replicas}"
    )
    write_chart(rows, args.out / "results.png", title)
    (args.out / "settings.json").write_text(json.dumps(asdict(settings), indent=2, default=list))
    (args.out / "metadata.json").write_text(json.dumps(metadata, indent=2))
    print(f"wrote {args.out / 'results.csv'} and {args.out / 'results.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
