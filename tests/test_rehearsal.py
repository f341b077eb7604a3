"""The CPU rehearsal's own pieces: the delta set it applies, and how it gets libfabric's source.

The rehearsal itself runs in `make rehearse` (serially, outside pytest's workers).
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from rehearsal import native
from rehearsal.__main__ import CASES
from rehearsal.checks import PREWARM_TRANSFERS
from rehearsal.deploy import (
    CPU_DELTAS,
    FAILURE_DELTAS,
    apply_failure_deltas,
    cpu_serve_config,
    kuberay_auth_env,
    kuberay_headers,
    llm_configs,
    product_head_env,
    product_worker_env,
)
from tests.conftest import shared_file
from tests.support.template_paths import differing_paths
from tools.verify_judgement import prewarm_check

pytestmark = pytest.mark.private_internals


def test_the_rehearsal_changes_exactly_the_documented_cpu_deltas(rayservice: dict[str, Any]) -> None:
    """Any other change to the product's serve config flows into the rehearsal unchanged."""
    product = yaml.safe_load(rayservice["spec"]["serveConfigV2"])
    cpu = cpu_serve_config(rayservice, Path("/models/tiny"))
    changed: set[str] = set()
    for before, after in zip(product["applications"], cpu["applications"], strict=True):
        for key in before["args"]:
            changed |= differing_paths(before["args"][key], after["args"][key])
        assert {k: v for k, v in before.items() if k != "args"} == {k: v for k, v in after.items() if k != "args"}
    assert changed == set(CPU_DELTAS)
    args = cpu["applications"][0]["args"]
    # The product's own NIXL setup is untouched.
    for side in ("prefill", "decode"):
        kv = args[f"{side}_config"]["engine_kwargs"]["kv_transfer_config"]
        assert kv["kv_connector_extra_config"]["backends"] == ["LIBFABRIC"]
        assert kv["kv_buffer_device"] == "cpu" and kv["engine_id"] == side
        assert args[f"{side}_config"]["placement_group_config"]["bundles"] == [{"CPU": 4, side: 1}]


def test_the_rehearsal_uses_the_workers_environment(rayservice: dict[str, Any]) -> None:
    env = product_worker_env(rayservice)
    assert env["NIXL_LOG_LEVEL"] == "INFO" and env["FI_EFA_USE_HUGE_PAGE"] == "0"
    assert env["FI_PROVIDER"] == "efa"  # the rehearsal replaces this one with tcp


def test_the_rehearsal_runs_ray_as_kuberay_does_with_token_authentication(rayservice: dict[str, Any]) -> None:
    """authOptions mode token: RAY_AUTH_MODE and a random token on every node, and KubeRay's header on each call."""
    env = kuberay_auth_env(rayservice)
    assert env["RAY_AUTH_MODE"] == "token"
    assert len(env["RAY_AUTH_TOKEN"]) == 64 and env["RAY_AUTH_TOKEN"] != kuberay_auth_env(rayservice)["RAY_AUTH_TOKEN"]
    assert kuberay_headers(env) == {"x-ray-authorization": f"Bearer {env['RAY_AUTH_TOKEN']}"}
    without = {**rayservice, "spec": {**rayservice["spec"], "rayClusterConfig": {}}}
    assert kuberay_auth_env(without) == {} and kuberay_headers({}) == {}


def test_debian_mirrors_are_read_from_apt_sources(tmp_path: Path) -> None:
    (tmp_path / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm\n\n"
        "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\n"
    )
    (tmp_path / "extra.list").write_text("deb https://other.example/debian bookworm main\n")
    assert native.apt_debian_mirrors(tmp_path) == ["http://mirror.example/debian", "https://other.example/debian"]


@contextlib.contextmanager
def _serve(root: Path) -> Iterator[str]:
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *args: None  # type: ignore[attr-defined]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/debian"
    finally:
        server.shutdown()
        server.server_close()


def test_libfabric_source_is_fetched_from_a_mirror_and_digest_checked(tmp_path: Path) -> None:
    tarball = shared_file(f"sources/{native.LIBFABRIC_TARBALL}")
    pool = tmp_path / "mirror" / "debian" / Path(native.DEBIAN_POOL_PATH).parent
    pool.mkdir(parents=True)
    (pool / native.LIBFABRIC_TARBALL).write_bytes(tarball.read_bytes())
    with _serve(tmp_path / "mirror") as mirror:
        fetched = native.fetch_libfabric_source(tmp_path / "out" / native.LIBFABRIC_TARBALL, [mirror])
    assert fetched.read_bytes() == tarball.read_bytes()


def test_a_libfabric_source_with_another_digest_is_refused(tmp_path: Path) -> None:
    pool = tmp_path / "mirror" / "debian" / Path(native.DEBIAN_POOL_PATH).parent
    pool.mkdir(parents=True)
    (pool / native.LIBFABRIC_TARBALL).write_bytes(b"not libfabric")
    with _serve(tmp_path / "mirror") as mirror, pytest.raises(native.NativeError, match="sha256"):
        native.fetch_libfabric_source(tmp_path / "out" / native.LIBFABRIC_TARBALL, [mirror])
    assert not (tmp_path / "out").exists()


# --- a failure case ends at DEPLOY_FAILED, and the endpoint serves no chat ----------
def test_failure_cases_change_only_the_failure_deltas_which_rays_schema_accepts(rayservice: dict[str, Any]) -> None:
    import copy

    from ray.serve._private.config import DeploymentConfig
    from ray.serve.llm import LLMConfig

    cpu = cpu_serve_config(rayservice, Path("/models/tiny"))
    failing = copy.deepcopy(cpu)
    apply_failure_deltas(failing)
    for (side, before), (_, after) in zip(llm_configs(cpu), llm_configs(failing), strict=True):
        assert differing_paths(before, after) == set(FAILURE_DELTAS), side
        # Ray validates deployment_config with Serve's DeploymentConfig, which ignores a key it does not
        # know: the value must come back out of it.
        validated = DeploymentConfig(**LLMConfig(**after).deployment_config)
        assert validated.max_constructor_retry_count == 1


@pytest.mark.parametrize("name", ["ucx", "wrong-side-channel", "no-plugin"])
def test_a_failure_case_passes_only_with_the_app_failed_and_no_chat_served(name: str) -> None:
    """The line deploy() ends a failure case with: the terminal status and the endpoint's answer are required."""
    import re

    (case,) = [c for c in CASES if c.name == name]
    cause = {
        "ucx": "NIXL transfer failure: handshake_failed",
        "wrong-side-channel": "NIXL transfer failure: handshake_setup_failed",
        "no-plugin": "createBackend: unsupported backend 'LIBFABRIC'",
    }[name]
    at_first_log_line = f"rehearsal FAILED ({name}): deploy failed: an engine could not start or pre-warm: {cause}"
    terminal = (
        f"rehearsal FAILED ({name}): deploy failed: app DEPLOY_FAILED after 150 s, endpoint served no chat "
        f"(chat: no answer in 10 s, /v1/models: HTTP 200); an engine could not start or pre-warm: {cause}"
    )
    served = terminal.replace("endpoint served no chat", "endpoint SERVED chat")
    assert re.search(case.failure, terminal)
    assert not re.search(case.failure, at_first_log_line)
    assert not re.search(case.failure, served)


# --- a failed decode start is retried within a budget -------------------------
RETRY_BUDGET = 10


def test_serve_retries_a_failed_decode_start_ten_times_by_rays_own_rule(
    rayservice: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ray's threshold, min(max_constructor_retry_count, replicas x RAY_SERVE_MAX_PER_REPLICA_RETRY_COUNT),
    computed by Ray's own property with the product's deployment_config and the head's environment:
    decode gets exactly the budget at any replica count (a decode that cannot start fails in bounded
    time), prefill at least the budget."""
    from types import SimpleNamespace

    from ray.serve._private import deployment_state
    from ray.serve._private.config import DeploymentConfig

    per_replica = int(product_head_env(rayservice)["RAY_SERVE_MAX_PER_REPLICA_RETRY_COUNT"])
    monkeypatch.setattr(deployment_state, "MAX_PER_REPLICA_RETRY_COUNT", per_replica)
    args = yaml.safe_load(rayservice["spec"]["serveConfigV2"])["applications"][0]["args"]
    for side in ("decode", "prefill"):
        given = args[f"{side}_config"].get("deployment_config", {})
        config = DeploymentConfig(**given)
        # DeploymentConfig ignores a key it does not know: what the product sets must come back out.
        assert config.max_constructor_retry_count == given.get("max_constructor_retry_count", 20), side
        for replicas in (1, 2, 4):
            target = SimpleNamespace(info=SimpleNamespace(deployment_config=config), target_num_replicas=replicas)
            threshold = deployment_state.DeploymentState._failed_to_start_threshold.fget(
                SimpleNamespace(_target_state=target)
            )
            if side == "decode":
                assert threshold == RETRY_BUDGET, (side, replicas, threshold)
            else:
                assert threshold >= RETRY_BUDGET, (side, replicas, threshold)


# --- what the pre-warm moves, and verify catching a skipped prefill replica ---------


def test_the_prewarm_is_one_prompt_token_so_one_transfer_per_prefill_replica() -> None:
    """The pinned count in the rehearsal's pre-warm probe rests on Ray's pre-warm request."""
    from ray.llm._internal.serve.serving_patterns.prefill_decode import pd_server

    assert (pd_server._PREWARM_PROMPT, pd_server._PREWARM_MAX_TOKENS) == (" x", 1)
    assert PREWARM_TRANSFERS == 1.0


def test_verify_fails_a_prewarm_that_skipped_a_prefill_replica() -> None:
    """The line Ray 2.58 logs when prefill answered the pre-warm with an error, built from Ray's own format string."""
    import inspect
    import re

    from ray.llm._internal.serve.serving_patterns.prefill_decode import pd_server

    (fmt,) = re.findall(
        r'"(\[PDDecodeServer\] P replica %d returned empty kv_params; skipping\.)"', inspect.getsource(pd_server)
    )
    line = f"INFO 2026-12-01 04:44:20,101 llm_Decode {fmt % 0}"
    assert not prewarm_check({"decode-pod": f"[PDDecodeServer] Starting pre-warm\n{line}\n"}).ok
    done = "[PDDecodeServer] Pre-warm complete — all P replicas registered."
    assert prewarm_check({"decode-pod": f"[PDDecodeServer] Starting pre-warm\n{done}\n"}).ok
