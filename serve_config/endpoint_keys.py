"""Who may call the endpoint: the product's ingress in the serve config, and the code and keys every Ray pod mounts.

The ingress class is the product's own (ray_pods/api_keys.py) in every mode, keys on
or off: it keeps the request timeout and the cut-stream guard (ray_pods/stream_guard.py),
which Ray's own ingress has not. It reaches the pods as a ConfigMap; with keys on, the
keys as a Secret that External Secrets keeps equal to the Secrets Manager secret the
settings name (cdk_constructs/secrets_sync.py).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from settings import Settings
from settings.project import ROOT

# The endpoint's API keys (setting endpoint_api_keys_secret_name): External Secrets
# syncs the Secrets Manager secret, a JSON object {"<key id>": "<key>", ...}, into
# this Kubernetes Secret under API_KEYS_FILE_KEY. Every Ray pod mounts the Secret as
# a whole volume (no subPath, so the kubelet refreshes it) at API_KEYS_MOUNT; the
# ingress re-reads API_KEYS_MOUNT/API_KEYS_FILE_KEY when it changes.
API_KEYS_SECRET = "endpoint-api-keys"  # noqa: S105 - a Secret's name, not a key
API_KEYS_FILE_KEY = "keys.json"
API_KEYS_MOUNT = "/etc/pd-inference/api-keys"
# The Python the Ray pods import (the ray_pods package): a ConfigMap mounted as
# the package's directory under RAY_PODS_PYTHONPATH, which every Ray container puts
# on PYTHONPATH. Ray imports the ingress class by this path, in the task that
# builds the app (any node) and in the ingress replica; the NIXL callback and the
# logging hook in each prefill and decode replica.
RAY_PODS_PACKAGE = "ray_pods"
RAY_PODS_CONFIGMAP = "ray-pods-code"
RAY_PODS_PYTHONPATH = "/opt/pd-inference/python"
API_KEY_INGRESS = f"{RAY_PODS_PACKAGE}.api_keys:ApiKeyIngress"
# Ray Serve LLM's callback hook on each prefill and decode replica: a NIXL engine id of
# its own for every start of an engine (ray_pods/nixl_incarnation.py, vllm#49238).
NIXL_INCARNATION_CALLBACK = f"{RAY_PODS_PACKAGE}.nixl_incarnation:NixlIncarnation"
# The worker-process set-up hook of every engine replica, a dotted path: vLLM's and NIXL's logging before Serve's, so a
# restarted controller keeps the engines (ray_pods/engine_logging.py). Ray 2.58's worker runs the function this
# variable names as it starts (ray/_private/workers/default_worker.py, ray_constants.WORKER_PROCESS_SETUP_HOOK_ENV_VAR).
SETUP_HOOK_ENV = "__RAY_WORKER_PROCESS_SETUP_HOOK_ENV_VAR"
ENGINE_LOGGING_HOOK = f"{RAY_PODS_PACKAGE}.engine_logging.import_logging_first"
# On the Ray pod templates: a digest of the shipped code, so a code change changes
# the Ray cluster's spec (and the recreate Job starts pods that import the new code).
RAY_PODS_CODE_ANNOTATION = "pd-inference.aws/ray-pods-code"


def ray_pods_files() -> dict[str, str]:
    """The ray_pods package's modules, by file name: the ConfigMap's data."""
    package = ROOT / RAY_PODS_PACKAGE
    return {path.name: path.read_text(encoding="utf-8") for path in sorted(package.glob("*.py"))}


def ray_pods_digest() -> str:
    """A short digest of the shipped code (a label-safe annotation value)."""
    text = json.dumps(ray_pods_files(), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def ray_pods_configmap(settings: Settings) -> dict[str, Any]:
    """The ConfigMap that carries the ray_pods package to every Ray pod."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": RAY_PODS_CONFIGMAP, "namespace": settings.serving_namespace},
        "data": ray_pods_files(),
    }


def ingress_cls_config(settings: Settings) -> dict[str, Any]:
    """The product's ingress (ray_pods/api_keys.py): behind API keys when they are on, open to every
    caller otherwise. Ray's own OpenAiIngress is never used: a client's headers can turn Serve's
    timeout and its hang-up cancel off, and only this class keeps them (ray_pods/stream_guard.py)."""
    # The ingress ends chats and completions here itself: a client's headers can turn Serve's own
    # timeout off (ray_pods/stream_guard.py); decode's drain covers exactly this (settings/sizing/,
    # graceful_shutdown).
    timeout = settings.request_timeout_seconds
    if settings.endpoint_api_keys_secret_name is None:
        return {
            "ingress_cls": API_KEY_INGRESS,
            "ingress_extra_kwargs": {"request_timeout_s": timeout, "code_digest": ray_pods_digest()},
        }
    return {
        "ingress_cls": API_KEY_INGRESS,
        "ingress_extra_kwargs": {
            "keys_file": f"{API_KEYS_MOUNT}/{API_KEYS_FILE_KEY}",
            "request_timeout_s": timeout,
            "requests_per_minute": settings.endpoint_rate_limit_rpm,
            # The key ids that may choose decode's prefill route (x-pd-prefill); the ingress refuses it from others.
            "prefill_header_keys": list(settings.pd_prefill_header_keys),
            "code_digest": ray_pods_digest(),
        },
    }


def mount_ray_pods_code(settings: Settings, pod: dict[str, Any], container: dict[str, Any]) -> None:
    """The code ConfigMap, and the keys Secret when keys are on, each mounted whole (a subPath mount is
    never refreshed). The code goes to every Ray pod in both serving modes: the NIXL callback needs it
    in P/D mode, and a mode switch must not change the Ray cluster (it would rebuild it)."""
    volumes = pod.setdefault("volumes", [])
    mounts = container.setdefault("volumeMounts", [])
    volumes.append({"name": "ray-pods-code", "configMap": {"name": RAY_PODS_CONFIGMAP}})
    mounts.append({"name": "ray-pods-code", "mountPath": f"{RAY_PODS_PYTHONPATH}/{RAY_PODS_PACKAGE}", "readOnly": True})
    if settings.endpoint_api_keys_secret_name is not None:
        volumes.append({"name": "api-keys", "secret": {"secretName": API_KEYS_SECRET}})
        mounts.append({"name": "api-keys", "mountPath": API_KEYS_MOUNT, "readOnly": True})
    # The image's Python finds the package here; the AWS Ray DLC sets no PYTHONPATH
    # of its own that this would hide (unconfirmed offline: see README).
    container.setdefault("env", []).append({"name": "PYTHONPATH", "value": RAY_PODS_PYTHONPATH})
