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

The count is the engine's render, not a second one (`RenderHandoff`): decode's renderer is one worker thread
(vLLM's renderer_num_workers, default 1) that every chat template and tokenization on decode queues for, and a
second render of each prompt doubled that queue. The count renders a copy of the request through the serving
object's `render_chat_request` or `render_completion_request` (vLLM's model and dead-engine checks, then its
OnlineRenderer). Kept local, that copy goes to the engine, whose own `render_chat_request` makes both checks
again and takes the count's render where it would call the OnlineRenderer. Split, prefill gets a copy of the
client's request as on Ray's path, and decode's request is made from the rendered copy (`_get_connector_backend`),
so decode's engine takes the count's render too. Rendering may rewrite the request (a reasoning or tool parser's
`adjust_request`: skip_special_tokens, a tool's structured output), so the engine always gets the request that
was rendered. Not the lower `OnlineRenderer.render_chat`, which takes skip_mm_cache but makes neither check; and
not a wider renderer pool, which vLLM refuses for a multimodal model with its processor cache on (config/model.py).
With one render, what a multimodal render puts in the sender's processor cache reaches the engine core with it, as
on vLLM's own path (a count never sent would leave the sender's cache ahead of the engine core's); on a split, only
after prefill answers, so a split failing at prefill still leaves it ahead. No model in settings/catalog.py is
multimodal.

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
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Counted:
    """A prompt's tokens and, where the count rendered it, what it rendered: the request as rendered (a copy of the
    client's: rendering rewrites some requests, e.g. a tool parser sets its structured output) and vLLM's render of
    it, which decode's engine takes in place of rendering the request again (RenderHandoff)."""

    tokens: int | None
    request: Any = None
    rendered: Any = None


class RenderHandoff:
    """The count's render, taken by decode's engine for the same request instead of a second render.

    vLLM 0.26's serving objects make the model check and the dead-engine check, then call their OnlineRenderer
    (chat_completion/serving.py `render_chat_request`, completion/serving.py `render_completion_request`). The
    hand-off wraps that OnlineRenderer's `render_chat` and `render_completion`, on decode's engine only, so both
    checks still run on the engine's own path and only the rendering is taken from the count. A render is kept for
    one request object (held here, so its id is not reused), taken at most once, and dropped when the request ends
    whether or not the engine took it; any other call renders as vLLM does, and a call with arguments (the
    tokenize route's skip_mm_cache) is never answered from here.
    """

    def __init__(self) -> None:
        self._kept: dict[int, tuple[Any, Any]] = {}
        self.taken = 0

    def install(self, online_renderer: Any) -> None:
        if getattr(online_renderer, "_render_handoff", None) is self:
            return
        for name in ("render_chat", "render_completion"):
            setattr(online_renderer, name, self._taking(getattr(online_renderer, name)))
        online_renderer._render_handoff = self

    def _taking(self, render: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def render_or_take(request: Any, **options: Any) -> Any:
            kept = None if options else self._kept.pop(id(request), None)
            if kept is not None and kept[0] is request:
                self.taken += 1
                return kept[1]
            return await render(request, **options)

        return render_or_take

    def keep(self, request: Any, rendered: Any) -> None:
        self._kept[id(request)] = (request, rendered)

    def drop(self, request: Any) -> None:
        if self._kept.get(id(request), (None,))[0] is request:
            del self._kept[id(request)]

    def __len__(self) -> int:
        return len(self._kept)


class _DecodeRequestFromRender:
    """Ray's KV-connector backend, making a split request's decode request from the request as the count rendered
    it, and handing the count's render to decode's engine for it. Ray's split path asks `_get_connector_backend`
    for the backend and makes the decode request with `prepare_decode_request` (pd_server.py
    `_pd_handle_request`): a deep copy plus prefill's kv_transfer_params. The prefill request is still made from
    the client's request, so prefill renders it as Ray's path does."""

    def __init__(self, backend: Any, server: "SelectivePDDecodeServer") -> None:
        self._backend = backend
        self._server = server

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def prepare_decode_request(self, *, request: Any, peer: Any, prefill_response: Any) -> Any:
        pending = self._server._split_renders.get(id(request))
        if pending is None or pending[0] is not request:
            return self._backend.prepare_decode_request(request=request, peer=peer, prefill_response=prefill_response)
        _, counted, handed = pending
        decode_request = self._backend.prepare_decode_request(
            request=counted.request, peer=peer, prefill_response=prefill_response
        )
        self._server._handoff.keep(decode_request, counted.rendered)
        handed.append(decode_request)
        return decode_request


class SelectivePDDecodeServer(PDDecodeServer):  # type: ignore[misc]  # Ray ships no type information
    """Ray's decode server, prefilling a request itself when its prompt is at most the threshold."""

    # Until Serve calls reconfigure with the deployment's user_config: split every request, as Ray does.
    _local_prefill_max_tokens = 0
    _requests: Counter | None = None
    # Made on first use: Serve builds the replica through Ray's constructor, which this class does not override.
    _handoff_made: RenderHandoff | None = None
    _split_renders_made: dict[int, tuple[Any, Counted, list[Any]]] | None = None

    @property
    def _handoff(self) -> RenderHandoff:
        if self._handoff_made is None:
            self._handoff_made = RenderHandoff()
        return self._handoff_made

    @property
    def _split_renders(self) -> dict[int, tuple[Any, Counted, list[Any]]]:
        """A split request's count, by the client's request, until Ray's split path makes its decode request."""
        if self._split_renders_made is None:
            self._split_renders_made = {}
        return self._split_renders_made

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

    def _get_connector_backend(self) -> Any:
        return _DecodeRequestFromRender(super()._get_connector_backend(), self)

    async def _count_prompt_tokens(self, request: ChatCompletionRequest | CompletionRequest) -> Counted:
        """The prompt's tokens as the engine renders them, by the engine's own renderer (vLLM's chat or completion
        serving, as its create_chat_completion renders a request), with that render kept for the engine. No count
        for several prompts in one completion: the request then goes Ray's way. Raises RenderRefusedError with the
        engine's own answer where the renderer refuses the request with a client error (a 4xx); anything else (a
        dead engine) propagates, as on Ray's path."""
        given = given_token_count(request)
        if given is not None or not renders_one_prompt(request):
            return Counted(given)
        chat = isinstance(request, ChatCompletionRequest)
        serving = self.engine._oai_serving_chat if chat else self.engine._oai_serving_completion
        self._handoff.install(serving.online_renderer)
        # A copy: the client's request stays as it came for a split's prefill request, which prefill renders.
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
            return Counted(None)
        return Counted(int(serving._extract_prompt_len(inputs[0])), copied, rendered)

    async def _pd_handle_request(
        self, request: Any, raw_request_info: RawRequestInfo | None = None
    ) -> AsyncGenerator[Any, None]:
        header = None if raw_request_info is None else raw_request_info.headers.get(ROUTE_HEADER)
        threshold = self._local_prefill_max_tokens
        counted = Counted(None)
        counted_in_s = 0.0
        if header not in ROUTES and threshold > 0:
            started = time.perf_counter()
            try:
                counted = await self._count_prompt_tokens(request)
            except RenderRefusedError as refused:
                error = refused.response.error
                logger.info("request refused by the renderer: HTTP %s: %s", error.code, error.message[:200])
                yield refused.response
                return
            counted_in_s = time.perf_counter() - started
        route, reason = choose_route(header, threshold, counted.tokens)
        self._count_request(route, reason)
        if threshold > 0 or header in ROUTES:
            # One line a request only where a choice was made: at the default (0) Serve's access line says enough.
            logger.info(
                "prefill %s (%s): %s prompt tokens, counted in %.1f ms",
                route,
                reason,
                counted.tokens,
                counted_in_s * 1000,
            )
        if route == SPLIT:
            handed: list[Any] = []
            if counted.rendered is not None:
                self._split_renders[id(request)] = (request, counted, handed)
            try:
                async for chunk in super()._pd_handle_request(request, raw_request_info):
                    yield chunk
            finally:
                if self._split_renders.get(id(request), (None,))[0] is request:
                    del self._split_renders[id(request)]
                for decode_request in handed:
                    self._handoff.drop(decode_request)
            return
        local_request = request
        if counted.rendered is not None:
            # The count rendered this copy: the engine takes that render instead of making its own.
            local_request = counted.request
            self._handoff.keep(local_request, counted.rendered)
        method = LLMServer.chat if isinstance(request, ChatCompletionRequest) else LLMServer.completions
        try:
            local = await method(self, local_request, raw_request_info)
            async for chunk in local:
                yield chunk
        finally:
            self._handoff.drop(local_request)


def build_pd_openai_app(pd_serving_args: dict[str, Any]) -> Application:
    """Ray's `build_pd_openai_app`, with the product's decode class (`SelectivePDDecodeServer`, timed against a
    latency target) where it names `PDDecodeServer`, and the product's prefill class where it names
    `PDPrefillServer` (ray_pods/latency_servers.py)."""
    from ray_pods.latency_servers import LatencyPDDecodeServer, LatencyPrefillServer  # a cycle: built on this module

    decode = ray_pd_builder.PDServingArgs.model_validate(pd_serving_args).decode_config
    dp_size = int(decode.engine_kwargs.get("data_parallel_size", 1))
    if dp_size > 1:
        raise ValueError(
            f"decode's data_parallel_size is {dp_size}: Ray's builder then runs DPPDDecodeServer, which has no local "
            f"prefill threshold ({THRESHOLD_KEY}); run decode with data_parallel_size 1"
        )
    rays = ray_pd_builder.PDDecodeServer, ray_pd_builder.PDPrefillServer
    ray_pd_builder.PDDecodeServer, ray_pd_builder.PDPrefillServer = LatencyPDDecodeServer, LatencyPrefillServer
    try:
        return ray_pd_builder.build_pd_openai_app(pd_serving_args)
    finally:
        ray_pd_builder.PDDecodeServer, ray_pd_builder.PDPrefillServer = rays
