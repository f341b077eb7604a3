"""The GPU node group's ScalingConfig with a range, across the deploys that create, replace and update it.

CreateNodegroup takes all of the scaling sizes or none (botocore's EKS model, NodegroupScalingConfig:
"When creating a node group, you must specify all or none of the properties"), and CloudFormation
creates the group with it both on the first deploy and whenever a create-only property changes (the
resource's registry schema, createOnlyProperties, as cfn-lint ships it). On an update CloudFormation
passes DesiredSize on only when its template value changes ("Whenever this parameter changes, the
number of worker nodes in the node group is updated to the specified size", the same model's
desiredSize), so a value held constant leaves Cluster Autoscaler's count alone.
"""

from __future__ import annotations

from typing import Any

import pytest
from cfnlint.schema import PROVIDER_SCHEMA_MANAGER, ResourceNotFoundError

from settings import settings_from
from settings.sizing import gpu_node_bounds
from tests.conftest import PROJECT_CONTEXT, resources, synth

# Both sides from one replica to two: the GPU group from 2 nodes to 4.
RANGE = {
    "prefill_max_replicas": "2",
    "decode_max_replicas": "2",
    "prefill_target_ongoing_requests": "2",
    "decode_target_ongoing_requests": "2",
}
GPU_AMI_TYPE = "AL2023_x86_64_NVIDIA"
# Settings changes that give the group a new create-only property, so CloudFormation creates a new
# group and deletes the old one: the settings, and that property.
REPLACING: dict[str, tuple[dict[str, str], str]] = {
    "instance type": ({"gpu_instance_type": "g6e.8xlarge"}, "InstanceTypes"),
    "capacity type": (
        {
            "gpu_capacity_reservation_id": "cr-0123456789abcdef0",
            "gpu_capacity_block": "true",
            "gpu_placement_group": "false",
        },
        "CapacityType",
    ),
    # The subnet is replaced in the new AZ, and so the group's Subnets change.
    "availability zone": ({"gpu_availability_zone": "us-east-1c"}, "Subnets"),
}
# Changes that update the group in place, or leave it as it is; none moves the minimum.
IN_PLACE = {
    "a larger maximum": {"decode_max_replicas": "3"},
    "another serving image": {"ray_image": "public.ecr.aws/deep-learning-containers/ray:serve-llm-cuda-v1.0.1"},
}


def _create_only(type_: str) -> list[str]:
    """The top-level properties a change of which replaces a resource of this type (a nested create-only
    path counts as its top-level property); none for a type without a registry schema."""
    try:
        schema = PROVIDER_SCHEMA_MANAGER.get_resource_schema("us-east-1", type_).schema
    except ResourceNotFoundError:
        return []
    return sorted({p.split("/")[2] for p in schema.get("createOnlyProperties", [])})


def _refs(value: Any) -> set[str]:
    """The logical ids a property value takes a Ref or Fn::GetAtt of."""
    if isinstance(value, list):
        return set().union(*map(_refs, value)) if value else set()
    if not isinstance(value, dict):
        return set()
    found = set()
    if isinstance(value.get("Ref"), str) and not value["Ref"].startswith("AWS::"):
        found.add(value["Ref"])
    if isinstance(value.get("Fn::GetAtt"), list):
        found.add(value["Fn::GetAtt"][0])
    return found.union(*map(_refs, value.values()))


def _replaced_by(before: dict[str, Any], after: dict[str, Any], logical_id: str) -> list[str]:
    """The create-only properties of this resource whose value changes between the two templates: the
    template value itself, or a resource it refers to, replaced in turn (its physical id then changes).
    CloudFormation replaces the resource for any."""
    old, new = before["Resources"].get(logical_id), after["Resources"].get(logical_id)
    if old is None or new is None or old["Type"] != new["Type"]:
        return ["(a new resource)"]
    changed = []
    for name in _create_only(new["Type"]):
        was, now = old.get("Properties", {}).get(name), new.get("Properties", {}).get(name)
        if was != now or any(_replaced_by(before, after, ref) for ref in _refs(now)):
            changed.append(name)
    return changed


def _gpu_group_id(template: dict[str, Any]) -> str:
    (logical_id,) = [
        k for k, r in resources(template, "AWS::EKS::Nodegroup").items() if r["Properties"]["AmiType"] == GPU_AMI_TYPE
    ]
    return logical_id


def _gpu_group(template: dict[str, Any]) -> dict[str, Any]:
    props: dict[str, Any] = template["Resources"][_gpu_group_id(template)]["Properties"]
    return props


def test_a_group_with_a_range_is_created_with_every_size() -> None:
    """The first deploy with a range creates the group in one step: CreateNodegroup gets all three sizes."""
    low, high = gpu_node_bounds(settings_from({**PROJECT_CONTEXT, **RANGE}))
    assert (low, high) == (2, 4)
    scaling = _gpu_group(synth(**RANGE))["ScalingConfig"]
    assert scaling == {"MinSize": low, "DesiredSize": low, "MaxSize": high}


@pytest.mark.parametrize("change", sorted(REPLACING))
def test_a_change_that_replaces_the_group_creates_it_with_every_size(change: str) -> None:
    overrides, replaced = REPLACING[change]
    before, after = synth(**RANGE), synth(**{**RANGE, **overrides})
    assert _replaced_by(before, after, _gpu_group_id(after)) == [replaced]
    scaling = _gpu_group(after)["ScalingConfig"]
    assert set(scaling) == {"MinSize", "DesiredSize", "MaxSize"}
    assert scaling["DesiredSize"] == scaling["MinSize"] < scaling["MaxSize"]


@pytest.mark.parametrize("change", sorted(IN_PLACE))
def test_a_change_in_place_leaves_desired_size_as_it_was(change: str) -> None:
    """DesiredSize's template value is the minimum and unchanged, so CloudFormation does not send it and
    the count Cluster Autoscaler set stays."""
    before_template, after_template = synth(**RANGE), synth(**{**RANGE, **IN_PLACE[change]})
    assert _replaced_by(before_template, after_template, _gpu_group_id(after_template)) == []
    before, after = _gpu_group(before_template), _gpu_group(after_template)
    assert after["ScalingConfig"]["MinSize"] == before["ScalingConfig"]["MinSize"]
    assert "DesiredSize" in before["ScalingConfig"]
    assert after["ScalingConfig"]["DesiredSize"] == before["ScalingConfig"]["DesiredSize"]


def test_giving_a_fixed_group_a_range_leaves_desired_size_as_it_was() -> None:
    """Adding maxima to a deployed fixed group: its DesiredSize (the count) is unchanged, so it is not sent."""
    fixed = _gpu_group(synth())["ScalingConfig"]
    ranged = _gpu_group(synth(**RANGE))["ScalingConfig"]
    assert ranged["MinSize"] == fixed["MinSize"] and ranged["MaxSize"] > fixed["MaxSize"]
    assert ranged["DesiredSize"] == fixed["DesiredSize"]


def test_a_new_minimum_is_the_new_desired_size() -> None:
    """The one in-place change that sends DesiredSize: the group is set to its new minimum (README,
    "Cluster Autoscaler"), which also lets a minimum rise above the current count."""
    before = _gpu_group(synth(**RANGE))["ScalingConfig"]
    after = _gpu_group(synth(**{**RANGE, "prefill_replicas": "2", "prefill_max_replicas": "3"}))["ScalingConfig"]
    assert after["MinSize"] == before["MinSize"] + 1
    assert after["DesiredSize"] == after["MinSize"]
