"""Whether every service that must publish to the alarm topic may, by the synthesized policies.

An `AWS::SNS::TopicPolicy` replaces SNS's default topic policy, so each publisher needs an Allow of
its own (AWS Knowledge Center "cloudwatch-receive-sns-for-alarm-trigger": a CloudWatch alarm whose
service has none is refused with `...:alarm:<name> is not authorized to perform: SNS:Publish`).
The publishers: managed Prometheus's alert manager (the workspace's `sns_configs`) and CloudWatch
for every alarm whose AlarmActions name the topic. The request context is the one each service
sends: its service principal, over TLS, with aws:SourceAccount and aws:SourceArn naming the
workspace or the alarm, as the deployed stack would have them.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping
from typing import Any

import pytest

from tests.conftest import resources, synth
from tools.template_text import render

ACCOUNT = "111122223333"
OTHER_ACCOUNT = "444455556666"
REGION = "eu-west-1"
STACK = "PdInference"
ALARM_TYPES = ("AWS::CloudWatch::Alarm", "AWS::CloudWatch::CompositeAlarm")


def _names(template: dict[str, Any]) -> dict[str, str]:
    """Each resource's physical name as the deployed stack would have it: its own name property, or
    CloudFormation's generated one (<stack>-<logical id>-<suffix>)."""
    found = {}
    for logical_id, resource in template["Resources"].items():
        own = resource.get("Properties", {}).get("AlarmName")
        found[logical_id] = own if isinstance(own, str) else f"{STACK}-{logical_id}-ABCDEF012345"
    return found


def deployed_world(template: dict[str, Any], account: str = ACCOUNT) -> dict[str, str]:
    """What each ${...} placeholder of tools.template_text.render resolves to once deployed."""
    names = _names(template)
    world = {
        "AWS::AccountId": account,
        "AWS::Region": REGION,
        "AWS::Partition": "aws",
        "AWS::URLSuffix": "amazonaws.com",
    }
    for logical_id, resource in template["Resources"].items():
        kind, name = resource["Type"], names[logical_id]
        if kind == "AWS::SNS::Topic":
            world[logical_id] = f"arn:aws:sns:{REGION}:{account}:{name}"
        elif kind in ALARM_TYPES:
            world[logical_id] = name
            world[f"{logical_id}.Arn"] = f"arn:aws:cloudwatch:{REGION}:{account}:alarm:{name}"
        elif kind == "AWS::APS::Workspace":
            world[f"{logical_id}.Arn"] = f"arn:aws:aps:{REGION}:{account}:workspace/ws-{logical_id.lower()}"
    return world


def resolve(value: Any, world: Mapping[str, str]) -> str:
    """A template value as deployed; a reference the world lacks fails the test (KeyError), never matches."""
    return re.sub(r"\$\{([^}]+)\}", lambda m: world[m.group(1)], render(value))


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _principal_matches(principal: Any, service: str, world: Mapping[str, str]) -> bool:
    if principal == "*" or principal == {"AWS": "*"}:
        return True
    if not isinstance(principal, dict):
        return False
    return service in [resolve(p, world) for p in _listed(principal.get("Service", []))]


def _conditions_hold(conditions: Mapping[str, Any], context: Mapping[str, str], world: Mapping[str, str]) -> bool:
    """The operators these policies use; any other operator does not hold (so an unknown Allow never admits)."""
    for operator, clauses in conditions.items():
        for key, wanted in clauses.items():
            values = [resolve(w, world) for w in _listed(wanted)]
            present = context.get(key)
            if present is None:
                return False
            if operator in ("StringEquals", "ArnEquals"):
                ok = present in values
            elif operator == "ArnLike":
                ok = any(fnmatch.fnmatchcase(present, v) for v in values)
            elif operator == "Bool":
                ok = present.lower() in [v.lower() for v in values]
            else:
                ok = False
            if not ok:
                return False
    return True


def statement_applies(
    statement: Mapping[str, Any], service: str, action: str, resource: str, context: Mapping[str, str], world: Any
) -> bool:
    if not _principal_matches(statement.get("Principal"), service, world):
        return False
    actions = [a.lower() for a in _listed(statement["Action"])]
    if not any(fnmatch.fnmatchcase(action.lower(), a) for a in actions):
        return False
    if not any(fnmatch.fnmatchcase(resource, resolve(r, world)) for r in _listed(statement.get("Resource", "*"))):
        return False
    return _conditions_hold(statement.get("Condition", {}), context, world)


def policy_allows(
    statements: list[dict[str, Any]], service: str, action: str, resource: str, context: Mapping[str, str], world: Any
) -> bool:
    """IAM's rule for one policy: an applicable Deny wins, else an applicable Allow admits, else refused."""
    applicable = [s for s in statements if statement_applies(s, service, action, resource, context, world)]
    return not any(s["Effect"] == "Deny" for s in applicable) and any(s["Effect"] == "Allow" for s in applicable)


def publishers(template: dict[str, Any], topic_id: str, world: Mapping[str, str]) -> list[tuple[str, str, str]]:
    """(who, service, source ARN) for everything that sends to the topic."""
    found = []
    for logical_id, workspace in resources(template, "AWS::APS::Workspace").items():
        definition = workspace["Properties"]["AlertManagerDefinition"]
        if {"Ref": topic_id} in definition["Fn::Join"][1]:
            found.append((logical_id, "aps.amazonaws.com", world[f"{logical_id}.Arn"]))
    for type_ in ALARM_TYPES:
        for logical_id, alarm in resources(template, type_).items():
            if {"Ref": topic_id} in alarm["Properties"].get("AlarmActions", []):
                found.append((logical_id, "cloudwatch.amazonaws.com", world[f"{logical_id}.Arn"]))
    return found


def _context(source_arn: str, account: str = ACCOUNT) -> dict[str, str]:
    return {"aws:SourceAccount": account, "aws:SourceArn": source_arn, "aws:SecureTransport": "true"}


def _topic(template: dict[str, Any]) -> tuple[str, list[dict[str, Any]], list[dict[str, Any]]]:
    (topic_id,) = resources(template, "AWS::SNS::Topic")
    (policy,) = [
        p["Properties"]
        for p in resources(template, "AWS::SNS::TopicPolicy").values()
        if {"Ref": topic_id} in p["Properties"]["Topics"]
    ]
    key_id = template["Resources"][topic_id]["Properties"]["KmsMasterKeyId"]["Fn::GetAtt"][0]
    return (
        topic_id,
        policy["PolicyDocument"]["Statement"],
        template["Resources"][key_id]["Properties"]["KeyPolicy"]["Statement"],
    )


@pytest.mark.parametrize("overrides", [{}, {"alarm_email": "oncall@example.com"}], ids=["defaults", "email"])
def test_every_publisher_may_publish_to_the_topic_and_use_its_key(overrides: dict[str, str]) -> None:
    template = synth(**overrides)
    world = deployed_world(template)
    topic_id, topic_policy, key_policy = _topic(template)
    senders = publishers(template, topic_id, world)
    # The alert manager, both notifying alarms (the composite's two halves notify only through it) and the GCS
    # store's.
    assert sorted(s for _, s, _ in senders) == [
        "aps.amazonaws.com",
        "cloudwatch.amazonaws.com",
        "cloudwatch.amazonaws.com",
        "cloudwatch.amazonaws.com",
    ]
    refused = [
        f"{who} ({service}): {action}"
        for who, service, source in senders
        for policy, action, resource in (
            (topic_policy, "sns:Publish", world[topic_id]),
            (key_policy, "kms:GenerateDataKey", "*"),
            (key_policy, "kms:Decrypt", "*"),
        )
        if not policy_allows(policy, service, action, resource, _context(source), world)
    ]
    assert refused == []


def test_only_the_stacks_own_publishers_and_only_over_tls() -> None:
    template = synth()
    world = deployed_world(template)
    topic_id, topic_policy, _ = _topic(template)
    topic = world[topic_id]
    ours = dict((service, source) for _, service, source in publishers(template, topic_id, world))
    # Another account's alarm or workspace, under the same service principal: refused.
    for service, source in ours.items():
        theirs = source.replace(ACCOUNT, OTHER_ACCOUNT)
        assert not policy_allows(topic_policy, service, "sns:Publish", topic, _context(theirs, OTHER_ACCOUNT), world)
        plain = {**_context(source), "aws:SecureTransport": "false"}
        assert not policy_allows(topic_policy, service, "sns:Publish", topic, plain, world)
    # An alarm of this account that is not the stack's: refused too (the statement names the stack's alarms).
    stray = f"arn:aws:cloudwatch:{REGION}:{ACCOUNT}:alarm:someone-elses-alarm"
    assert not policy_allows(topic_policy, "cloudwatch.amazonaws.com", "sns:Publish", topic, _context(stray), world)
    # Nor any other service, nor CloudWatch managing the topic.
    assert not policy_allows(topic_policy, "s3.amazonaws.com", "sns:Publish", topic, _context(stray), world)
    assert not policy_allows(
        topic_policy,
        "cloudwatch.amazonaws.com",
        "sns:SetTopicAttributes",
        topic,
        _context(ours["cloudwatch.amazonaws.com"]),
        world,
    )


def test_the_evaluator_refuses_what_iam_refuses() -> None:
    """The evaluator itself: a Deny wins, an unknown operator never admits, a missing key never matches."""
    world = {"AWS::AccountId": ACCOUNT}
    allow = {"Effect": "Allow", "Principal": {"Service": "x.amazonaws.com"}, "Action": "sns:Publish", "Resource": "*"}
    context = _context("arn:aws:x:r:1:thing")
    assert policy_allows([allow], "x.amazonaws.com", "sns:Publish", "t", context, world)
    assert policy_allows([allow], "x.amazonaws.com", "SNS:PUBLISH", "t", context, world)
    assert not policy_allows([allow], "y.amazonaws.com", "sns:Publish", "t", context, world)
    deny = {**allow, "Effect": "Deny", "Principal": "*", "Condition": {"Bool": {"aws:SecureTransport": "false"}}}
    assert policy_allows([allow, deny], "x.amazonaws.com", "sns:Publish", "t", context, world)
    assert not policy_allows(
        [allow, deny], "x.amazonaws.com", "sns:Publish", "t", {**context, "aws:SecureTransport": "false"}, world
    )
    odd = {**allow, "Condition": {"StringNotEqualsIfExists": {"aws:SourceAccount": "1"}}}
    assert not policy_allows([odd], "x.amazonaws.com", "sns:Publish", "t", context, world)
    missing = {**allow, "Condition": {"StringEquals": {"aws:SourceOrgID": "o-1"}}}
    assert not policy_allows([missing], "x.amazonaws.com", "sns:Publish", "t", context, world)
    account = {**allow, "Condition": {"StringEquals": {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}}}
    assert policy_allows([account], "x.amazonaws.com", "sns:Publish", "t", context, world)
    assert not policy_allows([account], "x.amazonaws.com", "sns:Publish", "t", _context("a", OTHER_ACCOUNT), world)
