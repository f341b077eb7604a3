"""Behind the internal NLB, an ingress pod is ready only once its target is healthy.

The readiness gate is injected by the AWS Load Balancer Controller's pod webhook, which the
pinned chart registers for namespaces that carry its label (templates/webhook.yaml,
mpod.elbv2.k8s.aws). The webhook and its selectors are the chart's own, rendered by the
deploy's helm with the stack's values; the namespace and the Service are the template's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

import serve_config
from settings import Settings
from tests.conftest import manifests, synth
from tests.support.helm import rendered_releases

NLB = {"internal_endpoint_cidrs": "10.0.0.0/8"}
POD_WEBHOOK = "mpod.elbv2.k8s.aws"


def selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A Kubernetes LabelSelector (matchLabels and matchExpressions) against an object's labels."""
    if not selector:
        return True
    if any(labels.get(key) != value for key, value in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        key, operator, values = expression["key"], expression["operator"], expression.get("values", [])
        present = key in labels
        ok = {
            "In": present and labels.get(key) in values,
            "NotIn": not present or labels.get(key) not in values,
            "Exists": present,
            "DoesNotExist": not present,
        }[operator]
        if not ok:
            return False
    return True


def _pod_webhook(template: dict[str, Any]) -> dict[str, Any]:
    rendered = rendered_releases(template, Settings().kubernetes_version)["aws-load-balancer-controller"]
    (config,) = [o for o in rendered if o["kind"] == "MutatingWebhookConfiguration"]
    (webhook,) = [w for w in config["webhooks"] if w["name"] == POD_WEBHOOK]
    found: dict[str, Any] = webhook
    return found


def _serving_namespace(template: dict[str, Any]) -> dict[str, Any]:
    (namespace,) = [
        m
        for m in manifests(template)
        if m["kind"] == "Namespace" and m["metadata"]["name"] == Settings().serving_namespace
    ]
    return namespace


def _ingress_pod_labels(template: dict[str, Any]) -> dict[str, str]:
    (rayservice,) = [m for m in manifests(template) if m["kind"] == "RayService"]
    (group,) = [
        g
        for g in rayservice["spec"]["rayClusterConfig"]["workerGroupSpecs"]
        if g["groupName"] == serve_config.INGRESS_GROUP
    ]
    labels: dict[str, str] = group["template"]["metadata"]["labels"]
    return labels


def test_the_controllers_pod_webhook_selects_the_serving_namespace_and_the_ingress_pods() -> None:
    template = synth(**NLB)
    webhook = _pod_webhook(template)
    namespace_labels = _serving_namespace(template)["metadata"].get("labels", {})
    assert selector_matches(webhook["namespaceSelector"], namespace_labels), (
        webhook["namespaceSelector"],
        namespace_labels,
    )
    assert selector_matches(webhook.get("objectSelector"), _ingress_pod_labels(template))
    assert {"operations": ["CREATE"], "resources": ["pods"]}.items() <= webhook["rules"][0].items()


def test_the_gate_needs_ip_targets_and_the_nlb_has_them() -> None:
    (service,) = [m for m in manifests(synth(**NLB)) if m["kind"] == "Service" and m["spec"]["type"] == "LoadBalancer"]
    assert service["metadata"]["annotations"]["service.beta.kubernetes.io/aws-load-balancer-nlb-target-type"] == "ip"


@pytest.mark.parametrize("overrides", [{}, {"hf_token_secret_name": "prod/hf-token"}], ids=["defaults", "secrets"])
def test_without_the_nlb_the_namespace_carries_no_controller_label(overrides: dict[str, Any]) -> None:
    labels = _serving_namespace(synth(**overrides))["metadata"].get("labels", {})
    assert not [key for key in labels if key.startswith("elbv2.k8s.aws/")], labels
