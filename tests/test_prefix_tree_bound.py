"""The prefix router's trees stay within their share of the Ray head's memory (settings/sizing/prefix_tree.py): Ray's
real PrefixTree, filled as the router fills it (per-replica inserts, a timestamp each) with the costliest prompts
there are, measured with tracemalloc, then evicted by Ray's own loop with the router's options."""

from __future__ import annotations

import itertools
import time
import tracemalloc
from collections.abc import Iterator
from typing import Any

import pytest

from serve_config.pod_templates import rayservice
from settings import Settings, sizing
from settings.rules.bounds import RANGES
from settings.sizing import prefix_tree
from tests.conftest import require_serve_deps

pytestmark = pytest.mark.private_internals
# One-character nodes come in chains this long: an insert walks its chain, so the fill stays linear (a chain of 4
# costs ~1,030 bytes a character under tracemalloc, a chain of 16 ~1,045).
CHAIN = 4
# Characters outside the BMP: a one-character str of one is a new 4-byte object (CPython caches only Latin-1's).
FIRST_CHAR = 0x10000
FILLER_CHAR = 0x1F600


def _gib(quantity: str) -> float:
    assert quantity.endswith("Gi"), quantity
    return float(quantity[:-2])


def _share_bytes() -> int:
    """One replica's share of the head, from the synthesized head's memory limit, over every replica the settings
    may ever allow both sides."""
    doc = rayservice(Settings(), system_node_labels={}, gpu_node_labels={}, gpu_toleration={})
    head = doc["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    budget = _gib(head["resources"]["limits"]["memory"]) * 2**30 * prefix_tree.PREFIX_TREES_HEAD_SHARE
    return int(budget // (RANGES["prefill_max_replicas"][1] + RANGES["decode_max_replicas"][1]))


def _traced() -> int:
    return tracemalloc.get_traced_memory()[0]


class _Filler:
    """Text no other tenant holds, in its costliest shape: chains of one-character nodes, each chain inserted
    longest first and then one character shorter each time, so that every insert splits off one node."""

    def __init__(self) -> None:
        self.first = itertools.count(FIRST_CHAR)
        self.clock = itertools.count(time.time())

    def chains(self, tree: Any, tenant: str, chars: int, share: int, start: int) -> None:
        """Grow the tenant to `chars` counted characters, failing as soon as what was traced since `start` passes
        `share`."""
        while (held := tree.tenant_to_char_count[tenant]) < chars:
            length = min(CHAIN, chars - held)
            chain = chr(next(self.first)) + chr(FILLER_CHAR) * (length - 1)
            for end in range(length, 0, -1):
                tree.insert(chain[:end], tenant, float(next(self.clock)))
            assert _traced() - start <= share, f"{tenant} costs more than its share at {held:,} characters"

    def burst(self, tree: Any, tenant: str, share: int, start: int) -> None:
        """One eviction interval's burst: full-length prompts of 4-byte characters, each new to the tree."""
        for _ in range(prefix_tree.PREFIX_TREE_BURST_PROMPTS):
            # Stored at 4 bytes a character for its first one; ASCII after it keeps Ray's character-by-character
            # comparison (os.path.commonprefix) from allocating a str per character under tracemalloc.
            prompt = chr(next(self.first)) + "x" * (prefix_tree.PREFIX_TREE_PROMPT_CHARS - 1)
            tree.insert(prompt, tenant, float(next(self.clock)))
        assert _traced() - start <= share, f"{tenant} costs more than its share after a burst"


@pytest.fixture
def tree_class() -> Iterator[Any]:
    """Ray's PrefixTree, imported before tracing starts (Ray's and vLLM's imports traced take minutes), and
    tracemalloc on for the test."""
    require_serve_deps()
    from ray.llm._internal.serve.routing_policies.prefix_aware.prefix_tree import PrefixTree  # imports ray

    tracemalloc.start()
    try:
        yield PrefixTree
    finally:
        tracemalloc.stop()


def _evict(tree: Any, kwargs: dict[str, Any]) -> None:
    """Ray's eviction loop with the router's options (prefix_aware_router.py, update_replicas), its interval
    shortened: one pass is what matters here, not the wait for it."""
    assert tree.start_eviction_loop(kwargs["eviction_threshold_chars"], kwargs["eviction_target_chars"], 0.01)
    deadline = time.monotonic() + 10
    try:
        while any(n > kwargs["eviction_threshold_chars"] for n in tree.tenant_to_char_count.values()):
            assert time.monotonic() < deadline, "Ray's eviction loop did not run"
            time.sleep(0.01)
    finally:
        tree.stop_eviction_loop()


@pytest.mark.parametrize(
    ("settings", "side"),
    [(Settings(), "prefill"), (Settings(prefill_max_replicas=16, decode_max_replicas=16), "decode")],
    ids=["defaults-prefill", "16-and-16-replicas-decode"],
)
def test_a_replica_at_its_bound_and_a_burst_fit_its_share_of_the_head(
    settings: Settings, side: str, tree_class: Any
) -> None:
    """A side's tree with every replica the settings allow, one of them filled to the router's eviction threshold
    and then grown by one interval's burst, costs that replica at most its share (tenants with text of their own
    share no node, so what one costs is what each costs; a tree of 16 at the bound is ~1 GB under tracemalloc).
    Ray's eviction with the router's options brings it to the target, and filling back to the threshold stays
    within the share."""
    share = _share_bytes()
    kwargs = sizing.prefix_router_kwargs(settings, side)
    assert kwargs["eviction_interval_secs"] == prefix_tree.PREFIX_TREE_EVICTION_INTERVAL_S
    tree = tree_class()
    tenants = [f"{side}-{i}" for i in range(settings.side_max_replicas(side))]
    tree.add_tenants(tenants, time.time())
    filler = _Filler()
    start = _traced()
    threshold = int(kwargs["eviction_threshold_chars"])
    filler.chains(tree, tenants[0], threshold, share, start)
    filler.burst(tree, tenants[0], share, start)
    _evict(tree, kwargs)
    assert tree.tenant_to_char_count[tenants[0]] <= kwargs["eviction_target_chars"]
    filler.chains(tree, tenants[0], threshold, share, start)


def test_the_sizing_reads_the_head_and_the_router_it_sizes() -> None:
    """The head's memory, the prompt's length in the tree and the eviction's interval: the sizing's copies of what
    the RayService, ray_pods/ and Ray set."""
    require_serve_deps()
    import inspect

    from ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router import PrefixCacheAffinityRouter

    from ray_pods.prefix_routing import MAX_TREE_TEXT_CHARS  # imports ray

    doc = rayservice(Settings(), system_node_labels={}, gpu_node_labels={}, gpu_toleration={})
    head = doc["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert _gib(head["resources"]["limits"]["memory"]) == prefix_tree.HEAD_MEMORY_GIB
    assert prefix_tree.PREFIX_TREE_PROMPT_CHARS == MAX_TREE_TEXT_CHARS
    defaults = inspect.signature(PrefixCacheAffinityRouter.initialize_state).parameters
    assert defaults["eviction_interval_secs"].default == prefix_tree.PREFIX_TREE_EVICTION_INTERVAL_S
    # Below one full-length prompt the tree would forget a prompt as it learns it.
    assert prefix_tree.prefix_tree_max_chars() > prefix_tree.PREFIX_TREE_PROMPT_CHARS
