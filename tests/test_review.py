"""Pull-request review: readable payloads, byte-identical synths, stable logical ids, the diff guard."""

from __future__ import annotations

import difflib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cdk_constructs.network import Network
from settings import settings_from
from stacks.pd_inference_stack import PdInferenceStack
from tests.conftest import PROJECT_CONTEXT, ROOT, synth
from tools import handoff, pr_guard, template_diff
from tools.dev import review


def test_review_files_are_up_to_date(template: dict[str, Any]) -> None:
    """Fails when a change to the stack was not followed by `make review`."""
    assert review.KUBERNETES.read_text() == review.kubernetes_review(review.default_template()), (
        "review/kubernetes.yaml is out of date: run `make review` and commit it"
    )


def test_a_serve_setting_change_is_a_small_line_diff() -> None:
    before = review.kubernetes_review(synth()).splitlines()
    after = review.kubernetes_review(synth(max_model_len="4096")).splitlines()
    changed = [line for line in difflib.unified_diff(before, after, lineterm="", n=0) if line[:1] in "+-"]
    changed = [line for line in changed if not line.startswith(("+++", "---"))]
    # One line out and one in for each side's max_model_len, and for prefill's step (a whole prompt
    # per step, settings/sizing/); and prefill's admission bounds and drain, which sizing derives
    # from the step (a smaller activation peak leaves more KV cache) and the longest prefill: nothing
    # else moves.
    assert len(changed) == 14, changed
    assert sorted(line[0] + line[1:].strip() for line in changed) == [
        "+graceful_shutdown_timeout_s: 74.0",
        "+graceful_shutdown_wait_loop_s: 37.0",
        "+max_model_len: 4096",
        "+max_model_len: 4096",
        "+max_num_batched_tokens: 4096",
        "+max_ongoing_requests: 13",
        "+max_queued_requests: 13",
        "-graceful_shutdown_timeout_s: 78.0",
        "-graceful_shutdown_wait_loop_s: 39.0",
        "-max_model_len: 8192",
        "-max_model_len: 8192",
        "-max_num_batched_tokens: 8192",
        "-max_ongoing_requests: 12",
        "-max_queued_requests: 12",
    ]


def test_serve_config_is_shown_as_yaml_not_a_json_string() -> None:
    text = review.KUBERNETES.read_text()
    assert "serveConfigV2: |" in text
    assert "import_path: ray_pods.selective_pd:build_pd_openai_app" in text


def test_stateful_logical_ids_are_unchanged(template: dict[str, Any]) -> None:
    expected = review.STATEFUL.read_text()
    actual = review.stateful_review(template)
    assert actual == expected, (
        "A stateful resource's logical id or type changed: CloudFormation would REPLACE it (a renamed "
        "construct replaces a cluster). If that is intended, run `make review`, commit "
        "review/stateful-resources.txt, and label the PR allow-destructive-change.\n"
        + "\n".join(difflib.unified_diff(expected.splitlines(), actual.splitlines(), lineterm=""))
    )


def _synth_to(outdir: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CDK_CONTEXT_JSON": json.dumps(PROJECT_CONTEXT), "CDK_OUTDIR": str(outdir)}
    return subprocess.run(
        [sys.executable, "app.py"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False
    )


def test_two_synths_are_byte_identical(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    assert _synth_to(first).returncode == 0
    assert _synth_to(second).returncode == 0
    for name in ("PdInference.template.json", "PdInference.assets.json"):
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    assert sorted(p.name for p in first.iterdir()) == sorted(p.name for p in second.iterdir())


@pytest.fixture(scope="module")
def renamed_network(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The default template and one where the Network construct was renamed, as a refactor might."""
    import aws_cdk as cdk

    folder = tmp_path_factory.mktemp("pair")
    before, after = folder / "before.json", folder / "after.json"
    before.write_text(json.dumps(synth()))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("stacks.pd_inference_stack.Network", lambda scope, _id, **kw: Network(scope, "Net", **kw))
        app = cdk.App(context=PROJECT_CONTEXT)
        stack = PdInferenceStack(app, "PdInference", settings=settings_from(PROJECT_CONTEXT))
        after.write_text(json.dumps(app.synth().get_stack_by_name(stack.stack_name).template))
    return before, after


def test_guard_blocks_a_renamed_stateful_construct(renamed_network: tuple[Path, Path]) -> None:
    before, after = renamed_network
    changes = template_diff.destructive_changes(before, after)
    types = {c["type"] for c in changes}
    assert {"AWS::EC2::VPC", "AWS::EC2::Subnet"} <= types, changes
    assert pr_guard.main([str(before), str(after)]) == 1
    assert pr_guard.main([str(before), str(after), "--allow", "true"]) == 0


def test_guard_passes_an_unchanged_and_a_harmless_change(tmp_path: Path) -> None:
    before, same, harmless = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "c.json"
    before.write_text(json.dumps(synth()))
    same.write_text(json.dumps(synth()))
    harmless.write_text(json.dumps(synth(max_model_len="4096")))
    assert pr_guard.main([str(before), str(same)]) == 0
    assert pr_guard.main([str(before), str(harmless)]) == 0


WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))


def _tool(name: str) -> str:
    return str(Path(sys.executable).parent / name)


def test_workflows_match_github_schema() -> None:
    assert len(WORKFLOWS) == 2
    result = subprocess.run(
        [_tool("check-jsonschema"), "--builtin-schema", "vendor.github-workflows", *map(str, WORKFLOWS)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_workflows_pass_zizmor() -> None:
    result = subprocess.run(
        [_tool("zizmor"), "--offline", "--no-progress", str(ROOT / ".github" / "workflows")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_diff_workflow_has_oidc_and_the_opt_in_label() -> None:
    import yaml

    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "pr-diff.yml").read_text())
    job = workflow["jobs"]["diff"]
    assert job["permissions"] == {"contents": "read", "id-token": "write", "pull-requests": "write"}
    text = json.dumps(workflow)
    assert pr_guard.OPT_IN_LABEL in text
    assert "tools.pr_guard" in text
    assert "cdk diff" in text


def test_diff_workflow_runs_preflight_with_its_role_and_comments_its_table() -> None:
    import yaml

    steps = yaml.safe_load((ROOT / ".github" / "workflows" / "pr-diff.yml").read_text())["jobs"]["diff"]["steps"]
    names = [s.get("name", s.get("uses", "")) for s in steps]
    credentials = next(i for i, s in enumerate(steps) if "configure-aws-credentials" in s.get("uses", ""))
    (preflight,) = [i for i, s in enumerate(steps) if "tools.preflight" in s.get("run", "")]
    assert credentials < preflight, names
    assert "--markdown preflight.md" in steps[preflight]["run"]
    comment = next(s for s in steps if "gh pr comment" in s.get("run", ""))
    assert "cat preflight.md" in comment["run"]
    verdict = steps[-1]
    assert verdict["if"] == f"steps.{steps[preflight]['id']}.outcome == 'failure'" and "exit 1" in verdict["run"]


def test_handoff_folder_holds_template_asset_manifest_and_assets(tmp_path: Path) -> None:
    synthesized = tmp_path / "cdk.out"
    assert _synth_to(synthesized).returncode == 0
    target = tmp_path / "handoff"
    assert handoff.main([str(target)], source=synthesized) == 0
    assets = json.loads((target / "PdInference.assets.json").read_text())
    for asset in assets["files"].values():
        assert (target / asset["source"]["path"]).exists(), asset["source"]["path"]
    template = json.loads((target / "PdInference.template.json").read_text())
    assert "AWS::EKS::Cluster" in {r["Type"] for r in template["Resources"].values()}
