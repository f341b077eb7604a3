"""The client endpoints, both on the ingress group's pods: a ClusterIP Service (the tools' and a
user's port-forward) and, optionally, an internal Network Load Balancer."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from aws_cdk import Aws
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from constructs import Construct

from cdk_constructs.cluster import as_icluster
from cdk_constructs.helm import helm_release, pod_identity
from settings.catalog import AWS_LOAD_BALANCER_CONTROLLER

POLICY_FILE = (
    Path(__file__).parent / "policies" / f"aws-load-balancer-controller-v{AWS_LOAD_BALANCER_CONTROLLER.version}.json"
)


TLS_PORT = 443
# TLS 1.3 and 1.2 with forward-secret ciphers only: ELB's recommended policy for NLB TLS listeners.
TLS_POLICY = "ELBSecurityPolicy-TLS13-1-2-2021-06"
# On the serving namespace, this label makes the controller's pod webhook give every pod behind
# the NLB a readiness gate: a new ingress pod counts as ready only once its target is healthy in
# the target group, so a replaced pod never leaves the NLB with only initial or draining targets
# (the chart's mpod.elbv2.k8s.aws webhook selects namespaces by it; ip targets only).
READINESS_GATE_LABELS = {"elbv2.k8s.aws/pod-readiness-gate-inject": "enabled"}
# The controller passes this annotation's comma-separated key=value pairs to the target group as
# ELB attributes (pkg/service/model_build_target_group.go, v3.2.2).
TARGET_GROUP_ATTRIBUTES = "service.beta.kubernetes.io/aws-load-balancer-target-group-attributes"


def ingress_service(*, name: str, namespace: str, selector: Mapping[str, str], port: int) -> dict[str, Any]:
    """A ClusterIP Service on the serve port of the pods the selector names (serve_config.ingress_selector).

    KubeRay's own serve Service is no client endpoint: it selects every ready pod of the
    serving RayCluster that runs a Serve proxy, GPU workers included, and ignores a custom
    selector (ray-operator controllers/ray/common/service.go, BuildServeService, v1.7.0).
    """
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "type": "ClusterIP",
            "selector": dict(selector),
            "ports": [{"name": "serve", "port": port, "targetPort": port, "protocol": "TCP"}],
        },
    }


class IngressService(Construct):
    """Applies ingress_service() as one manifest.

    `kubectl port-forward svc/<name>` picks one ready pod when it starts and stays on it: with
    the one ingress replica that is the endpoint; when that pod is replaced, start it again.

    Args:
        cluster: the cluster; namespace / service_name / selector / port: the Service.

    Attributes:
        manifest: the Service's manifest (the stack makes it wait for the namespace).
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster: eks.Cluster,
        namespace: str,
        service_name: str,
        selector: Mapping[str, str],
        port: int,
    ) -> None:
        super().__init__(scope, construct_id)
        service = ingress_service(name=service_name, namespace=namespace, selector=selector, port=port)
        self.manifest = eks.KubernetesManifest(self, "Service", cluster=as_icluster(cluster), manifest=[service])


def internal_nlb_service(
    *,
    name: str,
    namespace: str,
    selector: Mapping[str, str],
    port: int,
    source_cidrs: Sequence[str],
    deregistration_delay_seconds: int,
    tls_certificate_arn: str | None = None,
) -> dict[str, Any]:
    """A LoadBalancer Service the AWS Load Balancer Controller turns into an internal NLB.

    With a certificate, its one listener is TLS on 443 (the NLB terminates TLS
    and forwards plain TCP to the pods' serve port); without, plain TCP on the port.
    A deregistering target keeps its open connections for deregistration_delay_seconds
    (settings.sizing.nlb_deregistration_delay), and past it too: the NLB may still hand a
    deregistering target a new stream for a while, and cutting connections at the delay would end
    that stream early; the ingress pod's preStop outlasts them both (docs/operations.md, "The
    internal NLB during a change").
    """
    attributes = {
        "deregistration_delay.timeout_seconds": str(deregistration_delay_seconds),
        "deregistration_delay.connection_termination.enabled": "false",
    }
    annotations = {
        "service.beta.kubernetes.io/aws-load-balancer-type": "external",
        "service.beta.kubernetes.io/aws-load-balancer-scheme": "internal",
        "service.beta.kubernetes.io/aws-load-balancer-nlb-target-type": "ip",
        TARGET_GROUP_ATTRIBUTES: ",".join(f"{key}={value}" for key, value in attributes.items()),
    }
    listener = {"name": "serve", "port": port, "targetPort": port, "protocol": "TCP"}
    if tls_certificate_arn is not None:
        annotations |= {
            "service.beta.kubernetes.io/aws-load-balancer-ssl-cert": tls_certificate_arn,
            "service.beta.kubernetes.io/aws-load-balancer-ssl-ports": str(TLS_PORT),
            "service.beta.kubernetes.io/aws-load-balancer-ssl-negotiation-policy": TLS_POLICY,
        }
        listener = {"name": "serve-tls", "port": TLS_PORT, "targetPort": port, "protocol": "TCP"}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
        "spec": {
            "type": "LoadBalancer",
            "loadBalancerClass": "service.k8s.aws/nlb",
            "loadBalancerSourceRanges": list(source_cidrs),
            "selector": dict(selector),
            "ports": [listener],
        },
    }


class PrivateEndpoint(Construct):
    """The AWS Load Balancer Controller (Helm, Pod Identity) and one internal NLB Service.

    Only the serve port is behind the NLB, and only the listed CIDRs reach it;
    the Ray dashboard and GCS stay on the cluster-internal head Service.

    Args:
        cluster: the cluster; vpc: its VPC (the controller is told it, not left to IMDS,
            which pods cannot reach at hop limit 1).
        namespace / service_name / selector / port: the Service to create; the selector is the
            ingress group's (serve_config.ingress_selector), as IngressService's.
        source_cidrs: who may connect.
        deregistration_delay_seconds: the target group's deregistration delay
            (settings.sizing.nlb_deregistration_delay).
        tls_certificate_arn: an ACM certificate: the NLB listens with TLS on 443
            instead of plain TCP on the port. Default None (plain TCP).
        system_node_labels: where the controller runs.

    Attributes:
        release: the controller's Helm release; service: the Service manifest.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster: eks.Cluster,
        vpc: ec2.IVpc,
        namespace: str,
        service_name: str,
        selector: Mapping[str, str],
        port: int,
        source_cidrs: Sequence[str],
        deregistration_delay_seconds: int,
        tls_certificate_arn: str | None = None,
        system_node_labels: Mapping[str, str],
    ) -> None:
        super().__init__(scope, construct_id)
        pin = AWS_LOAD_BALANCER_CONTROLLER
        self.role = pod_identity(
            self, "PodIdentity", cluster=cluster, namespace=pin.namespace, service_account=pin.release
        )
        document = iam.PolicyDocument.from_json(json.loads(POLICY_FILE.read_text()))
        iam.Policy(self, "Policy", document=document, roles=[self.role])
        values = {
            "clusterName": cluster.cluster_name,
            "region": Aws.REGION,
            "vpcId": vpc.vpc_id,
            "serviceAccount": {"name": pin.release},
            "nodeSelector": dict(system_node_labels),
            # The Service mutator fails closed for every Service CREATE in the
            # cluster while the controller is not ready; it only defaults
            # loadBalancerClass, which our Service sets itself.
            "enableServiceMutatorWebhook": False,
        }
        # Its remaining webhooks (TargetGroupBinding, Ingress) fail closed too:
        # the release returns only once the controller serves them.
        self.release = helm_release(self, "Controller", cluster=cluster, pin=pin, values=values, wait=True)
        self.service = eks.KubernetesManifest(
            self,
            "Service",
            cluster=as_icluster(cluster),
            manifest=[
                internal_nlb_service(
                    name=service_name,
                    namespace=namespace,
                    selector=selector,
                    port=port,
                    source_cidrs=source_cidrs,
                    deregistration_delay_seconds=deregistration_delay_seconds,
                    tls_certificate_arn=tls_certificate_arn,
                )
            ],
        )
        # Deleted before the controller, so the controller is still there to
        # remove the NLB (kubectl delete waits for its finalizer).
        self.service.node.add_dependency(self.release)
