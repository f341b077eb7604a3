"""The stream batching interval: set on purpose, accepted by Ray, and the value Ray's server reads."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from serve_config import application
from settings import Settings
from tests.conftest import require_serve_deps

pytestmark = pytest.mark.private_internals

serve = pytest.mark.serve


def _interval_ray_uses(llm_config: dict[str, Any]) -> float:
    """What Ray 2.58's LLMServer streams with, for this LLMConfig (its own method, on its own model)."""
    from ray.llm._internal.serve.core.server.llm_server import LLMServer
    from ray.serve.llm import LLMConfig

    config = LLMConfig.model_validate(llm_config)
    interval: float = LLMServer._get_batch_interval_ms(SimpleNamespace(_llm_config=config))
    return interval


@serve
def test_decode_and_aggregated_stream_at_the_chosen_interval() -> None:
    """LLMConfig accepts any experimental key, so a misspelled one validates: the test asks Ray's
    own server for the interval it would use, which differs from Ray's 50 ms default."""
    require_serve_deps()
    from ray.llm._internal.serve.constants import MODEL_RESPONSE_BATCH_TIMEOUT_MS

    chosen = application.application_data()["sides"]["decode"]["experimental_configs"]["stream_batching_interval_ms"]
    assert chosen != MODEL_RESPONSE_BATCH_TIMEOUT_MS
    pd = application.serve_config(Settings())["applications"][0]["args"]
    assert _interval_ray_uses(pd["decode_config"]) == chosen
    aggregated = application.serve_config(Settings(serving_mode="aggregated"))["applications"][0]["args"]
    assert _interval_ray_uses(aggregated["llm_configs"][0]) == chosen


@serve
@pytest.mark.xdist_group("ray")  # the one Ray of a worker: a second would run beside the Ray tests' own clusters
def test_build_pd_openai_app_accepts_the_interval(local_ray: None) -> None:
    from ray.serve._private.build_app import build_app
    from ray.serve.llm import build_pd_openai_app

    args = application.serve_config(Settings())["applications"][0]["args"]
    built = build_app(build_pd_openai_app(args), name="llm")
    assert len(built.deployments) == 3
