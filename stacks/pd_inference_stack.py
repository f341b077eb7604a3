"""The one stack: wires the constructs together, nothing else."""

from __future__ import annotations

from typing import Any

from aws_cdk import CfnOutput, Stack
from constructs import Construct

import serve_config
from cdk_constructs.addons import ClusterAddons
from cdk_constructs.cluster import EksCluster
from cdk_constructs.cluster_autoscaler import ClusterAutoscaler
from cdk_constructs.gcs_store import GCS_STORE_PORT, GcsStore
from cdk_constructs.gpu_nodes import EfaGpuNodes, gpu_toleration
from cdk_constructs.head_image import HeadImage
from cdk_constructs.image_cache import PullThroughImageCache, from_cache, with_string
from cdk_constructs.llm_service import LlmService
from cdk_constructs.log_encryption import LogEncryptionKey
from cdk_constructs.model_weights import ModelReadAccess
from cdk_constructs.network import Network
from cdk_constructs.network_policies import ServingNetworkPolicies, serving_network_policies
from cdk_constructs.observability import Observability
from cdk_constructs.private_endpoint import READINESS_GATE_LABELS, IngressService, PrivateEndpoint
from cdk_constructs.ray_pods_code import RayPodsCode
from cdk_constructs.secrets_sync import SecretsSync
from cdk_constructs.system_nodes import SystemNodes
from cdk_constructs.warm_nodes import WarmGpuNodes
from serve_config import endpoint_keys, pod_templates
from serve_config.head_image import head_image_daemonset
from serve_config.observability_payloads import render_rules, render_scrape
from serve_config.warm_nodes import warm_node_manifests
from settings import Settings
from settings.catalog import CLUSTER_AUTOSCALER_IMAGE_TAGS, ECR_PUBLIC_REGISTRY, KUBERAY_OPERATOR
from settings.estimates import observability_summary
from settings.model import s3_model_location
from settings.sizing import gpu_node_bounds, nlb_deregistration_delay
from stacks.outputs import usage_outputs
from stacks.synced_secrets import synced_secrets


class PdInferenceStack(Stack):
    """Disaggregated LLM inference on EKS: prefill and decode on separate GPU nodes, KV cache over EFA."""

    def __init__(self, scope: Construct, construct_id: str, *, settings: Settings, **kwargs: Any) -> None:
        super().__init__(scope, construct_id, **kwargs)
        logs_key = LogEncryptionKey(self, "LogsKey").key
        network = Network(
            self,
            "Network",
            vpc_id=settings.vpc_id,
            cidr=settings.vpc_cidr,
            max_azs=settings.max_azs,
            availability_zones=settings.new_vpc_availability_zones,
            gpu_availability_zone=settings.gpu_availability_zone,
            logs_key=logs_key,
        )
        eks_cluster = EksCluster(
            self,
            "Eks",
            vpc=network.vpc,
            cluster_name=settings.cluster_name,
            kubernetes_version=settings.kubernetes_version,
            endpoint_access=settings.endpoint_access,
            admin_principal_arns=settings.cluster_admin_arns,
            public_access_cidrs=settings.public_access_cidrs,
            logs_key=logs_key,
        )
        cluster = eks_cluster.cluster
        system_nodes = SystemNodes(
            self,
            "SystemNodes",
            cluster=cluster,
            instance_type=settings.system_instance_type,
            min_size=settings.system_nodes_min,
            desired_size=settings.system_nodes_desired,
            max_size=settings.system_nodes_max,
            volume_gib=settings.system_volume_gib,
            pods_reach_imds=settings.pod_imds_access,
        )
        min_gpu_nodes, max_gpu_nodes = gpu_node_bounds(settings)
        gpu_nodes = EfaGpuNodes(
            self,
            "GpuNodes",
            cluster=cluster,
            vpc=network.vpc,
            subnet=network.gpu_subnet,
            instance_type=settings.gpu_instance_type,
            node_count=min_gpu_nodes,
            max_node_count=max_gpu_nodes,
            volume_gib=settings.gpu_root_volume_gib,
            placement_group=settings.gpu_placement_group,
            capacity_reservation_id=settings.gpu_capacity_reservation_id,
            capacity_block=settings.gpu_capacity_block,
            pods_reach_imds=settings.pod_imds_access,
            local_nvme_raid0=settings.gpu_instance.instance_store_gb > 0,
            ami_release_version=settings.gpu_ami_release,
        )
        # Everything Kubernetes runs waits for both node groups (and is deleted before them).
        nodegroups = (system_nodes.nodegroup, gpu_nodes.nodegroup)
        addons = ClusterAddons(
            self,
            "Addons",
            cluster=cluster,
            system_node_labels=system_nodes.labels,
            gpu_node_labels=gpu_nodes.labels,
            gpu_toleration=gpu_toleration(),
        )
        image_cache: PullThroughImageCache | None = None
        if settings.image_pull_through_cache_prefix is not None:
            image_cache = PullThroughImageCache(
                self,
                "ImageCache",
                prefix=settings.image_pull_through_cache_prefix,
                image=settings.ray_image,
                registry=ECR_PUBLIC_REGISTRY,
                node_roles=[system_nodes.role, gpu_nodes.role],
                image_text=serve_config.serving_image(settings),
            )
        rayservice = from_cache(
            pod_templates.rayservice(
                settings,
                system_node_labels=dict(system_nodes.labels),
                gpu_node_labels=dict(gpu_nodes.labels),
                gpu_toleration=gpu_toleration(),
            ),
            image_cache,
        )
        gcs_store: GcsStore | None = None
        if settings.gcs_fault_tolerance:
            gcs_store = GcsStore(
                self,
                "GcsStore",
                vpc=network.vpc,
                node_security_group=cluster.cluster_security_group,
                cluster_name=settings.cluster_name,
                node_type=settings.gcs_store_node_type,
            )
            rayservice = with_string(rayservice, serve_config.GCS_STORE_ADDRESS_PLACEHOLDER, gcs_store.address)
        service = LlmService(
            self,
            "LlmService",
            cluster=cluster,
            namespace=settings.serving_namespace,
            rayservice=rayservice,
            system_node_labels=system_nodes.labels,
            namespace_labels=READINESS_GATE_LABELS if settings.internal_endpoint_cidrs else None,
        )
        if image_cache is not None:
            # The pods pull the cached image: the rule, the repository and the nodes' import right first.
            service.rayservice_manifest.node.add_dependency(image_cache)
        if gcs_store is not None:
            # The store outlives the RayService on delete: KubeRay's cleanup Job reads it while the RayCluster goes.
            service.rayservice_manifest.node.add_dependency(gcs_store)
        # The control plane's ENIs, and an internal NLB, live in the private subnets.
        private_cidrs = [subnet.ipv4_cidr_block for subnet in network.vpc.private_subnets]
        network_policies = ServingNetworkPolicies(
            self,
            "NetworkPolicies",
            cluster=cluster,
            policies=serving_network_policies(
                namespace=settings.serving_namespace,
                ray_pod_labels=serve_config.pod_labels(settings),
                operator_namespace=KUBERAY_OPERATOR.namespace,
                operator_pod_labels={
                    "app.kubernetes.io/name": KUBERAY_OPERATOR.chart,
                    "app.kubernetes.io/instance": KUBERAY_OPERATOR.release,
                },
                dashboard_port=serve_config.DASHBOARD_PORT,
                serve_port=serve_config.SERVE_PORT,
                metrics_port=serve_config.METRICS_PORT,
                control_plane_cidrs=private_cidrs,
                load_balancer_cidrs=private_cidrs if settings.internal_endpoint_cidrs else [],
                gcs_store_port=GCS_STORE_PORT if gcs_store is not None else None,
            ),
        )
        # The policies are in place before any Ray pod starts, and go after them.
        for policy in network_policies.manifests:
            policy.node.add_dependency(service.namespace_manifest)
        service.rayservice_manifest.node.add_dependency(*network_policies.manifests)
        location = s3_model_location(settings)
        if location is not None:
            weights = ModelReadAccess(
                self,
                "ModelWeights",
                cluster=cluster,
                namespace=settings.serving_namespace,
                service_account=serve_config.RAY_SERVICE_ACCOUNT,
                bucket=location[0],
                prefix=location[1],
            )
            weights.service_account_manifest.node.add_dependency(service.namespace_manifest)
            # The whole construct: pods admitted before the association exists never get credentials.
            service.rayservice_manifest.node.add_dependency(weights)
        synced = synced_secrets(settings, gcs_store=gcs_store)
        secrets_releases: list[Construct] = []
        synced_secret_manifests: list[Construct] = []
        autoscaler_releases: list[Construct] = []
        if gpu_nodes.autoscaled:
            autoscaler = ClusterAutoscaler(
                self,
                "ClusterAutoscaler",
                cluster=cluster,
                nodegroup=gpu_nodes.nodegroup,
                min_nodes=min_gpu_nodes,
                max_nodes=max_gpu_nodes,
                image_tag=CLUSTER_AUTOSCALER_IMAGE_TAGS[settings.kubernetes_version],
                system_node_labels=system_nodes.labels,
            )
            # Its pod schedules on a system node; it is deleted before the groups it sizes.
            autoscaler.release.node.add_dependency(*nodegroups)
            autoscaler_releases.append(autoscaler.release)
        if synced:
            # Construct id kept from when it synced only the model token: another id
            # would replace the operator's Helm release, which a fixed release name forbids.
            secrets_sync = SecretsSync(
                self,
                "ModelToken",
                cluster=cluster,
                namespace=settings.serving_namespace,
                secrets=synced,
                system_node_labels=system_nodes.labels,
            )
            secrets_sync.release.node.add_dependency(*nodegroups)
            secrets_releases.append(secrets_sync.release)
            secrets_sync.secret_store.node.add_dependency(service.namespace_manifest)
            service.rayservice_manifest.node.add_dependency(*secrets_sync.external_secrets)
            synced_secret_manifests += secrets_sync.external_secrets
        if settings.gpu_warm_nodes:
            warm = WarmGpuNodes(
                self,
                "WarmGpuNodes",
                cluster=cluster,
                manifests=[
                    from_cache(manifest, image_cache)
                    for manifest in warm_node_manifests(
                        settings,
                        namespace=settings.serving_namespace,
                        gpu_node_labels=gpu_nodes.labels,
                        gpu_toleration=gpu_toleration(),
                    )
                ],
            )
            if image_cache is not None:
                warm.deployment.node.add_dependency(image_cache)
            # Its pods hold GPUs and read the model token: after the device plugins and the synced
            # secrets, and deleted before them and the node groups.
            warm.deployment.node.add_dependency(
                service.namespace_manifest, *nodegroups, *addons.releases, *synced_secret_manifests
            )
        if gcs_store is not None:
            # The head comes back within the workers' 600 s only if its node need not pull the image first.
            head_image = HeadImage(
                self,
                "HeadImage",
                cluster=cluster,
                daemonset=from_cache(
                    head_image_daemonset(
                        settings, namespace=settings.serving_namespace, system_node_labels=system_nodes.labels
                    ),
                    image_cache,
                ),
            )
            head_image.manifest.node.add_dependency(service.namespace_manifest, *nodegroups)
            if image_cache is not None:
                head_image.manifest.node.add_dependency(image_cache)
        code = RayPodsCode(self, "RayPodsCode", cluster=cluster, configmap=endpoint_keys.ray_pods_configmap(settings))
        code.manifest.node.add_dependency(service.namespace_manifest)
        service.rayservice_manifest.node.add_dependency(code.manifest)
        # The clients' endpoint: the ingress group's pods only, never a GPU worker's Serve proxy.
        client_endpoint = IngressService(
            self,
            "IngressService",
            cluster=cluster,
            namespace=settings.serving_namespace,
            service_name=serve_config.ingress_service_name(settings),
            selector=serve_config.ingress_selector(settings),
            port=serve_config.SERVE_PORT,
        )
        client_endpoint.manifest.node.add_dependency(service.namespace_manifest)
        if settings.internal_endpoint_cidrs:
            endpoint = PrivateEndpoint(
                self,
                "PrivateEndpoint",
                cluster=cluster,
                vpc=network.vpc,
                namespace=settings.serving_namespace,
                service_name=f"{settings.service_name}-internal",
                selector=serve_config.ingress_selector(settings),
                port=serve_config.SERVE_PORT,
                source_cidrs=settings.internal_endpoint_cidrs,
                deregistration_delay_seconds=nlb_deregistration_delay(settings),
                tls_certificate_arn=settings.endpoint_tls_certificate_arn,
                system_node_labels=system_nodes.labels,
            )
            endpoint.release.node.add_dependency(*nodegroups)
            endpoint.service.node.add_dependency(service.namespace_manifest)
            # The controller's webhooks are registered by its release: whatever
            # creates Services (the charts, KubeRay for the RayService) comes after.
            later_services = (service.rayservice_manifest, client_endpoint.manifest)
            for later in (*addons.releases, *later_services, *secrets_releases, *autoscaler_releases):
                later.node.add_dependency(endpoint.release)
            CfnOutput(
                self,
                "InternalEndpointCommand",
                value=(
                    f"kubectl -n {settings.serving_namespace} get svc {settings.service_name}-internal "
                    "-o jsonpath='{.status.loadBalancer.ingress[0].hostname}'"
                ),
                description=f"Prints the internal NLB's DNS name (port {serve_config.SERVE_PORT})",
            )

        # Deletion runs in reverse: RayService, then Helm releases, then node
        # groups, then the cluster. The releases wait for nodes to exist so
        # their pods schedule; the RayService needs the CRDs and device plugins.
        for nodegroup in nodegroups:
            nodegroup.node.add_dependency(*eks_cluster.node_prerequisites)
        for release in addons.releases:
            release.node.add_dependency(*nodegroups)
        service.namespace_manifest.node.add_dependency(*nodegroups)
        service.rayservice_manifest.node.add_dependency(*addons.releases, addons.kuberay_crd_upgrade[-1])

        if settings.observability:
            watch = Observability(
                self,
                "Observability",
                cluster=cluster,
                cluster_name=settings.cluster_name,
                vpc=network.vpc,
                logs_key=logs_key,
                namespace=settings.serving_namespace,
                alert_rules=render_rules(settings),
                scrape_configuration=render_scrape(settings, cluster.cluster_arn),
                metrics_port=serve_config.METRICS_PORT,
                alarm_email=settings.alarm_email,
                efa_flat_bytes_per_second=settings.alarm_efa_flat_bytes_per_second,
                pod_network_kv_bytes_per_second=settings.alarm_pod_network_kv_bytes_per_second,
            )
            # Its pods schedule once nodes exist, and Pod Identity hands them the agent's role.
            watch.addon.node.add_dependency(*nodegroups)
            watch.collector_rbac.node.add_dependency(service.namespace_manifest)
            CfnOutput(
                self,
                "DashboardUrl",
                value=watch.dashboard_url(),
                description="CloudWatch dashboard: GPU, EFA, nodes, pending pods",
            )
            CfnOutput(
                self,
                "PrometheusQueryUrl",
                value=watch.workspace.attr_prometheus_endpoint,
                description="The managed Prometheus workspace's endpoint (SigV4): Grafana's source, verify's queries",
            )
            CfnOutput(
                self,
                "GrafanaImportCommand",
                value=(
                    "python -m tools.import_dashboard --grafana-url <your Grafana> "
                    f"--prometheus-url {watch.workspace.attr_prometheus_endpoint}"
                ),
                description="Imports observability/dashboard.json (KV path and latency panels) into a Grafana",
            )
            if gcs_store is not None:
                watch.notify(gcs_store.no_primary_alarm())
            CfnOutput(self, "AlarmTopicArn", value=watch.topic.topic_arn, description="Every alarm goes here")
            CfnOutput(
                self,
                "EstimatedObservabilityPerMonth",
                value=observability_summary(settings),
                description="Monthly estimate of the metrics, logs and alarms (settings/estimates.py)",
            )

        usage_outputs(self, settings=settings, cluster=cluster, gpu_subnet=network.gpu_subnet)
