"""The VPC: a new one across two or more AZs, or an existing one looked up by id."""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import RemovalPolicy
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from constructs import Construct


class Network(Construct):
    """A VPC with public and private subnets and NAT, and the one subnet for GPU nodes.

    Args:
        vpc_id: reuse this VPC (found with a context lookup, so the stack needs an
            account and region); default None, a new VPC.
        cidr: the new VPC's IPv4 range; default 10.0.0.0/16. Subnet CIDRs follow
            from it and from the AZ order, so they are stable across synths.
        max_azs: how many AZs the new VPC spans; default 2 (EKS needs two).
        availability_zones: the new VPC's AZs by name; default None, the
            region's first ``max_azs``. Needs a stack with a region.
        gpu_availability_zone: the AZ of the GPU subnet; default None, the
            first private subnet's AZ.
        logs_key: the KMS key that encrypts the new VPC's flow logs; default None
            (CloudWatch Logs' own encryption).

    Attributes:
        vpc: the VPC.
        gpu_subnet: one private subnet; all EFA nodes must share it.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        vpc_id: str | None = None,
        cidr: str = "10.0.0.0/16",
        max_azs: int = 2,
        availability_zones: Sequence[str] | None = None,
        gpu_availability_zone: str | None = None,
        logs_key: kms.IKey | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        self.vpc: ec2.IVpc
        if vpc_id is not None:
            self.vpc = ec2.Vpc.from_lookup(self, "Vpc", vpc_id=vpc_id)
        else:
            prefix = int(cidr.split("/")[1])
            vpc = ec2.Vpc(
                self,
                "Vpc",
                ip_addresses=ec2.IpAddresses.cidr(cidr),
                max_azs=None if availability_zones else max_azs,
                availability_zones=list(availability_zones) if availability_zones else None,
                # One NAT per AZ: a NAT outage in one AZ must not cut the
                # other AZ's nodes off from ECR and Hugging Face.
                nat_gateways=len(availability_zones) if availability_zones else max_azs,
                subnet_configuration=[
                    ec2.SubnetConfiguration(name="Public", subnet_type=ec2.SubnetType.PUBLIC, cidr_mask=prefix + 6),
                    # Large private subnets: the VPC CNI gives every pod a VPC address.
                    ec2.SubnetConfiguration(
                        name="Private", subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS, cidr_mask=prefix + 2
                    ),
                ],
                # Not restricted by a custom resource: that would be a third Lambda,
                # and nothing in this stack attaches to the default group.
                restrict_default_security_group=False,
            )
            log_group = logs.LogGroup(
                self,
                "FlowLogs",
                retention=logs.RetentionDays.ONE_MONTH,
                removal_policy=RemovalPolicy.DESTROY,
                encryption_key=logs_key,
            )
            vpc.add_flow_log("FlowLog", destination=ec2.FlowLogDestination.to_cloud_watch_logs(log_group))
            self.vpc = vpc

        selection = self.vpc.select_subnets(
            subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS,
            availability_zones=[gpu_availability_zone] if gpu_availability_zone else None,
        )
        self.gpu_subnet: ec2.ISubnet = selection.subnets[0]
