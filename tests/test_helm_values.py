"""Every Helm value the stack sets is one the pinned chart reads."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from settings.catalog import EFA_DEVICE_PLUGIN, KUBERAY_OPERATOR, NVIDIA_DEVICE_PLUGIN, HelmChartPin
from tests.conftest import resources, shared_file

PINS = {pin.chart: pin for pin in (KUBERAY_OPERATOR, NVIDIA_DEVICE_PLUGIN, EFA_DEVICE_PLUGIN)}


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
    path = shared_file(f"helm-values/{pin.chart}-{pin.version}.values.yaml")
    values: dict[str, Any] = yaml.safe_load(path.read_text())
    return values


@pytest.mark.parametrize("chart", sorted(PINS))
def test_values_we_set_exist_in_chart_defaults(template: dict[str, Any], chart: str) -> None:
    (release,) = [
        r["Properties"]
        for r in resources(template, "Custom::AWSCDK-EKS-HelmChart").values()
        if r["Properties"]["Chart"] == chart
    ]
    ours = json.loads(release["Values"])
    assert ours
    assert unknown_keys(ours, _defaults(PINS[chart])) == []


def test_a_misspelled_value_is_caught() -> None:
    defaults = _defaults(KUBERAY_OPERATOR)
    assert unknown_keys({"nodeSelectors": {"role": "system"}}, defaults) == ["nodeSelectors"]
    assert unknown_keys({"image": {"tagg": "x"}}, defaults) == ["image.tagg"]
