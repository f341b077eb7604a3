"""Warm GPU nodes: the placeholder pods that keep gpu_warm_nodes spare GPU nodes ready (warm_node.yaml).

Each placeholder asks for every GPU of a node, so one lands per spare node and nothing else of lower
priority shares it; a Ray worker preempts it. Its container runs the serving image, so the node has
pulled the image before a replica needs it. With a Hugging Face model on a type with instance store,
an init container first downloads the weights into the node's model cache (the hostPath the Ray
workers mount as HF_HOME), as vLLM would: a replica that lands there finds them on its NVMe. An
s3:// source is downloaded again by Ray at every engine start, so there the placeholder pulls only
the image (settings/sizing/scale_up.py warm_node_holds_weights).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from serve_config import GPU_RESOURCE, data_file, serving_image
from serve_config.pod_templates import MODEL_CACHE_MOUNT, MODEL_CACHE_VOLUME, token_env
from settings import Settings
from settings.catalog import LOCAL_NVME_MOUNT
from settings.sizing import warm_node_holds_weights

WARM_NODE = "gpu-warm-node"

# What vLLM 0.26's default loader downloads for a Hugging Face model with load_format auto: the
# safetensors weights (default_loader.py _prepare_weights, "hf"), never original/ (LoadConfig's
# ignore_patterns default). The JSON files are the config, the tokenizer and the weights' index; the
# few small files left (merges.txt and the like) come at engine start.
WEIGHT_PATTERNS = ("*.safetensors", "*.json")
IGNORE_PATTERNS = ("original/**/*",)

# The download, run by whichever Python the image has (as verify runs its probe), with the model id
# and the Hugging Face cache from the environment.
DOWNLOAD_CODE = (
    "import os; from huggingface_hub import snapshot_download; "
    f"snapshot_download(os.environ['MODEL_ID'], allow_patterns={list(WEIGHT_PATTERNS)!r}, "
    f"ignore_patterns={list(IGNORE_PATTERNS)!r})"
)


def warm_node_manifests(
    settings: Settings, *, namespace: str, gpu_node_labels: Mapping[str, str], gpu_toleration: Mapping[str, str]
) -> list[dict[str, Any]]:
    """The PriorityClass and the Deployment of gpu_warm_nodes placeholders; none when it is 0."""
    if settings.gpu_warm_nodes == 0:
        return []
    data = data_file("warm_node.yaml")
    priority_class: dict[str, Any] = data["priorityClass"]
    deployment: dict[str, Any] = data["deployment"]
    deployment["metadata"]["namespace"] = namespace
    deployment["spec"]["replicas"] = settings.gpu_warm_nodes
    pod = deployment["spec"]["template"]["spec"]
    pod["nodeSelector"] = dict(gpu_node_labels)
    pod["tolerations"] = [dict(gpu_toleration)]
    hold = pod["containers"][0]
    hold["image"] = serving_image(settings)
    gpus = str(settings.gpu_instance.gpus)
    for bound in ("requests", "limits"):
        hold["resources"][bound][GPU_RESOURCE] = gpus
    if warm_node_holds_weights(settings):
        pod["volumes"] = [
            {
                "name": MODEL_CACHE_VOLUME,
                "hostPath": {"path": f"{LOCAL_NVME_MOUNT}/{MODEL_CACHE_VOLUME}", "type": "DirectoryOrCreate"},
            }
        ]
        pod["initContainers"] = [_download(settings)]
    return [priority_class, deployment]


def _download(settings: Settings) -> dict[str, Any]:
    cache = f"{MODEL_CACHE_MOUNT}/huggingface"
    # As root, as the Ray workers' own init container makes the cache writable: then open to every user,
    # since the image's serving user writes to it later.
    script = (
        f'mkdir -p {cache} && "$(command -v python3 || command -v python)" -c "$0" '
        f"&& chmod -R a+rwX {MODEL_CACHE_MOUNT}"
    )
    resources = {"cpu": "1", "memory": "2Gi"}
    return {
        "name": "model-cache-download",
        "image": serving_image(settings),
        "command": ["sh", "-c", script, DOWNLOAD_CODE],
        "env": [
            {"name": "MODEL_ID", "value": settings.model_id},
            {"name": "HF_HOME", "value": cache},
            *token_env(settings),
        ],
        "securityContext": {"runAsUser": 0},
        "volumeMounts": [{"name": MODEL_CACHE_VOLUME, "mountPath": MODEL_CACHE_MOUNT}],
        "resources": {"requests": dict(resources), "limits": copy.deepcopy(resources)},
    }
