"""The Hugging Face token: from Secrets Manager into a Kubernetes Secret, never through the template."""

from __future__ import annotations

from collections.abc import Mapping

from aws_cdk import ArnFormat, Aws, Stack
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from constructs import Construct

from cdk_constructs.cluster import as_icluster
from cdk_constructs.helm import helm_release, pod_identity
from settings.catalog import EXTERNAL_SECRETS

SECRET_STORE = "aws-secrets-manager"  # noqa: S105 - a SecretStore name


class ModelTokenSync(Construct):
    """External Secrets Operator syncs one Secrets Manager secret into one Kubernetes Secret.

    The operator reads AWS through EKS Pod Identity, with a role that can read
    that one secret and nothing else. The template holds the secret's name only.

    Args:
        cluster: the cluster.
        secret_name: the Secrets Manager secret (its whole string value is the token).
        kms_key_arn: the customer-managed KMS key that encrypts the secret; the
            role may decrypt with it only through Secrets Manager. Default None:
            the secret uses Secrets Manager's AWS managed key, which needs no grant.
        namespace: where the Kubernetes Secret is made (the serving namespace).
        target_secret / target_key: the Kubernetes Secret and key the pods read.
        system_node_labels: where the operator runs.

    Attributes:
        release: the operator's Helm release (installs its CRDs).
        secret_store, external_secret: the two manifests.
        role: the Pod Identity role.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster: eks.Cluster,
        secret_name: str,
        kms_key_arn: str | None = None,
        namespace: str,
        target_secret: str,
        target_key: str,
        system_node_labels: Mapping[str, str],
    ) -> None:
        super().__init__(scope, construct_id)
        pin = EXTERNAL_SECRETS
        service_account = pin.release
        self.role = pod_identity(
            self, "PodIdentity", cluster=cluster, namespace=pin.namespace, service_account=service_account
        )
        # Secrets Manager appends six random characters to a secret's ARN.
        secret_arn = Stack.of(self).format_arn(
            service="secretsmanager",
            resource="secret",
            resource_name=f"{secret_name}-??????",
            arn_format=ArnFormat.COLON_RESOURCE_NAME,
        )
        self.role.add_to_policy(
            iam.PolicyStatement(
                actions=["secretsmanager:GetSecretValue", "secretsmanager:DescribeSecret"], resources=[secret_arn]
            )
        )
        if kms_key_arn is not None:
            self.role.add_to_policy(
                iam.PolicyStatement(
                    actions=["kms:Decrypt"],
                    resources=[kms_key_arn],
                    conditions={"StringEquals": {"kms:ViaService": f"secretsmanager.{Aws.REGION}.amazonaws.com"}},
                )
            )
        values = {"global": {"nodeSelector": dict(system_node_labels)}, "serviceAccount": {"name": service_account}}
        # The chart's validating webhook fails closed: the SecretStore below is
        # refused ("no endpoints available") until the webhook pod is ready.
        self.release = helm_release(self, "Operator", cluster=cluster, pin=pin, values=values, wait=True)
        self.secret_store = eks.KubernetesManifest(
            self,
            "SecretStore",
            cluster=as_icluster(cluster),
            manifest=[
                {
                    "apiVersion": "external-secrets.io/v1",
                    "kind": "SecretStore",
                    "metadata": {"name": SECRET_STORE, "namespace": namespace},
                    "spec": {"provider": {"aws": {"service": "SecretsManager", "region": Aws.REGION}}},
                }
            ],
        )
        self.external_secret = eks.KubernetesManifest(
            self,
            "ExternalSecret",
            cluster=as_icluster(cluster),
            manifest=[
                {
                    "apiVersion": "external-secrets.io/v1",
                    "kind": "ExternalSecret",
                    "metadata": {"name": target_secret, "namespace": namespace},
                    "spec": {
                        "refreshInterval": "1h",
                        "secretStoreRef": {"kind": "SecretStore", "name": SECRET_STORE},
                        "target": {"name": target_secret, "creationPolicy": "Owner"},
                        "data": [{"secretKey": target_key, "remoteRef": {"key": secret_name}}],
                    },
                }
            ],
        )
        self.secret_store.node.add_dependency(self.release)
        self.external_secret.node.add_dependency(self.secret_store)
