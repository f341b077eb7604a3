"""The serving image kept on every system node, so a Ray head that moves to one starts without a 20 GB pull.

Under GCS fault tolerance a lost head has KubeRay's 600 s (the workers' RAY_gcs_rpc_server_reconnect_timeout_s)
to come back before the workers give up and take their replicas. The head runs the serving image; on a system
node that never ran it, the pull alone takes `plan`'s 240-360 s. A DaemonSet that runs the image's own `sleep`
makes each system node pull it as it joins, and keeps it there (the kubelet's image garbage collection spares
an image a running container uses). A changed image rolls the DaemonSet: the nodes pull the new one beside
the old before or while the Ray cluster is rebuilt.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from serve_config import serving_image
from settings import Settings

HEAD_IMAGE = "ray-head-image"


def head_image_daemonset(
    settings: Settings, *, namespace: str, system_node_labels: Mapping[str, str]
) -> dict[str, Any]:
    """The DaemonSet that holds the serving image on every system node."""
    labels = {"app.kubernetes.io/name": HEAD_IMAGE}
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": HEAD_IMAGE, "namespace": namespace},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": dict(system_node_labels),
                    "terminationGracePeriodSeconds": 0,
                    "automountServiceAccountToken": False,
                    "containers": [
                        {
                            "name": "hold",
                            "image": serving_image(settings),
                            "command": ["sleep", "infinity"],
                            "resources": {
                                "requests": {"cpu": "10m", "memory": "32Mi"},
                                "limits": {"cpu": "10m", "memory": "32Mi"},
                            },
                            "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True},
                        }
                    ],
                },
            },
        },
    }
