"""Secrets from Secrets Manager into Kubernetes Secrets, never through the template: the model token, the API keys."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from aws_cdk import ArnFormat, Aws, Stack, Token
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from constructs import Construct

from cdk_constructs.cluster import as_icluster
from cdk_constructs.helm import helm_release, pod_identity
from settings.catalog import EXTERNAL_SECRETS

SECRET_STORE = "aws-secrets-manager"  # noqa: S105 - a SecretStore name


@dataclass(frozen=True)
class SyncedSecret:
    """One Secrets Manager secret whose whole string value lands in one key of one Kubernetes Secret.

    construct_id: the ExternalSecret manifest's id (stable: it names the CloudFormation resource).
    secret_name: the secret's name, or its ARN where the stack makes it (a token: the operator may read
        exactly that secret, which External Secrets finds by ARN as well as by name).
    kms_key_arn: the secret's customer-managed KMS key, if any; the operator may
        decrypt with it only through Secrets Manager. None: Secrets Manager's AWS
        managed key, which needs no grant.
    refresh_seconds: how often the operator re-reads it.
    """

    construct_id: str
    secret_name: str
    target_secret: str
    target_key: str
    refresh_seconds: int
    kms_key_arn: str | None = None


class SecretsSync(Construct):
    """The External Secrets Operator, allowed to read exactly the listed secrets, and one ExternalSecret each.

    The operator reads AWS through EKS Pod Identity. The template holds the
    secrets' names only.

    Args:
        cluster: the cluster.
        namespace: where the Kubernetes Secrets are made (the serving namespace).
        secrets: what to sync (at least one).
        system_node_labels: where the operator runs.

    Attributes:
        release: the operator's Helm release (installs its CRDs).
        secret_store: the SecretStore manifest.
        external_secrets: one manifest per synced secret, in the order given.
        role: the Pod Identity role.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster: eks.Cluster,
        namespace: str,
        secrets: Sequence[SyncedSecret],
        system_node_labels: Mapping[str, str],
    ) -> None:
        super().__init__(scope, construct_id)
        pin = EXTERNAL_SECRETS
        service_account = pin.release
        self.role = pod_identity(
            self, "PodIdentity", cluster=cluster, namespace=pin.namespace, service_account=service_account
        )
        for secret in secrets:
            self._allow(secret)
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
        self.secret_store.node.add_dependency(self.release)
        self.external_secrets = [
            eks.KubernetesManifest(
                self, secret.construct_id, cluster=as_icluster(cluster), manifest=[external_secret(secret, namespace)]
            )
            for secret in secrets
        ]
        for manifest in self.external_secrets:
            manifest.node.add_dependency(self.secret_store)

    def _allow(self, secret: SyncedSecret) -> None:
        # Secrets Manager appends six random characters to a secret's ARN.
        secret_arn = (
            secret.secret_name
            if Token.is_unresolved(secret.secret_name)
            else Stack.of(self).format_arn(
                service="secretsmanager",
                resource="secret",
                resource_name=f"{secret.secret_name}-??????",
                arn_format=ArnFormat.COLON_RESOURCE_NAME,
            )
        )
        self.role.add_to_policy(
            iam.PolicyStatement(
                actions=["secretsmanager:GetSecretValue", "secretsmanager:DescribeSecret"], resources=[secret_arn]
            )
        )
        if secret.kms_key_arn is not None:
            self.role.add_to_policy(
                iam.PolicyStatement(
                    actions=["kms:Decrypt"],
                    resources=[secret.kms_key_arn],
                    conditions={"StringEquals": {"kms:ViaService": f"secretsmanager.{Aws.REGION}.amazonaws.com"}},
                )
            )


def external_secret(secret: SyncedSecret, namespace: str) -> dict[str, object]:
    """The ExternalSecret that keeps one Kubernetes Secret equal to one Secrets Manager secret."""
    return {
        "apiVersion": "external-secrets.io/v1",
        "kind": "ExternalSecret",
        "metadata": {"name": secret.target_secret, "namespace": namespace},
        "spec": {
            "refreshInterval": duration(secret.refresh_seconds),
            "secretStoreRef": {"kind": "SecretStore", "name": SECRET_STORE},
            "target": {"name": secret.target_secret, "creationPolicy": "Owner"},
            "data": [{"secretKey": secret.target_key, "remoteRef": {"key": secret.secret_name}}],
        },
    }


def duration(seconds: int) -> str:
    """A Go duration as a person writes it (3600 -> 1h, 90 -> 90s), so the manifest reads as the setting."""
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"
