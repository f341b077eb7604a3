"""What change-impact says of a system-node replacement: the Ray head moves with its node, and whether the
whole cluster restarts depends on GCS fault tolerance, which the tool reads from the proposed RayService."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import synth
from tools import change_impact

HEAD_KEPT = "the Ray head restarts under GCS fault tolerance, every replica kept and the endpoint answering"
CLUSTER_LOST = "without GCS fault tolerance the whole Ray cluster restarts"
SYSTEM_NODES = {"system_volume_gib": 200}


def _impact(tmp_path: Path, before: dict[str, Any], after: dict[str, Any], *context: str) -> str:
    """The markdown the CLI writes for two templates, as the PR comment quotes it."""
    old, new, out = tmp_path / "deployed.json", tmp_path / "proposed.json", tmp_path / "impact.md"
    old.write_text(json.dumps(before))
    new.write_text(json.dumps(after))
    args = [str(old), str(new), "--markdown", str(out)]
    for item in context:
        args += ["-c", item]
    assert change_impact.main(args) == 0
    return out.read_text()


@pytest.mark.parametrize(
    ("gcs", "said", "not_said"),
    [({}, HEAD_KEPT, CLUSTER_LOST), ({"gcs_fault_tolerance": "false"}, CLUSTER_LOST, HEAD_KEPT)],
    ids=["defaults-store-on", "store-off"],
)
def test_a_system_node_replacement_says_what_the_head_loss_costs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], gcs: dict[str, str], said: str, not_said: str
) -> None:
    """The defaults run a GCS store (gcsFaultToleranceOptions under the RayService's rayClusterConfig): a new
    system node keeps every replica. Without it the same change restarts the whole Ray cluster."""
    text = _impact(
        tmp_path, synth(**gcs), synth(**gcs, **SYSTEM_NODES), *(f"{key}={value}" for key, value in gcs.items())
    )
    capsys.readouterr()
    assert text.startswith("**Interruption: nodes replaced.**"), text
    assert said in text and not_said not in text, text
