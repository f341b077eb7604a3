"""The image cache: its pull-through cache prefix and its repository free in the account's registry.

Both are registry-wide names that CloudFormation would refuse only deep into a deploy."""

from __future__ import annotations

from botocore.exceptions import ClientError

from cdk_constructs.image_cache import repository_name
from settings.catalog import ECR_PUBLIC_REGISTRY
from tools.preflight.account import deployed_template
from tools.preflight.base import Account, Result, error_code

CHECK = "image cache"


def _ours(account: Account, prefix: str) -> bool:
    """Whether the deployed stack already holds the rule with this prefix (a redeploy keeps it)."""
    if not account.deployed:
        return False
    return any(
        resource.get("Type") == "AWS::ECR::PullThroughCacheRule"
        and resource.get("Properties", {}).get("EcrRepositoryPrefix") == prefix
        for resource in deployed_template(account).get("Resources", {}).values()
    )


def image_cache(account: Account) -> list[Result]:
    settings = account.settings
    prefix = settings.image_pull_through_cache_prefix
    if prefix is None:
        return []
    ecr = account.client("ecr")
    fix = "-c image_pull_through_cache_prefix=<a prefix no rule in this registry uses>"
    name = repository_name(settings.ray_image, prefix=prefix, registry=ECR_PUBLIC_REGISTRY)
    if _ours(account, prefix):
        return [Result("PASS", CHECK, f"the deployed stack's rule {prefix} and repository {name}")]
    try:
        rules = ecr.describe_pull_through_cache_rules(ecrRepositoryPrefixes=[prefix])["pullThroughCacheRules"]
    except ClientError as err:
        if error_code(err) != "PullThroughCacheRuleNotFoundException":
            raise
        rules = []
    if rules:
        upstream = rules[0].get("upstreamRegistryUrl", "another registry")
        taken = f"a pull-through cache rule with prefix {prefix} already exists in {account.region} (for {upstream})"
        return [Result("FAIL", CHECK, taken, fix)]
    try:
        ecr.describe_repositories(repositoryNames=[name])
    except ClientError as err:
        if error_code(err) != "RepositoryNotFoundException":
            raise
        return [Result("PASS", CHECK, f"prefix {prefix} is free; the stack makes {name}")]
    return [Result("FAIL", CHECK, f"the repository {name} already exists in {account.region}", fix)]
