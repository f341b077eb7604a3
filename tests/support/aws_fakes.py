"""A boto3 Session stand-in for offline tests: real botocore clients, answered without a network.

Each client is the real botocore client for its service: botocore validates every
request against the service model, and every answer here is validated against the
operation's output shape with the validator botocore's Stubber uses. Unlike the
Stubber's queue, answers are keyed by operation, so a test states the account
("this AZ does not offer g6.8xlarge"), not the order of calls.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import botocore.session
from botocore.awsrequest import AWSResponse
from botocore.exceptions import ParamValidationError
from botocore.validate import validate_parameters

Answer = dict[str, Any] | Callable[[dict[str, Any], str], dict[str, Any]]
_BOTOCORE = botocore.session.get_session()


class FakeAwsMisuseError(BaseException):
    """A test's own mistake (no answer, an answer AWS could not give).

    A BaseException, so that preflight's guard, which turns any Exception of a check
    into that check's FAIL line, cannot hide it: the test errors instead.
    """


def client_error(code: str, message: str = "", status: int = 400) -> dict[str, Any]:
    """An answer that makes botocore raise ClientError, as AWS would."""
    return {"Error": {"Code": code, "Message": message or code}, "ResponseMetadata": {"HTTPStatusCode": status}}


class FakeAws:
    """`session.client(service, region_name=...)` as boto3 has it; answers from `answers[(service, operation)]`.

    An answer is a response dict, or a function of (the call's parameters, region).
    Every call is recorded in `calls` as (service, operation, region, parameters).
    """

    def __init__(self, answers: dict[tuple[str, str], Answer], region_name: str | None = "us-east-1") -> None:
        self.answers = answers
        self.region_name = region_name
        self.calls: list[tuple[str, str, str, dict[str, Any]]] = []

    def client(self, service_name: str, region_name: str | None = None) -> Any:
        region = region_name or self.region_name or "us-east-1"
        client = _BOTOCORE.create_client(
            service_name, region_name=region, aws_access_key_id="testing", aws_secret_access_key="testing"
        )
        pending: dict[str, Any] = {}

        def remember(params: dict[str, Any], model: Any, **_: Any) -> None:
            pending["params"] = copy.deepcopy(params)

        def answer(model: Any, **_: Any) -> tuple[AWSResponse, dict[str, Any]]:
            params = pending.pop("params", {})
            self.calls.append((service_name, model.name, region, params))
            key = (service_name, model.name)
            if key not in self.answers:
                raise FakeAwsMisuseError(f"the test gave no answer for {service_name} {model.name}")
            found = self.answers[key]
            response = found(params, region) if callable(found) else copy.deepcopy(found)
            if "Error" in response:
                status = response.get("ResponseMetadata", {}).get("HTTPStatusCode", 400)
                return AWSResponse(None, status, {}, None), response
            if model.output_shape is not None:
                try:
                    validate_parameters(response, model.output_shape)
                except ParamValidationError as err:
                    raise FakeAwsMisuseError(f"{service_name} {model.name}: not an answer AWS gives: {err}") from None
            return AWSResponse(None, 200, {}, None), response

        client.meta.events.register("before-parameter-build", remember)
        client.meta.events.register("before-call", answer)
        return client

    def actions(self) -> set[str]:
        """The IAM actions of every call made so far."""
        # An IAM action's prefix is the service's signing name (servicequotas for service-quotas).
        return {f"{_BOTOCORE.get_service_model(s).signing_name}:{op}" for s, op, *_ in self.calls}
