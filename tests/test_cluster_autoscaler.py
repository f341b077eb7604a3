"""Cluster Autoscaler on the GPU group: present only with a range, the pinned chart's
Deployment as rendered by the deploy's own helm, its IAM against kubernetes/autoscaler's source, the
node group's tags, the Ray pods' eviction guard (the scaling config: tests/test_gpu_node_scaling.py)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from cdk_constructs import cluster_autoscaler as ca
from cdk_constructs.gpu_nodes import CA_GPU_LABEL, CA_RESOURCE_TAG_PREFIX
from settings import settings_from
from settings.catalog import CLUSTER_AUTOSCALER, CLUSTER_AUTOSCALER_IMAGE_TAGS, KUBERNETES_VERSIONS
from settings.sizing import gpu_node_bounds
from stacks.pd_inference_stack import PdInferenceStack
from tests.conftest import PROJECT_CONTEXT, manifests, only, resources, synth
from tests.support.autoscaling import AUTOSCALING
from tests.support.helm import rendered_releases

# Both sides from one replica to two: the GPU group from 2 nodes to 4.
GPU_NODEGROUP = {"AmiType": "AL2023_x86_64_NVIDIA"}
SAFE_TO_EVICT = "cluster-autoscaler.kubernetes.io/safe-to-evict"
# The image the chart runs (its values.yaml image.repository); only the tag is ours.
IMAGE_REPOSITORY = "registry.k8s.io/autoscaling/cluster-autoscaler"


# The AWS calls Cluster Autoscaler makes for a managed node group, each with its caller in
# kubernetes/autoscaler cluster-autoscaler/cloudprovider/aws/ at cluster-autoscaler-1.36.1. Reads of
# any resource:
SOURCE_READS = {
    "autoscaling:DescribeAutoScalingGroups": "aws_wrapper.go getAutoscalingGroupsByNames, getAutoscalingGroupsByTags",
    "autoscaling:DescribeScalingActivities": "auto_scaling_groups.go isNodeGroupAvailable",
    "ec2:DescribeInstanceTypes": "aws_util.go GenerateEC2InstanceTypes (--aws-use-static-instance-list=false)",
    "ec2:DescribeLaunchTemplateVersions": "aws_wrapper.go getLaunchTemplateData",
}
# Of the node group (a group at zero nodes: its labels, taints and node-template tags):
SOURCE_NODEGROUP_READS = {"eks:DescribeNodegroup": "aws_wrapper.go getManagedNodegroupInfo"}
# Its writes, on the GPU group's Auto Scaling group only:
SOURCE_WRITES = {
    "autoscaling:SetDesiredCapacity": "auto_scaling_groups.go setAsgSizeNoLock (IncreaseSize, DecreaseTargetSize)",
    "autoscaling:TerminateInstanceInAutoScalingGroup": "auto_scaling_groups.go DeleteInstances (scale-down)",
}
# Called by the same files but never for this group, so not allowed: ec2:DescribeImages and
# ec2:GetInstanceTypesFromInstanceRequirements (aws_wrapper.go getInstanceTypeFromInstanceRequirements,
# groups sized by instance requirements only), autoscaling:DescribeLaunchConfigurations
# (getInstanceTypeByLaunchConfigNames, groups with a launch configuration only).


def _gpu_group(template: dict[str, Any]) -> dict[str, Any]:
    props: dict[str, Any] = only(template, "AWS::EKS::Nodegroup", **GPU_NODEGROUP)["Properties"]
    return props


def _gpu_group_id(template: dict[str, Any]) -> str:
    (logical_id,) = [
        k
        for k, r in resources(template, "AWS::EKS::Nodegroup").items()
        if r["Properties"]["AmiType"] == GPU_NODEGROUP["AmiType"]
    ]
    return logical_id


def _release_id(template: dict[str, Any]) -> str:
    (logical_id,) = [
        k
        for k, r in resources(template, "Custom::AWSCDK-EKS-HelmChart").items()
        if r["Properties"]["Chart"] == CLUSTER_AUTOSCALER.chart
    ]
    return logical_id


def _deployment(version: str) -> dict[str, Any]:
    rendered = rendered_releases(synth(kubernetes_version=version, **AUTOSCALING), version)
    (deployment,) = [o for o in rendered[CLUSTER_AUTOSCALER.release] if o["kind"] == "Deployment"]
    return copy.deepcopy(deployment)


def _flags(deployment: dict[str, Any]) -> dict[str, str]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    flags = {}
    for arg in container["command"][1:]:
        key, _, value = arg.removeprefix("--").partition("=")
        flags[key] = value
    return flags


def parse_auto_discovery(spec: str) -> dict[str, str]:
    """cloudprovider/aws/aws_manager.go parseASGAutoDiscoverySpec (1.32.7 to 1.36.1), line for line."""
    discoverer, sep, param = spec.partition(":")
    assert sep and discoverer == "asg", spec
    key, sep, value = param.partition("=")
    assert sep and key == "tag" and value, spec
    tags = {}
    for label in value.split(","):
        name, _, tag_value = label.partition("=")
        tags[name] = tag_value
    return tags


def test_every_accepted_kubernetes_minor_has_an_image_of_its_own_minor() -> None:
    assert set(CLUSTER_AUTOSCALER_IMAGE_TAGS) == set(KUBERNETES_VERSIONS)
    for minor, tag in CLUSTER_AUTOSCALER_IMAGE_TAGS.items():
        assert tag.startswith(f"v{minor}."), (minor, tag)


def test_defaults_have_no_autoscaler_and_a_fixed_group(template: dict[str, Any]) -> None:
    assert gpu_node_bounds(settings_from(PROJECT_CONTEXT)) == (2, 2)
    charts = {r["Properties"]["Chart"] for r in resources(template, "Custom::AWSCDK-EKS-HelmChart").values()}
    assert CLUSTER_AUTOSCALER.chart not in charts
    assert not any("ClusterAutoscaler" in logical_id for logical_id in template["Resources"])
    group = _gpu_group(template)
    assert group["ScalingConfig"] == {"MinSize": 2, "DesiredSize": 2, "MaxSize": 2}
    assert CA_GPU_LABEL not in group["Labels"]
    assert not any(key.startswith(CA_RESOURCE_TAG_PREFIX) for key in group.get("Tags", {}))
    assert not any(SAFE_TO_EVICT in str(doc) for doc in manifests(template))


def test_turning_autoscaling_on_adds_resources_and_renames_none(template: dict[str, Any]) -> None:
    """A deploy that adds maxima updates the GPU group in place (bounds, a label, a tag): no logical id moves.
    Where the new maximum holds a second Ray cluster (here 4 nodes, 2 at the minimum), the recreate Job and
    its RBAC go: KubeRay's NewCluster rolls the cluster from then on (tests/test_blue_green.py)."""
    scaled = synth(**AUTOSCALING)["Resources"]
    recreate = {k for k in template["Resources"] if k.startswith("LlmServiceRayClusterRecreate")}
    assert len(recreate) == 4 and not recreate & set(scaled)
    for logical_id, resource in template["Resources"].items():
        if logical_id not in recreate:
            assert scaled.get(logical_id, {}).get("Type") == resource["Type"], logical_id
    added = {k for k in scaled if k not in template["Resources"]}
    assert added and all(k.startswith("ClusterAutoscaler") for k in added), added


@pytest.mark.parametrize("version", sorted(KUBERNETES_VERSIONS))
def test_rendered_deployment_runs_the_minors_image_with_discovery_of_the_gpu_group(version: str) -> None:
    template = synth(kubernetes_version=version, **AUTOSCALING)
    deployment = _deployment(version)
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == f"{IMAGE_REPOSITORY}:{CLUSTER_AUTOSCALER_IMAGE_TAGS[version]}"
    flags = _flags(deployment)
    assert flags["cloud-provider"] == "aws"
    assert flags["namespace"] == CLUSTER_AUTOSCALER.namespace
    # The discovery tags, as Cluster Autoscaler parses them: this cluster's groups, and of those the GPU group.
    cluster = only(template, "AWS::EKS::Cluster")
    (cluster_id,) = [k for k, r in template["Resources"].items() if r is cluster]
    tags = parse_auto_discovery(flags["node-group-auto-discovery"])
    assert tags == {
        "k8s.io/cluster-autoscaler/enabled": "",
        f"k8s.io/cluster-autoscaler/${{{cluster_id}}}": "",
        ca.NODEGROUP_TAG: f"${{{_gpu_group_id(template)}.NodegroupName}}",
    }
    # The region from the environment: the pod cannot reach IMDS at hop limit 1.
    assert {"name": "AWS_REGION", "value": "${AWS::Region}"} in container["env"]
    assert pod["nodeSelector"] == {"role": "system"}
    assert "tolerations" not in pod or not pod["tolerations"]
    assert container["resources"] == ca.RESOURCES


def test_the_pod_identity_association_names_the_rendered_service_account() -> None:
    template = synth(**AUTOSCALING)
    deployment = _deployment("1.36")
    association = only(template, "AWS::EKS::PodIdentityAssociation", ServiceAccount=ca.SERVICE_ACCOUNT)
    assert association["Properties"]["Namespace"] == deployment["metadata"]["namespace"]
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == ca.SERVICE_ACCOUNT


def test_the_role_may_scale_only_the_gpu_group_and_read_what_the_source_reads() -> None:
    """The policy against the calls Cluster Autoscaler makes, written out here rather than read from the
    module, so that a change to the module's actions has to change this list too."""
    template = synth(**AUTOSCALING)
    association = only(template, "AWS::EKS::PodIdentityAssociation", ServiceAccount=ca.SERVICE_ACCOUNT)
    role_id = association["Properties"]["RoleArn"]["Fn::GetAtt"][0]
    (policy,) = [
        p for p in resources(template, "AWS::IAM::Policy").values() if p["Properties"]["Roles"] == [{"Ref": role_id}]
    ]
    statements = policy["Properties"]["PolicyDocument"]["Statement"]
    group_id = _gpu_group_id(template)
    cluster_ref = association["Properties"]["ClusterName"]
    by_action = {}
    for statement in statements:
        assert statement["Effect"] == "Allow"
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        for action in actions:
            assert action not in by_action, f"{action} is allowed twice"
            by_action[action] = statement
    assert set(by_action) == {*SOURCE_READS, *SOURCE_NODEGROUP_READS, *SOURCE_WRITES}
    for action in SOURCE_READS:
        assert by_action[action]["Resource"] == "*" and "Condition" not in by_action[action]
    for action in SOURCE_NODEGROUP_READS:
        assert by_action[action]["Resource"] == {"Fn::GetAtt": [group_id, "Arn"]}
    for action in SOURCE_WRITES:
        statement = by_action[action]
        assert statement["Condition"] == {
            "StringEquals": {
                "aws:ResourceTag/eks:cluster-name": cluster_ref,
                "aws:ResourceTag/eks:nodegroup-name": {"Fn::GetAtt": [group_id, "NodegroupName"]},
            }
        }
        assert statement["Resource"] == {
            "Fn::Join": [
                "",
                [
                    "arn:",
                    {"Ref": "AWS::Partition"},
                    ":autoscaling:",
                    {"Ref": "AWS::Region"},
                    ":",
                    {"Ref": "AWS::AccountId"},
                    ":autoScalingGroup:*:autoScalingGroupName/*",
                ],
            ]
        }


def test_the_pinned_actions_are_operations_of_their_services() -> None:
    """Each pinned action names an operation in botocore's model of its service (a misspelt one would
    be allowed by IAM and match nothing)."""
    import botocore.session

    session = botocore.session.get_session()
    for action in [*SOURCE_READS, *SOURCE_NODEGROUP_READS, *SOURCE_WRITES]:
        service, _, operation = action.partition(":")
        assert operation in session.get_service_model(service).operation_names, action


def test_the_release_waits_for_the_node_groups_and_its_credentials() -> None:
    template = synth(**AUTOSCALING)
    depends = set(template["Resources"][_release_id(template)]["DependsOn"])
    groups = set(resources(template, "AWS::EKS::Nodegroup"))
    association = {
        k for k in resources(template, "AWS::EKS::PodIdentityAssociation") if k.startswith("ClusterAutoscaler")
    }
    policy = {k for k in resources(template, "AWS::IAM::Policy") if k.startswith("ClusterAutoscaler")}
    assert groups | association | policy <= depends
    # With the internal endpoint, after the load balancer controller's webhook (it mutates every Service).
    private = synth(**AUTOSCALING, internal_endpoint_cidrs="10.0.0.0/8")
    lbc = {
        k
        for k, r in resources(private, "Custom::AWSCDK-EKS-HelmChart").items()
        if r["Properties"]["Chart"] == "aws-load-balancer-controller"
    }
    assert lbc <= set(private["Resources"][_release_id(private)]["DependsOn"])


def test_a_gpu_group_at_zero_nodes_still_offers_what_the_ray_pods_ask_for() -> None:
    """What the autoscaler's node template gets (aws_manager.go buildNodeFromTemplate): CPU, memory and
    nvidia.com/gpu from its instance table, labels and taints from eks:DescribeNodegroup, any other
    resource only from a node-template tag. Every worker's request must be met from those alone."""
    template = synth(**AUTOSCALING)
    group = _gpu_group(template)
    assert group["Labels"][CA_GPU_LABEL] == "nvidia-l4"
    from_tags = {
        key.removeprefix(CA_RESOURCE_TAG_PREFIX): int(value)
        for key, value in group["Tags"].items()
        if key.startswith(CA_RESOURCE_TAG_PREFIX)
    }
    # The autoscaler's instance table (cloudprovider/aws/ec2_instance_types.go, g6.8xlarge): 32 vCPU, 131072 MiB, 1 GPU.
    from_instance = {"cpu": 32, "memory": 131072 * 2**20, "nvidia.com/gpu": 1}
    (rayservice,) = [d for d in manifests(template) if d["kind"] == "RayService"]
    for worker_group in rayservice["spec"]["rayClusterConfig"]["workerGroupSpecs"]:
        pod = worker_group["template"]["spec"]
        if pod.get("nodeSelector") != {"role": "gpu-worker"}:
            continue
        assert pod["nodeSelector"].items() <= group["Labels"].items()
        taints = [{"key": t["Key"], "effect": "NoSchedule"} for t in group["Taints"] if t["Effect"] == "NO_SCHEDULE"]
        assert all(
            any(t["key"] == tol["key"] and t["effect"] == tol["effect"] for tol in pod["tolerations"]) for t in taints
        )
        for resource, amount in pod["containers"][0]["resources"]["requests"].items():
            have = from_instance.get(resource, from_tags.get(resource))
            assert have is not None, f"{worker_group['groupName']} asks for {resource}, which a template node lacks"
            wanted = _quantity(amount)
            assert wanted <= have, (resource, amount, have)


def _quantity(value: str) -> float:
    units = {"Gi": 2**30, "Mi": 2**20, "m": 1e-3}
    for suffix, factor in units.items():
        if value.endswith(suffix):
            return float(value.removesuffix(suffix)) * factor
    return float(value)


def test_ray_pods_are_never_evicted_by_the_autoscaler() -> None:
    (rayservice,) = [d for d in manifests(synth(**AUTOSCALING)) if d["kind"] == "RayService"]
    cluster = rayservice["spec"]["rayClusterConfig"]
    templates = [cluster["headGroupSpec"]["template"], *(g["template"] for g in cluster["workerGroupSpecs"])]
    assert [t["metadata"]["annotations"][SAFE_TO_EVICT] for t in templates] == ["false"] * len(templates)


def test_the_construct_refuses_a_range_of_none() -> None:
    import aws_cdk as cdk

    app = cdk.App(context=PROJECT_CONTEXT)
    stack = PdInferenceStack(app, "Refuse", settings=settings_from({**PROJECT_CONTEXT, **AUTOSCALING}))
    gpu_nodes = stack.node.find_child("GpuNodes")
    cluster = stack.node.find_child("Eks").node.find_child("Cluster")
    with pytest.raises(ValueError, match="min_nodes < max_nodes"):
        ca.ClusterAutoscaler(
            stack,
            "Again",
            cluster=cluster,  # type: ignore[arg-type]
            nodegroup=gpu_nodes.nodegroup,  # type: ignore[attr-defined]
            min_nodes=2,
            max_nodes=2,
            image_tag="v1.36.1",
            system_node_labels={"role": "system"},
        )
