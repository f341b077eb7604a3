"""Sizing: the prefix router's trees (ray_pods/prefix_routing.py), in bytes of the Ray head's memory.

Ray's tree evicts by characters: every `eviction_interval_secs` it brings each tenant (one replica of the
deployment) above `eviction_threshold_chars` down to `eviction_target_chars`, oldest first
(routing_policies/prefix_aware/prefix_tree.py, _run_eviction_loop). What a character costs depends on the
prompts: a node is an object and four dicts, and holds at least one character of its tenants' counts, so the
costliest tree is one node per character. The bound here is that worst case, so no traffic can push the
trees past their share of the head.
"""

from __future__ import annotations

# The Ray head container's memory limit (serve_config/rayservice.yaml; tests/test_prefix_tree_bound.py keeps the
# synthesized RayService equal to it). Both trees live there: their actor prefers the head.
HEAD_MEMORY_GIB = 8
# The trees' share of the head: 2 of its 8 GiB. Ray reserves 30% of a node's memory for its object store
# (filled only by what is put on the head: little, as no replica runs there), and the rest holds the GCS, the
# raylet, the dashboard, Serve's controller and proxy and the two tree actors' own interpreters, about 3.6 GiB
# for processes that use a few hundred MB each (an estimate: the head's memory was not measured under load).
# tracemalloc counts what Python asked for; the tree's freed nodes leave pymalloc arenas partly used, so the
# process's resident size sits somewhat above the traced bytes, and the rest of the head absorbs that.
PREFIX_TREES_HEAD_SHARE = 0.25
# Bytes of a tree per character of its tenants' counts, at worst: 1,051 measured with tracemalloc on Ray 2.58's
# PrefixTree (2026-12-06), one tenant, a chain of one-character nodes of astral characters (each node an object,
# its four dicts and a 4-byte str: the prompts inserted longest first, each one character shorter, so every
# insert splits off one node); 1,043 for CJK, 889 for ASCII (its one-character strs are CPython's cached ones),
# 869 for 20,000 distinct one-character prompts, 816 for a binary trie. The same chain shared by two tenants
# costs 622 a counted character, and realistic prompts far less: 1.1 for distinct 4,000-character prompts
# (3.3 in emoji), 40 for distinct 30-character ones, 60 for a 2,000-character system prompt with 20-character
# suffixes. Rounded up.
PREFIX_TREE_WORST_BYTES_PER_CHAR = 1_100
# A long prompt's own text: CPython stores a str at 1, 2 or 4 bytes a character, by its widest character.
PREFIX_TREE_TEXT_BYTES_PER_CHAR = 4
# The characters of a prompt the tree sees: ray_pods/prefix_routing.py's MAX_TREE_TEXT_CHARS
# (tests/test_prefix_tree_bound.py keeps them equal; settings/ cannot import ray_pods/).
PREFIX_TREE_PROMPT_CHARS = 32_768
# Ray's interval between two eviction passes (prefix_aware_router.py's default, passed explicitly).
PREFIX_TREE_EVICTION_INTERVAL_S = 10
# Between two passes a tenant grows past its threshold by what its replica is sent. A prompt that adds text to
# the tree is text the replica lacks, so it is prefilled or pulled: 100 full-length prompts in one interval
# (10 a second, ~82k prompt tokens a second) is more than one replica prefills on any GPU in the catalog
# (p5.48xlarge: 8,192 tokens in ~0.27 s at the best MFU), or pulls at 5-10 GB/s (Qwen3-8B: 1.2 GB of KV a
# prompt). The reserve this sets aside, ~13 MB a replica, also holds ~6,000 requests that each split off two
# one-character nodes (600 a second to one replica).
PREFIX_TREE_BURST_PROMPTS = 100


def prefix_trees_budget_bytes() -> int:
    """Bytes of the head's memory for both sides' trees together."""
    return int(HEAD_MEMORY_GIB * 2**30 * PREFIX_TREES_HEAD_SHARE)


def prefix_tree_max_tenants() -> int:
    """The most tenants both trees hold together: each side's largest maximum replicas the settings allow. Not the
    settings' own maxima: the router's options are in Serve's code version, and a replica bound changes in place
    (docs/operations.md, "Upgrades"); a character bound that followed it would restart every replica."""
    from settings.rules.bounds import RANGES  # here, not at the top: settings.rules imports settings.sizing

    return RANGES["prefill_max_replicas"][1] + RANGES["decode_max_replicas"][1]


def prefix_tree_burst_bytes() -> int:
    """What one tenant may add between two eviction passes, at most: PREFIX_TREE_BURST_PROMPTS inserts, each a
    full-length prompt of 4-byte characters and the two nodes an insert makes at most (a leaf and a split)."""
    per_insert = PREFIX_TREE_PROMPT_CHARS * PREFIX_TREE_TEXT_BYTES_PER_CHAR + 2 * PREFIX_TREE_WORST_BYTES_PER_CHAR
    return PREFIX_TREE_BURST_PROMPTS * per_insert


def prefix_tree_max_chars() -> int:
    """The most characters one tenant (replica) may hold at an eviction pass: its share of the trees' budget, less
    one interval's burst, at the worst bytes a character. Every tenant of both trees at this bound, each grown
    by a burst, fits the budget."""
    per_tenant = prefix_trees_budget_bytes() // prefix_tree_max_tenants()
    return (per_tenant - prefix_tree_burst_bytes()) // PREFIX_TREE_WORST_BYTES_PER_CHAR
