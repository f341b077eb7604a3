"""The selective-prefill phase: decode prefills a short prompt itself and splits a long one (ray_pods/selective_pd.py).

The pd case deploys with a threshold of 0 (every request split; rehearsal/case_settings.py), which every other
phase relies on. This phase sets a threshold as the product synthesizes it (decode's user_config in `deployments`),
PUT to the running app as KubeRay does: Serve must apply it through the running decode replica's `reconfigure`,
with no replica restarted. First, short and long prompts at one concurrency, always-split against selective on
the same engines (rehearsal/selective_mix.py); its quiet reading after is the baseline of what follows. Then three
requests at once, read from the engines' own counters (decode's NIXL transfers, prefill's vllm:prompt_tokens) after
one quiet export: a short prompt, a long one, and another long one sent with `x-pd-prefill: local`; only the long
one may move KV or reach prefill. Decode's route counter must count each by where and why, and the long prompt sent
again must hit both sides' prefix caches. Last, the threshold goes back to the deployed 0 the same way, so that the
phases after this one see the app as deployed. Decode's log says how long counting each prompt took.
"""

from __future__ import annotations

import copy
import json
import re
import statistics
import time
import urllib.request
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from rehearsal import selective_mix
from rehearsal.cluster import ray_logs
from rehearsal.context import Context
from rehearsal.deploy import cpu_serve_config, product_rayservice
from rehearsal.network import DECODE_METRICS, PREFILL_METRICS, http, metrics_text
from serve_config.deployments import LOCAL_PREFILL_KEY, PREFILL_ROUTE_HEADER, deployment_name_of, options_of
from tools.checks import Check
from tools.cluster_access import PROMPT_TOKENS, NixlSnapshot, metric_total
from tools.polling import poll, settled
from tools.upgrade import replicas_of

# Far above the short prompt's tokens with the chat template, far below the long one's.
THRESHOLD = 64
SHORT_PROMPT = "Count slowly."
# One token a word at least (tokenizers split on spaces first): 200 words are more than THRESHOLD tokens.
LONG_WORDS = 200
LONG_PROMPT = "Please count the apples in this long basket. " * (LONG_WORDS // 8)
# As long, and different from its first word on: no prefix shared with LONG_PROMPT.
OTHER_LONG_PROMPT = "Weigh every pear on that heavy crate slowly. " * (LONG_WORDS // 8)
MAX_TOKENS = 4
APPLY_TIMEOUT_S = 120.0
POLL_S = 2.0
# vLLM's prefix-cache hits in tokens (vllm:prefix_cache_hits), as Ray's exporter names it.
PREFIX_CACHE_HITS = "ray_vllm_prefix_cache_hits_total"
# ray_pods/selective_pd.py's REQUESTS_METRIC, as Ray's exporter names a counter.
ROUTES_SERIES = "ray_pd_prefill_requests_total"
# vLLM's nixl_bytes_transferred histogram's sum, as Ray's exporter names it.
NIXL_BYTES = "ray_vllm_nixl_bytes_transferred_sum"
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
    """Decode's NIXL transfers, prefill's prompt tokens, each side's prefix-cache hits (tokens), and the bytes NIXL
    moved to decode."""

    transfers: float
    prefill_prompt_tokens: float
    prefill_hits: float
    decode_hits: float
    nixl_bytes: float


def _read() -> Counters:
    decode, prefill = metrics_text(DECODE_METRICS), metrics_text(PREFILL_METRICS)
    return Counters(
        NixlSnapshot.of(decode).transfers,
        metric_total(prefill, PROMPT_TOKENS) or 0.0,
        metric_total(prefill, PREFIX_CACHE_HITS) or 0.0,
        metric_total(decode, PREFIX_CACHE_HITS) or 0.0,
        metric_total(decode, NIXL_BYTES) or 0.0,
    )


def _counters() -> Counters:
    """The counters once Ray's export holds still."""
    return settled(_read)


def with_threshold(ctx: Context, threshold: int | None) -> dict[str, Any]:
    """The running config with decode's user_config as the product synthesizes it for this threshold (None: the
    product's default)."""
    overrides = {} if threshold is None else {LOCAL_PREFILL_KEY: str(threshold)}
    synthesized = cpu_serve_config(product_rayservice(overrides), ctx.model_dir)
    decode = deployment_name_of(ctx.model_id, "decode")
    user_config = options_of(synthesized["applications"][0], decode)["user_config"]
    config = copy.deepcopy(ctx.config)
    for entry in config["applications"][0]["deployments"]:
        if entry["name"] == decode:
            entry["user_config"] = user_config
    return config


def apply_config(ctx: Context, config: dict[str, Any]) -> tuple[float | None, dict[str, dict[str, str]]]:
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


def _routes(text: str) -> dict[tuple[str, str], float]:
    """Decode's route counter by (prefill, reason), from its node's scrape."""
    found: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == ROUTES_SERIES:
                key = (sample.labels.get("prefill", ""), sample.labels.get("reason", ""))
                found[key] = found.get(key, 0.0) + sample.value
    return found


def _logged(ctx: Context) -> dict[str, tuple[str, ...]]:
    """Decode's route lines so far, each once (a replica's line may be in its log file and its worker's output
    both): (route, reason, tokens, ms) by line."""
    lines = dict.fromkeys(line for line in ray_logs(ctx.temp_dir).splitlines() if ROUTE_LINE.search(line))
    return {line: match.groups() for line in lines if (match := ROUTE_LINE.search(line))}


def _counted_ms(logged: Iterable[tuple[str, ...]]) -> list[float]:
    """How long counting took, for the requests the threshold decided (a header skips the count)."""
    return [float(ms) for _, reason, _, ms in logged if reason in ("short prompt", "long prompt")]


def _spread(values: list[float]) -> str:
    if not values:
        return "none"
    return f"median {statistics.median(values):.1f} ms, max {max(values):.1f} ms"


def _routes_grown(
    before: dict[tuple[str, str], float], wanted: dict[tuple[str, str], float]
) -> dict[tuple[str, str], float]:
    """Decode's route counter once Ray's export shows at least the wanted growth by (prefill, reason)."""
    return poll(
        lambda: _routes(metrics_text(DECODE_METRICS)),
        lambda now: all(now.get(k, 0.0) - before.get(k, 0.0) >= n for k, n in wanted.items()),
    )


def _added(before: dict[tuple[str, str], float], now: dict[tuple[str, str], float]) -> dict[tuple[str, str], float]:
    """The growth by (prefill, reason), where there was any."""
    return {k: now.get(k, 0.0) - before.get(k, 0.0) for k in sorted({*now, *before}) if now.get(k) != before.get(k)}


def _grown(before: Counters, *, transfers: float, prompt_tokens: float) -> Counters:
    """The counters once Ray's export shows at least this much growth, then holds still for one export."""
    poll(
        _read,
        lambda now: (
            now.transfers >= before.transfers + transfers
            and now.prefill_prompt_tokens >= before.prefill_prompt_tokens + prompt_tokens
        ),
    )
    return _counters()


def selective_check(ctx: Context) -> list[Any]:
    """A threshold set in place; the mix of short and long prompts; a short prompt prefilled on decode, a long one
    split, a long one kept local by the header, and the long one again found in both prefix caches. The three go at
    once: one quiet window after them shows that only the long one moved KV."""
    if ctx.aggregated:
        return []
    before = _replicas(ctx)
    applied_s, after = apply_config(ctx, with_threshold(ctx, THRESHOLD))
    mix_start = _counters()
    routes_at_start = _routes(metrics_text(DECODE_METRICS))
    # Short and long prompts at one concurrency first: the quiet reading after it is the next requests' baseline.
    mix = selective_mix.send(ctx, selective_mix.SELECTIVE_ROUTES, selective_mix.BLOCKS)
    mix_routes = selective_mix.expected_routes(selective_mix.BLOCKS)
    start = _grown(mix_start, transfers=selective_mix.expected_transfers(selective_mix.BLOCKS), prompt_tokens=0)
    routes_before = _routes_grown(routes_at_start, mix_routes)
    mix.transfers, mix.nixl_bytes = start.transfers - mix_start.transfers, start.nixl_bytes - mix_start.nixl_bytes
    mixed = selective_mix.selective_checks(ctx, mix, _added(routes_at_start, routes_before))
    under_load = _logged(ctx)
    with ThreadPoolExecutor(3) as pool:
        sent = [
            pool.submit(_chat, ctx, SHORT_PROMPT),
            pool.submit(_chat, ctx, LONG_PROMPT),
            pool.submit(_chat, ctx, OTHER_LONG_PROMPT, {PREFILL_ROUTE_HEADER: "local"}),
        ]
        statuses = [future.result() for future in sent]
    # The long prompt's tokens as prefill counts them: the lower bound is the words (one token each at least).
    first = _grown(start, transfers=1, prompt_tokens=LONG_WORDS)
    # The long prompt again: prefill finds it in its prefix cache, and so does decode, which holds the blocks it
    # pulled the first time (vLLM's NixlConnector pulls only the blocks decode lacks).
    statuses.append(_chat(ctx, LONG_PROMPT))
    again = poll(_read, lambda now: now.prefill_hits > first.prefill_hits and now.decode_hits > first.decode_hits)
    wanted = {("local", "short prompt"): 1.0, ("local", "header"): 1.0, ("split", "long prompt"): 2.0}
    added = _added(routes_before, _routes_grown(routes_before, wanted))
    restored_s, restored = apply_config(ctx, ctx.config)
    # Counted one or two at a time, and in the mix's selective blocks with three others in flight.
    alone = [groups for line, groups in _logged(ctx).items() if line not in under_load]
    tokens = {reason: count for _, reason, count, _ in alone}
    counted_ms = _counted_ms(alone)
    counted_under_load_ms = _counted_ms(under_load.values())
    ctx.metrics.update(
        {
            "selective_applied_s": applied_s,
            "selective_count_ms_median": statistics.median(counted_ms) if counted_ms else None,
            "selective_count_ms_median_under_load": (
                statistics.median(counted_under_load_ms) if counted_under_load_ms else None
            ),
            "selective_count_ms_max": max(counted_ms + counted_under_load_ms, default=None),
        }
    )
    moved = first.transfers - start.transfers
    prompt_tokens = first.prefill_prompt_tokens - start.prefill_prompt_tokens
    ctx.log_lines.append(
        f"local_prefill_max_tokens {THRESHOLD} applied in {applied_s} s, back to 0 in {restored_s} s; HTTP {statuses}; "
        f"short, long and long with x-pd-prefill: local at once: {moved:g} NIXL transfers, prefill prompt tokens "
        f"+{prompt_tokens:g}; the long again: prefix-cache hits prefill {first.prefill_hits:g} -> "
        f"{again.prefill_hits:g}, decode {first.decode_hits:g} -> {again.decode_hits:g}; routes added {added}; "
        f"tokens counted {tokens}; counting took {counted_ms} ms; in the mix's selective blocks, "
        f"{len(counted_under_load_ms)} counts with 3 others in flight: {_spread(counted_under_load_ms)}"
    )
    long_tokens = float(tokens.get("long prompt", "0"))
    return [
        Check(
            "selective prefill: a new threshold reaches decode in place, no replica restarted",
            applied_s is not None and restored_s is not None and after == before == restored,
            f"applied in {applied_s} s, undone in {restored_s} s; replicas before {before}, after {after}",
        ),
        Check(
            "selective prefill: a short prompt and a long one sent with x-pd-prefill: local move no KV, "
            "a long one moves it through prefill",
            statuses[:3] == [200, 200, 200] and moved == 1 and prompt_tokens == long_tokens > THRESHOLD,
            f"{tokens.get('short prompt')} and {long_tokens:g} tokens at a threshold of {THRESHOLD}, sent at once: "
            f"HTTP {statuses[:3]}, {moved:g} NIXL transfers, prefill prompt tokens +{prompt_tokens:g}",
        ),
        Check(
            "selective prefill: decode counts each request by where it was prefilled and why",
            all(added.get(k, 0.0) == n for k, n in wanted.items()),
            f"ray_pd_prefill_requests_total added {added}",
        ),
        Check(
            "selective prefill: a long prompt sent again hits the prefix cache on both sides",
            statuses[3] == 200 and again.prefill_hits > first.prefill_hits and again.decode_hits > first.decode_hits,
            f"HTTP {statuses[3]}; hits (tokens) prefill {first.prefill_hits:g} -> {again.prefill_hits:g}, "
            f"decode {first.decode_hits:g} -> {again.decode_hits:g}",
        ),
        *mixed,
    ]
