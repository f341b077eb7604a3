"""The rehearsal's bad requests: the set it sends, and what counts as OpenAI's error shape."""

from __future__ import annotations

import json

from rehearsal.bad_requests import INTERNALS, TEN_MB, bad_requests_check, cases, openai_error
from rehearsal.case_settings import CASE_SETTINGS
from rehearsal.cases import CASE_PHASES
from rehearsal.checks import bench, verify_checks
from rehearsal.disconnects import busy
from settings import settings_from, sizing
from tests.conftest import PROJECT_CONTEXT


def test_every_bad_request_the_issue_names_is_sent() -> None:
    sent = {name: (body, kind) for name, body, kind in cases("Qwen/Qwen3-8B")}
    assert set(sent) == {
        "a prompt longer than max_model_len",
        "max_tokens 0",
        "max_tokens negative",
        "max_tokens beyond the context",
        "malformed JSON",
        "an unknown model",
        "a wrong content type",
        "a 10 MB body",
        "an empty messages list",
        "kv_transfer_params asking decode to hold KV",
        "kv_transfer_params naming a remote prefill",
        "kv_transfer_params in vllm_xargs",
    }
    assert len(sent["a 10 MB body"][0]) > TEN_MB
    assert sent["a wrong content type"][1] == "text/plain"
    assert json.loads(sent["an empty messages list"][0])["messages"] == []


def test_openais_error_shape_is_required_not_just_a_status() -> None:
    assert openai_error('{"error": {"message": "bad", "type": "invalid_request_error", "code": 400}}')
    for other in ('{"detail": "Not Found"}', "Internal Server Error", '{"error": "bad"}', '{"error": {"message": ""}}'):
        assert not openai_error(other), other


def test_the_pd_case_sends_them_after_verify_and_before_the_bench() -> None:
    phases = CASE_PHASES["pd"]
    assert phases.index(verify_checks) < phases.index(bad_requests_check) < phases.index(bench)


def test_the_disconnect_phase_reads_each_gauge_summed_over_engines() -> None:
    text = (
        "# HELP ray_vllm_kv_cache_usage_perc KV-cache usage.\n"
        'ray_vllm_kv_cache_usage_perc{ReplicaId="a",model_name="Qwen/Qwen3-8B"} 0.25\n'
        'ray_vllm_kv_cache_usage_perc{ReplicaId="b",model_name="Qwen/Qwen3-8B"} 0.5\n'
        'ray_vllm_num_requests_running{ReplicaId="a"} 3.0\n'
        'ray_vllm_num_requests_waiting_by_reason{reason="capacity"} 7.0\n'
    )
    assert busy(text) == {
        "ray_vllm_kv_cache_usage_perc": 0.75,
        "ray_vllm_num_requests_running": 3.0,
        "ray_vllm_num_requests_waiting": 0.0,
    }


def test_an_error_naming_a_replicas_actor_pid_or_ip_is_not_a_refusal() -> None:
    leaked = "Internal exception: ray::ServeReplica:llm:Decode.chat() (pid=4242, ip=10.1.2.3)"
    assert INTERNALS.search(leaked)
    assert not INTERNALS.search("This model's maximum context length is 8192 tokens. However, you requested 12010.")


def test_the_pd_case_deploys_below_the_default_threshold_so_the_phase_also_runs_at_the_default() -> None:
    """The phase sends its set at the deployed threshold and again at the product's default when they differ
    (bad_requests._thresholds): the pd case's 0 splits every request, the default counts each prompt first."""
    deployed = settings_from({**PROJECT_CONTEXT, **CASE_SETTINGS["pd"]})
    assert sizing.local_prefill_threshold(deployed) == 0
    assert sizing.local_prefill_threshold(settings_from(PROJECT_CONTEXT)) > 0
    assert "team-b" in deployed.pd_prefill_header_keys, "the key in force after the key phase's rotation"
