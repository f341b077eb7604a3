"""What the product deploys, the CPU deltas, and deploying it the way KubeRay does."""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import tempfile
import time
import urllib.error
from pathlib import Path
from typing import Any

import yaml

from rehearsal.cluster import ray_logs
from rehearsal.network import DASHBOARD, SERVE, RehearsalError, http
from serve_config import SIDES
from settings import project_context
from settings.project import ROOT, STACK_NAME
from tools.polling import EXPORT_INTERVAL_ENV
from tools.template_text import render

# The only changes made to the product's serve config, and why (a test pins this set).
CPU_DELTAS: dict[str, str] = {
    "model_loading_config.model_source": "a tiny Qwen3 made at test time (no hub); model_id stays the product's",
    "accelerator_type": "removed: with an accelerator Ray LLM takes its GPU path ('platform cpu does not support ray')",
    "placement_group_config.bundles[].GPU": "removed, for the same reason; CPU and the side's resource stay",
    "engine_kwargs.enforce_eager": "True: no CUDA graphs or torch.compile warm-up on CPU",
    "engine_kwargs.max_num_batched_tokens": "512: a CPU-sized batch",
    "engine_kwargs.max_num_seqs": "8: a CPU-sized batch",
    "engine_kwargs.dtype": "float32: this CPU has no fast bfloat16 path",
    "engine_kwargs.kv_cache_memory_bytes": (
        "256 MiB (131,072 tokens of the tiny model): vLLM's CPU backend takes whole GiB through "
        "VLLM_CPU_KVCACHE_SPACE, and with 1 GiB vLLM's `init engine (profile, create kv cache, warmup model)` "
        "took 13.5 s, against 4.3 s (one start each)"
    ),
    "runtime_env.env_vars.VLLM_CPU_OMP_THREADS_BIND": "one core per side (0 prefill, 1 decode); aggregated: both",
}
# What a failure case changes beside CPU_DELTAS, and why (a test pins this set). Serve retries a
# replica's constructor min(max_constructor_retry_count, replicas x RAY_SERVE_MAX_PER_REPLICA_RETRY_COUNT)
# times before the deployment is terminally failed (serve/_private/deployment_state.py); a
# failure case needs the terminal state, and one failed start of each side reaches it.
FAILURE_DELTAS: dict[str, str] = {
    "deployment_config.max_constructor_retry_count": "1: the app is DEPLOY_FAILED after one failed start",
}
# What the scaling case changes beside CPU_DELTAS, and why (a test pins this set): Serve's own delays,
# shortened so that 1 -> 2 -> 1 fits a CI run. The signal, the bounds, the target and the drain
# are the product's. Each delay: (the value here, Serve's default in serve/config.py AutoscalingConfig).
SCALING_DELAYS = {
    "upscale_delay_s": (5.0, 30.0),
    "downscale_delay_s": (20.0, 600.0),
    "look_back_period_s": (10.0, 30.0),
}
SCALING_DELTAS: dict[str, str] = {
    f"deployments[].autoscaling_config.{name}": f"{value:g}: Serve's default {default:g} s, for a CI-sized run"
    for name, (value, default) in SCALING_DELAYS.items()
}
# Environment of the Ray processes here, beside the product's worker environment.
CPU_ENV = {
    "FI_PROVIDER": "tcp",  # replaces the product's efa: no EFA device here (FI_TCP_IFACE: per node)
    "TORCH_COMPILE_DISABLE": "1",
    "HF_HUB_OFFLINE": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
    # Ray's metric export every 2 s, not its default 10 s: the rehearsal's checks wait for an export after each
    # request they count (tools.polling reads the same variable), and those waits were its largest idle time.
    # The product's pods keep Ray's default.
    EXPORT_INTERVAL_ENV: "2000",
}
CORES = {"prefill": "0", "decode": "1", "aggregated": "0-1"}
# Far above what any phase holds at once (the prefix-routing run's 8 prefixes of about 1,400 tokens, 20 streams).
KV_CACHE_BYTES = 256 * 2**20
DEPLOY_TIMEOUT_S = 720.0
# How long a chat to a failed app is given: Serve's proxy holds it (no replica of decode), with no answer. A serving
# app answers one in about a second here (verify's chat).
ENDPOINT_TIMEOUT_S = 10.0


def product_rayservice(overrides: dict[str, str] | None = None) -> dict[str, Any]:
    """The RayService in the synthesized template, on default settings (or with these overrides)."""
    return rayservice_of(product_manifests(overrides))


def rayservice_of(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    for doc in manifests:
        if doc.get("kind") == "RayService":
            return dict(doc)
    raise RehearsalError("no RayService in the synthesized template")


def product_manifests(overrides: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Every Kubernetes object in the synthesized template, on default settings (or with these overrides)."""
    os.environ.setdefault("CDK_VALIDATION", "false")
    from app import build_app  # loads aws_cdk, whose Node kernel reads CDK_VALIDATION as it starts: set above

    context = {**project_context(ROOT), **(overrides or {})}
    with tempfile.TemporaryDirectory() as out:
        os.environ["CDK_OUTDIR"] = out
        app, _, _ = build_app(context)
        template = app.synth().get_stack_by_name(STACK_NAME).template
    return [
        doc
        for resource in template["Resources"].values()
        if resource["Type"] == "Custom::AWSCDK-EKS-KubernetesResource"
        for doc in json.loads(render(resource["Properties"]["Manifest"]))
    ]


def llm_configs(config: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(side, LLMConfig) of the serve config's one application: prefill and decode, or aggregated."""
    args = config["applications"][0]["args"]
    if "llm_configs" in args:
        return [("aggregated", c) for c in args["llm_configs"]]
    # Only the two sides: the args may also carry ingress_cls_config (the endpoint's key ingress).
    return [(side, args[f"{side}_config"]) for side in SIDES]


def cpu_serve_config(rayservice: dict[str, Any], model_dir: Path) -> dict[str, Any]:
    """serveConfigV2 with CPU_DELTAS applied, and nothing else changed."""
    config: dict[str, Any] = yaml.safe_load(rayservice["spec"]["serveConfigV2"])
    for side, llm in llm_configs(config):
        llm["model_loading_config"]["model_source"] = str(model_dir)
        llm.pop("accelerator_type", None)
        for bundle in llm["placement_group_config"]["bundles"]:
            bundle.pop("GPU", None)
        llm["engine_kwargs"].update(
            enforce_eager=True,
            max_num_batched_tokens=512,
            max_num_seqs=8,
            dtype="float32",
            kv_cache_memory_bytes=KV_CACHE_BYTES,
        )
        env = llm.setdefault("runtime_env", {}).setdefault("env_vars", {})
        env["VLLM_CPU_OMP_THREADS_BIND"] = CORES[side]
    return config


def apply_failure_deltas(config: dict[str, Any]) -> None:
    """FAILURE_DELTAS on every LLMConfig of the serve config."""
    for _, llm in llm_configs(config):
        llm.setdefault("deployment_config", {})["max_constructor_retry_count"] = 1


def apply_scaling_deltas(config: dict[str, Any]) -> None:
    """SCALING_DELTAS on every deployment of the serve config that scales (has an autoscaling_config)."""
    for deployment in config["applications"][0].get("deployments", []):
        scaling = deployment.get("autoscaling_config")
        if scaling is not None:
            scaling.update({name: value for name, (value, _) in SCALING_DELAYS.items()})


def is_aggregated(config: dict[str, Any]) -> bool:
    return "llm_configs" in config["applications"][0]["args"]


def model_id(config: dict[str, Any]) -> str:
    args = config["applications"][0]["args"]
    llm = args["llm_configs"][0] if "llm_configs" in args else args["decode_config"]
    return str(llm["model_loading_config"]["model_id"])


def product_worker_env(rayservice: dict[str, Any]) -> dict[str, str]:
    """The plain-value environment of the product's worker containers (both groups share it)."""
    env: dict[str, str] = {}
    for group in rayservice["spec"]["rayClusterConfig"]["workerGroupSpecs"]:
        for item in group["template"]["spec"]["containers"][0].get("env", []):
            if "value" in item:
                env[item["name"]] = str(item["value"])
    return env


def product_head_env(rayservice: dict[str, Any]) -> dict[str, str]:
    """Ray's own knobs (RAY_*) among the head container's plain values: its raylet and Serve's controller read them."""
    container = rayservice["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    return {
        e["name"]: str(e["value"]) for e in container.get("env", []) if "value" in e and e["name"].startswith("RAY_")
    }


def kuberay_auth_env(rayservice: dict[str, Any]) -> dict[str, str]:
    """What KubeRay 1.7 puts in every Ray container for `authOptions: {mode: token}`.

    It generates a random token into a Secret of the cluster and sets RAY_AUTH_MODE
    and RAY_AUTH_TOKEN (a secretKeyRef to it) in the head and every worker
    (controllers/ray/common/pod.go, utils.RAY_AUTH_TOKEN_SECRET_KEY "auth_token").
    """
    options = rayservice["spec"]["rayClusterConfig"].get("authOptions") or {}
    if options.get("mode") != "token":
        return {}
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}


def kuberay_headers(env: dict[str, str]) -> dict[str, str]:
    """The header KubeRay's dashboard client sets on every call (dashboard_httpclient.go, setAuthHeader)."""
    token = env.get("RAY_AUTH_TOKEN")
    return {"x-ray-authorization": f"Bearer {token}"} if token else {}


# An engine that cannot start, or decode's pre-warm through prefill failing: Serve would
# retry the replica for minutes before giving up.
ENGINE_FAILED = re.compile(
    r"createBackend: unsupported backend.*|Skipping backend registration.*|Engine core initialization failed.*|"
    r"NIXL transfer failure: handshake_\w+"
)


def app_status(config: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
    """The application's entry in the dashboard's GET /api/serve/applications/ (what KubeRay polls)."""
    status = http(f"{DASHBOARD}/api/serve/applications/", headers=headers)
    return dict((status or {}).get("applications", {}).get(config["applications"][0]["name"], {}))


def first_fatal_line(temp_dir: Path) -> str | None:
    """The first log line of an engine that could not start or pre-warm; NIXL's own line first."""
    fatal = ENGINE_FAILED.findall(ray_logs(temp_dir))
    return sorted(fatal, key=lambda line: "Engine core" in line)[0].strip()[:200] if fatal else None


def endpoint_answer(url: str, body: Any, timeout: float) -> tuple[bool, str]:
    """Whether the endpoint answered one request with success, and what it said: 'HTTP <status>',
    'no connection', or 'no answer in N s' (a request the endpoint holds: a client would hang)."""
    try:
        http(url, body, method="POST" if body is not None else "GET", timeout=timeout)
    except urllib.error.HTTPError as err:
        return False, f"HTTP {err.code}"
    except urllib.error.URLError as err:
        return False, f"no connection: {err.reason}"
    except TimeoutError:
        return False, f"no answer in {timeout:.0f} s"
    except (OSError, ValueError) as err:
        return False, f"{type(err).__name__}: {err}"
    return True, "HTTP 200"


def failed_endpoint(model: str) -> tuple[bool, str]:
    """After DEPLOY_FAILED: whether the endpoint served a chat, and what it said to a chat and to /v1/models."""
    chat = {"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
    served, said = endpoint_answer(f"{SERVE}/v1/chat/completions", chat, ENDPOINT_TIMEOUT_S)
    _, models = endpoint_answer(f"{SERVE}/v1/models", None, 10.0)
    return served, f"chat: {said}, /v1/models: {models}"


def deploy(config: dict[str, Any], temp_dir: Path, headers: dict[str, str], *, to_terminal_state: bool = False) -> None:
    """PUT the serve config to the dashboard, as KubeRay does (with its token header), and wait until the app runs.

    A case that must pass stops at the first log line of an engine that could not start.
    A failure case (to_terminal_state) instead waits for the app's terminal status, as
    KubeRay sees it, and then calls the endpoint: the failure is shown only when the app
    reached DEPLOY_FAILED and the endpoint served no chat."""
    http(f"{DASHBOARD}/api/serve/applications/", config, method="PUT", timeout=60, headers=headers)
    started = time.monotonic()
    last = ""
    while time.monotonic() - started < DEPLOY_TIMEOUT_S:
        fatal = first_fatal_line(temp_dir)
        if fatal and not to_terminal_state:
            raise RehearsalError(f"deploy failed: an engine could not start or pre-warm: {fatal}")
        with contextlib.suppress(OSError, ValueError):
            app = app_status(config, headers)
            last = str(app.get("status"))
            if last == "RUNNING":
                return
            if last == "DEPLOY_FAILED":
                served, answer = failed_endpoint(model_id(config))
                message = (app.get("message") or "").strip().splitlines()[:1]
                raise RehearsalError(
                    f"deploy failed: app DEPLOY_FAILED after {time.monotonic() - started:.0f} s, "
                    f"endpoint {'SERVED' if served else 'served no'} chat "
                    f"({answer}); an engine could not start or pre-warm: {fatal or message}"
                )
        time.sleep(5)
    raise RehearsalError(f"the app was not RUNNING after {DEPLOY_TIMEOUT_S:.0f} s (last status {last})")
