"""cdk-nag AwsSolutions acknowledgements: one finding on one construct each, with its reason.

Every line here was read by a reviewer; tests/test_nag.py counts them, and an
unacknowledged finding fails synth.
"""

from __future__ import annotations

import aws_cdk as cdk
from constructs import IConstruct

PACK = "AwsSolutions"


def _policy(name: str) -> str:
    return f"AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/{name}]"


# The roles EKS itself requires; AWS maintains these policies for exactly
# these principals, and a copy would drift from them.
_NODE_ROLE_REASONS = {
    _policy("AmazonEKSWorkerNodePolicy"): "EKS managed nodes must carry AmazonEKSWorkerNodePolicy to join the cluster",
    _policy(
        "AmazonEC2ContainerRegistryReadOnly"
    ): "Nodes pull the EKS add-on and Ray images from ECR; AWS's read-only policy is the documented minimum",
    _policy(
        "AmazonEKS_CNI_Policy"
    ): "The VPC CNI on each node assigns pod IPs; EKS documents this policy for the node role",
}
_PROVIDER_ROLE_REASONS = {
    _policy("service-role/AWSLambdaBasicExecutionRole"): "aws-cdk's kubectl provider Lambda: CloudWatch Logs only",
    _policy(
        "service-role/AWSLambdaVPCAccessExecutionRole"
    ): "aws-cdk's kubectl provider Lambda runs in the private subnets to reach a private endpoint",
}

ACKNOWLEDGEMENTS: dict[str, dict[str, str]] = {
    "Eks/Cluster/Role": {
        _policy(
            "AmazonEKSClusterPolicy"
        ): "The EKS service role must carry AmazonEKSClusterPolicy; EKS documents no narrower set",
    },
    "Eks/Cluster/NodegroupSystemNodes/NodeGroupRole": _NODE_ROLE_REASONS,
    "Eks/Cluster/NodegroupGpuNodes/NodeGroupRole": _NODE_ROLE_REASONS,
    "Eks/Cluster/KubectlProvider/Handler/ServiceRole": {
        **_PROVIDER_ROLE_REASONS,
        _policy(
            "AmazonEC2ContainerRegistryReadOnly"
        ): "aws-cdk's kubectl provider pulls OCI Helm charts from ECR when asked",
    },
    "Eks/Cluster/KubectlProvider/Provider/framework-onEvent/ServiceRole": _PROVIDER_ROLE_REASONS,
    "Eks/Cluster/KubectlProvider/Provider/framework-onEvent/ServiceRole/DefaultPolicy": {
        "AwsSolutions-IAM5[Resource::<EksClusterKubectlProviderHandlerDA75FB7A.Arn>:*]": (
            "aws-cdk's custom-resource framework invokes the kubectl handler and its versions (ARN:*), nothing else"
        ),
    },
    "Eks/Cluster/KubectlProvider/Handler": {
        "AwsSolutions-L1": "The kubectl handler's runtime is chosen by aws-cdk-lib and moves with it; not ours to pin",
    },
}


def acknowledge(scope: IConstruct, rule: str, reason: str) -> None:
    cdk.Validations.of(scope).acknowledge(cdk.Acknowledgment(id=f"{PACK}::{rule}", reason=reason))


def _ecr_public_rule(stack: cdk.Stack) -> str:
    """The ECR Public policy finding names a CloudFormation condition by its logical id."""
    condition = stack.node.find_child("Eks").node.find_child("Cluster").node.find_child("KubectlProvider")
    cfn_condition = condition.node.find_child("Handler").node.find_child("HasEcrPublic")
    logical_id = stack.get_logical_id(cfn_condition)  # type: ignore[arg-type]
    policy = (
        '{"Fn::If":["' + logical_id + '",{"Fn::Join":["",["arn:",{"Ref":"AWS::Partition"},'
        '":iam::aws:policy/AmazonElasticContainerRegistryPublicReadOnly"]]},{"Ref":"AWS::NoValue"}]}'
    )
    return f"AwsSolutions-IAM4[Policy::{policy}]"


def acknowledge_findings(stack: cdk.Stack) -> int:
    """Apply every acknowledgement to its one construct; returns how many."""
    count = 0
    for path, rules in ACKNOWLEDGEMENTS.items():
        scope: IConstruct = stack
        for part in path.split("/"):
            scope = scope.node.find_child(part)
        for rule, reason in rules.items():
            acknowledge(scope, rule, reason)
            count += 1
    handler_role = stack.node.find_child("Eks").node.find_child("Cluster").node.find_child("KubectlProvider")
    acknowledge(
        handler_role.node.find_child("Handler").node.find_child("ServiceRole"),
        _ecr_public_rule(stack),
        "aws-cdk's kubectl provider may pull public OCI Helm charts; read-only, and only when the condition holds",
    )
    return count + 1
