"""Prefix-aware routing: a request goes to the replica of a side that already holds its prompt's prefix.

Named in each engine deployment's `request_router_config` (serve_config/deployments.py) for a side that can run
more than one replica. Ray 2.58's `PrefixCacheAffinityRouter` keeps, per deployment, a tree of the prompts each
replica was sent, in a detached actor, and sends a prompt to the replica with the longest match while the
replicas' queues differ by at most `imbalanced_threshold`; past it, power of two choices.

Two of its defaults do not fit the product, and this class changes only those:

- **Where its tree actor runs.** Ray creates it with default options in whichever process first routes to the
  deployment (routing_policies/prefix_aware/prefix_aware_router.py, initialize_state). For prefill that process
  is a decode replica, which runs inside its placement group with child tasks captured
  (serve/_private/deployment_scheduler.py), so the tree lands in that group, and Ray kills what is in a group
  when the group is removed: when that decode replica goes (a scale-down, an upgrade), prefill's tree dies with
  it, and every other caller's routing calls a dead actor. tests/test_prefix_routing.py shows both. Here the
  actor asks for no CPU, is placed outside any placement group (an explicit scheduling strategy is never
  captured), prefers the Ray head (a system node, `num-cpus: 0`, no GPU), and is restarted elsewhere if its node
  goes (`max_restarts=-1`; the tree starts empty again, and routing follows load until it refills).
- **A routing task holding no request.** Serve's own routers include `FIFOMixin`; Ray's prefix router does not
  (serve/_private/request_router/pow_2_router.py against prefix_aware_router.py). A spare routing task then
  asks for a replica with no request (`request_metadata` None), gets one from the cache without awaiting, and
  Ray's base `_fulfill_next_pending_request` hands it to no one, so the task loops without yielding and freezes
  every other routing task in the process until the queue-length cache goes stale (10 s). On the CPU
  rehearsal's scaling case that left a new prefill replica without a request and requests unanswered. Here such
  a replica goes to the oldest pending request, as `FIFOMixin` does; a real request keeps its exact match.
- **A request with no text.** Ray divides by the prompt's length (`len(matched_text) / len(input_text)`) and
  raises where a request has neither `messages` nor `prompt`; such a request (token ids, an image alone, or an
  embeddings call) is routed here by power of two choices instead.
"""

# No `from __future__ import annotations`: Serve may read these signatures at run time.
import logging
from typing import Any

import ray
from ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router import PrefixCacheAffinityRouter
from ray.llm._internal.serve.routing_policies.prefix_aware.prefix_tree import PrefixTreeActor
from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

logger = logging.getLogger("ray.serve")

# Ray's own name for the tree actor, in a namespace per deployment (prefix_aware_router.py, initialize_state).
TREE_ACTOR_NAME = "LlmPrefixTreeActor"
# The resource only the head node has.
HEAD_NODE_RESOURCE = "node:__internal_head__"


def tree_actor_options(namespace: str, head_node_id: str | None) -> dict[str, Any]:
    """The tree actor's options: Ray's name, namespace and lifetime; no CPU; outside the caller's placement group
    (an explicit scheduling strategy is never captured into it); the head node preferred, any node if it is gone;
    restarted wherever there is room if its node is lost."""
    strategy: Any = "DEFAULT" if head_node_id is None else NodeAffinitySchedulingStrategy(head_node_id, soft=True)
    return {
        "name": TREE_ACTOR_NAME,
        "namespace": namespace,
        "get_if_exists": True,
        "lifetime": "detached",
        "num_cpus": 0,
        "scheduling_strategy": strategy,
        "max_restarts": -1,
        "max_task_retries": -1,
    }


def head_node_id() -> str | None:
    """The Ray head's node id, if it is alive."""
    for node in ray.nodes():
        if node.get("Alive") and HEAD_NODE_RESOURCE in node.get("Resources", {}):
            return str(node["NodeID"])
    return None


class PrefixAffinityRouter(PrefixCacheAffinityRouter):  # type: ignore[misc]  # Ray ships no type information
    """Ray's prefix-cache affinity router, its tree actor placed off the GPU nodes and out of any placement group."""

    def initialize_state(self, **kwargs: Any) -> None:
        if kwargs.get("tree_actor") is None:
            parts = [SERVE_NAMESPACE]
            if self._deployment_id is not None:
                parts += [self._deployment_id.app_name, self._deployment_id.name]
            options = tree_actor_options("::".join(p for p in parts if p), head_node_id())
            actor = PrefixTreeActor.options(**options).remote()
            # As Ray's own: serve.shutdown() removes it with the app.
            controller = ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
            ray.get(controller._register_shutdown_cleanup_actor.remote(actor))
            kwargs["tree_actor"] = actor
        super().initialize_state(**kwargs)

    def _fulfill_next_pending_request(self, replica: Any, request_metadata: Any = None) -> None:
        """A replica chosen for no request in particular goes to the oldest pending one (FIFOMixin's rule); one
        chosen for a request goes to that request, as in Ray's router."""
        if request_metadata is not None:
            super()._fulfill_next_pending_request(replica, request_metadata)
            return
        # FIFOMixin._fulfill_next_pending_request's queue walk (serve/_private/request_router/request_router.py); its
        # metadata match needs FIFOMixin's own helper and matches nothing without metadata.
        while self._pending_requests_to_fulfill:
            pending = self._pending_requests_to_fulfill.popleft()
            if not pending.future.done():
                self._record_queue_wait_time(pending)
                pending.future.set_result(replica)
                self._remove_pending_request_from_indices(pending)
                return

    def _extract_text_from_request(self, pending_request: Any) -> str | None:
        """The prompt's text, or None (power of two choices) where there is none to match."""
        try:
            text = super()._extract_text_from_request(pending_request)
        except ValueError:
            return None
        return text or None
