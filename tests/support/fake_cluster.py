"""A deployed stack as kubectl and the endpoint answer it, for verify's run_checks and main.

The fakes sit at the boundary of tools/cluster_access (kubectl, the port-forward, the HTTP
calls); everything above them is the real code. Time is simulated: sleeping and each metrics
scrape advance the clock, and Ray's export is modelled as it works: a counter change becomes
visible at the next export tick (every 10 s), not when it happens.
"""

from __future__ import annotations

import base64
import contextlib
import json
import math
import urllib.error
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from serve_config.deployments import PREFILL_ROUTE_HEADER
from tools import cluster_access, verify, verify_observability

DATA = Path(__file__).parents[1] / "data"
EXPORT_S = 10.0
# Ray's export ticks fall at 5 s, 15 s, ... of verify's clock: not in step with it.
EXPORT_PHASE_S = 5.0
# One kubectl round trip through the API server's proxy.
SCRAPE_S = 3.0
KEY = "sk-test-0123456789abcdef"
PODS = {"prefill": ("w-prefill", "n1"), "decode": ("w-decode", "n2")}
GOOD_PROBE = {
    "versions": {"ray": "2.58.0", "vllm": "0.26.0", "nixl": "1.3.1"},
    "plugin": "/x/.nixl_cu13.mesonpy.libs/plugins/libplugin_LIBFABRIC.so",
    "plugin_expected_at": "/x/.nixl_cu13.mesonpy.libs/plugins/libplugin_LIBFABRIC.so",
    "ldd_not_found": [],
}


@dataclass
class FakeCluster:
    # What the chat request does: a KV transfer on decode, prompt tokens on prefill.
    chat_transfers: int = 1
    chat_prompt_tokens: int = 180
    # verify's short prompt (without the x-pd-prefill header): its prompt tokens as the engine counted them,
    # and what it moved: none, where decode prefilled it itself.
    short_tokens: int = 12
    short_transfers: int = 0
    # Decode's pre-warm (1 transfer, 2 prompt tokens on prefill) happened before verify started
    # at t=0, at this time; Ray exports it at its next tick.
    prewarm_at: float = -3.0
    logs: str = field(default_factory=lambda: (DATA / "ray_logs_libfabric.txt").read_text())
    probe: dict[str, Any] = field(default_factory=lambda: dict(GOOD_PROBE))
    # Keys: whether the endpoint demands one, and what the Secret holds.
    require_key: bool = False
    secret_keys: dict[str, str] | None = field(default_factory=lambda: {"team-a": KEY})
    now: float = 0.0
    events: list[tuple[float, int, int]] = field(default_factory=list)
    calls: list[tuple[str, ...]] = field(default_factory=list)
    sent_keys: list[str | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.events.append((self.prewarm_at, 1, 2))

    # --- time -------------------------------------------------------------------------------
    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def _exported(self) -> tuple[int, int]:
        def tick(t: float) -> float:
            return math.floor((t - EXPORT_PHASE_S) / EXPORT_S + 1) * EXPORT_S + EXPORT_PHASE_S

        visible = [(t, n, k) for t, n, k in self.events if tick(t) <= self.now]
        return sum(n for _, n, _ in visible), sum(k for _, _, k in visible)

    # --- kubectl ----------------------------------------------------------------------------
    def _pod(self, side: str) -> dict[str, Any]:
        name, node = PODS[side]
        return {
            "metadata": {"name": name, "labels": {"ray.io/group": side}},
            "spec": {"nodeName": node, "containers": [{"resources": {"limits": {"vpc.amazonaws.com/efa": "1"}}}]},
            "status": {"phase": "Running"},
        }

    def _metrics(self, pod: str) -> str:
        self.now += SCRAPE_S
        transfers, tokens = self._exported()
        if pod == PODS["decode"][0]:
            return (
                "# TYPE ray_vllm_nixl_xfer_time_seconds histogram\n"
                f'ray_vllm_nixl_xfer_time_seconds_count{{engine="0"}} {float(transfers)}\n'
                f'ray_vllm_nixl_xfer_time_seconds_sum{{engine="0"}} {0.1 * transfers}\n'
            )
        if not tokens:
            return "# nothing exported yet\n"
        return f'# TYPE ray_vllm_prompt_tokens counter\nray_vllm_prompt_tokens_total{{engine="0"}} {float(tokens)}\n'

    def kubectl(self, *args: str, timeout: float = 60) -> str:
        self.calls.append(args)
        if args[:2] == ("get", "pods"):
            return json.dumps({"items": [self._pod(side) for side in PODS]})
        if args[:2] == ("get", "node"):
            return json.dumps({
                "metadata": {"labels": {"topology.kubernetes.io/zone": "us-east-1c"}},
                "status": {"allocatable": {"vpc.amazonaws.com/efa": "1"}},
            })  # fmt: skip
        if args[:2] == ("get", "--raw"):
            return self._metrics(args[2].split("/pods/")[1].split(":")[0])
        if args[:2] == ("get", "secret"):
            if self.secret_keys is None:
                raise RuntimeError(
                    f'kubectl {" ".join(args)}: Error from server (NotFound): secrets "{args[4]}" not found'
                )
            return base64.b64encode(json.dumps(self.secret_keys).encode()).decode()
        if args[0] == "exec":
            command = args[args.index("--") + 1 :]
            if command[0] == "nvidia-smi":
                return "580.159.03\n"
            if "image_probe" in " ".join(command) or "libplugin_LIBFABRIC" in " ".join(command):
                return json.dumps(self.probe) + "\n"
            return self.logs
        raise AssertionError(f"unexpected kubectl {args}")

    # --- the endpoint -----------------------------------------------------------------------
    @contextlib.contextmanager
    def port_forward(self, *_: Any) -> Iterator[str]:
        yield "http://fake"

    def _refuse(self, url: str, api_key: str | None) -> None:
        self.sent_keys.append(api_key)
        if self.require_key and api_key != KEY:
            raise urllib.error.HTTPError(url, 401, "Unauthorized", {}, None)  # type: ignore[arg-type]

    def http_json(self, url: str, body: dict[str, Any] | None = None, timeout: float = 300, **kw: Any) -> Any:
        self._refuse(url, kw.get("api_key"))
        if url.endswith("/v1/models"):
            return {"data": [{"id": "Qwen/Qwen3-8B"}]}
        answer = {"choices": [{"message": {"content": "Prefill is compute-bound; decode is memory-bound."}}]}
        # The product's route: the header, else the prompt's length (verify's short prompt prefills on decode).
        prompt = ((body or {}).get("messages") or [{}])[0].get("content")
        if PREFILL_ROUTE_HEADER not in (kw.get("headers") or {}) and prompt == verify.SHORT_PROMPT:
            self.events.append((self.now, self.short_transfers, self.short_tokens if self.short_transfers else 0))
            return {**answer, "usage": {"prompt_tokens": self.short_tokens}}
        self.events.append((self.now, self.chat_transfers, self.chat_prompt_tokens))
        return answer

    def http_status(self, url: str, body: dict[str, Any] | None = None, timeout: float = 60, **kw: Any) -> int:
        self.sent_keys.append(kw.get("api_key"))
        return 401 if self.require_key and kw.get("api_key") != KEY else 200


def install(monkeypatch: Any, cluster: FakeCluster) -> FakeCluster:
    """Answer every call verify makes to the cluster and the endpoint from `cluster`."""
    import time

    for module in (cluster_access, verify):
        monkeypatch.setattr(module, "kubectl", cluster.kubectl, raising=False)
        monkeypatch.setattr(module, "port_forward", cluster.port_forward, raising=False)
        monkeypatch.setattr(module, "http_json", cluster.http_json, raising=False)
        monkeypatch.setattr(module, "http_status", cluster.http_status, raising=False)
    monkeypatch.setattr(time, "sleep", cluster.sleep)
    # Its Prometheus workspace and CloudWatch answer every panel (tests/test_observability_names.py fails them).

    for answers in ("workspace_query", "insights_query"):
        monkeypatch.setattr(verify_observability, answers, lambda _settings: lambda _query: [{"value": [0, "1"]}])
    return cluster
