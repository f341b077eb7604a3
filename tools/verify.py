"""After `cdk deploy`: prove the KV cache moves over EFA with NIXL's LIBFABRIC backend.

    python -m tools.verify [-c key=value ...]     (the same -c settings as the deploy)

Checks, each a row of the table it prints (exit 1 on any failure):
1. prefill and decode workers run on distinct nodes, in one AZ, each with an EFA device;
2. the workers' Ray logs show NIXL's LIBFABRIC backend instantiated, no skipped
   backend registration, no UCX backend and no TCP/sockets libfabric provider;
3. /v1/models and one chat completion answer through the one serve endpoint;
4. after that request, decode's vllm:nixl_xfer_time_seconds_count has grown and
   vllm:nixl_num_failed_transfers is 0.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from serve_config import DECODE, EFA_RESOURCE, SERVE_PORT, SIDES, serve_service_name
from settings import Settings, settings_from_cli
from tools.cluster_access import (
    NixlSnapshot,
    http_json,
    kubectl,
    kubectl_json,
    metrics_text,
    port_forward,
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

    @property
    def problems(self) -> list[str]:
        found = []
        if "LIBFABRIC" not in self.instantiated:
            found.append("no 'Backend LIBFABRIC was instantiated'")
        if self.skipped:
            found.append(f"skipped backend registration: {sorted(self.skipped)}")
        if "UCX" in self.instantiated:
            found.append("UCX backend instantiated (TCP speed on EFA)")
        if self.nixl_missing:
            found.append("NIXL is not available")
        if self.tcp_provider:
            found.append("libfabric on a TCP/sockets provider, not efa")
        return found


def nixl_log_findings(text: str) -> LogFindings:
    return LogFindings(
        instantiated=frozenset(_INSTANTIATED.findall(text)),
        skipped=frozenset(_SKIPPED.findall(text)),
        nixl_missing=bool(_NIXL_MISSING.search(text)),
        tcp_provider=bool(_TCP_PROVIDER.search(text)),
    )


def placement_check(groups: dict[str, list[dict[str, Any]]], nodes: dict[str, dict[str, Any]]) -> Check:
    """Each side running, on its own node, all in one AZ, each pod holding an EFA device."""
    problems = []
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
            efa = [c["resources"].get("limits", {}).get(EFA_RESOURCE) for c in pod["spec"]["containers"]]
            allocatable = nodes.get(node, {}).get("status", {}).get("allocatable", {}).get(EFA_RESOURCE)
            if "1" not in efa or not allocatable or int(allocatable) < 1:
                problems.append(f"{pod['metadata']['name']}: no EFA device (limit {efa}, node has {allocatable})")
    if len(used) != len(set(used)):
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


def _guard(name: str, fn: Callable[[], Check]) -> Check:
    try:
        return fn()
    except Exception as err:
        return Check(name, False, f"{type(err).__name__}: {err}")


def run_checks(settings: Settings) -> list[Check]:
    ns = settings.serving_namespace
    groups = worker_pods(settings)
    node_names = {p["spec"].get("nodeName") for pods in groups.values() for p in pods if p["spec"].get("nodeName")}
    nodes = {name: kubectl_json("get", "node", name) for name in node_names}
    checks = [placement_check(groups, nodes)]

    def logs() -> Check:
        problems = []
        for side, pods in sorted(groups.items()):
            for pod in pods:
                text = kubectl("exec", "-n", ns, pod["metadata"]["name"], "--", "sh", "-c", LOG_GREP + " || true")
                problems += [f"{side}: {p}" for p in nixl_log_findings(text).problems]
        return Check(
            "NIXL LIBFABRIC backend, no fallback", not problems, "; ".join(problems) or "LIBFABRIC on every worker"
        )

    checks.append(_guard("NIXL LIBFABRIC backend, no fallback", logs))

    decode = groups.get(DECODE, [])
    decode_pod = decode[0]["metadata"]["name"] if decode else ""
    before = NixlSnapshot.of(metrics_text(ns, decode_pod)) if decode_pod else NixlSnapshot(0, 0, 0)
    with port_forward(settings, serve_service_name(settings), SERVE_PORT) as base:
        models = _guard(
            "GET /v1/models",
            lambda: _models_check(http_json(f"{base}/v1/models"), settings.model_id),
        )
        chat = _guard("POST /v1/chat/completions", lambda: _chat_check(base, settings.model_id))
    checks += [models, chat]
    after = NixlSnapshot.of(metrics_text(ns, decode_pod)) if decode_pod else before
    checks.append(metrics_check(before, after))
    return checks


def _models_check(body: dict[str, Any], model_id: str) -> Check:
    ids = [m.get("id") for m in body.get("data", [])]
    return Check("GET /v1/models", model_id in ids, f"models: {ids}")


def _chat_check(base: str, model_id: str) -> Check:
    prompt = "Explain in two sentences why prefill and decode are split across GPUs. " * 8
    body = http_json(
        f"{base}/v1/chat/completions",
        {"model": model_id, "messages": [{"role": "user", "content": prompt}], "max_tokens": 32},
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
    args = parser.parse_args(argv)
    checks = run_checks(settings_from_cli(args.context))
    print(table(checks))
    return 0 if all(c.ok for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
