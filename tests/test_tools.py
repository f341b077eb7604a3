"""verify, bench and plan: their parsing and their outputs, on recorded samples (no cluster here)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from serve_config.application import serve_config_v2
from settings import Settings, settings_from_cli
from settings.catalog import IMAGE_MIN_NVIDIA_DRIVER
from tests.conftest import ROOT, require_serve_deps
from tools import bench, bench_compare, bench_results, plan
from tools.bench_compare import goodput
from tools.checks import Check, driver_check, nixl_log_findings, table
from tools.cluster_access import NixlSnapshot, metric_total
from tools.polling import grew, poll, poll_until_grown
from tools.verify_judgement import metrics_check, no_nixl_check, placement_check, prefill_check, served_check

DATA = Path(__file__).parent / "data"


def test_good_worker_logs_show_libfabric_and_no_fallback() -> None:
    findings = nixl_log_findings((DATA / "ray_logs_libfabric.txt").read_text())
    assert findings.instantiated == {"LIBFABRIC"}
    assert findings.problems == []


def test_fallback_logs_are_caught() -> None:
    problems = nixl_log_findings((DATA / "ray_logs_fallback.txt").read_text()).problems
    assert any("no 'Backend LIBFABRIC was instantiated'" in p for p in problems)
    assert any("skipped backend registration: ['LIBFABRIC']" in p for p in problems)
    assert any("UCX backend" in p for p in problems)
    assert any("TCP/sockets provider" in p for p in problems)


def test_ray_exported_nixl_metrics_are_read() -> None:
    before = NixlSnapshot.of((DATA / "decode_metrics_before.prom").read_text())
    after = NixlSnapshot.of((DATA / "decode_metrics_after.prom").read_text())
    assert (before.transfers, after.transfers) == (4.0, 5.0)
    assert after.transfer_seconds == pytest.approx(0.498)
    assert after.failed == 0.0
    assert metrics_check(before, after).ok
    assert not metrics_check(after, after).ok  # no transfer: the request fell back to local prefill
    failed = NixlSnapshot(after.transfers + 1, after.transfer_seconds, 1.0)
    assert not metrics_check(before, failed).ok


def test_vllm_native_metric_names_are_read_too() -> None:
    text = 'vllm:nixl_xfer_time_seconds_count{engine="0"} 7.0\nvllm:nixl_xfer_time_seconds_count{engine="1"} 2.0\n'
    assert metric_total(text, "vllm:nixl_xfer_time_seconds_count") == 9.0
    assert metric_total(text, "vllm:nixl_num_failed_transfers") is None


def _pod(name: str, group: str, node: str, efa: str = "1") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"ray.io/group": group}},
        "spec": {"nodeName": node, "containers": [{"resources": {"limits": {"vpc.amazonaws.com/efa": efa}}}]},
        "status": {"phase": "Running"},
    }


def _node(zone: str, efa: str = "1") -> dict[str, Any]:
    return {
        "metadata": {"labels": {"topology.kubernetes.io/zone": zone}},
        "status": {"allocatable": {"vpc.amazonaws.com/efa": efa}},
    }


def test_placement_passes_on_two_efa_nodes_in_one_az() -> None:
    groups = {"prefill": [_pod("p", "prefill", "n1")], "decode": [_pod("d", "decode", "n2")]}
    check = placement_check(groups, {"n1": _node("us-east-1c"), "n2": _node("us-east-1c")})
    assert check.ok, check.detail


@pytest.mark.parametrize(
    ("groups", "nodes", "expected"),
    [
        (
            {"prefill": [_pod("p", "prefill", "n1")], "decode": [_pod("d", "decode", "n1")]},
            {"n1": _node("a")},
            "share nodes",
        ),
        (
            {"prefill": [_pod("p", "prefill", "n1")], "decode": [_pod("d", "decode", "n2")]},
            {"n1": _node("a"), "n2": _node("b")},
            "span AZs",
        ),
        (
            {"prefill": [_pod("p", "prefill", "n1", efa="0")], "decode": [_pod("d", "decode", "n2")]},
            {"n1": _node("a"), "n2": _node("a")},
            "no EFA device",
        ),
        ({"prefill": [_pod("p", "prefill", "n1")]}, {"n1": _node("a")}, "no running decode"),
    ],
    ids=["same-node", "two-azs", "no-efa", "no-decode"],
)
def test_placement_failures(groups: dict[str, Any], nodes: dict[str, Any], expected: str) -> None:
    check = placement_check(groups, nodes)
    assert not check.ok
    assert expected in check.detail


def test_table_marks_failures() -> None:
    text = table([Check("a", True, "fine"), Check("longer name", False, "broken")])
    assert "PASS" in text.splitlines()[2]
    assert "FAIL" in text.splitlines()[3]


def test_bench_row_csv_and_chart(tmp_path: Path) -> None:
    result = json.loads((DATA / "vllm_bench_result.json").read_text())
    before = NixlSnapshot.of((DATA / "decode_metrics_before.prom").read_text())
    after = NixlSnapshot.of((DATA / "decode_metrics_after.prom").read_text())
    rows = [
        bench_results.row(bench_results.Point(2048, 4), result, before, after),
        bench_results.row(bench_results.Point(512, 4), {**result, "median_ttft_ms": 300.0}, before, after),
        bench_results.row(bench_results.Point(2048, 1), {**result, "median_ttft_ms": 700.0}, before, before),
    ]
    assert rows[0]["median_ttft_ms"] == 987.1
    assert rows[0]["nixl_transfers"] == 1.0
    assert rows[0]["nixl_ms_per_transfer"] == pytest.approx(86.0)
    assert rows[2]["nixl_ms_per_transfer"] is None
    bench_results.write_csv(rows, tmp_path / "results.csv")
    with (tmp_path / "results.csv").open() as handle:
        assert len(list(csv.DictReader(handle))) == 3
    bench_results.write_chart(rows, tmp_path / "results.png", "test")
    assert (tmp_path / "results.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.serve
@pytest.mark.parametrize("workload", bench.WORKLOADS)
def test_bench_flags_exist_in_the_installed_vllm(tmp_path: Path, workload: str) -> None:
    """Every flag bench passes is one `vllm bench serve` of the image's vLLM accepts, for each workload."""

    require_serve_deps()
    command = bench.bench_command(
        base_url="http://127.0.0.1:1", model="m", point=bench_results.Point(1, 1), output_len=1,
        num_prompts=1, result_dir=tmp_path, result_file="r.json", workload=workload,
    )  # fmt: skip
    assert command[:3] == [sys.executable, "-m", "tools.vllm_bench"]
    help_text = subprocess.run(
        [*command[:3], "--help=all"], capture_output=True, text=True, timeout=300, check=False, cwd=ROOT
    ).stdout
    assert "--random-input-len" in help_text
    flags = [arg for arg in command[3:] if arg.startswith("--")]
    missing = [flag for flag in flags if f"{flag} " not in help_text and f"{flag}\n" not in help_text]
    assert missing == []


def test_a_shared_prefix_point_keeps_its_length_in_a_few_long_prefixes(tmp_path: Path) -> None:
    command = bench.bench_command(
        base_url="http://x", model="m", point=bench_results.Point(2048, 4), output_len=64,
        num_prompts=64, result_dir=tmp_path, result_file="r.json", workload=bench.SHARED_PREFIX,
    )  # fmt: skip

    def flag(name: str) -> str:
        return command[command.index(name) + 1]

    assert flag("--dataset-name") == "prefix_repetition" and "--random-input-len" not in command
    prefix, suffix = int(flag("--prefix-repetition-prefix-len")), int(flag("--prefix-repetition-suffix-len"))
    assert (prefix, prefix + suffix) == (1536, 2048)
    assert flag("--prefix-repetition-num-prefixes") == "4" and flag("--prefix-repetition-output-len") == "64"


def test_plan_prints_the_budget(capsys: pytest.CaptureFixture[str]) -> None:
    assert plan.main(["-c", "max_model_len=4096"]) == 0
    out = capsys.readouterr().out
    assert "147,456 bytes per prompt token" in out
    assert "Estimated cost" in out
    with pytest.raises(SystemExit) as stopped:
        plan.main(["-c", "gpu_instance_type=nope"])
    assert stopped.value.code == 2


def test_plan_prints_the_scale_up_budget_term_by_term_and_the_cost_range(capsys: pytest.CaptureFixture[str]) -> None:
    """`make plan` with decode scaling 1 -> 3: every term of the time to add a replica on a new GPU node, each
    with its source, the total, and the hourly cost at 2 and at 4 GPU nodes (numbers: tests/test_estimates.py)."""
    assert plan.main(["-c", "decode_max_replicas=3", "-c", "decode_target_ongoing_requests=8"]) == 0
    out = capsys.readouterr().out
    budget = out.split("One more replica on a new GPU node (g6.8xlarge), term by term:\n", 1)[1]
    lines = budget.splitlines()
    terms = [line for line in lines if line.startswith("  ") and " s  " in line]
    assert [line.split("  ")[1] for line in terms] == [
        "Serve sees the load",
        "Ray adds the pod, Cluster Autoscaler the node",
        "g6.8xlarge launch and node join",
        "image pull (~20 GB, parallel)",
        "weights (16.4 GB)",
        "engine start",
        "Serve sees the load",
        "Ray adds the pod",
        "placeholder preempted, pod started",
        "weights (16.4 GB)",
        "engine start",
    ]
    assert "AWS ML Blog" in budget and "measured on CPU" in budget and "kubernetes/autoscaler FAQ" in budget
    totals = [line for line in lines if line.split()[0] == "total"]
    assert "6.4-10.9 min" in totals[0] and "1.6-3.9 min" in totals[1]
    assert "with a standard image pull (240-360 s): 8.6-14.2 min" in budget
    assert "~$4.68 at the minimum (2 GPU nodes), ~$8.72 at the maximum (4 GPU nodes)" in budget
    assert "Estimated cost: ~$4.68/h at the minimum (2 GPU nodes) to ~$8.72/h at the maximum (4 GPU nodes)" in out


def test_default_settings_object_is_what_tools_load() -> None:
    assert settings_from_cli([]) == Settings()


# --- the fabric proved positively ------------------------------------


def test_the_efa_rails_line_is_required_and_tcp_fails_the_default() -> None:
    text = (DATA / "ray_logs_libfabric.txt").read_text()
    assert nixl_log_findings(text).rail_providers == {"efa"}
    # Without NIXL's INFO line nothing proves the fabric: the absence of a TCP line is not proof.
    silent = "\n".join(line for line in text.splitlines() if "rails using" not in line)
    assert any("provider=efa" in p for p in nixl_log_findings(silent).problems)
    on_tcp = text.replace("provider=efa", "provider=tcp")
    assert any("not efa" in p for p in nixl_log_findings(on_tcp).problems)
    assert nixl_log_findings(on_tcp, expected_provider="tcp").problems == []


def test_driver_check_against_the_images_cuda() -> None:
    assert driver_check({"p": "580.159.03\n", "d": "580.159.03"}, IMAGE_MIN_NVIDIA_DRIVER).ok
    old = driver_check({"p": "570.86.15"}, IMAGE_MIN_NVIDIA_DRIVER)
    assert not old.ok and "570.86.15 < 580" in old.detail
    assert not driver_check({"p": "NVIDIA-SMI has failed"}, IMAGE_MIN_NVIDIA_DRIVER).ok
    assert not driver_check({}, IMAGE_MIN_NVIDIA_DRIVER).ok


def test_counters_are_polled_until_they_grow() -> None:
    readings = iter([NixlSnapshot(4, 0.4, 0), NixlSnapshot(4, 0.4, 0), NixlSnapshot(5, 0.5, 0)])
    slept: list[float] = []
    after = poll_until_grown(lambda: next(readings), NixlSnapshot(4, 0.4, 0), sleep=slept.append)
    assert after.transfers == 5 and slept == [2.0, 2.0]
    # Never grows: gives up after the timeout, having waited about 30 s of Ray's export interval.
    slept.clear()
    stuck = poll_until_grown(lambda: NixlSnapshot(4, 0.4, 0), NixlSnapshot(4, 0.4, 0), sleep=slept.append)
    assert stuck.transfers == 4 and sum(slept) == pytest.approx(30.0)


def test_prefill_must_have_served() -> None:
    assert prefill_check(100.0, 612.0).ok
    assert not prefill_check(100.0, 100.0).ok
    assert not prefill_check(None, None).ok


# --- no cluster, one line -----------------------------------------------


@pytest.mark.parametrize("tool", ["verify", "bench"])
def test_without_a_cluster_the_tools_end_in_one_line(tmp_path: Path, tool: str) -> None:
    env = {**os.environ, "KUBECONFIG": str(tmp_path / "missing"), "HOME": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-m", f"tools.{tool}"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert "aws eks update-kubeconfig --name pd-inference" in lines[0]


def test_prefill_tokens_are_polled_until_they_grow() -> None:
    readings = iter([None, 1.0, 1.0, 180.0])
    slept: list[float] = []
    assert poll(lambda: next(readings), grew(1.0), sleep=slept.append) == 180.0
    assert slept == [2.0, 2.0, 2.0]
    assert grew(None)(1.0) and not grew(1.0)(1.0) and not grew(None)(None)


# --- bench compare, on crafted result sets whose answer is known -------------------------------
def _result_set(folder: Path, mode: str, points: dict[tuple[int, int], tuple[float, float, float]]) -> Path:
    """A bench folder: per point (TTFT s, inter-token s, throughput tok/s) for 10 requests over 10 s."""
    folder.mkdir(parents=True)
    (folder / "metadata.json").write_text(json.dumps({"serving_mode": mode}))
    rows = []
    for (n, c), (ttft, itl, throughput) in points.items():
        result = {"duration": 10.0, "ttfts": [ttft] * 10, "itls": [[itl] * 15] * 10, "errors": [""] * 10}
        (folder / f"run-{n}-{c}.json").write_text(json.dumps(result))
        rows.append(
            {
                "input_len": n, "concurrency": c, "completed": 10, "median_ttft_ms": ttft * 1e3,
                "p99_ttft_ms": ttft * 1.2e3, "median_itl_ms": itl * 1e3, "p99_itl_ms": itl * 1.5e3,
                "output_throughput": throughput, "request_throughput": 1.0,
                "nixl_transfers": 10 if mode == "disaggregated" else 0, "nixl_ms_per_transfer": None, "nixl_failed": 0,
            }
        )  # fmt: skip
    bench_results.write_csv(rows, folder / "results.csv")
    return folder


GOOD, SLOW_TTFT = (0.5, 0.05, 100.0), (3.0, 0.05, 100.0)


@pytest.mark.parametrize(
    ("pd", "agg", "expected"),
    [
        ({(512, 1): GOOD, (4096, 8): GOOD}, {(512, 1): SLOW_TTFT, (4096, 8): SLOW_TTFT}, "disaggregated wins at every"),
        ({(512, 1): SLOW_TTFT, (4096, 8): SLOW_TTFT}, {(512, 1): GOOD, (4096, 8): GOOD}, "aggregated wins at every"),
        (
            {(512, 1): SLOW_TTFT, (4096, 8): GOOD},
            {(512, 1): GOOD, (4096, 8): SLOW_TTFT},
            "split: disaggregated wins at 4096 tokens x 8; aggregated wins at 512 tokens x 1",
        ),
        (
            {(512, 1): SLOW_TTFT, (4096, 8): GOOD},
            {(512, 1): GOOD, (4096, 8): GOOD},
            "aggregated wins at 512 tokens x 1; no difference beyond 5% at 4096 tokens x 8",
        ),
    ],
    ids=["pd-wins", "pd-loses", "split", "one-win-one-tie"],
)
def test_compare_gives_the_known_verdict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], pd: Any, agg: Any, expected: str
) -> None:
    a = _result_set(tmp_path / "pd", "disaggregated", pd)
    b = _result_set(tmp_path / "agg", "aggregated", agg)
    assert bench.main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert f"verdict: {expected}" in out
    assert (a / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with (a / "compare.csv").open() as handle:
        assert len(list(csv.DictReader(handle))) == 2
    # Under a looser TTFT SLO both meet it everywhere: throughput is equal, so no winner.
    assert bench_compare.main([str(a), str(b), "--ttft-slo-ms", "5000"]) == 0
    assert "no difference beyond 5% at any load point" in capsys.readouterr().out


def test_goodput_counts_only_requests_within_both_slos_and_without_errors() -> None:
    result = {
        "duration": 2.0,
        "ttfts": [0.1, 0.1, 3.0, 0.1],
        "itls": [[0.01, 0.03], [0.5], [0.01], [0.01]],
        "errors": ["", "", "", "timeout"],
    }
    assert goodput(result, 2000, 100) == 0.5  # only the first: slow ITL, slow TTFT, an error
    assert goodput({"duration": 1.0}, 2000, 100) is None


def test_bench_labels_the_result_with_the_live_mode() -> None:
    import yaml

    for mode in ("disaggregated", "aggregated"):
        config = yaml.safe_load(serve_config_v2(Settings(serving_mode=mode)))
        described = bench.describe_serve_config(config)
        assert described["serving_mode"] == mode
        assert described["model_id"] == "Qwen/Qwen3-8B"
    pd = bench.describe_serve_config(yaml.safe_load(serve_config_v2(Settings())))
    assert pd["replicas"] == {"prefill": 1, "decode": 1}
    assert pd["engine_kwargs"]["prefill"]["max_num_batched_tokens"] == 8192
    # The threshold as decode's user_config holds it: the label tells selective P/D from always-split.
    assert pd["local_prefill_max_tokens"] == 4096
    assert bench_compare.mode_label(pd) == "selective P/D (<= 4096)"
    split = bench.describe_serve_config(yaml.safe_load(serve_config_v2(Settings(local_prefill_max_tokens=0))))
    assert bench_compare.mode_label(split) == "disaggregated"
    aggregated = bench.describe_serve_config(yaml.safe_load(serve_config_v2(Settings(serving_mode="aggregated"))))
    assert bench_compare.mode_label(aggregated) == "aggregated"


def test_aggregated_verify_wants_no_nixl_at_all() -> None:
    quiet = 'ray_vllm_prompt_tokens_total{model_name="m"} 12.0\n'
    assert no_nixl_check({"w1": quiet, "w2": quiet}, {"w1": "", "w2": ""}).ok
    nixl_metrics = (DATA / "decode_metrics_after.prom").read_text()
    assert not no_nixl_check({"w1": quiet, "w2": nixl_metrics}, {}).ok
    logs = (DATA / "ray_logs_libfabric.txt").read_text()
    assert "NIXL backend" in no_nixl_check({"w1": quiet}, {"w1": logs}).detail
    assert served_check(0.0, 12.0).ok and not served_check(12.0, 12.0).ok and not served_check(None, None).ok
