"""Read access to the model's weights in the user's own S3 prefix, for the Ray pods only."""

from __future__ import annotations

from aws_cdk import Aws
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from constructs import Construct

from cdk_constructs.cluster import as_icluster
from cdk_constructs.helm import pod_identity


class ModelReadAccess(Construct):
    """A ServiceAccount for the Ray pods, whose EKS Pod Identity role may read one S3 prefix and nothing else.

    Ray 2.58 reads an s3:// model_source with boto3 (ray.llm cloud_filesystem/s3_filesystem.py):
    GetObject on <prefix>/hash and on every file, and ListObjectsV2 with Prefix "<prefix>/".

    Args:
        cluster: the cluster (its Pod Identity agent hands the pods the role).
        namespace: the serving namespace.
        service_account: the ServiceAccount the Ray pods run as.
        bucket, prefix: where the model's files are (s3://bucket/prefix/...).

    Attributes:
        role: the Pod Identity role.
        service_account_manifest: the ServiceAccount.

    The RayService must wait for the whole construct: EKS Pod Identity hands a pod
    credentials at admission only if the association exists by then, and Ray's S3
    download logs a failed file and goes on, so the error would surface later as
    missing files.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster: eks.Cluster,
        namespace: str,
        service_account: str,
        bucket: str,
        prefix: str,
    ) -> None:
        super().__init__(scope, construct_id)
        self.role = pod_identity(
            self, "PodIdentity", cluster=cluster, namespace=namespace, service_account=service_account
        )
        self.role.add_to_policy(
            iam.PolicyStatement(actions=["s3:GetObject"], resources=[f"arn:{Aws.PARTITION}:s3:::{bucket}/{prefix}/*"])
        )
        self.role.add_to_policy(
            iam.PolicyStatement(
                actions=["s3:ListBucket"],
                resources=[f"arn:{Aws.PARTITION}:s3:::{bucket}"],
                conditions={"StringLike": {"s3:prefix": [f"{prefix}/", f"{prefix}/*"]}},
            )
        )
        self.service_account_manifest = eks.KubernetesManifest(
            self,
            "ServiceAccount",
            cluster=as_icluster(cluster),
            manifest=[
                {
                    "apiVersion": "v1",
                    "kind": "ServiceAccount",
                    "metadata": {"name": service_account, "namespace": namespace},
                }
            ],
        )
