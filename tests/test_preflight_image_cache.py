"""preflight on the image cache: its pull-through cache prefix and its repository are free in the account's
registry, or already the deployed stack's; each FAIL names the setting that fixes it.

The account is tests/test_preflight.py's, answered in AWS's own response shapes (botocore validates every
request and answer)."""

from __future__ import annotations

import json
from typing import Any

from settings import settings_from_cli
from tests.conftest import synth
from tests.support.aws_fakes import Answer, FakeAws, client_error
from tests.support.preflight_account import ACCOUNT, GOOD, account, check, deployed_stack, preflight
from tools.preflight.checks import run

PREFIX = "pd-inference-public"
CACHED = [*GOOD, f"image_pull_through_cache_prefix={PREFIX}"]
REPOSITORY = f"{PREFIX}/deep-learning-containers/ray"
NO_RULE = client_error("PullThroughCacheRuleNotFoundException", "no rule")
NO_REPOSITORY = client_error("RepositoryNotFoundException", "no repository")


def rule(prefix: str = PREFIX, upstream: str = "registry-1.docker.io") -> dict[str, Any]:
    return {"pullThroughCacheRules": [{"ecrRepositoryPrefix": prefix, "upstreamRegistryUrl": upstream}]}


def repository() -> dict[str, Any]:
    arn = f"arn:aws:ecr:us-east-1:{ACCOUNT}:repository/{REPOSITORY}"
    return {"repositories": [{"repositoryArn": arn, "repositoryName": REPOSITORY}]}


def cache_account(**changes: Answer) -> dict[tuple[str, str], Answer]:
    return account(
        **{"ecr:DescribePullThroughCacheRules": NO_RULE, "ecr:DescribeRepositories": NO_REPOSITORY, **changes}
    )


def test_a_free_prefix_passes_and_names_the_repository_the_stack_makes() -> None:
    line = check(preflight(cache_account(), *CACHED), "image cache")
    assert line.status == "PASS" and REPOSITORY in line.detail


def test_a_prefix_another_rule_holds_fails_naming_the_setting() -> None:
    line = check(preflight(cache_account(**{"ecr:DescribePullThroughCacheRules": rule()}), *CACHED), "image cache")
    assert line.status == "FAIL" and "registry-1.docker.io" in line.detail
    assert "image_pull_through_cache_prefix" in line.fix


def test_an_existing_repository_of_that_name_fails() -> None:
    line = check(preflight(cache_account(**{"ecr:DescribeRepositories": repository()}), *CACHED), "image cache")
    assert line.status == "FAIL" and f"{REPOSITORY} already exists" in line.detail


def test_a_redeploy_of_the_stack_that_holds_the_rule_passes_without_asking_ecr() -> None:
    body = json.dumps(synth(image_pull_through_cache_prefix=PREFIX, gpu_availability_zone="us-east-1b"))
    deployed: dict[str, Answer] = {
        "cloudformation:DescribeStacks": {"Stacks": [deployed_stack("us-east-1b")]},
        "cloudformation:GetTemplate": {"TemplateBody": body},
    }
    answers = account(**deployed)
    fake = FakeAws(answers)
    results = run(settings_from_cli(CACHED), fake)[1]
    assert check(results, "image cache").status == "PASS"
    assert not [c for c in fake.calls if c[0] == "ecr"]


def test_no_line_without_the_setting() -> None:
    assert not [r for r in preflight(account(), *GOOD) if r.check == "image cache"]
