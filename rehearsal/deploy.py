"""What the product deploys, the CPU deltas, and deploying it the way KubeRay does."""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from rehearsal.cluster import ray_logs
from rehearsal.network import DASHBOARD, RehearsalError, http

ROOT = Path(__file__).resolve().parent.parent

# The only changes made to the product's serve config, and why (a test pins this set).
CPU_DELTAS: dict[str, str] = {
    "model_loading_config.model_source": "a tiny Qwen3 made at test time (no hub); model_id stays the product's",
    "accelerator_type": "removed: with an accelerator Ray LLM takes its GPU path ('platform cpu does not support ray')",
    "placement_group_config.bundles[].GPU": "removed, for the same reason; CPU and the side's resource stay",
    "engine_kwargs.enforce_eager": "True: no CUDA graphs or torch.compile warm-up on CPU",
    "engine_kwargs.max_num_batched_tokens": "512: a CPU-sized batch",
    "engine_kwargs.max_num_seqs": "8: a CPU-sized batch",
    "engine_kwargs.dtype": "float32: this CPU has no fast bfloat16 path",
    "runtime_env.env_vars.VLLM_CPU_OMP_THREADS_BIND": "one core per side (0 prefill, 1 decode); aggregated: both",
}
# Environment of the Ray processes here, beside the product's worker environment.
CPU_ENV = {
    "FI_PROVIDER": "tcp",  # replaces the product's efa: no EFA device here (FI_TCP_IFACE: per node)
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB
    "TORCH_COMPILE_DISABLE": "1",
    "HF_HUB_OFFLINE": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
}
CORES = {"prefill": "0", "decode": "1", "aggregated": "0-1"}
DEPLOY_TIMEOUT_S = 720.0


def product_rayservice(overrides: dict[str, str] | None = None) -> dict[str, Any]:
    """The RayService in the synthesized template, on default settings (or with these overrides)."""
    os.environ.setdefault("CDK_VALIDATION", "false")
    from app import STACK_NAME, build_app
    from settings import project_context
    from tools.review import render

    context = {**project_context(ROOT), **(overrides or {})}
    with tempfile.TemporaryDirectory() as out:
        os.environ["CDK_OUTDIR"] = out
        app, _, _ = build_app(context)
        template = app.synth().get_stack_by_name(STACK_NAME).template
    for resource in template["Resources"].values():
        if resource["Type"] != "Custom::AWSCDK-EKS-KubernetesResource":
            continue
        for doc in json.loads(render(resource["Properties"]["Manifest"])):
            if doc.get("kind") == "RayService":
                return dict(doc)
    raise RehearsalError("no RayService in the synthesized template")


def llm_configs(config: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(side, LLMConfig) of the serve config's one application: prefill and decode, or aggregated."""
    args = config["applications"][0]["args"]
    if "llm_configs" in args:
        return [("aggregated", c) for c in args["llm_configs"]]
    return [(key.removesuffix("_config"), c) for key, c in args.items()]


def cpu_serve_config(rayservice: dict[str, Any], model_dir: Path) -> dict[str, Any]:
    """serveConfigV2 with CPU_DELTAS applied, and nothing else changed."""
    config: dict[str, Any] = yaml.safe_load(rayservice["spec"]["serveConfigV2"])
    for side, llm in llm_configs(config):
        llm["model_loading_config"]["model_source"] = str(model_dir)
        llm.pop("accelerator_type", None)
        for bundle in llm["placement_group_config"]["bundles"]:
            bundle.pop("GPU", None)
        llm["engine_kwargs"].update(enforce_eager=True, max_num_batched_tokens=512, max_num_seqs=8, dtype="float32")
        env = llm.setdefault("runtime_env", {}).setdefault("env_vars", {})
        env["VLLM_CPU_OMP_THREADS_BIND"] = CORES[side]
    return config


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


def deploy(config: dict[str, Any], temp_dir: Path, headers: dict[str, str]) -> None:
    """PUT the serve config to the dashboard, as KubeRay does (with its token header), and wait until the app runs."""
    http(f"{DASHBOARD}/api/serve/applications/", config, method="PUT", timeout=60, headers=headers)
    deadline = time.monotonic() + DEPLOY_TIMEOUT_S
    last = ""
    while time.monotonic() < deadline:
        fatal = ENGINE_FAILED.findall(ray_logs(temp_dir))
        if fatal:
            # NIXL's own line first, where there is one.
            first = sorted(fatal, key=lambda line: "Engine core" in line)[0]
            raise RehearsalError(f"deploy failed: an engine could not start or pre-warm: {first.strip()[:200]}")
        with contextlib.suppress(OSError, ValueError):
            status = http(f"{DASHBOARD}/api/serve/applications/", headers=headers)
            app = (status or {}).get("applications", {}).get(config["applications"][0]["name"], {})
            last = str(app.get("status"))
            if last == "RUNNING":
                return
            if last == "DEPLOY_FAILED":
                raise RehearsalError(f"deploy failed: {(app.get('message') or '').strip().splitlines()[-1:]}")
        time.sleep(5)
    raise RehearsalError(f"the app was not RUNNING after {DEPLOY_TIMEOUT_S:.0f} s (last status {last})")
