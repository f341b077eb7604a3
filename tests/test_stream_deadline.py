"""Client headers cannot make a stream outlive decode's drain: the key ingress behind Ray 2.58's own Serve proxy.

Serve's proxy reads `x-request-timeout-seconds` (0 turns its timeout off) and
`x-request-disconnect-disabled: ?1` (no cancel on a hang-up) before the ingress sees the request
(serve/_private/proxy.py, send_request_to_replica). Here the product's ingress class runs as Ray's
builder makes it (make_fastapi_ingress), in a Serve app on a local Ray, in front of a model
deployment that streams for ever and writes down when its generator stops; the requests go through
Serve's real proxy with both headers.
"""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from rehearsal.keys import write_like_the_kubelet

MODEL = "test/model"
KEY = "stream-key-" + "s" * 24
# The ingress's deadline, and Serve's own request timeout as the product sets both (one setting).
TIMEOUT_S = 8.0
OUTLIVE_THE_DRAIN = {"x-request-timeout-seconds": "0", "x-request-disconnect-disabled": "?1"}

pytestmark = [pytest.mark.serve, pytest.mark.xdist_group("ray")]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


@pytest.fixture(scope="module")
def served(local_ray: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    from ray import serve
    from ray.llm._internal.serve.core.configs.openai_api_models import ChatCompletionStreamResponse, ModelCard
    from ray.llm._internal.serve.core.ingress.ingress import make_fastapi_ingress

    from ray_pods.api_keys import ApiKeyIngress

    tmp_path = tmp_path_factory.mktemp("served")
    states = tmp_path / "generation"
    states.mkdir()

    @serve.deployment(ray_actor_options={"num_cpus": 0})
    class EndlessModel:
        """Decode as the ingress calls it (`chat(body, raw_request_info)`, streamed): a chunk every 0.1 s, for ever."""

        async def chat(self, body: Any, raw_request_info: Any) -> AsyncIterator[Any]:
            import asyncio

            state = states / f"{body.user}.txt"
            index = 0
            try:
                while True:
                    state.write_text(f"running {index}")
                    yield ChatCompletionStreamResponse.model_validate(
                        {"id": "c", "created": 0, "model": MODEL, "choices": [{"index": 0, "delta": {"content": "x"}}]}
                    )
                    index += 1
                    await asyncio.sleep(0.1)
            finally:
                state.write_text(f"stopped {time.time()}")

    keys_file = write_like_the_kubelet(tmp_path / "api-keys", {"team-a": KEY}, 1)
    card = ModelCard(id=MODEL, object="model", owned_by="test", permission=[], metadata={})
    ingress = serve.deployment(make_fastapi_ingress(ApiKeyIngress), ray_actor_options={"num_cpus": 0}).bind(
        {MODEL: EndlessModel.bind()},  # type: ignore[attr-defined]
        {MODEL: card},
        keys_file=str(keys_file),
        request_timeout_s=TIMEOUT_S,
    )
    port = _free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port, "request_timeout_s": TIMEOUT_S})
    try:
        serve.run(ingress, name="llm", route_prefix="/")
        yield SimpleNamespace(port=port, states=states)
    finally:
        serve.shutdown()


def _open_stream(port: int, user: str) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True, "user": user}
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json", **OUTLIVE_THE_DRAIN}
    connection.request("POST", "/v1/chat/completions", body=json.dumps(body), headers=headers)
    response = connection.getresponse()
    assert response.status == 200
    return connection, response


def _read_for(response: http.client.HTTPResponse, seconds: float) -> tuple[bytes, float | None]:
    """What the stream sent within `seconds`, and when it ended (None: still open)."""
    started, data = time.monotonic(), b""
    while time.monotonic() - started < seconds:
        try:
            chunk = response.read1(65536)
        except http.client.IncompleteRead:  # Serve's proxy cut the body
            return data, time.monotonic() - started
        if not chunk:
            return data, time.monotonic() - started
        data += chunk
    return data, None


def _stopped_within(states: Path, user: str, seconds: float) -> str:
    deadline = time.monotonic() + seconds
    state = ""
    while time.monotonic() < deadline:
        state = (states / f"{user}.txt").read_text()
        if state.startswith("stopped"):
            break
        time.sleep(0.1)
    return state


def test_with_both_headers_the_stream_ends_at_the_request_timeout_and_generation_stops(served: Any) -> None:
    connection, response = _open_stream(served.port, "deadline")
    try:
        data, ended_after = _read_for(response, TIMEOUT_S + 10)
    finally:
        connection.close()
    assert ended_after is not None and ended_after < TIMEOUT_S + 3, f"the stream was still open: {data[-300:]!r}"
    last = data.decode().strip().split("\n\n")[-1]
    assert last.startswith("data: ") and json.loads(last[len("data: ") :])["error"]["code"] == "request_timeout", last
    state = _stopped_within(served.states, "deadline", 5)
    assert state.startswith("stopped"), f"the model still generates after the deadline: {state}"


def test_with_both_headers_a_hang_up_stops_generation(served: Any) -> None:
    connection, response = _open_stream(served.port, "hang-up")
    data, ended_after = _read_for(response, 1.5)
    assert data and ended_after is None
    connection.close()
    hung_up = time.time()
    # Well inside the deadline: what stops it here is the hang-up, not the request timeout.
    state = _stopped_within(served.states, "hang-up", 3)
    assert state.startswith("stopped"), f"the model still generates after the client hung up: {state}"
    assert float(state.split()[1]) - hung_up < TIMEOUT_S - 1.5
