"""The cluster a synthesized template brings up: its nodes and every pod, placed (tests/placement.py)."""

from __future__ import annotations

import functools
import json
from typing import Any

from settings.catalog import EFA_DEVICE_PLUGIN, NVIDIA_DEVICE_PLUGIN
from tests.conftest import manifests, rayservice_from, synth
from tests.support import placement
from tests.support.helm import rendered_releases

# The DaemonSet of each device plugin release: its resource exists on a node only where it runs.
DEVICE_PLUGIN_DAEMONSETS = {
    f"DaemonSet/{NVIDIA_DEVICE_PLUGIN.release}": NVIDIA_DEVICE_PLUGIN.release,
    f"DaemonSet/{EFA_DEVICE_PLUGIN.release}": EFA_DEVICE_PLUGIN.release,
}


def workloads(template: dict[str, Any], kubernetes_version: str) -> list[placement.Workload]:
    """Every pod controller the cluster will run: charts, our manifests, the Ray pods, EKS's add-ons."""
    found: list[placement.Workload] = []
    for release, objects in rendered_releases(template, kubernetes_version).items():
        found += placement.workloads_from_objects(objects, f"chart {release}")
    found += placement.workloads_from_objects(manifests(template), "stack manifest")
    found += placement.ray_workloads(rayservice_from(template))
    found += placement.eks_addon_workloads()
    found += placement.cloudwatch_observability_workloads(template)
    return found


def priority_classes(template: dict[str, Any], kubernetes_version: str) -> dict[str, placement.PriorityClass]:
    """The PriorityClasses the charts and the stack's manifests create, and Kubernetes' own."""
    objects = [obj for objs in rendered_releases(template, kubernetes_version).values() for obj in objs]
    return placement.priority_classes([*objects, *manifests(template)])


@functools.cache
def _placed(overrides_json: str) -> placement.Placement:
    overrides: dict[str, Any] = json.loads(overrides_json)
    template = synth(**overrides)
    version = str(overrides.get("kubernetes_version", "1.36"))
    nodes = placement.nodes_from_template(template, version)
    classes = priority_classes(template, version)
    return placement.place(nodes, workloads(template, version), DEVICE_PLUGIN_DAEMONSETS, classes)


def placed(**overrides: Any) -> placement.Placement:
    """The placement on the system node group at its minimum size, for these settings (cached)."""
    return _placed(json.dumps(overrides, sort_keys=True))
