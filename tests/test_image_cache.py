"""A regional copy of the serving image: an ECR pull-through cache of public ECR that every Ray pod and warm
placeholder pulls from, removed with the stack, the nodes allowed to fill only its one repository."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from cdk_constructs.node_common import NODE_MANAGED_POLICIES
from serve_config import CLUSTER_CONFIG_LABEL, pod_templates
from settings import SettingsError, settings_from
from settings.catalog import DEFAULT_RAY_IMAGE
from tests.conftest import PROJECT_CONTEXT, manifests, only, rayservice_from, resources, synth
from tests.support.cfn_lint import lint_errors
from tools.template_text import render

PREFIX = "pd-inference-public"
CACHE = {"image_pull_through_cache_prefix": PREFIX}
WARM = {"decode_max_replicas": 2, "decode_target_ongoing_requests": 4, "gpu_warm_nodes": 1}
CACHED = (
    "${AWS::AccountId}.dkr.ecr.${AWS::Region}.${AWS::URLSuffix}/"
    + PREFIX
    + "/deep-learning-containers/ray:serve-llm-cuda-v1.0.0"
)
# An Amazon ECR private image (Amazon ECR user guide, "Private registry concepts"): what kubelet's ECR
# credential provider pulls with the node role.
PRIVATE_ECR = re.compile(r"^\d{12}\.dkr\.ecr\.[a-z0-9-]+\.amazonaws\.com/[a-z0-9._/-]+:[\w.-]+$")


def _images(obj: Any) -> list[str]:
    found: list[str] = []
    if isinstance(obj, dict):
        found += [obj["image"]] if isinstance(obj.get("image"), str) else []
        for value in obj.values():
            found += _images(value)
    elif isinstance(obj, list):
        for value in obj:
            found += _images(value)
    return found


def _plain_strings(obj: Any) -> list[str]:
    """Every string of a template value that no Fn::Sub holds."""
    if isinstance(obj, str):
        return [obj]
    if isinstance(obj, dict):
        return [s for key, value in obj.items() if key != "Fn::Sub" for s in _plain_strings(value)]
    if isinstance(obj, list):
        return [s for value in obj for s in _plain_strings(value)]
    return []


def test_the_rule_and_its_one_repository_go_with_the_stack() -> None:
    template = synth(**CACHE)
    rule = only(template, "AWS::ECR::PullThroughCacheRule")
    assert rule["Properties"] == {
        "EcrRepositoryPrefix": PREFIX,
        "UpstreamRegistry": "ecr-public",
        "UpstreamRegistryUrl": "public.ecr.aws",
    }
    repository = only(template, "AWS::ECR::Repository")
    assert repository["Properties"]["RepositoryName"] == f"{PREFIX}/deep-learning-containers/ray"
    # cdk destroy removes it with the images the nodes pulled into it.
    assert repository["Properties"]["EmptyOnDelete"] is True
    assert repository["DeletionPolicy"] == "Delete"


def test_the_nodes_may_fill_only_that_repository_and_pull_with_their_managed_policy() -> None:
    template = synth(**CACHE)
    (repository_id,) = resources(template, "AWS::ECR::Repository")
    policy = only(template, "AWS::IAM::Policy", PolicyName=next(
        k for k, r in resources(template, "AWS::IAM::Policy").items() if "ImageCache" in k
    ))["Properties"]  # fmt: skip
    assert policy["PolicyDocument"]["Statement"] == [
        {
            "Action": "ecr:BatchImportUpstreamImage",
            "Effect": "Allow",
            "Resource": {"Fn::GetAtt": [repository_id, "Arn"]},
        }
    ]
    roles = {r["Ref"] for r in policy["Roles"]}
    node_roles = {
        ng["Properties"]["NodeRole"]["Fn::GetAtt"][0] for ng in resources(template, "AWS::EKS::Nodegroup").values()
    }
    assert roles == node_roles and len(roles) == 2
    assert "AmazonEC2ContainerRegistryPullOnly" in NODE_MANAGED_POLICIES


def test_every_ray_pod_and_placeholder_runs_the_cached_image() -> None:
    template = synth(**CACHE, **WARM)
    rayservice = rayservice_from(template)
    placeholder = next(
        m for m in manifests(template) if m["metadata"].get("name") == "gpu-warm-node" and m["kind"] == "Deployment"
    )
    images = _images(rayservice) + _images(placeholder)
    # The head, the three worker groups, the model-cache init containers and the placeholder with its download.
    assert len(images) >= 8
    assert set(images) == {CACHED}
    assert DEFAULT_RAY_IMAGE not in json.dumps(manifests(template))
    # In the template itself the image's ${AWS::...} text stands only inside Fn::Sub, which resolves it: as a
    # plain string it would reach kubelet as it is.
    raw = [r["Properties"]["Manifest"] for r in resources(template, "Custom::AWSCDK-EKS-KubernetesResource").values()]
    assert not [s for s in _plain_strings(raw) if "${AWS::" in s]
    assert sum(json.dumps(m).count('{"Fn::Sub": "' + CACHED) for m in raw) >= 2
    sample = CACHED.replace("${AWS::AccountId}", "123456789012").replace("${AWS::Region}", "us-east-1")
    assert PRIVATE_ECR.match(sample.replace("${AWS::URLSuffix}", "amazonaws.com"))


def test_the_pods_wait_for_the_cache_and_the_nodes_right_to_fill_it() -> None:
    template = synth(**CACHE, **WARM)
    cache = {k for k in template["Resources"] if k.startswith("ImageCache")}
    assert len(cache) == 3
    for kind, name in (("RayService", None), ("Deployment", "gpu-warm-node"), ("DaemonSet", "ray-head-image")):
        (resource,) = [
            r
            for r in resources(template, "Custom::AWSCDK-EKS-KubernetesResource").values()
            if any(
                d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
                for d in json.loads(render(r["Properties"]["Manifest"]))
            )
        ]
        assert cache <= set(resource["DependsOn"]), kind


def test_the_cluster_config_hash_is_over_the_images_text_not_a_token() -> None:
    """The label is the hash of the RayService as a reader sees it, the image as its ${AWS::...} text: a
    token's text would carry a counter that moves with the other tokens a synth makes."""
    rayservice = rayservice_from(synth(**CACHE))
    assert set(_images(rayservice)) == {CACHED}
    assert rayservice["metadata"]["labels"][CLUSTER_CONFIG_LABEL] == pod_templates.cluster_config_hash(rayservice)
    labels = {
        rayservice_from(synth(**CACHE, **extra))["metadata"]["labels"][CLUSTER_CONFIG_LABEL]
        for extra in ({}, {"observability": False}, {"gpu_placement_group": False})
    }
    assert len(labels) == 1


@pytest.mark.parametrize(
    ("overrides", "allowed"),
    [
        ({"image_pull_through_cache_prefix": "Bad_Prefix"}, "2 to 30 lowercase"),
        ({"image_pull_through_cache_prefix": "x"}, "2 to 30 lowercase"),
        ({"image_pull_through_cache_prefix": "a" * 31}, "2 to 30 lowercase"),
        ({**CACHE, "ray_image": "rayproject/ray:2.58.0"}, "set only with a ray_image on public.ecr.aws"),
    ],
    ids=["case", "short", "long", "not-public-ecr"],
)
def test_a_bad_prefix_or_image_is_refused_in_one_line(overrides: dict[str, Any], allowed: str) -> None:
    with pytest.raises(SettingsError) as raised:
        settings_from({**PROJECT_CONTEXT, **overrides})
    assert raised.value.key == "image_pull_through_cache_prefix"
    assert allowed in str(raised.value) and "\n" not in str(raised.value)


def test_none_on_the_defaults(template: dict[str, Any]) -> None:
    assert not [r for r in template["Resources"].values() if r["Type"].startswith("AWS::ECR::")]


def test_cfn_lint_and_cdk_nag_are_clean_with_the_cache() -> None:
    # synth() runs cdk-nag's AwsSolutions checks; an unacknowledged finding stops it.
    assert lint_errors(synth(**CACHE, **WARM)) == []
