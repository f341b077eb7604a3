"""What verify.py and bench.py share: kubectl, a port-forward to the endpoint, and NIXL metrics.

Everything here runs against a deployed stack with kubectl pointed at it
(`aws eks update-kubeconfig ...`, the stack's UpdateKubeconfigCommand output).
The parsing functions are pure and tested on recorded samples.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

import serve_config
from settings import Settings

# Ray exports each node's metrics here (KubeRay's default --metrics-export-port).
RAY_METRICS_PORT = serve_config.METRICS_PORT
# vLLM names them vllm:...; Ray's exporter turns ':' into '_' and prefixes ray_.
XFER_COUNT = "vllm:nixl_xfer_time_seconds_count"
XFER_SUM = "vllm:nixl_xfer_time_seconds_sum"
FAILED_TRANSFERS = "vllm:nixl_num_failed_transfers"
# Prompt tokens an engine has processed: grows on prefill when it serves a request.
PROMPT_TOKENS = "vllm:prompt_tokens"

# What kubectl says when it has no cluster to talk to (no kubeconfig, a wrong
# context, the endpoint out of reach, expired credentials).
_UNREACHABLE = (
    "connection to the server",
    "couldn't get current server api group list",
    "no configuration has been provided",
    "dial tcp",
    "i/o timeout",
    "unable to connect to the server",
    "you must be logged in",
    "the server has asked for the client to provide credentials",
    "current-context is not set",
)


class ClusterUnreachableError(RuntimeError):
    """kubectl is missing or cannot reach the cluster."""


def unreachable_message(settings: Settings, err: BaseException) -> str:
    """One line: what went wrong and the command that points kubectl at the stack's cluster."""
    detail = (str(err).strip().splitlines() or [""])[0]
    region = f" --region {settings.effective_region}" if settings.effective_region else " --region <region>"
    return (
        f"error: kubectl cannot reach the cluster ({detail}); run the stack's UpdateKubeconfigCommand output: "
        f"aws eks update-kubeconfig --name {settings.cluster_name}{region}"
    )


def kubectl(*args: str, timeout: float = 60) -> str:
    try:
        result = subprocess.run(["kubectl", *args], capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError:
        raise ClusterUnreachableError("kubectl is not installed or not on PATH") from None
    if result.returncode != 0:
        message = result.stderr.strip()
        if any(marker in message.lower() for marker in _UNREACHABLE):
            raise ClusterUnreachableError(message)
        raise RuntimeError(f"kubectl {' '.join(args)}: {message}")
    return result.stdout


def kubectl_json(*args: str) -> Any:
    return json.loads(kubectl(*args, "-o", "json"))


def worker_pods(settings: Settings) -> dict[str, list[dict[str, Any]]]:
    """Running worker pods of the RayService, by worker group (prefill, decode)."""
    pods = kubectl_json(
        "get",
        "pods",
        "-n",
        settings.serving_namespace,
        "-l",
        f"app.kubernetes.io/name={settings.service_name},ray.io/node-type=worker",
    )["items"]
    groups: dict[str, list[dict[str, Any]]] = {}
    for pod in pods:
        groups.setdefault(pod["metadata"]["labels"].get("ray.io/group", "?"), []).append(pod)
    return groups


def metrics_text(namespace: str, pod: str) -> str:
    """A pod's Ray metrics through the API server's proxy (no port-forward needed)."""
    return kubectl("get", "--raw", f"/api/v1/namespaces/{namespace}/pods/{pod}:{RAY_METRICS_PORT}/proxy/metrics")


def _metric_names(name: str) -> set[str]:
    plain = name.replace(":", "_")
    names = {name, plain, f"ray_{plain}", f"ray_{name}"}
    # Counters are exposed with a _total suffix.
    return names | {f"{n}_total" for n in names}


def metric_total(text: str, name: str) -> float | None:
    """Sum of one metric over all its label sets, under any of the names Ray or vLLM give it; None if absent."""
    wanted = _metric_names(name)
    found = False
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in wanted:
                found = True
                total += sample.value
    return total if found else None


@dataclass(frozen=True)
class NixlSnapshot:
    transfers: float
    transfer_seconds: float
    failed: float

    @classmethod
    def of(cls, text: str) -> NixlSnapshot:
        return cls(
            metric_total(text, XFER_COUNT) or 0.0,
            metric_total(text, XFER_SUM) or 0.0,
            metric_total(text, FAILED_TRANSFERS) or 0.0,
        )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def port_forward(settings: Settings, service: str, remote_port: int) -> Iterator[str]:
    """kubectl port-forward to the service on a free local port; yields the base URL."""
    port = _free_port()
    proc = subprocess.Popen(
        ["kubectl", "-n", settings.serving_namespace, "port-forward", f"svc/{service}", f"{port}:{remote_port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            if proc.poll() is not None:
                raise RuntimeError(f"port-forward exited: {proc.stderr.read().decode() if proc.stderr else ''}")
            time.sleep(0.5)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def http_json(url: str, body: dict[str, Any] | None = None, timeout: float = 300) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})  # noqa: S310
    with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - a local port-forward
        return json.loads(response.read())
