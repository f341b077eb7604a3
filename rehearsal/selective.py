"""The selective-prefill phase: decode prefills a short prompt itself and splits a long one (ray_pods/selective_pd.py).

The pd case deploys with the product's default threshold, 0 (every request split), which every other phase
relies on. This phase sets a threshold as the product synthesizes it (decode's user_config in `deployments`),
PUT to the running app as KubeRay does: Serve must apply it through the running decode replica's `reconfigure`,
with no replica restarted. Then, one request at a time, read from the engines' own counters (prefill's
vllm:prompt_tokens, decode's NIXL transfers): a short prompt moves no KV and prefill never sees it; a long one
goes through prefill and moves KV; a short one with `x-pd-prefill: split` does too. Last, the threshold goes
back to 0 the same way, so that the phases after this one see the app as deployed. Decode's log says how long
counting each prompt took.
"""

from __future__ import annotations

import copy
import json
import re
import statistics
import time
import urllib.request
from dataclasses import dataclass
from typing import Any

from rehearsal.cluster import ray_logs
from rehearsal.context import Context
from rehearsal.deploy import cpu_serve_config, product_rayservice
from rehearsal.network import DECODE_METRICS, PREFILL_METRICS, http, metrics_text
from serve_config.deployments import LOCAL_PREFILL_KEY, PREFILL_ROUTE_HEADER, deployment_name_of, options_of
from tools.checks import Check
from tools.cluster_access import PROMPT_TOKENS, NixlSnapshot, metric_total
from tools.polling import poll_until_grown, settled
from tools.upgrade import replicas_of

# Far above the short prompt's tokens with the chat template, far below the long one's.
THRESHOLD = 64
SHORT_PROMPT = "Count slowly."
# One token a word at least (tokenizers split on spaces first): 200 words are more than THRESHOLD tokens.
LONG_PROMPT = "Please count the apples in this long basket. " * 25
MAX_TOKENS = 4
APPLY_TIMEOUT_S = 120.0
POLL_S = 2.0
# vLLM's prefix-cache hits in tokens (vllm:prefix_cache_hits), as Ray's exporter names it.
PREFIX_CACHE_HITS = "ray_vllm_prefix_cache_hits_total"
ROUTE_LINE = re.compile(r"prefill (local|split) \(([^)]*)\): (\S+) prompt tokens, counted in ([0-9.]+) ms")


def _chat(ctx: Context, prompt: str, headers: dict[str, str] | None = None) -> int:
    """One chat through the endpoint; its HTTP status."""
    body = {
        "model": ctx.model_id,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": MAX_TOKENS,
    }
    sent = {"Content-Type": "application/json", **(headers or {})}
    if ctx.api_key is not None:
        sent["Authorization"] = f"Bearer {ctx.api_key}"
    request = urllib.request.Request(  # noqa: S310 - the rehearsal's own endpoint
        f"{ctx.serve}/v1/chat/completions", data=json.dumps(body).encode(), method="POST", headers=sent
    )
    with urllib.request.urlopen(request, timeout=120) as response:  # noqa: S310
        response.read()
        return int(response.status)


@dataclass(frozen=True)
class Counters:
    """Decode's NIXL transfers, prefill's prompt tokens, and each side's prefix-cache hits (tokens)."""

    transfers: float
    prefill_prompt_tokens: float
    prefill_hits: float
    decode_hits: float


def _read() -> Counters:
    decode, prefill = metrics_text(DECODE_METRICS), metrics_text(PREFILL_METRICS)
    return Counters(
        NixlSnapshot.of(decode).transfers,
        metric_total(prefill, PROMPT_TOKENS) or 0.0,
        metric_total(prefill, PREFIX_CACHE_HITS) or 0.0,
        metric_total(decode, PREFIX_CACHE_HITS) or 0.0,
    )


def _counters() -> Counters:
    """The counters once Ray's export holds still."""
    return settled(_read)


def _with_threshold(ctx: Context, threshold: int) -> dict[str, Any]:
    """The running config with decode's user_config as the product synthesizes it for this threshold."""
    synthesized = cpu_serve_config(product_rayservice({LOCAL_PREFILL_KEY: str(threshold)}), ctx.model_dir)
    decode = deployment_name_of(ctx.model_id, "decode")
    user_config = options_of(synthesized["applications"][0], decode)["user_config"]
    config = copy.deepcopy(ctx.config)
    for entry in config["applications"][0]["deployments"]:
        if entry["name"] == decode:
            entry["user_config"] = user_config
    return config


def _apply(ctx: Context, config: dict[str, Any]) -> tuple[float | None, dict[str, dict[str, str]]]:
    """PUT the config as KubeRay does; seconds until Serve has the app RUNNING with it, and the replicas then."""
    http(f"{ctx.dashboard}/api/serve/applications/", config, method="PUT", timeout=60, headers=ctx.headers)
    began = time.monotonic()
    decode = deployment_name_of(ctx.model_id, "decode")
    wanted = options_of(config["applications"][0], decode)["user_config"]
    while time.monotonic() - began < APPLY_TIMEOUT_S:
        time.sleep(POLL_S)
        live: dict[str, Any] = http(f"{ctx.dashboard}/api/serve/applications/", headers=ctx.headers)
        (app,) = live["applications"].values()
        deployment = (app.get("deployments") or {}).get(decode, {})
        in_force = (deployment.get("deployment_config") or {}).get("user_config")
        if app.get("status") == "RUNNING" and deployment.get("status") == "HEALTHY" and in_force == wanted:
            return round(time.monotonic() - began, 1), replicas_of(live)
    return None, {}


def _replicas(ctx: Context) -> dict[str, dict[str, str]]:
    live: dict[str, Any] = http(f"{ctx.dashboard}/api/serve/applications/", headers=ctx.headers)
    return replicas_of(live)


@dataclass(frozen=True)
class Step:
    """One request: its HTTP status, and what the counters added."""

    status: int
    transfers: float
    prefill_prompt_tokens: float
    prefill_hits: float
    decode_hits: float

    def __str__(self) -> str:
        return (
            f"HTTP {self.status}, {self.transfers:g} NIXL transfers, prefill prompt tokens "
            f"+{self.prefill_prompt_tokens:g}, prefix-cache hits prefill +{self.prefill_hits:g}, "
            f"decode +{self.decode_hits:g}"
        )


def _step(
    ctx: Context, before: Counters, prompt: str, *, split: bool, headers: dict[str, str] | None = None
) -> tuple[Step, Counters]:
    """One request; what it added to the counters, and the counters after it (the next step's before)."""
    status = _chat(ctx, prompt, headers)
    if split:
        # Wait for Ray's export to show its transfer before waiting for the counters to hold still.
        poll_until_grown(
            lambda: NixlSnapshot.of(metrics_text(DECODE_METRICS)), NixlSnapshot(before.transfers, 0.0, 0.0)
        )
    after = _counters()
    added = Step(
        status,
        after.transfers - before.transfers,
        after.prefill_prompt_tokens - before.prefill_prompt_tokens,
        after.prefill_hits - before.prefill_hits,
        after.decode_hits - before.decode_hits,
    )
    return added, after


def selective_check(ctx: Context) -> list[Any]:
    """A threshold set in place; a short prompt prefilled on decode, a long one and a forced one split."""
    if ctx.aggregated:
        return []
    before = _replicas(ctx)
    applied_s, after = _apply(ctx, _with_threshold(ctx, THRESHOLD))
    counters = _counters()
    short, counters = _step(ctx, counters, SHORT_PROMPT, split=False)
    long, counters = _step(ctx, counters, LONG_PROMPT, split=True)
    forced, counters = _step(ctx, counters, SHORT_PROMPT, split=True, headers={PREFILL_ROUTE_HEADER: "split"})
    # The long prompt again: prefill finds it in its prefix cache, and so does decode, which holds the blocks it
    # pulled the first time (vLLM's NixlConnector pulls only the blocks decode lacks).
    again, counters = _step(ctx, counters, LONG_PROMPT, split=True)
    restored_s, restored = _apply(ctx, ctx.config)
    # A replica's line may be in its log file and in its worker's output both: each line once.
    lines = dict.fromkeys(line for line in ray_logs(ctx.temp_dir).splitlines() if ROUTE_LINE.search(line))
    routes = [match.groups() for line in lines if (match := ROUTE_LINE.search(line))]
    counted_ms = [float(ms) for route, reason, _, ms in routes if reason in ("short prompt", "long prompt")]
    tokens = {reason: count for _, reason, count, _ in routes}
    ctx.metrics.update(
        {
            "selective_applied_s": applied_s,
            "selective_count_ms_median": statistics.median(counted_ms) if counted_ms else None,
            "selective_count_ms_max": max(counted_ms) if counted_ms else None,
        }
    )
    ctx.log_lines.append(
        f"local_prefill_max_tokens {THRESHOLD} applied in {applied_s} s, back to 0 in {restored_s} s; short: {short}; "
        f"long: {long}; short with x-pd-prefill: split: {forced}; long again: {again}; tokens counted {tokens}; "
        f"counting took {counted_ms} ms"
    )
    return [
        Check(
            "selective prefill: a new threshold reaches decode in place, no replica restarted",
            applied_s is not None and restored_s is not None and after == before == restored,
            f"applied in {applied_s} s, undone in {restored_s} s; replicas before {before}, after {after}",
        ),
        Check(
            "selective prefill: a short prompt is prefilled on decode, moving no KV",
            short.status == 200 and short.transfers == 0 and short.prefill_prompt_tokens == 0,
            f"{tokens.get('short prompt')} tokens at a threshold of {THRESHOLD}: {short}",
        ),
        Check(
            "selective prefill: a long prompt goes through prefill, moving KV",
            long.status == 200 and long.transfers >= 1 and long.prefill_prompt_tokens > THRESHOLD,
            f"{tokens.get('long prompt')} tokens: {long}",
        ),
        Check(
            "selective prefill: x-pd-prefill: split sends a short prompt through prefill",
            forced.status == 200 and forced.transfers >= 1 and forced.prefill_prompt_tokens > 0,
            str(forced),
        ),
        Check(
            "selective prefill: a long prompt sent again hits the prefix cache on both sides",
            again.status == 200 and again.prefill_hits > 0 and again.decode_hits > 0,
            str(again),
        ),
    ]
