"""A burst past Serve's bounds, on the one deployed app (issue 19, item 2): a clear answer, not an endless queue.

BURST streams are sent at once, twice what the app admits: the ingress's max_ongoing_requests
plus the queue at Serve's proxy (max_queued_requests), both read from the deployed serve config,
as the product sized them (settings/sizing.py). Past them Serve's router raises BackPressureError
and the deployment's backpressure_config answers.

Required: every request ends with 200 and a complete stream, or with the configured status and
Retry-After, and nothing else (no 500, no hang, no stream cut); at least one is refused; most
refusals come at once (the median within REFUSED_WITHIN_S), and none later than the slowest
admitted request took; every admitted request moved its KV over NIXL with none failed; a request
after the burst is answered.

Measured: most refusals come from Serve's proxy at once (the ingress's queue is full), and a few
from inside the ingress after the request waited in that queue (decode's queue at the ingress was
full when it got there: Serve's routers see each replica's load with a lag), as late as the
burst's longest request (8.8 s in one run). Each is still a 503 with Retry-After.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from rehearsal import streams
from rehearsal.context import Context
from rehearsal.network import decode_nixl_counters
from serve_config.deployments import NAME_PREFIXES

MAX_TOKENS = 32
# Most refusals are Serve's router saying no at once, without waiting for an engine.
REFUSED_WITHIN_S = 1.0
# An admitted request waits for decode's engine, which runs 8 sequences at a time on this CPU.
ADMITTED_TIMEOUT_S = 240.0


def admitted_bound(config: dict[str, Any]) -> tuple[int, int, int]:
    """(what the app admits at once, the refusal's status, its Retry-After) from the deployed serve config."""
    (app,) = config["applications"]
    (ingress,) = [d for d in app["deployments"] if not d["name"].startswith(tuple(NAME_PREFIXES.values()))]
    backpressure = ingress["backpressure_config"]
    return (
        int(ingress["max_ongoing_requests"]) + int(ingress["max_queued_requests"]),
        int(backpressure["status_code"]),
        int(backpressure["retry_after_s"]),
    )


def burst_check(ctx: Context) -> list[Any]:
    from tools.verify import Check, poll, settled

    if ctx.aggregated:
        return []
    bound, status, retry_after = admitted_bound(ctx.config)
    burst = 2 * bound
    transfers_before, failed_before = settled(decode_nixl_counters)
    outcomes: list[streams.Outcome] = []
    lock = threading.Lock()
    go = threading.Event()

    def client(number: int) -> None:
        go.wait()
        # A prompt of its own: a shared one would be a prefix-cache hit on decode, with no transfer.
        prompt = f"{number}: {streams.DEFAULT_PROMPT}"
        outcome = streams.stream_chat(ctx, MAX_TOKENS, timeout=ADMITTED_TIMEOUT_S, prompt=prompt)
        with lock:
            outcomes.append(outcome)

    threads = [threading.Thread(target=client, args=(n,), daemon=True) for n in range(burst)]
    for thread in threads:
        thread.start()
    started = time.monotonic()
    go.set()
    for thread in threads:
        thread.join(timeout=ADMITTED_TIMEOUT_S + 30)
    took = time.monotonic() - started
    admitted = [o for o in outcomes if o.status == 200]
    refused = [o for o in outcomes if o.status == status]
    other = [o for o in outcomes if o.status not in (200, status)]
    complete = [o for o in admitted if o.kind == "ok"]
    refusal_times = sorted(o.ended - o.started for o in refused)
    slowest_refusal = refusal_times[-1] if refusal_times else 0.0
    median_refusal = refusal_times[len(refusal_times) // 2] if refusal_times else 0.0
    slowest_admitted = max((o.ended - o.started for o in complete), default=0.0)
    headers = {o.retry_after for o in refused}

    def grown(reading: tuple[float, float]) -> bool:
        return reading[0] + reading[1] - transfers_before - failed_before >= len(complete)

    poll(decode_nixl_counters, grown)
    transfers_after, failed_after = settled(decode_nixl_counters)
    transfers, nixl_failed = transfers_after - transfers_before, failed_after - failed_before
    after = streams.stream_chat(ctx, MAX_TOKENS, timeout=60.0)
    ctx.metrics.update(
        burst_sent=float(burst),
        burst_admitted=float(len(admitted)),
        burst_refused=float(len(refused)),
        burst_median_refusal_s=round(median_refusal, 2),
        burst_slowest_refusal_s=round(slowest_refusal, 2),
        burst_slowest_admitted_s=round(slowest_admitted, 2),
        burst_seconds=round(took, 1),
    )
    ctx.log_lines.append(
        f"burst of {burst} streams (the app admits {bound}): {streams.summary(outcomes)}; Retry-After {headers}; "
        f"refusals after {median_refusal:.2f} s (median), {slowest_refusal:.2f} s (slowest); the slowest admitted "
        f"request took {slowest_admitted:.2f} s; all ended in {took:.1f} s; decode transfers {transfers:g}, "
        f"NIXL failed {nixl_failed:g}; after the burst {after.label()}"
    )
    return [
        Check(
            f"burst: past the bounds a {status} with Retry-After, mostly at once, never after an endless wait",
            bool(refused)
            and headers == {str(retry_after)}
            and median_refusal <= REFUSED_WITHIN_S
            and slowest_refusal <= slowest_admitted,
            f"{len(refused)} of {burst} refused with {status}, Retry-After {headers} (expected {retry_after}); "
            f"refusal after {median_refusal:.2f} s median (limit {REFUSED_WITHIN_S:g} s), {slowest_refusal:.2f} s "
            f"slowest (limit: the slowest admitted request, {slowest_admitted:.2f} s)",
        ),
        Check(
            "burst: every admitted request finished, nothing else came back",
            not other and len(complete) == len(admitted) > 0 and len(outcomes) == burst,
            f"{streams.summary(outcomes)} ({len(admitted)} admitted of a bound of {bound})",
        ),
        Check(
            "burst: each admitted request moved its KV, none failed; the app answers after",
            transfers == len(complete) and nixl_failed == 0 and after.kind == "ok",
            f"decode NIXL transfers {transfers:g} for {len(complete)} requests, failed {nixl_failed:g}; "
            f"after: {after.label()}",
        ),
    ]
