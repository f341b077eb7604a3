"""Seeing the service: Container Insights by the EKS add-on, the Ray pods' Prometheus metrics in a
managed Prometheus workspace, the alarms, and a CloudWatch dashboard.

Two paths, each for what it keeps:
- The `amazon-cloudwatch-observability` add-on (Container Insights, enhanced, with accelerated
  compute metrics): GPU and EFA per node, node readiness, pending pods, container logs. Its
  EMF path drops histograms, so it does not carry the Ray pods' metrics.
- A managed collector (AWS::APS::Scraper) scrapes the Ray pods' `metrics` port into an Amazon
  Managed Service for Prometheus workspace, histograms intact; its rule groups alert through
  the workspace's alert manager to the stack's SNS topic. observability/dashboard.json is their Grafana dashboard.
"""

from __future__ import annotations

import json
from typing import Any

from aws_cdk import Duration, Fn, RemovalPolicy, Stack
from aws_cdk import aws_aps as aps
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from constructs import Construct

from cdk_constructs.cluster import as_icluster, pod_identity_role
from serve_config.observability_payloads import alarm_queries, insights_queries

ADDON_NAME = "amazon-cloudwatch-observability"
# The add-on's agent service account (aws-observability/helm-charts values.yaml; FACTS "Observability on EKS").
AGENT_NAMESPACE = "amazon-cloudwatch"
AGENT_SERVICE_ACCOUNT = "cloudwatch-agent"
# The groups the add-on writes to: the agent's performance events (EMF) and Fluent Bit's three
# (application, dataplane, host; chart values.yaml `log_group_name`). Application Signals is off.
ADDON_LOG_GROUPS = ("application", "dataplane", "host", "performance")
# The EKS API server's endpoint (private and public alike).
EKS_API_PORT = 443
# The Kubernetes user a managed collector acts as (its access entry's username; AMP user guide,
# "Configuring your Amazon EKS cluster": a binding for aps-collector-user).
COLLECTOR_USER = "aps-collector-user"


def collector_rbac(namespace: str) -> list[dict[str, Any]]:
    """What the collector's pod discovery needs, and no more: pods of the serving namespace.

    AWS's example ClusterRole grants cluster-wide reads including nodes/proxy (the kubelet's API);
    this scrape config discovers pods in one namespace and scrapes their IPs directly."""
    name = "managed-prometheus-collector"
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": name, "namespace": namespace},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": name, "namespace": namespace},
            "subjects": [{"kind": "User", "name": COLLECTOR_USER, "apiGroup": "rbac.authorization.k8s.io"}],
            "roleRef": {"kind": "Role", "name": name, "apiGroup": "rbac.authorization.k8s.io"},
        },
    ]


def addon_log_group_name(cluster_name: str, kind: str) -> str:
    return f"/aws/containerinsights/{cluster_name}/{kind}"


def addon_configuration() -> dict[str, Any]:
    """Enhanced Container Insights with the GPU (DCGM) and EFA metrics, and container logs.

    The agent config replaces the chart's default, which also turns on Application Signals
    (traces and its own log group): this stack does not use it."""
    return {
        "agent": {
            "config": {
                "logs": {
                    "metrics_collected": {
                        "kubernetes": {"enhanced_container_insights": True, "accelerated_compute_metrics": True}
                    }
                }
            }
        },
        "containerLogs": {"enabled": True},
    }


def alert_manager_definition(topic_arn: str, region: str) -> str:
    """Every alert to the SNS topic (AMP alert manager's sns_configs)."""
    config = {
        "route": {"receiver": "sns", "group_by": ["alertname"], "repeat_interval": "4h"},
        "receivers": [{"name": "sns", "sns_configs": [{"topic_arn": topic_arn, "sigv4": {"region": region}}]}],
    }
    # AMP takes the Alertmanager config as a string under alertmanager_config.
    return "alertmanager_config: |\n" + "\n".join(f"  {line}" for line in json.dumps(config, indent=2).splitlines())


class Observability(Construct):
    """The add-on, the collector and workspace, the alarms and the dashboard.

    Args:
        cluster: the EKS cluster; its security group admits the collector to the metrics port, and the
            groups of its API endpoint admit it to 443.
        cluster_name: the cluster's name as a plain string (cluster.cluster_name is a token): the log
            groups', workspace's, collector's and dashboard's names and every Insights query carry it.
        vpc: the collector's ENIs go in its private subnets.
        logs_key: encrypts the add-on's log groups.
        namespace: the serving namespace: the collector lists its pods, the panels and alarms watch them.
        alert_rules: the workspace's rule groups (serve_config.observability_payloads.render_rules).
        scrape_configuration: the collector's Prometheus configuration, base64-encoded into the
            scraper (serve_config.observability_payloads.render_scrape).
        metrics_port: the port the Ray pods export metrics on, the one the collector is admitted to.
        alarm_email: an address subscribed to the alarm topic; default None (no subscription).
        efa_flat_bytes_per_second: EFA receiving less than this on every node is flat; default 10_000.
        pod_network_kv_bytes_per_second: the serving namespace's pods receiving more than this on the
            pod network is KV-sized traffic; default 10_000_000. With EFA flat too, KV transfers left EFA.

    Attributes:
        addon: the EKS add-on (the stack makes it wait for the node groups).
        workspace, scraper, rules: the managed Prometheus pieces.
        topic: the alarms' SNS topic.
        dashboard: the CloudWatch dashboard (Container Insights panels).
        scraper_security_group: the collector's ENIs' group.
        scrape_ingress, api_ingress: the rules that admit that group to the Ray pods' metrics port and to
            the EKS API's 443 (on each group the API endpoint's ENIs carry).
        notifying_alarms: the alarms that publish to the topic (notify adds one), the only ones CloudWatch may.
        collector_rbac: the Role and RoleBinding that let the collector list the serving namespace's
            pods (the stack makes it wait for the namespace).
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster: eks.Cluster,
        cluster_name: str,
        vpc: ec2.IVpc,
        logs_key: kms.IKey,
        namespace: str,
        alert_rules: str,
        scrape_configuration: str,
        metrics_port: int,
        alarm_email: str | None = None,
        efa_flat_bytes_per_second: int = 10_000,
        pod_network_kv_bytes_per_second: int = 10_000_000,
    ) -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)

        # --- The add-on and its log groups -------------------------------------------
        # Made before the add-on, so the agent never creates them (with no key and no
        # retention) and cdk destroy removes them after it.
        self.log_groups = [
            logs.LogGroup(
                self,
                f"AddonLogs{kind.capitalize()}",
                log_group_name=addon_log_group_name(cluster_name, kind),
                retention=logs.RetentionDays.ONE_MONTH,
                removal_policy=RemovalPolicy.DESTROY,
                encryption_key=logs_key,
            )
            for kind in ADDON_LOG_GROUPS
        ]
        self.agent_role = pod_identity_role(self, "AgentRole")
        self.agent_role.add_managed_policy(
            iam.ManagedPolicy.from_aws_managed_policy_name("CloudWatchAgentServerPolicy")
        )
        self.addon = eks.CfnAddon(
            self,
            "Addon",
            addon_name=ADDON_NAME,
            cluster_name=cluster.cluster_name,
            configuration_values=json.dumps(addon_configuration()),
            pod_identity_associations=[
                eks.CfnAddon.PodIdentityAssociationProperty(
                    role_arn=self.agent_role.role_arn, service_account=AGENT_SERVICE_ACCOUNT
                )
            ],
        )
        for group in self.log_groups:
            self.addon.node.add_dependency(group)

        # --- The alarms' topic ----------------------------------------------------------
        self.topic_key = kms.Key(
            self,
            "TopicKey",
            description="Encrypts the alarm topic of this stack",
            enable_key_rotation=True,
            removal_policy=RemovalPolicy.DESTROY,
            pending_window=Duration.days(7),
        )
        # The two publishers encrypt through SNS with this key, which encrypts this topic only.
        publishers = [iam.ServicePrincipal("aps.amazonaws.com"), iam.ServicePrincipal("cloudwatch.amazonaws.com")]
        self.topic_key.add_to_resource_policy(
            iam.PolicyStatement(principals=publishers, actions=["kms:GenerateDataKey*", "kms:Decrypt"], resources=["*"])
        )
        self.topic = sns.Topic(self, "AlarmTopic", master_key=self.topic_key, enforce_ssl=True)
        self.topic.add_to_resource_policy(
            iam.PolicyStatement(
                principals=[iam.ServicePrincipal("aps.amazonaws.com")],
                actions=["sns:Publish", "sns:GetTopicAttributes"],
                resources=[self.topic.topic_arn],
                conditions={
                    "StringEquals": {"aws:SourceAccount": stack.account},
                },
            )
        )
        if alarm_email is not None:
            self.topic.add_subscription(subscriptions.EmailSubscription(alarm_email))

        # --- Managed Prometheus: workspace, rules, alert manager, collector --------------
        self.workspace = aps.CfnWorkspace(
            self,
            "Workspace",
            alias=f"{cluster_name}-metrics",
            alert_manager_definition=alert_manager_definition(self.topic.topic_arn, stack.region),
        )
        self.workspace.node.add_dependency(self.topic.node.find_child("Policy"))
        self.rules = aps.CfnRuleGroupsNamespace(
            self, "Rules", name=f"{cluster_name}-alarms", workspace=self.workspace.attr_arn, data=alert_rules
        )
        self.scraper_security_group = ec2.SecurityGroup(
            self,
            "ScraperSecurityGroup",
            vpc=vpc,
            description="Managed Prometheus collector ENIs: scrape the Ray pods metrics port",
            allow_all_outbound=True,
        )
        # The one rule that admits the collector to the Ray pods' metrics port (the nodes carry the
        # cluster security group; pods use their node's groups). The NetworkPolicy cannot tell it from
        # any other private-subnet address (docs/operations.md, "Watching it").
        self.scrape_ingress = ec2.CfnSecurityGroupIngress(
            self,
            "ScraperToRayMetrics",
            group_id=cluster.cluster_security_group_id,
            source_security_group_id=self.scraper_security_group.security_group_id,
            ip_protocol="tcp",
            from_port=metrics_port,
            to_port=metrics_port,
            description="Managed Prometheus collector to the Ray pods metrics port",
        )
        # The collector finds its targets through the EKS API, from its own ENIs. The AMP user guide
        # ("Using an AWS managed collector", creating a scraper) requires the cluster's endpoint
        # access to include private access, and has the scraper's subnets and security groups be the
        # cluster's: with a group of its own, that group must reach the API server. The private
        # endpoint's ENIs carry the cluster security group and the control-plane group aws_eks_v2
        # puts in ResourcesVpcConfig; cluster.connections holds both. Without 443 the collector
        # discovers no pod and every Ray series is absent.
        self.api_ingress = [
            ec2.CfnSecurityGroupIngress(
                self,
                f"ScraperToEksApi{group.node.id}",
                group_id=group.security_group_id,
                source_security_group_id=self.scraper_security_group.security_group_id,
                ip_protocol="tcp",
                from_port=EKS_API_PORT,
                to_port=EKS_API_PORT,
                description="Managed Prometheus collector to the EKS API (pod discovery)",
            )
            for group in cluster.connections.security_groups
        ]
        private = vpc.select_subnets(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS)
        self.scraper = aps.CfnScraper(
            self,
            "Scraper",
            alias=f"{cluster_name}-ray-pods",
            source=aps.CfnScraper.SourceProperty(
                eks_configuration=aps.CfnScraper.EksConfigurationProperty(
                    cluster_arn=cluster.cluster_arn,
                    subnet_ids=private.subnet_ids,
                    security_group_ids=[self.scraper_security_group.security_group_id],
                )
            ),
            destination=aps.CfnScraper.DestinationProperty(
                amp_configuration=aps.CfnScraper.AmpConfigurationProperty(workspace_arn=self.workspace.attr_arn)
            ),
            # CloudFormation takes the configuration file base64-encoded (AWS::APS::Scraper ScrapeConfiguration).
            scrape_configuration=aps.CfnScraper.ScrapeConfigurationProperty(
                configuration_blob=Fn.base64(scrape_configuration)
            ),
        )
        self.scraper.node.add_dependency(self.scrape_ingress, *self.api_ingress)
        # The collector's access entry is EKS's (API authentication mode); what it may read is ours.
        self.collector_rbac = eks.KubernetesManifest(
            self, "CollectorRbac", cluster=as_icluster(cluster), manifest=collector_rbac(namespace)
        )

        # --- CloudWatch: the Container Insights dashboard and alarms ----------------------
        self.dashboard = cloudwatch.Dashboard(
            self,
            "Dashboard",
            dashboard_name=f"{cluster_name}-serving",
            default_interval=Duration.hours(3),
        )
        period = Duration.minutes(1)
        widgets = [
            cloudwatch.GraphWidget(
                title=title,
                left=[cloudwatch.MathExpression(expression=query, label=metric, period=period)],
                width=12,
                height=6,
            )
            for title, (metric, query) in insights_queries(cluster_name, namespace).items()
        ]
        for i in range(0, len(widgets), 2):
            self.dashboard.add_widgets(*widgets[i : i + 2])
        queries = alarm_queries(cluster_name, namespace)
        action = cw_actions.SnsAction(self.topic)

        def insights(key: str) -> cloudwatch.MathExpression:
            metric, query = queries[key]
            return cloudwatch.MathExpression(expression=query, label=metric, period=period)

        self.node_not_ready = cloudwatch.Alarm(
            self,
            "NodeNotReady",
            alarm_description="A node of the cluster (GPU or system) has not been Ready for 3 minutes",
            metric=insights("node-not-ready"),
            threshold=1,
            comparison_operator=cloudwatch.ComparisonOperator.LESS_THAN_THRESHOLD,
            evaluation_periods=3,
            treat_missing_data=cloudwatch.TreatMissingData.MISSING,
        )
        self.efa_flat = cloudwatch.Alarm(
            self,
            "EfaFlat",
            alarm_description=f"EFA receives under {efa_flat_bytes_per_second} bytes/s on every node",
            metric=insights("efa-bytes"),
            threshold=efa_flat_bytes_per_second,
            comparison_operator=cloudwatch.ComparisonOperator.LESS_THAN_THRESHOLD,
            evaluation_periods=5,
            treat_missing_data=cloudwatch.TreatMissingData.BREACHING,
        )
        self.kv_on_pod_network = cloudwatch.Alarm(
            self,
            "KvSizedTrafficOnPodNetwork",
            alarm_description=(
                f"The serving namespace's pods receive over {pod_network_kv_bytes_per_second} bytes/s "
                "on the pod network"
            ),
            metric=insights("serving-pod-network"),
            threshold=pod_network_kv_bytes_per_second,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
            evaluation_periods=5,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
        )
        # Both Container Insights: KV-sized traffic on the pod network while EFA carries nothing is
        # NIXL's TCP path (the KV floor alarm in the workspace sees the same failure from NIXL's side).
        self.kv_off_efa = cloudwatch.CompositeAlarm(
            self,
            "KvOffEfa",
            alarm_description="EFA flat while KV-sized traffic crosses the pod network: KV transfers left EFA",
            alarm_rule=cloudwatch.AlarmRule.all_of(
                cloudwatch.AlarmRule.from_alarm(self.efa_flat, cloudwatch.AlarmState.ALARM),
                cloudwatch.AlarmRule.from_alarm(self.kv_on_pod_network, cloudwatch.AlarmState.ALARM),
            ),
        )
        # The composite's two halves notify only through it.
        self.notifying_alarms: list[cloudwatch.AlarmBase] = [self.node_not_ready, self.kv_off_efa]
        for alarm in self.notifying_alarms:
            alarm.add_alarm_action(action)
        self._let_alarms_publish(self.notifying_alarms)

    def notify(self, alarm: cloudwatch.Alarm) -> None:
        """Another construct's alarm pages the topic too: its action, and CloudWatch's right to publish it."""
        alarm.add_alarm_action(cw_actions.SnsAction(self.topic))
        self.notifying_alarms.append(alarm)
        self._let_alarms_publish([alarm])

    def _let_alarms_publish(self, alarms: list[cloudwatch.AlarmBase]) -> None:
        """Let CloudWatch publish these alarms' actions to the topic. A topic policy replaces SNS's default one,
        so without this Allow every alarm action is refused (AWS Knowledge Center "cloudwatch-receive-sns-for-
        alarm-trigger"). The condition lists this stack's alarms (aws:SourceArn) rather than `alarm:*`, so no
        other alarm of the account can page whoever the topic reaches."""
        stack = Stack.of(self)
        self.topic.add_to_resource_policy(
            iam.PolicyStatement(
                principals=[iam.ServicePrincipal("cloudwatch.amazonaws.com")],
                actions=["sns:Publish"],
                resources=[self.topic.topic_arn],
                conditions={
                    "StringEquals": {"aws:SourceAccount": stack.account},
                    "ArnEquals": {"aws:SourceArn": [alarm.alarm_arn for alarm in alarms]},
                },
            )
        )

    def dashboard_url(self) -> str:
        region = Stack.of(self).region
        return (
            f"https://{region}.console.aws.amazon.com/cloudwatch/home?region={region}"
            f"#dashboards:name={self.dashboard.dashboard_name}"
        )
