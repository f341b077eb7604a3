"""The EKS control plane: aws_eks_v2, no Auto Mode, node groups added by others."""

from __future__ import annotations

import hashlib
import importlib
import json
from collections.abc import Sequence
from typing import cast

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from settings.catalog import DEFAULT_KUBERNETES_VERSION, KUBERNETES_VERSIONS

ENDPOINT_ACCESS = {
    "public_and_private": eks.EndpointAccess.PUBLIC_AND_PRIVATE,
    "private": eks.EndpointAccess.PRIVATE,
}

ALL_CONTROL_PLANE_LOGS = (
    eks.ClusterLoggingTypes.API,
    eks.ClusterLoggingTypes.AUDIT,
    eks.ClusterLoggingTypes.AUTHENTICATOR,
    eks.ClusterLoggingTypes.CONTROLLER_MANAGER,
    eks.ClusterLoggingTypes.SCHEDULER,
)


def as_icluster(cluster: eks.Cluster) -> eks.ICluster:
    """Cluster as ICluster: jsii's generated protocol lists a member the class stub lacks."""
    return cast(eks.ICluster, cluster)


def pod_identity_role(scope: Construct, construct_id: str) -> iam.Role:
    """A role that EKS Pod Identity may hand to one service account (bound by its association)."""
    return iam.Role(
        scope,
        construct_id,
        assumed_by=iam.ServicePrincipal("pods.eks.amazonaws.com").with_session_tags(),
    )


def kubectl_layer(scope: Construct, kubernetes_version: str) -> lambda_.ILayerVersion:
    """The kubectl Lambda layer that matches the cluster's Kubernetes version."""
    module = importlib.import_module(KUBERNETES_VERSIONS[kubernetes_version])
    layer_class = getattr(module, f"KubectlV{kubernetes_version.replace('1.', '')}Layer")
    layer: lambda_.ILayerVersion = layer_class(scope, "KubectlLayer")
    return layer


class EksCluster(Construct):
    """An EKS cluster with envelope-encrypted secrets, all control-plane logs and access entries.

    Args:
        vpc: where the control plane's ENIs, the nodes and the kubectl provider live.
        cluster_name: the EKS cluster name; default "pd-inference".
        kubernetes_version: a key of settings.catalog.KUBERNETES_VERSIONS; default "1.36".
            The matching kubectl layer is chosen from the same table.
        endpoint_access: "public_and_private" (default) or "private". Private
            needs kubectl from inside the VPC (a bastion, VPN or CloudShell VPC environment).
        admin_principal_arns: IAM roles or users given AmazonEKSClusterAdminPolicy
            through access entries; default none (the deploying role is admin).
        public_access_cidrs: who may reach the public endpoint (still authenticated);
            default none, which EKS takes as 0.0.0.0/0. Ignored for a private endpoint.
        logs_key: the KMS key that encrypts the control-plane and kubectl-provider
            log groups; default None (CloudWatch Logs' own encryption).

    Attributes:
        cluster: the aws_eks_v2 Cluster.
        secrets_key: the KMS key that encrypts Kubernetes secrets.
        pod_identity_agent, vpc_cni: the EKS add-ons; node_prerequisites holds both,
            for node groups to depend on.
        kubectl_security_group: the kubectl provider's own security group.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        vpc: ec2.IVpc,
        cluster_name: str = "pd-inference",
        kubernetes_version: str = DEFAULT_KUBERNETES_VERSION,
        endpoint_access: str = "public_and_private",
        admin_principal_arns: Sequence[str] = (),
        public_access_cidrs: Sequence[str] = (),
        logs_key: kms.IKey | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        self.secrets_key = kms.Key(
            self,
            "SecretsKey",
            description=f"Envelope encryption of Kubernetes secrets in EKS cluster {cluster_name}",
            enable_key_rotation=True,
            removal_policy=RemovalPolicy.DESTROY,
            pending_window=Duration.days(7),
        )
        # EKS writes control-plane logs to this group; made here (before the
        # cluster) so that cdk destroy removes it instead of leaving EKS's own.
        self.control_plane_logs = logs.LogGroup(
            self,
            "ControlPlaneLogs",
            log_group_name=f"/aws/eks/{cluster_name}/cluster",
            retention=logs.RetentionDays.ONE_MONTH,
            removal_policy=RemovalPolicy.DESTROY,
            encryption_key=logs_key,
        )
        # The kubectl provider's Lambdas would otherwise sit on the security group
        # EKS creates; their ENIs can outlive the functions and block that group's
        # and the subnets' deletion on `cdk destroy` (aws/aws-cdk#18650). On a
        # group the stack owns, CloudFormation waits for the ENIs and deletes it.
        self.kubectl_security_group = ec2.SecurityGroup(
            self,
            "KubectlProviderSecurityGroup",
            vpc=vpc,
            description="kubectl provider Lambdas: HTTPS to the EKS API and the Helm repositories",
            allow_all_outbound=True,
        )
        endpoint = ENDPOINT_ACCESS[endpoint_access]
        if public_access_cidrs and endpoint_access != "private":
            endpoint = endpoint.only_from(*public_access_cidrs)
        private_subnets = vpc.select_subnets(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS)
        self.cluster = eks.Cluster(
            self,
            "Cluster",
            cluster_name=cluster_name,
            version=eks.KubernetesVersion.of(kubernetes_version),
            vpc=vpc,
            vpc_subnets=[ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS)],
            # Node groups are added explicitly; Auto Mode would bring its own.
            default_capacity_type=eks.DefaultCapacityType.NODEGROUP,
            default_capacity=0,
            endpoint_access=endpoint,
            cluster_logging=list(ALL_CONTROL_PLANE_LOGS),
            secrets_encryption_key=self.secrets_key,
            kubectl_provider_options=eks.KubectlProviderOptions(
                kubectl_layer=kubectl_layer(self, kubernetes_version),
                # In the VPC, so a private-only endpoint still works; NAT gives
                # it the egress Helm needs to pull charts.
                private_subnets=private_subnets.subnets,
                security_groups=[self.kubectl_security_group],
            ),
        )
        # The provider reaches the API server's private endpoint.
        self.cluster.connections.allow_from(
            self.kubectl_security_group, ec2.Port.tcp(443), "kubectl provider to the EKS API"
        )
        # Pod Identity: the agent on every node, and the VPC CNI's EC2
        # permissions on its own service account instead of the node role.
        self.pod_identity_agent = eks.CfnAddon(
            self, "PodIdentityAgent", addon_name="eks-pod-identity-agent", cluster_name=self.cluster.cluster_name
        )
        self.vpc_cni_role = pod_identity_role(self, "VpcCniRole")
        self.vpc_cni_role.add_managed_policy(iam.ManagedPolicy.from_aws_managed_policy_name("AmazonEKS_CNI_Policy"))
        self.vpc_cni = eks.CfnAddon(
            self,
            "VpcCni",
            addon_name="vpc-cni",
            cluster_name=self.cluster.cluster_name,
            # EKS bootstrapped aws-node as a self-managed DaemonSet; the add-on takes it over.
            resolve_conflicts="OVERWRITE",
            # Its node agent enforces NetworkPolicies (the serving namespace's).
            configuration_values=json.dumps({"enableNetworkPolicy": "true"}),
            pod_identity_associations=[
                eks.CfnAddon.PodIdentityAssociationProperty(
                    role_arn=self.vpc_cni_role.role_arn, service_account="aws-node"
                )
            ],
        )
        self.vpc_cni.node.add_dependency(self.pod_identity_agent)
        # Node groups join only once both are in place (the stack adds that).
        self.node_prerequisites = (self.pod_identity_agent, self.vpc_cni)

        self.cluster.node.add_dependency(self.control_plane_logs)
        # aws-cdk keeps the kubectl provider's Lambda log groups for two years
        # after a destroy; this stack leaves nothing behind.
        for child in self.cluster.node.find_all():
            if isinstance(child, logs.CfnLogGroup):
                child.apply_removal_policy(RemovalPolicy.DESTROY)
                child.retention_in_days = 30
                if logs_key is not None:
                    child.kms_key_id = logs_key.key_arn

        admin = eks.AccessPolicy.from_access_policy_name(
            "AmazonEKSClusterAdminPolicy", access_scope_type=eks.AccessScopeType.CLUSTER
        )
        for arn in admin_principal_arns:
            # Keyed by the ARN, not its position, so reordering the list replaces nothing.
            digest = hashlib.sha256(arn.encode()).hexdigest()[:8]
            self.cluster.grant_access(f"Admin{digest}", arn, [admin])
