"""The decode node goes away and comes back, on the one deployed app (issue 23, item 3).

Every process in node B's network namespace (its raylet, its workers, decode's replica and
engine) is killed at once, as when the node fails; DOWN_S later Ray is started there again
with decode's resource, as KubeRay recreates the worker pod on a new node. Recorded: what
callers saw, how long until the app answers again, and decode's counters afterwards.
Required: the app answers again, every request afterwards succeeds with NIXL failing none,
no stream cut without an error. Node A (the head and prefill) is not this case: losing it
is losing the cluster, as there is no GCS fault tolerance here.
"""

from __future__ import annotations

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

# How long the node stays away: longer than the GCS takes to call a node dead (health checks every
# 3 s, 5 misses), so that Serve sees the replica die rather than a blip.
DOWN_S = 30.0
# From the stop: the node's time away, node B's Ray start, decode's new replica (engine start and
# pre-warm), with the margin of rehearsal/margins.py.
RECOVER_WITHIN_S = NODE_RECOVERY.limit_s


def node_loss_check(ctx: Context) -> list[Any]:
    from tools.verify import Check

    if ctx.nodes is None or ctx.restart_node_b is None:
        raise RuntimeError("node loss needs the rehearsal's nodes")
    before = counters()
    with streams.Traffic(ctx, TRAFFIC, MAX_TOKENS) as traffic:
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
    mid = counters()
    after = [streams.stream_chat(ctx, MAX_TOKENS, timeout=AFTER_TIMEOUT_S) for _ in range(AFTER if back else 0)]
    end = settled_counters(mid, expect=len(after))
    since_restart = None if back is None else round(back - (restarted - stopped), 1)
    ctx.metrics.update(
        node_loss_recovery_s=None if back is None else round(back, 1),
        node_loss_recovery_after_restart_s=since_restart,
        node_loss_processes_killed=float(killed),
        node_loss_cut_without_error=float(len(cut)),
    )
    ctx.log_lines.append(
        f"node B stopped ({killed} processes) for {DOWN_S:.0f} s: callers saw {streams.summary(around)}; "
        f"Serve while it was down: {while_down}; answering again {back} s after the stop ({since_restart} s after "
        f"node B's Ray was started again); after {streams.summary(after)}; counters before {before}, "
        f"after {mid}, at the end {end}"
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
        served_after("decode node lost and back", after, mid, end),
    ]
