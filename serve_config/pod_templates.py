"""The RayService that runs the application: rayservice.yaml filled in with the settings.

Its Ray cluster's pod templates: the head's on the system nodes, a worker group per side on the GPU
nodes (their GPUs, EFA devices, model cache and custom resources), the ingress's group on the system
nodes; and the hash of the cluster's spec that tells a running cluster built from another spec.
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

from ray_pods.ingress_ready import SERVING_DASHBOARD_ENV
from serve_config import (
    CLUSTER_CONFIG_LABEL,
    DASHBOARD_PORT,
    EFA_RESOURCE,
    GCS_STORE_ADDRESS_PLACEHOLDER,
    GCS_STORE_SECRET,
    GCS_STORE_SECRET_KEY,
    GPU_RESOURCE,
    HF_TOKEN_SECRET,
    HF_TOKEN_SECRET_KEY,
    INGRESS_GROUP,
    PREFILL,
    RAY_SERVICE_ACCOUNT,
    SERVE_PORT,
    SIDES,
    ServeConfigError,
    checks,
    data_file,
    pod_labels,
    serving_image,
)
from serve_config.application import serve_config_v2
from serve_config.deployments import ingress_replicas
from serve_config.endpoint_keys import (
    RAY_PODS_CODE_ANNOTATION,
    RAY_PODS_PACKAGE,
    RAY_PODS_PYTHONPATH,
    mount_ray_pods_code,
    ray_pods_digest,
)
from serve_config.ingress_prestop import prestop_script
from settings import Settings
from settings.catalog import IMAGE_RAY_VERSION, LOCAL_NVME_MOUNT
from settings.sizing import (
    INGRESS_READINESS_PERIOD_S,
    INGRESS_READINESS_TIMEOUT_S,
    blue_green,
    cluster_deletion_delay_seconds,
    ingress_surge_room,
    ingress_termination_grace_seconds,
)

# The ingress pods' readiness probe, in the ray_pods package; it reads the serving cluster's dashboard from
# SERVING_DASHBOARD_ENV (its own cluster's from KubeRay's FQ_RAY_IP).
INGRESS_READY_SCRIPT = "ingress_ready.py"

# On instance-store GPU types: the Hugging Face cache on the node's NVMe RAID0, a
# hostPath, so a restarted pod finds the weights it downloaded (catalog.LOCAL_NVME_MOUNT).
MODEL_CACHE_VOLUME = "model-cache"
MODEL_CACHE_MOUNT = "/model-cache"
# The serving image's system CA bundle (Ubuntu's ca-certificates), which holds the Amazon roots that sign the GCS
# store's certificate. Ray's Redis client otherwise trusts BoringSSL's default locations (/etc/ssl/cert.pem, which
# Ubuntu does not have, and the /etc/ssl/certs directory); verify's image probe checks the file is there
# (tools/in_pod/image_probe.py, CA_BUNDLES).
IMAGE_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
# The variable gcs_server reads its Redis client's CA file from (RayConfig REDIS_CA_CERT, redis_context.cc).
REDIS_CA_CERT_ENV = "RAY_REDIS_CA_CERT"


def rayservice_data() -> dict[str, Any]:
    """A copy of rayservice.yaml."""
    return data_file("rayservice.yaml")


def replicas(settings: Settings, side: str) -> int:
    """Engine replicas of a side (its minimum): one Ray worker pod each, holding its tensor-parallel group's GPUs."""
    return settings.side_replicas(side)


def _worker_env(settings: Settings, base: list[dict[str, Any]]) -> list[dict[str, Any]]:
    env = list(base)
    if settings.gpu_instance.gpudirect_rdma:
        # Only where the device has RDMA: on G6 this would abort libfabric.
        env.append({"name": "FI_EFA_USE_DEVICE_RDMA", "value": "1"})
    return env


def token_env(settings: Settings) -> list[dict[str, Any]]:
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
    if blue_green(settings):
        # KubeRay 1.7's blue/green: a changed rayClusterConfig gets a second cluster, and traffic moves
        # to it once its head is ready and every app RUNNING; the old one goes this long after.
        spec["upgradeStrategy"] = {"type": "NewCluster"}
        spec["rayClusterDeletionDelaySeconds"] = cluster_deletion_delay_seconds(settings)
    cluster = spec["rayClusterConfig"]
    cluster["rayVersion"] = IMAGE_RAY_VERSION
    if settings.gcs_fault_tolerance:
        cluster["gcsFaultToleranceOptions"] = gcs_fault_tolerance_options()
    if not settings.ray_token_auth:
        del cluster["authOptions"]

    cluster["headGroupSpec"]["template"]["metadata"] = {"labels": pod_labels(settings)}
    head_pod = cluster["headGroupSpec"]["template"]["spec"]
    head_pod["nodeSelector"] = dict(system_node_labels)
    head = head_pod["containers"][0]
    head["ports"].append({"containerPort": SERVE_PORT, "name": "serve"})
    head["image"] = serving_image(settings)
    if settings.hf_token_secret_name is not None:
        head["env"] = [*head.get("env", []), *token_env(settings)]
    if settings.gcs_fault_tolerance:
        # The store's CA named, not left to the TLS library's defaults; KubeRay's cleanup Job copies the head's env.
        head["env"] = [*head.get("env", []), {"name": REDIS_CA_CERT_ENV, "value": IMAGE_CA_BUNDLE}]
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
        container["image"] = serving_image(settings)
        container["env"] = _worker_env(settings, container.get("env", [])) + token_env(settings)
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
                    "image": serving_image(settings),
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


def gcs_fault_tolerance_options(address: str = GCS_STORE_ADDRESS_PLACEHOLDER) -> dict[str, Any]:
    """KubeRay 1.7's Redis GCS fault tolerance: the head gets RAY_REDIS_ADDRESS and `--redis-password=$REDIS_PASSWORD`
    from the Secret (common/pod.go configureRedisFT), the workers wait 600 s for a lost GCS
    (RAY_gcs_rpc_server_reconnect_timeout_s), and the storage namespace is the RayCluster's UID, so a new
    cluster (blue/green, recreate) starts from empty tables. The stack puts the store's endpoint in address."""
    password = {"valueFrom": {"secretKeyRef": {"name": GCS_STORE_SECRET, "key": GCS_STORE_SECRET_KEY}}}
    return {"redisAddress": address, "redisPassword": password}


def _ingress_group(
    settings: Settings, template: dict[str, Any], system_node_labels: dict[str, str], *, reads_s3: bool
) -> dict[str, Any]:
    """The ingress's worker group on the system nodes: one pod per ingress replica, and one more where the
    system nodes hold it under Ray's autoscaler (settings/sizing/upgrade.py, ingress_surge_room): the pod of the
    surge replica `make upgrade` starts (serve_config/deployments.py, ingress_surge_replicas), which the autoscaler
    adds only while that replica waits for it and removes once idle."""
    group = copy.deepcopy(template)
    count = ingress_replicas()
    high = count + ingress_surge_room(settings)
    group.update({"groupName": INGRESS_GROUP, "replicas": count, "minReplicas": count, "maxReplicas": high})
    group["rayStartParams"]["resources"] = f"'{json.dumps({INGRESS_GROUP: 1})}'"
    group["template"]["metadata"] = {"labels": pod_labels(settings)}
    pod = group["template"]["spec"]
    pod["nodeSelector"] = dict(system_node_labels)
    container = pod["containers"][0]
    container["image"] = serving_image(settings)
    if reads_s3:
        pod["serviceAccountName"] = RAY_SERVICE_ACCOUNT
    _ready_only_when_serving(settings, container)
    if settings.internal_endpoint_cidrs:
        _outlast_nlb_drain(settings, pod, container)
    mount_ray_pods_code(settings, pod, container)
    return group


def serving_dashboard(settings: Settings) -> str:
    """The dashboard behind the RayService's own head Service, which KubeRay points at the serving
    cluster's head (common/service.go, BuildHeadServiceForRayService, v1.7.0: `<name>-head-svc`, the
    head container's ports)."""
    return f"http://{settings.service_name}-head-svc:{DASHBOARD_PORT}"


def _ready_only_when_serving(settings: Settings, container: dict[str, Any]) -> None:
    """The ingress container's readiness probe (ray_pods/ingress_ready.py) in place of KubeRay's: only
    the serving cluster's ingress pods are the client Services' endpoints, during a blue/green upgrade
    too. KubeRay 1.7.0 keeps a readiness probe the template sets (common/pod.go,
    initLivenessAndReadinessProbe, `if rayContainer.ReadinessProbe == nil`) and still adds its liveness
    probe. Its timing is in settings/sizing/upgrade.py."""
    script = f"{RAY_PODS_PYTHONPATH}/{RAY_PODS_PACKAGE}/{INGRESS_READY_SCRIPT}"
    container["readinessProbe"] = {
        "exec": {"command": ["sh", "-c", f'exec "$(command -v python3 || command -v python)" {script}']},
        "initialDelaySeconds": 10,
        "periodSeconds": INGRESS_READINESS_PERIOD_S,
        "timeoutSeconds": INGRESS_READINESS_TIMEOUT_S,
        "successThreshold": 1,
        "failureThreshold": 1,
    }
    container.setdefault("env", []).append({"name": SERVING_DASHBOARD_ENV, "value": serving_dashboard(settings)})


def _outlast_nlb_drain(settings: Settings, pod: dict[str, Any], container: dict[str, Any]) -> None:
    """Behind the internal NLB, a terminating ingress pod keeps serving until no stream can still
    reach it: the NLB opens connections to its deregistering target for a while, then lets each run
    (settings.sizing.ingress_prestop_seconds). KubeRay 1.7.0 keeps both fields: BuildPod copies the
    group template's pod spec and sets only the Ray container's command, args, environment, probes
    and volumes (ray-operator/controllers/ray/common/pod.go), and no controller sets a lifecycle.
    It ends early once no connection is open on the Serve port (serve_config/ingress_prestop.py), so a
    `cdk destroy` without clients waits only out the NLB's propagation. An exec hook needs no feature gate.
    """
    script = prestop_script(settings, SERVE_PORT)
    container["lifecycle"] = {"preStop": {"exec": {"command": ["/bin/sh", "-c", script]}}}
    pod["terminationGracePeriodSeconds"] = ingress_termination_grace_seconds(settings)


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
    # The GCS store's address is the stack's (a CloudFormation token when synthesized), not a setting: the hash
    # reads the placeholder wherever it is (a replaced store is a replaced stateful resource, which pr_guard
    # refuses).
    if "gcsFaultToleranceOptions" in cluster:
        cluster["gcsFaultToleranceOptions"]["redisAddress"] = GCS_STORE_ADDRESS_PLACEHOLDER
    text = json.dumps(cluster, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]
