"""The Ray Serve LLM application, serveConfigV2: pd_application.yaml filled in with the settings.

P/D mode builds it with build_pd_openai_app, a prefill and a decode LLMConfig; aggregated mode
with build_openai_app, one LLMConfig. Serve's per-deployment options are deployments.py's.
"""

from __future__ import annotations

from typing import Any

import yaml

from serve_config import DECODE, PREFILL, SIDES, data_file, deployments
from serve_config.endpoint_keys import (
    ENGINE_LOGGING_HOOK,
    NIXL_INCARNATION_CALLBACK,
    SETUP_HOOK_ENV,
    ingress_cls_config,
)
from settings import Settings, sizing


def application_data() -> dict[str, Any]:
    """A copy of pd_application.yaml."""
    return data_file("pd_application.yaml")


def kv_buffer_device(settings: Settings) -> str:
    """Where NIXL stages KV blocks: GPU memory only where EFA can reach it (GPUDirect RDMA)."""
    return "cuda" if settings.gpu_instance.gpudirect_rdma else "cpu"


def ingress_deployment_config() -> dict[str, Any]:
    """The OpenAI ingress's structural Serve options in the builder's args: one replica, its home on the
    ingress worker group (pd_application.yaml). Its bounds and drain are in `deployments`."""
    config: dict[str, Any] = application_data()["ingress"]["deployment_config"]
    return config


# vLLM reads the KV cache layout from this variable (vllm/envs.py); its Ray workers copy it.
KV_LAYOUT_ENV = "VLLM_KV_CACHE_LAYOUT"


def llm_config(settings: Settings, side: str) -> dict[str, Any]:
    """The Ray LLMConfig of one side, as the dict serveConfigV2 carries."""
    data = application_data()
    config: dict[str, Any] = data["llm_config"]
    engine = config["engine_kwargs"]
    engine["max_model_len"] = settings.max_model_len
    engine["gpu_memory_utilization"] = settings.gpu_memory_utilization
    if settings.model.reasoning_parser:
        # Ray 2.58 hands an AsyncEngineArgs field to the engine (vllm_models.py from_llm_config) and vLLM's chat
        # serving reads it from there (api_server.py init_app_state): a thinking model's thinking comes back in
        # `reasoning`, not as a <think> block in `content`. The parser changes no prompt (vLLM applies it after the
        # template), so the sides still render the same one; prefill's one-token answer is discarded.
        engine["reasoning_parser"] = settings.model.reasoning_parser
    kv = engine["kv_transfer_config"]
    kv["engine_id"] = data["sides"][side]["engine_id"]
    kv["kv_buffer_device"] = kv_buffer_device(settings)
    step = sizing.prefill_max_num_batched_tokens(settings)
    if side == PREFILL and step is not None:
        engine["max_num_batched_tokens"] = step
    tp = settings.tensor_parallel_size(side)
    engine["tensor_parallel_size"] = tp
    # vLLM's and NIXL's logging set up before Serve's in the replica, or a restarted controller replaces the engine
    # (ray_pods/engine_logging.py). Ray runs a runtime_env's `worker_process_setup_hook` only for the job's
    # (ray.init turns it into this variable); an actor's runtime_env carries the variable itself.
    config["runtime_env"] = {"env_vars": {SETUP_HOOK_ENV: ENGINE_LOGGING_HOOK}}
    # One bundle per GPU of the tensor-parallel group. The side's resource rides on the
    # first only: each worker pod advertises one unit, and STRICT_PACK keeps the group's
    # other bundles on that same Ray node, the pod that holds the group's GPUs.
    (first,) = config["placement_group_config"]["bundles"]
    first[side] = 1
    config["placement_group_config"]["bundles"] = [first] + [{"GPU": 1} for _ in range(tp - 1)]
    if settings.prefill_tensor_parallel_size != settings.decode_tensor_parallel_size:
        # vLLM 0.26 NixlConnector (nixl/base_worker.py, _validate_remote_agent_handshake): a TP
        # mismatch splits KV heads and needs the HND layout on both sides. The connector asks for
        # HND on CUDA itself (nixl/connector.py, get_required_kvcache_layout); pinning it here
        # keeps an image-level VLLM_KV_CACHE_LAYOUT=NHD from breaking the handshake.
        config["runtime_env"]["env_vars"][KV_LAYOUT_ENV] = "HND"
    config["model_loading_config"] = {
        "model_id": settings.model_id,
        "model_source": settings.model_source or settings.model_id,
    }
    config["accelerator_type"] = settings.gpu_instance.ray_accelerator_type
    # A NIXL engine id of its own for each start of the engine (ray_pods/nixl_incarnation.py).
    config["callback_config"] = {"callback_class": NIXL_INCARNATION_CALLBACK}
    # Serve's replica, queue and drain options are in the application's `deployments`
    # (serve_config/deployments.py): here, only what never changes with a bound.
    fixed = data["sides"][side].get("deployment_config")
    if fixed:
        config["deployment_config"] = fixed
    if data["sides"][side]["experimental_configs"]:
        config["experimental_configs"] = data["sides"][side]["experimental_configs"]
    return config


def aggregated_llm_config(settings: Settings) -> dict[str, Any]:
    """The one LLMConfig of aggregated mode: the sides' config without KV transfer or side resources."""
    config = llm_config(settings, PREFILL)
    del config["engine_kwargs"]["kv_transfer_config"]
    config["engine_kwargs"].pop("max_num_batched_tokens", None)
    config.pop("experimental_configs", None)
    config.pop("callback_config", None)
    # Like with like: the replicas stream to clients with decode's batching interval.
    interval = application_data()["sides"][DECODE]["experimental_configs"].get("stream_batching_interval_ms")
    if interval is not None:
        config["experimental_configs"] = {"stream_batching_interval_ms": interval}
    for bundle in config["placement_group_config"]["bundles"]:
        bundle.pop(PREFILL, None)
    config.pop("deployment_config", None)
    return config


def serve_application(settings: Settings) -> dict[str, Any]:
    """One Serve application: build_pd_openai_app, or build_openai_app in aggregated mode."""
    data = application_data()
    app: dict[str, Any] = data["application"]
    if settings.serving_mode == "aggregated":
        app["import_path"] = data["aggregated_import_path"]
        app["args"] = {"llm_configs": [aggregated_llm_config(settings)]}
    else:
        app["args"] = {f"{side}_config": llm_config(settings, side) for side in SIDES}
    app["args"]["ingress_cls_config"] = ingress_cls_config(settings)
    app["args"]["ingress_deployment_config"] = ingress_deployment_config()
    app["deployments"] = deployments.serve_deployments(settings)
    return app


def serve_config(settings: Settings) -> dict[str, Any]:
    """The document serveConfigV2 holds (Ray Serve's ServeDeploySchema).

    Serve's proxy ends a request, a stream included, after request_timeout_s: 408 when nothing
    was sent yet, a cut stream otherwise (serve/_private/proxy_response_generator.py). Serve
    applies http_options when it starts, so a changed timeout reaches a running cluster only
    with its next Serve start (serve_head.py validate_http_options warns).
    """
    return {
        "http_options": {"request_timeout_s": settings.request_timeout_seconds},
        "applications": [serve_application(settings)],
    }


def serve_config_v2(settings: Settings) -> str:
    """serveConfigV2 as YAML text, as KubeRay expects it."""
    return yaml.safe_dump(serve_config(settings), sort_keys=False)
