"""The Ray Serve LLM application and its RayService, built from data and settings.

The invariant parts are the YAML files beside this module; this code fills in
only what follows from the settings, so every value has one home.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
from pathlib import Path
from typing import Any

import yaml

from serve_config import checks, deployments
from serve_config.checks import DECODE as DECODE
from serve_config.checks import PREFILL as PREFILL
from serve_config.checks import SIDES as SIDES
from serve_config.endpoint_keys import (
    NIXL_INCARNATION_CALLBACK,
    RAY_PODS_CODE_ANNOTATION,
    ingress_cls_config,
    mount_ray_pods_code,
    ray_pods_digest,
)
from settings import Settings, sizing
from settings.catalog import IMAGE_RAY_VERSION, LOCAL_NVME_MOUNT

HERE = Path(__file__).parent


class ServeConfigError(ValueError):
    """The serve config data breaks disaggregation (see serve_config/checks.py)."""


SERVE_PORT = 8000
# The head's dashboard (the REST API KubeRay deploys serveConfigV2 through, and
# the job API) and KubeRay's default metrics port on every Ray container.
DASHBOARD_PORT = 8265
METRICS_PORT = 8080
# Extended resources the device plugins advertise on the GPU nodes.
GPU_RESOURCE = "nvidia.com/gpu"
EFA_RESOURCE = "vpc.amazonaws.com/efa"
# On instance-store GPU types: the Hugging Face cache on the node's NVMe RAID0, a
# hostPath, so a restarted pod finds the weights it downloaded (catalog.LOCAL_NVME_MOUNT).
# With an s3:// model_source, every Ray pod runs as this ServiceAccount (its Pod
# Identity role reads the prefix: cdk_constructs/model_weights.py).
RAY_SERVICE_ACCOUNT = "ray-model-reader"
MODEL_CACHE_VOLUME = "model-cache"
MODEL_CACHE_MOUNT = "/model-cache"
HF_TOKEN_SECRET = "hf-token"  # noqa: S105 - a Secret's name, not a token
HF_TOKEN_SECRET_KEY = "token"  # noqa: S105 - a key name
# A label on the RayService carrying a hash of its rayClusterConfig. KubeRay copies
# the RayService's labels onto the RayCluster it creates (rayservice_controller.go,
# constructRayClusterForRayService), so a running cluster shows which spec it was
# built from; the recreate Job (cdk_constructs/llm_service.py) deletes one built
# from another spec, and KubeRay builds a new one from the current spec. Every Ray
# pod carries it too: an operator upgrade makes KubeRay rewrite the live cluster's
# spec and labels in place and keep its pods, which the Job then finds by theirs.
CLUSTER_CONFIG_LABEL = "pd-inference.aws/ray-cluster-config"
# KubeRay's label on a RayCluster made for a RayService: the RayService's name.
ORIGINATED_FROM_LABEL = "ray.io/originated-from-cr-name"


@functools.cache
def _data(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((HERE / name).read_text(encoding="utf-8"))
    return loaded


def application_data() -> dict[str, Any]:
    """A copy of pd_application.yaml."""
    return copy.deepcopy(_data("pd_application.yaml"))


def rayservice_data() -> dict[str, Any]:
    """A copy of rayservice.yaml."""
    return copy.deepcopy(_data("rayservice.yaml"))


def kv_buffer_device(settings: Settings) -> str:
    """Where NIXL stages KV blocks: GPU memory only where EFA can reach it (GPUDirect RDMA)."""
    return "cuda" if settings.gpu_instance.gpudirect_rdma else "cpu"


def replicas(settings: Settings, side: str) -> int:
    """Engine replicas of a side (its minimum): one Ray worker pod each, holding its tensor-parallel group's GPUs."""
    return settings.side_replicas(side)


# The custom resource the ingress worker group advertises and the ingress replica asks for.
INGRESS_GROUP = "ingress"


def ingress_deployment_config() -> dict[str, Any]:
    """The OpenAI ingress's structural Serve options in the builder's args: one replica, its home on the
    ingress worker group (pd_application.yaml). Its bounds and drain are in `deployments`."""
    config: dict[str, Any] = application_data()["ingress"]["deployment_config"]
    return config


def ingress_replicas() -> int:
    replicas: int = application_data()["ingress"]["deployment_config"]["num_replicas"]
    return replicas


# vLLM reads the KV cache layout from this variable (vllm/envs.py); its Ray workers copy it.
KV_LAYOUT_ENV = "VLLM_KV_CACHE_LAYOUT"


def llm_config(settings: Settings, side: str) -> dict[str, Any]:
    """The Ray LLMConfig of one side, as the dict serveConfigV2 carries."""
    data = application_data()
    config: dict[str, Any] = data["llm_config"]
    engine = config["engine_kwargs"]
    engine["max_model_len"] = settings.max_model_len
    engine["gpu_memory_utilization"] = settings.gpu_memory_utilization
    kv = engine["kv_transfer_config"]
    kv["engine_id"] = data["sides"][side]["engine_id"]
    kv["kv_buffer_device"] = kv_buffer_device(settings)
    step = sizing.prefill_max_num_batched_tokens(settings)
    if side == PREFILL and step is not None:
        engine["max_num_batched_tokens"] = step
    tp = settings.tensor_parallel_size(side)
    engine["tensor_parallel_size"] = tp
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
        config["runtime_env"] = {"env_vars": {KV_LAYOUT_ENV: "HND"}}
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


def _worker_env(settings: Settings, base: list[dict[str, Any]]) -> list[dict[str, Any]]:
    env = list(base)
    if settings.gpu_instance.gpudirect_rdma:
        # Only where the device has RDMA: on G6 this would abort libfabric.
        env.append({"name": "FI_EFA_USE_DEVICE_RDMA", "value": "1"})
    return env


def _token_env(settings: Settings) -> list[dict[str, Any]]:
    if settings.hf_token_secret_name is None:
        return []
    # From a Kubernetes Secret only: serveConfigV2 is plain text in the custom resource.
    ref = {"name": HF_TOKEN_SECRET, "key": HF_TOKEN_SECRET_KEY}
    return [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": ref}}]


# Ray's resource for a node's accelerator (ray/_common/utils.py RESOURCE_CONSTRAINT_PREFIX, Ray 2.58):
# the raylet of an L4 node advertises accelerator_type:L4 = 1, and Ray LLM asks for 0.001 of it in
# every bundle of an LLMConfig with accelerator_type (engines/vllm/vllm_models.py placement_bundles).
ACCELERATOR_RESOURCE_PREFIX = "accelerator_type:"


def accelerator_resource(settings: Settings) -> str:
    """The accelerator resource of the GPU type (Ray LLM's format_ray_accelerator_resource)."""
    return ACCELERATOR_RESOURCE_PREFIX + settings.gpu_instance.ray_accelerator_type


def group_resources(settings: Settings, side: str) -> dict[str, int]:
    """The custom resources a side's worker group declares: the side's own, which pins its replicas to
    it, and the GPU's accelerator resource.

    Ray's autoscaler knows a group's resources only from the RayCluster
    (autoscaler/_private/kuberay/autoscaling_config.py) and learns CPU, GPU and memory alone from a
    running pod (resource_demand_scheduler.py, _update_node_resources_from_runtime). Without the
    accelerator declared here no group could hold an engine's bundle, and no side would scale up,
    from its minimum or from an empty group.
    """
    return {side: 1, accelerator_resource(settings): 1}


def worker_resources(settings: Settings, side: str = PREFILL) -> dict[str, str]:
    """What one worker pod asks for: its tensor-parallel group's GPUs, the EFA devices that go with
    them (the node's EFA devices split evenly across its pods), its share of most of the node's CPU
    and memory.

    The rest is left to the kubelet's reservations, the DaemonSets (VPC CNI,
    kube-proxy, device plugins, Pod Identity agent) and EFA's huge pages.
    """
    gpu = settings.gpu_instance
    tp = settings.tensor_parallel_size(side)
    pods = settings.replicas_per_node(side)
    return {
        "cpu": str((gpu.vcpus - 4) // pods),
        "memory": f"{int(gpu.memory_gib * 0.75) // pods}Gi",
        GPU_RESOURCE: str(tp),
        EFA_RESOURCE: str(gpu.efa_interfaces // pods),
    }


def rayservice(
    settings: Settings,
    *,
    system_node_labels: dict[str, str],
    gpu_node_labels: dict[str, str],
    gpu_toleration: dict[str, str],
) -> dict[str, Any]:
    """The RayService manifest (ray.io/v1) that runs the application."""
    data = rayservice_data()
    doc = {
        "apiVersion": data["apiVersion"],
        "kind": data["kind"],
        "metadata": {"name": settings.service_name, "namespace": settings.serving_namespace},
        "spec": data["spec"],
    }
    spec = doc["spec"]
    spec["serveConfigV2"] = serve_config_v2(settings)
    cluster = spec["rayClusterConfig"]
    cluster["rayVersion"] = IMAGE_RAY_VERSION
    if not settings.ray_token_auth:
        del cluster["authOptions"]

    cluster["headGroupSpec"]["template"]["metadata"] = {"labels": pod_labels(settings)}
    head_pod = cluster["headGroupSpec"]["template"]["spec"]
    head_pod["nodeSelector"] = dict(system_node_labels)
    head = head_pod["containers"][0]
    head["ports"].append({"containerPort": SERVE_PORT, "name": "serve"})
    head["image"] = settings.ray_image
    if settings.hf_token_secret_name is not None:
        head["env"] = [*head.get("env", []), *_token_env(settings)]
    mount_ray_pods_code(settings, head_pod, head)

    reads_s3 = (settings.model_source or "").startswith("s3://")
    if reads_s3:
        head_pod["serviceAccountName"] = RAY_SERVICE_ACCOUNT
    template = cluster.pop("workerGroupTemplate")
    ingress_template = cluster.pop("ingressGroupTemplate")
    autoscaler = cluster.pop("autoscalerOptions")
    if settings.any_autoscaling:
        cluster["enableInTreeAutoscaling"] = True
        cluster["autoscalerOptions"] = {**autoscaler, "idleTimeoutSeconds": settings.ray_worker_idle_timeout_seconds}
    groups = []
    for side in SIDES:
        group = copy.deepcopy(template)
        # One pod per replica: the group's bounds are the side's.
        low, high = replicas(settings, side), settings.side_max_replicas(side)
        group.update({"groupName": side, "replicas": low, "minReplicas": low, "maxReplicas": high})
        # The custom resources each side's placement bundles ask for, in the form
        # KubeRay writes itself: single-quoted JSON. KubeRay parses it by trimming
        # quotes and a strict JSON parse, and pastes it into `ray start
        # --resources=...` under bash, where the single quotes keep it one word;
        # Ray's autoscaler drops the first and last character and parses the rest.
        group["rayStartParams"]["resources"] = f"'{json.dumps(group_resources(settings, side))}'"
        group["template"]["metadata"] = {"labels": pod_labels(settings)}
        pod = group["template"]["spec"]
        pod["nodeSelector"] = dict(gpu_node_labels)
        pod["tolerations"] = [dict(gpu_toleration)]
        container = pod["containers"][0]
        container["image"] = settings.ray_image
        container["env"] = _worker_env(settings, container.get("env", [])) + _token_env(settings)
        if reads_s3:
            pod["serviceAccountName"] = RAY_SERVICE_ACCOUNT
        if settings.gpu_instance.instance_store_gb > 0:
            pod["volumes"].append(
                {
                    "name": MODEL_CACHE_VOLUME,
                    "hostPath": {"path": f"{LOCAL_NVME_MOUNT}/{MODEL_CACHE_VOLUME}", "type": "DirectoryOrCreate"},
                }
            )
            container["volumeMounts"].append({"name": MODEL_CACHE_VOLUME, "mountPath": MODEL_CACHE_MOUNT})
            container["env"].append({"name": "HF_HOME", "value": f"{MODEL_CACHE_MOUNT}/huggingface"})
            # vLLM's torch.compile cache (VLLM_CACHE_ROOT/torch_compile_cache/<hash>) on the NVMe too: a
            # restarted pod with the same model, engine settings, vLLM and torch reuses the compiled graphs
            # instead of compiling again. The default, ~/.cache/vllm, dies with the container.
            container["env"].append({"name": "VLLM_CACHE_ROOT", "value": f"{MODEL_CACHE_MOUNT}/vllm"})
            # kubelet creates the hostPath owned by root, 0755: whichever user the image
            # runs as, the cache must be writable before the Ray container starts.
            pod["initContainers"] = [
                {
                    "name": "model-cache-permissions",
                    "image": settings.ray_image,
                    "command": [
                        "sh",
                        "-c",
                        f"mkdir -p {MODEL_CACHE_MOUNT}/huggingface && chmod -R a+rwX {MODEL_CACHE_MOUNT}",
                    ],
                    "securityContext": {"runAsUser": 0},
                    "volumeMounts": [{"name": MODEL_CACHE_VOLUME, "mountPath": MODEL_CACHE_MOUNT}],
                    "resources": {
                        "requests": {"cpu": "100m", "memory": "64Mi"},
                        "limits": {"cpu": "100m", "memory": "64Mi"},
                    },
                }
            ]
        resources = worker_resources(settings, side)
        container["resources"] = {"requests": dict(resources), "limits": dict(resources)}
        mount_ray_pods_code(settings, pod, container)
        groups.append(group)
    groups.append(_ingress_group(settings, ingress_template, system_node_labels, reads_s3=reads_s3))
    cluster["workerGroupSpecs"] = groups
    for template in (cluster["headGroupSpec"]["template"], *(g["template"] for g in groups)):
        template["metadata"].setdefault("annotations", {})[RAY_PODS_CODE_ANNOTATION] = ray_pods_digest()
    if settings.any_autoscaling:
        # Cluster Autoscaler may drain an underused node and so kill a serving replica; with this it
        # leaves any node with a Ray pod alone (its FAQ, "What types of pods can prevent CA from removing
        # a node?"). Ray's autoscaler removes idle workers itself, and the empty node goes then.
        for template in _pod_templates(cluster):
            annotations = template["metadata"].setdefault("annotations", {})
            annotations["cluster-autoscaler.kubernetes.io/safe-to-evict"] = "false"
    config_hash = cluster_config_hash(doc)
    doc["metadata"]["labels"] = {CLUSTER_CONFIG_LABEL: config_hash}
    for pod_template in _pod_templates(cluster):
        pod_template["metadata"]["labels"][CLUSTER_CONFIG_LABEL] = config_hash
    found = checks.problems(doc)
    if found:
        raise ServeConfigError("serve_config/*.yaml: " + "; ".join(found))
    return doc


def _ingress_group(
    settings: Settings, template: dict[str, Any], system_node_labels: dict[str, str], *, reads_s3: bool
) -> dict[str, Any]:
    """The ingress's worker group on the system nodes: a fixed size, one pod per ingress replica."""
    group = copy.deepcopy(template)
    count = ingress_replicas()
    group.update({"groupName": INGRESS_GROUP, "replicas": count, "minReplicas": count, "maxReplicas": count})
    group["rayStartParams"]["resources"] = f"'{json.dumps({INGRESS_GROUP: 1})}'"
    group["template"]["metadata"] = {"labels": pod_labels(settings)}
    pod = group["template"]["spec"]
    pod["nodeSelector"] = dict(system_node_labels)
    container = pod["containers"][0]
    container["image"] = settings.ray_image
    if reads_s3:
        pod["serviceAccountName"] = RAY_SERVICE_ACCOUNT
    mount_ray_pods_code(settings, pod, container)
    return group


def _pod_templates(cluster: dict[str, Any]) -> list[dict[str, Any]]:
    return [cluster["headGroupSpec"]["template"], *(g["template"] for g in cluster["workerGroupSpecs"])]


REPLICA_BOUND_FIELDS = ("replicas", "minReplicas", "maxReplicas")


def cluster_config_hash(rayservice: dict[str, Any]) -> str:
    """A short, stable hash of the RayService's rayClusterConfig (a label value).

    The label sits on the pod templates too; it enters the hash with its value
    blanked, so the hash never depends on itself.
    """
    cluster = copy.deepcopy(rayservice["spec"]["rayClusterConfig"])
    for pod_template in _pod_templates(cluster):
        pod_template.setdefault("metadata", {}).setdefault("labels", {})[CLUSTER_CONFIG_LABEL] = ""
    # Under Ray's autoscaler the replica bounds are left out, as KubeRay leaves replicas, minReplicas
    # and maxReplicas out of its own hash (rayservice_controller.go,
    # generateHashWithoutReplicasAndWorkersToDelete): a changed bound must not rebuild a running
    # cluster. KubeRay does not copy them into the running RayCluster either (shouldUpdateCluster
    # stops at an equal hash), so a new bound reaches Serve at once and Ray's autoscaler at the
    # cluster's next rebuild (docs/operations.md, "Scaling"). Without the autoscaler nothing but a rebuild would
    # start the pods of a new fixed count: there they stay in.
    if cluster.get("enableInTreeAutoscaling"):
        for group in cluster.get("workerGroupSpecs", []):
            for bound in REPLICA_BOUND_FIELDS:
                group.pop(bound, None)
    text = json.dumps(cluster, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def pod_labels(settings: Settings) -> dict[str, str]:
    """Labels on every Ray pod of the service, for Services that select them."""
    return {"app.kubernetes.io/name": settings.service_name}


def ingress_selector(settings: Settings) -> dict[str, str]:
    """The client endpoint's pods: the ingress group's, of whichever Ray cluster serves.

    KubeRay 1.7 labels every RayService worker pod ray.io/serve=true and leaves readiness to
    the pod's probe, which checks the Serve proxy on the serve port (ray-operator
    controllers/ray/common/pod.go, BuildPod and the readiness probe). Serve runs a proxy on
    every node that holds a replica, the GPU workers' too: a client whose stream enters there
    loses it with that node, with no error from the ingress, and meets an admission queue per
    proxy. So the group is named, and the RayCluster is not (ray.io/cluster): the selector
    follows a cluster KubeRay builds under another name.
    """
    return {**pod_labels(settings), "ray.io/group": INGRESS_GROUP, "ray.io/serve": "true"}


def ingress_service_name(settings: Settings) -> str:
    """The stack's ClusterIP Service on ingress_selector's pods: what the tools' port-forward reaches."""
    return f"{settings.service_name}-ingress"
