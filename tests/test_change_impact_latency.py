"""What changing a side's latency target interrupts (tools/change_impact.py), on the synthesized templates: a new
target or percentile goes to the running replicas (their user_config, reconfigure), turning a target on or off
changes the app's code version in Serve's own hash (deploy_utils.py, get_app_code_version hashes each deployment's
autoscaling policy) and so restarts every replica of the app."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import rayservice_from, require_serve_deps, synth
from tools import change_impact, serve_controller, template_diff
from tools.change_impact import Impact

serve = pytest.mark.serve
one_ray = pytest.mark.xdist_group("ray")

PREFILL_RANGE: dict[str, Any] = {"prefill_max_replicas": 2}
DECODE_RANGE: dict[str, Any] = {"decode_max_replicas": 2}
PREFILL_TTFT = {**PREFILL_RANGE, "prefill_ttft_target_ms": 2000}
DECODE_ITL = {**DECODE_RANGE, "decode_itl_target_ms": 200}
PREFILL_ONGOING = {**PREFILL_RANGE, "prefill_target_ongoing_requests": 2.0}
DECODE_ONGOING = {**DECODE_RANGE, "decode_target_ongoing_requests": 8.0}

# (deployed settings, proposed settings, the class, words of the finding of that class)
IN_PLACE = "new options, applied without a restart"
CHANGES: dict[str, tuple[dict[str, Any], dict[str, Any], Impact, str]] = {
    "prefill target value": (
        PREFILL_TTFT,
        {**PREFILL_TTFT, "prefill_ttft_target_ms": 3000},
        Impact.IN_PLACE,
        f"`Prefill:Qwen--Qwen3-8B`: {IN_PLACE}",
    ),
    "prefill percentile": (
        PREFILL_TTFT,
        {**PREFILL_TTFT, "prefill_ttft_target_percentile": 99},
        Impact.IN_PLACE,
        f"`Prefill:Qwen--Qwen3-8B`: {IN_PLACE}",
    ),
    "decode target value": (
        DECODE_ITL,
        {**DECODE_ITL, "decode_itl_target_ms": 150},
        Impact.IN_PLACE,
        f"`Decode:Qwen--Qwen3-8B`: {IN_PLACE}",
    ),
    "decode percentile": (
        DECODE_ITL,
        {**DECODE_ITL, "decode_itl_target_percentile": 50},
        Impact.IN_PLACE,
        f"`Decode:Qwen--Qwen3-8B`: {IN_PLACE}",
    ),
    "prefill target on": (PREFILL_ONGOING, PREFILL_TTFT, Impact.REPLICAS_RESTARTED, "code version"),
    "prefill target off": (PREFILL_TTFT, PREFILL_ONGOING, Impact.REPLICAS_RESTARTED, "code version"),
    "decode target on": (DECODE_ONGOING, DECODE_ITL, Impact.REPLICAS_RESTARTED, "code version"),
    "decode target off": (DECODE_ITL, DECODE_ONGOING, Impact.REPLICAS_RESTARTED, "code version"),
}


def _app(template: dict[str, Any]) -> dict[str, Any]:
    """The one Serve application of the template's serveConfigV2, as Serve's controller receives it."""
    (app,) = yaml.safe_load(rayservice_from(template)["spec"]["serveConfigV2"])["applications"]
    found: dict[str, Any] = app
    return found


@pytest.mark.parametrize("name", list(CHANGES))
def test_serves_code_version_changes_only_when_a_target_turns_on_or_off(name: str) -> None:
    """Serve's own get_app_code_version on the two serve configs: a new target or percentile leaves it as it was."""
    require_serve_deps()
    before, after, impact, _ = CHANGES[name]
    old, new = (serve_controller.code_version(_app(synth(**s))) for s in (before, after))
    assert (old == new) is (impact is Impact.IN_PLACE), (old, new)


@pytest.mark.parametrize("side", ["prefill", "decode"])
def test_a_new_target_changes_the_sides_user_config_and_nothing_else(side: str) -> None:
    """What the in-place claim rests on: between two targets the serve config differs in one user_config alone,
    and the Ray cluster's config (its hash label, the worker groups) not at all."""
    before, after, _, _ = CHANGES[f"{side} target value"]
    old, new = synth(**before), synth(**after)
    old_app, new_app = _app(old), _app(new)
    changed = [
        (a["name"], key)
        for a, b in zip(old_app["deployments"], new_app["deployments"], strict=True)
        for key in sorted(set(a) | set(b))
        if a.get(key) != b.get(key)
    ]
    assert [key for _, key in changed] == ["user_config"], changed
    assert {k: v for k, v in old_app.items() if k != "deployments"} == {
        k: v for k, v in new_app.items() if k != "deployments"
    }
    old_cluster, new_cluster = (rayservice_from(t)["spec"]["rayClusterConfig"] for t in (old, new))
    assert json.dumps(old_cluster, sort_keys=True) == json.dumps(new_cluster, sort_keys=True)


@serve
@one_ray
@pytest.mark.parametrize("name", list(CHANGES))
def test_a_target_change_is_classified(tmp_path: Path, name: str, local_ray: None) -> None:
    """change_impact on the two synthesized templates, as the PR comment runs it."""
    before, after, expected, words = CHANGES[name]
    old_template, new_template = synth(**before), synth(**after)
    old, new = tmp_path / "deployed.json", tmp_path / "proposed.json"
    old.write_text(json.dumps(old_template))
    new.write_text(json.dumps(new_template))
    found = change_impact.classify(old_template, new_template, template_diff.destructive_changes(old, new))
    assert found.impact is expected, found.findings
    assert words in " ".join(f.what for f in found.findings if f.impact is expected), found.findings
    if expected is Impact.REPLICAS_RESTARTED:
        assert "Serve's code version changed" in " ".join(f.what for f in found.findings), found.findings
