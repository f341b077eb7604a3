"""What a deployed RayService's failures on day one look like, and the fix for each: `make status` and `make wait`
print these lines themselves.

Every function is pure: it reads what kubectl returned (the RayService's status, pods, Events) and the worker pods'
Ray log lines, and names the symptom, its evidence, the fix and the command that shows more. The strings matched
are the ones their authors print:
- Kubernetes' scheduler: a Pending pod's PodScheduled condition and its FailedScheduling Event, "0/3 nodes are
  available: 1 Insufficient nvidia.com/gpu, 2 node(s) didn't match Pod's node affinity/selector. ...";
- the kubelet: a container's last termination reason `OOMKilled`, a waiting reason `ImagePullBackOff`;
- huggingface_hub (utils/_http.py, hf_raise_for_status): "Cannot access gated repo for url ...", "Repository Not
  Found for url ...", "Invalid credentials in Authorization header"; Serve copies a replica constructor's
  exception into the deployment's status message ("The deployment failed to start N times in a row ...
  Error:"), which KubeRay copies into the RayService's serveDeploymentStatuses;
- Ray Serve LLM (common/utils/download_utils.py, cloud_filesystem/s3_filesystem.py): "Failed to download files
  for model ...", "Error downloading files from s3://...: An error occurred (AccessDenied) ..." (botocore's text);
- PyTorch's caching allocator, "CUDA out of memory", and vLLM 0.26 (v1/core/kv_cache_utils.py): "No available
  memory for the cache blocks", "... is larger than the available KV cache memory ...".
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from settings import Settings


@dataclass(frozen=True)
class Finding:
    """One failure: where, what, the evidence (one line), the fix, and the command that shows more."""

    where: str
    symptom: str
    evidence: str
    fix: str
    see: str

    def line(self) -> str:
        return f"{self.where}: {self.symptom} ({self.evidence}); fix: {self.fix}; see: {self.see}"


def first_line(text: str, limit: int = 240) -> str:
    """The text's first non-empty line, cut to limit characters."""
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return line if len(line) <= limit else line[: limit - 3] + "..."


def region_flag(settings: Settings) -> str:
    return f" --region {settings.effective_region}" if settings.effective_region else ""


def describe(settings: Settings, pod: str) -> str:
    return f"kubectl describe pod -n {settings.serving_namespace} {pod}"


# --- A Pending pod: the scheduler's reason ----------------------------------------------------------------------
def _scheduling_fix(settings: Settings, message: str) -> tuple[str, str]:
    """(symptom, fix) for a scheduler's FailedScheduling message."""
    nodes = "kubectl get nodes -L node.kubernetes.io/instance-type,topology.kubernetes.io/zone"
    group = (
        f"aws eks list-nodegroups --cluster-name {settings.cluster_name}{region_flag(settings)}, then "
        f"aws eks describe-nodegroup --cluster-name {settings.cluster_name} --nodegroup-name <the GPU group> "
        "--query nodegroup.health"
    )
    if "Insufficient nvidia.com/gpu" in message:
        return (
            "no node has a free GPU",
            f"the GPU nodes are all taken or have not joined: check the GPU node group's health ({group}); "
            f"an InsufficientInstanceCapacity or vCPU limit there needs EC2 capacity in "
            f"{settings.gpu_availability_zone or 'the GPU AZ'} or the G and VT vCPU quota (make preflight); "
            f"{nodes}",
        )
    if "Insufficient vpc.amazonaws.com/efa" in message:
        return (
            "no node has a free EFA device",
            "the EFA device plugin is not running on the GPU nodes, or the instance type has fewer EFA devices "
            "than the pods ask for: kubectl get daemonsets -n kube-system, then its pods on the GPU nodes",
        )
    if "didn't match Pod's node affinity/selector" in message or "node affinity" in message:
        return (
            "no node matches the pod's GPU node labels",
            f"no GPU node has joined: the GPU AZ ({settings.gpu_availability_zone or 'gpu_availability_zone'}) may "
            f"not offer {settings.gpu_instance_type}, or EC2 had no capacity; make preflight checks the AZ's "
            f"offering; the node group's health: {group}",
        )
    if "max node group size reached" in message:
        return (
            "Cluster Autoscaler is at the GPU group's maximum",
            "raise the side's max replicas (prefill_max_replicas, decode_max_replicas) or free a node",
        )
    if re.search(r"Insufficient (cpu|memory)", message):
        return (
            "no node has the CPU or memory the pod asks for",
            f"the pod asks for most of a {settings.gpu_instance_type}'s CPU and memory: something else runs on the "
            f"GPU node; {nodes}, then kubectl describe node <node>",
        )
    return "the pod cannot be scheduled", "read the scheduler's message"


def pending_findings(
    settings: Settings, pods: Iterable[Mapping[str, Any]], events: Iterable[Mapping[str, Any]]
) -> list[Finding]:
    """A Pending pod the scheduler refused, with its reason: the pod's own PodScheduled condition, else its latest
    FailedScheduling (or Cluster Autoscaler's NotTriggerScaleUp) Event."""
    latest: dict[str, str] = {}
    for event in sorted(events, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or ""):
        involved = event.get("involvedObject") or {}
        if involved.get("kind") == "Pod" and event.get("reason") in ("FailedScheduling", "NotTriggerScaleUp"):
            latest[involved.get("name", "")] = event.get("message", "")
    found = []
    for pod in pods:
        name = pod["metadata"]["name"]
        status = pod.get("status") or {}
        if status.get("phase") != "Pending":
            continue
        unschedulable = [
            c.get("message", "")
            for c in status.get("conditions") or []
            if c.get("type") == "PodScheduled" and c.get("status") == "False"
        ]
        message = " ".join(m for m in (*unschedulable, latest.get(name, "")) if m)
        if not message:
            continue
        symptom, fix = _scheduling_fix(settings, message)
        found.append(Finding(f"pod {name}", f"Pending: {symptom}", first_line(message), fix, describe(settings, name)))
    return found


# --- Containers: killed for memory, image not pulled, crashing ------------------------------------------------
def container_findings(settings: Settings, pods: Iterable[Mapping[str, Any]]) -> list[Finding]:
    found = []
    for pod in pods:
        name = pod["metadata"]["name"]
        for container in (pod.get("status") or {}).get("containerStatuses") or []:
            state, last = container.get("state") or {}, container.get("lastState") or {}
            terminated = state.get("terminated") or last.get("terminated") or {}
            waiting = (state.get("waiting") or {}).get("reason", "")
            restarts = container.get("restartCount", 0)
            if terminated.get("reason") == "OOMKilled":
                found.append(Finding(
                    f"pod {name}", "killed for host memory (OOMKilled)",
                    f"container {container.get('name')} exit {terminated.get('exitCode')}, {restarts} restart(s)",
                    "the pod's memory limit (three quarters of the node's memory, shared by its pods) is too small "
                    "for the engine's CPU-side buffers: a type with more memory (gpu_instance_type), or a smaller "
                    "max_model_len",
                    f"kubectl get pod -n {settings.serving_namespace} {name} -o jsonpath='{{.spec.containers[0]"
                    ".resources}}'",
                ))  # fmt: skip
            elif waiting in ("ErrImagePull", "ImagePullBackOff", "InvalidImageName"):
                found.append(Finding(
                    f"pod {name}", "the serving image is not pulled",
                    first_line(f"{waiting}: {(state.get('waiting') or {}).get('message', '')}"),
                    "check ray_image (and image_pull_through_cache_prefix): the node must reach the registry",
                    describe(settings, name),
                ))  # fmt: skip
            elif waiting == "CrashLoopBackOff":
                found.append(Finding(
                    f"pod {name}", "the container keeps exiting (CrashLoopBackOff)", f"{restarts} restart(s)",
                    "read the previous container's log",
                    f"kubectl logs -n {settings.serving_namespace} {name} --previous",
                ))  # fmt: skip
    return found


# --- The engines: the weights and GPU memory ------------------------------------------------------------------
@dataclass(frozen=True)
class _Failure:
    pattern: re.Pattern[str]
    symptom: str
    fix: str
    s3_only: bool = False


def _failures(settings: Settings) -> list[_Failure]:
    token = settings.hf_token_secret_name
    secret = (
        f"the Secrets Manager secret {token} (hf_token_secret_name)"
        if token
        else "a secret named by hf_token_secret_name"
    )
    memory = (
        f"lower max_model_len ({settings.max_model_len}) or raise gpu_memory_utilization "
        f"({settings.gpu_memory_utilization}), or a GPU with more memory (gpu_instance_type)"
    )
    return [
        _Failure(
            re.compile(r"Cannot access gated repo|GatedRepoError|not in the authorized list"),
            "the model is gated and the token has no access to it",
            f"accept the model's terms on huggingface.co with the account of the token in {secret}, or pick "
            "another model_id",
        ),
        _Failure(
            re.compile(r"Repository Not Found for url"),
            "Hugging Face has no such model, or it is gated and no token was sent",
            f"check model_id ({settings.model_id}); for a gated model set hf_token_secret_name",
        ),
        _Failure(
            re.compile(r"Invalid credentials in Authorization header|401 Client Error|401 Unauthorized"),
            "Hugging Face refused the token (401)",
            f"put a valid Hugging Face read token in {secret}; once External Secrets has synced it (its refresh "
            "interval), delete the worker pods: a pod reads the token when it starts",
        ),
        _Failure(
            re.compile(r"AccessDenied|Access Denied|\(403\)|403 Forbidden"),
            "S3 refused to read the weights (access denied)",
            f"the stack lets the Ray pods' role read {settings.model_source} and nothing else: check that the "
            f"weights are under it (aws s3 ls {settings.model_source}/) and that no bucket policy or KMS key policy "
            "denies the role",
            s3_only=True,
        ),
        _Failure(
            re.compile(r"Failed to download files for model|Error downloading files from"),
            "the weights did not download",
            f"check model_source ({settings.model_source or settings.model_id}) and the pods' access to it",
        ),
        _Failure(
            re.compile(r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory"),
            "an engine ran out of GPU memory (CUDA out of memory)",
            memory,
        ),
        _Failure(
            re.compile(r"No available memory for the cache blocks|larger than the available KV cache memory"),
            "an engine has no room for max_model_len's KV cache",
            memory,
        ),
    ]


def text_findings(settings: Settings, where: str, text: str, see: str) -> list[Finding]:
    """The first known failure in a deployment's status message or a worker's log lines (one per text: the first
    pattern that matches is the cause, the later ones its consequences)."""
    s3 = (settings.model_source or "").startswith("s3://")
    for failure in _failures(settings):
        if failure.s3_only and not s3:
            continue
        match = failure.pattern.search(text)
        if match:
            line = text[text.rfind("\n", 0, match.start()) + 1 :]
            return [Finding(where, failure.symptom, first_line(line), failure.fix, see)]
    return []


# The engine's start, stage by stage, as Ray Serve LLM and vLLM 0.26 log it (the furthest one reached is its
# progress: grep reads the log files in no particular order).
LOAD_STAGES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("downloading the weights", re.compile(r"Downloading (?:model|tokenizer)")),
    ("weights downloaded", re.compile(r"Finished downloading|Time spent downloading weights")),
    ("loading the weights", re.compile(r"Starting to load model")),
    ("loading the weights: {0}% of the shards", re.compile(r"Loading safetensors checkpoint shards:\s*(\d+)%")),
    ("weights loaded, {0} GiB", re.compile(r"Model loading took ([\d.]+) GiB")),
    ("engine started in {0} s", re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+)")),
)
STARTED = len(LOAD_STAGES) - 1
# What the tools grep the worker's Ray logs for: every stage and every failure above.
LOG_PATTERN = (
    "Downloading (model|tokenizer)|Finished downloading|Time spent downloading|Starting to load model|"
    "checkpoint shards|Model loading took|init engine|gated repo|GatedRepoError|authorized list|Client Error|"
    "Invalid credentials|401 Unauthorized|Repository Not Found|AccessDenied|Access Denied|Failed to download|"
    "Error downloading|"
    "out of memory|OutOfMemoryError|No available memory|available KV cache memory"
)


def load_progress(text: str) -> tuple[int, str]:
    """(stage index, -1 before any; what it says) of the furthest stage the log lines reach."""
    best, said = -1, "no engine log line yet"
    # tqdm rewrites its bar after a carriage return, where splitlines() also splits: each rewrite is a reading.
    lines = text.splitlines()
    for index, (label, pattern) in enumerate(LOAD_STAGES):
        values = [m.group(1) if m.groups() else "" for m in map(pattern.search, lines) if m]
        if values and index >= best:
            value = max(values, key=lambda v: float(v) if v else 0.0)
            best, said = index, label.format(value)
    return best, said
