"""The GCS store's no-primary alarm, run as CloudWatch evaluates it (tests/support/cloudwatch_alarm.py) on the
synthesized template: who it pages on a first deploy, a failover, a store without a primary and a silent store."""

from __future__ import annotations

from typing import Any

import pytest

from cdk_constructs.gcs_store import replication_group_id
from tests.conftest import resources
from tests.support.cloudwatch_alarm import judge, pages, run_alarm
from tests.support.template_graph import depends_on

FIRST, SECOND = (f"{replication_group_id('pd-inference')}-{n:03d}" for n in (1, 2))
# What CloudWatch holds for the store's nodes, one value a minute: None where a node published nothing.
Timeline = dict[str, list[float | None]]


def _alarm(template: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    ((logical_id, alarm),) = [
        (k, a) for k, a in resources(template, "AWS::CloudWatch::Alarm").items() if k.startswith("GcsStore")
    ]
    return logical_id, alarm["Properties"]


def _timeline(*spans: tuple[int, float | None, float | None]) -> Timeline:
    """Minutes of (how many, the first node's IsMaster, the second's)."""
    first: list[float | None] = []
    second: list[float | None] = []
    for minutes, a, b in spans:
        first += [a] * minutes
        second += [b] * minutes
    return {FIRST: first, SECOND: second}


HEALTHY = (30, 1.0, 0.0)


def test_the_model_gives_the_user_guides_own_examples() -> None:
    """The CloudWatch user guide's tables (3 of 3, then 2 of 3; '0' within, 'X' breaching, '-' missing)."""
    rows = [
        (3, "0-X-X", {"missing": "OK", "breaching": "OK", "notBreaching": "OK"}),
        (3, "0----", {"missing": "OK", "breaching": "OK", "notBreaching": "OK"}),
        (3, "-----", {"missing": "INSUFFICIENT_DATA", "breaching": "ALARM", "notBreaching": "OK"}),
        (3, "0XX-X", {"missing": "ALARM", "breaching": "ALARM", "notBreaching": "ALARM"}),
        (3, "----X", {"missing": "INSUFFICIENT_DATA", "breaching": "ALARM", "notBreaching": "OK"}),
        (3, "X----", {"missing": "ALARM", "breaching": "ALARM", "notBreaching": "OK"}),
        (2, "0-X-X", {"missing": "ALARM", "breaching": "ALARM", "notBreaching": "ALARM"}),
        (2, "00X0X", {"missing": "ALARM", "breaching": "ALARM", "notBreaching": "ALARM"}),
        (2, "0-X--", {"missing": "OK", "breaching": "ALARM", "notBreaching": "OK"}),
        (2, "----0", {"missing": "OK", "breaching": "ALARM", "notBreaching": "OK"}),
        (2, "----X", {"missing": "INSUFFICIENT_DATA", "breaching": "ALARM", "notBreaching": "OK"}),
    ]
    for to_alarm, text, expected in rows:
        points = [None if c == "-" else (1.0 if c == "X" else 0.0) for c in text]
        for missing, state in expected.items():
            got = judge(points, periods=3, to_alarm=to_alarm, missing=missing, breaches=lambda v: v > 0.5)
            assert got == state, (to_alarm, text, missing)


def test_the_alarm_is_made_after_the_store_and_deleted_before_it(template: dict[str, Any]) -> None:
    (store,) = resources(template, "AWS::ElastiCache::ReplicationGroup")
    logical_id, _ = _alarm(template)
    assert depends_on(template, logical_id, store)


def test_the_first_deploy_pages_no_one(template: dict[str, Any]) -> None:
    """The store created in the same deploy (or in the update that first adds it): nothing reported for the
    alarm's first minutes, then a primary and its replica."""
    _, alarm = _alarm(template)
    for silent in (0, 3, 15):
        run = run_alarm(alarm, _timeline((silent, None, None), HEALTHY))
        assert pages(run) == [], (silent, run.actions)
        assert run.states[-1] == "OK"
    # The first node reports a minute before its replica does.
    assert pages(run_alarm(alarm, _timeline((5, None, None), (1, 1.0, None), HEALTHY))) == []


def test_a_failover_pages_no_one(template: dict[str, Any]) -> None:
    """The primary fails; its replica is promoted within two minutes, during which neither is a primary."""
    _, alarm = _alarm(template)
    for gap in (1, 2):
        run = run_alarm(alarm, _timeline(HEALTHY, (gap, 0.0, 0.0), (30, 0.0, 1.0)))
        assert pages(run) == [], (gap, run.actions)
    # The failed node is replaced and reports nothing for a while; the promoted one carries on.
    assert pages(run_alarm(alarm, _timeline(HEALTHY, (1, None, 0.0), (10, None, 1.0), (20, 0.0, 1.0)))) == []


def test_no_primary_for_longer_than_a_failover_pages_the_topic(template: dict[str, Any]) -> None:
    _, alarm = _alarm(template)
    topic = [ref for ref in alarm["AlarmActions"]]
    assert topic
    run = run_alarm(alarm, _timeline(HEALTHY, (10, 0.0, 0.0)))
    assert [(state, actions) for _, state, actions in run.actions if actions] == [("ALARM", topic)]
    # One node gone silent, the other no primary: the sum still reads 0.
    run = run_alarm(alarm, _timeline(HEALTHY, (10, None, 0.0)))
    assert [state for _, state in pages(run)] == ["ALARM"]


def test_a_store_that_falls_silent_pages_the_topic(template: dict[str, Any]) -> None:
    """Both nodes stop reporting (the store deleted or unreachable for CloudWatch): paged within minutes."""
    _, alarm = _alarm(template)
    run = run_alarm(alarm, _timeline(HEALTHY, (15, None, None)))
    assert pages(run), run.actions
    minute, _state = pages(run)[0]
    assert minute - HEALTHY[0] <= 6
    assert alarm["InsufficientDataActions"] == alarm["AlarmActions"]


@pytest.mark.parametrize("silent", [3, 15])
def test_the_old_design_fails_these_tests(template: dict[str, Any], silent: int) -> None:
    """The model tells the designs apart: FILL(m, 0) with missing data as breaching paged on a first deploy."""
    _, alarm = _alarm(template)
    old = {
        **alarm,
        "TreatMissingData": "breaching",
        "Metrics": [
            {**m, "Expression": "FILL(m0, 0) + FILL(m1, 0)"} if "Expression" in m else m for m in alarm["Metrics"]
        ],
    }
    assert pages(run_alarm(old, _timeline((silent, None, None), HEALTHY)))
