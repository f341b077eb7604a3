"""The Ray head's GCS store: ElastiCache for Valkey, so a lost head comes back without taking the replicas."""

from __future__ import annotations

from aws_cdk import Duration, Fn, RemovalPolicy
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_elasticache as elasticache
from aws_cdk import aws_kms as kms
from aws_cdk import aws_secretsmanager as secretsmanager
from constructs import Construct

# Not Valkey's 6379: Ray's own GCS listens there on the head, and the workers' NetworkPolicy tells the two
# apart by port alone (cdk_constructs/network_policies.py).
GCS_STORE_PORT = 6380
# Ray 2.58's GCS speaks the Redis protocol; Valkey 7.2 is the Redis 7.2 protocol (the rehearsal runs Redis 7.0).
ENGINE = "valkey"
ENGINE_VERSION = "7.2"
# Two nodes in two AZs: the primary and a replica ElastiCache promotes when the primary's AZ or node fails.
NODES = 2
# ElastiCache's AUTH token: 16-128 printable characters without space, '"', '/' or '@'. KubeRay passes it to
# `ray start --redis-password=$REDIS_PASSWORD` unquoted under bash, where punctuation such as '*' or '$'
# would be expanded: letters and digits only.
AUTH_TOKEN_LENGTH = 64
# One-minute periods without a primary before the no-primary alarm pages: longer than a Multi-AZ failover.
NO_PRIMARY_EVALUATION_PERIODS = 3


def replication_group_id(cluster_name: str) -> str:
    """The replication group's name (its members are `<name>-001` and `-002`, which the alarm reads)."""
    # ElastiCache stores the name in lower case, and names the metrics' dimensions so.
    return f"{cluster_name}-gcs".lower()


class GcsStore(Construct):
    """A Multi-AZ ElastiCache for Valkey replication group that only the cluster's nodes reach, with TLS,
    encryption at rest, and an AUTH token generated into Secrets Manager (the template holds a reference).

    Ray's GCS on the head writes its tables there (KubeRay's `gcsFaultToleranceOptions`); a head that
    restarts reads them back and the workers, who wait for it, keep their replicas.

    Args:
        vpc: where it lives: the VPC's private subnets, in at least two AZs.
        node_security_group: the nodes' security group (pods use their node's): the one group admitted.
        cluster_name: names the replication group (`<cluster_name>-gcs`).
        node_type: the ElastiCache node type; no default (the settings' `gcs_store_node_type`).

    Attributes:
        key: the KMS key of its data at rest and of its token's secret.
        auth_token: the Secrets Manager secret holding the AUTH token.
        security_group, subnet_group, replication_group.
        address: `rediss://<primary endpoint>:<port>`, as Ray and KubeRay's cleanup Job parse it.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        vpc: ec2.IVpc,
        node_security_group: ec2.ISecurityGroup,
        cluster_name: str,
        node_type: str,
    ) -> None:
        super().__init__(scope, construct_id)
        self.key = kms.Key(
            self,
            "Key",
            description="Encrypts the Ray GCS store and its AUTH token",
            enable_key_rotation=True,
            removal_policy=RemovalPolicy.DESTROY,
            pending_window=Duration.days(7),
        )
        self.auth_token = secretsmanager.Secret(
            self,
            "AuthToken",
            description="AUTH token of the Ray GCS store (ElastiCache); synced into the serving namespace",
            encryption_key=self.key,
            generate_secret_string=secretsmanager.SecretStringGenerator(
                password_length=AUTH_TOKEN_LENGTH, exclude_punctuation=True, include_space=False
            ),
            removal_policy=RemovalPolicy.DESTROY,
        )
        self.security_group = ec2.SecurityGroup(
            self,
            "SecurityGroup",
            vpc=vpc,
            description="Ray GCS store: the EKS nodes only, on the store port",
            allow_all_outbound=False,
        )
        self.security_group.add_ingress_rule(
            node_security_group, ec2.Port.tcp(GCS_STORE_PORT), "EKS nodes (the Ray head's pod) to the GCS store"
        )
        private = vpc.select_subnets(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS)
        self.subnet_group = elasticache.CfnSubnetGroup(
            self,
            "SubnetGroup",
            description="Ray GCS store: the private subnets",
            subnet_ids=private.subnet_ids,
        )
        self.replication_group = elasticache.CfnReplicationGroup(
            self,
            "ReplicationGroup",
            replication_group_id=replication_group_id(cluster_name),
            replication_group_description="Ray GCS fault tolerance: the head's tables",
            engine=ENGINE,
            engine_version=ENGINE_VERSION,
            cache_node_type=node_type,
            num_cache_clusters=NODES,
            multi_az_enabled=True,
            automatic_failover_enabled=True,
            port=GCS_STORE_PORT,
            transit_encryption_enabled=True,
            transit_encryption_mode="required",
            at_rest_encryption_enabled=True,
            kms_key_id=self.key.key_arn,
            auth_token=self.auth_token.secret_value.unsafe_unwrap(),
            cache_subnet_group_name=self.subnet_group.ref,
            security_group_ids=[self.security_group.security_group_id],
            # Nothing to keep past the cluster: the GCS tables of a deleted Ray cluster are garbage.
            snapshot_retention_limit=0,
        )
        self.address = Fn.join(
            "", ["rediss://", self.replication_group.attr_primary_end_point_address, f":{GCS_STORE_PORT}"]
        )
        self._cluster_name = cluster_name

    def no_primary_alarm(self) -> cloudwatch.Alarm:
        """An alarm when no node of the store is a primary: the head's GCS cannot write, and a head lost meanwhile
        would lose the replicas as without fault tolerance. Its action is the caller's (the alarm topic), taken both
        when a node reports no primary and when the store falls silent.

        - The sum of the nodes' `IsMaster`, no FILL: a node that reports nothing counts 0 beside one that reports,
          and with neither reporting there is no data point. FILL would put a value in every minute of the query,
          the ones before the store existed included (CloudWatch's metric math guide), so a filled 0 paged on the
          first deploy (the store takes 10-15 minutes to create) and a filled 1 would never notice a silent store.
        - Missing data is `missing`: a new alarm starts in INSUFFICIENT_DATA, and that first state runs no action
          (actions run on a change of state), so no one is paged while the store comes up or on the update that
          first adds it. A store that reported and then fell silent moves the alarm from OK to INSUFFICIENT_DATA,
          which pages as ALARM does.
        - Three one-minute periods: a Multi-AZ failover leaves the store without a primary for about a minute.
        - Created after the store and so deleted before it: `cdk destroy` pages no one either.
        """
        members = [f"{replication_group_id(self._cluster_name)}-{n:03d}" for n in range(1, NODES + 1)]
        primaries = cloudwatch.MathExpression(
            expression=" + ".join(f"m{n}" for n in range(len(members))),
            using_metrics={
                f"m{n}": cloudwatch.Metric(
                    namespace="AWS/ElastiCache",
                    metric_name="IsMaster",
                    dimensions_map={"CacheClusterId": member},
                    statistic="Maximum",
                    period=Duration.minutes(1),
                )
                for n, member in enumerate(members)
            },
            label="nodes that are a primary",
            period=Duration.minutes(1),
        )
        alarm = _PagesWhenSilentToo(
            self,
            "NoPrimary",
            alarm_description=(
                "The Ray GCS store has no primary, or has stopped reporting: the head's GCS cannot write "
                "(docs/operations.md)"
            ),
            metric=primaries,
            threshold=1,
            comparison_operator=cloudwatch.ComparisonOperator.LESS_THAN_THRESHOLD,
            evaluation_periods=NO_PRIMARY_EVALUATION_PERIODS,
            treat_missing_data=cloudwatch.TreatMissingData.MISSING,
        )
        alarm.node.add_dependency(self.replication_group)
        return alarm


class _PagesWhenSilentToo(cloudwatch.Alarm):
    """An alarm whose ALARM actions also run on INSUFFICIENT_DATA: whoever it pages when the store has no primary
    it pages when the store stops reporting."""

    def add_alarm_action(self, *actions: cloudwatch.IAlarmAction) -> None:
        super().add_alarm_action(*actions)
        self.add_insufficient_data_action(*actions)
