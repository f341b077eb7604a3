"""A restarted controller keeps engine replicas whose vLLM and NIXL logging start first (ray_pods/engine_logging.py).

Serve 2.58's controller, starting again after a lost head, recovers each replica it finds by calling the replica
actor's `is_allocated` (serve/_private/deployment_state.py, `recover_current_state_from_replica_actor_name`); if
that call raises, it replaces the replica. Here two Serve replicas do what an engine replica does when its engine
starts (import vLLM, and NIXL through vLLM's NixlConnector), one with the serve config's engine runtime_env, one
without. The tests call `is_allocated` on each as the recovering controller does, then restart the controller
itself. The rehearsal's head-loss case shows the same on the product's real app (rehearsal/head_loss.py).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from ray_pods.engine_logging import UCX_RCACHE_ENV, UCX_RCACHE_VALUE
from serve_config.endpoint_keys import ENGINE_LOGGING_HOOK, SETUP_HOOK_ENV
from tests.conftest import ROOT, rayservice_from, synth

# A restarted controller recovers the replicas it finds within seconds (its log, "Recovering Replica").
RECOVERY_LIMIT_S = 60.0

pytestmark = [pytest.mark.serve, pytest.mark.xdist_group("ray"), pytest.mark.private_internals]


def _app(template: dict[str, Any]) -> dict[str, Any]:
    (app,) = yaml.safe_load(rayservice_from(template)["spec"]["serveConfigV2"])["applications"]
    result: dict[str, Any] = app
    return result


def _built_engine_runtime_envs(app: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each engine deployment's replica runtime_env, as Ray's own builder makes it from the serve config."""
    from ray.serve._private.build_app import build_app
    from ray.serve.llm import build_openai_app, build_pd_openai_app

    builder = build_pd_openai_app if app["import_path"].endswith("build_pd_openai_app") else build_openai_app
    built = build_app(builder(app["args"]), name="llm")
    return {
        d.name: d._replica_config.ray_actor_options["runtime_env"]
        for d in built.deployments
        if d.name.startswith(("Prefill:", "Decode:", "LLMServer:"))
    }


@pytest.mark.parametrize("overrides", [{}, {"serving_mode": "aggregated"}], ids=["pd", "aggregated"])
def test_ray_builds_every_engine_replica_with_the_hook(overrides: dict[str, Any], local_ray: None) -> None:
    envs = _built_engine_runtime_envs(_app(synth(**overrides)))
    assert len(envs) == (2 if not overrides else 1), envs
    hooks = {name: env.get("env_vars", {}).get(SETUP_HOOK_ENV) for name, env in envs.items()}
    assert hooks == dict.fromkeys(envs, ENGINE_LOGGING_HOOK)


def test_the_variable_is_the_one_rays_worker_reads() -> None:
    from ray._private import ray_constants
    from ray._private.workers import default_worker

    assert SETUP_HOOK_ENV == ray_constants.WORKER_PROCESS_SETUP_HOOK_ENV_VAR
    assert "WORKER_PROCESS_SETUP_HOOK_ENV_VAR" in Path(default_worker.__file__).read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def engine_like_replicas(local_ray: None) -> Iterator[dict[str, Any]]:
    """One replica with the decode side's runtime_env from the synthesized serve config, one with none."""
    import ray
    from ray import serve
    from ray.serve.api import RunTarget

    runtime_env = _app(synth())["args"]["decode_config"]["runtime_env"]
    # The pods put ray_pods on PYTHONPATH (serve_config/pod_templates.py); the hook runs before Ray adds the driver's.
    runtime_env["env_vars"]["PYTHONPATH"] = str(ROOT)

    @serve.deployment(graceful_shutdown_timeout_s=1)
    class EngineLike:
        def __init__(self) -> None:
            # What an engine replica imports when its engine starts, after Serve set up the replica's logger:
            # vLLM, and NIXL as vLLM's NixlConnector loads it.
            from vllm.distributed.nixl_utils import NixlWrapper

            self.ucx_rcache = os.environ.get(UCX_RCACHE_ENV)
            self.nixl = NixlWrapper is not None

        def __call__(self) -> dict[str, Any]:
            """How many of Serve's log records this replica holds unwritten, and what vLLM saw of NIXL."""
            import logging.handlers

            serve_logger = logging.getLogger("ray.serve")
            memory = [h for h in serve_logger.handlers if isinstance(h, logging.handlers.MemoryHandler)]
            return {"held": sum(len(h.buffer) for h in memory), "ucx_rcache": self.ucx_rcache, "nixl": self.nixl}

    options = {"hooked": {"num_cpus": 0, "runtime_env": runtime_env}, "bare": {"num_cpus": 0}}
    serve.start()
    try:
        serve.run_many(
            [
                RunTarget(EngineLike.options(ray_actor_options=opts).bind(), name=name, route_prefix=None)  # type: ignore[attr-defined]
                for name, opts in options.items()
            ]
        )
        actors = {
            name: ray.get_actor(entry["name"], namespace=entry["namespace"])
            for entry in ray.util.list_named_actors(all_namespaces=True)
            for name in options
            if entry["name"].startswith(f"SERVE_REPLICA::{name}#")
        }
        assert set(actors) == set(options), actors
        yield actors
    finally:
        serve.shutdown()


def test_a_recovering_controller_can_ask_a_hooked_replica(engine_like_replicas: dict[str, Any]) -> None:
    import ray

    *_, log_path = ray.get(engine_like_replicas["hooked"].is_allocated.remote(), timeout=60)
    assert isinstance(log_path, str) and log_path.endswith(".log"), log_path


def test_serves_log_records_are_written_not_kept(engine_like_replicas: dict[str, Any]) -> None:
    """Each request logs through Serve's handler; with its target closed the records pile up in the replica."""
    from ray import serve

    seen = {}
    for app in ("hooked", "bare"):
        handle = serve.get_app_handle(app)
        seen[app] = [handle.remote().result(timeout_s=60) for _ in range(20)][-1]
    assert seen["hooked"]["held"] <= 1 and seen["bare"]["held"] >= 20, seen


def test_nixl_loads_with_vllms_ucx_setting_in_both(engine_like_replicas: dict[str, Any]) -> None:
    """The hook imports NIXL before vLLM does: vLLM's UCX setting must still be in place, and NIXL still load."""
    from ray import serve

    for app in ("hooked", "bare"):
        seen = serve.get_app_handle(app).remote().result(timeout_s=60)
        assert seen["nixl"] and seen["ucx_rcache"] == UCX_RCACHE_VALUE, (app, seen)


def test_without_the_hook_vllm_has_closed_serves_handler(engine_like_replicas: dict[str, Any]) -> None:
    """The defect the hook removes, pinned: a vLLM that stops closing other handlers fails here (drop the hook then)."""
    import ray

    with pytest.raises(ray.exceptions.RayTaskError, match="AttributeError"):
        ray.get(engine_like_replicas["bare"].is_allocated.remote(), timeout=60)


def _replica_names() -> dict[str, set[str]]:
    import ray

    names = [entry["name"] for entry in ray.util.list_named_actors(all_namespaces=True)]
    return {app: {n for n in names if n.startswith(f"SERVE_REPLICA::{app}#")} for app in ("hooked", "bare")}


def test_a_restarted_controller_keeps_the_hooked_replica_and_replaces_the_other(
    engine_like_replicas: dict[str, Any],
) -> None:
    """Serve's own recovery, as after a lost head: the controller actor killed and restarted by Ray (runs last:
    it replaces the module's bare replica)."""
    import ray
    from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE

    before = _replica_names()
    ray.kill(ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE), no_restart=False)
    deadline = time.monotonic() + RECOVERY_LIMIT_S
    after = before
    while time.monotonic() < deadline and after["bare"] & before["bare"]:
        time.sleep(0.5)
        after = _replica_names()
    assert after["hooked"] == before["hooked"], (before, after)
    assert after["bare"] and not after["bare"] & before["bare"], (before, after)
