"""verify's judgements: each turns what was read from the cluster into one Check row (or a few)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from serve_config import EFA_RESOURCE, SIDES
from serve_config.pod_templates import IMAGE_CA_BUNDLE
from tools.checks import IMAGE_PINS, Check, nixl_log_findings
from tools.cluster_access import (
    FAILED_TRANSFERS,
    XFER_COUNT,
    NixlSnapshot,
    metric_total,
)
from tools.in_pod import image_probe


def prefill_check(before: float | None, after: float | None) -> Check:
    """Prefill's own prompt-token counter grew: the request's prefill really ran there."""
    ok = after is not None and (before or 0.0) < after
    return Check("prefill served the request", ok, f"prefill vllm:prompt_tokens {before} -> {after}")


def local_prefill_check(
    threshold: int,
    prompt_tokens: int | None,
    before: tuple[NixlSnapshot, float | None],
    after: tuple[NixlSnapshot, float | None],
) -> Check:
    """A prompt of at most local_prefill_max_tokens, sent without the route header: decode prefilled it itself, so
    decode pulled no KV and prefill's prompt-token counter stood still (docs/architecture.md, "Which requests are
    split")."""
    moved = after[0].transfers - before[0].transfers
    prefilled = (after[1] or 0.0) - (before[1] or 0.0)
    short = prompt_tokens is not None and prompt_tokens <= threshold
    return Check(
        "a short prompt is prefilled on decode: no KV moved",
        short and moved == 0 and prefilled == 0,
        f"{prompt_tokens} prompt tokens at local_prefill_max_tokens {threshold}: {moved:g} NIXL transfers, "
        f"prefill vllm:prompt_tokens +{prefilled:g}",
    )


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
    # Judged where the probe reports it (every probe of this version does): the head names this file as the GCS
    # store's CA, and Ray stops where it is missing.
    bundles = found.get("ca_bundles")
    if bundles is not None and IMAGE_CA_BUNDLE not in bundles:
        failed.append(
            Check("image: CA bundle", False, f"{pod}: {IMAGE_CA_BUNDLE} missing (the image has {bundles or 'none'})")
        )
    if failed:
        return failed
    have = ", ".join(f"{name} {versions[name]}" for name in pins)
    extra = ", boto3" if s3 else ""
    # Reported, not judged: the product does not stream weights (docs/hardware-and-models.md).
    streamer = found.get("streamer") or {}
    held = [f"{name} {v}" for name, v in streamer.items() if v] or ["absent"]
    return [
        Check(
            "image: pins, LIBFABRIC plugin libraries",
            True,
            f"{pod}: {have}, plugin resolves{extra}{', CA bundle' if bundles else ''}; "
            f"Run:ai streamer (not used): {', '.join(held)}",
        )
    ]


def models_check(body: dict[str, Any], model_id: str) -> Check:
    ids = [m.get("id") for m in body.get("data", [])]
    return Check("GET /v1/models", model_id in ids, f"models: {ids}")


def answer_check(body: dict[str, Any]) -> Check:
    """A chat completion came back with text: its answer (`content`) or, from a thinking model whose max_tokens ran out
    while it thought, its thinking (vLLM's `reasoning`, with the model's reasoning parser; `content` is then null)."""
    message = (body.get("choices") or [{}])[0].get("message") or {}
    answer, thinking = message.get("content") or "", message.get("reasoning") or ""
    if answer:
        detail = f"{len(answer)} characters of answer" + (f", {len(thinking)} of reasoning" if thinking else "")
    elif thinking:
        detail = f"{len(thinking)} characters of reasoning, no answer yet (max_tokens)"
    else:
        detail = f"no content and no reasoning: {json.dumps(body)[:200]}"
    return Check("POST /v1/chat/completions", bool(answer or thinking), detail)
