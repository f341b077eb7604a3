"""A CloudWatch metric alarm as its user guide describes it, run minute by minute on given metric data.

What it models, from the CloudWatch user guide:
- Metric math (using-metric-math): `+` between metrics treats a missing value as 0 where another term has one, and
  gives no data point where none has; `FILL(m, value)` puts the value in every period of the query, the latest
  ones included.
- Evaluation (AlarmThatSendsEmail, "How alarm state is evaluated when data is missing"): the alarm reads an
  evaluation range of N + 2 periods; with at least N data points it judges the latest N; with fewer it fills the
  missing ones by TreatMissingData (`missing`: no data at all is INSUFFICIENT_DATA, and with only breaching points
  it waits for the range's oldest one to breach too).
- Actions run on a change of state; a new alarm starts in INSUFFICIENT_DATA.

Enough for alarms on `+` of metrics with or without FILL of a constant; anything else is refused.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Series = Sequence[float | None]
EXTRA_PERIODS = 2  # the guide's example: 3 evaluation periods read 5 data points
COMPARE: dict[str, Callable[[float, float], bool]] = {
    "LessThanThreshold": operator.lt,
    "LessThanOrEqualToThreshold": operator.le,
    "GreaterThanThreshold": operator.gt,
    "GreaterThanOrEqualToThreshold": operator.ge,
}
_TERM = re.compile(r"^(?:FILL\((?P<filled>m\w*)\s*,\s*(?P<value>-?[\d.]+)\)|(?P<plain>m\w*))$")


def evaluate_expression(expression: str, data: Mapping[str, Series]) -> list[float | None]:
    """The expression's value in each period of the query, given each metric id's data."""
    length = len(next(iter(data.values())))
    terms: list[list[float | None]] = []
    for text in expression.split("+"):
        match = _TERM.match(text.strip())
        assert match, f"this model reads `+` of metrics and FILL(metric, constant) only: {text!r}"
        if match["filled"]:
            fill = float(match["value"])
            terms.append([fill if v is None else v for v in data[match["filled"]]])
        else:
            terms.append(list(data[match["plain"]]))
    values: list[float | None] = []
    for i in range(length):
        present = [t[i] for t in terms if t[i] is not None]
        values.append(sum(v for v in present if v is not None) if present else None)
    return values


def judge(
    points: Sequence[float | None], *, periods: int, to_alarm: int, missing: str, breaches: Callable[[float], bool]
) -> str | None:
    """The state the guide gives for an evaluation range of data points (oldest first); None: keep the state."""
    assert len(points) == periods + EXTRA_PERIODS
    existing = [p for p in points if p is not None]
    if len(existing) >= periods:
        latest = existing[-periods:]
        return "ALARM" if sum(breaches(p) for p in latest) >= to_alarm else "OK"
    if missing == "ignore" and not existing:
        return None
    if missing in ("breaching", "notBreaching"):
        filled = [(missing == "breaching") if p is None else breaches(p) for p in points[-periods:]]
        # Real data points anywhere in the range count; the missing ones stand in as few times as possible.
        real = [breaches(p) for p in existing]
        ordered = real + [f for p, f in zip(points[-periods:], filled, strict=True) if p is None]
        return "ALARM" if sum(ordered[:periods]) >= to_alarm else "OK"
    # `missing` (and `ignore` with some data): judge the real points alone.
    if not existing:
        return "INSUFFICIENT_DATA"
    bad = sum(breaches(p) for p in existing)
    if bad < len(existing):
        return "ALARM" if bad >= to_alarm else "OK"
    return (
        "ALARM"
        if points[0] is not None and bad >= min(to_alarm, len(existing))
        else ("INSUFFICIENT_DATA" if missing == "missing" else None)
    )


@dataclass
class Run:
    states: list[str] = field(default_factory=list)
    actions: list[tuple[int, str, list[Any]]] = field(default_factory=list)  # (minute, new state, actions run)


def run_alarm(alarm: Mapping[str, Any], data_by_dimension: Mapping[str, Series]) -> Run:
    """Evaluate a synthesized AWS::CloudWatch::Alarm's Properties each minute over one-minute data, given by the
    value of each metric's first dimension; the alarm exists from minute 0 (older data: before the alarm)."""
    props = alarm
    periods = int(props["EvaluationPeriods"])
    to_alarm = int(props.get("DatapointsToAlarm", periods))
    missing = props.get("TreatMissingData", "missing")
    threshold = float(props["Threshold"])
    compare = COMPARE[props["ComparisonOperator"]]
    (expression,) = [m["Expression"] for m in props["Metrics"] if "Expression" in m]
    by_id = {
        m["Id"]: data_by_dimension[m["MetricStat"]["Metric"]["Dimensions"][0]["Value"]]
        for m in props["Metrics"]
        if "MetricStat" in m
    }
    for m in props["Metrics"]:
        if "MetricStat" in m:
            assert m["MetricStat"]["Period"] == 60, "one-minute data only"
    length = len(next(iter(by_id.values())))
    run = Run()
    state = "INSUFFICIENT_DATA"
    span = periods + EXTRA_PERIODS
    for minute in range(length):
        window = {k: list(v[max(0, minute - span + 1) : minute + 1]) for k, v in by_id.items()}
        gap: list[float | None] = [None] * (span - len(next(iter(window.values()))))
        padded = {k: gap + v for k, v in window.items()}
        # FILL fills the whole query, so it is applied to the padded range as CloudWatch queries it.
        points = evaluate_expression(expression, padded)
        new = judge(
            points, periods=periods, to_alarm=to_alarm, missing=missing, breaches=lambda v: compare(v, threshold)
        )
        if new is not None and new != state:
            key = {"ALARM": "AlarmActions", "OK": "OKActions", "INSUFFICIENT_DATA": "InsufficientDataActions"}[new]
            run.actions.append((minute, new, list(props.get(key, []))))
            state = new
        run.states.append(state)
    return run


def pages(run: Run) -> list[tuple[int, str]]:
    """The changes of state that ran an action: (minute, state)."""
    return [(minute, state) for minute, state, actions in run.actions if actions]
