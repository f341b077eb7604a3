"""Sizing: admission, backpressure and draining."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from settings.sizing.calibration import PREFILL_MFU_RANGE
from settings.sizing.memory import kv_cache_tokens, prefill_seconds, vllm_default_max_num_seqs
from settings.sizing.prefix_tree import PREFIX_TREE_EVICTION_INTERVAL_S, prefix_tree_max_chars

if TYPE_CHECKING:
    from settings.model import Settings

# kv_lease_duration).
PREFILL_KV_LEASE_S = 30
# Serve drops a stopping replica from its callers' routers through a long poll; the replicas
# still routed to in that window get a request or two more (an allowance, unmeasured).
ROUTER_UPDATE_ALLOWANCE_S = 5


def _engine_side(side: str) -> str:
    """The memory plan an engine follows: an aggregated engine steps like decode."""
    return "prefill" if side == "prefill" else "decode"


def max_ongoing_requests(s: Settings, side: str) -> int:
    """Requests one engine replica ('prefill', 'decode' or 'aggregated') takes at once: as many
    typical_request_tokens sequences as its KV cache holds, at most vLLM's max_num_seqs, at least one.

    More would wait inside vLLM, out of Serve's sight: they would count as ongoing, so neither
    Serve's queue bound nor its 503 would ever meet them, and a burst would wait there unbounded.
    """
    fits = kv_cache_tokens(s, _engine_side(side)) // s.typical_request_tokens
    return max(1, min(vllm_default_max_num_seqs(s), fits))


def max_queued_requests(s: Settings, side: str) -> int:
    """Requests each caller holds for a side beyond what its replicas take: one replica's worth, so a
    queued request waits for about one request's duration at most before a slot frees."""
    return max_ongoing_requests(s, side)


def engine_admits(s: Settings, side: str) -> int:
    """Requests a side takes at its maximum, running and queued at one caller."""
    return max_ongoing_requests(s, side) * s.side_max_replicas(_engine_side(side)) + max_queued_requests(s, side)


def aggregated_max_ongoing(s: Settings) -> int:
    """Requests aggregated mode's engines take at their maximum, queued at one caller included."""
    replicas = s.side_max_replicas("prefill") + s.side_max_replicas("decode")
    return max_ongoing_requests(s, "aggregated") * replicas + max_queued_requests(s, "aggregated")


def ingress_max_ongoing_requests(s: Settings) -> int:
    """The ingress replica takes everything the engines behind it can hold or queue (the client-facing
    engines: decode, or the aggregated ones), so the bound that refuses a burst is theirs, once."""
    if s.serving_mode == "aggregated":
        return aggregated_max_ongoing(s)
    return engine_admits(s, "decode")


def graceful_shutdown(s: Settings, side: str) -> tuple[float, float]:
    """(graceful_shutdown_wait_loop_s, graceful_shutdown_timeout_s) of a deployment.

    A stopping replica sleeps the wait loop, then checks its ongoing requests, again and again
    until none are left, and is killed at the timeout (serve/_private/replica.py,
    _drain_ongoing_requests). Decode, aggregated and the ingress hold a request for its whole
    generation, which Serve's proxy ends at request_timeout_seconds: the timeout covers that
    (Serve's 20 s default would cut a long stream). Prefill's requests end at their first token,
    but the KV they leave behind is leased for PREFILL_KV_LEASE_S: prefill's first sleep covers
    the lease after the longest prefill that could still be running when it was told to stop, so
    the KV of every request it answered is read or expired before it exits.
    """
    if side != "prefill":
        return 2.0, float(s.request_timeout_seconds + ROUTER_UPDATE_ALLOWANCE_S)
    longest = prefill_seconds(s, s.max_model_len, mfu=PREFILL_MFU_RANGE[0])
    wait = float(math.ceil(PREFILL_KV_LEASE_S + longest + ROUTER_UPDATE_ALLOWANCE_S))
    # A second loop for a request that arrived in the router update window.
    return wait, 2 * wait


# --- The internal NLB during a change: its target group's drain and the ingress pods' preStop ------
# The AWS Load Balancer Controller deregisters an ingress pod's target as soon as the pod is
# terminating (it drops terminating endpoints: pkg/backend/endpoint_resolver.go, v3.2.2), yet the NLB
# keeps opening new connections to a deregistering target for about two minutes whatever its delay
# (measured upstream, kubernetes-sigs/aws-load-balancer-controller#2366 and #3270,
# aws/containers-roadmap#470; AWS documents no figure: unverified here).
NLB_DEREGISTRATION_PROPAGATION_S = 120
# The controller's deregister calls are rate-limited (its default --aws-api-throttle): an allowance
# for a late call, unmeasured.
NLB_DEREGISTRATION_ALLOWANCE_S = 10
# ELB's range for deregistration_delay.timeout_seconds is 0 to 3600 s (the controller's service
# annotations guide, v3.2.2; the NLB user guide, "Deregistration delay").
NLB_MAX_DEREGISTRATION_DELAY_S = 3600
# Left to the Ray container after the preStop, for its own stop on SIGTERM: Kubernetes' default
# terminationGracePeriodSeconds.
RAY_STOP_GRACE_S = 30


def nlb_deregistration_delay(s: Settings) -> int:
    """The internal NLB target group's deregistration delay: the ingress's drain, the longest a request
    may run through it (graceful_shutdown), so a stream on a deregistering target may finish."""
    return math.ceil(graceful_shutdown(s, "ingress")[1])


def nlb_longest_request_timeout(s: Settings) -> int:
    """The longest request_timeout_seconds whose drain an NLB target group's deregistration delay covers."""
    return NLB_MAX_DEREGISTRATION_DELAY_S - (nlb_deregistration_delay(s) - s.request_timeout_seconds)


def ingress_prestop_seconds(s: Settings) -> int:
    """How long an ingress pod behind the NLB sleeps before its Ray container is told to stop: the
    deregistration delay after the last connection the NLB may still open to it, so every stream it
    accepted ends before the pod does."""
    return nlb_deregistration_delay(s) + NLB_DEREGISTRATION_PROPAGATION_S + NLB_DEREGISTRATION_ALLOWANCE_S


# The preStop ends early once the pod holds no open connection on the Serve port, checked this often, and
# only after this many checks in a row find none (an NLB health check's connection lasts a moment).
INGRESS_PRESTOP_POLL_S = 5
INGRESS_PRESTOP_QUIET_POLLS = 2


def ingress_prestop_min_seconds(s: Settings) -> int:
    """The least an ingress pod behind the NLB waits, open connections or not: until the NLB can open no new
    connection to its deregistering target."""
    del s  # the same for every setting; a function so that its callers read it from one home
    return NLB_DEREGISTRATION_PROPAGATION_S + NLB_DEREGISTRATION_ALLOWANCE_S


def ingress_prestop_idle_seconds(s: Settings) -> int:
    """How long the preStop of an ingress pod that holds no connection lasts (a `cdk destroy` without clients)."""
    return ingress_prestop_min_seconds(s) + INGRESS_PRESTOP_QUIET_POLLS * INGRESS_PRESTOP_POLL_S


def ingress_termination_grace_seconds(s: Settings) -> int:
    """The ingress pod's terminationGracePeriodSeconds: the kubelet counts the preStop inside it and
    kills the pod 2 s past it, so it covers the preStop and then Ray's own stop."""
    return ingress_prestop_seconds(s) + RAY_STOP_GRACE_S


# --- One more replica on a new GPU node: the scale-up budget (README "The cost of a burst") -------
# Each term is a range in seconds with where it comes from; nothing here was timed on AWS.


# --- Prefix-aware routing (ray_pods/prefix_routing.py) ------------------------------------------------
# Characters of English text per token under a BPE tokenizer (OpenAI's rule of thumb, "one token is about 4
# characters"): the router's tree counts characters, a replica's KV cache holds tokens.
CHARS_PER_TOKEN = 4
# Ray's own ratio of the tree's eviction target to its trigger (prefix_aware_router.py: 360,000 of 400,000).
PREFIX_TREE_EVICTION_TARGET_RATIO = 0.9


def prefix_router_kwargs(s: Settings, side: str) -> dict[str, float | int | bool]:
    """The router's request_router_kwargs for a side ('prefill' or 'decode'). Only engine settings go in: Serve
    hashes a router's options into the code version, and the bounds, targets and queue sizes change in place.

    - imbalanced_threshold: past this difference between its replicas' queues the router stops following prefixes
      and picks the less loaded of two (Ray's default, infinity, pins every request that shares a system prompt to
      one replica however busy). Prefill: 1. A cache hit saves at most one prompt's prefill, and each request
      queued ahead costs about one, so a replica busier by more than one costs more than its cache saves. Decode:
      the full-length sequences its KV cache holds (at least 1): within that, the busier replica still takes every
      extra request into its running batch, and a step with one sequence more costs little.
    - eviction: on, every PREFIX_TREE_EVICTION_INTERVAL_S, and each replica's share of the tree kept within what
      its KV cache holds, in characters (a prefix the tree remembers past that has most likely been evicted from
      the engine's prefix cache), and within its share of the head's memory for the trees at the worst bytes a
      character (settings/sizing/prefix_tree.py), whichever is less. Ray's default keeps every prompt forever,
      and its 400,000-character trigger is unrelated to either.
    """
    tokens = kv_cache_tokens(s, side)
    imbalance = 1 if side == "prefill" else max(1, tokens // s.max_model_len)
    chars = min(tokens * CHARS_PER_TOKEN, prefix_tree_max_chars())
    return {
        "imbalanced_threshold": float(imbalance),
        "do_eviction": True,
        "eviction_threshold_chars": chars,
        "eviction_target_chars": int(chars * PREFIX_TREE_EVICTION_TARGET_RATIO),
        "eviction_interval_secs": PREFIX_TREE_EVICTION_INTERVAL_S,
    }
