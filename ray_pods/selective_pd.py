"""Split a request only where splitting pays: decode prefills a short prompt itself.

Named in serveConfigV2 as the application's `import_path` (`build_pd_openai_app` below) in disaggregated mode.

Ray 2.58's `PDDecodeServer` sends every request's prompt to a prefill replica first and then decodes locally
with the KV it pulled (serving_patterns/prefill_decode/pd_server.py, `_pd_handle_request`). Below a few
thousand tokens that round trip costs more than prefilling on decode (docs/architecture.md, "Which requests
are split"). `SelectivePDDecodeServer` counts the prompt's tokens as the engine will: with the engine's own
renderer (vLLM's chat or completion serving), the model's tokenizer and chat template. Not through Ray's
`LLMServer.tokenize`: Ray 2.58 looks for vLLM's tokenize route under a name vLLM 0.26 no longer sets
(`openai_serving_tokenization`; vLLM names it `serving_tokenization`) and answers that the model cannot
tokenize. A prompt the renderer refuses (longer than max_model_len, a bad template or tool) gets the error
Ray's own path makes of it (VLLMEngine._make_error_response: vLLM's status, a 400 for a validation error), not
the 500 an uncaught exception makes. At or below the threshold it runs the request whole on decode's engine
through `LLMServer`'s own path: decode's engine is `kv_both`, and a request without `kv_transfer_params` (the
ingress refuses a client's) is an ordinary local request to vLLM's NixlConnector. Above it, or at a threshold
of 0, Ray's own `_pd_handle_request` runs unchanged.

It counts the whole prompt, not the part decode has not cached: vLLM looks a prompt up in its prefix cache
only when its scheduler admits it, and exposes no lookup before that, so the count is an upper bound and a
cached long prompt is still split.

The threshold is the deployment's `user_config` (`reconfigure`), which Serve changes in place: it is not in
Serve's code version, so a new threshold restarts no engine. A request's `x-pd-prefill` header (`split` or
`local`) overrides it, for debugging and for `verify`; the product's ingress (api_keys.py) lets it through only
from the API keys the setting pd_prefill_header_keys names, and refuses it from everyone else.

`build_pd_openai_app` is Ray's own builder with this class where Ray's builder names `PDDecodeServer`: Ray's
builder takes no decode class. tests/test_selective_pd.py compares what it builds with what Ray's builder
builds on the same config, so that a change in Ray's builder fails there. Decode with data parallelism above 1
is refused: Ray's builder then names DPPDDecodeServer, which this swap does not replace, so the threshold would
be lost without a word (and Serve refuses a user_config on a class without `reconfigure`).
"""

# No `from __future__ import annotations`: Serve and pydantic may read these signatures at run time.
import logging
import time
from collections.abc import AsyncGenerator
from typing import Any

from ray.llm._internal.serve.core.configs.openai_api_models import (
    ChatCompletionRequest,
    CompletionRequest,
    ErrorInfo,
    ErrorResponse,
)
from ray.llm._internal.serve.core.protocol import RawRequestInfo
from ray.llm._internal.serve.core.server.llm_server import LLMServer
from ray.llm._internal.serve.engines.vllm.vllm_engine import VLLMEngine
from ray.llm._internal.serve.serving_patterns.prefill_decode import builder as ray_pd_builder
from ray.llm._internal.serve.serving_patterns.prefill_decode.pd_server import PDDecodeServer
from ray.serve.deployment import Application
from ray.serve.metrics import Counter

logger = logging.getLogger("ray.serve")

THRESHOLD_KEY = "local_prefill_max_tokens"
# A request's override of the threshold.
ROUTE_HEADER = "x-pd-prefill"
LOCAL, SPLIT = "local", "split"
ROUTES = (LOCAL, SPLIT)
# Requests by where they were prefilled (`prefill`: local or split) and why (`reason`); Ray's exporter names it
# ray_pd_prefill_requests_total (observability/dashboard.json). Not `route`: Serve adds that tag itself.
REQUESTS_METRIC = "pd_prefill_requests"


def choose_route(header: str | None, threshold: int, prompt_tokens: int | None) -> tuple[str, str]:
    """(local or split, the reason): the header wins, then the threshold (0 splits all) on the prompt's tokens."""
    if header in ROUTES:
        return header, "header"
    if threshold <= 0 or prompt_tokens is None:
        return SPLIT, "always split"
    if prompt_tokens <= threshold:
        return LOCAL, "short prompt"
    return SPLIT, "long prompt"


def given_token_count(request: ChatCompletionRequest | CompletionRequest) -> int | None:
    """A completion's prompt given as token ids: its length, with nothing to render."""
    prompt = getattr(request, "prompt", None)
    if isinstance(prompt, list) and prompt and all(isinstance(token, int) for token in prompt):
        return len(prompt)
    return None


class RenderRefusedError(Exception):
    """The engine's renderer refused the request: its answer, in OpenAI's shape, for the client."""

    def __init__(self, response: ErrorResponse) -> None:
        super().__init__(response.error.message)
        self.response = response


def renders_one_prompt(request: ChatCompletionRequest | CompletionRequest) -> bool:
    """A chat, or a completion of one text prompt: one prompt the engine renders."""
    return isinstance(request, ChatCompletionRequest) or isinstance(getattr(request, "prompt", None), str)


class SelectivePDDecodeServer(PDDecodeServer):  # type: ignore[misc]  # Ray ships no type information
    """Ray's decode server, prefilling a request itself when its prompt is at most the threshold."""

    # Until Serve calls reconfigure with the deployment's user_config: split every request, as Ray does.
    _local_prefill_max_tokens = 0
    _requests: Counter | None = None

    def _count_request(self, route: str, reason: str) -> None:
        if self._requests is None:
            self._requests = Counter(
                REQUESTS_METRIC,
                description="Requests by where their prompt was prefilled (local or split) and why.",
                tag_keys=("prefill", "reason"),
            )
        self._requests.inc(tags={"prefill": route, "reason": reason})

    async def reconfigure(self, user_config: dict[str, Any]) -> None:
        """Serve calls this after the constructor and on every change of the deployment's user_config."""
        self._local_prefill_max_tokens = int(user_config.get(THRESHOLD_KEY, 0))
        logger.info(
            "local prefill for prompts of at most %d tokens (0: every request split)", self._local_prefill_max_tokens
        )

    async def _count_prompt_tokens(self, request: ChatCompletionRequest | CompletionRequest) -> int | None:
        """The prompt's tokens as the engine renders them, by the engine's own renderer (vLLM's chat or completion
        serving, as its create_chat_completion renders a request). None for several prompts in one completion: the
        request then goes Ray's way. Raises RenderRefusedError with the engine's own answer where the renderer
        refuses the request with a client error (a 4xx); anything else (a dead engine) propagates, as on Ray's path."""
        given = given_token_count(request)
        if given is not None or not renders_one_prompt(request):
            return given
        chat = isinstance(request, ChatCompletionRequest)
        serving = self.engine._oai_serving_chat if chat else self.engine._oai_serving_completion
        # A copy: rendering may rewrite a request's tool calls, and the request goes on to the engine.
        copied = request.model_copy(deep=True)
        try:
            rendered = await (
                serving.render_chat_request(copied) if chat else serving.render_completion_request(copied)
            )
        except Exception as err:
            # Ray's own mapping of what vLLM raises (VLLMValidationError, a template's error: 400).
            answer = VLLMEngine._make_error_response(serving, err)
            if not 400 <= int(answer.error.code) < 500:
                raise
            raise RenderRefusedError(answer) from err
        if hasattr(rendered, "error"):  # vLLM's ErrorResponse: the model check refused it
            raise RenderRefusedError(ErrorResponse(error=ErrorInfo(**rendered.error.model_dump())))
        inputs = rendered[1] if isinstance(rendered, tuple) else rendered
        if not isinstance(inputs, list) or len(inputs) != 1:
            logger.warning("could not count the prompt's tokens, so the request is split: %s", type(rendered))
            return None
        return int(serving._extract_prompt_len(inputs[0]))

    async def _pd_handle_request(
        self, request: Any, raw_request_info: RawRequestInfo | None = None
    ) -> AsyncGenerator[Any, None]:
        header = None if raw_request_info is None else raw_request_info.headers.get(ROUTE_HEADER)
        threshold = self._local_prefill_max_tokens
        tokens = None
        counted_in_s = 0.0
        if header not in ROUTES and threshold > 0:
            started = time.perf_counter()
            try:
                tokens = await self._count_prompt_tokens(request)
            except RenderRefusedError as refused:
                error = refused.response.error
                logger.info("request refused by the renderer: HTTP %s: %s", error.code, error.message[:200])
                yield refused.response
                return
            counted_in_s = time.perf_counter() - started
        route, reason = choose_route(header, threshold, tokens)
        self._count_request(route, reason)
        if threshold > 0 or header in ROUTES:
            # One line a request only where a choice was made: at the default (0) Serve's access line says enough.
            logger.info(
                "prefill %s (%s): %s prompt tokens, counted in %.1f ms", route, reason, tokens, counted_in_s * 1000
            )
        if route == SPLIT:
            async for chunk in super()._pd_handle_request(request, raw_request_info):
                yield chunk
            return
        method = LLMServer.chat if isinstance(request, ChatCompletionRequest) else LLMServer.completions
        local = await method(self, request, raw_request_info)
        async for chunk in local:
            yield chunk


def build_pd_openai_app(pd_serving_args: dict[str, Any]) -> Application:
    """Ray's `build_pd_openai_app`, with `SelectivePDDecodeServer` where it names `PDDecodeServer`."""
    decode = ray_pd_builder.PDServingArgs.model_validate(pd_serving_args).decode_config
    dp_size = int(decode.engine_kwargs.get("data_parallel_size", 1))
    if dp_size > 1:
        raise ValueError(
            f"decode's data_parallel_size is {dp_size}: Ray's builder then runs DPPDDecodeServer, which has no local "
            f"prefill threshold ({THRESHOLD_KEY}); run decode with data_parallel_size 1"
        )
    rays = ray_pd_builder.PDDecodeServer
    ray_pd_builder.PDDecodeServer = SelectivePDDecodeServer
    try:
        return ray_pd_builder.build_pd_openai_app(pd_serving_args)
    finally:
        ray_pd_builder.PDDecodeServer = rays
