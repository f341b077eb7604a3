"""Every Helm release renders, through the deploy's own helm, into objects Kubernetes' own schemas accept."""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate
import pytest

from settings.catalog import ALL_CHARTS, KUBERNETES_VERSIONS
from tests.conftest import synth
from tests.support.autoscaling import AUTOSCALING
from tests.support.helm import rendered_releases
from tests.support.kuberay_schema import custom_resource_errors

pytestmark = pytest.mark.xdist_group("placement")

# Every optional chart: the operator for secrets, the load balancer controller, Cluster Autoscaler (a GPU range).
EVERYTHING = {"hf_token_secret_name": "prod/hf-token", "internal_endpoint_cidrs": "10.0.0.0/8", **AUTOSCALING}


def _objects(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """A List's items, or the object itself."""
    return [o for item in obj.get("items", []) for o in _objects(item)] if obj["kind"] == "List" else [obj]


@pytest.mark.parametrize("version", sorted(KUBERNETES_VERSIONS))
def test_every_release_renders_valid_objects(version: str) -> None:
    releases = rendered_releases(synth(kubernetes_version=version, **EVERYTHING), version)
    assert set(releases) == {pin.release for pin in ALL_CHARTS}
    everything = {release: [o for obj in rendered for o in _objects(obj)] for release, rendered in releases.items()}
    crds = [o for objects in everything.values() for o in objects if o["kind"] == "CustomResourceDefinition"]
    counts = {}
    for release, objects in everything.items():
        assert objects, release
        counts[release] = len(objects)
        for obj in objects:
            where = f"{release}: {obj['kind']}/{obj['metadata'].get('name')}"
            errors = custom_resource_errors(obj, crds)
            if errors is not None:
                assert errors == [], where
                continue
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as err:
                pytest.fail(f"{where}: {err.message}")
    print(version, counts)


def test_strict_validation_catches_a_bad_field_in_a_rendered_object() -> None:
    rendered = rendered_releases(synth(), "1.36")
    (daemonset,) = [o for o in rendered["aws-efa-k8s-device-plugin"] if o["kind"] == "DaemonSet"]
    broken = copy.deepcopy(daemonset)
    broken["spec"]["template"]["spec"]["tolerations"][0]["efect"] = "NoSchedule"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, "1.36", strict=True)
