"""The endpoint's API keys on the product's own serve config, with the key ingress loaded as the pods load it.

The pd and aggregated cases synthesize the product with KEY_SETTINGS. Two CPU
deltas stand in for what the kubelet does on EKS (prepare): the ConfigMap
`ray-pods-code` from the synthesized template is laid out as a mounted volume and
put on the Ray processes' PYTHONPATH (the product's own is a path in the pod), and
the keys are written the way the kubelet writes a Secret volume (`keys.json` ->
`..data/keys.json`, `..data` swapped atomically) at a path of this run, which the
serve config's `keys_file` names. key_checks then runs on the one deployed app, and
key_log_scan reads every Ray log for the keys before the cluster is torn down.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from rehearsal.cluster import ray_logs
from rehearsal.context import Context, EndpointKeys, Setup
from serve_config.endpoint_keys import RAY_PODS_PACKAGE
from tools.checks import Check

# What the cases that serve set, as a user would: the name of a Secrets Manager secret (never read here).
KEY_SETTINGS = {"endpoint_api_keys_secret_name": "rehearsal/llm-keys"}
# The only changes prepare makes for the key check, and why (a test pins this set).
KEY_DELTAS: dict[str, str] = {
    "ingress_cls_config.ingress_extra_kwargs.keys_file": "this run's keys, laid out as the kubelet mounts a Secret",
    "env PYTHONPATH": "the ConfigMap's package laid out in this run, instead of the pod's mount path",
}
ROTATION_TIMEOUT_S = 60.0
# The product's ingress logs this once per replica, with the file it was imported from.
_LOADED = re.compile(r"API key check on \(code (\w+) from (\S+),")


def write_like_the_kubelet(folder: Path, keys: dict[str, str], generation: int) -> Path:
    """A Secret volume as the kubelet writes it: the new files in a fresh directory, then `..data` swapped."""
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"..{generation}_{time.time_ns()}"
    target.mkdir()
    (target / "keys.json").write_text(json.dumps(keys))
    link = folder / "..data_tmp"
    link.symlink_to(target.name)
    os.replace(link, folder / "..data")
    visible = folder / "keys.json"
    if not visible.is_symlink():
        visible.symlink_to("..data/keys.json")
    return visible


def prepare(setup: Setup, manifests: list[dict[str, Any]]) -> EndpointKeys | None:
    """The two CPU deltas of the key check: the code wherever the template ships it (the NIXL callback in
    P/D mode needs it too), the keys when the synthesized serve config gives the ingress a keys file."""
    code = [m for m in manifests if m.get("kind") == "ConfigMap" and m["metadata"]["name"] == "ray-pods-code"]
    for configmap in code:
        package = setup.work / "python" / RAY_PODS_PACKAGE
        package.mkdir(parents=True)
        for name, text in configmap["data"].items():
            (package / name).write_text(text)
        setup.env["PYTHONPATH"] = str(setup.work / "python")
    args = setup.config["applications"][0]["args"]
    # The product's ingress is in every serve config; it reads keys only when it names a keys file.
    ingress = args["ingress_cls_config"]
    if "keys_file" not in ingress["ingress_extra_kwargs"]:
        return None
    keys = EndpointKeys(
        folder=setup.work / "api-keys",
        current=f"sk-{secrets.token_urlsafe(32)}",
        retired=[],
        wrong=f"sk-{secrets.token_urlsafe(32)}",
    )
    path = write_like_the_kubelet(keys.folder, {"team-a": keys.current}, 1)
    ingress["ingress_extra_kwargs"]["keys_file"] = str(path)
    return keys


def _call(url: str, key: str | None, body: dict[str, Any] | None = None) -> tuple[int, str]:
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers=headers)  # noqa: S310 - our own namespace
    try:
        with urllib.request.urlopen(request, timeout=120) as response:  # noqa: S310
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def key_checks(ctx: Context) -> list[Any]:
    """No key and a wrong key: 401; the right key: 200, streaming and not; a rotation with no restart."""

    keys = ctx.endpoint_keys
    if keys is None:
        return []
    chat_url, models_url = f"{ctx.serve}/v1/chat/completions", f"{ctx.serve}/v1/models"
    chat = {"model": ctx.model_id, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8}
    found = []

    def expect(name: str, url: str, key: str | None, body: dict[str, Any] | None, wanted: int) -> tuple[int, str]:
        status, text = _call(url, key, body)
        detail = f"HTTP {status} (expected {wanted})"
        if status == 401:
            detail += f", error code {json.loads(text).get('error', {}).get('code')}"
        found.append(Check(f"endpoint keys: {name}", status == wanted, detail))
        return status, text

    expect("health path without a key", f"{ctx.serve}/-/healthz", None, None, 200)
    expect("/v1/models without a key", models_url, None, None, 401)
    expect("chat without a key", chat_url, None, chat, 401)
    expect("chat with a wrong key", chat_url, keys.wrong, chat, 401)
    expect("/v1/models with the key", models_url, keys.current, None, 200)
    status, text = expect("chat with the key", chat_url, keys.current, chat, 200)
    status, text = expect("streamed chat with the key", chat_url, keys.current, {**chat, "stream": True}, 200)
    if status == 200 and "data: [DONE]" not in text:
        found.append(Check("endpoint keys: the stream ran to [DONE]", False, text[-200:]))

    # Rotation: the kubelet swaps the Secret volume's files; no process restarts.
    old, new = keys.current, f"sk-{secrets.token_urlsafe(32)}"
    started = time.monotonic()
    write_like_the_kubelet(keys.folder, {"team-b": new}, 2)
    statuses = (0, 0)
    while time.monotonic() - started < ROTATION_TIMEOUT_S:
        statuses = (_call(models_url, old)[0], _call(models_url, new)[0])
        if statuses == (401, 200):
            break
        time.sleep(0.5)
    delay = time.monotonic() - started
    keys.retired.append(old)
    keys.current = new
    ctx.metrics["key_rotation_s"] = round(delay, 2)
    found.append(
        Check(
            "endpoint keys: after a rotation the old key is refused, the new one admitted",
            statuses == (401, 200),
            f"old HTTP {statuses[0]}, new HTTP {statuses[1]}, {delay:.1f} s after the file changed, no restart",
        )
    )
    return found


def key_log_scan(ctx: Context) -> list[Any]:
    """Every Ray and engine log, read for every key this run made: none may appear. The ingress came from the copy."""

    keys = ctx.endpoint_keys
    if keys is None:
        return []
    text = ray_logs(ctx.temp_dir)
    leaked = [kind for kind, key in keys.all().items() if key in text]
    loaded = sorted({path for _, path in _LOADED.findall(text)})
    copy = str(ctx.work / "python" / RAY_PODS_PACKAGE)
    return [
        Check(
            "endpoint keys: no key in any Ray log", not leaked, f"found: {leaked}" if leaked else f"{len(text)} bytes"
        ),
        Check(
            "endpoint keys: the ingress was imported from the ConfigMap's copy",
            bool(loaded) and all(path.startswith(copy) for path in loaded),
            f"{loaded}",
        ),
        Check(
            "endpoint keys: the logs name who called",
            "key id team-a" in text and "key id team-b" in text,
            "admitted requests logged by key id",
        ),
    ]
