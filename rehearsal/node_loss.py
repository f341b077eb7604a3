"""The decode node goes away and comes back, on the one deployed app.

Every process in node B's network namespace (its raylet, its workers, decode's replica and
engine) is killed at once, as when the node fails; DOWN_S later Ray is started there again
with decode's resource, as KubeRay recreates the worker pod on a new node. Recorded: what
callers saw, how long until the app answers again, and decode's counters afterwards.
Required: the app answers again, every request afterwards succeeds with NIXL failing none,
no stream cut without an error. Node A (the head and prefill) is not this case: losing it
is losing the cluster, as there is no GCS fault tolerance here.

One more stream enters through node B's own Serve proxy, as a client of a Service selecting every
ray.io/serve=true pod could (KubeRay labels every RayService worker so). It must end cut without
the error event: the proxy the ingress would send it through is gone with the node, which is why
the product's endpoint selects the ingress group alone (serve_config.ingress_selector).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

from rehearsal import streams
from rehearsal.cluster import stop_node_b
from rehearsal.context import Context
from rehearsal.engine_deaths import (
    AFTER,
    AFTER_TIMEOUT_S,
    MAX_TOKENS,
    TRAFFIC,
    WARM_S,
    counters,
    deployment_states,
    recovered,
    served_after,
    settled_counters,
)
from rehearsal.margins import NODE_RECOVERY
from rehearsal.network import WORKER_IP
from serve_config import SERVE_PORT
from tools.checks import Check

# How long the node stays away: longer than the GCS takes to call a node dead (health checks every
# 3 s, 5 misses), so that Serve sees the replica die rather than a blip.
DOWN_S = 30.0
# From the stop: the node's time away, node B's Ray start, decode's new replica (engine start and
# pre-warm), with the margin of rehearsal/margins.py.
RECOVER_WITHIN_S = NODE_RECOVERY.limit_s
# Serve runs a proxy on every node that holds a replica (proxy_location EveryNode, Serve's default
# and the product's; serve/_private/controller.py _update_proxy_nodes), on the serve port of all
# addresses (http_options.host 0.0.0.0): decode's node has one.
NODE_B_PROXY = f"http://{WORKER_IP}:{SERVE_PORT}"
# Still streaming when node B stops WARM_S later: about 13 ms a token here (rehearsal/disconnects.py).
OWN_PROXY_MAX_TOKENS = 4096


def error_event(outcome: streams.Outcome) -> bool:
    """Whether the stream carried an error event: stream_chat keeps the event's JSON object, and a
    transport failure (the connection closed mid-stream, a timeout) as `<exception>: <text>`."""
    return outcome.error.startswith("{")


def cut_without_error_event(outcome: streams.Outcome) -> bool:
    """A 200 stream that streamed, then ended with no `data: [DONE]` and no error event."""
    return outcome.status == 200 and outcome.chunks > 0 and not outcome.done and not error_event(outcome)


def _through_node_b_proxy(ctx: Context, into: list[streams.Outcome]) -> threading.Thread:
    """One long stream through node B's own Serve proxy, started now in a thread."""
    via_b = dataclasses.replace(ctx, serve=NODE_B_PROXY)
    thread = threading.Thread(
        target=lambda: into.append(streams.stream_chat(via_b, OWN_PROXY_MAX_TOKENS, timeout=AFTER_TIMEOUT_S)),
        daemon=True,
    )
    thread.start()
    return thread


def node_loss_check(ctx: Context) -> list[Any]:
    if ctx.nodes is None or ctx.restart_node_b is None:
        raise RuntimeError("node loss needs the rehearsal's nodes")
    before = counters()
    own_proxy: list[streams.Outcome] = []
    with streams.Traffic(ctx, TRAFFIC, MAX_TOKENS) as traffic:
        own_proxy_thread = _through_node_b_proxy(ctx, own_proxy)
        time.sleep(WARM_S)
        stopped = time.monotonic()
        killed = stop_node_b(ctx.nodes)
        time.sleep(DOWN_S)
        while_down = deployment_states(ctx)
        restarted = time.monotonic()
        ctx.restart_node_b()
        back = recovered(ctx, stopped, RECOVER_WITHIN_S)
    around = [o for o in traffic.outcomes if o.ended >= stopped]
    cut = [o for o in around if o.kind == "cut"]
    own_proxy_thread.join(timeout=AFTER_TIMEOUT_S)
    (via_b,) = own_proxy or [streams.Outcome(stopped, error="no outcome: the client was still waiting")]
    mid = counters()
    after = [streams.stream_chat(ctx, MAX_TOKENS, timeout=AFTER_TIMEOUT_S) for _ in range(AFTER if back else 0)]
    end = settled_counters(mid, expect=len(after))
    since_restart = None if back is None else round(back - (restarted - stopped), 1)
    ctx.metrics.update(
        node_loss_recovery_s=None if back is None else round(back, 1),
        node_loss_recovery_after_restart_s=since_restart,
        node_loss_processes_killed=float(killed),
        node_loss_cut_without_error=float(len(cut)),
        node_loss_own_proxy_cut_without_error_event=float(cut_without_error_event(via_b)),
    )
    ctx.log_lines.append(
        f"node B stopped ({killed} processes) for {DOWN_S:.0f} s: callers saw {streams.summary(around)}; "
        f"Serve while it was down: {while_down}; answering again {back} s after the stop ({since_restart} s after "
        f"node B's Ray was started again); after {streams.summary(after)}; counters before {before}, "
        f"after {mid}, at the end {end}; through node B's own proxy: {_own_proxy_detail(via_b, stopped)}"
    )
    return [
        Check(
            "decode node lost and back: the app answers again",
            back is not None,
            f"{killed} processes of node B killed; answering again after the stop: "
            f"{NODE_RECOVERY.used(back) if back is not None else f'not within {RECOVER_WITHIN_S:.0f} s'}; "
            f"{since_restart} s after its Ray started again; while down: {while_down}",
        ),
        Check("decode node lost and back: no stream cut without an error", not cut, streams.summary(around)),
        Check(
            "decode node lost: a stream through decode's own proxy is cut without the error event",
            cut_without_error_event(via_b) and via_b.started < stopped <= via_b.ended,
            _own_proxy_detail(via_b, stopped),
        ),
        served_after("decode node lost and back", after, mid, end),
    ]


def _own_proxy_detail(outcome: streams.Outcome, stopped: float) -> str:
    shown = outcome.error.replace("\n", " ")[:80] or "no transport error"
    done = "seen" if outcome.done else "not seen"
    event = "seen" if error_event(outcome) else "none"
    return (
        f"{NODE_B_PROXY}: HTTP {outcome.status}, {outcome.chunks} chunks, [DONE] {done}, error event {event}, "
        f"ended {outcome.ended - stopped:+.1f} s from the stop ({shown})"
    )
