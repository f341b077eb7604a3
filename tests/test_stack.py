"""The synthesized template holds every piece the product promises: VPC, cluster, node groups, add-ons, RayService."""

from __future__ import annotations

import ipaddress
import json
import re
from typing import Any

from aws_cdk.assertions import Match, Template

from settings.catalog import (
    EFA_DEVICE_PLUGIN,
    FAST_IMAGE_PULL_GATE,
    GPU_AMI_RELEASE_VERSIONS,
    INSTANCE_TYPES,
    KUBERAY_OPERATOR,
    KUBERNETES_VERSIONS,
    LOCAL_NVME_MOUNT,
    NODEADM_FEATURE_GATES,
    NVIDIA_DEVICE_PLUGIN,
)
from tests.conftest import manifests, only, resources, synth


def _ref_id(value: Any) -> str:
    """The logical id a Ref or GetAtt points at."""
    if "Ref" in value:
        return str(value["Ref"])
    return str(value["Fn::GetAtt"][0])


def test_one_stack_no_nested_stacks_at_most_two_lambdas(template: dict[str, Any]) -> None:
    assert not resources(template, "AWS::CloudFormation::Stack")
    assert len(resources(template, "AWS::Lambda::Function")) <= 2


def test_new_vpc_spans_two_azs_with_public_private_subnets_and_nat(template: dict[str, Any]) -> None:
    subnets = resources(template, "AWS::EC2::Subnet").values()
    public = [s for s in subnets if s["Properties"]["MapPublicIpOnLaunch"]]
    private = [s for s in subnets if not s["Properties"]["MapPublicIpOnLaunch"]]
    assert len(public) == 2 and len(private) == 2
    azs = {json.dumps(s["Properties"]["AvailabilityZone"]) for s in private}
    assert len(azs) == 2
    assert len(resources(template, "AWS::EC2::NatGateway")) == 2
    cidrs = [ipaddress.IPv4Network(s["Properties"]["CidrBlock"]) for s in subnets]
    assert all(c.subnet_of(ipaddress.IPv4Network("10.0.0.0/16")) for c in cidrs)
    # Stable, non-overlapping CIDRs: a change here would replace the subnets.
    assert sorted(str(c) for c in cidrs) == ["10.0.0.0/22", "10.0.128.0/18", "10.0.4.0/22", "10.0.64.0/18"]


def test_cluster_is_native_eks_v2_on_136_with_all_logs_and_no_auto_mode(template: dict[str, Any]) -> None:
    cluster = only(template, "AWS::EKS::Cluster")["Properties"]
    assert cluster["Version"] == "1.36"
    assert cluster["ComputeConfig"] == {"Enabled": False}
    assert cluster["AccessConfig"]["AuthenticationMode"] == "API"
    logged = {t["Type"] for t in cluster["Logging"]["ClusterLogging"]["EnabledTypes"]}
    assert logged == {"api", "audit", "authenticator", "controllerManager", "scheduler"}
    vpc_config = cluster["ResourcesVpcConfig"]
    assert vpc_config["EndpointPublicAccess"] is True and vpc_config["EndpointPrivateAccess"] is True
    assert cluster["EncryptionConfig"][0]["Resources"] == ["secrets"]


def test_kubectl_layer_matches_kubernetes_version(template: dict[str, Any]) -> None:
    layers = resources(template, "AWS::Lambda::LayerVersion").values()
    descriptions = [layer["Properties"].get("Description", "") for layer in layers]
    assert any(d.startswith("/opt/kubectl/kubectl 1.36.") for d in descriptions), descriptions


def test_private_endpoint_setting() -> None:
    vpc_config = only(synth(endpoint_access="private"), "AWS::EKS::Cluster")["Properties"]["ResourcesVpcConfig"]
    assert vpc_config["EndpointPublicAccess"] is False and vpc_config["EndpointPrivateAccess"] is True


def test_cluster_admins_get_access_entries() -> None:
    arn = "arn:aws:iam::123456789012:role/platform-admins"
    template = synth(cluster_admin_arns=arn)
    entry = only(template, "AWS::EKS::AccessEntry", PrincipalArn=arn)["Properties"]
    assert entry["AccessPolicies"][0]["AccessScope"] == {"Type": "cluster"}
    assert "AmazonEKSClusterAdminPolicy" in json.dumps(entry["AccessPolicies"][0]["PolicyArn"])


def _nodegroup(template: dict[str, Any], role: str) -> dict[str, Any]:
    groups: list[dict[str, Any]] = [
        g["Properties"]
        for g in resources(template, "AWS::EKS::Nodegroup").values()
        if g["Properties"]["Labels"].get("role") == role
    ]
    assert len(groups) == 1
    return groups[0]


def _launch_template_of(template: dict[str, Any], nodegroup: dict[str, Any]) -> dict[str, Any]:
    logical_id = _ref_id(nodegroup["LaunchTemplate"]["Id"])
    data: dict[str, Any] = template["Resources"][logical_id]["Properties"]["LaunchTemplateData"]
    return data


def test_system_nodegroup(template: dict[str, Any]) -> None:
    group = _nodegroup(template, "system")
    assert group["InstanceTypes"] == ["m7i.xlarge"]
    assert group["AmiType"] == "AL2023_x86_64_STANDARD"
    # Two at the least: the second holds the ingress's surge pod (sizing.INGRESS_SURGE_SYSTEM_NODES).
    assert group["ScalingConfig"] == {"MinSize": 2, "DesiredSize": 2, "MaxSize": 3}
    assert "Taints" not in group


def test_gpu_nodegroup_is_efa_in_one_subnet_tainted(template: dict[str, Any]) -> None:
    group = _nodegroup(template, "gpu-worker")
    assert group["InstanceTypes"] == ["g6.8xlarge"]
    assert group["AmiType"] == "AL2023_x86_64_NVIDIA"
    assert group["ScalingConfig"] == {"MinSize": 2, "DesiredSize": 2, "MaxSize": 2}
    assert len(group["Subnets"]) == 1
    subnet = template["Resources"][_ref_id(group["Subnets"][0])]["Properties"]
    assert subnet["MapPublicIpOnLaunch"] is False
    assert group["Taints"] == [{"Effect": "NO_SCHEDULE", "Key": "nvidia.com/gpu", "Value": "true"}]
    assert group["UpdateConfig"] == {"MaxUnavailable": 1}
    assert "DiskSize" not in group


def test_gpu_launch_template_has_efa_interface_with_both_groups(template: dict[str, Any]) -> None:
    data = _launch_template_of(template, _nodegroup(template, "gpu-worker"))
    assert "InstanceType" not in data and "SubnetId" not in json.dumps(data)
    (interface,) = data["NetworkInterfaces"]
    assert interface["InterfaceType"] == "efa"
    assert interface["DeviceIndex"] == 0
    attributes = sorted((template["Resources"][_ref_id(g)]["Type"], g["Fn::GetAtt"][1]) for g in interface["Groups"])
    assert attributes == [("AWS::EC2::SecurityGroup", "GroupId"), ("AWS::EKS::Cluster", "ClusterSecurityGroupId")]


def test_efa_security_group_allows_itself_both_ways_and_nothing_else(template: dict[str, Any]) -> None:
    data = _launch_template_of(template, _nodegroup(template, "gpu-worker"))
    (efa_sg,) = [_ref_id(g) for g in data["NetworkInterfaces"][0]["Groups"] if g["Fn::GetAtt"][1] == "GroupId"]
    self_ref = {"Fn::GetAtt": [efa_sg, "GroupId"]}
    ingress = only(template, "AWS::EC2::SecurityGroupIngress", GroupId=self_ref)["Properties"]
    assert ingress["SourceSecurityGroupId"] == self_ref and ingress["IpProtocol"] == "-1"
    egress = only(template, "AWS::EC2::SecurityGroupEgress", GroupId=self_ref)["Properties"]
    assert egress["DestinationSecurityGroupId"] == self_ref and egress["IpProtocol"] == "-1"
    group = template["Resources"][efa_sg]["Properties"]
    assert "SecurityGroupIngress" not in group
    # CDK's placeholder that denies all other egress (allow_all_outbound=False).
    assert all(rule.get("CidrIp") == "255.255.255.255/32" for rule in group.get("SecurityGroupEgress", []))


def test_gpu_launch_template_placement_imds_and_disk(template: dict[str, Any]) -> None:
    data = _launch_template_of(template, _nodegroup(template, "gpu-worker"))
    placement_group = template["Resources"][_ref_id(data["Placement"]["GroupName"])]
    assert placement_group["Type"] == "AWS::EC2::PlacementGroup"
    assert placement_group["Properties"]["Strategy"] == "cluster"
    assert data["MetadataOptions"]["HttpTokens"] == "required"
    assert data["MetadataOptions"]["HttpPutResponseHopLimit"] == 1
    (disk,) = data["BlockDeviceMappings"]
    assert disk["DeviceName"] == "/dev/xvda"
    assert disk["Ebs"]["VolumeType"] == "gp3" and disk["Ebs"]["Encrypted"] is True
    # The AMI and logs only: kubelet, containerd and the model cache are on the NVMe (tests/test_sizing.py).
    assert disk["Ebs"]["VolumeSize"] >= 30


def test_every_node_requires_imdsv2(template: dict[str, Any]) -> None:
    for group in resources(template, "AWS::EKS::Nodegroup").values():
        data = _launch_template_of(template, group["Properties"])
        assert data["MetadataOptions"]["HttpTokens"] == "required"


def test_placement_group_off_and_capacity_reservation() -> None:
    template = synth(gpu_placement_group="false", gpu_capacity_reservation_id="cr-0123456789abcdef0")
    assert not resources(template, "AWS::EC2::PlacementGroup")
    data = _launch_template_of(template, _nodegroup(template, "gpu-worker"))
    assert "Placement" not in data
    target = data["CapacityReservationSpecification"]["CapacityReservationTarget"]
    assert target == {"CapacityReservationId": "cr-0123456789abcdef0"}


def test_gpu_az_setting_pins_the_gpu_subnet() -> None:
    template = synth(gpu_availability_zone="us-east-1c")
    group = _nodegroup(template, "gpu-worker")
    subnet = template["Resources"][_ref_id(group["Subnets"][0])]["Properties"]
    assert subnet["AvailabilityZone"] == "us-east-1c"


def test_helm_charts_pinned_with_explicit_releases(template: dict[str, Any]) -> None:
    charts = {
        c["Properties"]["Chart"]: c["Properties"] for c in resources(template, "Custom::AWSCDK-EKS-HelmChart").values()
    }
    for pin in (KUBERAY_OPERATOR, NVIDIA_DEVICE_PLUGIN, EFA_DEVICE_PLUGIN):
        chart = charts[pin.chart]
        assert chart["Version"] == pin.version
        assert chart["Release"] == pin.release
        assert chart["Repository"] == pin.repository
        assert chart["Namespace"] == pin.namespace
    assert (KUBERAY_OPERATOR.chart, "1.7.0") in {(c, p["Version"]) for c, p in charts.items()}
    assert (NVIDIA_DEVICE_PLUGIN.chart, "0.20.0") in {(c, p["Version"]) for c, p in charts.items()}
    assert (EFA_DEVICE_PLUGIN.chart, "v0.5.30") in {(c, p["Version"]) for c, p in charts.items()}


def test_operator_on_system_nodes_plugins_on_gpu_nodes_tolerating_taint(template: dict[str, Any]) -> None:
    charts = {
        c["Properties"]["Chart"]: c["Properties"] for c in resources(template, "Custom::AWSCDK-EKS-HelmChart").values()
    }
    operator = json.loads(charts["kuberay-operator"]["Values"])
    assert operator["nodeSelector"] == {"role": "system"}
    for name in ("nvidia-device-plugin", "aws-efa-k8s-device-plugin"):
        values = json.loads(charts[name]["Values"])
        assert values["nodeSelector"] == {"role": "gpu-worker"}
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in values["tolerations"]


def test_no_crd_in_any_manifest(template: dict[str, Any]) -> None:
    kinds = [m["kind"] for m in manifests(template)]
    assert "CustomResourceDefinition" not in kinds
    assert kinds.count("RayService") == 1


def test_outputs(template: dict[str, Any]) -> None:
    outputs = template["Outputs"]
    assert {"ClusterName", "UpdateKubeconfigCommand", "GpuNodeAvailabilityZone"} <= set(outputs)
    assert "aws eks update-kubeconfig --name" in json.dumps(outputs["UpdateKubeconfigCommand"])


def test_assertions_library_agrees(template: dict[str, Any]) -> None:
    """The same facts through aws_cdk.assertions, as a reviewer would write them."""
    t = Template.from_json(template)
    t.resource_count_is("AWS::EKS::Cluster", 1)
    t.has_resource_properties(
        "AWS::EC2::LaunchTemplate",
        {"LaunchTemplateData": {"NetworkInterfaces": [Match.object_like({"InterfaceType": "efa"})]}},
    )
    t.has_resource_properties("AWS::EKS::Nodegroup", {"AmiType": "AL2023_x86_64_NVIDIA"})


def _gpu_node_config(template: dict[str, Any]) -> dict[str, Any]:
    """The NodeConfig in the GPU launch template's user data (MIME multipart, one nodeadm part)."""
    import email

    import yaml

    templates = resources(template, "AWS::EC2::LaunchTemplate").values()
    (gpu,) = [t for t in templates if "NetworkInterfaces" in t["Properties"]["LaunchTemplateData"]]
    text = gpu["Properties"]["LaunchTemplateData"]["UserData"]["Fn::Base64"]
    message = email.message_from_string(text)
    assert message.is_multipart()
    parts = [p for p in message.walk() if not p.is_multipart()]
    assert [p.get_content_type() for p in parts] == ["application/node.eks.aws"]
    config: dict[str, Any] = yaml.safe_load(str(parts[0].get_payload()))
    assert config["kind"] == "NodeConfig" and config["apiVersion"] == "node.eks.aws/v1alpha1"
    return config


def test_gpu_nodes_assemble_their_nvme_as_raid0_and_pull_through_soci(template: dict[str, Any]) -> None:
    """localStorage RAID0 and the FastImagePull gate; SOCI's state is not kept off the array."""
    spec = _gpu_node_config(template)["spec"]
    assert spec == {
        "featureGates": {FAST_IMAGE_PULL_GATE: True},
        "instance": {"localStorage": {"strategy": "RAID0"}},
    }
    assert "SOCI" not in spec["instance"]["localStorage"].get("disabledMounts", [])


def test_every_feature_gate_is_one_nodeadm_knows(template: dict[str, Any]) -> None:
    """The NodeConfig's featureGates takes any name; nodeadm's own enum (settings/catalog.py) is the list."""
    gates = _gpu_node_config(template)["spec"].get("featureGates", {})
    assert gates and set(gates) <= NODEADM_FEATURE_GATES, sorted(set(gates) - NODEADM_FEATURE_GATES)
    assert all(value is True for value in gates.values())


def test_every_gpu_type_is_large_enough_for_fast_image_pull() -> None:
    """nodeadm uses the SOCI snapshotter only with 7 GiB of memory and 4000 millicores or more."""
    gpu_types = {name: spec for name, spec in INSTANCE_TYPES.items() if spec.gpus > 0}
    assert gpu_types
    assert all(spec.memory_gib >= 7 and spec.vcpus >= 4 for spec in gpu_types.values())


def test_gpu_nodes_are_pinned_to_one_ami_release_the_system_nodes_are_not(template: dict[str, Any]) -> None:
    assert _nodegroup(template, "gpu-worker")["ReleaseVersion"] == "1.36.2-20260714"
    # The launch template names no image: EKS picks the release's AMI of the group's AMI type.
    assert "ImageId" not in _launch_template_of(template, _nodegroup(template, "gpu-worker"))
    assert "ReleaseVersion" not in _nodegroup(template, "system")


def test_the_ami_release_follows_the_kubernetes_version_and_the_setting() -> None:
    assert set(GPU_AMI_RELEASE_VERSIONS) == set(KUBERNETES_VERSIONS)
    for minor, release in GPU_AMI_RELEASE_VERSIONS.items():
        assert re.fullmatch(re.escape(minor) + r"\.\d+-\d{8}", release), release
    chosen = synth(gpu_ami_release_version="1.36.2-20260801")
    assert _nodegroup(chosen, "gpu-worker")["ReleaseVersion"] == "1.36.2-20260801"


def test_the_model_cache_is_on_the_nvme_of_both_worker_groups(rayservice: dict[str, Any]) -> None:
    # The GPU groups; the ingress group on the system nodes loads no weights.
    for group in rayservice["spec"]["rayClusterConfig"]["workerGroupSpecs"][:2]:
        pod = group["template"]["spec"]
        (volume,) = [v for v in pod["volumes"] if v["name"] == "model-cache"]
        assert volume["hostPath"] == {"path": "/mnt/k8s-disks/0/model-cache", "type": "DirectoryOrCreate"}
        container = pod["containers"][0]
        assert {"name": "model-cache", "mountPath": "/model-cache"} in container["volumeMounts"]
        assert {"name": "HF_HOME", "value": "/model-cache/huggingface"} in container["env"]


def test_vllm_compile_cache_is_on_the_nvme_of_every_gpu_worker(rayservice: dict[str, Any]) -> None:
    """VLLM_CACHE_ROOT (torch_compile_cache under it) lies in a mount of a hostPath on the NVMe array."""
    from pathlib import PurePosixPath

    gpu_groups = [
        g
        for g in rayservice["spec"]["rayClusterConfig"]["workerGroupSpecs"]
        if g["template"]["spec"].get("nodeSelector", {}).get("role") == "gpu-worker"
    ]
    assert {g["groupName"] for g in gpu_groups} == {"prefill", "decode"}
    for group in gpu_groups:
        pod = group["template"]["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        for container in pod["containers"]:
            env = {e["name"]: e.get("value") for e in container["env"]}
            root = PurePosixPath(env["VLLM_CACHE_ROOT"])
            hosts = [
                PurePosixPath(volumes[m["name"]]["hostPath"]["path"])
                for m in container["volumeMounts"]
                if root.is_relative_to(m["mountPath"]) and "hostPath" in volumes[m["name"]]
            ]
            assert hosts, f"{group['groupName']}: VLLM_CACHE_ROOT {root} is in no hostPath mount"
            assert all(host.is_relative_to(LOCAL_NVME_MOUNT) for host in hosts), hosts
