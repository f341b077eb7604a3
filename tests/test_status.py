"""`make status` and `make wait` (tools/status.py, tools/diagnosis.py) against what a cluster really returns.

The RayService statuses are KubeRay v1.7.0's shape and validate against its CRD; the pods and Events are the
Kubernetes API's; the failure texts come from the libraries that raise them where they run here (huggingface_hub's
hf_raise_for_status, botocore's ClientError) and, where they need a GPU, from their authors' format strings.
The cluster is a `kubectl` on PATH that answers from those objects, so the real kubectl calls run.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import botocore.exceptions
import httpx2
import huggingface_hub.errors
import pytest
import yaml
from huggingface_hub.utils._http import hf_raise_for_status

from serve_config.deployments import ingress_deployment_name
from settings import Settings, sizing
from tests.conftest import ROOT, shared_file
from tests.support.kuberay_schema import crd_schema, schema_errors
from tools import diagnosis, status
from tools.cluster_access import ClusterUnreachableError

CRD = "kuberay-v1.7.0/ray.io_rayservices.yaml"
SETTINGS = Settings()
PREFILL, DECODE, INGRESS = (
    "Prefill:Qwen--Qwen3-8B",
    "Decode:Qwen--Qwen3-8B",
    ingress_deployment_name(SETTINGS),
)
T0 = "2026-12-01T10:00:00Z"


# --- Recorded shapes -----------------------------------------------------------------------------------------
def rayservice(*, ready: bool, app: str = "RUNNING", deployments: dict[str, dict[str, str]] | None = None) -> dict[
    str, Any
]:  # fmt: skip
    """A RayService's status as KubeRay v1.7.0 writes it (rayservice_controller.go, calculateConditions)."""
    statuses = deployments or {name: {"status": "HEALTHY"} for name in (PREFILL, DECODE, INGRESS)}
    serving = {
        "rayClusterName": "pd-llm-x7k2p",
        "applicationStatuses": {"llm": {"status": app, "serveDeploymentStatuses": statuses}},
        "rayClusterStatus": {"state": "ready", "readyWorkerReplicas": 3, "availableWorkerReplicas": 3,
                             "desiredWorkerReplicas": 3, "minWorkerReplicas": 3, "maxWorkerReplicas": 3},
    }  # fmt: skip
    condition = (
        {"type": "Ready", "status": "True", "reason": "NonZeroServeEndpoints",
         "message": "Number of serve endpoints is greater than 0"}
        if ready
        else {"type": "Ready", "status": "False", "reason": "Initializing", "message": "RayService is initializing"}
    )  # fmt: skip
    upgrade = {"type": "UpgradeInProgress", "status": "False", "reason": "NoPendingCluster",
               "message": "Active Ray cluster exists and no pending Ray cluster"}  # fmt: skip
    conditions = [{**c, "lastTransitionTime": T0, "observedGeneration": 1} for c in (condition, upgrade)]
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": {"name": "pd-llm", "namespace": "llm"},
        "status": {
            "conditions": conditions,
            "serviceStatus": "Running" if ready else "",
            "numServeEndpoints": 1 if ready else 0,
            "observedGeneration": 1,
            "lastUpdateTime": T0,
            # Until KubeRay promotes the first cluster, it is the pending one.
            "activeServiceStatus" if ready else "pendingServiceStatus": serving,
        },
    }


def pod(name: str, group: str, *, phase: str = "Running", ready: bool = True, **container: Any) -> dict[str, Any]:
    node_type = "head" if group == "headgroup" else "worker"
    labels = {"app.kubernetes.io/name": "pd-llm", "ray.io/group": group, "ray.io/node-type": node_type}
    state = container.pop("state", {"running": {"startedAt": T0}} if phase == "Running" else {})
    statuses = [{"name": "ray-worker", "ready": ready, "restartCount": 0, "state": state, **container}]
    return {
        "metadata": {"name": name, "namespace": "llm", "labels": labels},
        "status": {"phase": phase, "containerStatuses": statuses if state else []},
    }


def pending(name: str, group: str, message: str) -> dict[str, Any]:
    """A pod the scheduler refused: its PodScheduled condition carries the scheduler's message."""
    refused = pod(name, group, phase="Pending", ready=False)
    refused["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
    ]
    return refused


def event(pod_name: str, reason: str, message: str, when: str = T0) -> dict[str, Any]:
    return {
        "kind": "Event",
        "involvedObject": {"kind": "Pod", "name": pod_name, "namespace": "llm"},
        "reason": reason,
        "message": message,
        "type": "Warning",
        "lastTimestamp": when,
    }


def healthy_pods() -> list[dict[str, Any]]:
    return [pod("pd-llm-head", "headgroup"), pod("pd-llm-prefill-a", "prefill"), pod("pd-llm-decode-b", "decode"),
            pod("pd-llm-ingress-c", "ingress")]  # fmt: skip


# What Ray Serve LLM and vLLM 0.26 log on a good start (download_utils.py, gpu_model_runner.py, weight_utils.py,
# core.py); tqdm rewrites its bar with carriage returns.
STARTED_LOG = "\n".join([
    "INFO 2026-12-01 10:01:02 [download_utils.py:243] Downloading model and tokenizer from HF mirror",
    "INFO 12-01 10:01:40 [gpu_model_runner.py:5251] Starting to load model Qwen/Qwen3-8B...",
    "Loading safetensors checkpoint shards:   0% Completed | 0/5 [00:00<?, ?it/s]\r"
    "Loading safetensors checkpoint shards:  40% Completed | 2/5 [00:03<00:04,  1.4s/it]\r"
    "Loading safetensors checkpoint shards: 100% Completed | 5/5 [00:07<00:00,  1.4s/it]",
    "INFO 12-01 10:01:49 [gpu_model_runner.py:5348] Model loading took 15.27 GiB memory and 8.412 seconds",
    "INFO 12-01 10:02:31 [core.py:348] init engine (profile, create kv cache, warmup model) took 41.93 s",
])  # fmt: skip


def serve_failure(error: str, times: int = 3) -> str:
    """Serve's deployment message after its replicas' constructors failed (deployment_state.py, Ray 2.58)."""
    return (
        f"The deployment failed to start {times} times in a row. This may be due to a problem with its "
        "constructor or initial health check failing. See controller logs for details. Error:\n"
        f"ray::ServeReplica:llm:{PREFILL}.initialize_and_get_metadata() (pid=2187, ip=10.0.71.23)\n{error}"
    )


def hub_error(code: int, headers: dict[str, str]) -> str:
    """The exception text huggingface_hub raises for one Hub answer, as a traceback's last line shows it."""
    url = "https://huggingface.co/api/models/meta-llama/Llama-3.1-8B-Instruct/revision/main"
    response = httpx2.Response(code, headers=headers, request=httpx2.Request("GET", url))
    with pytest.raises(huggingface_hub.errors.HfHubHTTPError) as raised:
        hf_raise_for_status(response)
    return f"{type(raised.value).__module__}.{type(raised.value).__name__}: {raised.value}"


GATED = hub_error(403, {"X-Error-Code": "GatedRepo", "X-Error-Message": (
    "Access to model meta-llama/Llama-3.1-8B-Instruct is restricted and you are not in the authorized list. "
    "Visit https://huggingface.co/meta-llama/Llama-3.1-8B-Instruct to ask for access.")})  # fmt: skip
WRONG_TOKEN = hub_error(401, {"X-Error-Message": "Invalid credentials in Authorization header"})
NO_TOKEN = hub_error(401, {})
S3_DENIED = (
    "ERROR 2026-12-01 10:01:03 [s3_filesystem.py:346] Error downloading files from s3://acme-models/qwen3-8b: "
    + str(
        botocore.exceptions.ClientError(
            {"Error": {"Code": "AccessDenied", "Message": "Access Denied"}}, "ListObjectsV2"
        )
    )
)
# PyTorch's caching allocator's message (c10/cuda/CUDACachingAllocator.cpp), as vLLM's engine core logs it.
CUDA_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.95 GiB. GPU 0 has a total capacity of "
    "22.05 GiB of which 1.02 GiB is free. Including non-PyTorch memory, this process has 21.02 GiB memory in use."
)
# vLLM 0.26's v1/core/kv_cache_utils.py, _check_enough_kv_cache_memory, filled in.
KV_TOO_SMALL = (
    "ValueError: To serve at least one request with the model's max seq len (40960), (5.62 GiB KV cache is needed, "
    "which is larger than the available KV cache memory (3.2 GiB). Based on the available memory, the estimated "
    "maximum model length is 23296. Try increasing `gpu_memory_utilization` (which also controls CPU memory on the "
    "CPU backend) or decreasing `max_model_len` when initializing the engine."
)
NO_GPU = (
    "0/4 nodes are available: 2 Insufficient nvidia.com/gpu, 2 node(s) didn't match Pod's node affinity/selector. "
    "preemption: 0/4 nodes are available: 2 No preemption victims found for incoming pod, 2 Preemption is not "
    "helpful for scheduling."
)
NO_EFA = (
    "0/3 nodes are available: 1 Insufficient vpc.amazonaws.com/efa, 2 node(s) didn't match Pod's node "
    "affinity/selector."
)
NO_GPU_NODE = (
    "0/2 nodes are available: 2 node(s) didn't match Pod's node affinity/selector. preemption: 0/2 nodes are "
    "available: 2 Preemption is not helpful for scheduling."
)


# --- The shapes are KubeRay's ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "obj",
    [
        rayservice(ready=True),
        rayservice(ready=False, app="DEPLOYING"),
        rayservice(
            ready=False,
            app="DEPLOY_FAILED",
            deployments={PREFILL: {"status": "UNHEALTHY", "message": serve_failure(GATED)}},
        ),
    ],
    ids=["ready", "deploying", "deploy-failed"],
)
def test_the_recorded_statuses_validate_against_the_crd(obj: dict[str, Any]) -> None:
    schema = crd_schema(yaml.safe_load(shared_file(CRD).read_text()), "v1")["properties"]["status"]
    assert schema_errors(obj["status"], schema) == []
    broken = copy.deepcopy(obj["status"])
    broken["applicationStatuses"] = broken.pop(next(k for k in broken if k.endswith("ServiceStatus")))
    assert schema_errors(broken, schema) != [], "the schema check cannot fail"


# --- Status, one reading ---------------------------------------------------------------------------------------
def snap(rs: dict[str, Any] | None, pods: list[dict[str, Any]], events: list[dict[str, Any]] | None = None,
         logs: dict[str, str] | None = None) -> status.Snapshot:  # fmt: skip
    return status.Snapshot(rs, pods, events or [], logs or {})


def test_a_ready_service_passes_every_row() -> None:
    reading = snap(rayservice(ready=True), healthy_pods(), logs={"pd-llm-prefill-a": STARTED_LOG})
    rows = status.report(SETTINGS, reading)
    assert all(r.ok for r in rows), rows
    assert status.is_ready(SETTINGS, reading)
    assert {r.name for r in rows} >= {"RayService llm/pd-llm", "application llm", f"prefill: Serve {PREFILL}",
                                      "decode pods", "engine pd-llm-prefill-a"}  # fmt: skip


def test_an_initializing_service_is_not_ready_and_says_so() -> None:
    reading = snap(rayservice(ready=False, app="DEPLOYING"), healthy_pods())
    assert not status.is_ready(SETTINGS, reading)
    assert "not ready (Initializing: RayService is initializing)" in status.rows(SETTINGS, reading)[0].detail


def test_a_ready_service_still_deploying_its_application_is_not_ready() -> None:
    """A new serve config on a serving cluster: KubeRay's Ready stays True while Serve deploys the new one."""
    reading = snap(rayservice(ready=True, app="DEPLOYING"), healthy_pods())
    assert not status.is_ready(SETTINGS, reading)
    answered, line = status.wait(SETTINGS, timeout=0, read_cluster=lambda _s: reading,
                                 ask=lambda _s: pytest.fail("asked before the application was RUNNING"))  # fmt: skip
    assert (
        not answered
        and line == "not ready after 0 s: application llm: DEPLOYING; see: make status (with the same SETTINGS)"
    )


def test_load_progress_is_the_furthest_stage_logged() -> None:
    lines = STARTED_LOG.split("\n")
    assert diagnosis.load_progress("")[1] == "no engine log line yet"
    assert diagnosis.load_progress(lines[0])[1] == "downloading the weights"
    assert diagnosis.load_progress("\n".join(lines[:3]))[1] == "loading the weights: 100% of the shards"
    # grep reads the files in no order: a later stage's line before an earlier one still counts as reached.
    assert diagnosis.load_progress("\n".join(reversed(lines))) == (diagnosis.STARTED, "engine started in 41.93 s")


@pytest.mark.parametrize(
    ("message", "symptom", "fix"),
    [
        (NO_GPU, "no node has a free GPU", "G and VT vCPU quota (make preflight)"),
        (NO_EFA, "no node has a free EFA device", "EFA device plugin"),
        (NO_GPU_NODE, "no node matches the pod's GPU node labels", "may not offer g6e.8xlarge"),
    ],
    ids=["gpu", "efa", "affinity"],
)
def test_a_pending_pod_names_the_schedulers_reason_and_its_fix(message: str, symptom: str, fix: str) -> None:
    settings = Settings(gpu_instance_type="g6e.8xlarge") if "offer" in fix else SETTINGS
    pods = [*healthy_pods()[:1], pending("pd-llm-decode-b", "decode", message)]
    found = status.findings(settings, snap(rayservice(ready=False, app="DEPLOYING"), pods))
    assert [f.symptom for f in found] == [f"Pending: {symptom}"]
    assert fix in found[0].fix and found[0].see == "kubectl describe pod -n llm pd-llm-decode-b"
    assert message.split(".")[0] in found[0].evidence


def test_a_pending_pod_without_its_condition_is_read_from_the_latest_event() -> None:
    refused = pod("pd-llm-decode-b", "decode", phase="Pending", ready=False)
    events = [event("pd-llm-decode-b", "FailedScheduling", NO_GPU_NODE, "2026-12-01T10:00:00Z"),
              event("pd-llm-decode-b", "FailedScheduling", NO_GPU, "2026-12-01T10:05:00Z"),
              event("pd-llm-prefill-a", "FailedScheduling", NO_EFA)]  # fmt: skip
    found = status.findings(SETTINGS, snap(None, [refused], events))
    assert [f.symptom for f in found] == ["Pending: no node has a free GPU"]


@pytest.mark.parametrize(
    ("error", "symptom", "fix"),
    [
        (GATED, "the model is gated and the token has no access to it", "accept the model's terms"),
        (WRONG_TOKEN, "Hugging Face refused the token (401)", "put a valid Hugging Face read token in"),
        (NO_TOKEN, "Hugging Face has no such model, or it is gated and no token was sent", "check model_id"),
    ],
    ids=["gated", "wrong-token", "no-token"],
)
def test_a_download_refused_by_the_hub_is_read_from_serves_message(error: str, symptom: str, fix: str) -> None:
    failed = {PREFILL: {"status": "UNHEALTHY", "message": serve_failure(error)}, DECODE: {"status": "UPDATING"}}
    reading = snap(rayservice(ready=False, app="DEPLOY_FAILED", deployments=failed), healthy_pods())
    (found,) = status.findings(Settings(hf_token_secret_name="prod/hf"), reading)
    assert found.symptom == symptom
    assert found.where == f"prefill (Serve {PREFILL})" and found.fix.startswith(fix)
    assert found.see == "kubectl get rayservice -n llm pd-llm -o yaml"


@pytest.mark.parametrize(
    ("log", "settings", "symptom", "fix"),
    [
        (S3_DENIED, Settings(model_source="s3://acme-models/qwen3-8b"), "S3 refused to read the weights",
         "aws s3 ls s3://acme-models/qwen3-8b/"),
        (CUDA_OOM, SETTINGS, "an engine ran out of GPU memory", "lower max_model_len (8192)"),
        (KV_TOO_SMALL, SETTINGS, "an engine has no room for max_model_len's KV cache", "gpu_memory_utilization"),
    ],
    ids=["s3-denied", "cuda-oom", "kv-cache"],
)  # fmt: skip
def test_a_failure_in_a_workers_log_is_named_with_its_fix(log: str, settings: Settings, symptom: str, fix: str) -> None:
    reading = snap(rayservice(ready=False, app="DEPLOYING"), healthy_pods(), logs={"pd-llm-decode-b": log})
    (found,) = status.findings(settings, reading)
    assert found.symptom.startswith(symptom) and fix in found.fix
    assert found.where == "pod pd-llm-decode-b" and found.see.startswith("kubectl exec -n llm pd-llm-decode-b --")


def test_an_oom_killed_worker_is_named() -> None:
    killed = pod("pd-llm-prefill-a", "prefill", ready=False, restartCount=2, lastState={"terminated": {
        "reason": "OOMKilled", "exitCode": 137, "startedAt": T0, "finishedAt": T0}})  # fmt: skip
    (found,) = status.findings(SETTINGS, snap(rayservice(ready=False), [killed]))
    assert found.symptom == "killed for host memory (OOMKilled)" and "exit 137" in found.evidence


def test_one_failure_seen_twice_is_one_finding() -> None:
    failed = {PREFILL: {"status": "UNHEALTHY", "message": serve_failure(GATED)}}
    reading = snap(rayservice(ready=False, deployments=failed), healthy_pods(), logs={"pd-llm-prefill-a": GATED})
    assert [f.where for f in status.findings(SETTINGS, reading)] == ["pod pd-llm-prefill-a"]


# --- Wait ------------------------------------------------------------------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_wait_returns_once_a_chat_is_answered() -> None:
    clock = Clock()
    readings = iter([snap(rayservice(ready=False, app="DEPLOYING"), healthy_pods())] * 3)
    asked: list[float] = []
    answered, line = status.wait(
        SETTINGS, timeout=600, interval=15, sleep=clock.sleep, clock=lambda: clock.now,
        read_cluster=lambda _s: next(readings, snap(rayservice(ready=True), healthy_pods())),
        ask=lambda _s: asked.append(clock.now),
    )  # fmt: skip
    assert answered and line.startswith("ready: Qwen/Qwen3-8B answered a chat")
    assert asked == [45.0]


def test_wait_times_out_with_one_line_naming_the_cause_and_its_fix() -> None:
    pods = [*healthy_pods()[:1], pending("pd-llm-decode-b", "decode", NO_GPU)]
    clock = Clock()
    answered, line = status.wait(
        SETTINGS, timeout=1, interval=0.5, sleep=clock.sleep, clock=lambda: clock.now,
        read_cluster=lambda _s: snap(rayservice(ready=False, app="DEPLOYING"), pods),
        ask=lambda _s: pytest.fail("asked before the service was ready"),
    )  # fmt: skip
    assert not answered and "\n" not in line
    assert line.startswith("not ready after 1 s: pod pd-llm-decode-b: Pending: no node has a free GPU (0/4 nodes")
    assert "; fix: " in line and line.endswith("; see: kubectl describe pod -n llm pd-llm-decode-b")


def test_wait_says_when_the_endpoint_does_not_answer() -> None:
    def refuse(_s: Settings) -> None:
        raise ConnectionResetError("Connection reset by peer")

    answered, line = status.wait(SETTINGS, timeout=0, read_cluster=lambda _s: snap(rayservice(ready=True), []),
                                 ask=refuse)  # fmt: skip
    assert not answered
    assert line == ("not ready after 0 s: the endpoint did not answer a chat (ConnectionResetError: Connection "
                    "reset by peer); see: make verify")  # fmt: skip


def test_wait_stops_when_serve_gave_up() -> None:
    failed = {PREFILL: {"status": "UNHEALTHY", "message": serve_failure(GATED)}}
    reads: list[int] = []

    def read_cluster(_s: Settings) -> status.Snapshot:
        reads.append(1)
        return snap(rayservice(ready=False, app="DEPLOY_FAILED", deployments=failed), healthy_pods())

    answered, line = status.wait(SETTINGS, timeout=600, read_cluster=read_cluster, sleep=lambda _s: None)
    assert not answered and len(reads) == 1
    assert line.startswith("Serve gave up on the application (DEPLOY_FAILED): prefill (Serve Prefill:Qwen--Qwen3-8B)")


# --- The command, through a kubectl on PATH --------------------------------------------------------------------
FAKE_KUBECTL = """#!{python}
import json, os, sys
args, root = sys.argv[1:], os.environ["FAKE_CLUSTER"]
if os.path.exists(os.path.join(root, "stderr")):
    sys.stderr.write(open(os.path.join(root, "stderr")).read()); sys.exit(1)
name = {{"rayservice": "rayservice", "pods": "pods", "events": "events"}}.get(args[1] if len(args) > 1 else "")
if args[0] == "exec":
    sys.stdout.write(open(os.path.join(root, "logs")).read())
elif name:
    sys.stdout.write(open(os.path.join(root, name)).read())
else:
    sys.exit("unexpected kubectl " + " ".join(args))
"""


def run_tool(tmp_path: Path, *args: str, cluster: dict[str, Any] | None = None, stderr: str | None = None) -> (
    subprocess.CompletedProcess[str]
):  # fmt: skip
    """python -m tools.status as a user runs it, against a kubectl that answers from `cluster`."""
    bin_dir, root = tmp_path / "bin", tmp_path / "cluster"
    bin_dir.mkdir()
    root.mkdir()
    kubectl = bin_dir / "kubectl"
    kubectl.write_text(FAKE_KUBECTL.format(python=sys.executable))
    kubectl.chmod(0o755)
    for name, value in (cluster or {}).items():
        (root / name).write_text(value if isinstance(value, str) else json.dumps(value))
    if stderr is not None:
        (root / "stderr").write_text(stderr)
    # The venv's bin first, as the Makefile puts it (its Node runs the CDK library the settings load).
    path = os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), os.environ["PATH"]])
    env = {**os.environ, "PATH": path, "FAKE_CLUSTER": str(root)}
    return subprocess.run([sys.executable, "-m", "tools.status", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120, check=False)  # fmt: skip


def test_status_prints_the_table_and_exits_1_while_loading(tmp_path: Path) -> None:
    cluster = {"rayservice": rayservice(ready=False, app="DEPLOYING"), "pods": {"items": healthy_pods()},
               "events": {"items": []}, "logs": "\n".join(STARTED_LOG.split("\n")[:3])}  # fmt: skip
    result = run_tool(tmp_path, cluster=cluster)
    assert result.returncode == 1, result.stderr
    assert "engine pd-llm-prefill-a" in result.stdout and "loading the weights: 100% of the shards" in result.stdout


def test_wait_with_a_tiny_timeout_exits_1_with_one_line(tmp_path: Path) -> None:
    pods = [*healthy_pods()[:1], pending("pd-llm-decode-b", "decode", NO_GPU)]
    cluster = {"rayservice": rayservice(ready=False), "pods": {"items": pods}, "events": {"items": []}, "logs": ""}
    result = run_tool(tmp_path, "--wait", "--timeout", "0", cluster=cluster)
    assert result.returncode == 1 and result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: not ready after 0 s: pod pd-llm-decode-b: Pending: no node has a free GPU")


def test_kubectl_unauthorized_is_one_line_naming_the_access_entry(tmp_path: Path) -> None:
    # What kubectl prints when the cluster has no access entry for the caller's IAM identity.
    result = run_tool(tmp_path, stderr="error: You must be logged in to the server (Unauthorized)\n")
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()
    assert "cluster_admin_arns" in line and "aws eks update-kubeconfig --name pd-inference" in line


def test_kubectl_out_of_reach_keeps_the_kubeconfig_line() -> None:
    err = ClusterUnreachableError("dial tcp 10.0.0.1:443: i/o timeout")
    assert status.access_message(SETTINGS, err).startswith("error: kubectl cannot reach the cluster (dial tcp")


def test_the_default_timeout_is_a_replicas_cold_start_in_whole_minutes() -> None:
    high = sizing.scale_up_seconds(SETTINGS)[1]
    assert status.default_timeout(SETTINGS) % 60 == 0 and high <= status.default_timeout(SETTINGS) < high + 60
