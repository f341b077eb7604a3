"""The outputs a user reads after a deploy: the cost, how to reach the cluster and the endpoint."""

from __future__ import annotations

import json

from aws_cdk import CfnOutput, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks

import serve_config
from settings import Settings, catalog
from settings.estimates import PRICE_SOURCE, cost_summary


def usage_outputs(stack: Stack, *, settings: Settings, cluster: eks.Cluster, gpu_subnet: ec2.ISubnet) -> None:
    """The estimate, the cluster's name and kubeconfig command, the GPU AZ, the port-forward and a first request."""
    CfnOutput(
        stack,
        "EstimatedCostPerHour",
        value=cost_summary(settings),
        description=f"On-demand estimate from {PRICE_SOURCE}",
    )
    region = stack.region
    CfnOutput(stack, "ClusterName", value=cluster.cluster_name, description="EKS cluster name")
    CfnOutput(
        stack,
        "UpdateKubeconfigCommand",
        value=f"aws eks update-kubeconfig --name {cluster.cluster_name} --region {region}",
        description="Point kubectl at the cluster",
    )
    CfnOutput(
        stack,
        "GpuNodeAvailabilityZone",
        value=gpu_subnet.availability_zone,
        description="The one AZ of the EFA GPU nodes (it must offer the GPU instance type)",
    )
    svc = serve_config.ingress_service_name(settings)
    port = serve_config.SERVE_PORT
    CfnOutput(
        stack,
        "PortForwardCommand",
        value=f"kubectl -n {settings.serving_namespace} port-forward svc/{svc} {port}:{port}",
        description=(
            "Reach the OpenAI-compatible endpoint on localhost, through the ingress pod "
            "(kubectl stays on the pod it picked: run it again after that pod is replaced)"
        ),
    )
    keyed = settings.endpoint_api_keys_secret_name is not None
    # A thinking model's answer would otherwise be cut inside its reasoning at 64 tokens.
    off = catalog.THINKING_OFF.get(settings.model.reasoning_parser or "")
    thinking_off = f', "chat_template_kwargs": {json.dumps(dict(off))}' if off else ""
    CfnOutput(
        stack,
        "ChatCompletionExample",
        value=(
            f"curl -s http://localhost:{port}/v1/chat/completions -H 'Content-Type: application/json' "
            + ('-H "Authorization: Bearer $OPENAI_API_KEY" ' if keyed else "")
            + f'-d \'{{"model": "{settings.model_id}", "messages": [{{"role": "user", '
            f'"content": "Hello"}}], "max_tokens": 64{thinking_off}}}\''
        ),
        description="One chat completion through the port-forward"
        + (f" (OPENAI_API_KEY: a key from the secret {settings.endpoint_api_keys_secret_name})" if keyed else ""),
    )
