"""The warm-node placeholder as the template ships it: applied after its PriorityClass, holding every GPU of a
multi-GPU node, and its model-cache download leaving the cache writable by the image's serving user."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

from aws_cdk.assertions import Template

from serve_config import GPU_RESOURCE
from serve_config.pod_templates import MODEL_CACHE_MOUNT
from serve_config.warm_nodes import WARM_NODE
from tests.conftest import manifests, synth
from tests.support import placement
from tests.support.cluster import DEVICE_PLUGIN_DAEMONSETS, priority_classes, workloads
from tools.template_text import render

WARM = {"decode_max_replicas": 3, "decode_target_ongoing_requests": 8, "gpu_warm_nodes": 1}
# Four L40S a node, a TP-4 replica a side: the placeholder must take all four.
FOUR_GPUS = {
    "gpu_instance_type": "g6e.12xlarge",
    "model_id": "meta-llama/Llama-3.3-70B-Instruct",
    "prefill_tensor_parallel_size": 4,
    "decode_tensor_parallel_size": 4,
    "hf_token_secret_name": "prod/hf-token",
    "decode_max_replicas": 2,
    "decode_target_ongoing_requests": 8,
    "gpu_warm_nodes": 1,
}
MANIFEST_TYPE = "Custom::AWSCDK-EKS-KubernetesResource"


def _manifest_ids(template: Template) -> dict[str, str]:
    """Each warm-node object's kind -> the logical id of the manifest resource that applies it."""
    found = {}
    for logical_id, resource in template.find_resources(MANIFEST_TYPE).items():
        for doc in json.loads(render(resource["Properties"]["Manifest"])):
            if doc["metadata"].get("name") == WARM_NODE:
                found[doc["kind"]] = logical_id
    return found


def test_the_placeholder_is_applied_after_its_priority_class() -> None:
    """The API server refuses a pod naming a PriorityClass that does not exist yet, and the Deployment's
    ReplicaSet keeps failing to create it: CloudFormation must create the class first."""
    template = Template.from_json(synth(**WARM))
    ids = _manifest_ids(template)
    assert set(ids) == {"PriorityClass", "Deployment"}
    deployment = template.find_resources(MANIFEST_TYPE)[ids["Deployment"]]
    assert ids["PriorityClass"] in deployment.get("DependsOn", []), deployment.get("DependsOn")


def test_on_a_four_gpu_node_the_placeholder_holds_every_gpu() -> None:
    """Placed by the proof's model of kube-scheduler on the template's nodes: the spare node the placeholder
    takes has no GPU left, so nothing else of its priority lands there and a TP-4 replica preempts it whole."""
    raw = synth(**FOUR_GPUS)
    (deployment,) = [m for m in manifests(raw) if m["kind"] == "Deployment" and m["metadata"]["name"] == WARM_NODE]
    (hold,) = deployment["spec"]["template"]["spec"]["containers"]
    assert hold["resources"]["requests"][GPU_RESOURCE] == hold["resources"]["limits"][GPU_RESOURCE] == "4"
    nodes = placement.nodes_from_template(raw, "1.36")
    result = placement.place(nodes, workloads(raw, "1.36"), DEVICE_PLUGIN_DAEMONSETS, priority_classes(raw, "1.36"))
    assert result.failures == []
    (warm_node,) = result.placed[f"Deployment/{WARM_NODE}"]
    (node,) = [n for n in result.nodes if n.name == warm_node]
    assert node.allocatable[GPU_RESOURCE] == 4
    assert node.free(GPU_RESOURCE) == 0


def _fake_hub(root: Path) -> Path:
    """A stand-in for huggingface_hub's snapshot_download: writes a snapshot under HF_HOME as the real one lays
    it out (hub/models--org--name/{blobs,snapshots}), with the process's umask, and records what it was asked."""
    package = root / "stand_in" / "huggingface_hub"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(
        "import json, os\n"
        "def snapshot_download(repo_id, allow_patterns=None, ignore_patterns=None):\n"
        "    repo = os.path.join(os.environ['HF_HOME'], 'hub', 'models--' + repo_id.replace('/', '--'))\n"
        "    for folder in ('blobs', 'snapshots/main'):\n"
        "        os.makedirs(os.path.join(repo, folder), exist_ok=True)\n"
        "    with open(os.path.join(repo, 'snapshots', 'main', 'config.json'), 'w') as handle:\n"
        "        json.dump({'repo_id': repo_id, 'allow': allow_patterns, 'ignore': ignore_patterns}, handle)\n"
        "    return repo\n"
    )
    return package.parent


def test_the_download_leaves_the_cache_writable_by_the_serving_user(tmp_path: Path) -> None:
    """The init container runs as root; the Ray workers run as the image's own user and write to the same cache
    (lock files, the rest of the model's files at engine start). Its script from the template, run here with
    the cache at a temporary path and a stand-in download: every folder and file ends open to every user."""
    template = synth(**WARM)
    (deployment,) = [m for m in manifests(template) if m["kind"] == "Deployment" and m["metadata"]["name"] == WARM_NODE]
    (download,) = deployment["spec"]["template"]["spec"]["initContainers"]
    shell, flag, script, code = download["command"]
    assert (shell, flag) == ("sh", "-c")
    cache = tmp_path / "model-cache"
    env = {e["name"]: e["value"].replace(MODEL_CACHE_MOUNT, str(cache)) for e in download["env"] if "value" in e}
    env["PATH"] = f"{Path(sys.executable).parent}:{os.environ['PATH']}"
    env["PYTHONPATH"] = str(_fake_hub(tmp_path))
    subprocess.run(
        [shell, flag, script.replace(MODEL_CACHE_MOUNT, str(cache)), code],
        env=env,
        check=True,
        preexec_fn=lambda: os.umask(0o022),  # a container's usual umask: group and others lose write
    )
    (config,) = cache.rglob("config.json")
    assert json.loads(config.read_text())["repo_id"] == "Qwen/Qwen3-8B"
    paths: list[Any] = [cache, *cache.rglob("*")]
    assert len(paths) >= 6
    closed = [
        str(p.relative_to(tmp_path))
        for p in paths
        if not p.stat().st_mode & stat.S_IWOTH or (p.is_dir() and not p.stat().st_mode & stat.S_IXOTH)
    ]
    assert closed == []
