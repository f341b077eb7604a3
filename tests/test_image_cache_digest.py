"""A digest-pinned serving image (registry/repository@sha256:..., which the settings allow) through the pull-through
cache: the repository the stack makes is the one every pod pulls from, digest and all."""

from __future__ import annotations

import json
import re

from aws_cdk.assertions import Template

from cdk_constructs.image_cache import repository_name
from settings.catalog import ECR_PUBLIC_REGISTRY
from tests.conftest import manifests, synth

PREFIX = "pd-inference-public"
DIGEST = "sha256:" + "0123456789abcdef" * 4
PINNED = f"{ECR_PUBLIC_REGISTRY}/deep-learning-containers/ray@{DIGEST}"
CACHE = {"image_pull_through_cache_prefix": PREFIX, "ray_image": PINNED}
WARM = {"decode_max_replicas": 2, "decode_target_ongoing_requests": 4, "gpu_warm_nodes": 1}
# The cached image as the manifests carry it inside Fn::Sub: the account's registry, the repository, the pin.
CACHED = re.compile(
    r"^\$\{AWS::AccountId\}\.dkr\.ecr\.\$\{AWS::Region\}\.\$\{AWS::URLSuffix\}/(?P<repo>[^@:]+)@(?P<pin>.+)$"
)


def _images(obj: object) -> list[str]:
    if isinstance(obj, dict):
        here = [obj["image"]] if isinstance(obj.get("image"), str) else []
        return here + [i for value in obj.values() for i in _images(value)]
    if isinstance(obj, list):
        return [i for value in obj for i in _images(value)]
    return []


def test_a_digest_pinned_image_lands_in_its_own_repository() -> None:
    raw = synth(**CACHE, **WARM)
    template = Template.from_json(raw)
    template.has_resource_properties(
        "AWS::ECR::Repository", {"RepositoryName": f"{PREFIX}/deep-learning-containers/ray"}
    )
    # Every Ray pod, the placeholder and its download, the head-image DaemonSet: one image, the cached one.
    images = {image for image in _images(manifests(raw)) if "deep-learning-containers" in image}
    assert len(images) == 1, images
    found = CACHED.match(images.pop())
    assert found, images
    # kubelet pulls <registry>/<repository>@<digest>: the repository is the stack's, the digest the one pinned.
    assert (found["repo"], found["pin"]) == (f"{PREFIX}/deep-learning-containers/ray", DIGEST)
    assert DIGEST not in json.dumps(template.find_resources("AWS::ECR::Repository"))


def test_preflight_looks_for_the_same_repository_the_stack_makes() -> None:
    """preflight's image-cache check asks ECR whether this name is free (tools/preflight/registry.py)."""
    tagged = f"{ECR_PUBLIC_REGISTRY}/deep-learning-containers/ray:serve-llm-cuda-v1.0.0"
    expected = f"{PREFIX}/deep-learning-containers/ray"
    assert repository_name(PINNED, prefix=PREFIX, registry=ECR_PUBLIC_REGISTRY) == expected
    assert repository_name(tagged, prefix=PREFIX, registry=ECR_PUBLIC_REGISTRY) == expected
