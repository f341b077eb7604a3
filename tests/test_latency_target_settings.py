"""A side's latency target, the alternative to its ongoing-requests target: where it loads, and each refusal in one
line naming the setting (settings/rules/latency.py). Every case is a settings file, read as `make synth SETTINGS=...`
reads it; the default stack stays as it was without one."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from settings import Settings
from settings.sizing import decode_itl_floor_ms, prefill_ttft_floor_ms
from tests.conftest import rayservice_from, synth
from tests.test_settings_refusals import load, refused
from tools import plan

RANGED = {
    "prefill": "prefill_max_replicas: 2\n",
    "decode": "decode_max_replicas: 2\n",
}
TARGET = {"prefill": "prefill_ttft_target_ms", "decode": "decode_itl_target_ms"}
PERCENTILE = {"prefill": "prefill_ttft_target_percentile", "decode": "decode_itl_target_percentile"}
# Targets every default replica can give: well above both floors on the default GPU.
GOOD_MS = {"prefill": 2000, "decode": 200}
SIDES = ("prefill", "decode")


def _floor_ms(side: str) -> int:
    floor = prefill_ttft_floor_ms(Settings()) if side == "prefill" else decode_itl_floor_ms(Settings())
    return math.ceil(floor)


def _target(side: str, ms: int | None = None) -> str:
    return f"{TARGET[side]}: {GOOD_MS[side] if ms is None else ms}\n"


@pytest.mark.parametrize("side", SIDES)
def test_a_latency_target_on_a_ranged_side_loads_with_its_percentile(tmp_path: Path, side: str) -> None:
    loaded = load(tmp_path, RANGED[side] + _target(side) + f"{PERCENTILE[side]}: 95\n")
    assert loaded.side_latency_target(side) == (GOOD_MS[side], 95)
    assert loaded.side_target_ongoing_requests(side) is None
    other = "decode" if side == "prefill" else "prefill"
    assert loaded.side_latency_target(other) is None


@pytest.mark.parametrize("side", SIDES)
def test_both_kinds_of_target_on_one_side_are_refused(tmp_path: Path, side: str) -> None:
    err = refused(tmp_path, RANGED[side] + _target(side) + f"{side}_target_ongoing_requests: 2\n")
    assert err.key == TARGET[side]
    assert f"unset while {side}_target_ongoing_requests is set" in str(err), err


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("fixed", ["", "{side}_replicas: 2\n{side}_max_replicas: 2\n"])
def test_a_target_on_a_side_with_no_range_is_refused(tmp_path: Path, side: str, fixed: str) -> None:
    err = refused(tmp_path, fixed.format(side=side) + _target(side))
    assert err.key == TARGET[side]
    assert f"unset while {side}_max_replicas is unset or equal to {side}_replicas" in str(err), err


@pytest.mark.parametrize("side", SIDES)
def test_a_target_in_aggregated_mode_is_refused(tmp_path: Path, side: str) -> None:
    err = refused(tmp_path, "serving_mode: aggregated\n" + RANGED[side] + _target(side))
    assert err.key == TARGET[side]
    assert "unset with serving_mode aggregated" in str(err), err


@pytest.mark.parametrize("side", SIDES)
def test_a_target_below_one_replicas_floor_is_refused_and_the_floor_itself_loads(tmp_path: Path, side: str) -> None:
    floor = _floor_ms(side)
    err = refused(tmp_path, RANGED[side] + _target(side, floor - 1))
    assert err.key == TARGET[side]
    assert f"at least {floor} ms on {Settings().gpu_instance_type}" in str(err), err
    assert load(tmp_path, RANGED[side] + _target(side, floor)).side_latency_target(side) == (floor, 90)


def test_the_floor_follows_the_hardware_and_the_request(tmp_path: Path) -> None:
    """A longer typical request takes one prefill replica longer: the target that loaded is then refused."""
    floor = _floor_ms("prefill")
    text = RANGED["prefill"] + _target("prefill", floor)
    load(tmp_path, text)
    err = refused(tmp_path, text + "typical_request_tokens: 8192\n")
    assert err.key == "prefill_ttft_target_ms" and "a 8192-token prompt" in str(err), err
    err = refused(tmp_path, text + "gpu_instance_type: g5.8xlarge\n")
    assert err.key == "prefill_ttft_target_ms" and "on g5.8xlarge" in str(err), err


@pytest.mark.parametrize("side", SIDES)
def test_a_target_past_the_request_timeout_is_refused(tmp_path: Path, side: str) -> None:
    err = refused(tmp_path, "request_timeout_seconds: 60\n" + RANGED[side] + _target(side, 60_001))
    assert err.key == TARGET[side]
    assert "at most 60000 ms, request_timeout_seconds" in str(err), err
    load(tmp_path, "request_timeout_seconds: 60\n" + RANGED[side] + _target(side, 60_000))


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("percentile", [49, 100])
def test_a_percentile_outside_50_to_99_is_refused(tmp_path: Path, side: str, percentile: int) -> None:
    err = refused(tmp_path, RANGED[side] + _target(side) + f"{PERCENTILE[side]}: {percentile}\n")
    assert err.key == PERCENTILE[side]
    assert "50 to 99" in str(err), err


@pytest.mark.parametrize("side", SIDES)
def test_a_percentile_given_without_its_target_is_refused(tmp_path: Path, side: str) -> None:
    # Even the default value: the user wrote it expecting it to act.
    err = refused(tmp_path, RANGED[side] + f"{side}_target_ongoing_requests: 2\n{PERCENTILE[side]}: 90\n")
    assert err.key == PERCENTILE[side]
    assert f"set only with {TARGET[side]}" in str(err), err


@pytest.mark.parametrize("side", SIDES)
def test_a_range_with_no_target_at_all_is_still_refused_and_names_both_kinds(tmp_path: Path, side: str) -> None:
    err = refused(tmp_path, RANGED[side])
    assert err.key == f"{side}_target_ongoing_requests"
    assert f"or set {TARGET[side]} instead" in str(err), err


def _deployments(template: dict[str, Any]) -> list[dict[str, Any]]:
    """The serve config's `deployments` list: Serve's options per deployment, as the controller applies them."""
    (app,) = yaml.safe_load(rayservice_from(template)["spec"]["serveConfigV2"])["applications"]
    found: list[dict[str, Any]] = app["deployments"]
    return found


def test_the_default_stack_has_no_latency_policy_and_no_latency_keys() -> None:
    """Opt-in: with no target the serve config carries neither a custom policy nor a target (queue depth scales),
    and a side scaling on ongoing requests keeps Serve's own policy and its target."""
    for settings in ({}, {"prefill_max_replicas": 2, "prefill_target_ongoing_requests": 2}):
        deployments = _deployments(synth(**settings))
        assert {d["name"].split(":")[0] for d in deployments} >= {"Prefill", "Decode"}, deployments
        text = yaml.safe_dump(deployments)
        assert "policy" not in text and "latency" not in text, text
    (prefill,) = [d for d in deployments if d["name"].startswith("Prefill:")]
    assert prefill["autoscaling_config"]["target_ongoing_requests"] == 2


@pytest.mark.parametrize("side", SIDES)
def test_the_floor_refused_is_the_floor_make_plan_prints(
    tmp_path: Path, side: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The refusal sends the user to `make plan`: both give the same number, so a target at plan's floor loads."""
    floor = _floor_ms(side)
    err = refused(tmp_path, RANGED[side] + _target(side, floor - 1))
    assert f"at least {floor} ms" in str(err), err
    assert plan.main(["-c", f"{side}_max_replicas=2", "-c", f"{TARGET[side]}={floor}"]) == 0
    (row,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith(f"  {side}: p90")]
    assert f"floor {floor} ms" in row, row
