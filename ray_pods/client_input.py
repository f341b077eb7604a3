"""What a client may not send to the product's ingress, and what it is told of an error.

The body fields only the server sets between its engines (``kv_transfer_params``, ``ec_transfer_params``, and the
same names in ``vllm_xargs``): on decode's local path they reach the engine, which would pin KV blocks for a remote
reader or pull KV from any address the client names, so the ingress answers them with a 400. An error Ray's handler
raises reaches the client in OpenAI's shape with the handler's own message for a 4xx and a fixed one for a 5xx: Ray's
own answer to an exception puts the exception's text, with the replica's actor id, pid and node IP, in the body.
"""

import logging
from collections.abc import Awaitable
from typing import Any

from fastapi import HTTPException
from ray.llm._internal.serve.core.configs.openai_api_models import OpenAIHTTPException
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError
from starlette.responses import JSONResponse, Response

# Serve writes this logger to the replica's own log file.
logger = logging.getLogger("ray.serve")

# Body fields vLLM reads as KV-transfer instructions (its protocol's to_sampling_params copies them, and any
# vllm_xargs, into the engine's extra_args; v1/request.py reads these keys there). Only the server sets them.
ENGINE_ONLY_FIELDS = ("kv_transfer_params", "ec_transfer_params")
ENGINE_ONLY_XARGS = (*ENGINE_ONLY_FIELDS, "kv_cache_report_mode")
SERVER_ERROR = "The server had an error while processing the request; retry it."


def openai_error(
    status: int,
    message: str,
    error_type: str,
    code: str,
    headers: dict[str, str] | None = None,
    param: str | None = None,
) -> Response:
    """An error in OpenAI's own shape, which every OpenAI client parses."""
    body = {"error": {"message": message, "type": error_type, "param": param, "code": code}}
    return JSONResponse(status_code=status, content=body, headers=headers)


def client_error(err: Exception) -> Response:
    """What a client sees of an exception from Ray's handler: the handler's message for a 4xx it meant (an
    HTTPException, Ray's OpenAIHTTPException made from the engine's error), a fixed message otherwise. Ray's own
    answer (utils/server_utils.py, get_response_for_error) adds the exception's text, which names the replica's
    actor, pid and node IP; that goes to this replica's log only."""
    status = int(getattr(err, "status_code", 500) or 500)
    if isinstance(err, HTTPException):
        message = str(err.detail)
    elif isinstance(err, OpenAIHTTPException):
        message = str(err.message)
    else:
        message = ""
    if 400 <= status < 500 and message:
        return openai_error(status, message, "invalid_request_error", "invalid_request")
    logger.error("request failed: %s: %s", type(err).__name__, str(err)[:500])
    return openai_error(status if 500 <= status < 600 else 500, SERVER_ERROR, "server_error", "internal_error")


async def answered(answer: Awaitable[Any]) -> Any:
    """Ray's answer, or the client's view of the exception it raised (client_error). Serve's own answers to its
    queue bounds (BackPressureError: a 503 with Retry-After) and to a deployment it cannot reach are left to the
    handlers Serve adds to the ingress app for them (replica.py, service_unavailable_exceptions)."""
    try:
        return await answer
    except (BackPressureError, DeploymentUnavailableError):
        raise
    except Exception as err:
        return client_error(err)


def engine_only_field(body: Any) -> str | None:
    """The first field of a request body that only the server may set, or None."""
    for name in ENGINE_ONLY_FIELDS:
        if getattr(body, name, None) is not None:
            return name
    xargs = getattr(body, "vllm_xargs", None) or {}
    return next((f"vllm_xargs.{name}" for name in ENGINE_ONLY_XARGS if name in xargs), None)
