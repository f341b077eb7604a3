"""One KMS key for every CloudWatch Logs group the stack makes: flow logs, control plane, kubectl provider."""

from __future__ import annotations

from aws_cdk import ArnFormat, Duration, RemovalPolicy, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from constructs import Construct


class LogEncryptionKey(Construct):
    """A rotating KMS key that CloudWatch Logs may use for this account's and region's log groups only.

    Deleted with the stack (after a 7-day pending window), like the log groups it encrypts.

    Attributes:
        key: the KMS key; pass it as a log group's encryption key.
    """

    def __init__(self, scope: Construct, construct_id: str) -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        self.key = kms.Key(
            self,
            "Key",
            description="Encrypts the CloudWatch Logs groups of this stack",
            enable_key_rotation=True,
            removal_policy=RemovalPolicy.DESTROY,
            pending_window=Duration.days(7),
        )
        # CloudWatch Logs calls KMS as its regional service principal, for log
        # groups of this account and region (the encryption context names the group).
        self.key.add_to_resource_policy(
            iam.PolicyStatement(
                principals=[iam.ServicePrincipal(f"logs.{stack.region}.amazonaws.com")],
                actions=["kms:Encrypt*", "kms:Decrypt*", "kms:ReEncrypt*", "kms:GenerateDataKey*", "kms:Describe*"],
                resources=["*"],
                conditions={
                    "ArnLike": {
                        "kms:EncryptionContext:aws:logs:arn": stack.format_arn(
                            service="logs",
                            resource="log-group",
                            resource_name="*",
                            arn_format=ArnFormat.COLON_RESOURCE_NAME,
                        )
                    }
                },
            )
        )
