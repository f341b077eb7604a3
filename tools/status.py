"""After `make deploy`: is the model ready, and if not, why. `make status` and `make wait`.

    python -m tools.status [-c key=value ...]                              (a table; exit 0 when ready)
    python -m tools.status --wait [--timeout SECONDS] [-c key=value ...]   (returns when a chat is answered)

What it reads, all through kubectl (tools/cluster_access.py), and why each is the one to read:
- the RayService's status as KubeRay v1.7.0 writes it: the `Ready` condition (KubeRay's readiness: a serving
  cluster with at least one serve endpoint; `serviceStatus` is its deprecated copy), and for the serving cluster
  (activeServiceStatus; pendingServiceStatus until the first one is promoted) the application's and each Serve
  deployment's status and message, which Serve fills with a replica's start failure or slow start;
- the Ray pods, by worker group: Ready, Pending (with the scheduler's reason, the pod's own PodScheduled
  condition and its FailedScheduling Event), and their containers' last termination (OOMKilled);
- each engine worker's Ray log files (kubectl exec grep, as verify reads NIXL's lines): Ray writes the replicas'
  output to files in the pod, not to the container's log, so `kubectl logs` never shows the weights' download or
  load. The furthest stage logged is the engine's progress; the download and memory failures are findings.
Every failure it recognises is one line with its fix (tools/diagnosis.py).

--wait polls that until the RayService is Ready, its application RUNNING and a chat through the endpoint (the
port-forward and the key verify uses) is answered; on a timeout, or an application Serve gave up on
(DEPLOY_FAILED), it prints one line: the first failure found, its fix and the command that shows more.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from serve_config import SERVE_PORT, SIDES, ingress_service_name, pod_labels
from serve_config.application import serve_application
from serve_config.deployments import engine_deployment_name, engines, ingress_deployment_name
from settings import Settings, sizing
from settings.cli import USAGE_EXIT, cli_settings
from tools import diagnosis
from tools.checks import Check, table
from tools.cluster_access import (
    ClusterUnreachableError,
    endpoint_key,
    kubectl,
    kubectl_json,
    port_forward,
    unreachable_message,
)
from tools.diagnosis import Finding, first_line
from tools.polling import poll
from tools.verify import RAY_LOGS, short_chat

# KubeRay's readiness condition (ray-operator/apis/ray/v1/rayservice_types.go, RayServiceReady) and Serve's
# statuses, as KubeRay copies them (ApplicationStatusEnum, DeploymentStatusEnum there).
READY_CONDITION = "Ready"
APP_RUNNING, APP_DEPLOY_FAILED = "RUNNING", "DEPLOY_FAILED"
DEPLOYMENT_HEALTHY = "HEALTHY"
# How often --wait reads the cluster: a few kubectl calls and one exec per engine pod each time.
WAIT_INTERVAL_S = 15.0
# At most this much of a worker's matching log lines is read back.
LOG_TAIL_BYTES = 200_000


@dataclass(frozen=True)
class Snapshot:
    """What the cluster said at one reading."""

    rayservice: dict[str, Any] | None
    pods: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    # Engine worker pod -> its Ray logs' lines about the weights and the engine's start.
    logs: Mapping[str, str] = field(default_factory=dict)


def log_grep() -> str:
    files = f"{RAY_LOGS}/*.out {RAY_LOGS}/*.err {RAY_LOGS}/serve/*.log"
    return f"grep -h -a -E '{diagnosis.LOG_PATTERN}' {files} 2>/dev/null | tail -c {LOG_TAIL_BYTES}"


def _group(pod: Mapping[str, Any]) -> str:
    return str(pod["metadata"].get("labels", {}).get("ray.io/group", "?"))


def _running(pod: Mapping[str, Any]) -> bool:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return any("running" in (c.get("state") or {}) for c in statuses)


def read(settings: Settings) -> Snapshot:
    """One reading of the RayService, its pods, their Events and the engines' log lines."""
    ns = settings.serving_namespace
    try:
        rayservice = kubectl_json("get", "rayservice", "-n", ns, settings.service_name)
    except ClusterUnreachableError:
        raise
    except RuntimeError as err:
        if "NotFound" not in str(err):
            raise
        rayservice = None
    selector = ",".join(f"{k}={v}" for k, v in pod_labels(settings).items())
    pods = kubectl_json("get", "pods", "-n", ns, "-l", selector)["items"]
    events = kubectl_json("get", "events", "-n", ns, "--field-selector", "involvedObject.kind=Pod")["items"]
    logs = {}
    for pod in pods:
        if _group(pod) in SIDES and _running(pod):
            name = pod["metadata"]["name"]
            try:
                logs[name] = kubectl("exec", "-n", ns, name, "--", "sh", "-c", log_grep())
            except ClusterUnreachableError:
                raise
            except RuntimeError:  # the container is going away: its progress is unknown, not an error
                logs[name] = ""
    return Snapshot(rayservice, pods, events, logs)


# --- Judging one reading -------------------------------------------------------------------------------------
def ready_condition(rayservice: Mapping[str, Any]) -> Mapping[str, Any]:
    conditions = (rayservice.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == READY_CONDITION), {})


def serving_status(rayservice: Mapping[str, Any]) -> Mapping[str, Any]:
    """The serving cluster's status; until KubeRay promotes the first cluster, the pending one's."""
    status = rayservice.get("status") or {}
    active = status.get("activeServiceStatus") or {}
    return active if active.get("applicationStatuses") else status.get("pendingServiceStatus") or {}


def application(settings: Settings, rayservice: Mapping[str, Any]) -> Mapping[str, Any]:
    apps = serving_status(rayservice).get("applicationStatuses") or {}
    return apps.get(serve_application(settings)["name"]) or {}


def deployments(settings: Settings) -> list[tuple[str, str]]:
    """(what it serves, Serve's deployment name): each engine side, then the ingress."""
    found = [(side, engine_deployment_name(settings, side)) for side in engines(settings)]
    return [*found, ("ingress", ingress_deployment_name(settings))]


def is_ready(settings: Settings, snap: Snapshot) -> bool:
    if snap.rayservice is None:
        return False
    return (
        ready_condition(snap.rayservice).get("status") == "True"
        and application(settings, snap.rayservice).get("status") == APP_RUNNING
    )


def _detail(status: Mapping[str, Any], missing: str) -> str:
    """A status and the first line of its message."""
    message = status.get("message")
    return f"{status.get('status', missing)}" + (f": {first_line(message)}" if message else "")


def service_rows(settings: Settings, rayservice: Mapping[str, Any]) -> list[Check]:
    """The RayService's readiness, its application's status and each deployment's, as KubeRay copies them."""
    condition = ready_condition(rayservice)
    up = condition.get("status") == "True"
    endpoints = (rayservice.get("status") or {}).get("numServeEndpoints", 0)
    said = condition.get("reason", "no Ready condition yet")
    if condition.get("message"):
        said += f": {first_line(condition['message'])}"
    app = application(settings, rayservice)
    checks = [
        Check(
            f"RayService {settings.serving_namespace}/{settings.service_name}",
            up,
            f"{'Ready' if up else 'not ready'} ({said}); {endpoints} serve endpoint(s)",
        ),
        Check(f"application {serve_application(settings)['name']}", app.get("status") == APP_RUNNING,
              _detail(app, "not reported")),
    ]  # fmt: skip
    statuses = app.get("serveDeploymentStatuses") or {}
    for side, deployment in deployments(settings):
        status = statuses.get(deployment) or {}
        ok = status.get("status") == DEPLOYMENT_HEALTHY
        checks.append(Check(f"{side}: Serve {deployment}", ok, _detail(status, "not reported")))
    return checks


def pod_rows(pods: list[dict[str, Any]]) -> list[Check]:
    """Each worker group's pods (the head's too): how many are Ready, how many Pending."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for pod in pods:
        groups.setdefault(_group(pod), []).append(pod)
    checks = []
    for group, members in sorted(groups.items()):
        statuses = [p.get("status") or {} for p in members]
        ready = sum(1 for s in statuses if any(c.get("ready") for c in s.get("containerStatuses") or []))
        pending = sum(1 for s in statuses if s.get("phase") == "Pending")
        detail = f"{ready} of {len(members)} Ready" + (f", {pending} Pending" if pending else "")
        checks.append(Check(f"{group} pods", ready == len(members), detail))
    return checks


def rows(settings: Settings, snap: Snapshot) -> list[Check]:
    """The RayService, its application, each deployment, each worker group's pods and each engine's start."""
    if snap.rayservice is None:
        where = f"RayService {settings.serving_namespace}/{settings.service_name}"
        return [Check(where, False, "not found: is the stack deployed with these settings?")]
    checks = service_rows(settings, snap.rayservice) + pod_rows(snap.pods)
    for pod, text in sorted(snap.logs.items()):
        stage, said = diagnosis.load_progress(text)
        checks.append(Check(f"engine {pod}", stage == diagnosis.STARTED, said))
    return checks


def findings(settings: Settings, snap: Snapshot) -> list[Finding]:
    """Every failure recognised, the pods' first (the cause nearest the hardware), each symptom once."""
    ns = settings.serving_namespace
    found = [
        *diagnosis.pending_findings(settings, snap.pods, snap.events),
        *diagnosis.container_findings(settings, snap.pods),
    ]
    for pod, text in sorted(snap.logs.items()):
        see = f'kubectl exec -n {ns} {pod} -- sh -c "{log_grep()}"'
        found += diagnosis.text_findings(settings, f"pod {pod}", text, see)
    if snap.rayservice is not None:
        see = f"kubectl get rayservice -n {ns} {settings.service_name} -o yaml"
        statuses = application(settings, snap.rayservice).get("serveDeploymentStatuses") or {}
        for side, deployment in deployments(settings):
            message = (statuses.get(deployment) or {}).get("message", "")
            found += diagnosis.text_findings(settings, f"{side} (Serve {deployment})", message, see)
    unique: dict[str, Finding] = {}
    for finding in found:
        unique.setdefault(finding.symptom, finding)
    return list(unique.values())


def report(settings: Settings, snap: Snapshot) -> list[Check]:
    """The status table's rows, then one failing row per finding, its fix in the detail."""
    return rows(settings, snap) + [
        Check(f"{f.where}: {f.symptom}", False, f"{f.evidence}; fix: {f.fix}; see: {f.see}")
        for f in findings(settings, snap)
    ]


def reason(settings: Settings, snap: Snapshot) -> str:
    """Why the model is not ready, in one line: the first finding, else the first row that is not ready."""
    found = findings(settings, snap)
    if found:
        return found[0].line()
    failing = next((c for c in rows(settings, snap) if not c.ok), None)
    where = f"{failing.name}: {failing.detail}" if failing else "the endpoint did not answer"
    return f"{where}; see: make status (with the same SETTINGS)"


# --- Waiting -------------------------------------------------------------------------------------------------
def default_timeout(settings: Settings) -> float:
    """The high end of a replica's start on a new node (settings/sizing/scale_up.py: node, image, weights, engine),
    in whole minutes: a deploy's first start has the same steps."""
    return float(math.ceil(sizing.scale_up_seconds(settings)[1] / 60) * 60)


def probe(settings: Settings) -> None:
    """One short chat through the endpoint, as verify sends it (its key when keys are on); raises if unanswered."""
    key = endpoint_key(settings)
    with port_forward(settings, ingress_service_name(settings), SERVE_PORT) as base:
        short_chat(base, settings.model_id, api_key=key)


@dataclass(frozen=True)
class Reading:
    snap: Snapshot
    answered: bool
    why: str


def wait(
    settings: Settings,
    *,
    timeout: float,
    interval: float = WAIT_INTERVAL_S,
    read_cluster: Callable[[Settings], Snapshot] = read,
    ask: Callable[[Settings], None] = probe,
    sleep: Callable[[float], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[bool, str]:
    """(answered, one line): poll until a chat is answered, the application failed for good, or the timeout."""
    deadline = clock() + timeout

    def attempt() -> Reading:
        snap = read_cluster(settings)
        if not is_ready(settings, snap):
            return Reading(snap, False, reason(settings, snap))
        try:
            ask(settings)
        except ClusterUnreachableError:
            raise
        except Exception as err:
            said = f"{type(err).__name__}: {first_line(str(err))}"
            return Reading(snap, False, f"the endpoint did not answer a chat ({said}); see: make verify")
        return Reading(snap, True, "")

    def failed_for_good(reading: Reading) -> bool:
        rayservice = reading.snap.rayservice
        return rayservice is not None and application(settings, rayservice).get("status") == APP_DEPLOY_FAILED

    last = poll(
        attempt,
        lambda r: r.answered or failed_for_good(r) or clock() >= deadline,
        timeout=timeout,
        interval=interval,
        sleep=sleep,
    )
    if last.answered:
        return True, f"ready: {settings.model_id} answered a chat through {ingress_service_name(settings)}"
    if failed_for_good(last):
        return False, f"Serve gave up on the application ({APP_DEPLOY_FAILED}): {last.why}"
    return False, f"not ready after {timeout:.0f} s: {last.why}"


# --- The command ---------------------------------------------------------------------------------------------
def access_message(settings: Settings, err: BaseException) -> str:
    """One line for kubectl refused or out of reach: who may use the cluster is the stack's access entries."""
    text = str(err)
    if "Unauthorized" in text or "provide credentials" in text:
        return (
            f"error: the cluster does not know your AWS identity (kubectl: {first_line(text)}); deploy with your role "
            f"in cluster_admin_arns (make preflight prints the -c cluster_admin_arns=... to use), then "
            f"aws eks update-kubeconfig --name {settings.cluster_name}{diagnosis.region_flag(settings)}"
        )
    if "(Forbidden)" in text:
        return (
            f"error: your identity may not read the serving namespace (kubectl: {first_line(text)}); "
            "add your role to cluster_admin_arns and deploy"
        )
    if isinstance(err, ClusterUnreachableError):
        return unreachable_message(settings, err)
    return f"error: {first_line(text)}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Is the deployed model ready, and why not (kubectl must reach it)")
    parser.add_argument("-c", "--context", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--wait", action="store_true", help="return when the endpoint answers a chat")
    parser.add_argument("--timeout", type=float, help="seconds --wait waits (default: a replica's cold start)")
    args = parser.parse_args(argv)
    settings = cli_settings(args.context)
    try:
        if args.wait:
            timeout = default_timeout(settings) if args.timeout is None else args.timeout
            answered, line = wait(settings, timeout=timeout)
            print(line if answered else f"error: {line}", file=sys.stdout if answered else sys.stderr)
            return 0 if answered else 1
        checks = report(settings, read(settings))
    except RuntimeError as err:  # kubectl out of reach, refused, or failing: one line
        print(access_message(settings, err), file=sys.stderr)
        return USAGE_EXIT
    print(table(checks))
    return 0 if all(c.ok for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
