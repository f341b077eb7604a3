"""The checks: the dashboard's token refusals, verify's own checks on the deployed app, and bench."""

from __future__ import annotations

import json
import secrets
import subprocess
from pathlib import Path
from typing import Any

from rehearsal import deploy
from rehearsal.cluster import ray_logs
from rehearsal.context import Context
from rehearsal.deploy import kuberay_headers
from rehearsal.network import DASHBOARD, DECODE_METRICS, PREFILL_METRICS, SERVE, http, metrics_text, status_of
from settings.catalog import THINKING_OFF
from settings.project import ROOT
from tools import bench as tools_bench
from tools import bench_results
from tools.checks import Check, nixl_log_findings
from tools.cluster_access import PROMPT_TOKENS, EngineSnapshot, NixlSnapshot, http_json, http_status, metric_total
from tools.polling import grew, poll, poll_until_grown, settled
from tools.verify import chat_check, guard
from tools.verify_judgement import (
    metrics_check,
    models_check,
    no_nixl_check,
    prefill_check,
    prewarm_check,
    served_check,
)

# libfabric's provider here: no EFA device, so verify expects tcp instead of efa.
EXPECTED_PROVIDER = "tcp"
BENCH_POINTS = ((128, 1), (512, 2))
BENCH_OUTPUT_LEN = 16
BENCH_PROMPTS = 4


def auth_checks(config: dict[str, Any], env: dict[str, str]) -> list[Any]:
    """With token authentication on: a deploy or a job without the token is refused (401), a wrong token too (403)."""

    if not kuberay_headers(env):
        return []
    job = {"entrypoint": "python -c 'print(1)'"}
    wrong = {"x-ray-authorization": f"Bearer {secrets.token_hex(32)}"}
    found = []
    for name, url, body, method, headers, expected in (
        ("a deploy without the token is refused", "/api/serve/applications/", config, "PUT", {}, 401),
        ("a job without the token is refused", "/api/jobs/", job, "POST", {}, 401),
        ("a job with a wrong token is refused", "/api/jobs/", job, "POST", wrong, 403),
    ):
        status = status_of(f"{DASHBOARD}{url}", body, method, headers)
        found.append(Check(f"dashboard: {name}", status == expected, f"HTTP {status} (expected {expected})"))
    return found


def all_prompt_tokens() -> float | None:
    """Both nodes' prompt-token counters summed; None before either exports one."""

    found = [metric_total(metrics_text(url), PROMPT_TOKENS) for url in (PREFILL_METRICS, DECODE_METRICS)]
    present = [value for value in found if value is not None]
    return sum(present) if present else None


# Decode's pre-warm (Ray 2.58 pd_server.py) sends the prompt " x" with max_tokens 1 through each
# prefill replica: one prompt token, one KV block, one NIXL read by decode (vLLM 0.26 pulls every
# prompt block, nixl/pull_scheduler.py). So the pre-warm proves the handshake and a real transfer.
PREWARM_TRANSFERS = 1.0
NIXL_BYTES = "vllm:nixl_bytes_transferred_sum"


def prewarm_probe(ctx: Context) -> list[Any]:
    """What decode's pre-warm moved, read after deploy and before any request, once Ray's export held still."""

    if ctx.aggregated:
        return []

    def read() -> tuple[NixlSnapshot, float | None, float | None]:
        decode, prefill = metrics_text(DECODE_METRICS), metrics_text(PREFILL_METRICS)
        return NixlSnapshot.of(decode), metric_total(decode, NIXL_BYTES), metric_total(prefill, PROMPT_TOKENS)

    counters, moved, prompt = settled(read)
    ctx.metrics.update(prewarm_transfers=counters.transfers, prewarm_bytes=moved, prewarm_prefill_prompt_tokens=prompt)
    ok = counters.transfers == PREWARM_TRANSFERS and (moved or 0.0) > 0 and counters.failed == 0
    detail = (
        f"before any request: decode nixl transfers {counters.transfers:g} (expected {PREWARM_TRANSFERS:g}), "
        f"{moved or 0:g} bytes, failed {counters.failed:g}; prefill prompt tokens {prompt}"
    )
    return [Check("pre-warm moved KV over NIXL", ok, detail)]


def verify_checks(ctx: Context) -> list[Any]:
    """verify's own checks, on the P/D app or (aggregated) on the aggregated one."""

    def decode_counters() -> NixlSnapshot:
        return NixlSnapshot.of(metrics_text(DECODE_METRICS))

    def prefill_tokens() -> float | None:
        return metric_total(metrics_text(PREFILL_METRICS), PROMPT_TOKENS)

    def api() -> list[Any]:
        """The endpoint's two calls; only after every counter's baseline is taken."""
        return [
            guard(
                "GET /v1/models",
                lambda: models_check(
                    http_json(f"{ctx.serve}/v1/models", timeout=120, api_key=ctx.api_key), ctx.model_id
                ),
            ),
            guard("POST /v1/chat/completions", lambda: chat_check(ctx.serve, ctx.model_id, api_key=ctx.api_key)),
        ]

    if ctx.aggregated:
        # The same checks `verify` makes in aggregated mode: a replica served it, and no NIXL anywhere.
        tokens_before = all_prompt_tokens()
        checks = api()
        checks.append(served_check(tokens_before, poll(all_prompt_tokens, grew(tokens_before))))
        node_metrics = {"node A": metrics_text(PREFILL_METRICS), "node B": metrics_text(DECODE_METRICS)}
        checks.append(no_nixl_check(node_metrics, {"Ray and engine logs": ray_logs(ctx.temp_dir)}))
        ctx.metrics.update(prompt_tokens_before=tokens_before, prompt_tokens_after=all_prompt_tokens())
        return checks + reasoning_checks(ctx)

    before = decode_counters()
    # Decode's pre-warm already went through prefill: wait for Ray to export that, so that only
    # the chat below can make prefill's count grow.
    prompt_before = poll(prefill_tokens, lambda value: value is not None)
    checks = api()
    after = poll_until_grown(decode_counters, before)
    checks.append(metrics_check(before, after))
    checks.append(prefill_check(prompt_before, poll(prefill_tokens, grew(prompt_before))))
    text = ray_logs(ctx.temp_dir)
    findings = nixl_log_findings(text, EXPECTED_PROVIDER)
    checks.insert(0, Check("NIXL LIBFABRIC backend, no fallback", not findings.problems, "; ".join(findings.problems)))
    checks.insert(1, prewarm_check({"Ray and engine logs": text}))
    lines = [
        line.strip()
        for line in text.splitlines()
        if any(k in line for k in ("was instantiated", "rails using provider", "Skipping backend", "TCP fallback"))
    ]
    ctx.log_lines.extend(sorted(set(lines))[:12])
    ctx.metrics.update(transfers_before=before.transfers, transfers_after=after.transfers, failed=after.failed)
    # After verify's own counters are read: these requests take the KV path too, as every request in this case does.
    return checks + reasoning_checks(ctx)


# The tiny model thinks as Qwen3 does (rehearsal/make_model.py: Qwen3's template branch, its think tokens), but its
# random weights never close the think block: by default every token it writes is thinking.
REASONING_MAX_TOKENS = 8
REASONING_PROMPT = "Hello"


def reasoning_checks(ctx: Context) -> list[Check]:
    """The model's reasoning parser on every engine, through the product's ingress (and decode, in P/D mode): by
    default the text lands in `reasoning`; with thinking off (chat_template_kwargs, or reasoning_effort none, which
    vLLM 0.26 maps to it) in `content`; a chat template sent with a request is refused."""
    parsers = {side: llm["engine_kwargs"].get("reasoning_parser") for side, llm in deploy.llm_configs(ctx.config)}
    parser = next(iter(parsers.values())) if len(set(parsers.values())) == 1 else None
    found = [Check("reasoning parser on every engine", parser is not None, f"engine_kwargs.reasoning_parser {parsers}")]
    if parser is None:
        return found
    url = f"{ctx.serve}/v1/chat/completions"

    def chat(**fields: Any) -> dict[str, Any]:
        body = {
            "model": ctx.model_id,
            "messages": [{"role": "user", "content": REASONING_PROMPT}],
            "max_tokens": REASONING_MAX_TOKENS,
            "temperature": 0,
            **fields,
        }
        message: dict[str, Any] = http_json(url, body, timeout=120, api_key=ctx.api_key)["choices"][0]["message"]
        return message

    def lands(name: str, field: str, other: str, message: dict[str, Any]) -> Check:
        ok = bool(message.get(field)) and not message.get(other)
        shown = {key: message.get(key) for key in ("content", "reasoning")}
        return Check(f"reasoning: {name}", ok, f"expected text in {field} only: {json.dumps(shown)[:200]}")

    off = dict(THINKING_OFF[parser])
    found.append(guard("reasoning: by default", lambda: lands("by default", "reasoning", "content", chat())))
    found.append(
        guard(
            "reasoning: chat_template_kwargs thinking off",
            lambda: lands("chat_template_kwargs thinking off", "content", "reasoning", chat(chat_template_kwargs=off)),
        )
    )
    found.append(
        guard(
            "reasoning: reasoning_effort none",
            lambda: lands("reasoning_effort none", "content", "reasoning", chat(reasoning_effort="none")),
        )
    )
    template = {"chat_template": "{{ 'injected' }}"}
    body = {"model": ctx.model_id, "messages": [{"role": "user", "content": REASONING_PROMPT}], "max_tokens": 1}
    status = http_status(url, {**body, "chat_template_kwargs": template}, timeout=120, api_key=ctx.api_key)
    found.append(Check("reasoning: a request's own chat template is refused", status == 400, f"HTTP {status}"))
    return found


def bench(ctx: Context) -> list[Any]:
    """tools.bench's own sweep, at two small load points: results.csv, results.png and metadata.json in results/.

    No checks of its own: a bench that cannot run raises, and the case fails."""
    if ctx.results is not None:
        short_bench(ctx.model_id, ctx.model_dir, ctx.results, ctx.headers, ctx.aggregated, ctx.api_key)
    return []


def short_bench(
    model_id: str, model_dir: Path, out: Path, headers: dict[str, str], aggregated: bool, api_key: str | None = None
) -> None:
    # The engines that decode: decode's node in P/D mode; in aggregated mode both nodes' replicas.
    engine_urls = (PREFILL_METRICS, DECODE_METRICS) if aggregated else (DECODE_METRICS,)

    def snapshot() -> tuple[NixlSnapshot, EngineSnapshot]:
        texts = {url: metrics_text(url) for url in {DECODE_METRICS, *engine_urls}}
        return NixlSnapshot.of(texts[DECODE_METRICS]), EngineSnapshot.of(*(texts[url] for url in engine_urls))

    def grown(before: tuple[NixlSnapshot, EngineSnapshot]) -> tuple[NixlSnapshot, EngineSnapshot]:
        return poll(snapshot, lambda after: after[0].transfers > before[0].transfers)

    out.mkdir(parents=True, exist_ok=True)
    # Labelled from the live application, as bench labels a deployment from the live RayService.
    live = http(f"{DASHBOARD}/api/serve/applications/", headers=headers)
    deployed = [app["deployed_app_config"] for app in live["applications"].values()]
    metadata = {
        "source": "the rehearsal's live Serve application",
        **tools_bench.describe_serve_config({"applications": deployed}),
    }
    (out / "metadata.json").write_text(json.dumps(metadata, indent=2))
    mode = metadata["serving_mode"]
    rows = []
    for input_len, concurrency in BENCH_POINTS:
        point = bench_results.Point(input_len, concurrency)
        name = f"run-{input_len}-{concurrency}.json"
        # A baseline once Ray's export has held still, as `make bench` takes it (tools.bench.sweep).
        (before, engine_before), tokens_before = settled(snapshot), all_prompt_tokens()
        command = tools_bench.bench_command(
            base_url=SERVE, model=model_id, point=point, output_len=BENCH_OUTPUT_LEN, num_prompts=BENCH_PROMPTS,
            result_dir=out, result_file=name, tokenizer=str(model_dir),
        )  # fmt: skip
        # vLLM's bench sends OPENAI_API_KEY as `Authorization: Bearer`, as `make bench` runs it.
        env = tools_bench.bench_env(api_key)
        subprocess.run(command, check=True, cwd=ROOT, timeout=600, capture_output=True, env=env)
        # Ray exports counters every few seconds: wait for this point's requests before the next point.
        if aggregated:
            poll(all_prompt_tokens, grew(tokens_before))
            after, engine_after = snapshot()
        else:
            after, engine_after = grown((before, engine_before))
        result = json.loads((out / name).read_text())
        rows.append(bench_results.row(point, result, before, after, engine_before, engine_after, serving_mode=mode))
    bench_results.write_csv(rows, out / "results.csv")
    bench_results.write_chart(rows, out / "results.png", f"CPU rehearsal: {model_id} (tiny stand-in), {mode}")
    print(f"bench ({mode}): {out / 'results.csv'}, {out / 'results.png'}")
