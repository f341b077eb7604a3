"""Deploy a change that restarts replicas with a surge replica on each side that has room.

    python -m tools.upgrade [-c key=value ...]    (make upgrade SETTINGS=... CDK_ARGS=...)

Serve 2.58 stops an outdated replica before it starts its replacement while a deployment runs at its
target (serve/_private/deployment_state.py, the rolling update: it stops at most the rollout size less
the replicas still missing from the target). A side with one replica is then down for one engine start.
With the target one above the replicas running, the missing one is started first, at the new version,
and only once it runs is an old one stopped. So:

1. `cdk deploy -c replica_surge=true`: the change, and each engine deployment with a range at one
   replica more than its minimum (settings/sizing/upgrade.py, surge_minimum).
2. Wait until Serve has the raised minimum in force, then until no replica that served before the deploy
   is left and each deployment has one running (`rolled_over`), or, for a change Serve applied in place,
   until every deployment is HEALTHY: the engines first, then the ingress, which runs one replica more
   under the surge where its group has room (settings/sizing/upgrade.py, ingress_surge_room).
3. `cdk deploy`: the minimum back down. A bound only: Serve applies it in place (serve_config/deployments.py).

A side with no range is restarted as before: `make change-impact` and the synth warning say so.
The rehearsal's scaling case runs this sequence on Serve itself (rehearsal/surge.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

from serve_config import DASHBOARD_PORT
from serve_config.deployments import engine_deployment_name, engines, ingress_deployment_name
from settings import Settings, sizing
from settings.cli import cli_settings
from tools.cluster_access import ClusterUnreachableError, http_json, port_forward, unreachable_message

CDK = "node_modules/.bin/cdk"
POLL_S = 5.0
# Each wait: an engine start where a new GPU node is needed (`make plan`'s scale-up budget) and again as much.
WAIT_MARGIN = 2.0
# The ingress's surge replica: a pod on a system node, which holds the image (the head's), then the ingress's
# start (51 s on the loaded CPU rehearsal). Where its group has no room for that pod after all (a Ray cluster
# built before the group's maximum was raised: docs/operations.md, "Scaling"), the replica never starts and
# Serve keeps the old one serving (it stops none while the target is still missing one); the deploy without
# the surge then restarts it as before, so the wait ends with a warning rather than an error.
INGRESS_SURGE_WAIT_S = 600.0
Replicas = dict[str, dict[str, str]]  # deployment name -> replica id -> state


def replicas_of(applications: Mapping[str, Any]) -> Replicas:
    """Every deployment's replicas, from Serve's /api/serve/applications/ answer."""
    found: Replicas = {}
    for app in applications["applications"].values():
        for name, deployment in (app.get("deployments") or {}).items():
            found[name] = {r["replica_id"]: r["state"] for r in deployment.get("replicas", [])}
    return found


def minimums_in_force(applications: Mapping[str, Any]) -> dict[str, int]:
    """The autoscaling minimum Serve has in force for each deployment that has a range."""
    found: dict[str, int] = {}
    for app in applications["applications"].values():
        for name, deployment in (app.get("deployments") or {}).items():
            scaling = (deployment.get("deployment_config") or {}).get("autoscaling_config")
            if isinstance(scaling, dict):
                found[name] = int(scaling["min_replicas"])
    return found


def rolled_over(before: Replicas, now: Replicas) -> bool:
    """Every deployment that served before has a replica running and none of its earlier replicas left."""
    for name, earlier in before.items():
        current = now.get(name, {})
        if set(earlier) & set(current) or "RUNNING" not in current.values():
            return False
    return True


def healthy(applications: Mapping[str, Any]) -> bool:
    return all(
        app.get("status") == "RUNNING"
        and all(d.get("status") == "HEALTHY" for d in (app.get("deployments") or {}).values())
        for app in applications["applications"].values()
    )


def surged_minimums(settings: Settings) -> dict[str, int]:
    """The minimum each engine deployment with room runs under the surge."""
    sides = [side for side in engines(settings) if sizing.surge_room(settings, side)]
    if not sides:
        return {}
    surged = dataclasses.replace(settings, replica_surge=True)
    return {engine_deployment_name(settings, side): sizing.surge_minimum(surged, side) for side in sides}


def wait_for_rollover(
    live: Callable[[], Mapping[str, Any]], before: Replicas, settings: Settings, budget: float
) -> None:
    """Step 2's second wait: the engine deployments rolled over (or the app healthy), within the budget, then the
    ingress, within INGRESS_SURGE_WAIT_S where it surges; an ingress that did not roll over is a warning."""
    ingress = ingress_deployment_name(settings)
    engines_before = {name: replicas for name, replicas in before.items() if name != ingress}
    wait_for("every engine deployment rolled over or healthy",
             lambda: rolled_over(engines_before, replicas_of(live())) or healthy(live()), budget)  # fmt: skip
    if not sizing.ingress_surge_room(settings) or ingress not in before:
        return
    try:
        wait_for("the ingress rolled over or healthy",
                 lambda: rolled_over({ingress: before[ingress]}, replicas_of(live())) or healthy(live()),
                 INGRESS_SURGE_WAIT_S)  # fmt: skip
    except TimeoutError as err:
        print(
            f"warning: {err}: its surge replica found no ingress pod (see docs/operations.md, Scaling, for a "
            "cluster built before its group had room); the deploy without the surge restarts it, requests "
            "waiting in Serve's proxy for one ingress start",
            file=sys.stderr,
        )


def wait_for(what: str, done: Callable[[], bool], timeout: float) -> None:
    began = time.monotonic()
    while not done():
        if time.monotonic() - began > timeout:
            raise TimeoutError(f"{what}: not within {timeout:.0f} s")
        time.sleep(POLL_S)
    print(f"{what}: after {time.monotonic() - began:.0f} s", flush=True)


def _cdk_deploy(cdk: str, context: list[str]) -> None:
    flags = [flag for pair in context for flag in ("-c", pair)]
    subprocess.run([cdk, "deploy", *flags], check=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("-c", "--context", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--cdk", default=CDK, help=f"the CDK CLI (default: {CDK}, the pinned one)")
    args = parser.parse_args(argv)
    settings = cli_settings(args.context)
    surged = surged_minimums(settings)
    if not surged:
        print(
            "error: replica_surge: no engine deployment has a range (a maximum above its minimum), so none has room "
            "for a surge replica; `make deploy` restarts each side with one replica for one engine start",
            file=sys.stderr,
        )
        return 2
    budget = WAIT_MARGIN * sizing.scale_up_seconds(settings)[1]
    try:
        with port_forward(settings, f"{settings.service_name}-head-svc", DASHBOARD_PORT) as dashboard:

            def live() -> dict[str, Any]:
                answer: dict[str, Any] = http_json(f"{dashboard}/api/serve/applications/", timeout=30)
                return answer

            before = replicas_of(live())
            _cdk_deploy(args.cdk, [*args.context, "replica_surge=true"])
            wait_for(
                "the raised minimums in force",
                lambda: all(minimums_in_force(live()).get(k) == v for k, v in surged.items()),
                budget,
            )
            wait_for_rollover(live, before, settings, budget)
            _cdk_deploy(args.cdk, args.context)
    except ClusterUnreachableError as err:
        print(unreachable_message(settings, err), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
