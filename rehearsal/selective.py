"""The selective-prefill phase: decode prefills a short prompt itself and splits a long one (ray_pods/selective_pd.py).

The pd case deploys with a threshold of 0 (every request split; rehearsal/case_settings.py), which every other
phase relies on. This phase sets a threshold as the product synthesizes it (decode's user_config in `deployments`),
PUT to the running app as KubeRay does: Serve must apply it through the running decode replica's `reconfigure`,
with no replica restarted. Then three requests at once, read from the engines' own counters (decode's NIXL
transfers, prefill's vllm:prompt_tokens) after one quiet export: a short prompt, a long one, and another long one
sent with `x-pd-prefill: local`; only the long one may move KV or reach prefill. Decode's route counter must count
each by where and why, and the long prompt sent again must hit both sides' prefix caches. Then short prompts'
TTFT both ways, like with like on the same engines: prefilled on decode by the threshold, and split by the header
(as a threshold of 0 splits them), one at a time and alternating, with each route's median and its bootstrap
interval; only the split ones may move KV. Last, the threshold
goes back to the deployed 0 the same way, so that the phases after this one see the app as deployed. Decode's log
says how long counting each prompt took.
"""

from __future__ import annotations

import copy
import json
import re
import statistics
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from rehearsal.cluster import ray_logs
from rehearsal.context import Context
from rehearsal.deploy import cpu_serve_config, product_rayservice
from rehearsal.network import DECODE_METRICS, PREFILL_METRICS, http, metrics_text
from rehearsal.streams import stream_chat
from serve_config.deployments import LOCAL_PREFILL_KEY, PREFILL_ROUTE_HEADER, deployment_name_of, options_of
from tools.bench_compare import percentile_interval
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
# Short prompts' TTFT both ways: this many of each, alternating which goes first.
TTFT_ROUNDS = 12
TTFT_MAX_TOKENS = 2
LOCAL, SPLIT = "local", "split"
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


def _routes(text: str) -> dict[tuple[str, str], float]:
    """Decode's route counter by (prefill, reason), from its node's scrape."""
    found: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == ROUTES_SERIES:
                key = (sample.labels.get("prefill", ""), sample.labels.get("reason", ""))
                found[key] = found.get(key, 0.0) + sample.value
    return found


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


@dataclass(frozen=True)
class ShortTtfts:
    """Short prompts' TTFT as a client sees it, prefilled on decode and split, and what they moved."""

    seconds: dict[str, list[float]]
    failed: list[str]
    transfers: float
    # How long the requests took, and the wait for Ray's export to show their transfers and hold still.
    sending_s: float
    settling_s: float

    def summary(self) -> dict[str, tuple[float, float, float] | None]:
        """Each route's median TTFT (ms) and its 95% bootstrap interval, and the median of the paired differences
        (split minus local, round by round)."""
        rng = np.random.default_rng(0)
        found: dict[str, tuple[float, float, float] | None] = {}
        for route in (LOCAL, SPLIT):
            values = [s * 1e3 for s in self.seconds[route]]
            found[route] = percentile_interval(values, 50, rng) if values else None
        pairs = [(s - lo) * 1e3 for lo, s in zip(self.seconds[LOCAL], self.seconds[SPLIT], strict=False)]
        found["split - local"] = percentile_interval(pairs, 50, rng) if pairs else None
        return found

    def verdict(self) -> str:
        """By the paired differences (each round's two requests ran back to back on the same engines): a difference
        only where their interval excludes 0."""
        paired = self.summary()["split - local"]
        if paired is None:
            return "no verdict"
        if paired[1] > 0:
            return "local faster (the paired interval is above 0)"
        if paired[2] < 0:
            return "split faster (the paired interval is below 0)"
        return "no difference shown (the paired interval spans 0)"


def _short_ttfts(ctx: Context) -> ShortTtfts:
    """Short prompts at the threshold in force, each new to both prefix caches: prefilled on decode (the threshold
    decides, counting included) and split (the header, as a threshold of 0 splits them), alternating which goes
    first, one at a time."""
    start = _counters()
    began = time.monotonic()
    seconds: dict[str, list[float]] = {LOCAL: [], SPLIT: []}
    failed: list[str] = []
    for round_ in range(TTFT_ROUNDS):
        for route in (LOCAL, SPLIT) if round_ % 2 == 0 else (SPLIT, LOCAL):
            headers = {PREFILL_ROUTE_HEADER: SPLIT} if route == SPLIT else None
            prompt = f"{route} {round_}: {SHORT_PROMPT}"
            outcome = stream_chat(ctx, TTFT_MAX_TOKENS, timeout=120, prompt=prompt, extra_headers=headers)
            if outcome.kind != "ok" or outcome.first_chunk is None:
                failed.append(outcome.label())
                continue
            seconds[route].append(outcome.first_chunk - outcome.started)
    sent = time.monotonic()
    end = _grown(start, transfers=len(seconds[SPLIT]), prompt_tokens=0)
    return ShortTtfts(
        seconds, failed, end.transfers - start.transfers, round(sent - began, 1), round(time.monotonic() - sent, 1)
    )


def interval_ms(found: tuple[float, float, float] | None) -> str:
    """A median and its interval, in ms: '62 ms [57, 66]'."""
    return "none" if found is None else f"{found[0]:.0f} ms [{found[1]:.0f}, {found[2]:.0f}]"


def selective_check(ctx: Context) -> list[Any]:
    """A threshold set in place; a short prompt prefilled on decode, a long one split, a long one kept local by the
    header, and the long one again found in both prefix caches. The first three go at once: one quiet window after
    them shows that only the long one moved KV."""
    if ctx.aggregated:
        return []
    before = _replicas(ctx)
    applied_s, after = _apply(ctx, _with_threshold(ctx, THRESHOLD))
    routes_before = _routes(metrics_text(DECODE_METRICS))
    start = _counters()
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
    routes = poll(
        lambda: _routes(metrics_text(DECODE_METRICS)),
        lambda now: all(now.get(k, 0.0) - routes_before.get(k, 0.0) >= n for k, n in wanted.items()),
    )
    added = {k: routes.get(k, 0.0) - routes_before.get(k, 0.0) for k in sorted({*routes, *routes_before})}
    ttfts = _short_ttfts(ctx)
    restored_s, restored = _apply(ctx, ctx.config)
    # A replica's line may be in its log file and in its worker's output both: each line once.
    lines = dict.fromkeys(line for line in ray_logs(ctx.temp_dir).splitlines() if ROUTE_LINE.search(line))
    logged = [match.groups() for line in lines if (match := ROUTE_LINE.search(line))]
    counted_ms = [float(ms) for _, reason, _, ms in logged if reason in ("short prompt", "long prompt")]
    tokens = {reason: count for _, reason, count, _ in logged}
    ctx.metrics.update(
        {
            "selective_applied_s": applied_s,
            "selective_count_ms_median": statistics.median(counted_ms) if counted_ms else None,
            "selective_count_ms_max": max(counted_ms) if counted_ms else None,
        }
    )
    moved = first.transfers - start.transfers
    prompt_tokens = first.prefill_prompt_tokens - start.prefill_prompt_tokens
    ctx.log_lines.append(
        f"local_prefill_max_tokens {THRESHOLD} applied in {applied_s} s, back to 0 in {restored_s} s; HTTP {statuses}; "
        f"short, long and long with x-pd-prefill: local at once: {moved:g} NIXL transfers, prefill prompt tokens "
        f"+{prompt_tokens:g}; the long again: prefix-cache hits prefill {first.prefill_hits:g} -> "
        f"{again.prefill_hits:g}, decode {first.decode_hits:g} -> {again.decode_hits:g}; routes added {added}; "
        f"tokens counted {tokens}; counting took {counted_ms} ms"
    )
    long_tokens = float(tokens.get("long prompt", "0"))
    summary = ttfts.summary()
    ctx.metrics.update(
        {
            f"selective_short_ttft_{route.replace(' - ', '_minus_')}_ms": None if found is None else round(found[0], 1)
            for route, found in summary.items()
        }
    )
    compared = ", ".join(f"{route} {interval_ms(found)}" for route, found in summary.items())
    ctx.log_lines.append(
        f"short prompts' TTFT, {TTFT_ROUNDS} of each, one at a time, median [95% interval]: {compared}: "
        f"{ttfts.verdict()}; {ttfts.transfers:g} NIXL transfers; failed {ttfts.failed}; sent in {ttfts.sending_s} s, "
        f"settled in {ttfts.settling_s} s"
    )
    wanted_ttfts = len(ttfts.seconds[LOCAL]) == len(ttfts.seconds[SPLIT]) == TTFT_ROUNDS
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
            "selective prefill: short prompts' TTFT measured both ways, and only the split ones moved KV",
            wanted_ttfts and not ttfts.failed and ttfts.transfers == TTFT_ROUNDS,
            f"{len(ttfts.seconds[LOCAL])} local and {len(ttfts.seconds[SPLIT])} split of {TTFT_ROUNDS} each, "
            f"failed {ttfts.failed}; {ttfts.transfers:g} NIXL transfers; TTFT {compared}: {ttfts.verdict()}",
        ),
        Check(
            "selective prefill: a long prompt sent again hits the prefix cache on both sides",
            statuses[3] == 200 and again.prefill_hits > first.prefill_hits and again.decode_hits > first.decode_hits,
            f"HTTP {statuses[3]}; hits (tokens) prefill {first.prefill_hits:g} -> {again.prefill_hits:g}, "
            f"decode {first.decode_hits:g} -> {again.decode_hits:g}",
        ),
    ]
