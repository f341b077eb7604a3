"""Prefill scales with the traffic, 1 -> 2 -> 1, on the scaling case's one deployed app.

The case deploys the product with a range on prefill (case_settings.SCALING_SETTINGS: prefill_max_replicas 2,
prefill_target_ongoing_requests 2, as a user sets them) and only the documented deltas: the CPU
deltas and SCALING_DELTAS (rehearsal/deploy.py: Serve's delays, shortened). Serve's own autoscaler
decides every step from its request-based signal; nothing here tells Serve how many replicas to run.

First (bound_change_check), the target is changed as a `cdk deploy` changes it: the product is
synthesized with CHANGED_TARGET, the two serve configs may differ only in the application's
`deployments` list, and that list is PUT to the running app as KubeRay does. Serve must apply it in
place: the new target in force, every replica the one it was, the app RUNNING throughout.

The capacity for the second replica: node C, a third network namespace with prefill's resource
and one replica's CPUs, as Ray's autoscaler starts a pod of the prefill group and Cluster
Autoscaler a node for it (their part is tested on the synthesized template: tests/test_scaling.py).

Load: LOAD clients, each sending prefill-heavy streams one after another (a long prompt of its own,
so that no prefix cache spares a transfer, and a short answer). Once two replicas serve, prefill's minimum is held
at two in place and, after the load, the prefix-routing runs (rehearsal/prefix_affinity.py) send prompts that
share prefixes to both, prefix-aware and by power of two choices side by side; then the minimum goes back to one
and the side must return to one replica while idle.
The case's surge phase (rehearsal/surge.py) then starts a prefill replica where one stopped before, on
the same node and likely the same rank, so the same NIXL name as the one that stopped without
ray_pods/nixl_incarnation.py (vllm#49238): decode must still shake hands with it, and that phase checks every
engine's name.

Recorded: the prefill replicas over time (state and node), each step's time, the prompt tokens the
new replica computed, decode's NIXL counters, and what every client got. Required: each step
happens within its limit; the new replica computed prompts whose KV decode read; every request
succeeded (none cut, none refused), decode's transfers equal the requests, NIXL failed none.
"""

from __future__ import annotations

import contextlib
import copy
import random
import re
import string
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rehearsal import prefix_affinity, streams
from rehearsal.case_settings import SCALING_SETTINGS
from rehearsal.cluster import start_worker, stop_node_b
from rehearsal.context import Context
from rehearsal.deploy import apply_scaling_deltas, cpu_serve_config, product_rayservice
from rehearsal.margins import SCALE_DOWN, SCALE_UP
from rehearsal.network import (
    HEAD_IP,
    NODE_C_IFACE,
    NODE_C_IP,
    NODE_C_METRICS,
    PREFILL_METRICS,
    WORKER_IP,
    decode_nixl_counters,
    http,
    metrics_text,
    third_node,
)
from serve_config.deployments import deployment_name_of
from tools.checks import Check
from tools.cluster_access import PROMPT_TOKENS, metric_total
from tools.polling import settled

SIDE = "prefill"
LOAD = 6
MAX_TOKENS = 4
# The target the case deploys with (case_settings.SCALING_SETTINGS) and the one bound_change_check sets in place.
CHANGED_TARGET = "1"
# How long the app is watched after the change: Serve's reconfigure of a running replica is immediate.
WATCH_AFTER_CHANGE_S = 20.0
# Words of a prompt: about 1,500 tokens with the rehearsal's tokenizer, three of the CPU engines'
# 512-token steps, so that a request spends most of its time in prefill.
PROMPT_WORDS = 400
# Up: Serve's upscale delay and metrics push (rehearsal/deploy.py SCALING_DELTAS; 10 s), then a new
# engine's start on this CPU beside two busy ones. Down: Serve's downscale delay, the metrics push,
# prefill's drain (graceful_shutdown_wait_loop_s: the KV lease after the longest prefill, 39 s on the
# defaults). Each limit is the slowest run seen with its margin (rehearsal/margins.py).
UP_WITHIN_S = SCALE_UP.limit_s
DOWN_WITHIN_S = SCALE_DOWN.limit_s
# Load kept on two replicas, so that the new one serves for a while (10 s until the prefix-routing run followed it
# on both replicas: the new one computed 33,702 prompt tokens in those 10 s).
SERVE_ON_TWO_S = 5.0
POLL_S = 2.0
PREFILL_LOG = streams.DEPLOYMENTS[SIDE]
NIXL_NAME = re.compile(rf"NIXL engine id ({SIDE}-\S+) \(was ({SIDE}-\S+)\)")


def prompt(rng: random.Random) -> str:
    words = ("".join(rng.choices(string.ascii_lowercase, k=rng.randint(3, 8))) for _ in range(PROMPT_WORDS))
    return "Summarise: " + " ".join(words)


@dataclass
class Timeline:
    """The side's replicas as Serve reports them, every POLL_S, in the background."""

    ctx: Context
    deployment: str
    seen: list[tuple[float, dict[str, tuple[str, str]]]] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def replicas(self) -> dict[str, tuple[str, str]]:
        """replica id -> (state, node IP)."""
        live = http(f"{self.ctx.dashboard}/api/serve/applications/", headers=self.ctx.headers)
        for app in live["applications"].values():
            deployment = (app.get("deployments") or {}).get(self.deployment)
            if deployment is not None:
                return {r["replica_id"]: (r["state"], r.get("node_ip") or "") for r in deployment.get("replicas", [])}
        return {}

    def _poll(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(OSError, ValueError, KeyError):
                self.seen.append((time.monotonic() - self.started, self.replicas()))
            self._stop.wait(POLL_S)

    def __enter__(self) -> Timeline:
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def wait_for(self, running: int, timeout: float) -> float | None:
        """Seconds until exactly `running` replicas are RUNNING and no other exists; None: not within timeout."""
        began = time.monotonic()
        while time.monotonic() - began < timeout:
            if self.seen:
                states = [state for state, _ in self.seen[-1][1].values()]
                if states.count("RUNNING") == running == len(states):
                    return round(time.monotonic() - began, 1)
            time.sleep(POLL_S / 2)
        return None

    def changes(self) -> list[str]:
        """The replica counts over time, one entry each time they change: `t=12s 1 RUNNING 1 STARTING`."""
        shown, last = [], ""
        for moment, replicas in self.seen:
            states: dict[str, int] = {}
            for state, _ in replicas.values():
                states[state] = states.get(state, 0) + 1
            text = " ".join(f"{n} {s}" for s, n in sorted(states.items()))
            if text != last:
                shown.append(f"t={moment:.0f}s {text}")
                last = text
        return shown

    def nodes_of(self) -> dict[str, str]:
        """Every replica ever seen, with the node it ran on."""
        found: dict[str, str] = {}
        for _, replicas in self.seen:
            for replica_id, (_, node) in replicas.items():
                if node:
                    found[replica_id] = node
        return found


# Each node's own exporter: node A holds the first prefill replica (and the head and ingress, no engine).
NODE_METRICS = {HEAD_IP: PREFILL_METRICS, NODE_C_IP: NODE_C_METRICS}


def _prompt_tokens() -> dict[str, float]:
    """Prompt tokens computed on each prefill node (each node holds at most one prefill replica)."""

    return {node: metric_total(metrics_text(url), PROMPT_TOKENS) or 0.0 for node, url in NODE_METRICS.items()}


def _deployments_of(ctx: Context) -> tuple[dict[str, Any], str]:
    """The app's deployments as Serve reports them (status, options in force, replicas), and its status."""
    live = http(f"{ctx.dashboard}/api/serve/applications/", headers=ctx.headers)
    (app,) = live["applications"].values()
    return dict(app["deployments"]), str(app["status"])


def bound_change_check(ctx: Context) -> list[Any]:
    """A changed bound reaches the running app in place: no replica restarts."""

    deployed = product_rayservice(SCALING_SETTINGS)
    changed = product_rayservice({**SCALING_SETTINGS, f"{SIDE}_target_ongoing_requests": CHANGED_TARGET})
    before_cpu, after_cpu = (cpu_serve_config(r, ctx.model_dir) for r in (deployed, changed))
    (old_app,), (new_app,) = before_cpu["applications"], after_cpu["applications"]
    elsewhere = sorted(k for k in {*old_app, *new_app} if k != "deployments" and old_app.get(k) != new_app.get(k))
    outside_app = {
        k for k in {*before_cpu, *after_cpu} if k != "applications" and before_cpu.get(k) != after_cpu.get(k)
    }
    config = copy.deepcopy(ctx.config)
    config["applications"][0]["deployments"] = new_app["deployments"]
    apply_scaling_deltas(config)
    replicas_before = {name: {r["replica_id"] for r in d["replicas"]} for name, d in _deployments_of(ctx)[0].items()}
    # A client streams through the change (one: more could scale prefill before node C is there): a restart,
    # or a replica cut from the routers, would show.
    with streams.Traffic(ctx, 1, MAX_TOKENS) as traffic:
        http(f"{ctx.dashboard}/api/serve/applications/", config, method="PUT", timeout=60, headers=ctx.headers)
        statuses: list[str] = []
        began = time.monotonic()
        while time.monotonic() - began < WATCH_AFTER_CHANGE_S:
            found, status = _deployments_of(ctx)
            statuses.append(status)
            time.sleep(POLL_S)
    bad = [o for o in traffic.outcomes if o.kind != "ok"]
    replicas_after = {name: {r["replica_id"] for r in d["replicas"]} for name, d in found.items()}
    deployment = deployment_name_of(ctx.model_id, SIDE)
    in_force = float(found[deployment]["deployment_config"]["autoscaling_config"]["target_ongoing_requests"])
    ctx.config = config
    ctx.log_lines.append(
        f"{SIDE}_target_ongoing_requests changed in place to {CHANGED_TARGET}: the serve configs differ only in "
        f"`deployments` ({elsewhere or 'nothing else'}{sorted(outside_app) or ''}); target in force {in_force}; "
        f"app status over {WATCH_AFTER_CHANGE_S:.0f} s {sorted(set(statuses))} (Serve says DEPLOYING while it applies "
        f"a config), ending {statuses[-1]}; replicas before {replicas_before}, after {replicas_after}; clients "
        f"meanwhile {streams.summary(traffic.outcomes)}"
    )
    return [
        Check(
            "bound change: the synthesized serve configs differ only in `deployments`",
            not elsewhere and not outside_app and old_app["deployments"] != new_app["deployments"],
            f"other keys that differ: {elsewhere + sorted(outside_app) or 'none'}",
        ),
        Check(
            "bound change: applied in place, every replica kept, every request served",
            in_force == float(CHANGED_TARGET)
            and replicas_after == replicas_before
            and statuses[-1] == "RUNNING"
            and bool(traffic.outcomes)
            and not bad,
            f"target in force {in_force} (set {CHANGED_TARGET}); app ending {statuses[-1]}; replicas kept: "
            f"{replicas_after == replicas_before} ({sum(len(v) for v in replicas_after.values())} replicas); "
            f"clients meanwhile {streams.summary(traffic.outcomes)}",
        ),
    ]


def prefill_names(temp_dir: Path) -> list[tuple[str, str]]:
    """(the NIXL name given, the one Ray alone would have given) of each prefill replica that started.

    ray_pods/nixl_incarnation.py logs both once per engine start, in the replica's own Serve log (the
    same line stands in its worker's .err too, so the Serve logs alone are read, one file a replica)."""
    found: list[tuple[str, str]] = []
    for path in sorted((temp_dir / "session_latest" / "logs" / "serve").glob(f"replica_llm_{PREFILL_LOG}_*.log")):
        found += sorted(set(NIXL_NAME.findall(path.read_text(errors="replace"))))
    return found


def with_prefill_minimum(ctx: Context, minimum: int) -> dict[str, Any]:
    """The running config with prefill's autoscaling minimum set: a bound, which Serve applies in place. (The
    product refuses `prefill_replicas` equal to its maximum with a target, so the rehearsal sets Serve's own
    field, as bound_change_check showed a bound reaches the app.)"""
    config = copy.deepcopy(ctx.config)
    name = deployment_name_of(ctx.model_id, SIDE)
    (entry,) = [d for d in config["applications"][0]["deployments"] if d["name"] == name]
    entry["autoscaling_config"]["min_replicas"] = minimum
    return config


def _put(ctx: Context, config: dict[str, Any]) -> None:
    http(f"{ctx.dashboard}/api/serve/applications/", config, method="PUT", timeout=60, headers=ctx.headers)


def scaling_check(ctx: Context) -> list[Any]:
    if ctx.nodes is None:
        raise RuntimeError("the scaling phase needs the rehearsal's nodes")
    deployment = deployment_name_of(ctx.model_id, SIDE)
    rng = random.Random(19)  # noqa: S311 - prompts, not secrets
    lock = threading.Lock()

    def next_prompt() -> str:
        with lock:
            return prompt(rng)

    steps: dict[str, float | None] = {}
    outcomes: list[streams.Outcome] = []
    routed: list[prefix_affinity.Run] = []
    with third_node(ctx.nodes) as node_c, Timeline(ctx, deployment) as timeline:
        try:
            start_worker(ctx.env, ctx.temp_dir, node_c, ip=NODE_C_IP, iface=NODE_C_IFACE, resources={SIDE: 1})
            transfers_before, failed_before = settled(decode_nixl_counters)
            sets = [set(timeline.replicas())]
            tokens = [_prompt_tokens()]
            for step, running, loaded in (("1 -> 2 under load", 2, True), ("2 -> 1 idle", 1, False)):
                if steps and list(steps.values())[-1] is None:
                    steps[step] = None
                    continue
                if loaded:
                    with streams.Traffic(ctx, LOAD, MAX_TOKENS, prompt=next_prompt) as load:
                        steps[step] = timeline.wait_for(running, UP_WITHIN_S)
                        sets.append(set(timeline.replicas()))
                        time.sleep(SERVE_ON_TWO_S)
                        if steps[step] is not None:
                            # Held at two before the load stops, for the prefix-routing run on both replicas.
                            _put(ctx, with_prefill_minimum(ctx, 2))
                    outcomes += load.outcomes
                    tokens.append(_prompt_tokens())
                    if steps[step] is not None:
                        routed = prefix_affinity.measure(ctx)
                        outcomes += [o for run in routed for o in run.outcomes]
                        _put(ctx, ctx.config)
                else:
                    steps[step] = timeline.wait_for(running, DOWN_WITHIN_S)
                    sets.append(set(timeline.replicas()))
                    tokens.append(_prompt_tokens())
            # No request since the prefix-routing runs, whose last reading held still: its counters are the phase's.
            transfers_after, failed_after = routed[-1].decode_node_after if routed else settled(decode_nixl_counters)
        finally:
            stop_node_b(node_c)
    nodes = timeline.nodes_of()
    # The replica the load added, and the prompt tokens its node computed while the load ran.
    added = [sets[1] - sets[0]] if len(sets) == 3 else []
    windows = [(tokens[0], tokens[1])] if len(tokens) == 3 else []
    served = [
        {nodes.get(r, "?"): after.get(nodes.get(r, ""), 0.0) - before.get(nodes.get(r, ""), 0.0) for r in new}
        for new, (before, after) in zip(added, windows, strict=True)
    ]
    transfers = transfers_after - transfers_before
    nixl_failed = failed_after - failed_before
    bad = [o for o in outcomes if o.kind != "ok"]
    completed = len(outcomes) - len(bad)
    ctx.metrics.update(
        scaling_up_s=steps["1 -> 2 under load"],
        scaling_down_s=steps["2 -> 1 idle"],
        scaling_requests=float(len(outcomes)),
        scaling_failed=float(len(bad)),
        scaling_nixl_transfers=transfers,
        scaling_nixl_failed=nixl_failed,
    )
    ctx.log_lines.append(
        f"prefill replicas over time: {', '.join(timeline.changes())}; steps (s): {steps}; replicas by node: "
        f"{nodes}; prompt tokens by each new replica's node: {served}; "
        f"callers saw {streams.summary(outcomes)}; decode transfers {transfers:g}, NIXL failed {nixl_failed:g}"
    )
    limits = {"1 -> 2 under load": SCALE_UP, "2 -> 1 idle": SCALE_DOWN}
    found = [
        Check(
            f"scaling: prefill {step}",
            seconds is not None,
            limits[step].used(seconds) if seconds is not None else f"not within {limits[step].limit_s:.0f} s",
        )
        for step, seconds in steps.items()
    ]
    found.append(
        Check(
            "scaling: the new prefill replica computed prompts that decode read over NIXL",
            len(served) == 1 and all(len(one) == 1 and min(one.values()) > 0 for one in served),
            f"prompt tokens by the new replica's node while the load ran: {served} (decode is on {WORKER_IP})",
        )
    )
    if routed:
        prefix_affinity.report(ctx, routed)
        found += [check for run in routed for check in prefix_affinity.run_checks(run)]
    found.append(
        Check(
            "scaling: every request succeeded, one NIXL transfer each, none failed",
            not bad and completed > 0 and transfers == completed and nixl_failed == 0,
            f"{streams.summary(outcomes)}; decode NIXL transfers {transfers:g} for {completed} requests, "
            f"failed {nixl_failed:g}",
        )
    )
    return found
