"""A side's latency target: what its replicas count and report to Serve (ray_pods/latency_stats.py,
ray_pods/latency_servers.py), and how the serve config carries it (serve_config/deployments.py).

The servers run here with Ray 2.58's own request path around them (LLMServer.chat, the product's
SelectivePDDecodeServer and Ray's PDOrchestratorMixin for a split); a stand-in stands only for the engine, which
answers after a delay or streams with a gap, and for prefill's handle. The serve config is the synthesized one,
parsed by Serve's own ServeDeploySchema, and its code version is Serve's own get_app_code_version.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from ray_pods.latency_stats import (
    ALLOWED_OVER_FRACTION,
    KV_CACHE_USAGE,
    LOCAL_PREFILLS,
    OVER_TARGET,
    REQUESTS,
    REQUESTS_METRIC,
    TARGET_MS_KEY,
    TARGET_PERCENTILE_KEY,
    WINDOW_S,
    SlidingCount,
    target_of,
)
from serve_config.deployments import (
    LATENCY_POLICIES,
    LATENCY_TARGET_MS_KEY,
    LATENCY_TARGET_PERCENTILE_KEY,
    LOCAL_PREFILL_KEY,
    engine_deployment_name,
    options_of,
)
from settings import Settings
from tests.conftest import rayservice_from, require_serve_deps, synth
from tests.support.recording_counter import RecordingCounter

pytestmark = pytest.mark.private_internals
MODEL = "Qwen/Qwen3-8B"
# Both sides with a range, each scaling to a latency target above its floor (settings/rules/latency.py).
TARGETS = {
    "prefill_max_replicas": 2,
    "decode_max_replicas": 2,
    "prefill_ttft_target_ms": 2000,
    "decode_itl_target_ms": 150,
}
# The same ranges scaling on ongoing requests, as before.
RANGES = {
    "prefill_max_replicas": 2,
    "decode_max_replicas": 2,
    "prefill_target_ongoing_requests": 2,
    "decode_target_ongoing_requests": 8,
}


def _app(template: dict[str, Any]) -> dict[str, Any]:
    (app,) = yaml.safe_load(rayservice_from(template)["spec"]["serveConfigV2"])["applications"]
    found: dict[str, Any] = app
    return found


def _options(app: dict[str, Any], side: str) -> dict[str, Any]:
    return options_of(app, engine_deployment_name(Settings(), side))


# The window.


def test_the_window_counts_the_last_seconds_only() -> None:

    window = SlidingCount()
    for at in (0.0, 1.0, 2.0):
        window.add(at)
    assert window.count(2.0) == 3
    assert window.count(WINDOW_S + 0.5) == 2, "the one at 0 s left the window"
    assert window.count(WINDOW_S + 2.0) == 0
    window.add(100.0)
    assert window.count(100.0) == 1
    # No shorter than Serve's interval between two reports, min(look_back_period_s x 0.2, metrics_interval_s), 6 s
    # by its defaults: a request finishing between two reports would be in neither.
    require_serve_deps()
    from ray.serve.config import AutoscalingConfig  # imports ray: make test-fast runs without it

    defaults = AutoscalingConfig()
    assert min(defaults.look_back_period_s * 0.2, defaults.metrics_interval_s) <= WINDOW_S


# The servers.


class StandInEngine:
    """An engine that answers whole after `delay_s` (prefill's one-token answer) or streams `tokens` strings
    `gap_s` apart, then vLLM's end line."""

    def __init__(self) -> None:
        self.delay_s = 0.0
        self.gap_s = 0.0
        self.tokens = 6

    async def chat(self, request: Any, raw_request_info: Any = None) -> AsyncIterator[Any]:
        if not request.stream:
            await asyncio.sleep(self.delay_s)
            yield SimpleNamespace(kv_transfer_params={"remote_block_ids": [1]})
            return
        for token in range(self.tokens):
            if token:
                await asyncio.sleep(self.gap_s)
            yield f'data: {{"token": {token}}}\n\n'
        yield "data: [DONE]\n\n"


class StandInPrefill:
    """Prefill's deployment handle, answering a split at once."""

    def options(self, **_: Any) -> StandInPrefill:
        return self

    def __getattr__(self, method: str) -> Any:
        async def answer() -> AsyncIterator[Any]:
            yield SimpleNamespace(kv_transfer_params={"do_remote_prefill": True, "remote_block_ids": [1]})

        return SimpleNamespace(remote=lambda request, raw_request_info=None: answer())


@pytest.fixture
def servers(monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    """(prefill, decode) as Serve makes them, with stand-in engines."""
    require_serve_deps()
    from ray.llm._internal.serve.engines.vllm.kv_transfer.nixl import NixlConnectorBackend

    from ray_pods import latency_servers, selective_pd  # imports ray

    RecordingCounter.made = []
    monkeypatch.setattr(latency_servers, "Counter", RecordingCounter)
    monkeypatch.setattr(selective_pd, "Counter", RecordingCounter)
    config = SimpleNamespace(
        kv_connector_backend=NixlConnectorBackend(SimpleNamespace()),
        experimental_configs={"stream_batching_interval_ms": 10},
        lora_config=None,
    )
    prefill = latency_servers.LatencyPrefillServer.__new__(latency_servers.LatencyPrefillServer)
    decode = latency_servers.LatencyPDDecodeServer.__new__(latency_servers.LatencyPDDecodeServer)
    for server in (prefill, decode):
        server.engine = StandInEngine()
        server._llm_config = config
    decode._prefill_handle = StandInPrefill()
    return prefill, decode


def _chat(*, stream: bool) -> Any:
    from ray.llm._internal.serve.core.configs.openai_api_models import ChatCompletionRequest

    return ChatCompletionRequest(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=8, stream=stream)


async def _prefill_once(prefill: Any, delay_s: float) -> list[Any]:
    prefill.engine.delay_s = delay_s
    return [chunk async for chunk in await prefill.chat(_chat(stream=False))]


async def _decode_once(decode: Any, gap_s: float, route: str) -> list[Any]:
    from ray.llm._internal.serve.core.protocol import RawRequestInfo

    from ray_pods.selective_pd import ROUTE_HEADER  # imports ray

    decode.engine.gap_s = gap_s
    info = RawRequestInfo(headers={ROUTE_HEADER: route})
    return [chunk async for chunk in await decode.chat(_chat(stream=True), info)]


def test_reconfigure_twice_changes_the_targets_and_keeps_decodes_threshold(servers: tuple[Any, Any]) -> None:

    prefill, decode = servers

    async def run() -> None:
        await prefill.reconfigure({TARGET_MS_KEY: 2000, TARGET_PERCENTILE_KEY: 90})
        await decode.reconfigure({LOCAL_PREFILL_KEY: 4096, TARGET_MS_KEY: 150, TARGET_PERCENTILE_KEY: 90})
        assert (prefill._target_ms, decode._target_ms, decode._local_prefill_max_tokens) == (2000, 150, 4096)
        assert (await prefill.record_autoscaling_stats())[ALLOWED_OVER_FRACTION] == pytest.approx(0.10)
        await prefill.reconfigure({TARGET_MS_KEY: 1500, TARGET_PERCENTILE_KEY: 99})
        await decode.reconfigure({LOCAL_PREFILL_KEY: 2048, TARGET_MS_KEY: 90, TARGET_PERCENTILE_KEY: 95})
        assert (prefill._target_ms, decode._target_ms, decode._local_prefill_max_tokens) == (1500, 90, 2048)
        assert (await prefill.record_autoscaling_stats())[ALLOWED_OVER_FRACTION] == pytest.approx(0.01)
        assert (await decode.record_autoscaling_stats())[ALLOWED_OVER_FRACTION] == pytest.approx(0.05)
        # The target taken off: decode keeps its threshold, and neither reports anything.
        await decode.reconfigure({LOCAL_PREFILL_KEY: 2048})
        assert decode._target_ms is None and decode._local_prefill_max_tokens == 2048
        assert await decode.record_autoscaling_stats() == {}

    asyncio.run(run())


def test_a_target_out_of_range_is_refused_by_reconfigure() -> None:

    assert target_of(None) is None and target_of({LOCAL_PREFILL_KEY: 4096}) is None
    for bad in ({TARGET_MS_KEY: 100}, {TARGET_MS_KEY: 100, TARGET_PERCENTILE_KEY: 100}, {TARGET_MS_KEY: 0}):
        with pytest.raises(ValueError, match=TARGET_MS_KEY):
            target_of(bad)


def test_prefill_reports_its_requests_and_those_over_the_target(servers: tuple[Any, Any]) -> None:

    prefill, _ = servers

    async def run() -> dict[str, float]:
        # No target: Ray's stream as it was, nothing timed, nothing reported.
        assert len(await _prefill_once(prefill, 0.0)) == 1
        assert await prefill.record_autoscaling_stats() == {}
        await prefill.reconfigure({TARGET_MS_KEY: 200, TARGET_PERCENTILE_KEY: 90})
        for delay_s in (0.0, 0.0, 0.3):
            (answer,) = await _prefill_once(prefill, delay_s)
            assert answer.kv_transfer_params, "the response goes on to decode unchanged"
        return dict(await prefill.record_autoscaling_stats())

    stats = asyncio.run(run())
    assert stats == {REQUESTS: 3.0, OVER_TARGET: 1.0, ALLOWED_OVER_FRACTION: pytest.approx(0.1)}
    assert all(isinstance(v, float) for v in stats.values()), "Serve takes ints or floats only"
    (counter,) = [c for c in RecordingCounter.made if c["name"] == REQUESTS_METRIC]
    assert [t["over_target"] for t in counter["tags"]] == ["no", "no", "yes"]
    assert {t["side"] for t in counter["tags"]} == {"prefill"}


def test_decode_reports_each_streams_gaps_its_own_prefills_and_its_kv_cache(servers: tuple[Any, Any]) -> None:
    from vllm.v1.metrics.loggers import StatLoggerManager
    from vllm.v1.metrics.stats import SchedulerStats

    from ray_pods.selective_pd import LOCAL, SPLIT  # imports ray

    _, decode = servers
    manager = SimpleNamespace(stat_loggers=[])
    decode.engine._engine_client = SimpleNamespace(logger_manager=manager)

    async def run() -> dict[str, float]:
        await decode.reconfigure({LOCAL_PREFILL_KEY: 4096, TARGET_MS_KEY: 100, TARGET_PERCENTILE_KEY: 90})
        assert KV_CACHE_USAGE not in await decode.record_autoscaling_stats(), "unknown until the engine steps"
        # vLLM's own manager hands each step's scheduler stats to every logger in its list.
        StatLoggerManager.record(manager, scheduler_stats=SchedulerStats(kv_cache_usage=0.42), iteration_stats=None)
        fast = await _decode_once(decode, 0.0, LOCAL)
        await _decode_once(decode, 0.2, SPLIT)
        assert sum(len(chunk) for chunk in fast) == decode.engine.tokens + 1, "every string reaches the client"
        return dict(await decode.record_autoscaling_stats())

    stats = asyncio.run(run())
    assert stats[REQUESTS] == 2.0 and stats[OVER_TARGET] == 1.0
    assert stats[LOCAL_PREFILLS] == 1.0
    assert stats[KV_CACHE_USAGE] == pytest.approx(0.42)


def test_decode_without_a_target_streams_as_before_and_reports_nothing(servers: tuple[Any, Any]) -> None:
    from ray_pods.selective_pd import LOCAL  # imports ray

    _, decode = servers

    async def run() -> None:
        await decode.reconfigure({LOCAL_PREFILL_KEY: 4096})
        await _decode_once(decode, 0.0, LOCAL)
        assert await decode.record_autoscaling_stats() == {}

    asyncio.run(run())
    assert not [c for c in RecordingCounter.made if c["name"] == REQUESTS_METRIC]


# The serve config.


def test_the_serve_config_the_policy_and_the_pods_use_one_set_of_names() -> None:
    require_serve_deps()
    from ray_pods import latency_autoscaling, latency_stats  # imports ray

    assert latency_stats.TARGET_MS_KEY == LATENCY_TARGET_MS_KEY
    assert latency_stats.TARGET_PERCENTILE_KEY == LATENCY_TARGET_PERCENTILE_KEY
    assert LATENCY_POLICIES == {
        "prefill": latency_autoscaling.PREFILL_POLICY,
        "decode": latency_autoscaling.DECODE_POLICY,
    }
    # What the replicas report is what the policy reads.
    for name in ("REQUESTS", "OVER_TARGET", "ALLOWED_OVER_FRACTION", "LOCAL_PREFILLS", "KV_CACHE_USAGE"):
        assert getattr(latency_autoscaling, name) == getattr(latency_stats, name), name


def test_a_target_puts_the_policy_in_autoscaling_and_the_target_in_user_config_and_none_is_as_before() -> None:
    with_targets, ranges_only = _app(synth(**TARGETS)), _app(synth(**RANGES))
    for side, ms_key in (("prefill", "prefill_ttft_target_ms"), ("decode", "decode_itl_target_ms")):
        options = _options(with_targets, side)
        policy = {"policy_function": LATENCY_POLICIES[side], "policy_kwargs": {}}
        assert options["autoscaling_config"]["policy"] == policy
        assert options["user_config"][LATENCY_TARGET_MS_KEY] == TARGETS[ms_key]
        assert options["user_config"][LATENCY_TARGET_PERCENTILE_KEY] == 90, "the default percentile"
        before = _options(ranges_only, side)
        assert "policy" not in before["autoscaling_config"]
        assert LATENCY_TARGET_MS_KEY not in (before.get("user_config") or {})
    # Decode keeps its threshold beside the target; prefill has a user_config only with a target.
    assert LOCAL_PREFILL_KEY in _options(with_targets, "decode")["user_config"]
    assert "user_config" not in _options(ranges_only, "prefill")


def test_a_new_target_is_the_same_code_version_and_serve_parses_the_config() -> None:
    require_serve_deps()
    from ray.serve.schema import ServeDeploySchema  # imports ray

    from tools.serve_controller import code_version  # imports ray

    with_targets = _app(synth(**TARGETS))
    tighter = _app(synth(**{**TARGETS, "decode_itl_target_ms": 120, "prefill_ttft_target_percentile": 95}))
    assert _options(with_targets, "decode")["user_config"] != _options(tighter, "decode")["user_config"]
    assert code_version(with_targets) == code_version(tighter), "a new target restarts no replica"
    # Turning a target on changes the policy, which Serve counts in the code version: a restart, once.
    assert code_version(_app(synth(**RANGES))) != code_version(with_targets)
    (app,) = ServeDeploySchema.model_validate({"applications": [with_targets]}).applications
    parsed = {d.name: d for d in app.deployments}
    for side in ("prefill", "decode"):
        deployment = parsed[engine_deployment_name(Settings(), side)]
        assert deployment.autoscaling_config["policy"]["policy_function"] == LATENCY_POLICIES[side]


@pytest.mark.serve
@pytest.mark.xdist_group("ray")
def test_serve_runs_each_side_with_a_target_on_a_class_that_takes_its_user_config(local_ray: None) -> None:
    """What Serve's controller runs (the builder's deployments with the config's `deployments` applied): a
    user_config on a class without `reconfigure` fails every replica (serve/_private/replica.py, call_reconfigure)."""
    require_serve_deps()
    from tools.serve_controller import deployment_infos  # imports ray

    infos = deployment_infos(_app(synth(**TARGETS)))
    for side in ("prefill", "decode"):
        info = infos[engine_deployment_name(Settings(), side)]
        assert info.deployment_config.user_config[LATENCY_TARGET_MS_KEY] > 0
        deployment_class = info.replica_config.deployment_def
        assert callable(deployment_class.reconfigure) and callable(deployment_class.record_autoscaling_stats)
        assert info.deployment_config.autoscaling_config.policy.policy_function == LATENCY_POLICIES[side]


@pytest.mark.serve
@pytest.mark.xdist_group("ray")
def test_a_real_serve_replica_reports_and_the_side_scales_up_on_slow_prefills(local_ray: None) -> None:
    """Serve itself, end to end: the product's prefill class (a stand-in engine behind Ray's LLMServer) gets its
    target through user_config, Serve calls its record_autoscaling_stats, and the policy the serve config names
    scales the side up when its prefills are slow."""
    require_serve_deps()
    import time

    from ray import serve  # imports ray
    from ray.llm._internal.serve.core.configs.openai_api_models import ChatCompletionRequest  # imports ray
    from ray.serve.llm import LLMConfig  # imports ray

    from ray_pods.latency_servers import LatencyPrefillServer  # imports ray

    class SlowEngine:
        """A prefill engine that answers after 300 ms, over the 100 ms target."""

        def __init__(self, llm_config: Any) -> None:
            pass

        async def start(self) -> None:
            pass

        async def check_health(self) -> None:
            pass

        async def shutdown(self) -> None:
            pass

        async def chat(self, request: Any, raw_request_info: Any = None) -> AsyncIterator[Any]:
            await asyncio.sleep(0.3)
            yield {"kv_transfer_params": {"remote_block_ids": [1]}}

    name = "Prefill:latency-test"
    deployment = serve.deployment(LatencyPrefillServer).options(
        name=name,
        ray_actor_options={"num_cpus": 0},
        max_ongoing_requests=16,
        user_config={TARGET_MS_KEY: 100, TARGET_PERCENTILE_KEY: 90},
        autoscaling_config={
            "min_replicas": 1,
            "max_replicas": 2,
            "upscale_delay_s": 0,
            "metrics_interval_s": 0.5,
            "look_back_period_s": 2,
            "policy": {"policy_function": LATENCY_POLICIES["prefill"], "policy_kwargs": {}},
        },
    )
    config = LLMConfig(model_loading_config={"model_id": "latency-test"})
    handle = serve.run(deployment.bind(config, engine_cls=SlowEngine), name="latency-test", route_prefix=None)
    request = ChatCompletionRequest(model="latency-test", messages=[{"role": "user", "content": "hi"}], max_tokens=1)

    async def slow_prefills() -> None:
        async def one() -> None:
            async for _ in handle.options(stream=True).chat.remote(request):
                pass

        await asyncio.gather(*(one() for _ in range(8)))

    try:
        running = 0
        deadline = time.monotonic() + 90
        while running < 2 and time.monotonic() < deadline:
            asyncio.run(slow_prefills())
            status = serve.status().applications["latency-test"].deployments[name]
            running = status.replica_states.get("RUNNING", 0)
        assert running == 2, f"the side did not scale up on slow prefills: {status}"
    finally:
        # Serve whole, not the app: a Serve left running keeps its proxy's port, and the next test's serve.start
        # with its own http_options would be ignored.
        serve.shutdown()
