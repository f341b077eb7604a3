"""Decode renders a prompt once (ray_pods/selective_pd.py, RenderHandoff): the count's render is the engine's.

Everything here is vLLM 0.26's and Ray 2.58's own: vLLM's OpenAIServingChat and OpenAIServingCompletion as
init_app_state builds them, on the real HfRenderer (one renderer worker, as decode runs) with the rehearsal's tiny
model's tokenizer and chat template and Qwen3's reasoning parser (as the product sets it); Ray's VLLMEngine.chat and
.completions around them, Ray's LLMServer path and its split path with Ray's NIXL connector backend. A stand-in
stands only for vLLM's engine core (it records the prompt and sampling parameters it was given and answers two
tokens) and for prefill's deployment handle. Renders are counted on the real renderer (render_chat_async,
render_cmpl_async); the answers are compared with vLLM's own create_chat_completion on the same request.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from rehearsal import make_model
from tests.conftest import require_serve_deps

pytestmark = pytest.mark.private_internals

MODEL = "tiny"
MAX_MODEL_LEN = 2048
THRESHOLD = 512
PREFILL_PARAMS = {"do_remote_prefill": True, "remote_engine_id": "prefill-engine", "remote_block_ids": [1, 2]}


class EngineCore:
    """vLLM's engine client below the serving objects: what reached the engine, and a two-token answer."""

    def __init__(self, vllm_config: Any, renderer: Any) -> None:
        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config
        self.renderer = renderer
        self.input_processor = None
        self.dead_error = RuntimeError("engine core died")
        self.errored_after: int | None = None  # reads of `errored` before the engine reports itself dead
        self.errored_reads = 0
        self.generated: list[tuple[list[int], Any]] = []

    @property
    def errored(self) -> bool:
        self.errored_reads += 1
        return self.errored_after is not None and self.errored_reads > self.errored_after

    async def is_tracing_enabled(self) -> bool:
        return False

    async def generate(self, prompt: Any, sampling_params: Any, request_id: str, **_: Any) -> AsyncIterator[Any]:
        from vllm.outputs import CompletionOutput, RequestOutput

        self.generated.append((list(prompt["prompt_token_ids"]), sampling_params))
        answer = CompletionOutput(
            index=0, text="hi", token_ids=[5, 6], cumulative_logprob=None, logprobs=None, finish_reason="stop"
        )
        yield RequestOutput(
            request_id=request_id,
            prompt=None,
            prompt_token_ids=prompt["prompt_token_ids"],
            prompt_logprobs=None,
            outputs=[answer],
            finished=True,
        )


class Prefill:
    """Prefill's deployment handle: answers with prefill's kv_transfer_params, as prefill's engine does."""

    def __init__(self) -> None:
        self.sent: list[Any] = []

    def options(self, **_: Any) -> Prefill:
        return self

    def __getattr__(self, method: str) -> Any:
        def remote(request: Any, raw_request_info: Any = None) -> AsyncIterator[Any]:
            self.sent.append(request)
            return self._answer()

        return SimpleNamespace(remote=remote)

    async def _answer(self) -> AsyncIterator[Any]:
        yield SimpleNamespace(kv_transfer_params=PREFILL_PARAMS)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The rehearsal's tiny model's tokenizer and config: all a renderer reads (no weights)."""
    require_serve_deps()
    from transformers import Qwen3Config

    out = tmp_path_factory.mktemp("model")
    make_model.make_tokenizer().save_pretrained(out)
    Qwen3Config(**make_model.CONFIG, architectures=["Qwen3ForCausalLM"]).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def vllm_args(model_dir: Path) -> tuple[argparse.Namespace, Any]:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.openai.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    argv = ["--model", str(model_dir), "--served-model-name", MODEL, "--max-model-len", str(MAX_MODEL_LEN)]
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(
        [*argv, "--enforce-eager", "--reasoning-parser", "qwen3"]
    )
    config = AsyncEngineArgs.from_cli_args(args).create_engine_config()
    assert config.model_config.renderer_num_workers == 1, "decode's default: one renderer worker"
    return args, config


@pytest.fixture
def decode(vllm_args: tuple[argparse.Namespace, Any], monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Decode's server on vLLM's serving objects, its renders counted on the real renderer."""
    from ray.llm._internal.serve.engines.vllm.kv_transfer.nixl import NixlConnectorBackend
    from ray.llm._internal.serve.engines.vllm.vllm_engine import VLLMEngine
    from starlette.datastructures import State
    from vllm.entrypoints.openai.api_server import init_app_state
    from vllm.renderers import renderer_from_config

    from ray_pods import selective_pd  # imports ray: make test-fast runs without it

    args, config = vllm_args
    renderer = renderer_from_config(config)
    renders: list[str] = []
    for name in ("render_chat_async", "render_cmpl_async"):
        real = getattr(renderer, name)

        def counted(*a: Any, _real: Any = real, _name: str = name, **k: Any) -> Any:
            renders.append(_name)
            return _real(*a, **k)

        monkeypatch.setattr(renderer, name, counted)
    core = EngineCore(config, renderer)
    state = State()
    asyncio.run(init_app_state(core, state, args, supported_tasks=("generate",)))
    engine = VLLMEngine.__new__(VLLMEngine)
    engine._oai_serving_chat = state.openai_serving_chat
    engine._oai_serving_completion = state.openai_serving_completion

    monkeypatch.setattr(selective_pd, "Counter", lambda *_, **__: SimpleNamespace(inc=lambda **_: None))
    server = selective_pd.SelectivePDDecodeServer.__new__(selective_pd.SelectivePDDecodeServer)
    server.engine = engine
    server._prefill_handle = Prefill()
    server._llm_config = SimpleNamespace(
        kv_connector_backend=NixlConnectorBackend(SimpleNamespace()), experimental_configs={}, lora_config=None
    )
    asyncio.run(server.reconfigure({selective_pd.THRESHOLD_KEY: THRESHOLD}))
    yield SimpleNamespace(server=server, core=core, renders=renders, state=state)
    renderer.shutdown()


def _chat(words: int, **fields: Any) -> Any:
    from ray.llm._internal.serve.core.configs.openai_api_models import ChatCompletionRequest

    content = " ".join(["settings"] * words)
    fields = {"model": MODEL, "max_tokens": 4, **fields}
    return ChatCompletionRequest(messages=[{"role": "user", "content": content}], **fields)


def _completion(words: int) -> Any:
    from ray.llm._internal.serve.core.configs.openai_api_models import CompletionRequest

    return CompletionRequest(model=MODEL, prompt=" ".join(["settings"] * words), max_tokens=4)


def _handle(decode: Any, request: Any) -> list[Any]:
    async def run() -> list[Any]:
        return [chunk async for chunk in decode.server._pd_handle_request(request, None)]

    return asyncio.run(run())


def _vllms_own(decode: Any, request: Any) -> tuple[Any, list[int], Any]:
    """vLLM's create_chat_completion on the same request, with no product code: its answer and what reached the
    engine."""
    before = len(decode.core.generated)
    answer = asyncio.run(decode.state.openai_serving_chat.create_chat_completion(request.model_copy(deep=True)))
    ((prompt, params),) = decode.core.generated[before:]
    return answer, prompt, params


def _same_sampling(ours: Any, vllms: Any) -> None:
    for field in ("max_tokens", "skip_special_tokens", "structured_outputs", "temperature", "stop_token_ids"):
        assert getattr(ours, field) == getattr(vllms, field), field


def test_a_local_chat_is_rendered_once_and_answered_as_vllm_answers_it(decode: Any) -> None:
    request = _chat(20, stream=False)
    (answer,) = _handle(decode, request)
    assert decode.renders == ["render_chat_async"], "one render on decode: the count's, taken by the engine"
    assert decode.server._handoff.taken == 1 and len(decode.server._handoff) == 0
    assert decode.server._prefill_handle.sent == [], "local: prefill never sees it"
    ((prompt, params),) = decode.core.generated
    vllms_answer, vllms_prompt, vllms_params = _vllms_own(decode, request)
    assert prompt == vllms_prompt and 20 < len(prompt) <= THRESHOLD
    # The reasoning parser's adjustment of the request (skip_special_tokens) reached the engine, as on vLLM's path.
    _same_sampling(params, vllms_params)
    assert params.skip_special_tokens is False
    assert answer.choices[0].message.content == vllms_answer.choices[0].message.content
    assert answer.usage.prompt_tokens == vllms_answer.usage.prompt_tokens == len(prompt)


def test_a_streamed_local_chat_is_rendered_once(decode: Any) -> None:
    chunks = _handle(decode, _chat(20, stream=True))
    assert decode.renders == ["render_chat_async"]
    assert len(decode.core.generated) == 1
    assert any("[DONE]" in str(chunk) for chunk in chunks)
    assert len(decode.server._handoff) == 0


def test_a_local_completion_is_rendered_once(decode: Any) -> None:
    (answer,) = _handle(decode, _completion(20))
    assert decode.renders == ["render_cmpl_async"]
    ((prompt, _),) = decode.core.generated
    assert answer.usage.prompt_tokens == len(prompt)


def test_a_split_chat_is_rendered_once_on_decode_and_decode_pulls_prefills_kv(decode: Any) -> None:
    request = _chat(THRESHOLD * 2, stream=False)
    (answer,) = _handle(decode, request)
    (sent,) = decode.server._prefill_handle.sent
    assert sent.kv_transfer_params["do_remote_decode"] is True, "prefill is sent the client's request, as by Ray"
    assert decode.renders == ["render_chat_async"], "decode's engine took the count's render"
    ((prompt, params),) = decode.core.generated
    assert len(prompt) > THRESHOLD
    assert params.extra_args["kv_transfer_params"] == PREFILL_PARAMS, "decode pulls what prefill returned"
    _, vllms_prompt, vllms_params = _vllms_own(decode, request)
    assert prompt == vllms_prompt
    _same_sampling(params, vllms_params)
    assert answer.usage.prompt_tokens == len(prompt)
    assert len(decode.server._handoff) == 0 and decode.server._split_renders == {}


def test_the_engines_checks_still_run_on_the_handed_render(decode: Any) -> None:
    """The engine's own render_chat_request still checks the engine: one that died after the count fails the
    request as vLLM's path fails it, not with the count's render."""
    decode.core.errored_after = 1  # the count's check passes, the engine's finds it dead
    with pytest.raises(RuntimeError, match="engine core died"):
        _handle(decode, _chat(20, stream=False))
    assert decode.core.generated == []
    assert len(decode.server._handoff) == 0, "the render kept for the engine is dropped with the request"


def test_refusals_are_vllms_answers_and_reach_no_engine(decode: Any) -> None:
    from ray.llm._internal.serve.core.configs.openai_api_models import ErrorResponse

    (too_long,) = _handle(decode, _chat(MAX_MODEL_LEN * 2))
    assert isinstance(too_long, ErrorResponse) and too_long.error.code == 400
    assert "maximum context length" in too_long.error.message
    (unknown,) = _handle(decode, _chat(3, model="another-model"))
    assert isinstance(unknown, ErrorResponse) and unknown.error.code == 404, "vLLM's model check, as on its path"
    (untrusted,) = _handle(decode, _chat(3, chat_template="{{ messages }}"))
    assert isinstance(untrusted, ErrorResponse) and untrusted.error.code == 400
    assert decode.core.generated == [] and decode.server._prefill_handle.sent == []
    assert len(decode.server._handoff) == 0
