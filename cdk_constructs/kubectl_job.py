"""A one-shot kubectl Job on the system nodes, named after its own spec."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from settings.catalog import KUBECTL_IMAGE

SCRATCH_HOME = "/tmp"  # noqa: S108 - an emptyDir of the Job's own pod


def _kubectl(name: str, args: Sequence[str]) -> dict[str, Any]:
    return {
        "name": name,
        "image": KUBECTL_IMAGE,
        # The image's entrypoint is not documented; name the binary.
        "command": ["kubectl"],
        "args": list(args),
        # kubectl writes its discovery cache under $HOME; the root
        # filesystem is read-only, so HOME is a scratch emptyDir.
        "env": [{"name": "HOME", "value": SCRATCH_HOME}],
        "volumeMounts": [{"name": "home", "mountPath": SCRATCH_HOME}],
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 65532,
            "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        },
    }


def kubectl_job(
    *,
    name_prefix: str,
    namespace: str,
    service_account: str,
    args: Sequence[str],
    node_selector: Mapping[str, str],
    first: Sequence[Sequence[str]] = (),
) -> dict[str, Any]:
    """A Job that runs `kubectl ARGS` once, as a non-root user on a read-only root filesystem.

    first: kubectl commands that run before ARGS, one after another, each to
    success (init containers: a pod's containers would run at the same time).

    Its name ends in a hash of its spec: a Job's pod template is immutable, so a
    changed spec under the same name would fail to apply on the next deploy. A
    new name is a new Job, and the kubectl provider prunes the old one.
    """
    pod: dict[str, Any] = {
        "serviceAccountName": service_account,
        "restartPolicy": "OnFailure",
        "nodeSelector": dict(node_selector),
        "containers": [_kubectl("kubectl", args)],
        "volumes": [{"name": "home", "emptyDir": {}}],
    }
    if first:
        pod["initContainers"] = [_kubectl(f"kubectl-{index}", step) for index, step in enumerate(first)]
    spec = {"backoffLimit": 6, "template": {"spec": pod}}
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:8]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": f"{name_prefix}-{digest}", "namespace": namespace},
        "spec": spec,
    }
