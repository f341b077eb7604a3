"""Bad requests at the endpoint, on the one deployed app: each a 4xx in OpenAI's shape, nothing breaks.

Every request carries the run's key (the endpoint checks keys
first), so each reaches the part of Ray or vLLM that should refuse it. In P/D mode the set goes twice: at the
deployed threshold (the pd case's 0: every request through Ray's split path) and at the product's default, set
in place as selective.py sets one (decode counts each prompt's tokens first, and a prompt past max_model_len
must get the engine's 400 there too), then the deployed threshold again. The set includes a client's
`kv_transfer_params` (the ingress refuses what only the server sets) and the `x-pd-prefill` header from a key
not allowed it (a key added to the file for this, as the kubelet would; a 403), and from the run's own key,
which the case's pd_prefill_header_keys allows or not. No error body may name a replica's actor, pid or IP.
After all of them: no engine restarted (the same NIXL agents, and a good request still
gets 200) and decode's NIXL failure counter did not move. Also one valid request that gets a 400: /tokenize, a
known limitation of Ray 2.58 with vLLM 0.26 (TOKENIZE_REFUSAL), checked as the docs state it.
"""

from __future__ import annotations

import json
import re
import secrets
import time
import urllib.error
import urllib.request
from typing import Any

from rehearsal.cluster import ray_logs
from rehearsal.context import Context
from rehearsal.keys import write_like_the_kubelet
from rehearsal.network import DECODE_METRICS, metrics_text
from rehearsal.selective import apply_config, with_threshold
from serve_config.deployments import LOCAL_PREFILL_KEY, PREFILL_ROUTE_HEADER, deployment_name_of, options_of
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
# What Ray's own error answer puts in a body (utils/server_utils.py: the exception's text): a replica's actor,
# its pid and its node's IP. None may reach a client.
INTERNALS = re.compile(r"ServeReplica|actor_id|pid=|ip=|\b\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}\b")
# A key id added to the keys file for the header check: never on the case's allowed list.
NOT_ALLOWED_KEY_ID = "no-route-header"


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
        # Decode's engine would pin its blocks for a remote reader and answer with its address and block ids.
        ("kv_transfer_params asking decode to hold KV", chat(kv_transfer_params={"do_remote_decode": True}), json_type),
        # Decode's engine would pull KV from whatever address the client names.
        (
            "kv_transfer_params naming a remote prefill",
            chat(
                kv_transfer_params={
                    "do_remote_prefill": True,
                    "remote_host": "127.0.0.1",
                    "remote_port": 1,
                    "remote_engine_id": "client",
                    "remote_block_ids": [0],
                }
            ),
            json_type,
        ),
        ("kv_transfer_params in vllm_xargs", chat(vllm_xargs={"kv_transfer_params": "x"}), json_type),
    ]


def _refused(name: str, status: int, text: str, elapsed: float) -> Check:
    """A 4xx in OpenAI's shape, naming nothing internal."""
    ok = 400 <= status < 500 and openai_error(text) and not INTERNALS.search(text)
    return Check(f"bad request: {name}", ok, f"HTTP {status} in {elapsed:.1f} s: {text[:160]!r}")


def _send_all(ctx: Context, url: str, headers: dict[str, str], where: str) -> list[Any]:
    found = []
    for name, body, content_type in cases(ctx.model_id):
        started = time.monotonic()
        status, text = _send(url, body, {**headers, "Content-Type": content_type})
        found.append(_refused(f"{name} ({where})", status, text, time.monotonic() - started))
        ctx.metrics[f"bad_request_status:{name} ({where})"] = float(status)
    return found


def _thresholds(ctx: Context) -> list[tuple[str, dict[str, Any] | None]]:
    """(where, the config to apply, None for the deployed one) for each threshold the set goes at."""
    if ctx.aggregated:
        return [("aggregated", None)]
    decode = deployment_name_of(ctx.model_id, "decode")
    deployed = options_of(ctx.config["applications"][0], decode).get("user_config", {}).get(LOCAL_PREFILL_KEY)
    default = with_threshold(ctx, None)
    default_threshold = options_of(default["applications"][0], decode)["user_config"][LOCAL_PREFILL_KEY]
    if deployed == default_threshold:
        return [(f"threshold {deployed}, the default", None)]
    return [(f"threshold {deployed}, as deployed", None), (f"threshold {default_threshold}, the default", default)]


def _header_checks(ctx: Context, url: str) -> list[Any]:
    """x-pd-prefill from a key not allowed it: 403; from the run's key: as the case's allowed list says."""
    body = json.dumps(
        {"model": ctx.model_id, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8}
    ).encode()
    header = {"Content-Type": "application/json", PREFILL_ROUTE_HEADER: "split"}
    keys = ctx.endpoint_keys
    if keys is None:
        status, text = _send(url, body, header)
        return [_refused(f"{PREFILL_ROUTE_HEADER} without keys", status, text, 0.0)]
    allowed = ctx.config["applications"][0]["args"]["ingress_cls_config"]["ingress_extra_kwargs"].get(
        "prefill_header_keys", []
    )
    visible = keys.folder / "keys.json"
    in_force: dict[str, str] = json.loads(visible.read_text())
    (current_id,) = [key_id for key_id, key in in_force.items() if key == keys.current]
    extra = f"sk-{secrets.token_urlsafe(32)}"
    keys.retired.append(extra)  # the log scan looks for it too
    write_like_the_kubelet(keys.folder, {**in_force, NOT_ALLOWED_KEY_ID: extra}, 90)
    try:
        started = time.monotonic()
        status, text = _send(url, body, {**header, "Authorization": f"Bearer {extra}"})
        found = [
            _refused(f"{PREFILL_ROUTE_HEADER} from a key not allowed it", status, text, time.monotonic() - started)
        ]
        status, text = _send(url, body, {**header, "Authorization": f"Bearer {keys.current}"})
        wanted = 200 if current_id in allowed else 403
        found.append(
            Check(
                f"{PREFILL_ROUTE_HEADER} from the run's key (id {current_id}; allowed: {allowed})",
                status == wanted,
                f"HTTP {status} (expected {wanted}): {text[:120]!r}",
            )
        )
    finally:
        write_like_the_kubelet(keys.folder, in_force, 91)
    return found


def bad_requests_check(ctx: Context) -> list[Any]:
    """Each bad request gets a 4xx in OpenAI's shape at each threshold; then no restart, no NIXL failure, and a
    good request works."""

    url = f"{ctx.serve}/v1/chat/completions"
    headers = {} if ctx.api_key is None else {"Authorization": f"Bearer {ctx.api_key}"}
    agents_before = ray_logs(ctx.temp_dir).count(_AGENT_MADE)
    failed_before = NixlSnapshot.of(metrics_text(DECODE_METRICS)).failed or 0.0
    found = []
    for where, config in _thresholds(ctx):
        if config is not None:
            applied_s, _ = apply_config(ctx, config)
            found.append(Check(f"bad requests: {where} applied in place", applied_s is not None, f"{applied_s} s"))
        try:
            found += _send_all(ctx, url, headers, where)
        finally:
            if config is not None:
                restored_s, _ = apply_config(ctx, ctx.config)
                found.append(
                    Check("bad requests: the deployed threshold restored", restored_s is not None, f"{restored_s} s")
                )
    found += _header_checks(ctx, url)
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
