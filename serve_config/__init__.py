"""The Ray Serve LLM application and its RayService, built from data and settings.

The invariant parts are the YAML files beside this package's modules; the code fills in only what
follows from the settings, so every value has one home: the Serve application in application.py,
the RayService and its pod templates in pod_templates.py.

This module holds the names they share with the stack and the tools: the sides, the ports, the
resources, the labels and Secrets of the Ray pods, and the Service that reaches the ingress.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import yaml

from settings import Settings, catalog

HERE = Path(__file__).parent


@functools.cache
def _loaded(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((HERE / name).read_text(encoding="utf-8"))
    return loaded


def data_file(name: str) -> dict[str, Any]:
    """A copy of one of the YAML files beside this package's modules, read once per process."""
    return copy.deepcopy(_loaded(name))


class ServeConfigError(ValueError):
    """The serve config data breaks disaggregation (see serve_config/checks.py)."""


# The two sides; each is also the name of its worker group and its custom resource.
PREFILL, DECODE = "prefill", "decode"
SIDES: tuple[str, str] = (PREFILL, DECODE)
# The custom resource the ingress worker group advertises and the ingress replica asks for.
INGRESS_GROUP = "ingress"

SERVE_PORT = 8000
# The head's dashboard (the REST API KubeRay deploys serveConfigV2 through, and
# the job API) and KubeRay's default metrics port on every Ray container.
DASHBOARD_PORT = 8265
METRICS_PORT = 8080
# Extended resources the device plugins advertise on the GPU nodes.
GPU_RESOURCE = "nvidia.com/gpu"
EFA_RESOURCE = "vpc.amazonaws.com/efa"
# With an s3:// model_source, every Ray pod runs as this ServiceAccount (its Pod
# Identity role reads the prefix: cdk_constructs/model_weights.py).
RAY_SERVICE_ACCOUNT = "ray-model-reader"
HF_TOKEN_SECRET = "hf-token"  # noqa: S105 - a Secret's name, not a token
HF_TOKEN_SECRET_KEY = "token"  # noqa: S105 - a key name
# The GCS store's AUTH token, synced from Secrets Manager (cdk_constructs/gcs_store.py); KubeRay reads it for the
# head's `ray start --redis-password` and its cleanup Job.
GCS_STORE_SECRET = "ray-gcs-store"  # noqa: S105 - a Secret's name
GCS_STORE_SECRET_KEY = "auth-token"  # noqa: S105 - a key name
# Where the RayService's store address goes until the stack puts the store's endpoint there (a CloudFormation
# token, which must not enter the cluster-config hash: tokens are numbered by construction order).
GCS_STORE_ADDRESS_PLACEHOLDER = "rediss://gcs-store.invalid:6380"
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


def serving_image(settings: Settings) -> str:
    """The image every Ray pod and warm-node placeholder runs: ray_image, or its copy in the account's
    pull-through cache, written with CloudFormation's pseudo parameters (${AWS::AccountId} and the like).
    The stack hands that text to Fn::Sub; here it stays text, so the cluster config hash never sees a token."""
    prefix = settings.image_pull_through_cache_prefix
    if prefix is None:
        return settings.ray_image
    path = settings.ray_image.removeprefix(catalog.ECR_PUBLIC_REGISTRY + "/")
    return "${AWS::AccountId}.dkr.ecr.${AWS::Region}.${AWS::URLSuffix}/" + f"{prefix}/{path}"


def ingress_service_name(settings: Settings) -> str:
    """The stack's ClusterIP Service on ingress_selector's pods: what the tools' port-forward reaches."""
    return f"{settings.service_name}-ingress"
