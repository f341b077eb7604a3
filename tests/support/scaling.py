"""The deployed RayService and serve config the scaling tests read."""

from __future__ import annotations

from typing import Any

import yaml

from tools.serve_controller import deployment_infos

RANGE: dict[str, Any] = {"decode_max_replicas": 3, "decode_target_ongoing_requests": 8}


SIDE_RANGES: dict[str, Any] = {
    **RANGE,
    "prefill_max_replicas": 2,
    "prefill_target_ongoing_requests": 2,
    "request_timeout_seconds": 900,
}


def serve_doc_of(rayservice: dict[str, Any]) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(rayservice["spec"]["serveConfigV2"])
    return doc


def deployed_rayservice(doc: dict[str, Any]) -> dict[str, Any]:
    """What Serve's controller runs for the serve config's one application (tools/serve_controller.py)."""

    (app,) = doc["applications"]
    return deployment_infos(app)


def ray_cluster_of(rayservice: dict[str, Any]) -> dict[str, Any]:
    """The RayCluster KubeRay makes for the RayService: its rayClusterConfig as the spec."""
    return {"metadata": {"name": "pd-llm-abcde", "namespace": "llm"}, "spec": rayservice["spec"]["rayClusterConfig"]}
