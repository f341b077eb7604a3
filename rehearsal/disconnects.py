"""Clients that hang up mid-stream, on the one deployed app: the engines give their KV cache back.

Twenty streaming chats start at once; each client reads its stream
for HOLD_S after the first chunk, longer than one metrics export, and closes the
connection while the engine is still generating. Both engines' KV-cache use (and their
running and waiting requests) must return to idle within IDLE_WITHIN_S: vLLM 0.26
leases prefill's blocks for 30 s after its one-token answer (nixl/base_scheduler.py),
and Ray exports gauges every few seconds. Then NIXL has failed nothing and a new request works.

Half the clients send the two headers with which Serve's proxy would let a stream outlive the
drain: no timeout, and no cancel on a hang-up. The product's ingress stops their generation all the
same (ray_pods/stream_guard.py), so the one idle check holds for them too, in the same time.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from typing import Any
from urllib.parse import urlsplit

from rehearsal.context import Context
from rehearsal.margins import ENGINES_IDLE
from rehearsal.network import DECODE_METRICS, PREFILL_METRICS, metrics_text
from tools.checks import Check
from tools.cluster_access import NixlSnapshot
from tools.polling import export_interval_seconds

STREAMS = 20
# Far longer than the clients stay: an engine that ignored the hang-ups would generate for minutes
# (measured here: about 13 ms a token at one stream, slower at eight), and miss IDLE_WITHIN_S.
MAX_TOKENS = 4096
# The 30 s prefill lease, Ray's export and a margin.
IDLE_WITHIN_S = ENGINES_IDLE.limit_s
# Each client reads this long after its first chunk before hanging up (generation takes longer).
HOLD_S = 12.0
GAUGES = ("ray_vllm_kv_cache_usage_perc", "ray_vllm_num_requests_running", "ray_vllm_num_requests_waiting")
# What Serve's proxy reads before any ingress sees the request (Ray 2.58 serve/_private/constants.py,
# SERVE_HTTP_REQUEST_TIMEOUT_S_HEADER and SERVE_HTTP_REQUEST_DISCONNECT_DISABLED_HEADER; http_util.py):
# 0 turns its timeout off, ?1 stops it cancelling the call when the client hangs up.
OUTLIVE_THE_DRAIN = {"x-request-timeout-seconds": "0", "x-request-disconnect-disabled": "?1"}
# The clients that send them (client_headers): every other one.
WITH_HEADERS = STREAMS // 2


def busy(text: str) -> dict[str, float]:
    """Each gauge of GAUGES summed over the engines in one node's scrape (absent: 0)."""
    totals = dict.fromkeys(GAUGES, 0.0)
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in totals:
            totals[name] += float(line.rsplit(" ", 1)[1])
    return totals


def _idle(readings: dict[str, dict[str, float]]) -> bool:
    return all(value == 0.0 for node in readings.values() for value in node.values())


def _read() -> dict[str, dict[str, float]]:
    return {node: busy(metrics_text(url)) for node, url in (("prefill", PREFILL_METRICS), ("decode", DECODE_METRICS))}


def _hang_up(serve: str, body: bytes, headers: dict[str, str], seen: list[str]) -> None:
    """One client: start a stream, read its first chunk, then close the connection mid-stream."""
    parts = urlsplit(serve)
    connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=120)
    try:
        connection.request("POST", "/v1/chat/completions", body=body, headers=headers)
        response = connection.getresponse()
        first = response.readline() if response.status == 200 else b""
        seen.append(f"{response.status}:{'chunk' if first.startswith(b'data:') else 'none'}")
        # Keep reading past one metrics export, so the load shows in the gauges, then leave mid-stream.
        holding = time.monotonic()
        while first and time.monotonic() - holding < HOLD_S and response.readline():
            pass
    except OSError as err:
        seen.append(f"error:{type(err).__name__}")
    finally:
        connection.close()


def disconnects_check(ctx: Context) -> list[Any]:
    """Twenty streams cut by their clients: the engines return to idle, NIXL fails nothing, service goes on."""

    headers = {"Content-Type": "application/json"}
    if ctx.api_key is not None:
        headers["Authorization"] = f"Bearer {ctx.api_key}"
    chat = {"model": ctx.model_id, "messages": [{"role": "user", "content": "Tell me a long story."}]}
    body = json.dumps({**chat, "max_tokens": MAX_TOKENS, "stream": True, "ignore_eos": True}).encode()
    failed_before = NixlSnapshot.of(metrics_text(DECODE_METRICS)).failed or 0.0
    seen: list[str] = []
    # The gauges must be seen busy while the streams run, or "back to idle" would prove nothing.
    peak = dict.fromkeys(GAUGES, 0.0)
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.is_set():
            for name, value in _read()["decode"].items():
                peak[name] = max(peak[name], value)
            sampling.wait(0.5)

    sampler = threading.Thread(target=sample)
    sampler.start()
    # The clients with the headers keep their own record, so the check can tell them apart.
    seen_with_headers: list[str] = []
    clients = [
        threading.Thread(
            target=_hang_up,
            args=(ctx.serve, body, sent, seen_with_headers if OUTLIVE_THE_DRAIN.items() <= sent.items() else seen),
        )
        for sent in client_headers(headers)
    ]
    for client in clients:
        client.start()
    for client in clients:
        client.join(timeout=180)
    left = time.monotonic()
    # Idle counts once it has held for longer than Ray's export interval: a stale export is not idle.
    still_s = export_interval_seconds() + 2.0
    idle_since: float | None = None
    readings = _read()
    while time.monotonic() - left < IDLE_WITHIN_S + still_s:
        now = time.monotonic()
        if not _idle(readings):
            idle_since = None
        elif idle_since is None:
            idle_since = now
        elif now - idle_since > still_s:
            break
        time.sleep(1.0)
        readings = _read()
    sampling.set()
    sampler.join()
    settled_idle = idle_since is not None and time.monotonic() - idle_since > still_s
    back = (idle_since or time.monotonic()) - left
    cut_with_headers = seen_with_headers.count("200:chunk")
    seen += seen_with_headers
    ctx.metrics.update(
        disconnect_streams_cut=float(seen.count("200:chunk")),
        disconnect_streams_cut_with_headers=float(cut_with_headers),
        disconnect_back_to_idle_s=round(back, 1),
        disconnect_decode_peak_kv_usage=peak["ray_vllm_kv_cache_usage_perc"],
        disconnect_decode_peak_running=peak["ray_vllm_num_requests_running"],
    )
    failed_after = NixlSnapshot.of(metrics_text(DECODE_METRICS)).failed or 0.0
    status = _good_request(ctx, headers, chat)
    cut = seen.count("200:chunk")
    return [
        Check(
            "disconnects: every client got its stream started, then hung up",
            cut == STREAMS and cut_with_headers == WITH_HEADERS,
            f"{cut} of {STREAMS} streamed a first chunk before hanging up ({sorted(set(seen))}), "
            f"{cut_with_headers} of the {WITH_HEADERS} that sent {_named(OUTLIVE_THE_DRAIN)}",
        ),
        Check(
            "disconnects: decode's gauges saw the streams",
            peak["ray_vllm_num_requests_running"] > 0 and peak["ray_vllm_kv_cache_usage_perc"] > 0,
            f"peak while streaming: {peak}",
        ),
        Check(
            f"disconnects: both engines back to idle within {IDLE_WITHIN_S:.0f} s",
            settled_idle and back <= IDLE_WITHIN_S,
            f"idle {back:.1f} s after the last client left ({ENGINES_IDLE.used(back)}), held {still_s:.0f} s "
            f"(Ray exports every {export_interval_seconds():.0f} s), "
            f"{WITH_HEADERS} of the {STREAMS} streams with {_named(OUTLIVE_THE_DRAIN)}; "
            f"{readings}",
        ),
        Check("disconnects: no NIXL failure", failed_after == failed_before, f"{failed_before} -> {failed_after}"),
        Check("disconnects: a new request still succeeds", status == 200, f"HTTP {status}"),
    ]


def client_headers(headers: dict[str, str]) -> list[dict[str, str]]:
    """Each client's request headers: every other one adds OUTLIVE_THE_DRAIN, so both kinds start, hold
    and hang up together (WITH_HEADERS of them)."""
    return [{**headers, **OUTLIVE_THE_DRAIN} if index % 2 else dict(headers) for index in range(STREAMS)]


def _named(headers: dict[str, str]) -> str:
    return " and ".join(f"{name}: {value}" for name, value in headers.items())


def _good_request(ctx: Context, headers: dict[str, str], chat: dict[str, Any]) -> int:
    parts = urlsplit(ctx.serve)
    connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=120)
    try:
        connection.request("POST", "/v1/chat/completions", body=json.dumps({**chat, "max_tokens": 8}), headers=headers)
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()
