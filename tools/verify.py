"""After `cdk deploy`: prove the KV cache moves over EFA with NIXL's LIBFABRIC backend.

    python -m tools.verify [-c key=value ...] [--provider efa]   (the same -c settings as the deploy)

Checks, each a row of the table it prints (exit 1 on any failure):
1. prefill and decode workers run on distinct nodes, in one AZ, each with an EFA device;
2. each worker's Ray logs show NIXL's LIBFABRIC backend instantiated and NIXL's own
   "Created N rails using provider=efa" line (logged at INFO: the workers run with
   NIXL_LOG_LEVEL=INFO), no skipped backend registration, no UCX backend and no
   other libfabric provider. The absence of a TCP line is not proof: the efa line is;
3. the workers' NVIDIA driver is at least what the image's CUDA needs;
4. /v1/models and one chat completion answer through the one serve endpoint;
5. after that request (Ray exports metrics every 10 s, so decode's counters are
   polled for up to 30 s): decode's vllm:nixl_xfer_time_seconds_count has grown,
   vllm:nixl_num_failed_transfers is 0, and prefill's vllm:prompt_tokens grew
   (prefill really served the request). The baselines are taken only once the
   counters have held still for longer than Ray's export interval: decode's
   pre-warm request, exported late, must not count as this request's transfer;
6. in one worker pod, the image: ray, vllm and nixl at the pinned versions, NIXL's
   LIBFABRIC plugin finding every shared library it needs, boto3 with an s3:// source;
7. with endpoint_api_keys_secret_name set: a request without a key gets 401; the
   requests above carry one (OPENAI_API_KEY, else the endpoint's own Secret).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from serve_config import DECODE, EFA_RESOURCE, PREFILL, SERVE_PORT, SIDES, ingress_service_name, worker_resources
from settings import Settings
from settings.catalog import IMAGE_MIN_NVIDIA_DRIVER, IMAGE_NIXL_VERSION, IMAGE_RAY_VERSION, IMAGE_VLLM_VERSION
from settings.cli import cli_settings
from tools import image_probe, verify_observability
from tools.cluster_access import (
    FAILED_TRANSFERS,
    PROMPT_TOKENS,
    XFER_COUNT,
    ClusterUnreachableError,
    EndpointKeyError,
    NixlSnapshot,
    endpoint_key,
    http_json,
    http_status,
    kubectl,
    kubectl_json,
    metric_total,
    metrics_text,
    port_forward,
    unreachable_message,
    worker_pods,
)

# Ray writes actor and Serve replica output here, not to the container's stdout.
RAY_LOGS = "/tmp/ray/session_latest/logs"  # noqa: S108 - a path inside the Ray pod
LOG_GREP = f"grep -h -i -E 'nixl|libfabric|backend|provider' {RAY_LOGS}/*.out {RAY_LOGS}/*.err {RAY_LOGS}/serve/*.log"

# Strings NIXL (nixl/_api.py) and vLLM (nixl/base_worker.py) log, read from their source.
_INSTANTIATED = re.compile(r"Backend (\w+) was instantiated")
_SKIPPED = re.compile(r"Skipping backend registration (\w+)")
_NIXL_MISSING = re.compile(r"NIXL is not available")
_TCP_PROVIDER = re.compile(r"provider\W{0,3}(tcp|sockets|udp)\b", re.IGNORECASE)
# nixl's libfabric rail manager: "Created 2 rails using provider=efa" (INFO).
_RAILS = re.compile(r"rails using provider\W{0,2}(\w+)")
_RAIL_COUNT = re.compile(r"Created (\d+) rails using provider")
_TCP_FALLBACK = re.compile(r"\(TCP fallback\)")
T = TypeVar("T")
# The provider the GPU nodes' libfabric must use; the CPU rehearsal passes tcp.
DEFAULT_PROVIDER = "efa"
# How long Ray takes to export a counter (metrics_report_interval_ms, 10 s), with margin.
METRICS_WAIT_SECONDS = 30.0
# Ray's metrics_report_interval_ms: a reading unchanged for longer than this includes
# everything that happened before it was first taken.
EXPORT_INTERVAL_SECONDS = 10.0
# What the image must hold (settings/catalog.py; requirements-serve.lock pins the same).
IMAGE_PINS = {"ray": IMAGE_RAY_VERSION, "vllm": IMAGE_VLLM_VERSION, "nixl": IMAGE_NIXL_VERSION}


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class LogFindings:
    instantiated: frozenset[str]
    skipped: frozenset[str]
    nixl_missing: bool
    tcp_provider: bool
    rail_providers: frozenset[str] = frozenset()
    tcp_fallback: bool = False
    expected_provider: str = DEFAULT_PROVIDER
    # The most rails one NIXL agent logged, and the EFA devices the pod holds (0: not checked):
    # a pod holding several cards should spread its rails across all of them.
    rails: int = 0
    expected_rails: int = 0

    @property
    def problems(self) -> list[str]:
        found = []
        if "LIBFABRIC" not in self.instantiated:
            found.append("no 'Backend LIBFABRIC was instantiated'")
        if self.expected_provider not in self.rail_providers:
            found.append(
                f"no NIXL 'rails using provider={self.expected_provider}' line "
                f"(providers seen: {sorted(self.rail_providers) or 'none'}; is NIXL_LOG_LEVEL=INFO set?)"
            )
        others = self.rail_providers - {self.expected_provider}
        if others:
            found.append(f"NIXL rails on {sorted(others)}, not {self.expected_provider}")
        if self.rails < self.expected_rails:
            found.append(f"NIXL created {self.rails} rail(s), fewer than the pod's {self.expected_rails} EFA devices")
        if self.tcp_fallback and self.expected_provider != "tcp":
            found.append("NIXL logged a TCP fallback")
        if self.skipped:
            found.append(f"skipped backend registration: {sorted(self.skipped)}")
        if "UCX" in self.instantiated:
            found.append("UCX backend instantiated (UCX picks its transports; without its EFA one it runs over TCP)")
        if self.nixl_missing:
            found.append("NIXL is not available")
        if self.tcp_provider and self.expected_provider not in ("tcp", "sockets"):
            found.append(f"libfabric on a TCP/sockets provider, not {self.expected_provider}")
        return found


def nixl_log_findings(text: str, expected_provider: str = DEFAULT_PROVIDER, expected_rails: int = 0) -> LogFindings:
    return LogFindings(
        instantiated=frozenset(_INSTANTIATED.findall(text)),
        skipped=frozenset(_SKIPPED.findall(text)),
        nixl_missing=bool(_NIXL_MISSING.search(text)),
        tcp_provider=bool(_TCP_PROVIDER.search(text)),
        rail_providers=frozenset(p.lower() for p in _RAILS.findall(text)),
        tcp_fallback=bool(_TCP_FALLBACK.search(text)),
        expected_provider=expected_provider,
        rails=max((int(n) for n in _RAIL_COUNT.findall(text)), default=0),
        expected_rails=expected_rails,
    )


def driver_check(versions: dict[str, str], minimum: int) -> Check:
    """Each worker's `nvidia-smi --query-gpu=driver_version` against the image's CUDA minimum."""
    problems = []
    for pod, text in sorted(versions.items()):
        first = text.strip().splitlines()[0] if text.strip() else ""
        try:
            major = int(first.split(".")[0])
        except ValueError:
            problems.append(f"{pod}: no driver version from nvidia-smi ({first!r})")
            continue
        if major < minimum:
            problems.append(f"{pod}: driver {first} < {minimum}, which the image's CUDA needs")
    detail = "; ".join(problems) or ", ".join(f"{p}: {v.strip()}" for p, v in sorted(versions.items()))
    return Check(f"NVIDIA driver >= {minimum}", bool(versions) and not problems, detail or "no workers")


def poll(
    read: Callable[[], T],
    done: Callable[[T], bool],
    *,
    timeout: float = METRICS_WAIT_SECONDS,
    interval: float = 2.0,
    sleep: Callable[[float], None] | None = None,
) -> T:
    """Read until done(reading) or the timeout passes (Ray exports metrics every 10 s); the last reading."""
    pause = sleep or time.sleep
    waited = 0.0
    value = read()
    while not done(value) and waited < timeout:
        pause(interval)
        waited += interval
        value = read()
    return value


def settled(
    read: Callable[[], T],
    *,
    quiet: float = EXPORT_INTERVAL_SECONDS + 2.0,
    timeout: float = 90.0,
    interval: float = 2.0,
    sleep: Callable[[float], None] | None = None,
) -> T:
    """A baseline: read until the value has held still for longer than Ray's export interval.

    A counter read once right after a deploy may not yet include decode's pre-warm (its
    transfer and prefill's prompt tokens), which Ray exports up to 10 s later; that late
    export would then pass for the growth a check request causes. Gives up after timeout
    (steady traffic) with the last reading.
    """
    pause = sleep or time.sleep
    value = read()
    still = waited = 0.0
    while still < quiet and waited < timeout:
        pause(interval)
        waited += interval
        latest = read()
        still = still + interval if latest == value else 0.0
        value = latest
    return value


def poll_until_grown(
    read: Callable[[], NixlSnapshot],
    before: NixlSnapshot,
    *,
    timeout: float = METRICS_WAIT_SECONDS,
    interval: float = 2.0,
    sleep: Callable[[float], None] | None = None,
) -> NixlSnapshot:
    """Read decode's counters until the transfer count grows or the timeout passes; the last reading."""
    return poll(read, lambda after: after.transfers > before.transfers, timeout=timeout, interval=interval, sleep=sleep)


def grew(before: float | None) -> Callable[[float | None], bool]:
    """A done() for poll: the counter exists and is above before."""
    return lambda after: after is not None and after > (before or 0.0)


def prefill_check(before: float | None, after: float | None) -> Check:
    """Prefill's own prompt-token counter grew: the request's prefill really ran there."""
    ok = after is not None and (before or 0.0) < after
    return Check("prefill served the request", ok, f"prefill vllm:prompt_tokens {before} -> {after}")


def placement_check(
    groups: dict[str, list[dict[str, Any]]],
    nodes: dict[str, dict[str, Any]],
    efa_per_pod: Mapping[str, int] | None = None,
    pods_per_node: Mapping[str, int] | None = None,
) -> Check:
    """Each side running, all in one AZ, each pod holding its share of its node's EFA devices (one by
    default), and no node holding more worker pods than its GPUs split into (one by default)."""
    problems = []
    per_node: dict[str, int] = {}
    used: list[str] = []
    zones = set()
    for side in SIDES:
        running = [p for p in groups.get(side, []) if p["status"].get("phase") == "Running"]
        if not running:
            problems.append(f"no running {side} worker")
        for pod in running:
            node = pod["spec"].get("nodeName", "")
            used.append(node)
            zones.add(nodes.get(node, {}).get("metadata", {}).get("labels", {}).get("topology.kubernetes.io/zone"))
            per_node[node] = max(per_node.get(node, 0), (pods_per_node or {}).get(side, 1))
            want = str((efa_per_pod or {}).get(side, 1))
            efa = [c["resources"].get("limits", {}).get(EFA_RESOURCE) for c in pod["spec"]["containers"]]
            allocatable = nodes.get(node, {}).get("status", {}).get("allocatable", {}).get(EFA_RESOURCE)
            if want not in efa or not allocatable or int(allocatable) < int(want):
                problems.append(
                    f"{pod['metadata']['name']}: no EFA device, or not its {want} (limit {efa}, node has {allocatable})"
                )
    if any(used.count(node) > most for node, most in per_node.items()):
        problems.append(f"workers share nodes: {used}")
    if len(zones) > 1:
        problems.append(f"workers span AZs: {sorted(map(str, zones))}")
    detail = "; ".join(problems) or f"{len(used)} workers on {len(set(used))} nodes in {next(iter(zones), '?')}"
    return Check("workers on distinct EFA nodes, one AZ", not problems, detail)


def metrics_check(before: NixlSnapshot, after: NixlSnapshot) -> Check:
    grew = after.transfers > before.transfers
    ok = grew and after.failed == 0
    detail = (
        f"nixl_xfer_time_seconds_count {before.transfers:g} -> {after.transfers:g}, "
        f"nixl_num_failed_transfers {after.failed:g}"
    )
    return Check("decode pulled KV over NIXL", ok, detail)


# Ray 2.58 (serving_patterns/prefill_decode/pd_server.py): a prefill replica that answered decode's
# pre-warm with an error is skipped, and decode turns healthy with no NIXL handshake to it.
PREWARM_SKIPPED = "returned empty kv_params; skipping"


def prewarm_check(logs: Mapping[str, str]) -> Check:
    """Decode's logs: its pre-warm skipped no prefill replica (a prefill-side error is otherwise silent)."""
    found = [
        f"{where}: {line.strip()[-120:]}"
        for where, text in sorted(logs.items())
        for line in text.splitlines()
        if PREWARM_SKIPPED in line
    ]
    return Check("decode's pre-warm reached prefill", not found, "; ".join(found[:3]) or "no prefill replica skipped")


def no_nixl_check(metrics: Mapping[str, str], logs: Mapping[str, str]) -> Check:
    """Aggregated mode: no worker has NIXL metrics or NIXL log lines; no KV moves between replicas."""
    problems = []
    for pod, text in sorted(metrics.items()):
        present = [name for name in (XFER_COUNT, FAILED_TRANSFERS) if metric_total(text, name) is not None]
        if present:
            problems.append(f"{pod}: {', '.join(present)} exported")
    for pod, text in sorted(logs.items()):
        found = nixl_log_findings(text)
        if found.instantiated or found.rail_providers:
            problems.append(
                f"{pod}: NIXL backend {sorted(found.instantiated) or sorted(found.rail_providers)} in its logs"
            )
    detail = "; ".join(problems) or f"no NIXL metrics or log lines on {len(metrics)} workers"
    return Check("no NIXL activity (aggregated)", not problems, detail)


def served_check(before: float | None, after: float | None) -> Check:
    """Aggregated mode: the workers' prompt-token counters grew: a replica served it, and Ray exported that."""
    ok = after is not None and (before or 0.0) < after
    return Check("a replica served the request", ok, f"workers' vllm:prompt_tokens {before} -> {after}")


def image_probe_command(namespace: str, pod: str, *, s3: bool) -> list[str]:
    """kubectl arguments running tools/image_probe.py in a pod, with the image's own python."""
    source = Path(image_probe.__file__).read_text()
    run = 'exec "$(command -v python3 || command -v python)" -c "$0" "$@"'
    return ["exec", "-n", namespace, pod, "--", "sh", "-c", run, source, *(["--s3"] if s3 else [])]


def image_checks(output: str, *, pod: str, s3: bool, pins: Mapping[str, str] = IMAGE_PINS) -> list[Check]:
    """The probe's findings judged: one FAIL row per missing piece, naming it; one PASS row if none."""
    try:
        found = json.loads(output.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return [Check("image probe", False, f"{pod}: no answer from the probe ({output.strip()[:200]!r})")]
    failed = []
    versions = found.get("versions") or {}
    for name, pin in pins.items():
        if versions.get(name) != pin:
            have = versions.get(name) or "not installed"
            failed.append(Check(f"image: {name} {pin}", False, f"{pod}: {name} {have}, pinned {pin}"))
    if not found.get("plugin"):
        where = found.get("plugin_expected_at") or "no nixl_cu<N> package"
        failed.append(Check("image: NIXL LIBFABRIC plugin", False, f"{pod}: {image_probe.PLUGIN} missing ({where})"))
    for library in found.get("ldd_not_found") or []:
        failed.append(
            Check(f"image: {library}", False, f"{pod}: {image_probe.PLUGIN} needs {library}: ldd says not found")
        )
    if s3 and found.get("boto3") != "ok":
        failed.append(Check("image: boto3", False, f"{pod}: boto3 does not import ({found.get('boto3')})"))
    if failed:
        return failed
    have = ", ".join(f"{name} {versions[name]}" for name in pins)
    extra = ", boto3" if s3 else ""
    return [Check("image: pins, LIBFABRIC plugin libraries", True, f"{pod}: {have}, plugin resolves{extra}")]


def auth_check(base: str, model_id: str, status: Callable[..., int] | None = None) -> Check:
    """With keys on: a chat completion without a key is refused with 401 (the key itself is never shown)."""
    body = {"model": model_id, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    code = (status or http_status)(f"{base}/v1/chat/completions", body)
    return Check("a request without a key is refused", code == 401, f"HTTP {code} (expected 401)")


def guard(name: str, fn: Callable[[], Check]) -> Check:
    try:
        return fn()
    except Exception as err:
        return Check(name, False, f"{type(err).__name__}: {err}")


def run_checks(
    settings: Settings,
    expected_provider: str = DEFAULT_PROVIDER,
    *,
    api_key: str | None = None,
    sleep: Callable[[float], None] | None = None,
) -> list[Check]:
    """Every check against the deployed stack; api_key: sent on the endpoint's requests when keys are on
    (None: endpoint_key(settings), i.e. OPENAI_API_KEY, else the endpoint's Secret)."""
    ns = settings.serving_namespace
    groups = worker_pods(settings)
    node_names = {p["spec"].get("nodeName") for pods in groups.values() for p in pods if p["spec"].get("nodeName")}
    nodes = {name: kubectl_json("get", "node", name) for name in node_names}
    efa_per_pod = {side: int(worker_resources(settings, side)[EFA_RESOURCE]) for side in SIDES}
    pods_per_node = {side: settings.replicas_per_node(side) for side in SIDES}
    checks = [placement_check(groups, nodes, efa_per_pod, pods_per_node)]
    keys_on = bool(getattr(settings, "endpoint_api_keys_secret_name", None))
    key = api_key
    if keys_on and key is None:
        try:
            key = endpoint_key(settings)
        except EndpointKeyError as err:  # no key: the requests below then show the refusal
            checks.append(Check("an endpoint key to send", False, f"{type(err).__name__}: {err}"))

    def logs() -> Check:
        problems = []
        for side, pods in sorted(groups.items()):
            for pod in pods:
                text = kubectl("exec", "-n", ns, pod["metadata"]["name"], "--", "sh", "-c", LOG_GREP + " || true")
                findings = nixl_log_findings(text, expected_provider, efa_per_pod.get(side, 0))
                problems += [f"{side}: {p}" for p in findings.problems]
        return Check(
            "NIXL LIBFABRIC backend, no fallback", not problems, "; ".join(problems) or "LIBFABRIC on every worker"
        )

    aggregated = settings.serving_mode == "aggregated"
    if not aggregated:
        checks.append(guard("NIXL LIBFABRIC backend, no fallback", logs))
        skipped = f"grep -h -F '{PREWARM_SKIPPED}' {RAY_LOGS}/*.out {RAY_LOGS}/*.err {RAY_LOGS}/serve/*.log || true"
        checks.append(guard("decode's pre-warm reached prefill", lambda: prewarm_check({
            name: kubectl("exec", "-n", ns, name, "--", "sh", "-c", skipped)
            for name in (p["metadata"]["name"] for p in groups.get(DECODE, []))
        })))  # fmt: skip

    def drivers() -> Check:
        versions = {
            pod["metadata"]["name"]: kubectl(
                "exec",
                "-n",
                ns,
                pod["metadata"]["name"],
                "--",
                "nvidia-smi",
                "--query-gpu=driver_version",
                "--format=csv,noheader",
            )
            for pods in groups.values()
            for pod in pods
        }
        return driver_check(versions, IMAGE_MIN_NVIDIA_DRIVER)

    checks.append(guard(f"NVIDIA driver >= {IMAGE_MIN_NVIDIA_DRIVER}", drivers))

    first = next((pod["metadata"]["name"] for _, pods in sorted(groups.items()) for pod in pods), None)
    s3 = (settings.model_source or "").startswith("s3://")
    if first is None:
        checks.append(Check("image probe", False, "no worker pod to probe"))
    else:
        try:
            checks += image_checks(kubectl(*image_probe_command(ns, first, s3=s3)), pod=first, s3=s3)
        except Exception as err:  # a failed exec is a finding, not a crash
            checks.append(Check("image probe", False, f"{first}: {type(err).__name__}: {err}"))

    decode = groups.get(DECODE, [])
    decode_pod = decode[0]["metadata"]["name"] if decode else ""
    prefill = groups.get(PREFILL, [])
    prefill_pod = prefill[0]["metadata"]["name"] if prefill else ""

    def decode_counters() -> NixlSnapshot:
        return NixlSnapshot.of(metrics_text(ns, decode_pod)) if decode_pod else NixlSnapshot(0.0, 0.0, 0.0)

    def prefill_tokens() -> float | None:
        return metric_total(metrics_text(ns, prefill_pod), PROMPT_TOKENS) if prefill_pod else None

    all_pods = [p["metadata"]["name"] for pods in groups.values() for p in pods]

    def workers_prompt_tokens() -> float | None:
        totals = [metric_total(metrics_text(ns, pod), PROMPT_TOKENS) for pod in all_pods]
        present = [t for t in totals if t is not None]
        return sum(present) if present else None

    # Baselines only once Ray's export has caught up (decode's pre-warm went through prefill).
    if aggregated:
        before, prefill_before = NixlSnapshot(0.0, 0.0, 0.0), settled(workers_prompt_tokens, sleep=sleep)
    else:
        before, prefill_before = settled(lambda: (decode_counters(), prefill_tokens()), sleep=sleep)
    with port_forward(settings, ingress_service_name(settings), SERVE_PORT) as base:
        models = guard(
            "GET /v1/models",
            lambda: models_check(http_json(f"{base}/v1/models", api_key=key), settings.model_id),
        )
        chat = guard("POST /v1/chat/completions", lambda: chat_check(base, settings.model_id, api_key=key))
        refused = [guard("a request without a key is refused", lambda: auth_check(base, settings.model_id))]
    checks += [models, chat, *(refused if keys_on else [])]
    if aggregated:
        checks.append(served_check(prefill_before, poll(workers_prompt_tokens, grew(prefill_before), sleep=sleep)))

        def quiet() -> Check:
            metrics = {pod: metrics_text(ns, pod) for pod in all_pods}
            logs = {pod: kubectl("exec", "-n", ns, pod, "--", "sh", "-c", LOG_GREP + " || true") for pod in all_pods}
            return no_nixl_check(metrics, logs)

        checks.append(guard("no NIXL activity (aggregated)", quiet))
        return checks
    after = poll_until_grown(decode_counters, before, sleep=sleep)
    checks.append(metrics_check(before, after))
    checks.append(prefill_check(prefill_before, poll(prefill_tokens, grew(prefill_before), sleep=sleep)))
    return checks


def models_check(body: dict[str, Any], model_id: str) -> Check:
    ids = [m.get("id") for m in body.get("data", [])]
    return Check("GET /v1/models", model_id in ids, f"models: {ids}")


def chat_check(base: str, model_id: str, api_key: str | None = None) -> Check:
    prompt = "Explain in two sentences why prefill and decode are split across GPUs. " * 8
    body = http_json(
        f"{base}/v1/chat/completions",
        {"model": model_id, "messages": [{"role": "user", "content": prompt}], "max_tokens": 32},
        api_key=api_key,
    )
    text = body["choices"][0]["message"]["content"]
    return Check("POST /v1/chat/completions", bool(text), f"{len(text)} characters back")


def table(checks: list[Check]) -> str:
    width = max(len(c.name) for c in checks)
    rows = [f"{'check':<{width}}  result  detail", f"{'-' * width}  ------  ------"]
    rows += [f"{c.name:<{width}}  {'PASS' if c.ok else 'FAIL':<6}  {c.detail}" for c in checks]
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Verify a deployed stack (kubectl must point at its cluster)")
    parser.add_argument("-c", "--context", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument(
        "--provider", default=DEFAULT_PROVIDER, help="the libfabric provider NIXL must use (default: efa)"
    )
    args = parser.parse_args(argv)
    settings = cli_settings(args.context)
    try:
        checks = run_checks(settings, args.provider)
        # The pipeline, after verify's own request: every dashboard panel has data (tools/verify_observability.py).
        checks += verify_observability.live_checks(settings)
    except ClusterUnreachableError as err:
        print(unreachable_message(settings, err), file=sys.stderr)
        return 2
    print(table(checks))
    return 0 if all(c.ok for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
