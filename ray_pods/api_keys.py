"""The product's OpenAI ingress, in every mode; with API keys, every route refuses a caller without a valid key.

Named in serveConfigV2 as ``ingress_cls_config.ingress_cls`` (Ray 2.58
``IngressClsConfig``); Ray's builder turns it into the FastAPI ingress with
``make_fastapi_ingress``, which routes the nine methods named in
``DEFAULT_ENDPOINTS`` to ``getattr(cls, name)``. Each is overridden here to check
the ``Authorization: Bearer <key>`` header first and then call Ray's own method,
so the check runs before a stream starts and no route is left open. The JSON
routes take only the Request and parse their body after the key (FastAPI would
validate it first), answering a non-JSON body, a bad one and an unknown model in
OpenAI's error shape where Ray answers 500 or FastAPI's bare ``{"detail": ...}``. Serve's proxy
answers its health paths (``/-/healthz``, ``/-/routes``) itself, before the
ingress: Kubernetes and KubeRay keep reaching them without a key. FastAPI's
``/docs`` and ``/openapi.json`` stay open; they describe the API, not the model.

The keys are a JSON object ``{"<key id>": "<key>", ...}`` in a file the pod mounts
from a Kubernetes Secret; the file is re-read whenever it changes (the kubelet
swaps a Secret volume's files atomically), so a rotation needs no restart. Keys
are compared in constant time and never logged: each request's log line names
the key id, or for a refused key the first 8 hex digits of its SHA-256.

What a client may not send, keys on or off, and what it is told of an error, is client_input.py's:
the body fields only the server sets between its engines (a 400), and the header ``x-pd-prefill``, which
overrides the prefill route on decode (ray_pods/selective_pd.py): a 403 unless the caller's key id is in
``prefill_header_keys`` (the setting pd_prefill_header_keys; with keys off nobody may send it).

Chats and completions end at the product's request timeout, and a client that hangs up stops its
generation, whatever headers it sent Serve's proxy (stream_guard.py). These hold with keys or
without: the serve config names this class whether keys are on or not, and without ``keys_file``
it admits every caller, as Ray's own ingress does (no key is read, none is asked for).
"""

# No `from __future__ import annotations`: FastAPI reads these signatures at run time.
import collections
import functools
import hashlib
import hmac
import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Form, HTTPException, Request
from pydantic import TypeAdapter, ValidationError
from ray.llm._internal.serve.core.configs.openai_api_models import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    EmbeddingRequest,
    ModelCard,
    ModelList,
    ScoreRequest,
    TokenizeCompletionRequest,
    TranscriptionRequest,
)
from ray.llm._internal.serve.core.ingress.ingress import OpenAiIngress
from starlette.responses import Response

from ray_pods.client_input import answered, engine_only_field
from ray_pods.client_input import openai_error as _error
from ray_pods.stream_guard import RecordingHandle, generate

# Serve writes this logger to the replica's own log file.
logger = logging.getLogger("ray.serve")

MIN_KEY_LENGTH = 16
WINDOW_S = 60.0
# Decode's per-request override of the prefill route (ray_pods/selective_pd.py ROUTE_HEADER; a test holds them equal).
PREFILL_ROUTE_HEADER = "x-pd-prefill"


def fingerprint(presented: str) -> str:
    """What a log may say about a key that was refused: enough to match a report, useless to a reader."""
    return "sha256:" + hashlib.sha256(presented.encode()).hexdigest()[:8]


def bearer_key(request: Request) -> str | None:
    """The key in ``Authorization: Bearer <key>`` (the header every OpenAI client sends), else None."""
    scheme, _, key = request.headers.get("authorization", "").partition(" ")
    key = key.strip()
    return key if scheme.lower() == "bearer" and key else None


class KeyFile:
    """The API keys in one JSON file, re-read when the file changes.

    A file that cannot be read, or holds no usable key, admits nobody until it
    is fixed (fail closed); the replica refuses to start on one.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self._keys: dict[str, bytes] = {}
        self.refresh()
        if not self._keys:
            raise ValueError(f"no usable API key in {path}: a JSON object of key id to key, keys of 16+ characters")

    def refresh(self) -> None:
        """Reload the keys if the file changed since the last read."""
        try:
            info = os.stat(self.path)
        except OSError as err:
            self._replace(None, {}, f"API keys file unreadable: {err.strerror}")
            return
        stamp = (info.st_ino, info.st_mtime_ns, info.st_size)
        if stamp == self._stamp:
            return
        try:
            with open(self.path, encoding="utf-8") as handle:
                loaded = json.load(handle)
        except (OSError, ValueError) as err:
            self._replace(stamp, {}, f"API keys file unreadable: {type(err).__name__}")
            return
        if not isinstance(loaded, dict):
            self._replace(stamp, {}, "API keys file is not a JSON object of key id to key")
            return
        keys = {}
        for key_id, key in loaded.items():
            if isinstance(key, str) and len(key) >= MIN_KEY_LENGTH:
                keys[str(key_id)] = key.encode()
            else:
                logger.error("API key %r ignored: not a string of %d+ characters", str(key_id), MIN_KEY_LENGTH)
        self._replace(stamp, keys, None if keys else "no usable API key in the keys file")

    def _replace(self, stamp: tuple[int, int, int] | None, keys: dict[str, bytes], problem: str | None) -> None:
        with self._lock:
            changed = stamp != self._stamp or (problem is not None and bool(self._keys))
            self._stamp, self._keys = stamp, keys
        if changed:
            if problem:
                logger.error("%s (%s): every request is refused until it is fixed", problem, self.path)
            else:
                logger.info("API keys loaded from %s: ids %s", self.path, sorted(keys))

    @property
    def usable(self) -> bool:
        return bool(self._keys)

    def identify(self, presented: str) -> str | None:
        """The id of the key presented, or None. Every key is compared, each in constant time."""
        candidate = presented.encode()
        found = None
        with self._lock:
            keys = list(self._keys.items())
        for key_id, key in keys:
            if hmac.compare_digest(candidate, key):
                found = key_id
        return found


class RateLimit:
    """At most ``per_minute`` requests per key in any 60 s, counted in this ingress replica."""

    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_minute = per_minute
        self._clock = clock
        self._seen: dict[str, collections.deque[float]] = collections.defaultdict(collections.deque)
        self._lock = threading.Lock()

    def retry_after(self, key_id: str) -> int:
        """0 if the request may go now (and count it), else the whole seconds until it may."""
        if self.per_minute <= 0:
            return 0
        now = self._clock()
        with self._lock:
            seen = self._seen[key_id]
            while seen and now - seen[0] >= WINDOW_S:
                seen.popleft()
            if len(seen) < self.per_minute:
                seen.append(now)
                return 0
            return max(1, math.ceil(WINDOW_S - (now - seen[0])))


class ApiKeyIngress(OpenAiIngress):  # type: ignore[misc]
    """OpenAiIngress with the product's request timeout and cut-stream guard, behind API keys (and an
    optional per-key rate limit) when a keys file is given.

    Args (ingress_cls_config.ingress_extra_kwargs):
        keys_file: the mounted JSON file of key id to key; None (default): no key check, every
            caller admitted.
        request_timeout_s: the product's request timeout (setting request_timeout_seconds, as
            http_options has it); every chat and completion ends there, whatever the client's
            headers (ray_pods/stream_guard.py).
        requests_per_minute: per key and per ingress replica; 0 (default) for no limit. Only with
            keys_file (it is counted per key).
        prefill_header_keys: the key ids whose requests may send ``x-pd-prefill`` (setting
            pd_prefill_header_keys); every other request with it is refused. Only with keys_file.
        code_digest: the digest of this package as the stack shipped it; unused
            here, it makes a code change a serve config change.
    """

    def __init__(
        self,
        llm_deployments: Any,
        model_cards: Any,
        *,
        keys_file: str | None = None,
        request_timeout_s: float,
        requests_per_minute: int = 0,
        prefill_header_keys: list[str] | None = None,
        code_digest: str = "",
        **kwargs: Any,
    ) -> None:
        if keys_file is None and requests_per_minute:
            raise ValueError("requests_per_minute needs keys_file: the limit is counted per key")
        if keys_file is None and prefill_header_keys:
            raise ValueError("prefill_header_keys needs keys_file: the header is allowed per key")
        super().__init__(llm_deployments, model_cards, **kwargs)
        self._header_keys = frozenset(prefill_header_keys or ())
        self._keys = None if keys_file is None else KeyFile(keys_file)
        self._limit = RateLimit(requests_per_minute)
        self._timeout_s = request_timeout_s
        if self._keys is None:
            logger.info("API key check off, every caller admitted (code %s from %s)", code_digest, __file__)
            return
        limit = requests_per_minute or "no limit"
        logger.info("API key check on (code %s from %s, %s requests/min per key)", code_digest, __file__, limit)

    def _refusal(self, request: Request) -> Response | None:
        """None to admit the request; else the response that refuses it: a key (with keys), then the route
        header (only from the keys allowed it)."""
        key_id, refusal = self._caller(request)
        if refusal is None and PREFILL_ROUTE_HEADER in request.headers and key_id not in self._header_keys:
            logger.info(
                "refused %s %s: %s from key id %s", request.method, request.url.path, PREFILL_ROUTE_HEADER, key_id
            )
            return _error(
                403,
                f"This key may not send the {PREFILL_ROUTE_HEADER} header.",
                "invalid_request_error",
                "header_not_allowed",
                param=PREFILL_ROUTE_HEADER,
            )
        return refusal

    def _caller(self, request: Request) -> tuple[str | None, Response | None]:
        """(the caller's key id, None) to admit the request (no key id with keys off); else (None, the refusal).
        Logs who called (with keys)."""
        if self._keys is None:
            return None, None
        self._keys.refresh()
        where = f"{request.method} {request.url.path}"
        if not self._keys.usable:
            logger.warning("refused %s: no usable API keys", where)
            return None, _error(503, "The server's API keys are unavailable.", "server_error", "keys_unavailable")
        presented = bearer_key(request)
        key_id = None if presented is None else self._keys.identify(presented)
        if key_id is None:
            why = "no key" if presented is None else f"unknown key {fingerprint(presented)}"
            logger.info("refused %s: %s", where, why)
            return None, _error(
                401,
                "Missing or invalid API key. Send it as 'Authorization: Bearer <key>'.",
                "invalid_request_error",
                "invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )
        wait = self._limit.retry_after(key_id)
        if wait:
            logger.info("rate-limited %s: key id %s", where, key_id)
            return None, _error(
                429,
                f"Rate limit of {self._limit.per_minute} requests per minute reached for this key.",
                "requests",
                "rate_limit_exceeded",
                headers={"Retry-After": str(wait)},
            )
        logger.info("admitted %s: key id %s", where, key_id)
        return key_id, None

    async def _admitted_body(self, request: Request, model: Any) -> tuple[Any, Response | None]:
        """(body, None) for an admitted, well-formed request; (None, the refusal) otherwise.

        The key is checked before the body is read. The body is parsed here rather than
        by FastAPI: Ray 2.58's handler for FastAPI's validation errors puts the raw body
        into its JSON answer, so a body that is not JSON (a wrong content type) became a
        500 (the CPU rehearsal's bad-requests phase found it).
        """
        refusal = self._refusal(request)
        if refusal is not None:
            return None, refusal
        content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if content_type != "application/json":
            return None, _error(
                415,
                "Send the body as JSON, with 'Content-Type: application/json'.",
                "invalid_request_error",
                "unsupported_media_type",
            )
        try:
            body = _adapter(model).validate_json(await request.body())
        except ValidationError as err:
            errors = err.errors()
            where = ".".join(str(part) for part in errors[0]["loc"]) if errors else "body"
            message = f"Invalid request: {errors[0]['msg'] if errors else 'not a valid request'} at {where or 'body'}"
            return None, _error(400, message, "invalid_request_error", "invalid_parameter")
        field = engine_only_field(body)
        if field is not None:
            logger.info("refused %s %s: it sets %s", request.method, request.url.path, field)
            return None, _error(
                400,
                f"Invalid request: {field} is set by the server, not by a client.",
                "invalid_request_error",
                "invalid_parameter",
                param=field,
            )
        return body, await self._unknown_model(getattr(body, "model", None))

    def _get_configured_serve_handle(self, model_id: str) -> RecordingHandle:
        """Ray's handle to the model, keeping each call a request makes so an early end can cancel it."""
        return RecordingHandle(super()._get_configured_serve_handle(model_id))

    async def _unknown_model(self, model: str | None) -> Response | None:
        """OpenAI's answer for a model this endpoint does not serve (Ray's is FastAPI's bare {"detail": ...})."""
        try:
            await self._get_model_id(model)
        except HTTPException as err:
            return _error(err.status_code, str(err.detail), "invalid_request_error", "model_not_found")
        return None

    # The nine routes of Ray 2.58's DEFAULT_ENDPOINTS. The JSON routes take only the
    # Request and parse their body after the key check; the model listings add the
    # Request to Ray's parameters; transcriptions keep FastAPI's form parsing.
    async def models(self, request: Request) -> ModelList | Response:
        return self._refusal(request) or await answered(super().models())

    async def model_data(self, model: str, request: Request) -> ModelCard | Response:
        return self._refusal(request) or await answered(super().model_data(model))

    async def completions(self, request: Request) -> Response:
        body, refusal = await self._admitted_body(request, CompletionRequest)
        return refusal or await generate(request, self._timeout_s, answered(super().completions(body, request)), _error)

    async def chat(self, request: Request) -> Response:
        body, refusal = await self._admitted_body(request, ChatCompletionRequest)
        return refusal or await generate(request, self._timeout_s, answered(super().chat(body, request)), _error)

    async def embeddings(self, request: Request) -> Response:
        body, refusal = await self._admitted_body(request, EmbeddingRequest)
        return refusal or await answered(super().embeddings(body, request))

    async def transcriptions(self, body: Annotated[TranscriptionRequest, Form()], request: Request) -> Response:
        refusal = self._refusal(request) or await self._unknown_model(body.model)
        return refusal or await answered(super().transcriptions(body, request))

    async def score(self, request: Request) -> Response:
        body, refusal = await self._admitted_body(request, ScoreRequest)
        return refusal or await answered(super().score(body, request))

    async def tokenize(self, request: Request) -> Response:
        body, refusal = await self._admitted_body(request, TokenizeCompletionRequest)
        return refusal or await answered(super().tokenize(body, request))

    async def detokenize(self, request: Request) -> Response:
        body, refusal = await self._admitted_body(request, DetokenizeRequest)
        return refusal or await answered(super().detokenize(body, request))


@functools.cache
def _adapter(model: Any) -> TypeAdapter[Any]:
    """One validator per request type (EmbeddingRequest is a Union, so a TypeAdapter, not model_validate)."""
    return TypeAdapter(model)
