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
import sys
from collections.abc import Callable
from pathlib import Path

from serve_config import DECODE, EFA_RESOURCE, PREFILL, SERVE_PORT, SIDES, ingress_service_name
from serve_config.deployments import PREFILL_ROUTE_HEADER
from serve_config.pod_templates import worker_resources
from settings import Settings, sizing
from settings.catalog import IMAGE_MIN_NVIDIA_DRIVER
from settings.cli import USAGE_EXIT, cli_settings
from tools import verify_observability
from tools.checks import DEFAULT_PROVIDER, Check, driver_check, nixl_log_findings, table
from tools.cluster_access import (
    PROMPT_TOKENS,
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
from tools.in_pod import image_probe
from tools.polling import grew, poll, poll_until_grown, settled
from tools.verify_judgement import (
    PREWARM_SKIPPED,
    answer_check,
    image_checks,
    local_prefill_check,
    metrics_check,
    models_check,
    no_nixl_check,
    placement_check,
    prefill_check,
    prewarm_check,
    served_check,
)

# Ray writes actor and Serve replica output here, not to the container's stdout.
RAY_LOGS = "/tmp/ray/session_latest/logs"  # noqa: S108 - a path inside the Ray pod
LOG_GREP = f"grep -h -i -E 'nixl|libfabric|backend|provider' {RAY_LOGS}/*.out {RAY_LOGS}/*.err {RAY_LOGS}/serve/*.log"


def image_probe_command(namespace: str, pod: str, *, s3: bool) -> list[str]:
    """kubectl arguments running tools/in_pod/image_probe.py in a pod, with the image's own python."""
    source = Path(image_probe.__file__).read_text()
    run = 'exec "$(command -v python3 || command -v python)" -c "$0" "$@"'
    return ["exec", "-n", namespace, pod, "--", "sh", "-c", run, source, *(["--s3"] if s3 else [])]


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
        words, header = split_request(settings)
        chat = guard(
            "POST /v1/chat/completions",
            lambda: chat_check(base, settings.model_id, api_key=key, prompt_words=words, route_header=header),
        )
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
    threshold = sizing.local_prefill_threshold(settings)
    if threshold:

        def short_prompt() -> Check:
            counters = settled(lambda: (decode_counters(), prefill_tokens()), sleep=sleep)
            with port_forward(settings, ingress_service_name(settings), SERVE_PORT) as base:
                tokens = short_chat(base, settings.model_id, api_key=key)
            return local_prefill_check(
                threshold, tokens, counters, settled(lambda: (decode_counters(), prefill_tokens()), sleep=sleep)
            )

        checks.append(guard("a short prompt is prefilled on decode: no KV moved", short_prompt))
    return checks


CHAT_MAX_TOKENS = 32
# Room for the chat template around the prompt's words, in tokens.
TEMPLATE_TOKENS = 64


def split_request(settings: Settings) -> tuple[int, bool]:
    """How verify's chat asks for the KV path (docs/architecture.md, "Which requests are split"): (a prompt of at
    least this many words, 0 for the short one; send the x-pd-prefill header). A prompt past local_prefill_max_tokens
    (a word is a token at least), which the product splits by its own rule; where none fits under max_model_len, the
    header, which the endpoint takes only from a key in pd_prefill_header_keys (docs/security.md)."""
    threshold = sizing.local_prefill_threshold(settings)
    if threshold == 0:
        return 0, False
    words = threshold + 1
    if words + TEMPLATE_TOKENS + CHAT_MAX_TOKENS <= settings.max_model_len:
        return words, False
    return 0, True


def chat_check(
    base: str, model_id: str, api_key: str | None = None, prompt_words: int = 0, route_header: bool = False
) -> Check:
    prompt = "Explain in two sentences why prefill and decode are split across GPUs. " * 8
    if prompt_words:
        prompt = "Read these words, then explain in two sentences why prefill and decode are split: " + " ".join(
            ["word"] * prompt_words
        )
    body = http_json(
        f"{base}/v1/chat/completions",
        {"model": model_id, "messages": [{"role": "user", "content": prompt}], "max_tokens": CHAT_MAX_TOKENS},
        api_key=api_key,
        headers={PREFILL_ROUTE_HEADER: "split"} if route_header else None,
    )
    return answer_check(body)


SHORT_PROMPT = "Say hello."


def short_chat(base: str, model_id: str, api_key: str | None = None) -> int | None:
    """A short chat without the route header, which the threshold decides: its prompt tokens, as the engine
    counted them."""
    body = http_json(
        f"{base}/v1/chat/completions",
        {"model": model_id, "messages": [{"role": "user", "content": SHORT_PROMPT}], "max_tokens": 4},
        api_key=api_key,
    )
    tokens = (body.get("usage") or {}).get("prompt_tokens")
    return int(tokens) if tokens is not None else None


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
        return USAGE_EXIT
    print(table(checks))
    return 0 if all(c.ok for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
