"""What verify.py and bench.py share: kubectl, a port-forward to the endpoint, and NIXL metrics.

Everything here runs against a deployed stack with kubectl pointed at it
(`aws eks update-kubeconfig ...`, the stack's UpdateKubeconfigCommand output).
The parsing functions are pure and tested on recorded samples.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

import serve_config
from serve_config import endpoint_keys
from settings import Settings

# Ray exports each node's metrics here (KubeRay's default --metrics-export-port).
RAY_METRICS_PORT = serve_config.METRICS_PORT
# vLLM names them vllm:...; Ray's exporter turns ':' into '_' and prefixes ray_.
XFER_COUNT = "vllm:nixl_xfer_time_seconds_count"
XFER_SUM = "vllm:nixl_xfer_time_seconds_sum"
FAILED_TRANSFERS = "vllm:nixl_num_failed_transfers"
# Prompt tokens an engine has processed: grows on prefill when it serves a request.
PROMPT_TOKENS = "vllm:prompt_tokens"
# The engine's own latency histograms (vLLM 0.26 names; Ray exports them as ray_vllm_*).
# A client behind Ray Serve LLM sees tokens in batches (stream_batching_interval_ms), so its
# gaps between tokens are mostly zero; these are the engine's gaps, before any batching.
ENGINE_ITL = "vllm:inter_token_latency_seconds"
ENGINE_TPOT = "vllm:request_time_per_output_token_seconds"

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


@dataclass(frozen=True)
class Histogram:
    """A Prometheus histogram summed over its label sets: cumulative counts per upper bound."""

    buckets: tuple[tuple[float, float], ...]  # (le, cumulative count), ascending, +Inf last
    total: float
    count: float

    def minus(self, before: Histogram | None) -> Histogram:
        """The observations made between two scrapes (a missing earlier scrape counts as empty)."""
        if before is None:
            return self
        earlier = dict(before.buckets)
        return Histogram(
            tuple((le, n - earlier.get(le, 0.0)) for le, n in self.buckets),
            self.total - before.total,
            self.count - before.count,
        )

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count > 0 else None

    def quantile(self, q: float) -> float | None:
        """Prometheus's histogram_quantile: linear within the bucket holding rank q * count."""
        if self.count <= 0:
            return None
        rank = q * self.count
        lower, below = 0.0, 0.0
        for le, cumulative in self.buckets:
            if cumulative >= rank:
                if le == float("inf"):
                    return lower  # above the highest finite bound: that bound is all we know
                inside = cumulative - below
                return lower + (le - lower) * ((rank - below) / inside if inside > 0 else 1.0)
            lower, below = le, cumulative
        return lower


def _plus(a: Histogram | None, b: Histogram | None) -> Histogram | None:
    if a is None or b is None:
        return a or b
    counts = dict(a.buckets)
    for le, n in b.buckets:
        counts[le] = counts.get(le, 0.0) + n
    return Histogram(tuple(sorted(counts.items())), a.total + b.total, a.count + b.count)


@dataclass(frozen=True)
class EngineSnapshot:
    """The engines' own inter-token latency and per-request time per output token, summed over pods."""

    itl: Histogram | None
    tpot: Histogram | None

    @classmethod
    def of(cls, *texts: str) -> EngineSnapshot:
        itl = tpot = None
        for text in texts:
            itl, tpot = _plus(itl, histogram(text, ENGINE_ITL)), _plus(tpot, histogram(text, ENGINE_TPOT))
        return cls(itl, tpot)


def histogram(text: str, name: str) -> Histogram | None:
    """One histogram (vLLM's or Ray's name for it) summed over label sets; None if absent."""
    bases = _metric_names(name) - {f"{n}_total" for n in _metric_names(name)}
    buckets: dict[float, float] = {}
    total = count = 0.0
    found = False
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            for base in bases:
                if sample.name == f"{base}_bucket":
                    le = float(sample.labels["le"])
                    buckets[le] = buckets.get(le, 0.0) + sample.value
                    found = True
                elif sample.name == f"{base}_sum":
                    total += sample.value
                elif sample.name == f"{base}_count":
                    count += sample.value
    return Histogram(tuple(sorted(buckets.items())), total, count) if found else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def port_forward(settings: Settings, service: str, remote_port: int) -> Iterator[str]:
    """kubectl port-forward to the service on a free local port, started again whenever it ends; yields the
    base URL.

    kubectl resolves the Service to one of its pods when it starts and stays on that pod: when the pod
    goes (replaced, evicted, its node drained), kubectl exits. A run that outlives the pod would then
    fail every request after it; instead the forward starts again on the same local port and resolves
    the Service anew, so the requests in between fail and the ones after reach the new pod.
    """
    port = _free_port()
    command = ["kubectl", "-n", settings.serving_namespace, "port-forward", f"svc/{service}", f"{port}:{remote_port}"]
    forward = _Forward(command)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            if forward.proc.poll() is not None:
                raise RuntimeError(f"port-forward exited: {forward.stderr()}")
            time.sleep(0.5)
        forward.keep_running()
        yield f"http://127.0.0.1:{port}"
    finally:
        forward.stop()


class _Forward:
    """One kubectl port-forward process, started again each time it exits until stopped."""

    RESTART_AFTER_S = 1.0

    def __init__(self, command: list[str]) -> None:
        self.command = command
        self.starts = 0
        self.proc = self._start()
        self._stopped = threading.Event()
        self._watcher: threading.Thread | None = None

    def _start(self) -> subprocess.Popen[bytes]:
        self.starts += 1
        return subprocess.Popen(self.command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def stderr(self) -> str:
        return self.proc.stderr.read().decode() if self.proc.stderr else ""

    def keep_running(self) -> None:
        self._watcher = threading.Thread(target=self._watch, name="port-forward", daemon=True)
        self._watcher.start()

    def _watch(self) -> None:
        while not self._stopped.is_set():
            if self.proc.poll() is not None and not self._stopped.wait(self.RESTART_AFTER_S):
                self.proc = self._start()
            self._stopped.wait(0.2)

    def stop(self) -> None:
        self._stopped.set()
        if self._watcher is not None:
            self._watcher.join(timeout=10)
        self.proc.terminate()
        self.proc.wait(timeout=10)


def _request(
    url: str, body: dict[str, Any] | None, api_key: str | None, extra: dict[str, str] | None = None
) -> urllib.request.Request:
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", **(extra or {})}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return urllib.request.Request(url, data=data, headers=headers)  # noqa: S310 - a local port-forward


def http_json(
    url: str,
    body: dict[str, Any] | None = None,
    timeout: float = 300,
    api_key: str | None = None,
    headers: dict[str, str] | None = None,
) -> Any:
    with urllib.request.urlopen(_request(url, body, api_key, headers), timeout=timeout) as response:  # noqa: S310
        return json.loads(response.read())


def http_status(url: str, body: dict[str, Any] | None = None, timeout: float = 60, api_key: str | None = None) -> int:
    """The HTTP status of one request (an error status is an answer here, not an exception)."""
    try:
        with urllib.request.urlopen(_request(url, body, api_key), timeout=timeout) as response:  # noqa: S310
            return int(response.status)
    except urllib.error.HTTPError as err:
        return int(err.code)


# --- The endpoint's API key (setting endpoint_api_keys_secret_name) ----------------------------------
class EndpointKeyError(RuntimeError):
    """No key to send: the Secret is missing, unreadable with the caller's RBAC, or holds none."""


def first_key(keys_json: str) -> str:
    """The first key of the Secret's keys.json ({"<key id>": "<key>", ...}); the error never shows a key."""
    try:
        keys = json.loads(keys_json)
    except json.JSONDecodeError:
        raise EndpointKeyError(f"{endpoint_keys.API_KEYS_FILE_KEY} is not JSON") from None
    values = [v for v in keys.values() if isinstance(v, str) and v] if isinstance(keys, dict) else []
    if not values:
        shape = '{"<key id>": "<key>", ...}'
        raise EndpointKeyError(f"{endpoint_keys.API_KEYS_FILE_KEY} holds no key (expected {shape})")
    return values[0]


def endpoint_key(settings: Settings, env: Mapping[str, str] | None = None) -> str | None:
    """The key to send as `Authorization: Bearer`, or None when the endpoint takes none.

    OPENAI_API_KEY if set; else the first key of the Kubernetes Secret the endpoint reads
    (endpoint_keys.API_KEYS_SECRET in the serving namespace), through the caller's own RBAC.
    """
    if not getattr(settings, "endpoint_api_keys_secret_name", None):
        return None
    given = (os.environ if env is None else env).get("OPENAI_API_KEY")
    if given:
        return given
    field = endpoint_keys.API_KEYS_FILE_KEY.replace(".", "\\.")
    secret = f"{settings.serving_namespace}/{endpoint_keys.API_KEYS_SECRET}"
    try:
        encoded = kubectl(
            "get", "secret", "-n", settings.serving_namespace, endpoint_keys.API_KEYS_SECRET,
            "-o", f"jsonpath={{.data.{field}}}",
        )  # fmt: skip
    except ClusterUnreachableError:
        raise
    except RuntimeError as err:  # kubectl's own message: NotFound, Forbidden (it never holds the data)
        detail = (str(err).strip().splitlines() or [""])[-1]
        raise EndpointKeyError(f"cannot read secret {secret} (set OPENAI_API_KEY instead?): {detail}") from None
    if not encoded.strip():
        raise EndpointKeyError(f"secret {secret} has no {endpoint_keys.API_KEYS_FILE_KEY}")
    return first_key(base64.b64decode(encoded.strip()).decode())
