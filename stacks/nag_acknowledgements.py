"""cdk-nag AwsSolutions acknowledgements: one finding on one construct each, with its reason.

Every line here was read by a reviewer; tests/test_nag.py counts them, and an
unacknowledged finding fails synth.
"""

from __future__ import annotations

import aws_cdk as cdk
from constructs import IConstruct

from settings.catalog import AWS_LOAD_BALANCER_CONTROLLER

PACK = "AwsSolutions"


def _policy(name: str) -> str:
    return f"AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/{name}]"


# AWS maintains these policies for exactly these principals; a copy would drift.
_NODE_ROLE_REASONS = {
    _policy("AmazonEKSWorkerNodePolicy"): "EKS managed nodes must carry AmazonEKSWorkerNodePolicy to join the cluster",
    _policy("AmazonEC2ContainerRegistryPullOnly"): (
        "Nodes pull EKS add-on images from ECR; PullOnly is AWS's narrowest ECR policy for nodes"
    ),
}
_PROVIDER_ROLE_REASONS = {
    _policy("service-role/AWSLambdaBasicExecutionRole"): "aws-cdk's kubectl provider Lambda: CloudWatch Logs only",
    _policy("service-role/AWSLambdaVPCAccessExecutionRole"): (
        "aws-cdk's kubectl provider Lambda runs in the private subnets to reach a private endpoint"
    ),
}

# Construct path (below the stack) -> {finding: reason}. Every path must exist.
ACKNOWLEDGEMENTS: dict[str, dict[str, str]] = {
    "Eks/Cluster/Role": {
        _policy(
            "AmazonEKSClusterPolicy"
        ): "The EKS service role must carry AmazonEKSClusterPolicy; EKS documents no narrower set",
    },
    "Eks/VpcCniRole": {
        _policy("AmazonEKS_CNI_Policy"): (
            "The VPC CNI's own Pod Identity role (service account aws-node only), as EKS documents; "
            "kept off the node roles"
        ),
    },
    "SystemNodes/NodeRole": _NODE_ROLE_REASONS,
    "GpuNodes/NodeRole": _NODE_ROLE_REASONS,
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

_LBC_REASON = (
    "AWS's published IAM policy for the AWS Load Balancer Controller {version} (vendored from aws-cdk-lib): "
    "it creates load balancers, target groups and security groups whose names it cannot know in advance; "
    "its mutating statements are conditioned on the elbv2.k8s.aws/cluster tag"
)
_LBC_RESOURCES = (
    "*",
    "arn:aws:ec2:*:*:security-group/*",
    "arn:aws:elasticloadbalancing:*:*:loadbalancer/app/*/*",
    "arn:aws:elasticloadbalancing:*:*:loadbalancer/net/*/*",
    "arn:aws:elasticloadbalancing:*:*:targetgroup/*/*",
    "arn:aws:elasticloadbalancing:*:*:listener-rule/app/*/*/*",
    "arn:aws:elasticloadbalancing:*:*:listener-rule/net/*/*/*",
    "arn:aws:elasticloadbalancing:*:*:listener/app/*/*/*",
    "arn:aws:elasticloadbalancing:*:*:listener/net/*/*/*",
)

# For constructs that exist only when a setting turns them on.
OPTIONAL_ACKNOWLEDGEMENTS: dict[str, dict[str, str]] = {
    "Observability/AgentRole": {
        _policy("CloudWatchAgentServerPolicy"): (
            "The CloudWatch observability add-on's own Pod Identity role (service account cloudwatch-agent only): "
            "AWS documents CloudWatchAgentServerPolicy for it, and it writes to log groups and metrics it names itself"
        ),
    },
    "PrivateEndpoint/Policy": {
        f"AwsSolutions-IAM5[Resource::{resource}]": _LBC_REASON.format(version=AWS_LOAD_BALANCER_CONTROLLER.version)
        for resource in _LBC_RESOURCES
    },
    # Only when the GPU group has a range (cdk_constructs/cluster_autoscaler.py).
    "ClusterAutoscaler/PodIdentityRole/DefaultPolicy": {
        "AwsSolutions-IAM5[Resource::*]": (
            "Cluster Autoscaler's reads (Describe* of Auto Scaling groups, scaling activities, instance types, "
            "launch template versions) take no resource-level permission"
        ),
        "AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:autoscaling:<AWS::Region>:<AWS::AccountId>:"
        "autoScalingGroup:*:autoScalingGroupName/*]": (
            "The Auto Scaling group EKS names for the GPU node group is unknown at synth; SetDesiredCapacity and "
            "TerminateInstanceInAutoScalingGroup are conditioned on its eks:cluster-name and eks:nodegroup-name tags"
        ),
    },
}


def acknowledge(scope: IConstruct, rule: str, reason: str, pack: str = PACK) -> None:
    cdk.Validations.of(scope).acknowledge(cdk.Acknowledgment(id=f"{pack}::{rule}", reason=reason))


def acknowledge_imported_vpc(stack: cdk.Stack) -> None:
    """CDK cannot tag subnets of a VPC it did not create; the README says which tags to add."""
    cluster = stack.node.find_child("Eks").node.find_child("Cluster")
    acknowledge(
        cluster,
        "@aws-cdk/aws-eks:clusterMustManuallyTagSubnet",
        "An existing VPC's subnets are the owner's: docs/security.md, 'Existing VPC' lists the "
        "kubernetes.io/role tags to set",
        pack="Annotation",
    )


def acknowledge_model_prefix(stack: cdk.Stack, bucket: str, prefix: str) -> None:
    """The Ray pods' role reads every object under the model's own prefix, and no other."""
    role = stack.node.find_child("ModelWeights").node.find_child("PodIdentityRole")
    acknowledge(
        role.node.find_child("DefaultPolicy"),
        f"AwsSolutions-IAM5[Resource::arn:<AWS::Partition>:s3:::{bucket}/{prefix}/*]",
        "Ray reads every file of the model under its own prefix (the file names are the model's); nothing wider",
    )


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
    optional = {path: (rules, False) for path, rules in OPTIONAL_ACKNOWLEDGEMENTS.items()}
    for path, (rules, required) in {**optional, **{p: (r, True) for p, r in ACKNOWLEDGEMENTS.items()}}.items():
        scope: IConstruct | None = stack
        for part in path.split("/"):
            scope = scope.node.try_find_child(part) if scope is not None else None
        if scope is None:
            if required:
                raise LookupError(f"cdk-nag acknowledgement for {path}: no such construct")
            continue
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
