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
  captured), prefers the Ray head (a system node, `num-cpus: 0`, no GPU; it asks for one byte of memory, without
  which Ray ignores the preference), and is restarted elsewhere if its node goes (`max_restarts=-1`; the tree
  starts empty again, and routing follows load until it refills). tests/test_prefix_tree_placement.py shows where
  it lands.
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
- **Routing that waits for the tree.** Ray calls the tree with a blocking `ray.get` from the routing path
  (`_prefix_match_best_replicas`, `on_request_routed`, `update_replicas`, `on_replica_actor_died`), on the one
  event loop every router of the process shares (serve/_private/router.py, SingletonThreadRouter). While the tree
  cannot answer (its node is lost, the head with it, and its restart waits for the GCS) such a call does not
  return, and every request of the process waits with it. Here a routing decision waits at most
  TREE_CALL_TIMEOUT_S for the tree and then goes by load alone (power of two choices), leaves the tree alone
  for TREE_RETRY_S, and asks again in the background; the tree's bookkeeping is sent without waiting.
- **A restarted tree.** It starts empty, and Ray re-registers only replicas a router newly sees and starts the
  eviction loop once per router: the replicas of before are unknown to it (it ignores their prompts, and its
  smallest tenant is always a new replica) and nothing evicts. Here every router re-registers its replicas and the
  eviction loop every TREE_RESYNC_S and after the tree comes back; both are no-ops on a tree that has them.
- **A prompt's length.** The tree keeps what a router puts in it until the eviction loop's next pass (10 s), so
  the text inserted and matched is the prompt's first MAX_TREE_TEXT_CHARS characters: a longer prompt is
  routed by its beginning. Each replica's count of characters is bounded by the router's options
  (settings/sizing/prefix_tree.py): its share of the head's memory at the worst bytes a character costs, less
  what one pass's interval can add.
"""

# No `from __future__ import annotations`: Serve may read these signatures at run time.
import asyncio
import logging
import math
import time
from collections.abc import Awaitable
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
# The tree actor's resource request: anything above none (tree_actor_options says why).
TREE_MEMORY_BYTES = 1
# The longest a routing decision waits for the tree. A match takes a few milliseconds on a live tree; past this
# the tree is taken as away, and the request goes by load.
TREE_CALL_TIMEOUT_S = 1.0
# How long routing leaves a tree that did not answer alone before asking it again, in the background: during a
# head's absence no request pays the timeout more than once.
TREE_RETRY_S = 5.0
# How often each router re-registers its replicas and the eviction loop with the tree: the longest a restarted
# tree goes without the replicas of before, half the eviction loop's own interval (Ray's 10 s).
TREE_RESYNC_S = 5.0
# The characters of a prompt the tree sees, about 8,000 tokens of English. What the tree holds grows by what
# routers insert between two eviction passes, 10 s apart, and a match follows the prompt's beginning (a system
# prompt, a conversation's first turns), which this keeps. A real tree costs 1-4 bytes a character for long
# prompts, tens for short distinct ones, and about 1,050 at worst, a node per character (tracemalloc, Ray 2.58's
# PrefixTree); the eviction bound is sized from that worst case (settings/sizing/prefix_tree.py, which mirrors
# this length).
MAX_TREE_TEXT_CHARS = 32_768


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
        # Ray's scheduler puts an actor that asks for no resource at all on a random node whatever its strategy,
        # unless its node affinity is hard (ClusterResourceScheduler::GetBestSchedulableNode: "The zero cpu actor
        # is a special case ... except for HARD node affinity"); one byte of memory makes the soft preference
        # count. Every node offers memory (Ray counts it at start), the head with `num-cpus: 0` included, so the
        # request never keeps the actor off a node.
        "memory": TREE_MEMORY_BYTES,
        "scheduling_strategy": strategy,
        "max_restarts": -1,
        "max_task_retries": -1,
    }


def tree_namespace(deployment_id: Any) -> str:
    """Ray's namespace of a deployment's tree (initialize_state): one tree per app and deployment, so prefill's and
    decode's replicas never share one."""
    parts = [SERVE_NAMESPACE]
    if deployment_id is not None:
        parts += [deployment_id.app_name, deployment_id.name]
    return "::".join(p for p in parts if p)


def head_node_id() -> str | None:
    """The Ray head's node id, if it is alive."""
    for node in ray.nodes():
        if node.get("Alive") and HEAD_NODE_RESOURCE in node.get("Resources", {}):
            return str(node["NodeID"])
    return None


class PrefixAffinityRouter(PrefixCacheAffinityRouter):  # type: ignore[misc]  # Ray ships no type information
    """Ray's prefix-cache affinity router, its tree actor placed off the GPU nodes and out of any placement group,
    and routing that never waits longer than TREE_CALL_TIMEOUT_S for it."""

    def initialize_state(self, **kwargs: Any) -> None:
        if kwargs.get("tree_actor") is None:
            options = tree_actor_options(tree_namespace(self._deployment_id), head_node_id())
            actor = PrefixTreeActor.options(**options).remote()
            # As Ray's own: serve.shutdown() removes it with the app.
            controller = ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
            ray.get(controller._register_shutdown_cleanup_actor.remote(actor))
            kwargs["tree_actor"] = actor
        super().initialize_state(**kwargs)
        # When the tree last failed to answer (None: it answers), and when this router last registered its
        # replicas and the eviction loop with it.
        self._tree_away_since: float | None = None
        self._tree_synced_at = -math.inf
        self._tree_sync: asyncio.Task[None] | None = None

    async def _ask_tree(self, call: Awaitable[Any]) -> tuple[bool, Any]:
        """The tree's answer within TREE_CALL_TIMEOUT_S: (True, answer), or (False, None) once it is taken as away."""
        try:
            return True, await asyncio.wait_for(call, TREE_CALL_TIMEOUT_S)
        except (TimeoutError, ray.exceptions.RayError) as error:
            if self._tree_away_since is None:
                logger.warning(
                    "Prefix tree of %s did not answer (%s); routing by load until it does.",
                    self._deployment_id,
                    type(error).__name__,
                )
            self._tree_away_since = time.monotonic()
            return False, None

    async def _sync_tree(self) -> None:
        """Register this router's replicas and the eviction loop with the tree: a restarted tree knows neither, and
        both are no-ops on a tree that has them (add_tenants skips a known tenant, start_eviction_loop a running
        loop)."""
        tenants = [replica_id.to_full_id_str() for replica_id in self._replica_id_set]
        calls = [self._tree_actor.add_tenants.remote(tenants, time.time())]
        if self._do_eviction:
            calls.append(
                self._tree_actor.start_eviction_loop.remote(
                    self._eviction_threshold_chars, self._eviction_target_chars, self._eviction_interval_secs
                )
            )
        answered, _ = await self._ask_tree(asyncio.gather(*calls))
        if answered:
            if self._tree_away_since is not None:
                logger.info("Prefix tree of %s answers again.", self._deployment_id)
            self._tree_away_since = None
            self._tree_synced_at = time.monotonic()
            self._eviction_loop_running = True

    def _tree_usable(self) -> bool:
        """Whether routing may ask the tree now; starts a sync in the background when one is due, so no request
        waits for it."""
        now = time.monotonic()
        away = self._tree_away_since is not None
        due = now - self._tree_synced_at >= TREE_RESYNC_S
        if away and now - (self._tree_away_since or now) < TREE_RETRY_S:
            return False
        if (away or due) and (self._tree_sync is None or self._tree_sync.done()):
            self._tree_sync = asyncio.get_running_loop().create_task(self._sync_tree())
        return not away

    def _tell_tree(self, method: str, *args: Any) -> None:
        """A call to the tree that nothing waits for. A tree that is away may never run it; the next sync puts
        back what it must know."""
        if self._tree_away_since is None:
            getattr(self._tree_actor, method).remote(*args)

    async def _imbalanced(self, candidate_replicas: list[Any]) -> bool:
        """Whether the candidates' queues differ by more than imbalanced_threshold (Ray's own rule, from the
        queue-length cache, probing what it lacks)."""
        lengths = []
        missing = []
        for replica in candidate_replicas:
            cached = (
                self._replica_queue_len_cache.get(replica.replica_id) if self._use_replica_queue_len_cache else None
            )
            if cached is None or cached >= replica.max_ongoing_requests:
                missing.append(replica)
            else:
                lengths.append(cached)
        if missing:
            lengths += [length for _, length in await self._probe_queue_lens(missing, 0) if length is not None]
        return bool(lengths) and max(lengths) - min(lengths) > self._imbalanced_threshold

    async def _prefix_match_best_replicas(self, pending_request: Any, candidate_replicas: list[Any]) -> list[list[Any]]:
        """Ray's choice (prefix_aware_router.py): the candidates with the longest match while their queues are
        balanced, the tree's smallest below the match-rate threshold; with each tree call bounded, and only
        candidates returned (Ray indexes its replicas with whatever tenant the tree names). An empty choice is
        power of two choices."""
        if pending_request is None or not pending_request.args or not self._tree_usable():
            return [[]]
        text = self._extract_text_from_request(pending_request)
        if text is None or await self._imbalanced(candidate_replicas):
            return [[]]
        text = text[:MAX_TREE_TEXT_CHARS]
        by_id = {replica.replica_id.to_full_id_str(): replica for replica in candidate_replicas}
        answered, found = await self._ask_tree(self._tree_actor.prefix_match.remote(text, list(by_id)))
        if not answered:
            return [[]]
        matched_text, chosen = found
        if len(matched_text) / len(text) < self._match_rate_threshold:
            answered, chosen = await self._ask_tree(self._tree_actor.get_smallest_tenants.remote())
        return [[by_id[tenant] for tenant in (chosen or []) if tenant in by_id]]

    def on_request_routed(self, pending_request: Any, replica_id: Any, result: Any) -> None:
        if pending_request is None or not pending_request.args:
            return
        text = self._extract_text_from_request(pending_request)
        if text is not None:
            self._tell_tree("insert", text[:MAX_TREE_TEXT_CHARS], replica_id.to_full_id_str(), time.time())

    def update_replicas(self, replicas: list[Any]) -> None:
        old = set(self._replica_id_set)
        # Serve's own bookkeeping, past Ray's prefix router, whose tree calls block.
        super(PrefixCacheAffinityRouter, self).update_replicas(replicas)
        new = set(self._replica_id_set)
        if new - old:
            self._tell_tree("add_tenants", [r.to_full_id_str() for r in new - old], time.time())
        if old - new:
            self._tell_tree("remove_tenants", [r.to_full_id_str() for r in old - new])

    def on_replica_actor_died(self, replica_id: Any) -> None:
        super(PrefixCacheAffinityRouter, self).on_replica_actor_died(replica_id)
        self._tell_tree("remove_tenants", [replica_id.to_full_id_str()])

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
