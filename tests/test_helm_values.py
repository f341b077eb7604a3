"""Every Helm value the stack sets is one the pinned chart reads (its own values.yaml, from the archive)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from settings.catalog import ALL_CHARTS, KUBERAY_OPERATOR, HelmChartPin
from tests.conftest import resources, synth
from tests.support.autoscaling import AUTOSCALING
from tests.support.helm import chart_archive, release_values
from tools.dev.fetch_schemas import chart_member

PINS = {pin.chart: pin for pin in ALL_CHARTS}
# Every optional chart: the operator for secrets, the load balancer controller, Cluster Autoscaler (a GPU range).
EVERYTHING = {"hf_token_secret_name": "prod/hf-token", "internal_endpoint_cidrs": "10.0.0.0/8", **AUTOSCALING}


def unknown_keys(ours: Any, defaults: Any, path: str = "") -> list[str]:
    """Keys we set that the chart's default values do not have (below open maps, anything goes)."""
    if not isinstance(ours, dict) or not isinstance(defaults, dict) or not defaults:
        return []
    found = []
    for key, value in ours.items():
        where = f"{path}.{key}" if path else key
        if key not in defaults:
            found.append(where)
        else:
            found.extend(unknown_keys(value, defaults[key], where))
    return found


def _defaults(pin: HelmChartPin) -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load(chart_member(chart_archive(pin), f"{pin.chart}/values.yaml"))
    return values


@pytest.mark.parametrize("chart", sorted(PINS))
def test_values_we_set_exist_in_chart_defaults(chart: str) -> None:
    (release,) = [
        r["Properties"]
        for r in resources(synth(**EVERYTHING), "Custom::AWSCDK-EKS-HelmChart").values()
        if r["Properties"]["Chart"] == chart
    ]
    ours = release_values(release)
    assert ours
    assert unknown_keys(ours, _defaults(PINS[chart])) == [], json.dumps(ours)


def test_a_misspelled_value_is_caught() -> None:
    defaults = _defaults(KUBERAY_OPERATOR)
    assert unknown_keys({"nodeSelectors": {"role": "system"}}, defaults) == ["nodeSelectors"]
    assert unknown_keys({"image": {"tagg": "x"}}, defaults) == ["image.tagg"]
