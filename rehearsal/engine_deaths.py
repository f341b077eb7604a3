"""An engine dies mid-stream, on the one deployed app: what callers see, and how Serve brings the side back.

Clients keep TRAFFIC streams in flight; the side's vLLM engine
process (EngineCore, a child of its Serve replica, found through /proc in that node's own
network namespace) is killed with SIGKILL, as an OOM kill or a GPU fault would end it.
Ray LLM's health check (every 10 s, llm_server.py check_health) then fails, and Serve
replaces the replica. Recorded: what each request in flight got, the time until requests
succeed again, the NIXL counters and KV-cache use before and after. Required: requests
after the restart all succeed with NIXL failing none of them, and no stream is cut without an error.

The pd case kills prefill's engine alone. Decode's engine is lost twice elsewhere in the case: killed in its pre-warm
as the case deploys (rehearsal/faults.py) and with its node (rehearsal/node_loss.py), where the streams it held
must end with an error and the new replica must serve. Killing it alone too, as the case did until 2026-12-05, costs
a third restart of decode (80-230 s) and showed nothing those two do not: the same health check and replacement as
prefill's, and open streams ending with an error event as in the node's loss.

Without ray_pods/nixl_incarnation.py the prefill case does not recover (measured with
Ray 2.58, vLLM 0.26, NIXL 1.3.1): Serve replaces the replica in about 30 s and the new
prefill answers, but decode knows its NIXL name (the dead engine's, as Ray names by node
and rank) and reads through the dead engine's agent. The read never completes: vLLM 0.26
polls a transfer in state PROC with no deadline (nixl/base_worker.py, _pop_done_transfers),
so every request from then on hangs, with no error, no failure counted and decode's worker
busy (vllm-project/vllm#49238).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from typing import Any

from rehearsal import streams
from rehearsal.context import Context
from rehearsal.disconnects import busy
from rehearsal.margins import ENGINE_RECOVERY
from rehearsal.network import DECODE_METRICS, PREFILL_METRICS, http, metrics_text
from tools.checks import Check
from tools.cluster_access import NixlSnapshot

TRAFFIC = 4
MAX_TOKENS = 48
# Streams run before the kill, so that the fault meets requests at every stage.
WARM_S = 8.0
# Serve's health check period (10 s), then a replica's restart on this CPU (rehearsal/margins.py).
RECOVER_WITHIN_S = ENGINE_RECOVERY.limit_s
# Requests sent one after another once the side is back: each must succeed and move its KV over NIXL.
AFTER = 6
# One such request, with a margin: a request that takes longer is stuck.
AFTER_TIMEOUT_S = 60.0


def deployment_states(ctx: Context) -> dict[str, str]:
    """Each deployment of the product's app: its status and replica states, as Serve reports them."""
    live = http(f"{ctx.dashboard}/api/serve/applications/", headers=ctx.headers)
    found = {}
    for app in live["applications"].values():
        for name, deployment in (app.get("deployments") or {}).items():
            found[name] = f"{deployment['status']} {deployment.get('replica_states', {})}"
    return found


def node_namespace(ctx: Context, side: str) -> str:
    if ctx.nodes is None:
        raise RuntimeError("the fault phases need the rehearsal's nodes")
    return ctx.nodes.node_b_namespace if side == "decode" else os.readlink("/proc/self/ns/net")


def counters() -> dict[str, Any]:
    """Decode's NIXL counters and both sides' KV-cache use, now."""

    decode, prefill = metrics_text(DECODE_METRICS), metrics_text(PREFILL_METRICS)
    nixl = NixlSnapshot.of(decode)
    return {
        "transfers": nixl.transfers,
        "nixl_failed": nixl.failed,
        "kv_prefill": busy(prefill)["ray_vllm_kv_cache_usage_perc"],
        "kv_decode": busy(decode)["ray_vllm_kv_cache_usage_perc"],
    }


def _engine_pid(ctx: Context, side: str, timeout: float = 60.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = streams.engine_processes(side, node_namespace(ctx, side))
        if len(found["engines"]) == 1:
            return found["engines"][0]
        time.sleep(1.0)
    raise RuntimeError(f"{side}: no single engine process found ({found})")


def recovered(ctx: Context, since: float, timeout: float) -> float | None:
    """Seconds from `since` until three requests in a row succeed (each its own stream); None: never."""
    deadline = since + timeout
    good = 0
    while time.monotonic() < deadline:
        outcome = streams.stream_chat(ctx, 8, timeout=max(5.0, deadline - time.monotonic()))
        good = good + 1 if outcome.kind == "ok" else 0
        if good == 3:
            return outcome.ended - since
        if outcome.kind != "ok":
            time.sleep(2.0)
    return None


def engine_death(side: str) -> Callable[[Context], list[Any]]:
    """The phase for one side: kill its engine while TRAFFIC streams run."""

    def phase(ctx: Context) -> list[Any]:
        before = counters()
        old_engine = _engine_pid(ctx, side)
        with streams.Traffic(ctx, TRAFFIC, MAX_TOKENS) as traffic:
            time.sleep(WARM_S)
            killed = time.monotonic()
            with contextlib.suppress(ProcessLookupError):
                os.kill(old_engine, signal.SIGKILL)
            back = recovered(ctx, killed, RECOVER_WITHIN_S)
        outcomes = traffic.outcomes
        before_kill = [o for o in outcomes if o.ended < killed]
        around = [o for o in outcomes if o.ended >= killed]
        states = deployment_states(ctx)
        new_engine = _engine_pid(ctx, side)
        mid = counters()
        # Not back: no more requests, each would hang as the ones before did (see the module's docstring).
        after = [streams.stream_chat(ctx, MAX_TOKENS, timeout=AFTER_TIMEOUT_S) for _ in range(AFTER if back else 0)]
        end = settled_counters(mid, expect=len(after))
        cut = [o for o in around if o.kind == "cut"]
        metric = f"{side}_death"
        ctx.metrics.update(
            {
                f"{metric}_recovery_s": None if back is None else round(back, 1),
                f"{metric}_in_flight_errors": float(sum(o.kind == "error" for o in around)),
                f"{metric}_cut_without_error": float(len(cut)),
                f"{metric}_nixl_failed_before": before["nixl_failed"],
                f"{metric}_nixl_failed_after": end["nixl_failed"],
            }
        )
        ctx.log_lines.append(
            f"{side} engine killed (pid {old_engine} -> {new_engine}): before the kill {streams.summary(before_kill)}; "
            f"from the kill on {streams.summary(around)}; back after {back} s; after {streams.summary(after)}; "
            f"counters before {before}, after the restart {mid}, at the end {end}; deployments {states}"
        )
        return [
            Check(
                f"{side} engine killed mid-stream: Serve replaced it",
                new_engine != old_engine and back is not None,
                f"engine pid {old_engine} -> {new_engine}; requests succeed again after the kill: "
                f"{ENGINE_RECOVERY.used(back) if back is not None else f'not within {RECOVER_WITHIN_S:.0f} s'}; "
                f"deployments {states}",
            ),
            Check(
                f"{side} engine killed mid-stream: no stream cut without an error",
                not cut,
                f"from the kill on: {streams.summary(around)}",
            ),
            served_after(f"{side} engine killed mid-stream", after, mid, end),
        ]

    phase.__name__ = f"{side}_death_check"
    return phase


def served_after(case: str, after: list[streams.Outcome], mid: dict[str, Any], end: dict[str, Any]) -> Any:
    """The check that the app is whole again: AFTER requests in a row, each complete, each moving its KV
    over NIXL, none failed (`mid` and `end`: the counters before and after them)."""

    return Check(
        f"{case}: every request afterwards succeeds, NIXL fails none",
        len(after) == AFTER
        and all(o.kind == "ok" for o in after)
        and end["nixl_failed"] == mid["nixl_failed"]
        and end["transfers"] - mid["transfers"] >= AFTER,
        f"{streams.summary(after)}; decode NIXL transfers {mid['transfers']:g} -> {end['transfers']:g}, "
        f"failed {mid['nixl_failed']:g} -> {end['nixl_failed']:g}",
    )


def settled_counters(start: dict[str, Any], expect: int, timeout: float = 60.0) -> dict[str, Any]:
    """Counters once Ray has exported the last requests' transfers (or their failures), or after the timeout."""
    deadline = time.monotonic() + timeout
    now = counters()
    while time.monotonic() < deadline:
        moved = now["transfers"] - start["transfers"] + now["nixl_failed"] - start["nixl_failed"]
        if moved >= expect:
            break
        time.sleep(2.0)
        now = counters()
    return now


prefill_death_check = engine_death("prefill")
