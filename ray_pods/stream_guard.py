"""The product's ingress's generating routes, keys on or off: the request timeout kept by the ingress, an
error event when a stream is cut or reaches it, and the model's work cancelled when a stream ends before
its last event.

Serve's proxy reads two client headers before any ingress sees the request (Ray 2.58
serve/_private/proxy.py, send_request_to_replica; http_util.py): ``x-request-timeout-seconds``
replaces http_options.request_timeout_s, and 0 or less turns the timeout off;
``x-request-disconnect-disabled: ?1`` stops the proxy cancelling the call when the client hangs up.
Either lets a caller hold decode past its drain (request_timeout_seconds + 5 s) and be killed on
scale-down. So the ingress ends every chat and completion at the product's request timeout itself,
and cancels the model's call itself when the client is gone: the proxy forwards the client's
``http.disconnect`` to the replica whatever the header (proxy_asgi_receive), and Starlette's
StreamingResponse stops the stream on it (ASGI spec 2.3, as uvicorn sets it).
"""

# No `from __future__ import annotations`: api_keys.py's routes are read by FastAPI at run time.
import asyncio
import contextvars
import json
import logging
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

logger = logging.getLogger("ray.serve")

# The last event of every stream Ray's ingress ends normally. Ray's wrapper tells it by the end of a
# packet (utils.py, _openai_json_wrapper: endswith "data: [DONE]"): a generated token "[DONE]" sits
# inside a JSON event, so a substring match would take a cut after it for a whole answer.
STREAM_END = "data: [DONE]"
INTERRUPTED = (
    "The stream was interrupted: the replica generating it stopped (its engine or its node failed). "
    "The answer above is incomplete; retry the request."
)
TIMED_OUT = (
    "The request reached the endpoint's request timeout of {seconds:g} s and was ended, its answer "
    "incomplete; ask for fewer tokens to finish within it."
)

# The model calls the current request made (one task per request in Serve's replica, so one list).
_CALLS: contextvars.ContextVar[list[Any] | None] = contextvars.ContextVar("model_calls", default=None)


class RecordingHandle:
    """A model deployment's handle that keeps each call the current request makes through it."""

    def __init__(self, handle: Any) -> None:
        self._handle = handle

    def options(self, **kwargs: Any) -> "RecordingHandle":
        return RecordingHandle(self._handle.options(**kwargs))

    def __getattr__(self, method: str) -> Any:
        return _RecordingMethod(getattr(self._handle, method))


class _RecordingMethod:
    def __init__(self, method: Any) -> None:
        self._method = method

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        call = self._method.remote(*args, **kwargs)
        calls = _CALLS.get()
        if calls is not None:
            calls.append(call)
        return call


def _cancel(calls: list[Any], request_id: str, why: str) -> None:
    """What Serve's proxy does on a disconnect or its timeout (ProxyResponseGenerator: response.cancel())."""
    for call in calls:
        try:
            call.cancel()
        except Exception as err:  # a call whose replica is gone has nothing left to stop
            logger.warning("request %s: cancel failed: %s: %s", request_id, type(err).__name__, str(err)[:200])
    if calls:
        logger.info("request %s: model call cancelled: %s", request_id, why)


def _event(message: str, code: str) -> str:
    """An error event in OpenAI's shape, as OpenAI's own API sends mid-stream."""
    return (
        f"data: {json.dumps({'error': {'message': message, 'type': 'server_error', 'param': None, 'code': code}})}\n\n"
    )


class GuardedStream(StreamingResponse):
    """Ray's streamed answer, ending with an error event when it is cut (``stream_interrupted``) or
    reaches the deadline (``request_timeout``), and cancelling the model's calls whenever it ends
    before its last event: a cut, the deadline, or a client that hung up.

    A dying decode replica makes the handle raise mid-stream (ActorUnavailableError, ActorDiedError);
    Starlette can no longer change the 200 it sent and closes the body as if it had ended, so a client
    would take a cut answer for a whole one (measured in the rehearsal's node-loss phase).
    """

    def __init__(
        self, inner: StreamingResponse, *, request_id: str, deadline: float, timeout_s: float, calls: list[Any]
    ) -> None:
        self.request_id, self.deadline, self.timeout_s, self.calls = request_id, deadline, timeout_s, calls
        self.ended = False
        super().__init__(
            self._events(inner.body_iterator),
            status_code=inner.status_code,
            media_type=inner.media_type,
            background=inner.background,
        )
        self.raw_headers = inner.raw_headers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if not self.ended:
                _cancel(self.calls, self.request_id, "the stream ended before its last event")

    async def _events(self, chunks: AsyncIterable[Any]) -> AsyncIterator[Any]:
        iterator = aiter(chunks)
        try:
            while True:
                limit = asyncio.timeout_at(self.deadline)
                try:
                    async with limit:
                        chunk = await anext(iterator)
                except StopAsyncIteration:
                    break
                except TimeoutError:
                    if not limit.expired():
                        raise
                    logger.warning("stream %s ended at the request timeout (%g s)", self.request_id, self.timeout_s)
                    yield _event(TIMED_OUT.format(seconds=self.timeout_s), "request_timeout")
                    return
                text = chunk.decode(errors="replace") if isinstance(chunk, bytes) else str(chunk)
                self.ended = text.strip().endswith(STREAM_END)
                yield chunk
        except Exception as err:  # whatever ended the stream, the client must hear of it
            logger.warning("stream %s cut: %s: %s", self.request_id, type(err).__name__, str(err)[:200])
        if not self.ended:
            yield _event(INTERRUPTED, "stream_interrupted")


async def generate(
    request: Request, timeout_s: float, answer: Awaitable[Response], refuse: Callable[..., Response]
) -> Response:
    """Ray's answer to an admitted chat or completion, within timeout_s of now, whatever the client's headers."""
    calls: list[Any] = []
    _CALLS.set(calls)
    request_id = request.headers.get("x-request-id", "") or str(id(calls))
    deadline = asyncio.get_running_loop().time() + timeout_s
    limit = asyncio.timeout_at(deadline)
    try:
        async with limit:
            response = await answer
    except TimeoutError:
        if not limit.expired():
            raise
        _cancel(calls, request_id, "no first token within the request timeout")
        return refuse(408, TIMED_OUT.format(seconds=timeout_s), "server_error", "request_timeout")
    if isinstance(response, StreamingResponse):
        return GuardedStream(response, request_id=request_id, deadline=deadline, timeout_s=timeout_s, calls=calls)
    return response
