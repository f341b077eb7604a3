"""Client headers cannot make a stream outlive decode's drain: the product's ingress behind Ray 2.58's own Serve proxy,
with API keys and on the defaults (no keys).

Serve's proxy reads `x-request-timeout-seconds` (0 turns its timeout off) and
`x-request-disconnect-disabled: ?1` (no cancel on a hang-up) before the ingress sees the request
(serve/_private/proxy.py, send_request_to_replica). Here the product's ingress class runs as Ray's
builder makes it (make_fastapi_ingress, bound with the serve config's ingress_extra_kwargs), in a
Serve app on a local Ray, in front of a model deployment that streams for ever and writes down when
its generator stops; the requests go through Serve's real proxy with both headers.

One Serve start for the module: the keys app and the defaults' app share one model deployment (a
third app), all deployed at once, and each test runs its two streams side by side. Each replica
process imports vLLM (Ray LLM's request models), which is most of the module's time.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from rehearsal.keys import write_like_the_kubelet
from serve_config.endpoint_keys import ingress_cls_config
from settings import settings_from
from tests.conftest import PROJECT_CONTEXT

MODEL = "test/model"
KEY = "stream-key-" + "s" * 24
# The ingress's deadline, and Serve's own request timeout as the product sets both (one setting).
TIMEOUT_S = 8.0
OUTLIVE_THE_DRAIN = {"x-request-timeout-seconds": "0", "x-request-disconnect-disabled": "?1"}
# Each app's settings, route prefix, and the Authorization its callers send: the defaults' app gets none.
APPS: dict[str, tuple[dict[str, Any], str, dict[str, str]]] = {
    "keys": ({"endpoint_api_keys_secret_name": "test/llm-keys"}, "/", {"Authorization": f"Bearer {KEY}"}),
    "defaults": ({}, "/defaults", {}),
}

pytestmark = [pytest.mark.serve, pytest.mark.xdist_group("ray"), pytest.mark.private_internals]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def _ingress_of(settings: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The ingress class and kwargs Ray's builder takes from the product's serve config for these settings
    (its own IngressClsConfig; with none named, Ray's OpenAiIngress)."""
    from ray.llm._internal.serve.core.ingress.builder import IngressClsConfig

    named = ingress_cls_config(settings_from({**PROJECT_CONTEXT, **settings}))
    config = IngressClsConfig.model_validate(named or {})
    return config.ingress_cls, dict(config.ingress_extra_kwargs)


@pytest.fixture(scope="module")
def served(local_ray: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    from ray import serve
    from ray.llm._internal.serve.core.configs.openai_api_models import ChatCompletionStreamResponse, ModelCard
    from ray.llm._internal.serve.core.ingress.ingress import make_fastapi_ingress
    from ray.serve.api import RunTarget

    tmp_path = tmp_path_factory.mktemp("served")
    states = tmp_path / "generation"
    states.mkdir()

    @serve.deployment(ray_actor_options={"num_cpus": 0}, graceful_shutdown_timeout_s=1)
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
    port = _free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port, "request_timeout_s": TIMEOUT_S})
    model = serve.get_deployment_handle("EndlessModel", app_name="model", _check_exists=False)
    targets = [RunTarget(EndlessModel.bind(), name="model", route_prefix=None)]  # type: ignore[attr-defined]
    for name, (settings, prefix, _) in APPS.items():
        cls, extra = _ingress_of(settings)
        # This test's timeout for the product's (the setting's minimum is 30 s); this run's keys.
        extra.update({k: v for k, v in (("request_timeout_s", TIMEOUT_S), ("keys_file", str(keys_file))) if k in extra})
        deployment = serve.deployment(
            make_fastapi_ingress(cls), ray_actor_options={"num_cpus": 0}, graceful_shutdown_timeout_s=1
        )
        app = deployment.bind({MODEL: model}, {MODEL: card}, **extra)
        targets.append(RunTarget(app, name=name, route_prefix=prefix))
    try:
        serve.run_many(targets)
        yield SimpleNamespace(port=port, states=states)
    finally:
        serve.shutdown()


def _path(app: str, path: str) -> str:
    return APPS[app][1].rstrip("/") + path


def _open_stream(port: int, app: str, user: str) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True, "user": user}
    headers = {"Content-Type": "application/json", **APPS[app][2], **OUTLIVE_THE_DRAIN}
    connection.request("POST", _path(app, "/v1/chat/completions"), body=json.dumps(body), headers=headers)
    response = connection.getresponse()
    assert response.status == 200, (app, response.status, response.read()[:300])
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


def _each_app(check: Callable[[str], Any]) -> dict[str, Any]:
    """check(app) for both apps at once (their streams run side by side): each app's result, or its failure."""
    results: dict[str, Any] = {}

    def run(app: str) -> None:
        try:
            results[app] = check(app)
        except BaseException as err:  # reported below, by app
            results[app] = err

    threads = [threading.Thread(target=run, args=(app,)) for app in APPS]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for app, result in results.items():
        if isinstance(result, BaseException):
            raise AssertionError(f"{app}: {result}") from result
    return results


def test_on_the_defaults_a_caller_without_a_key_is_admitted_and_with_keys_refused(served: Any) -> None:
    statuses = {}
    for app in APPS:
        connection = http.client.HTTPConnection("127.0.0.1", served.port, timeout=60)
        try:
            connection.request("GET", _path(app, "/v1/models"))
            response = connection.getresponse()
            statuses[app] = (response.status, json.loads(response.read()))
        finally:
            connection.close()
    assert statuses["defaults"][0] == 200 and statuses["defaults"][1]["data"][0]["id"] == MODEL, statuses
    assert statuses["keys"][0] == 401, statuses


def test_with_both_headers_the_stream_ends_at_the_request_timeout_and_generation_stops(served: Any) -> None:
    def check(app: str) -> None:
        user = f"deadline-{app}"
        connection, response = _open_stream(served.port, app, user)
        try:
            data, ended_after = _read_for(response, TIMEOUT_S + 10)
        finally:
            connection.close()
        assert ended_after is not None and ended_after < TIMEOUT_S + 3, f"the stream was still open: {data[-300:]!r}"
        last = data.decode().strip().split("\n\n")[-1]
        assert last.startswith("data: "), last
        assert json.loads(last[len("data: ") :])["error"]["code"] == "request_timeout", last
        state = _stopped_within(served.states, user, 5)
        assert state.startswith("stopped"), f"the model still generates after the deadline: {state}"

    _each_app(check)


def test_with_both_headers_a_hang_up_stops_generation(served: Any) -> None:
    def check(app: str) -> None:
        user = f"hang-up-{app}"
        connection, response = _open_stream(served.port, app, user)
        data, ended_after = _read_for(response, 1.5)
        assert data and ended_after is None
        connection.close()
        hung_up = time.time()
        # Well inside the deadline: what stops it here is the hang-up, not the request timeout.
        state = _stopped_within(served.states, user, 3)
        assert state.startswith("stopped"), f"the model still generates after the client hung up: {state}"
        assert float(state.split()[1]) - hung_up < TIMEOUT_S - 1.5

    _each_app(check)
