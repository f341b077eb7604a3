"""Decode's server on a request (ray_pods/selective_pd.py): the product's class with Ray's real code around it.

`SelectivePDDecodeServer` runs here with Ray 2.58's own `PDOrchestratorMixin._pd_handle_request` (the split),
`LLMServer.chat` and `.completions` (the local path), Ray's NIXL connector backend (what a split sends prefill
and decode) and vLLM's own error mapping (create_error_response, through Ray's VLLMEngine._make_error_response).
A stand-in stands only for the engine: its renderer counts a token a word (plus a template's few) and refuses a
prompt past max_model_len with vLLM's own VLLMValidationError, as vLLM's renderer does; its chat and completions
record what reached them. Prefill's handle is a stand-in that answers with kv_transfer_params, as prefill's
engine does. The rehearsal runs the real engines (rehearsal/selective.py); these say which line broke.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest

from tests.conftest import rayservice_from, require_serve_deps
from tests.support.recording_counter import RecordingCounter

pytestmark = pytest.mark.private_internals

MAX_MODEL_LEN = 256
TEMPLATE_TOKENS = 5
MODEL = "Qwen/Qwen3-8B"


class StandInServing:
    """vLLM's chat or completion serving, as the counting calls it."""

    def __init__(self, rendered: list[str]) -> None:
        self.rendered = rendered
        # Where decode's server hands its count's render to the engine (tests/test_selective_pd_render_once.py runs
        # vLLM's own); this stand-in's renders do not go through it.
        self.online_renderer = SimpleNamespace(render_chat=None, render_completion=None)

    def _inputs(self, text: str) -> list[dict[str, Any]]:
        from vllm.exceptions import VLLMValidationError

        tokens = len(text.split()) + TEMPLATE_TOKENS
        if tokens > MAX_MODEL_LEN:
            raise VLLMValidationError(
                f"This model's maximum context length is {MAX_MODEL_LEN} tokens. However, your request has "
                f"{tokens} input tokens.",
                parameter="input_tokens",
                value=tokens,
            )
        return [{"prompt_token_ids": list(range(tokens))}]

    async def render_chat_request(self, request: Any) -> tuple[list[Any], list[dict[str, Any]]]:
        self.rendered.append("chat")
        return [], self._inputs(" ".join(str(m["content"]) for m in request.messages))

    async def render_completion_request(self, request: Any) -> list[dict[str, Any]]:
        self.rendered.append("completion")
        return self._inputs(str(request.prompt))

    def _extract_prompt_len(self, engine_input: dict[str, Any]) -> int:
        return len(engine_input["prompt_token_ids"])

    @staticmethod
    def create_error_response(message: Any) -> Any:
        from vllm.entrypoints.serve.utils.error_response import create_error_response

        return create_error_response(message)


class StandInEngine:
    """Decode's engine: records each call and the kv_transfer_params it carried."""

    def __init__(self) -> None:
        self.rendered: list[str] = []
        self._oai_serving_chat = StandInServing(self.rendered)
        self._oai_serving_completion = StandInServing(self.rendered)
        self.calls: list[tuple[str, Any]] = []

    async def chat(self, request: Any, raw_request_info: Any = None) -> AsyncIterator[str]:
        self.calls.append(("chat", request.kv_transfer_params))
        yield "chat answer"

    async def completions(self, request: Any, raw_request_info: Any = None) -> AsyncIterator[str]:
        self.calls.append(("completions", request.kv_transfer_params))
        yield "completion answer"


PREFILL_PARAMS = {"do_remote_prefill": True, "remote_engine_id": "prefill-engine", "remote_block_ids": [1, 2]}


class StandInPrefill:
    """Prefill's deployment handle: records what it was sent, answers with prefill's kv_transfer_params."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, Any]] = []

    def options(self, **_: Any) -> StandInPrefill:
        return self

    def __getattr__(self, method: str) -> Any:
        def remote(request: Any, raw_request_info: Any = None) -> AsyncIterator[Any]:
            self.sent.append((method, request))
            return self._answer()

        return SimpleNamespace(remote=remote)

    async def _answer(self) -> AsyncIterator[Any]:
        yield SimpleNamespace(kv_transfer_params=PREFILL_PARAMS)


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Any:
    require_serve_deps()
    from ray.llm._internal.serve.engines.vllm.kv_transfer.nixl import NixlConnectorBackend

    from ray_pods import selective_pd  # imports ray: make test-fast runs without it

    RecordingCounter.made = []
    monkeypatch.setattr(selective_pd, "Counter", RecordingCounter)
    made = selective_pd.SelectivePDDecodeServer.__new__(selective_pd.SelectivePDDecodeServer)
    made.engine = StandInEngine()
    made._prefill_handle = StandInPrefill()
    made._llm_config = SimpleNamespace(
        kv_connector_backend=NixlConnectorBackend(SimpleNamespace()), experimental_configs={}, lora_config=None
    )
    return made


def _chat(words: int, **fields: Any) -> Any:
    from ray.llm._internal.serve.core.configs.openai_api_models import ChatCompletionRequest

    content = " ".join(["word"] * words)
    return ChatCompletionRequest(model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=4, **fields)


def _completion(prompt: Any) -> Any:
    from ray.llm._internal.serve.core.configs.openai_api_models import CompletionRequest

    return CompletionRequest(model=MODEL, prompt=prompt, max_tokens=4)


def _handle(
    server: Any, request: Any, headers: dict[str, str] | None = None, threshold: int | None = None
) -> list[Any]:
    from ray.llm._internal.serve.core.protocol import RawRequestInfo

    from ray_pods.selective_pd import THRESHOLD_KEY  # imports ray: make test-fast runs without it

    async def run() -> list[Any]:
        if threshold is not None:
            await server.reconfigure({THRESHOLD_KEY: threshold})
        info = None if headers is None else RawRequestInfo(headers=headers)
        return [chunk async for chunk in server._pd_handle_request(request, info)]

    return asyncio.run(run())


def test_a_short_chat_is_prefilled_on_decode_through_chat_and_a_long_one_through_prefill(server: Any) -> None:
    threshold = 64
    assert _handle(server, _chat(threshold - TEMPLATE_TOKENS), threshold=threshold) == ["chat answer"]
    assert server.engine.calls == [("chat", None)], "local: decode's own chat, no KV to pull"
    assert server._prefill_handle.sent == []
    _handle(server, _chat(threshold - TEMPLATE_TOKENS + 1))
    (sent,) = server._prefill_handle.sent
    assert sent[0] == "chat" and sent[1].kv_transfer_params["do_remote_decode"] is True
    assert server.engine.calls[1] == ("chat", PREFILL_PARAMS), "split: decode pulls what prefill returned"


def test_a_completion_goes_to_completions_on_either_route(server: Any) -> None:
    _handle(server, _completion("a short prompt"), threshold=64)
    _handle(server, _completion(" ".join(["word"] * 100)))
    assert [method for method, _ in server.engine.calls] == ["completions", "completions"]
    assert [method for method, _ in server._prefill_handle.sent] == ["completions"]


def test_the_prompt_is_counted_by_the_engines_renderer_not_taken_as_one_token(server: Any) -> None:
    from ray_pods.selective_pd import given_token_count  # imports ray: make test-fast runs without it

    assert asyncio.run(server._count_prompt_tokens(_chat(40))).tokens == 40 + TEMPLATE_TOKENS
    assert asyncio.run(server._count_prompt_tokens(_completion("three short words"))).tokens == 3 + TEMPLATE_TOKENS
    assert server.engine.rendered == ["chat", "completion"]
    # Token ids need no rendering; several prompts in one completion are not counted (Ray's split path).
    assert (
        asyncio.run(server._count_prompt_tokens(_completion([1, 2, 3, 4, 5]))).tokens
        == 5
        == given_token_count(_completion([1, 2, 3, 4, 5]))
    )
    assert asyncio.run(server._count_prompt_tokens(_completion(["one", "two"]))).tokens is None
    assert server.engine.rendered == ["chat", "completion"]


@pytest.mark.parametrize(("header", "expected"), [("local", "local"), ("split", "split")])
def test_the_route_header_overrides_the_threshold_and_nothing_is_counted(
    server: Any, header: str, expected: str
) -> None:
    from ray_pods.selective_pd import ROUTE_HEADER  # imports ray: make test-fast runs without it

    # A long prompt kept local, or a short one split.
    request = _chat(200) if header == "local" else _chat(3)
    _handle(server, request, headers={ROUTE_HEADER: header}, threshold=64)
    assert server.engine.rendered == [], "the header skips the count"
    assert bool(server._prefill_handle.sent) == (expected == "split")
    assert RecordingCounter.made[0]["tags"] == [{"prefill": expected, "reason": "header"}]


def test_the_route_counter_tags_where_and_why(server: Any) -> None:
    from ray_pods.selective_pd import REQUESTS_METRIC  # imports ray: make test-fast runs without it

    _handle(server, _chat(3), threshold=64)
    _handle(server, _chat(100))
    _handle(server, _chat(3), threshold=0)
    (counter,) = RecordingCounter.made
    assert counter["name"] == REQUESTS_METRIC and counter["tag_keys"] == ("prefill", "reason")
    assert counter["tags"] == [
        {"prefill": "local", "reason": "short prompt"},
        {"prefill": "split", "reason": "long prompt"},
        {"prefill": "split", "reason": "always split"},
    ]


def test_reconfigure_called_twice_takes_the_second_threshold(server: Any) -> None:
    from ray_pods.selective_pd import THRESHOLD_KEY  # imports ray: make test-fast runs without it

    asyncio.run(server.reconfigure({THRESHOLD_KEY: 8}))
    asyncio.run(server.reconfigure({THRESHOLD_KEY: 128}))
    assert server._local_prefill_max_tokens == 128
    _handle(server, _chat(100))
    assert server._prefill_handle.sent == [] and server.engine.calls == [("chat", None)], "100 words: local at 128"


def test_a_prompt_past_max_model_len_gets_the_engines_400_at_a_threshold_and_reaches_no_engine(server: Any) -> None:
    """Ray's own path answers vLLM's VLLMValidationError with a 400 (VLLMEngine._make_error_response); the count
    must too, not raise it into Ray's 500."""
    from ray.llm._internal.serve.core.configs.openai_api_models import ErrorResponse

    (answer,) = _handle(server, _chat(MAX_MODEL_LEN * 2), threshold=64)
    assert isinstance(answer, ErrorResponse) and answer.error.code == 400
    assert "maximum context length" in answer.error.message
    assert server.engine.calls == [] and server._prefill_handle.sent == []


def test_an_engine_failure_while_counting_is_not_made_a_client_error(server: Any) -> None:
    """Only a client's error becomes an answer; anything else propagates as on Ray's path (the ingress then says
    only that the server failed)."""

    async def dead(_: Any) -> Any:
        raise RuntimeError("engine core died")

    server.engine._oai_serving_chat.render_chat_request = dead
    with pytest.raises(RuntimeError, match="engine core died"):
        _handle(server, _chat(3), threshold=64)


def test_decode_with_data_parallelism_is_refused_so_the_threshold_cannot_be_lost(template: dict[str, Any]) -> None:
    """Ray's builder picks DPPDDecodeServer for decode with data_parallel_size above 1, which the product's swap
    does not replace: the product's builder stops there, naming the setting that would be lost."""
    require_serve_deps()
    import copy

    import yaml

    from ray_pods.selective_pd import THRESHOLD_KEY, build_pd_openai_app  # imports ray: make test-fast runs without it

    (app,) = yaml.safe_load(rayservice_from(template)["spec"]["serveConfigV2"])["applications"]
    args = copy.deepcopy(app["args"])
    args["decode_config"]["engine_kwargs"]["data_parallel_size"] = 2
    with pytest.raises(ValueError, match=f"DPPDDecodeServer.*{THRESHOLD_KEY}"):
        build_pd_openai_app(args)
