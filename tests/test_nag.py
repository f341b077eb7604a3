"""cdk-nag AwsSolutions passes with reviewed acknowledgements; what nag misses on eks_v2 is tested here."""

from __future__ import annotations

from typing import Any

import aws_cdk as cdk
import pytest

from settings import settings_from
from stacks.nag_acknowledgements import ACKNOWLEDGEMENTS, OPTIONAL_ACKNOWLEDGEMENTS, acknowledge_findings
from stacks.pd_inference_stack import PdInferenceStack
from tests.conftest import PROJECT_CONTEXT, only, synth
from tests.support.autoscaling import AUTOSCALING

REVIEWED_DEFAULT = 14
REVIEWED_OPTIONAL = 13
# Optional acknowledgements whose construct the defaults build (Observability/AgentRole: observability is on;
# GcsStore/AuthToken: GCS fault tolerance is on).
OPTIONAL_ON_BY_DEFAULT = 2


def test_nag_passes_on_defaults(template: dict[str, Any]) -> None:
    # synth() runs the AwsSolutions plugin; any unacknowledged finding raises.
    assert template["Resources"]


def test_every_acknowledgement_has_a_reason_and_count_is_reviewed() -> None:
    tables = (ACKNOWLEDGEMENTS, OPTIONAL_ACKNOWLEDGEMENTS)
    reasons = [reason for table in tables for rules in table.values() for reason in rules.values()]
    assert all(len(reason) > 30 for reason in reasons)
    # Changing these numbers means a reviewer read the new acknowledgements
    # (+1: the ECR Public finding, whose id is computed).
    assert sum(len(rules) for rules in ACKNOWLEDGEMENTS.values()) + 1 == REVIEWED_DEFAULT
    assert sum(len(rules) for rules in OPTIONAL_ACKNOWLEDGEMENTS.values()) == REVIEWED_OPTIONAL


def test_nag_passes_with_cluster_autoscaler() -> None:
    # synth() runs the AwsSolutions plugin: the autoscaler's role passes with its two reviewed findings.
    template = synth(**AUTOSCALING)
    assert any(k.startswith("ClusterAutoscalerPodIdentityRole") for k in template["Resources"])


def test_unacknowledged_finding_fails_synth() -> None:
    """Without the acknowledgements, the nag plugin stops synth: the check can fail."""
    from cdk_nag import AwsSolutionsChecks

    app = cdk.App(context=PROJECT_CONTEXT)
    PdInferenceStack(app, "Bare", settings=settings_from(PROJECT_CONTEXT))
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    with pytest.raises(RuntimeError, match="ValidationFailed"):
        app.synth()


def test_acknowledgements_apply_to_the_stack() -> None:
    app = cdk.App(context=PROJECT_CONTEXT)
    stack = PdInferenceStack(app, "Count", settings=settings_from(PROJECT_CONTEXT))
    assert acknowledge_findings(stack) == REVIEWED_DEFAULT + OPTIONAL_ON_BY_DEFAULT


# cdk-nag's EKS rules (EKS1 public endpoint, EKS2 logging) look for aws_eks.CfnCluster
# and miss aws_eks_v2's cluster: the same checks, on the template.
def test_control_plane_logging_all_types(template: dict[str, Any]) -> None:
    logging = only(template, "AWS::EKS::Cluster")["Properties"]["Logging"]["ClusterLogging"]["EnabledTypes"]
    assert len(logging) == 5


def test_private_endpoint_has_no_public_access() -> None:
    config = only(synth(endpoint_access="private"), "AWS::EKS::Cluster")["Properties"]["ResourcesVpcConfig"]
    assert config["EndpointPublicAccess"] is False
    assert config["EndpointPrivateAccess"] is True
