"""A burst past Serve's bounds, on the one deployed app: a clear answer, not an endless queue.

BURST streams are sent at once, twice what the app admits: the ingress's max_ongoing_requests
plus the queue at Serve's proxy (max_queued_requests), both read from the deployed serve config,
as the product sized them (settings/sizing/). Past them Serve's router raises BackPressureError
and the deployment's backpressure_config answers.

Required: every request ends with 200 and a complete stream, or with the configured status and
Retry-After, and nothing else (no 500, no hang, no stream cut); at least one is refused; most
refusals come at once (the median refusal within REFUSAL_RATIO of the median admitted request,
both in this run: a ratio holds on a slower machine where an absolute time would not), and none
later than the slowest admitted request took; every admitted request moved its KV over NIXL with none failed; a request
after the burst is answered.

Measured: most refusals come from Serve's proxy at once (the ingress's queue is full), and a few
from inside the ingress after the request waited in that queue (decode's queue at the ingress was
full when it got there: Serve's routers see each replica's load with a lag), as late as the
burst's longest request (8.8 s in one run). Each is still a 503 with Retry-After.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from rehearsal import streams
from rehearsal.context import Context
from rehearsal.network import decode_nixl_counters
from serve_config.deployments import NAME_PREFIXES
from tools.checks import Check
from tools.polling import poll, settled

MAX_TOKENS = 32
# Most refusals are Serve's router saying no at once, without waiting for an engine: the median
# refusal takes at most this share of the median admitted request's time.
REFUSAL_RATIO = 1 / 3
# An admitted request waits for decode's engine, which runs 8 sequences at a time on this CPU.
ADMITTED_TIMEOUT_S = 240.0


@dataclass(frozen=True)
class RefusalTiming:
    """How long refusals and admitted requests took in one burst, and whether refusals came at once."""

    median_refusal: float
    slowest_refusal: float
    median_admitted: float
    slowest_admitted: float

    @classmethod
    def of(cls, refusals: list[float], admitted: list[float]) -> RefusalTiming:
        refusals, admitted = sorted(refusals), sorted(admitted)
        return cls(
            median_refusal=refusals[len(refusals) // 2] if refusals else 0.0,
            slowest_refusal=refusals[-1] if refusals else 0.0,
            median_admitted=admitted[len(admitted) // 2] if admitted else 0.0,
            slowest_admitted=admitted[-1] if admitted else 0.0,
        )

    @property
    def ratio(self) -> float:
        """The median refusal's time as a share of the median admitted request's."""
        return self.median_refusal / self.median_admitted if self.median_admitted > 0 else float("inf")

    def at_once(self) -> bool:
        """Most refusals far faster than an admitted request, none slower than the slowest admitted one."""
        return self.ratio <= REFUSAL_RATIO and self.slowest_refusal <= self.slowest_admitted

    def detail(self) -> str:
        headroom = REFUSAL_RATIO / self.ratio if self.ratio > 0 else float("inf")
        return (
            f"median refusal {self.median_refusal:.2f} s, {self.ratio:.3f} of the median admitted request's "
            f"{self.median_admitted:.2f} s (limit {REFUSAL_RATIO:.3f}: {headroom:.1f}x headroom); slowest refusal "
            f"{self.slowest_refusal:.2f} s (limit: the slowest admitted request, {self.slowest_admitted:.2f} s)"
        )


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
    timing = RefusalTiming.of([o.ended - o.started for o in refused], [o.ended - o.started for o in complete])
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
        burst_median_refusal_s=round(timing.median_refusal, 2),
        burst_slowest_refusal_s=round(timing.slowest_refusal, 2),
        burst_median_admitted_s=round(timing.median_admitted, 2),
        burst_slowest_admitted_s=round(timing.slowest_admitted, 2),
        burst_refusal_ratio=round(timing.ratio, 3),
        burst_seconds=round(took, 1),
    )
    ctx.log_lines.append(
        f"burst of {burst} streams (the app admits {bound}): {streams.summary(outcomes)}; Retry-After {headers}; "
        f"{timing.detail()}; all ended in {took:.1f} s; decode transfers {transfers:g}, "
        f"NIXL failed {nixl_failed:g}; after the burst {after.label()}"
    )
    return [
        Check(
            f"burst: past the bounds a {status} with Retry-After, mostly at once, never after an endless wait",
            bool(refused) and headers == {str(retry_after)} and timing.at_once(),
            f"{len(refused)} of {burst} refused with {status}, Retry-After {headers} (expected {retry_after}); "
            f"{timing.detail()}",
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
