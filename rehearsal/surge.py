"""An engine setting changed under load, with a surge replica on each side: no admitted request fails.

The scaling case's last phase. Its settings give both sides a range (case_settings.SCALING_SETTINGS),
so both have room for one replica more. The change is `gpu_memory_utilization`, an engine setting:
it changes the builder's args, so Serve's code version of every deployment, and every replica restarts
(tools/change_impact.py says "replicas restarted" for it). It is deployed as `make upgrade` deploys it
(tools/upgrade.py): the product synthesized with the change and `replica_surge=true`, that serve config
PUT to the running app as KubeRay does, a wait until no replica of before is left, then the product
synthesized with the change alone, PUT again: the minimums back down in place, Serve stopping the surplus
as in any scale-down and keeping a new replica a side that already ran.

Node C comes back with room for one replica of each side, as Ray's autoscaler adds a worker pod within
the group's maximum. The ingress restarts too (the args changed), with a surge replica of its own on node A,
as the ingress group's maximum holds one pod more (rehearsal/cluster.py, NODE_A_RESOURCES). LOAD clients
stream through the ingress throughout. Recorded: each deployment's replicas over time, the slowest request
served, and what every client got: served, refused (503, the bounds) or failed. Required: no admitted request
failed, the ingress never without a RUNNING replica, every replica of before replaced, the app RUNNING again
with one replica a deployment, each a new one that already ran.
"""

from __future__ import annotations

import copy
import time
from typing import Any

from rehearsal import streams
from rehearsal.case_settings import SCALING_SETTINGS
from rehearsal.cluster import NODE_B_CPUS, start_worker, stop_node_b
from rehearsal.context import Context
from rehearsal.deploy import apply_scaling_deltas, cpu_serve_config, product_rayservice
from rehearsal.margins import SURGE
from rehearsal.network import NODE_C_IFACE, NODE_C_IP, http, third_node
from rehearsal.scaling import Timeline, prefill_names
from serve_config import SIDES
from serve_config.deployments import deployment_name_of, ingress_deployment_name
from settings import Settings
from tools.checks import Check
from tools.upgrade import minimums_in_force, replicas_of, rolled_over

ENGINE_CHANGE = {"gpu_memory_utilization": "0.85"}
# Two clients, back to back: load throughout. The two new engines start beside it on this machine's two cores in
# 5-6 min, with two clients or four, and with two pausing 0.5 s between requests too (their starts, not the load,
# fill the cores).
LOAD = 2
MAX_TOKENS = 8
POLL_S = 2.0
# Load kept on the new replicas once the minimums are back down.
SERVE_AFTER_S = 10.0
REFUSED = (503,)


def _synthesized(ctx: Context, overrides: dict[str, str]) -> dict[str, Any]:
    app: dict[str, Any] = cpu_serve_config(product_rayservice({**SCALING_SETTINGS, **overrides}), ctx.model_dir)[
        "applications"
    ][0]
    return app


def _changed(ctx: Context, base: dict[str, Any], overrides: dict[str, str]) -> tuple[dict[str, Any], list[str]]:
    """The running config with what the product changes for `overrides`: the engines' kwargs that differ and
    the `deployments` list (the rest of the running config keeps the rehearsal's own paths, the keys file's
    among them). Also every other key of the synthesized app that differs: the check wants none."""
    new = _synthesized(ctx, overrides)
    config = copy.deepcopy(ctx.config)
    app = config["applications"][0]
    for side in SIDES:
        old_kwargs, new_kwargs = (a["args"][f"{side}_config"]["engine_kwargs"] for a in (base, new))
        for key, value in new_kwargs.items():
            if old_kwargs.get(key) != value:
                app["args"][f"{side}_config"]["engine_kwargs"][key] = value
    app["deployments"] = new["deployments"]
    apply_scaling_deltas(config)
    for a in (base, new):
        for side in SIDES:
            a["args"][f"{side}_config"].pop("engine_kwargs")
    elsewhere = sorted(k for k in {*base, *new} if k != "deployments" and base.get(k) != new.get(k))
    return config, elsewhere


def _live(ctx: Context) -> dict[str, Any]:
    answer: dict[str, Any] = http(f"{ctx.dashboard}/api/serve/applications/", headers=ctx.headers)
    return answer


def _wait(what: str, done: Any, timeout: float) -> float | None:
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        try:
            if done():
                return round(time.monotonic() - began, 1)
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(POLL_S)
    print(f"surge: {what} not within {timeout:.0f} s", flush=True)
    return None


def _one_each(now: dict[str, dict[str, str]], names: list[str]) -> bool:
    return all(list(now.get(name, {}).values()) == ["RUNNING"] for name in names)


def _running(now: dict[str, dict[str, str]], names: list[str]) -> dict[str, set[str]]:
    return {name: {r for r, state in now.get(name, {}).items() if state == "RUNNING"} for name in names}


def _lowered_in_place(live: dict[str, Any], engines: list[str], ingress: str, new: dict[str, set[str]]) -> bool:
    """The minimums back to one a side and the ingress back to one replica, the app RUNNING again with one replica
    a deployment, and that one a new replica that already ran: nothing restarted. A change of code version would
    keep the app DEPLOYING through Serve's build and rollout (about a minute before any replica stops), and end
    with none of these replicas."""
    now = replicas_of(live)
    minimums = minimums_in_force(live)
    status = {app.get("status") for app in live["applications"].values()}
    names = [*engines, ingress]
    return (
        status == {"RUNNING"}
        and _one_each(now, names)
        and all(minimums.get(name) == 1 for name in engines)
        and all(set(now[name]) <= new[name] for name in names)
    )


def without_a_running_replica(timeline: Timeline) -> list[int]:
    """The moments (s) Serve listed the deployment's replicas and none was RUNNING: a stop-first restart shows
    its old replica STOPPING or its new one STARTING alone. A sample that lists none is left out: while Serve
    builds the app anew after the PUT (about 40 s), its answer lists no deployment, and the old replicas go on
    serving meanwhile (the clients' requests say so)."""
    return [
        round(moment)
        for moment, replicas in timeline.seen
        if replicas and not any(state == "RUNNING" for state, _ in replicas.values())
    ]


def unlisted(timeline: Timeline) -> int:
    """The samples in which Serve listed no replica of the deployment."""
    return sum(1 for _, replicas in timeline.seen if not replicas)


def surge_check(ctx: Context) -> list[Any]:
    if ctx.nodes is None:
        raise RuntimeError("the surge phase needs the rehearsal's nodes")
    engines = [deployment_name_of(ctx.model_id, side) for side in SIDES]
    ingress = ingress_deployment_name(Settings())
    base = _synthesized(ctx, {})
    surged, elsewhere = _changed(ctx, copy.deepcopy(base), {**ENGINE_CHANGE, "replica_surge": "true"})
    lowered, _ = _changed(ctx, copy.deepcopy(base), ENGINE_CHANGE)
    changed_kwargs = {
        side: {k: v for k, v in surged["applications"][0]["args"][f"{side}_config"]["engine_kwargs"].items()
               if ctx.config["applications"][0]["args"][f"{side}_config"]["engine_kwargs"].get(k) != v}
        for side in SIDES
    }  # fmt: skip
    settled_before = _wait("one replica a deployment before the change",
                           lambda: _one_each(replicas_of(_live(ctx)), [*engines, ingress]), SURGE.limit_s)  # fmt: skip
    before = replicas_of(_live(ctx))
    steps: dict[str, float | None] = {}
    timelines = {side: Timeline(ctx, name) for side, name in zip(SIDES, engines, strict=True)}
    timelines["ingress"] = Timeline(ctx, ingress)
    with third_node(ctx.nodes) as node_c:
        try:
            resources = {side: 1 for side in SIDES}
            start_worker(ctx.env, ctx.temp_dir, node_c, ip=NODE_C_IP, iface=NODE_C_IFACE, resources=resources,
                         num_cpus=2 * NODE_B_CPUS)  # fmt: skip
            with (
                timelines["prefill"],
                timelines["decode"],
                timelines["ingress"],
                streams.Traffic(ctx, LOAD, MAX_TOKENS) as load,
            ):
                began = time.monotonic()
                http(f"{ctx.dashboard}/api/serve/applications/", surged, method="PUT", timeout=60, headers=ctx.headers)
                # Serve builds the app anew first (the args changed), which took 55-60 s on a loaded run.
                steps["surge minimums in force"] = _wait(
                    "the surge minimums",
                    lambda: all(minimums_in_force(_live(ctx)).get(n) == 2 for n in engines),
                    SURGE.limit_s,
                )
                steps["rolled over"] = _wait(
                    "every replica replaced", lambda: rolled_over(before, replicas_of(_live(ctx))), SURGE.limit_s
                )
                new = _running(replicas_of(_live(ctx)), [*engines, ingress])
                http(f"{ctx.dashboard}/api/serve/applications/", lowered, method="PUT", timeout=60, headers=ctx.headers)
                steps["back to one a side, a new replica kept"] = _wait(
                    "the minimums down in place",
                    lambda: _lowered_in_place(_live(ctx), engines, ingress, new),
                    SURGE.limit_s,
                )
                time.sleep(SERVE_AFTER_S)
                took = time.monotonic() - began
            after = replicas_of(_live(ctx))
        finally:
            stop_node_b(node_c)
    ctx.config = lowered
    outcomes = load.outcomes
    served = [o for o in outcomes if o.kind == "ok"]
    refused = [o for o in outcomes if o.status in REFUSED]
    failed = [o for o in outcomes if o.kind != "ok" and o.status not in REFUSED]
    kept = {name: sorted(set(before[name]) & set(after.get(name, {}))) for name in before}
    # Without its surge replica the ingress's one replica stopped before the new one started, and requests waited
    # in Serve's proxy meanwhile: 63 s for the slowest in CI. The slowest request served shows any such wait.
    slowest = max((o.ended - o.started for o in served), default=0.0)
    ingress_gaps = without_a_running_replica(timelines["ingress"])
    # Every prefill engine of the case: node A's first, node C's from the scaling phase, and the surge's on node C
    # again, where Ray alone would give the name of the one that stopped there (vllm#49238).
    names = prefill_names(ctx.temp_dir)
    reused = sorted({was for _, was in names if [w for _, w in names].count(was) > 1})
    ctx.metrics.update(
        surge_served=float(len(served)), surge_refused=float(len(refused)), surge_failed=float(len(failed)),
        surge_s=round(took, 1), surge_slowest_request_s=round(slowest, 1),
        surge_ingress_without_replica_samples=float(len(ingress_gaps)),
    )  # fmt: skip
    ctx.log_lines.append(
        f"engine setting {ENGINE_CHANGE} deployed with replica_surge, then without: steps (s) {steps}; "
        f"replicas over time: prefill {', '.join(timelines['prefill'].changes())}; decode "
        f"{', '.join(timelines['decode'].changes())}; ingress {', '.join(timelines['ingress'].changes())}; "
        f"replicas of before still there {kept}; clients saw "
        f"{len(served)} served, {len(refused)} refused, {len(failed)} failed ({streams.summary(outcomes)}), the "
        f"slowest served in {slowest:.1f} s; "
        f"prefill NIXL names (given, Ray's own): {names}; Ray's own name given twice: {reused or 'none'}"
    )
    return [
        Check(
            "surge: the synthesized serve configs differ in the engines' kwargs and `deployments` only",
            not elsewhere and all(changed_kwargs.values()),
            f"engine kwargs changed {changed_kwargs}; other keys that differ: {elsewhere or 'none'}",
        ),
        Check(
            "surge: an engine setting changed under load, every replica replaced, the minimums back down in place",
            settled_before is not None and None not in steps.values() and not any(kept.values()),
            f"{SURGE.used(took)}; steps (s) {steps}; replicas of before left {kept}",
        ),
        Check(
            "surge: the ingress kept a RUNNING replica throughout: its surge replica started first",
            bool(timelines["ingress"].seen) and not ingress_gaps,
            f"ingress {', '.join(timelines['ingress'].changes())}; "
            f"no RUNNING replica at t (s) {ingress_gaps or 'never'} ({unlisted(timelines['ingress'])} samples "
            "listed none: Serve building the app anew); "
            f"the slowest request served took {slowest:.1f} s",
        ),
        Check(
            "surge: no admitted request failed during the change",
            bool(served) and not failed,
            f"{len(served)} served, {len(refused)} refused, {len(failed)} failed: {streams.summary(failed) or 'none'}",
        ),
        Check(
            "surge: each prefill engine started got a NIXL name of its own",
            len(names) >= 3 and len({given for given, _ in names}) == len(names),
            f"{len(names)} engines, {len({given for given, _ in names})} names; Ray's own name given again to a "
            f"replacement: {reused or 'none'} (vllm#49238: decode would skip the handshake for it)",
        ),
    ]
