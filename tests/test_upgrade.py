"""tools/upgrade.py: the minimums `make upgrade` waits for are the ones the product's surge deploys, and a
stack with no room is refused before any deploy. Serve's own answers to the waits are read in the
rehearsal's surge phase (rehearsal/surge.py), on a running app."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from serve_config.deployments import engine_deployment_name, ingress_deployment_name, serve_deployments
from settings import Settings
from tools import upgrade

RANGES = Settings(
    prefill_max_replicas=2, prefill_target_ongoing_requests=2.0, decode_max_replicas=3,
    decode_target_ongoing_requests=8.0, decode_replicas=2,
)  # fmt: skip


def test_the_minimums_waited_for_are_the_ones_the_surge_deploys() -> None:
    surged = dataclasses.replace(RANGES, replica_surge=True)
    deployed = {
        d["name"]: d["autoscaling_config"]["min_replicas"]
        for d in serve_deployments(surged)
        if d.get("autoscaling_config")
    }
    assert (
        upgrade.surged_minimums(RANGES)
        == deployed
        == {
            engine_deployment_name(RANGES, "prefill"): 2,
            engine_deployment_name(RANGES, "decode"): 3,
        }
    )
    # The minimums come back down without the surge, so the second deploy lowers them.
    assert all(d["autoscaling_config"]["min_replicas"] < deployed[d["name"]] for d in serve_deployments(RANGES)
               if d.get("autoscaling_config"))  # fmt: skip


def test_a_stack_with_no_room_is_refused_before_any_deploy(capsys: pytest.CaptureFixture[str]) -> None:
    assert upgrade.surged_minimums(Settings()) == {}
    assert upgrade.main(["--cdk", "/nonexistent/cdk"]) == 2
    (line,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert line.startswith("error: replica_surge: no engine deployment has a range")


def test_rolled_over_needs_every_earlier_replica_gone_and_one_running() -> None:
    before = {"Prefill:m": {"a": "RUNNING"}, "ApiKeyIngress": {"i": "RUNNING"}}
    assert not upgrade.rolled_over(
        before, {"Prefill:m": {"a": "RUNNING", "b": "STARTING"}, "ApiKeyIngress": {"j": "RUNNING"}}
    )
    assert not upgrade.rolled_over(before, {"Prefill:m": {"b": "STARTING"}, "ApiKeyIngress": {"j": "RUNNING"}})
    assert upgrade.rolled_over(
        before, {"Prefill:m": {"b": "RUNNING", "c": "STARTING"}, "ApiKeyIngress": {"j": "RUNNING"}}
    )


def _answers(*states: dict[str, dict[str, str]]) -> Any:
    """Serve's /api/serve/applications/ answers, one per call, the last repeated: the app DEPLOYING throughout."""
    seen = list(states)

    def live() -> dict[str, Any]:
        replicas = seen.pop(0) if len(seen) > 1 else seen[0]
        deployments = {
            name: {"status": "UPDATING", "replicas": [{"replica_id": r, "state": s} for r, s in reps.items()]}
            for name, reps in replicas.items()
        }
        return {"applications": {"llm": {"status": "DEPLOYING", "deployments": deployments}}}

    return live


def test_an_ingress_without_room_for_its_surge_replica_is_a_warning_not_a_failed_upgrade(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The engines rolled over; the ingress's surge replica never starts (no pod for it), so its old replica keeps
    serving: the upgrade goes on to the deploy without the surge, saying so, rather than leaving the surge on."""
    monkeypatch.setattr(upgrade, "POLL_S", 0.01)
    monkeypatch.setattr(upgrade, "INGRESS_SURGE_WAIT_S", 0.2)
    ingress, prefill = ingress_deployment_name(RANGES), engine_deployment_name(RANGES, "prefill")
    before = {prefill: {"a": "RUNNING"}, ingress: {"i": "RUNNING"}}
    stuck = {prefill: {"b": "RUNNING"}, ingress: {"i": "RUNNING", "j": "PENDING_ALLOCATION"}}
    upgrade.wait_for_rollover(_answers(stuck), before, RANGES, budget=5)
    (line,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert "the ingress rolled over or healthy: not within" in line
    # With room the ingress rolls over after the engines and nothing is said.
    rolled = {prefill: {"b": "RUNNING"}, ingress: {"j": "RUNNING"}}
    upgrade.wait_for_rollover(_answers(stuck, rolled), before, RANGES, budget=5)
    assert "warning" not in capsys.readouterr().err
    # Engines that never roll over are still an error: the budget is the engines'.
    with pytest.raises(TimeoutError, match="every engine deployment"):
        upgrade.wait_for_rollover(_answers(before), before, RANGES, budget=0.1)
