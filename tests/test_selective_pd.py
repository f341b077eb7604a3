"""Decode prefilling short prompts itself (ray_pods/selective_pd.py): the choice, the builder, the threshold.

The builder is Ray's own with the product's decode class: what it builds is compared here with what Ray's
builder builds on the same synthesized config, so that a change in Ray's builder fails here and not in a pod.
The threshold is decode's user_config, which Serve applies through `reconfigure`: two thresholds give the same
code version (Ray's get_app_code_version), so a new one restarts no replica. The runtime choice, a short prompt
moving no KV and a long one moving it, is the rehearsal's (rehearsal/selective.py).
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest
import yaml

from serve_config.deployments import LOCAL_PREFILL_KEY, PREFILL_ROUTE_HEADER, engine_deployment_name, options_of
from settings import Settings, SettingsError, settings_from, sizing
from settings.estimates import plan_table
from settings.sizing import MIN_PROMPT_TOKENS_THAT_PAY
from tests.conftest import PROJECT_CONTEXT, rayservice_from, require_serve_deps, synth

pytestmark = pytest.mark.private_internals
serve = pytest.mark.serve
one_ray = pytest.mark.xdist_group("ray")


def _app(template: dict[str, Any]) -> dict[str, Any]:
    (app,) = yaml.safe_load(rayservice_from(template)["spec"]["serveConfigV2"])["applications"]
    found: dict[str, Any] = app
    return found


def _built(builder: Any, args: dict[str, Any]) -> dict[str, Any]:
    from ray.serve._private.build_app import build_app

    return {d.name: d for d in build_app(builder(copy.deepcopy(args)), name="llm").deployments}


def _shape(deployment: Any) -> dict[str, Any]:
    """What Serve runs for a deployment besides its class: its options, its args, its actor and placement."""
    replica = deployment._replica_config
    return {
        "config": deployment._deployment_config.to_proto_bytes(),
        "args": repr(replica.init_args),
        "kwargs": sorted(replica.init_kwargs),
        "actor": replica.ray_actor_options,
        "bundles": replica.placement_group_bundles,
        "strategy": replica.placement_group_strategy,
        "class": replica.deployment_def.__name__,
    }


@serve
@one_ray
def test_the_builder_is_rays_with_the_products_two_engine_classes(template: dict[str, Any], local_ray: None) -> None:
    require_serve_deps()
    from ray._common.utils import import_attr
    from ray.llm._internal.serve.serving_patterns.prefill_decode import builder as ray_builder
    from ray.llm._internal.serve.serving_patterns.prefill_decode.pd_server import PDDecodeServer, PDPrefillServer
    from ray.serve.llm import build_pd_openai_app as rays

    from ray_pods.latency_servers import LatencyPDDecodeServer, LatencyPrefillServer  # imports ray
    from ray_pods.selective_pd import SelectivePDDecodeServer  # imports ray: make test-fast runs without it

    app = _app(template)
    ours = _built(import_attr(app["import_path"]), app["args"])
    theirs = _built(rays, app["args"])
    assert sorted(ours) == sorted(theirs)
    decode, prefill = (engine_deployment_name(Settings(), side) for side in ("decode", "prefill"))
    swapped = {decode: (LatencyPDDecodeServer, PDDecodeServer), prefill: (LatencyPrefillServer, PDPrefillServer)}
    assert issubclass(LatencyPDDecodeServer, SelectivePDDecodeServer)
    for name, (mine, its) in swapped.items():
        assert ours[name]._replica_config.deployment_def is mine and issubclass(mine, its)
        assert theirs[name]._replica_config.deployment_def is its
    # Everything else is Ray's: the same options, args, actor options and placement, the same classes elsewhere.
    for name in ours:
        mine_shape, its_shape = _shape(ours[name]), _shape(theirs[name])
        if name in swapped:
            assert (mine_shape.pop("class"), its_shape.pop("class")) == tuple(c.__name__ for c in swapped[name])
        assert mine_shape == its_shape, name
    # Ray's module is left as it was found.
    assert ray_builder.PDDecodeServer is PDDecodeServer and ray_builder.PDPrefillServer is PDPrefillServer


@serve
@one_ray
def test_two_thresholds_give_one_code_version(local_ray: None) -> None:
    require_serve_deps()
    from tools.serve_controller import code_version  # imports ray: make test-fast runs without it

    off, on = _app(synth(local_prefill_max_tokens=0)), _app(synth())
    decode = engine_deployment_name(Settings(), "decode")
    assert code_version(off) == code_version(on)
    assert options_of(off, decode)["user_config"] == {LOCAL_PREFILL_KEY: 0}
    assert options_of(on, decode)["user_config"] == {LOCAL_PREFILL_KEY: MIN_PROMPT_TOKENS_THAT_PAY}


def test_the_serve_config_the_tools_and_the_pods_use_one_key_and_one_header() -> None:
    require_serve_deps()
    from ray_pods.selective_pd import ROUTE_HEADER, THRESHOLD_KEY  # imports ray: make test-fast runs without it

    assert THRESHOLD_KEY == LOCAL_PREFILL_KEY
    assert ROUTE_HEADER == PREFILL_ROUTE_HEADER


def test_aggregated_mode_has_no_decode_user_config() -> None:
    app = _app(synth(serving_mode="aggregated"))
    assert all("user_config" not in d for d in app["deployments"])


@pytest.mark.parametrize(
    ("header", "threshold", "tokens", "expected"),
    [
        (None, 0, None, ("split", "always split")),
        (None, 4096, 4096, ("local", "short prompt")),
        (None, 4096, 4097, ("split", "long prompt")),
        # A prompt the engine could not count goes Ray's way, where the engine answers its error.
        (None, 4096, None, ("split", "always split")),
        ("split", 4096, 10, ("split", "header")),
        ("local", 0, None, ("local", "header")),
        ("sideways", 4096, 10, ("local", "short prompt")),
    ],
)
def test_the_route_of_a_request(header: str | None, threshold: int, tokens: int | None, expected: Any) -> None:
    require_serve_deps()
    from ray_pods.selective_pd import choose_route  # imports ray: make test-fast runs without it

    assert choose_route(header, threshold, tokens) == expected


def test_reconfigure_sets_the_threshold_and_a_new_replica_splits_until_then() -> None:
    require_serve_deps()
    from ray_pods.selective_pd import THRESHOLD_KEY, SelectivePDDecodeServer  # imports ray

    server = SelectivePDDecodeServer.__new__(SelectivePDDecodeServer)
    assert server._local_prefill_max_tokens == 0
    asyncio.run(server.reconfigure({THRESHOLD_KEY: 2048}))
    assert server._local_prefill_max_tokens == 2048


@pytest.mark.parametrize(
    ("overrides", "allowed"),
    [
        ({"local_prefill_max_tokens": "8193"}, "0 (split every request) to max_model_len = 8192 tokens"),
        ({"local_prefill_max_tokens": "-1"}, "0 (split every request) to max_model_len = 8192 tokens"),
        ({"local_prefill_max_tokens": "1024", "serving_mode": "aggregated"}, "0 or unset with serving_mode aggregated"),
    ],
)
def test_a_threshold_out_of_range_or_in_aggregated_mode_is_refused_in_one_line(
    overrides: dict[str, str], allowed: str
) -> None:
    with pytest.raises(SettingsError) as raised:
        settings_from({**PROJECT_CONTEXT, **overrides})
    message = str(raised.value)
    assert message.startswith("setting 'local_prefill_max_tokens'") and allowed in message and "\n" not in message


def test_the_largest_threshold_is_max_model_len() -> None:
    assert settings_from({**PROJECT_CONTEXT, "local_prefill_max_tokens": "8192"}).local_prefill_max_tokens == 8192


def test_the_default_threshold_is_the_guidance_at_most_max_model_len_and_none_when_aggregated() -> None:
    assert sizing.local_prefill_threshold(settings_from(PROJECT_CONTEXT)) == MIN_PROMPT_TOKENS_THAT_PAY
    short = settings_from({**PROJECT_CONTEXT, "max_model_len": "2048"})
    assert sizing.local_prefill_threshold(short) == 2048
    aggregated = settings_from({**PROJECT_CONTEXT, "serving_mode": "aggregated"})
    assert sizing.local_prefill_threshold(aggregated) == 0
    assert sizing.local_prefill_threshold(settings_from({**PROJECT_CONTEXT, "local_prefill_max_tokens": "0"})) == 0


def test_plan_says_which_requests_are_split_and_why() -> None:
    default = plan_table(settings_from(PROJECT_CONTEXT))
    assert (
        f"Which requests are split (local_prefill_max_tokens = {MIN_PROMPT_TOKENS_THAT_PAY}, the default: the guidance "
        f"above, splitting pays only from {MIN_PROMPT_TOKENS_THAT_PAY} tokens" in default
    )
    assert f"prompts of at most {MIN_PROMPT_TOKENS_THAT_PAY} tokens prefill on decode" in default
    split = plan_table(settings_from({**PROJECT_CONTEXT, "local_prefill_max_tokens": "0"}))
    assert "(local_prefill_max_tokens = 0, set): every one" in split
    short = plan_table(settings_from({**PROJECT_CONTEXT, "max_model_len": "2048"}))
    assert "no prompt can be longer, so none is split" in short
    assert "Which requests are split" not in plan_table(
        settings_from({**PROJECT_CONTEXT, "serving_mode": "aggregated"})
    )
