"""A regional copy of the serving image: an ECR pull-through cache of public ECR, in the stack's account."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aws_cdk import Fn, RemovalPolicy
from aws_cdk import aws_ecr as ecr
from aws_cdk import aws_iam as iam
from constructs import Construct


def repository_name(image: str, *, prefix: str, registry: str) -> str:
    """The cached repository of a public ECR image: the prefix, then the image's path without its tag or digest."""
    path = image.removeprefix(registry + "/").split("@")[0]
    name, _, _ = path.rpartition(":") if ":" in path else (path, "", "")
    return f"{prefix}/{name}"


def with_string(obj: Any, text: str, value: str) -> Any:
    """obj with every string equal to text replaced by value (a token): the serving image, the GCS store's
    address. Nothing else is touched, since other strings may hold shell's ${...}, which Fn::Sub would take
    for references."""
    if isinstance(obj, dict):
        return {key: with_string(item, text, value) for key, item in obj.items()}
    if isinstance(obj, list):
        return [with_string(item, text, value) for item in obj]
    return value if obj == text else obj


class PullThroughImageCache(Construct):
    """A pull-through cache rule for public ECR, the one repository the serving image lands in, and the nodes'
    right to fill it.

    ECR creates a cached repository on the first pull unless it exists; the stack makes it, so that
    `cdk destroy` removes it with its images (EmptyOnDelete) and the nodes need no ecr:CreateRepository
    (Amazon ECR user guide, "IAM permissions required to sync an upstream registry"). Pulling it is the
    node role's AmazonEC2ContainerRegistryPullOnly; importing from upstream on a miss is
    ecr:BatchImportUpstreamImage, granted here on that repository only.

    Args:
        prefix: the rule's repository prefix, free in the account's registry; no default.
        image: the public ECR image the nodes run (registry/repository:tag or @digest); no default.
        registry: the upstream registry; default public.ecr.aws.
        node_roles: the roles of the nodes that pull it; no default.
        image_text: the cached image as serve_config.serving_image writes it; no default.

    Attributes:
        rule, repository; image_text: the cached image with ${AWS::...} pseudo parameters, as
        serve_config.serving_image writes it; image: the same through Fn::Sub, for the manifests.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        prefix: str,
        image: str,
        node_roles: Sequence[iam.IRole],
        image_text: str,
        registry: str = "public.ecr.aws",
    ) -> None:
        super().__init__(scope, construct_id)
        self.rule = ecr.CfnPullThroughCacheRule(
            self, "Rule", ecr_repository_prefix=prefix, upstream_registry="ecr-public", upstream_registry_url=registry
        )
        self.repository = ecr.Repository(
            self,
            "Repository",
            repository_name=repository_name(image, prefix=prefix, registry=registry),
            image_scan_on_push=False,
            empty_on_delete=True,
            removal_policy=RemovalPolicy.DESTROY,
        )
        # Made after the rule and removed before it.
        self.repository.node.add_dependency(self.rule)
        self.import_policy = iam.Policy(
            self,
            "NodesImportUpstream",
            roles=list(node_roles),
            statements=[
                iam.PolicyStatement(
                    actions=["ecr:BatchImportUpstreamImage"], resources=[self.repository.repository_arn]
                )
            ],
        )
        self.image_text = image_text
        self.image = Fn.sub(image_text)


def from_cache(obj: Any, cache: PullThroughImageCache | None) -> Any:
    """A manifest with the serving image taken from the cache, or as it is where there is none."""
    return obj if cache is None else with_string(obj, cache.image_text, cache.image)
