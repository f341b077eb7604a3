"""bench: local recompute flagged, the engine's own latencies beside the client's, the endpoint key."""

from __future__ import annotations

import csv
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from settings import Settings
from tests.support.bench_result import RESULT
from tests.support.fake_cluster import KEY, FakeCluster
from tools import bench, bench_mixed, bench_results
from tools.cluster_access import EngineSnapshot, Histogram, NixlSnapshot, histogram

# A recorded run, at 4 requests (the rehearsal's size).

ITL_BOUNDS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2)  # vLLM 0.26's first ITL buckets


def _engine_text(itl_counts: dict[float, int], tpot_counts: dict[float, int], engine: str = "0") -> str:
    """Ray's export of vLLM's two latency histograms, as the workers' metrics endpoint serves it."""
    lines = []
    for name, counts in (("inter_token_latency", itl_counts), ("request_time_per_output_token", tpot_counts)):
        lines.append(f"# TYPE ray_vllm_{name}_seconds histogram")
        cumulative, total = 0, 0.0
        for le in (*ITL_BOUNDS, float("inf")):
            cumulative += counts.get(le, 0)
            total += counts.get(le, 0) * (le if le != float("inf") else 1.0) * 0.9
            bound = "+Inf" if le == float("inf") else repr(le)
            labels = f'engine="{engine}",model_name="m",le="{bound}"'
            lines.append(f"ray_vllm_{name}_seconds_bucket{{{labels}}} {float(cumulative)}")
        lines.append(f'ray_vllm_{name}_seconds_sum{{engine="{engine}",model_name="m"}} {total}')
        lines.append(f'ray_vllm_{name}_seconds_count{{engine="{engine}",model_name="m"}} {float(cumulative)}')
    return "\n".join(lines) + "\n"


# --- local recompute is flagged, and the staging copies are said -------------
def test_a_point_with_fewer_transfers_than_requests_is_flagged(tmp_path: Path) -> None:
    before = NixlSnapshot(10, 1.0, 0)
    short = bench_results.row(
        bench_results.Point(512, 4), RESULT, before, NixlSnapshot(13, 1.3, 0), serving_mode="disaggregated"
    )
    assert short["requests_without_transfer"] == 1
    assert "1 of 4 requests had no NIXL transfer" in short["notes"]
    # vLLM's bench sends one ready-check request first: 5 transfers for 4 completed requests is fine.
    full = bench_results.row(
        bench_results.Point(512, 4), RESULT, before, NixlSnapshot(15, 1.5, 0), serving_mode="disaggregated"
    )
    assert full["requests_without_transfer"] == 0 and "no NIXL transfer" not in full["notes"]
    # Aggregated mode moves no KV at all: nothing to flag.
    agg = bench_results.row(bench_results.Point(512, 4), RESULT, before, before, serving_mode="aggregated")
    assert agg["requests_without_transfer"] is None and agg["notes"] == ""
    bench_results.write_csv([short, full, agg], tmp_path / "results.csv")
    with (tmp_path / "results.csv").open() as handle:
        written = list(csv.DictReader(handle))
    # The CSV itself says what nixl_ms_per_transfer leaves out, on every row that has one.
    assert [bench_results.STAGING_NOTE in r["notes"] for r in written] == [True, True, False]
    assert written[0]["requests_without_transfer"] == "1"


def test_a_point_decode_prefills_itself_is_not_flagged_and_a_longer_one_is(tmp_path: Path) -> None:
    """Selective P/D: prompts of at most the threshold move no KV by design; longer ones must, as when split."""
    before = NixlSnapshot(10, 1.0, 0)
    selective = {"serving_mode": "disaggregated", "local_prefill_max_tokens": 4096}
    local = bench_results.row(bench_results.Point(512, 4), RESULT, before, before, **selective)  # type: ignore[arg-type]
    assert local["requests_without_transfer"] is None
    assert "prefilled on decode: prompts of at most local_prefill_max_tokens = 4096" in local["notes"]
    long = bench_results.row(bench_results.Point(6144, 4), RESULT, before, before, **selective)  # type: ignore[arg-type]
    assert long["requests_without_transfer"] == 4 and "4 of 4 requests had no NIXL transfer" in long["notes"]


# --- the engine's inter-token latency, not Ray's stream batches --------------
def test_histogram_quantile_interpolates_as_prometheus_does() -> None:
    h = Histogram(((0.01, 10.0), (0.025, 30.0), (0.05, 40.0), (float("inf"), 40.0)), 0.8, 40.0)
    assert h.quantile(0.5) == pytest.approx(0.01 + 0.015 * (20 - 10) / 20)  # rank 20 in (0.01, 0.025]
    assert h.quantile(0.99) == pytest.approx(0.025 + 0.025 * (39.6 - 30) / 10)
    assert h.quantile(0.1) == pytest.approx(0.004)  # the first bucket starts at 0
    assert h.mean == pytest.approx(0.02)
    assert Histogram(((float("inf"), 0.0),), 0.0, 0.0).quantile(0.5) is None
    # Above every finite bound: the highest finite bound is all a histogram can say.
    assert Histogram(((0.05, 0.0), (float("inf"), 3.0)), 9.0, 3.0).quantile(0.5) == 0.05


def test_engine_latency_comes_from_the_histograms_change_over_the_point() -> None:
    before_text = _engine_text({0.01: 100}, {0.025: 5})
    # During the point: 600 token gaps of 25-50 ms in the engine, 8 requests at 25-50 ms per token.
    after_text = _engine_text({0.01: 100, 0.05: 600}, {0.025: 5, 0.05: 8})
    assert histogram(after_text, "vllm:inter_token_latency_seconds") is not None
    before, after = EngineSnapshot.of(before_text), EngineSnapshot.of(after_text)
    point = bench_results.row(
        bench_results.Point(512, 4), RESULT, NixlSnapshot(0, 0, 0), NixlSnapshot(5, 0.5, 0), before, after
    )
    assert 25 < point["engine_median_itl_ms"] < 50 and 25 < point["engine_p99_itl_ms"] <= 50
    assert 25 < point["engine_median_tpot_ms"] < 50
    assert point["engine_mean_itl_ms"] == pytest.approx(0.05 * 0.9 * 1e3)
    # The client's median gap (Ray's batching) is a different, much smaller figure; both are kept.
    assert point["median_itl_ms"] == RESULT["median_itl_ms"]
    # Two decode replicas: their histograms add up.
    two = EngineSnapshot.of(after_text, _engine_text({0.01: 100, 0.05: 600}, {}, engine="1"))
    assert two.itl is not None and two.itl.count == 1400


def test_progress_shows_the_engines_itl_beside_the_clients() -> None:
    line = bench.progress({"median_ttft_ms": 987.1, "engine_median_itl_ms": 41.3, "median_itl_ms": 0.012})
    assert line == "TTFT p50 987 ms; ITL p50 engine 41 ms, client 0.012 ms (Ray's stream batches)"
    assert "engine - ms" in bench.progress({"median_ttft_ms": 1.0})


def test_engine_figures_are_absent_without_a_scrape() -> None:
    point = bench_results.row(bench_results.Point(512, 4), RESULT, NixlSnapshot(0, 0, 0), NixlSnapshot(0, 0, 0))
    assert point["engine_median_itl_ms"] is None and point["engine_p99_tpot_ms"] is None


def test_bench_asks_vllm_for_per_request_tpot() -> None:
    command = bench.bench_command(
        base_url="http://x", model="m", point=bench_results.Point(1, 1), output_len=1, num_prompts=1,
        result_dir=Path("/tmp"), result_file="r.json",
    )  # fmt: skip
    assert command[command.index("--percentile-metrics") + 1].split(",") == ["ttft", "tpot", "itl", "e2el"]


# --- the endpoint key reaches vLLM's bench, never its command line -------------
def test_the_key_reaches_vllms_own_request_headers(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.benchmarks.lib import endpoint_request_func

    env = bench.bench_env("sk-bench-key", base={"PATH": "/bin"})
    assert env == {"PATH": "/bin", "OPENAI_API_KEY": "sk-bench-key"}
    monkeypatch.setattr(endpoint_request_func.os, "environ", env)
    assert endpoint_request_func._get_headers()["Authorization"] == "Bearer sk-bench-key"
    assert "OPENAI_API_KEY" not in bench.bench_env(None, base={"PATH": "/bin"})


def test_sweep_runs_vllms_bench_with_the_key_and_flags_recompute(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The sweep against a fake cluster: the key from the endpoint's Secret is in vLLM's bench's
    environment and not on its command line; 3 transfers for 4 requests is flagged."""

    cluster = FakeCluster()
    state = {"transfers": 0}

    def metrics(namespace: str, pod: str) -> str:
        return f'ray_vllm_nixl_xfer_time_seconds_count{{engine="0"}} {state["transfers"]}\n'

    runs: list[dict[str, Any]] = []

    def run(command: list[str], check: bool, env: dict[str, str]) -> None:
        runs.append({"command": command, "env": env})
        out = Path(command[command.index("--result-dir") + 1])
        (out / command[command.index("--result-filename") + 1]).write_text(json.dumps(RESULT))
        state["transfers"] += 3

    monkeypatch.setenv("OPENAI_API_KEY", "")
    monkeypatch.setattr(bench, "worker_pods", lambda s: {"decode": [{"metadata": {"name": "w-decode"}}]})
    monkeypatch.setattr(bench, "metrics_text", metrics)
    monkeypatch.setattr(bench, "port_forward", cluster.port_forward)
    monkeypatch.setattr("tools.cluster_access.kubectl", cluster.kubectl)
    monkeypatch.setattr("tools.bench.subprocess.run", run)
    monkeypatch.setattr(time, "sleep", cluster.sleep)

    class Keyed:
        endpoint_api_keys_secret_name = "pd/endpoint-api-keys"

        def __getattr__(self, name: str) -> Any:
            return getattr(Settings(), name)

    rows = bench.sweep(Keyed(), [bench_results.Point(128, 1)], 16, 4, tmp_path, "disaggregated")  # type: ignore[arg-type]
    assert runs[0]["env"]["OPENAI_API_KEY"] == KEY
    assert KEY not in " ".join(runs[0]["command"])
    assert rows[0]["nixl_transfers"] == 3 and rows[0]["requests_without_transfer"] == 1
    assert "WARNING: 1 of 4 requests had no NIXL transfer" in capsys.readouterr().out


# --- the mixed workload: Azure's 2023 conversation trace's classes, as vLLM's own bench reads them ----------
def test_the_mixed_workload_is_the_conversation_traces_classes_in_its_proportions() -> None:
    """The counts and medians counted from AzureLLMInferenceTrace_conv.csv (Splitwise, ISCA 2024): 19,366
    requests, 39.5% short, 46.6% medium, 14.0% long; 64 prompts are 25, 30 and 9 of them, shuffled."""
    classes = {name: (count, prompt, output) for name, count, prompt, output in bench_mixed.MIXED_TRACE_CLASSES}
    assert classes == {"short": (7643, 386, 98), "medium": (9020, 1085, 396), "long": (2703, 4077, 67)}
    total = sum(count for count, _, _ in classes.values())
    assert total == 19366
    assert [round(count / total, 3) for count, _, _ in classes.values()] == [0.395, 0.466, 0.14]
    lengths = bench_mixed.mixed_lengths(64, 8192)
    assert Counter(lengths) == {(386, 98): 25, (1085, 396): 30, (4077, 67): 9}
    assert lengths != sorted(lengths) and lengths == bench_mixed.mixed_lengths(64, 8192)  # shuffled, the same each run
    assert bench_mixed.mixed_input_len(8192) == round((7643 * 386 + 9020 * 1085 + 2703 * 4077) / 19366) == 1227
    # A shorter max_model_len cuts the long prompts to leave room for their output, and nothing else.
    assert Counter(bench_mixed.mixed_lengths(64, 4096)) == {(386, 98): 25, (1085, 396): 30, (4029, 67): 9}
    assert sum(Counter(bench_mixed.mixed_lengths(10, 8192)).values()) == 10


class _Tokenizer:
    """What vLLM's timed_trace dataset asks of a tokenizer."""

    all_special_ids = (0,)

    def get_vocab(self) -> dict[str, int]:
        return {f"t{i}": i for i in range(1000)}

    def decode(self, ids: list[int]) -> str:
        return " ".join(map(str, ids))


def test_vllms_own_parser_and_dataset_give_each_mixed_request_its_lengths(tmp_path: Path) -> None:
    """The command parses with the installed vLLM's `vllm bench serve` parser, and its timed_trace dataset reads the
    file bench writes into exactly the mix's lengths, each prompt new, sent at the concurrency, not the timestamps."""
    from vllm.benchmarks.datasets.datasets import get_samples
    from vllm.benchmarks.serve import add_cli_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    command = bench.bench_command(
        base_url="http://x", model="m", point=bench_results.Point(bench_mixed.mixed_input_len(4096), 4), output_len=1,
        num_prompts=64, result_dir=tmp_path, result_file="run-1-4.json", workload=bench.MIXED,
    )  # fmt: skip
    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    args = parser.parse_args(command[3:])
    assert (args.dataset_name, args.self_timed, args.max_concurrency, args.num_prompts) == ("timed_trace", False, 4, 64)
    prompt_lens = bench_mixed.write_mixed_requests(Path(args.dataset_path), 64, 4096)
    samples = get_samples(args, _Tokenizer())
    assert [(s.prompt_len, s.expected_output_len) for s in samples] == bench_mixed.mixed_lengths(64, 4096)
    assert [s.prompt_len for s in samples] == prompt_lens
    assert len({s.prompt for s in samples}) == 64


def test_a_mixed_point_expects_kv_only_from_its_prompts_above_the_threshold() -> None:
    lens = [n for n, _ in bench_mixed.mixed_lengths(64, 8192)]
    result = {**RESULT, "completed": 64}
    point = bench_results.Point(bench_mixed.mixed_input_len(8192), 4)

    def row(transfers: int, threshold: int) -> dict[str, Any]:
        return bench_results.row(
            point, result, NixlSnapshot(0, 0, 0), NixlSnapshot(transfers, 1.0, 0),
            serving_mode="disaggregated", local_prefill_max_tokens=threshold, prompt_lens=lens,
        )  # fmt: skip

    # Threshold 1,024: the 25 short prompts stay on decode, the 39 others move KV.
    assert row(39, 1024)["requests_without_transfer"] == 0
    assert "25 of 64 prompts of at most local_prefill_max_tokens = 1024" in row(39, 1024)["notes"]
    assert row(30, 1024)["requests_without_transfer"] == 9
    assert row(60, 0)["requests_without_transfer"] == 4  # always split: every request moves KV
    assert row(0, 4096)["requests_without_transfer"] is None  # all of the mix is prefilled on decode


def test_a_mixed_sweep_writes_the_requests_file_vllm_reads(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cluster = FakeCluster()
    read: list[list[dict[str, Any]]] = []

    def run(command: list[str], check: bool, env: dict[str, str]) -> None:
        dataset = Path(command[command.index("--dataset-path") + 1])
        read.append([json.loads(line) for line in dataset.read_text().splitlines()])
        out = Path(command[command.index("--result-dir") + 1])
        (out / command[command.index("--result-filename") + 1]).write_text(json.dumps(RESULT))

    monkeypatch.setattr(bench, "worker_pods", lambda s: {"decode": [{"metadata": {"name": "w-decode"}}]})
    monkeypatch.setattr(bench, "metrics_text", lambda namespace, pod: "")
    monkeypatch.setattr(bench, "port_forward", cluster.port_forward)
    monkeypatch.setattr(bench, "endpoint_key", lambda s: None)
    monkeypatch.setattr("tools.bench.subprocess.run", run)
    monkeypatch.setattr(time, "sleep", cluster.sleep)
    point = bench_results.Point(bench_mixed.mixed_input_len(4096), 1)
    bench.sweep(Settings(max_model_len=4096), [point], 16, 64, tmp_path, workload=bench.MIXED)
    assert [(r["input_length"], r["output_length"]) for r in read[0]] == bench_mixed.mixed_lengths(64, 4096)
