"""The head-loss case: the Ray head's processes killed while streams run through the ingress, under GCS fault tolerance.

The cluster is laid out as the product lays out its pods: the head alone in this namespace (`num-cpus: 0`, as
rayservice.yaml has it), the ingress and prefill on node C (the ingress group's and prefill's resources), decode
on node B. GCS fault tolerance is set up as KubeRay 1.7 sets it up from the RayService's
`gcsFaultToleranceOptions` (common/pod.go, configureRedisFT): the head gets RAY_REDIS_ADDRESS (the stack's
`rediss://` address, pointed at this run's store), RAY_external_storage_namespace and `--redis-password=$REDIS_PASSWORD`
under bash; every worker gets RAY_gcs_rpc_server_reconnect_timeout_s=600. The store is Debian's redis-server with
TLS and a password, in the ElastiCache store's place; the head trusts its CA through the file RAY_REDIS_CA_CERT
names, as the product's head names the image's CA bundle (serve_config/pod_templates.py).

The phase kills every process of the head's node (GCS, raylet, dashboard, Serve's controller), as a lost head pod
does, waits as KubeRay's restart of the container would, and starts the head again: the new head's controller must
keep every replica. Both sides are ranged and every request split (rehearsal/case_settings.py), so each request is
routed twice by the prefix-aware router, whose trees the product puts on the head (ray_pods/prefix_routing.py): the
phase checks both trees were on the head it kills, and that a request sent while the head is away still gets its
first token within a bound (margins.FIRST_TOKEN_WITHOUT_HEAD): routing that waits for a lost tree holds every
request of its process until the head is back. Then the contrast: the same kill, the head started again without
the store, as KubeRay starts it with gcs_fault_tolerance off; the endpoint must stop answering. tests/test_gcs_ft.py
shows the same on Ray alone.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import secrets
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from rehearsal import streams
from rehearsal.cluster import _COMMON, _parents, _ray, kill_namespace_processes, start_worker
from rehearsal.context import Context
from rehearsal.gcs_store import tls_redis
from rehearsal.margins import FIRST_TOKEN_WITHOUT_HEAD, HEAD_BACK, NO_STORE_STOP
from rehearsal.network import (
    HEAD_IFACE,
    HEAD_IP,
    NODE_C_IFACE,
    NODE_C_IP,
    WORKER_IFACE,
    WORKER_IP,
    Nodes,
    http,
    third_node,
)
from serve_config import SERVE_PORT
from serve_config.pod_templates import REDIS_CA_CERT_ENV
from tools.checks import Check

CASE = "head-loss"
# A Serve log line's start ("ERROR 2026-12-03 ..."); a traceback's lines come between two of them.
LOG_LINE = re.compile(r"^[A-Z]+ \d{4}-")
# The clients' endpoint: the ingress node's Serve proxy, as the product's client Services select the ingress pods.
INGRESS_SERVE = f"http://{NODE_C_IP}:{SERVE_PORT}"
NODE_C_RESOURCES = {"prefill": 1, "ingress": 1}
# Prefill's engine bundle (4 CPUs and 1 for its replica) and the ingress replica's CPU.
NODE_C_CPUS = 6
# What KubeRay sets on every worker under GCS fault tolerance (common/pod.go).
WORKER_RECONNECT_S = 600
STREAMS = 2
MAX_TOKENS = 96
WARM_S = 6.0
# The controller recovers the replicas it finds within a second of its start (its log, "Finished recovering").
RECOVERY_SETTLE_S = 5.0
# The head pod's container restarting: the kubelet's first restart of a crashed container is at once, a lost
# node's pod is rescheduled in seconds to minutes; 10 s of a head away is enough to see who waits for it.
HEAD_AWAY_S = 10.0
# Without the store the endpoint has stopped answering once no request has completed for this long and some have
# failed in it: a stream through a serving endpoint completes every 3-7 s here. The workers' raylets exit when
# their liveness check, every 60 s (Ray's raylet_liveness_self_check_interval_ms), meets the new GCS's
# authentication error (node_manager.cc, "GCS returned an authentication error"): up to about a minute after
# the head is back, and its proxy with them.
WITHOUT_STORE_QUIET_S = 15.0
# Ray's tree actor class (routing_policies/prefix_aware/prefix_tree.py), one per routed deployment: prefill, decode.
PREFIX_TREE = "PrefixTreeActor"
SIDES = ("prefill", "decode")


def kuberay_head_env(rayservice: dict[str, Any], password: str, ca: Path) -> dict[str, str]:
    """The head container's environment that KubeRay adds from gcsFaultToleranceOptions, at this run's store."""
    options = rayservice["spec"]["rayClusterConfig"]["gcsFaultToleranceOptions"]
    address = urlparse(options["redisAddress"])
    return {
        # The stack's scheme and port, at this run's store on the head's address.
        "RAY_REDIS_ADDRESS": f"{address.scheme}://{HEAD_IP}:{address.port}",
        # From the Secret the options name (redisPassword.valueFrom.secretKeyRef).
        "REDIS_PASSWORD": password,
        # KubeRay's default: the RayCluster's UID.
        "RAY_external_storage_namespace": "3f2b8c1e-rehearsal-raycluster-uid",
        # The head container's own CA variable, at this run's CA where the image's bundle would be.
        REDIS_CA_CERT_ENV: str(ca),
    }


def _start_head(env: dict[str, str], temp_dir: Path) -> None:
    # KubeRay's `ray start` under bash, with `--redis-password=$REDIS_PASSWORD` added (configureRedisFT) when the
    # options are there.
    password = ["--redis-password=$REDIS_PASSWORD"] if "RAY_REDIS_ADDRESS" in env else []
    command = " ".join(
        [_ray(), "start", "--head", f"--node-ip-address={HEAD_IP}", "--port=6379", f"--dashboard-host={HEAD_IP}",
         f"--temp-dir={temp_dir}", "--num-cpus=0", "--num-gpus=0", *_COMMON, *password]
    )  # fmt: skip
    subprocess.run(["bash", "-c", command], env=env, check=True, timeout=180, cwd=temp_dir.parent, capture_output=True)


@contextlib.contextmanager
def cluster(
    env: dict[str, str], temp_dir: Path, nodes: Nodes, head_env: dict[str, str], rayservice: dict[str, Any]
) -> Iterator[Callable[[], Path]]:
    """The head alone here with its store, node B (decode), node C (ingress, prefill). Yields what starts the
    head again, on a fresh temp dir as a new container has, and returns that dir."""
    password = secrets.token_hex(24)
    port = urlparse(rayservice["spec"]["rayClusterConfig"]["gcsFaultToleranceOptions"]["redisAddress"]).port
    store = tls_redis(temp_dir.parent / "gcs-store", host=HEAD_IP, port=port or 0, password=password)
    with store as ca, third_node(nodes) as node_c:
        head = {**env, **head_env, **kuberay_head_env(rayservice, password, ca), "FI_TCP_IFACE": HEAD_IFACE}
        workers = {**env, "RAY_gcs_rpc_server_reconnect_timeout_s": str(WORKER_RECONNECT_S)}
        incarnations = [temp_dir]
        _start_head(head, temp_dir)
        start_worker(workers, temp_dir, nodes, ip=WORKER_IP, iface=WORKER_IFACE, resources={"decode": 1})
        start_worker(
            workers,
            temp_dir,
            node_c,
            ip=NODE_C_IP,
            iface=NODE_C_IFACE,
            resources=NODE_C_RESOURCES,
            num_cpus=NODE_C_CPUS,
        )

        def restart_head(*, store: bool = True) -> Path:
            """The head again; without the store, as KubeRay starts it with gcs_fault_tolerance off."""
            incarnations.append(temp_dir.parent / f"ray-head-{len(incarnations) + 1}")
            ft_only = kuberay_head_env(rayservice, password, ca)
            _start_head(head if store else {k: v for k, v in head.items() if k not in ft_only}, incarnations[-1])
            return incarnations[-1]

        try:
            yield restart_head
        finally:
            # As ray_cluster ends: every Ray process here and on node B, then node C's.
            kill_namespace_processes(f"/proc/{nodes.holder.pid}/ns/net", nodes.holder.pid)
            for pid in _in_namespace(os.readlink(f"/proc/{node_c.holder.pid}/ns/net"), node_c.holder.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def _in_namespace(namespace: str, spared: int) -> list[int]:
    found = []
    for pid in _parents():
        with contextlib.suppress(OSError):
            if pid != spared and os.readlink(f"/proc/{pid}/ns/net") == namespace:
                found.append(pid)
    return found


def kill_head() -> int:
    """Kill every process of this namespace that is not ours (this run, its store): the head's Ray, whose daemons
    were reparented away from us, as the loss of its pod would."""
    parents = _parents()

    def ours(pid: int) -> bool:
        while pid > 1:
            if pid in (os.getpid(), os.getppid()):
                return True
            pid = parents.get(pid, 0)
        return False

    killed = 0
    for pid in _in_namespace(os.readlink("/proc/self/ns/net"), os.getpid()):
        if not ours(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
    return killed


def replica_ids(ctx: Context) -> dict[str, list[str]] | None:
    """Each deployment's replicas as Serve's controller lists them (ReplicaDetails.replica_id); None while no
    controller answers."""
    with contextlib.suppress(OSError, ValueError, KeyError):
        live = http(f"{ctx.dashboard}/api/serve/applications/", headers=ctx.headers)
        found = {
            name: sorted(r["replica_id"] for r in deployment.get("replicas", []))
            for app in live["applications"].values()
            for name, deployment in (app.get("deployments") or {}).items()
        }
        return found or None
    return None


def _recovered(ctx: Context, since: float) -> tuple[float | None, dict[str, list[str]]]:
    """Seconds from `since` until the new head's controller lists every deployment again, and what it lists a few
    seconds later, once it has decided which replicas it keeps (it recovers them within a second)."""
    while time.monotonic() - since < HEAD_BACK.limit_s:
        if replica_ids(ctx) is not None:
            back = time.monotonic() - since
            time.sleep(RECOVERY_SETTLE_S)
            return back, replica_ids(ctx) or {}
        time.sleep(1.0)
    return None, {}


def _controller_lines(head_dir: Path) -> list[str]:
    """What the new head's Serve controller said about the replicas it found, with the last line of each traceback."""
    found = []
    for log in sorted((head_dir / "session_latest" / "logs" / "serve").glob("controller_*.log")):
        lines = log.read_text(errors="replace").splitlines()
        for index, line in enumerate(lines):
            if any(word in line for word in ("Recovering Replica", "Exception in Replica", "Starting Replica")):
                found.append("controller: " + line[:240])
            if "Exception in Replica" in line:
                trace = list(itertools.takewhile(lambda rest: not LOG_LINE.match(rest), lines[index + 1 : index + 200]))
                found += ["controller:   " + rest[:240] for rest in trace[-3:]]
    return found[:30]


def tree_nodes(ctx: Context) -> tuple[str | None, dict[str, str]]:
    """The head's node id, and each prefix tree's namespace with the node it runs on, from the state API (the
    dashboard is the head's: ask before it is killed)."""
    nodes = http(f"{ctx.dashboard}/api/v0/nodes?detail=1&limit=100", headers=ctx.headers)["data"]["result"]["result"]
    head = next((n["node_id"] for n in nodes if n.get("is_head_node") and n.get("state") == "ALIVE"), None)
    actors = http(f"{ctx.dashboard}/api/v0/actors?detail=1&limit=1000", headers=ctx.headers)["data"]["result"]["result"]
    trees = {
        a["ray_namespace"]: a["node_id"] for a in actors if a["class_name"] == PREFIX_TREE and a["state"] == "ALIVE"
    }
    return head, trees


def slow_first_tokens(while_away: list[streams.Outcome], within_s: float) -> list[streams.Outcome]:
    """The requests with no first token within `within_s` of being sent."""
    return [o for o in while_away if o.first_chunk is None or o.first_chunk - o.started > within_s]


def head_loss_check(ctx: Context) -> list[Any]:
    """Streams through the ingress while the head's processes die; the head comes back and Serve's controller
    recovers the app. The traffic stops before the head's restart: what comes after it is the controller's."""
    if ctx.restart_head is None:
        raise RuntimeError("the head-loss phase needs the head-loss case's cluster")
    ctx.serve = INGRESS_SERVE
    before = replica_ids(ctx) or {}
    with streams.Traffic(ctx, STREAMS, MAX_TOKENS) as traffic:
        time.sleep(WARM_S)
        head, trees = tree_nodes(ctx)
        killed_at = time.monotonic()
        killed = kill_head()
        time.sleep(HEAD_AWAY_S)
    away_until = time.monotonic()
    new_head = ctx.restart_head()
    back, after = _recovered(ctx, killed_at)
    around = [o for o in traffic.outcomes if o.ended >= killed_at]
    while_away = [o for o in around if o.started >= killed_at]
    kept = sorted(name for name, ids in after.items() if ids and ids == before.get(name))
    replaced = sorted(name for name in after if name not in kept)
    slow = slow_first_tokens(while_away, FIRST_TOKEN_WITHOUT_HEAD.limit_s)
    first_tokens = [o.first_chunk - o.started for o in while_away if o.first_chunk is not None]
    ctx.metrics.update(
        {
            "head_loss_processes_killed": float(killed),
            "head_loss_controller_back_s": None if back is None else round(back, 1),
            "head_loss_answered_while_away": float(sum(o.kind == "ok" for o in while_away)),
            "head_loss_failed": float(sum(o.kind == "error" for o in around)),
            "head_loss_cut": float(sum(o.kind == "cut" for o in around)),
            "head_loss_slowest_first_token_s": round(max(first_tokens), 2) if first_tokens else None,
        }
    )
    ctx.log_lines += _controller_lines(new_head)
    ctx.log_lines.append(
        f"head killed ({killed} processes), away {away_until - killed_at:.0f} s: from the kill on "
        f"{streams.summary(around)}, {len(while_away)} of them sent while it was away; controller back after {back} s; "
        f"replicas before {before}, after {after}; prefix trees (namespace: node) {trees}, the head {head}; "
        f"first tokens of the requests sent while it was away: {_seconds(first_tokens)}"
    )
    engines = [name for name in after if name.startswith(("Prefill:", "Decode:", "LLMServer:"))]
    return [
        Check(
            "head lost under GCS fault tolerance: every stream through the ingress completes",
            bool(around) and all(o.kind == "ok" for o in around),
            f"from the kill on: {streams.summary(around)}",
        ),
        Check(
            "head lost: new requests are answered while it is away",
            bool(while_away) and all(o.kind == "ok" for o in while_away),
            f"sent in the {HEAD_AWAY_S:.0f} s without a head: {streams.summary(while_away)}",
        ),
        # Without it the checks below pass whether or not routing waits for the head: nothing of routing was on it.
        Check(
            "head lost: both sides' prefix trees were on the lost head",
            head is not None and len(trees) == len(SIDES) and all(node == head for node in trees.values()),
            f"trees {trees}; the head {head}",
        ),
        Check(
            "head lost: every request sent while it is away has its first token within "
            f"{FIRST_TOKEN_WITHOUT_HEAD.limit_s:.0f} s",
            bool(while_away) and not slow,
            f"{len(slow)} of {len(while_away)} later or never ({len(while_away) - len(first_tokens)} never); slowest "
            + (FIRST_TOKEN_WITHOUT_HEAD.used(max(first_tokens)) if first_tokens else "none")
            + f"; each: {_seconds(first_tokens)}",
        ),
        Check(
            "head lost: the new head's controller lists the app again",
            back is not None,
            HEAD_BACK.used(back) if back is not None else f"not within {HEAD_BACK.limit_s:.0f} s",
        ),
        # The controller's recovery asks each replica for its log file (is_allocated). Without the product's
        # logging hook (ray_pods/engine_logging.py) vLLM and NIXL have closed Serve's handler in every engine replica,
        # the call raises, and Ray 2.58's controller replaces them all.
        Check(
            "head lost: Serve's new controller keeps every replica, the engines included",
            bool(engines) and not replaced and set(kept) == set(before),
            f"kept {kept}; replaced {replaced}",
        ),
    ]


def _seconds(values: list[float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values) + " s" if values else "none"


def stopped_answering(outcomes: list[streams.Outcome], back_at: float, now: float) -> float | None:
    """Seconds from the head's restart until the endpoint last completed a request, once it has stopped answering:
    nothing completed in the last WITHOUT_STORE_QUIET_S and at least one request failed or was cut in that time.
    None while it may still be answering."""
    since = max([back_at] + [o.ended for o in outcomes if o.kind == "ok"])
    failed_since = [o for o in outcomes if o.kind != "ok" and o.ended >= since]
    if now - since < WITHOUT_STORE_QUIET_S or not failed_since:
        return None
    return since - back_at


def without_store_check(ctx: Context) -> list[Any]:
    """The contrast: the same kill, the head started again without its store, as with gcs_fault_tolerance off.
    It ends the cluster, so it runs last."""
    if ctx.restart_head is None:
        raise RuntimeError("the without-store phase needs the head-loss case's cluster")
    ctx.serve = INGRESS_SERVE
    stopped = waited = None
    with streams.Traffic(ctx, STREAMS, MAX_TOKENS) as traffic:
        time.sleep(WARM_S)
        killed_at = time.monotonic()
        killed = kill_head()
        time.sleep(HEAD_AWAY_S)
        ctx.restart_head(store=False)
        back_at = time.monotonic()
        while stopped is None and time.monotonic() - back_at < NO_STORE_STOP.limit_s:
            time.sleep(1.0)
            stopped = stopped_answering(traffic.since(killed_at), back_at, time.monotonic())
        if stopped is not None:
            waited = time.monotonic() - back_at
    around = [o for o in traffic.outcomes if o.ended >= killed_at]
    after_back = [o for o in around if o.started >= back_at]
    apps = replica_ids(ctx)
    ctx.metrics.update(
        {
            "no_store_answered_after_kill": float(sum(o.kind == "ok" for o in around)),
            "no_store_failed": float(sum(o.kind == "error" for o in around)),
            "no_store_cut": float(sum(o.kind == "cut" for o in around)),
            "no_store_last_answer_s": None if stopped is None else round(stopped, 1),
        }
    )
    ctx.log_lines.append(
        f"head killed again ({killed} processes), back without its store: from the kill on {streams.summary(around)}; "
        f"sent after it was back: {streams.summary(after_back)}; last request completed {stopped} s after it was "
        f"back; Serve apps: {apps}"
    )
    return [
        Check("head lost without GCS fault tolerance: the new head knows no Serve app", apps is None, f"lists {apps}"),
        Check(
            "head lost without GCS fault tolerance: the endpoint stops answering",
            stopped is not None and waited is not None,
            (
                f"the last request completed {stopped:.0f} s after the head was back, none in the "
                f"{WITHOUT_STORE_QUIET_S:.0f} s after it; {NO_STORE_STOP.used(waited)}"
                if stopped is not None and waited is not None
                else f"still answering {NO_STORE_STOP.limit_s:.0f} s after the head was back: "
                f"{streams.summary(after_back)}"
            ),
        ),
    ]
