"""What a change interrupts (tools/change_impact.py): a fixed table of concrete changes, each synthesized
through the stack and classified by Ray Serve's own controller code, the stack's cluster hash and node
groups, and pr_guard's CloudFormation comparison."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from settings import Settings, sizing
from tests.conftest import ROOT, synth
from tools import change_impact, pr_guard, template_diff
from tools.change_impact import Impact
from tools.template_text import render

serve = pytest.mark.serve
one_ray = pytest.mark.xdist_group("ray")
IMAGE = "public.ecr.aws/deep-learning-containers/ray:serve-llm-cuda-v1.0"


def _classify(tmp_path: Path, before: dict[str, Any], after: dict[str, Any]) -> change_impact.Classification:
    """As the PR comment does: pr_guard's stateful changes between the two files, then the classes."""
    old, new = tmp_path / "deployed.json", tmp_path / "proposed.json"
    old.write_text(json.dumps(before))
    new.write_text(json.dumps(after))
    return change_impact.classify(before, after, template_diff.destructive_changes(old, new))


# --- Changes that leave the serve config alone: no Ray needed ---------------------------------------
@pytest.mark.parametrize(
    ("change", "expected", "names"),
    [
        ({}, Impact.IN_PLACE, ""),
        ({"ray_image": IMAGE}, Impact.NEW_RAY_CLUSTER, "the image"),
        ({"gpu_volume_gib": 200}, Impact.NODES_REPLACED, "GPU nodes"),
        ({"system_volume_gib": 200}, Impact.NODES_REPLACED, "system nodes"),
        ({"vpc_cidr": "10.1.0.0/16"}, Impact.STATEFUL_REPLACED, "AWS::EC2::VPC"),
    ],
    ids=["nothing", "image", "GPU root volume", "system root volume", "VPC CIDR"],
)
def test_a_change_outside_serve_is_classified(
    tmp_path: Path, change: dict[str, Any], expected: Impact, names: str
) -> None:
    found = _classify(tmp_path, synth(), synth(**change))
    assert found.impact is expected, found.findings
    assert names in " ".join(f.what for f in found.findings if f.impact is expected)


# --- Changes to the serve config: Serve's controller code decides --------------------------------
def _edit_deployment(template: dict[str, Any], prefix: str, **options: Any) -> dict[str, Any]:
    """The template with one entry of serveConfigV2's `deployments` list edited, as a user would edit it."""
    edited = copy.deepcopy(template)
    for resource in edited["Resources"].values():
        if resource["Type"] != "Custom::AWSCDK-EKS-KubernetesResource":
            continue
        # A manifest that holds a token (the GCS store's address) is an Fn::Join: read as change_impact reads it.
        manifest = render(resource["Properties"]["Manifest"])
        if "RayService" not in manifest:
            continue
        docs = json.loads(manifest)
        for doc in docs:
            if doc["kind"] == "RayService":
                config = yaml.safe_load(doc["spec"]["serveConfigV2"])
                (entry,) = [d for d in config["applications"][0]["deployments"] if d["name"].startswith(prefix)]
                entry.update(options)
                doc["spec"]["serveConfigV2"] = yaml.safe_dump(config, sort_keys=False)
        resource["Properties"]["Manifest"] = json.dumps(docs)
    return edited


BOUNDS = {"min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 4}
RANGE: dict[str, Any] = {"num_replicas": None, "autoscaling_config": BOUNDS}
WIDER: dict[str, Any] = {"num_replicas": None, "autoscaling_config": {**BOUNDS, "max_replicas": 3}}
POLICY = {"policy_function": "ray.serve.autoscaling_policy:replica_queue_length_autoscaling_policy"}
WITH_POLICY: dict[str, Any] = {"num_replicas": None, "autoscaling_config": {**BOUNDS, "policy": POLICY}}
# Both sides with a range: room for a surge replica each (settings/sizing/upgrade.py, surge_room).
RANGES: dict[str, Any] = {
    "prefill_max_replicas": 2, "prefill_target_ongoing_requests": 2.0,
    "decode_max_replicas": 2, "decode_target_ongoing_requests": 8.0,
}  # fmt: skip
Pair = Callable[[], tuple[dict[str, Any], dict[str, Any]]]
SERVE_CHANGES: dict[str, tuple[Pair, Impact, str]] = {
    "queue bounds": (
        lambda: (synth(), synth(typical_request_tokens=1024)),
        Impact.IN_PLACE,
        "applied without a restart",
    ),
    "engine setting": (lambda: (synth(), synth(max_model_len=4096)), Impact.REPLICAS_RESTARTED, "code version"),
    "fixed replica count": (lambda: (synth(), synth(decode_replicas=2)), Impact.NEW_RAY_CLUSTER, "worker group decode"),
    "GPU instance type": (
        lambda: (synth(), synth(gpu_instance_type="g6e.8xlarge")),
        Impact.STATEFUL_REPLACED,
        "AWS::EKS::Nodegroup",
    ),
    # Serve restarts these replicas without a new code version (version.py, requires_actor_restart).
    "placement strategy": (
        lambda: (synth(), _edit_deployment(synth(), "Decode:", placement_group_strategy="PACK")),
        Impact.REPLICAS_RESTARTED,
        "`Decode:Qwen--Qwen3-8B`: restarted for its placement group",
    ),
    # A wider range is applied to running replicas; a range where there was a fixed size, or an
    # autoscaling policy, enters the code version (deploy_utils.py, get_app_code_version).
    "autoscaling bounds": (
        lambda: (_edit_deployment(synth(), "Decode:", **RANGE), _edit_deployment(synth(), "Decode:", **WIDER)),
        Impact.IN_PLACE,
        "`Decode:Qwen--Qwen3-8B`: new options, applied without a restart",
    ),
    "fixed to a range": (
        lambda: (synth(), _edit_deployment(synth(), "Decode:", **RANGE)),
        Impact.REPLICAS_RESTARTED,
        "code version",
    ),
    # `make upgrade`'s two deploys around a change (tools/upgrade.py): the surge's minimum up, then down again,
    # each applied to running replicas. A range stays a range under the surge (serve_config/deployments.py):
    # as a fixed size its way back would change the code version, as "fixed to a range" does.
    "surge on": (lambda: (synth(**RANGES), synth(**RANGES, replica_surge=True)), Impact.IN_PLACE, "without a restart"),
    "surge off": (lambda: (synth(**RANGES, replica_surge=True), synth(**RANGES)), Impact.IN_PLACE, "without a restart"),
    # Decode's user_config: Serve calls the running replicas' reconfigure (ray_pods/selective_pd.py).
    "local prefill threshold": (
        lambda: (synth(local_prefill_max_tokens=0), synth()),
        Impact.IN_PLACE,
        "`Decode:Qwen--Qwen3-8B`: new options, applied without a restart",
    ),
    # Each side's router is in Serve's code version (deploy_utils.py, request_router_configs): switching prefix-aware
    # routing restarts every replica, and the PR comment must say so.
    "prefix routing off": (
        lambda: (synth(**RANGES), synth(**RANGES, prefix_cache_routing=False)),
        Impact.REPLICAS_RESTARTED,
        "code version",
    ),
    "autoscaling policy": (
        lambda: (
            _edit_deployment(synth(), "Decode:", **RANGE),
            _edit_deployment(synth(), "Decode:", **WITH_POLICY),
        ),
        Impact.REPLICAS_RESTARTED,
        "code version",
    ),
}


@serve
@one_ray
@pytest.mark.parametrize("name", list(SERVE_CHANGES))
def test_a_change_to_the_serve_config_is_classified(tmp_path: Path, name: str, local_ray: None) -> None:
    pair, expected, names = SERVE_CHANGES[name]
    found = _classify(tmp_path, *pair())
    assert found.impact is expected, found.findings
    assert names in " ".join(f.what for f in found.findings if f.impact is expected), found.findings


# --- What the PR comment says ----------------------------------------------------------------------
def test_a_replica_restart_says_which_sides_a_surge_keeps_serving() -> None:
    """On the defaults neither side has room; with a range on prefill, prefill surges and decode is still down."""
    restart = change_impact.Classification([change_impact.Finding(Impact.REPLICAS_RESTARTED, "code version")])
    plain = change_impact.interruption(restart, Settings())
    assert "No room for a surge replica on prefill and decode" in plain and "make upgrade" not in plain
    one = Settings(prefill_max_replicas=2, prefill_target_ongoing_requests=2.0)
    said = change_impact.interruption(restart, one)
    assert "Deployed with `make upgrade`, prefill start" in said and "No room for a surge replica on decode" in said
    both = change_impact.interruption(restart, Settings(**RANGES))
    assert "prefill and decode start a surge replica" in both and "No room" not in both
    assert "and so does the ingress" in both
    one_system_node = change_impact.interruption(restart, Settings(**RANGES, system_nodes_min=1))
    assert "the ingress restarts in place" in one_system_node and "so does the ingress" not in one_system_node
    new_model = change_impact.Classification(restart.findings, new_model=True)
    assert "no surge replica keeps them serving" in change_impact.interruption(new_model, Settings(**RANGES))


def test_each_class_says_how_long_from_sizing() -> None:
    s = Settings()
    start, engine, pull = sizing.cold_start(s), sizing.ENGINE_START_S, sizing.IMAGE_PULL_S

    def said(impact: Impact, **facts: Any) -> str:
        return change_impact.interruption(change_impact.Classification([change_impact.Finding(impact, "")], **facts), s)

    def minutes(low: float, high: float) -> str:
        return f"about {low / 60:.1f}-{high / 60:.1f} min"

    assert said(Impact.IN_PLACE) == "No replica, Ray cluster or node restarts."
    weights = start.restart_seconds
    assert f"one engine start, {minutes(weights + engine[0], weights + engine[1])}." in said(Impact.REPLICAS_RESTARTED)
    image = minutes(weights + engine[0] + pull[0], weights + engine[1] + pull[1])
    assert f"whole cluster start on the existing nodes, {image} (the new image" in said(
        Impact.NEW_RAY_CLUSTER, image_changed=True
    )
    # A new GPU node pulls by nodeadm's parallel pull; the head's system node by a standard one.
    fast = sizing.gpu_image_pull_seconds(parallel=True)
    new_node = minutes(
        start.first_download_seconds + engine[0] + fast[0], start.first_download_seconds + engine[1] + fast[1]
    )
    gpu = said(Impact.NODES_REPLACED, replaced_groups={"GPU": 1})
    assert f"a start on an empty node, {new_node}" in gpu
    assert f"scale-up budget, {minutes(*sizing.scale_up_seconds(s))}" in gpu
    assert f"the whole Ray cluster restarts, {image}" in said(Impact.NODES_REPLACED, replaced_groups={"system": 1})
    assert "ingress pods" not in said(Impact.NEW_RAY_CLUSTER)


def test_a_recreate_behind_the_nlb_counts_the_ingress_pods_drain() -> None:
    """The old ingress pods sleep out their preStop (settings/sizing admission.py) before the new ones may
    take their place on full system nodes: 765 s on the defaults, 12.8 min."""
    s = Settings(internal_endpoint_cidrs=("10.0.0.0/8",))
    finding = change_impact.Classification([change_impact.Finding(Impact.NEW_RAY_CLUSTER, "")])
    text = change_impact.interruption(finding, s)
    assert sizing.ingress_termination_grace_seconds(s) == 765
    assert "the old ingress pods take up to 12.8 min to go" in text


def test_the_pr_comment_and_the_cli_name_the_class(tmp_path: Path) -> None:
    old, new = tmp_path / "deployed.json", tmp_path / "proposed.json"
    old.write_text(json.dumps(synth()))
    new.write_text(json.dumps(synth(ray_image=IMAGE)))
    assert pr_guard.main([str(old), str(new), "--markdown", str(tmp_path / "guard.md")]) == 0
    comment = (tmp_path / "guard.md").read_text()
    assert comment.startswith("No stateful resource is replaced or deleted.\n")
    assert "**Interruption: a new Ray cluster.** The recreate Job deletes the running RayCluster" in comment
    assert change_impact.main([str(old), str(new), "--markdown", str(tmp_path / "impact.md")]) == 0
    assert (tmp_path / "impact.md").read_text() in comment


def test_the_diff_workflow_installs_serve_before_the_guard() -> None:
    steps = yaml.safe_load((ROOT / ".github" / "workflows" / "pr-diff.yml").read_text())["jobs"]["diff"]["steps"]
    runs = [step.get("run", "") for step in steps]
    serve_at = next(i for i, run in enumerate(runs) if "make setup-serve" in run)
    assert serve_at < next(i for i, run in enumerate(runs) if "tools.pr_guard" in run)


def test_the_upgrades_table_gives_the_interruptions_change_impact_computes() -> None:
    """docs/operations.md's table of what each change interrupts quotes change-impact's figures on the defaults."""
    readme = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    s = Settings()
    for kind, (new_weights, image_pull, gpu_nodes_only) in {
        "an engine setting": (False, False, False),
        "a new Ray cluster": (False, True, False),
        "GPU nodes replaced": (True, True, True),
    }.items():
        seconds = sizing.engine_restart_seconds(
            s, new_weights=new_weights, image_pull=image_pull, gpu_nodes_only=gpu_nodes_only
        )
        assert change_impact._minutes(*seconds) in readme, kind
    assert f"{sizing.cluster_deletion_delay_seconds(s):.0f} s after the switch" in readme
