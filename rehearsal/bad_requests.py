"""Bad requests at the endpoint, on the one deployed app: each a 4xx in OpenAI's shape, nothing breaks.

Every request carries the run's key (the endpoint checks keys
first), so each reaches the part of Ray or vLLM that should refuse it. After all
of them: no engine restarted (the same NIXL agents, and a good request still
gets 200) and decode's NIXL failure counter did not move. Also one valid request that gets a 400: /tokenize, a
known limitation of Ray 2.58 with vLLM 0.26 (TOKENIZE_REFUSAL), checked as the docs state it.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

from rehearsal.cluster import ray_logs
from rehearsal.context import Context
from rehearsal.network import DECODE_METRICS, metrics_text
from tools.checks import Check
from tools.cluster_access import NixlSnapshot

# Far past max_model_len (8192): one token per word for the tiny model's byte-level BPE, or more.
LONG_PROMPT_WORDS = 12_000
TEN_MB = 10 * 1024 * 1024
# NIXL logs this once per agent it creates: an engine restart makes one more.
_AGENT_MADE = "Backend LIBFABRIC was instantiated"
# Ray 2.58 looks for vLLM 0.26's tokenization server under its old name, so a valid /tokenize gets this 400 (docs/
# architecture.md, "How a request flows"). Checked as documented: a Ray or vLLM that fixes it fails the check, and the
# docs change with it.
TOKENIZE_REFUSAL = "does not support the 'tokenization' task"


def _send(url: str, data: bytes, headers: dict[str, str]) -> tuple[int, str]:
    request = urllib.request.Request(url, data=data, headers=headers, method="POST")  # noqa: S310 - our namespace
    try:
        with urllib.request.urlopen(request, timeout=300) as response:  # noqa: S310
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")


def openai_error(text: str) -> bool:
    """OpenAI's error shape: {"error": {"message": ..., ...}}."""
    try:
        body = json.loads(text)
    except ValueError:
        return False
    return isinstance(body, dict) and isinstance(body.get("error"), dict) and bool(body["error"].get("message"))


def cases(model_id: str) -> list[tuple[str, bytes, str]]:
    """(name, body, content type) of each bad request."""

    def chat(**fields: Any) -> bytes:
        body = {"model": model_id, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8, **fields}
        return json.dumps(body).encode()

    json_type = "application/json"
    long_prompt = [{"role": "user", "content": " ".join(["word"] * LONG_PROMPT_WORDS)}]
    return [
        ("a prompt longer than max_model_len", chat(messages=long_prompt), json_type),
        ("max_tokens 0", chat(max_tokens=0), json_type),
        ("max_tokens negative", chat(max_tokens=-5), json_type),
        ("max_tokens beyond the context", chat(max_tokens=10_000_000), json_type),
        ("malformed JSON", b'{"model": "' + model_id.encode() + b'", "messages": [', json_type),
        ("an unknown model", chat(model="no-such/model"), json_type),
        ("a wrong content type", chat(), "text/plain"),
        ("a 10 MB body", chat(messages=[{"role": "user", "content": "x" * TEN_MB}]), json_type),
        ("an empty messages list", chat(messages=[]), json_type),
    ]


def bad_requests_check(ctx: Context) -> list[Any]:
    """Each bad request gets a 4xx in OpenAI's shape; then no restart, no NIXL failure, and a good request works."""

    url = f"{ctx.serve}/v1/chat/completions"
    headers = {} if ctx.api_key is None else {"Authorization": f"Bearer {ctx.api_key}"}
    agents_before = ray_logs(ctx.temp_dir).count(_AGENT_MADE)
    failed_before = NixlSnapshot.of(metrics_text(DECODE_METRICS)).failed or 0.0
    found = []
    for name, body, content_type in cases(ctx.model_id):
        started = time.monotonic()
        status, text = _send(url, body, {**headers, "Content-Type": content_type})
        elapsed = time.monotonic() - started
        ok = 400 <= status < 500 and openai_error(text)
        detail = f"HTTP {status} in {elapsed:.1f} s: {text[:160]!r}"
        found.append(Check(f"bad request: {name}", ok, detail))
        ctx.metrics[f"bad_request_status:{name}"] = float(status)
    tokenize = json.dumps({"model": ctx.model_id, "prompt": "Hello"}).encode()
    status, text = _send(f"{ctx.serve}/tokenize", tokenize, {**headers, "Content-Type": "application/json"})
    found.append(
        Check(
            "known limitation: a valid /tokenize gets Ray's 400, as documented",
            status == 400 and TOKENIZE_REFUSAL in text and openai_error(text),
            f"HTTP {status}: {text[:160]!r}",
        )
    )
    good = json.dumps({"model": ctx.model_id, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8})
    status, text = _send(url, good.encode(), {**headers, "Content-Type": "application/json"})
    found.append(Check("bad requests: a good request still succeeds", status == 200, f"HTTP {status}"))
    agents_after = ray_logs(ctx.temp_dir).count(_AGENT_MADE)
    found.append(
        Check(
            "bad requests: no engine restarted",
            agents_after == agents_before,
            f"NIXL agents made: {agents_before} before, {agents_after} after",
        )
    )
    failed_after = NixlSnapshot.of(metrics_text(DECODE_METRICS)).failed or 0.0
    found.append(
        Check(
            "bad requests: no NIXL failure",
            failed_after == failed_before,
            f"nixl_num_failed_transfers {failed_before} -> {failed_after}",
        )
    )
    return found
