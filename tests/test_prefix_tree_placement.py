"""Where the prefix router's tree actor lands (ray_pods/prefix_routing.py, tree_actor_options), on real Ray: a cluster
laid out as the product's, the head with no CPU (rayservice.yaml's `num-cpus: 0`) and two workers.

Ray 2.58 places an actor that asks for no resource on a random node whatever its soft node affinity, so the head
would hold a tree about one time in three here; TREE_PLACEMENTS placements all on the head leave a random placement
passing by chance below one in a thousand. A node the preference names that is gone does not keep the tree away:
it is restarted on a node that is there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from tests.conftest import ROOT, require_serve_deps

pytestmark = pytest.mark.private_internals
# (1/3) ** 7 < 1e-3: seven placements on three nodes, all on the head, are not chance.
NODES = 3
TREE_PLACEMENTS = 7

# In its own process, on its own cluster: the session's Ray (conftest's local_ray) and any other cluster on the
# machine are never joined.
PLACEMENTS = r"""
import json, sys, time
import ray
from ray.cluster_utils import Cluster
from ray.llm._internal.serve.routing_policies.prefix_aware.prefix_tree import PrefixTreeActor
from ray_pods.prefix_routing import head_node_id, tree_actor_options

placements = int(sys.argv[1])
cluster = Cluster(initialize_head=True, connect=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
try:
    for _ in range(2):
        cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    head = head_node_id()

    def node_of(tree):
        return ray.get(tree.__ray_call__.remote(lambda _: ray.get_runtime_context().get_node_id()), timeout=60)

    # Each a placement of its own (a namespace each, as each deployment's tree has), made at once.
    trees = [PrefixTreeActor.options(**tree_actor_options(f"serve::t::{i}", head)).remote() for i in range(placements)]
    landed = [node_of(tree) for tree in trees]
    # A preferred node that goes: the product's options name the head, which is this node's part here (no CPU).
    spare = cluster.add_node(num_cpus=0)
    cluster.wait_for_nodes()
    tree = PrefixTreeActor.options(**tree_actor_options("serve::t::moved", spare.node_id)).remote()
    on_spare = node_of(tree)
    cluster.remove_node(spare)
    moved = node_of(tree)
    head_memory = next(n["Resources"].get("memory", 0) for n in ray.nodes() if n["NodeID"] == head)
    print(json.dumps({"head": head, "landed": landed, "spare": spare.node_id, "on_spare": on_spare, "moved": moved,
                      "head_memory": head_memory}))
finally:
    ray.shutdown()
    cluster.shutdown()
"""


def _placements() -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    done = subprocess.run(
        [sys.executable, "-c", PLACEMENTS, str(TREE_PLACEMENTS)],
        cwd=ROOT,
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def test_the_tree_lands_on_the_head_with_no_cpu_every_time_and_elsewhere_once_its_node_is_gone() -> None:
    require_serve_deps()
    assert (1 / NODES) ** TREE_PLACEMENTS < 1e-3
    found = _placements()
    # The head offers what the tree asks for, with no CPU.
    assert found["head_memory"] > 0
    assert found["landed"] == [found["head"]] * TREE_PLACEMENTS, found
    assert found["on_spare"] == found["spare"]
    assert found["moved"] not in (found["spare"], None)
