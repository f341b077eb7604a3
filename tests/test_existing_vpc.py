"""An existing VPC, looked up by id: with the lookup answered in context, as cdk.context.json would."""

from __future__ import annotations

from typing import Any

from tests.conftest import only, resources, synth

ACCOUNT, REGION, VPC_ID = "123456789012", "us-east-1", "vpc-0123456789abcdef0"
LOOKUP_KEY = f"vpc-provider:account={ACCOUNT}:filter.vpc-id={VPC_ID}:region={REGION}:returnAsymmetricSubnets=true"


def _subnet(index: int, az: str, cidr: str) -> dict[str, str]:
    return {
        "subnetId": f"subnet-0{index:016x}",
        "cidr": cidr,
        "availabilityZone": az,
        "routeTableId": f"rtb-0{index:016x}",
    }


LOOKUP_ANSWER = {
    "vpcId": VPC_ID,
    "vpcCidrBlock": "10.20.0.0/16",
    "ownerAccountId": ACCOUNT,
    "availabilityZones": [],
    "subnetGroups": [
        {
            "name": "Public",
            "type": "Public",
            "subnets": [_subnet(1, "us-east-1a", "10.20.0.0/22"), _subnet(2, "us-east-1b", "10.20.4.0/22")],
        },
        {
            "name": "Private",
            "type": "Private",
            "subnets": [_subnet(3, "us-east-1a", "10.20.64.0/18"), _subnet(4, "us-east-1b", "10.20.128.0/18")],
        },
    ],
}


def _synth(**extra: str) -> dict[str, Any]:
    return synth(vpc_id=VPC_ID, account=ACCOUNT, region=REGION, **{LOOKUP_KEY: LOOKUP_ANSWER}, **extra)


def test_existing_vpc_is_used_not_created() -> None:
    template = _synth()
    assert not resources(template, "AWS::EC2::VPC")
    assert not resources(template, "AWS::EC2::Subnet")
    cluster = only(template, "AWS::EKS::Cluster")["Properties"]
    assert set(cluster["ResourcesVpcConfig"]["SubnetIds"]) == {"subnet-00000000000000003", "subnet-00000000000000004"}


def test_gpu_nodes_in_the_named_az_of_the_existing_vpc() -> None:
    template = _synth(gpu_availability_zone="us-east-1b")
    gpu = [
        g
        for g in resources(template, "AWS::EKS::Nodegroup").values()
        if g["Properties"]["Labels"]["role"] == "gpu-worker"
    ]
    assert gpu[0]["Properties"]["Subnets"] == ["subnet-00000000000000004"]
