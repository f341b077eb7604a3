"""Serve's options for each deployment of the app: replicas or autoscaling, queue bounds, drains.

They go in the application's `deployments` list, Serve's own override of the options a builder
set in code (ServeApplicationSchema.deployments), not in the builder's `args`: Serve hashes an
application's args into the code version of every one of its deployments (Ray 2.58
serve/_private/deploy_utils.py, get_app_code_version), and a changed code version restarts every
replica of the app. Every option here is one Serve applies to running replicas in place
(serve/_private/config.py, DeploymentOptionUpdateType LightWeight, NeedsReconfigure or
NeedsActorReconfigure): a `cdk deploy` that changes a bound restarts nothing. Serve refuses an
override that names a deployment the builder did not make, so a wrong name fails the deploy loudly.

The numbers come from settings/sizing/.
"""

from __future__ import annotations

from typing import Any

from serve_config import DECODE, PREFILL, data_file
from serve_config.endpoint_keys import API_KEY_INGRESS
from settings import Settings, sizing

# The key of decode's user_config that ray_pods/selective_pd.py reads (THRESHOLD_KEY there; a test keeps them equal).
LOCAL_PREFILL_KEY = "local_prefill_max_tokens"
# A request's override of that choice, `split` or `local` (ROUTE_HEADER there; the same test).
PREFILL_ROUTE_HEADER = "x-pd-prefill"
# A side's latency target in its user_config, and the policy that scales on what its replicas report
# (ray_pods/latency_stats.py TARGET_MS_KEY and TARGET_PERCENTILE_KEY, ray_pods/latency_autoscaling.py PREFILL_POLICY
# and DECODE_POLICY; a test keeps them equal).
LATENCY_TARGET_MS_KEY = "latency_target_ms"
LATENCY_TARGET_PERCENTILE_KEY = "latency_target_percentile"
LATENCY_POLICIES = {
    PREFILL: "ray_pods.latency_autoscaling:prefill_latency_policy",
    DECODE: "ray_pods.latency_autoscaling:decode_latency_policy",
}
# The product's prefix-aware router (ray_pods/prefix_routing.py), by import path: Serve imports it where the config
# is applied and pickles it to every caller of the deployment (serve/config.py, RequestRouterConfig).
PREFIX_ROUTER = "ray_pods.prefix_routing:PrefixAffinityRouter"
# Past a deployment's queue bound Serve answers this (503 or 429, serve/config.py BackpressureConfig);
# 429 is the key rate limit's (ray_pods/api_keys.py): 503 says the service, not the caller, is full.
BACKPRESSURE_STATUS = 503
# The deployment name prefix Ray LLM gives each engine deployment: build_pd_openai_app names its sides
# (serving_patterns/prefill_decode/builder.py), build_openai_app takes the server class's name
# (core/server/builder.py, build_llm_deployment).
NAME_PREFIXES = {PREFILL: "Prefill:", DECODE: "Decode:", "aggregated": "LLMServer:"}


def engine_deployment_name(settings: Settings, side: str) -> str:
    """The name Ray LLM gives a side's engine deployment for the settings' model."""
    return deployment_name_of(settings.model_id, side)


def deployment_name_of(model_id: str, side: str) -> str:
    """The name Ray LLM gives an engine deployment: its prefix and the model id with '/' as '--' and '.' as '_'
    (core/server/builder.py, _get_deployment_name)."""
    return NAME_PREFIXES[side] + model_id.replace("/", "--").replace(".", "_")


def ingress_deployment_name(settings: Settings) -> str:
    """The ingress deployment's name: its class's (make_fastapi_ingress keeps it), the product's in every
    mode (serve_config/endpoint_keys.py, ingress_cls_config)."""
    return API_KEY_INGRESS.rsplit(":", 1)[1]


def engines(settings: Settings) -> tuple[str, ...]:
    """The engine deployments of the serving mode: prefill and decode, or the aggregated one."""
    return sizing.engine_sides(settings)


def _bounds(settings: Settings, side: str) -> tuple[int, int, float | None]:
    """(minimum, maximum, target) of a side, or of aggregated mode's one deployment: the sides summed,
    scaling toward decode's target (prefill's when only prefill has a range). Under replica_surge the
    minimum is one more where there is room (settings/sizing/upgrade.py, surge_minimum)."""
    _, high = sizing.engine_bounds(settings, side)
    if side != "aggregated":
        target = settings.side_target_ongoing_requests(side)
    else:
        target = settings.decode_target_ongoing_requests or settings.prefill_target_ongoing_requests
    return sizing.surge_minimum(settings, side), high, target


def _queue_bounds(settings: Settings, *, ongoing: int, queued: int) -> dict[str, Any]:
    return {
        "max_ongoing_requests": ongoing,
        "max_queued_requests": queued,
        "backpressure_config": {
            "status_code": BACKPRESSURE_STATUS,
            "retry_after_s": settings.backpressure_retry_after_seconds,
        },
    }


def engine_options(settings: Settings, side: str) -> dict[str, Any]:
    """Serve's options for one engine deployment ('prefill', 'decode' or 'aggregated').

    Either a fixed num_replicas (with autoscaling_config null) or an autoscaling_config (with
    num_replicas null), always both keys: Ray LLM deep-merges its own autoscaling_config
    (target_ongoing_requests 1e9, which never scales) into a deployment built without
    num_replicas (ray/llm/_internal/common/dict_utils.py), and Serve applies an override on top of
    the options in force (application_state.py, override_deployment_info), so the key left out
    would keep whatever was there before: a range turned off would go on scaling.
    """
    low, high, target = _bounds(settings, side)
    options: dict[str, Any]
    # A range stays a range under the surge, its minimum at its maximum: Serve hashes whether a deployment
    # has an autoscaling_config into the app's code version (deploy_utils.py, deployment_autoscaling_policies),
    # so a surge as a fixed num_replicas would restart every replica again when the minimum comes back down.
    if sizing.surge_room(settings, side):
        options = {
            "num_replicas": None,
            "autoscaling_config": {"min_replicas": low, "max_replicas": high, "target_ongoing_requests": target},
        }
    else:
        options = {"num_replicas": low, "autoscaling_config": None}
    options.update(
        _queue_bounds(
            settings,
            ongoing=sizing.max_ongoing_requests(settings, side),
            queued=sizing.max_queued_requests(settings, side),
        )
    )
    wait, timeout = sizing.graceful_shutdown(settings, side)
    if side == PREFILL:
        options["graceful_shutdown_wait_loop_s"] = wait
    if settings.prefix_cache_routing and side in (PREFILL, DECODE) and high > 1:
        # A router in Serve's code version (deploy_utils.py, get_app_code_version hashes request_router_configs):
        # switching it restarts every replica of the app, once.
        options["request_router_config"] = {
            "request_router_class": PREFIX_ROUTER,
            "request_router_kwargs": sizing.prefix_router_kwargs(settings, side),
        }
    if side == DECODE:
        # Which requests decode prefills itself (ray_pods/selective_pd.py): Serve hands a user_config to the
        # running replicas' reconfigure (NeedsReconfigure), so a new threshold restarts no engine.
        options["user_config"] = {LOCAL_PREFILL_KEY: sizing.local_prefill_threshold(settings)}
    _scale_on_latency(settings, side, options)
    options["graceful_shutdown_timeout_s"] = timeout
    return options


def _scale_on_latency(settings: Settings, side: str, options: dict[str, Any]) -> None:
    """A side with a latency target: the policy in its autoscaling_config, the target in its user_config.

    The policy is in Serve's code version (deploy_utils.py, get_app_code_version hashes each deployment's
    autoscaling_config.policy): turning a target on or off restarts every replica of the app, once. So the policy
    and its kwargs are the same for every target, and the target travels in the user_config, which Serve hands the
    running replicas' reconfigure (ray_pods/latency_servers.py): a new target or percentile restarts nothing. The
    settings allow a target only on a side with a range (settings/rules/latency.py), so an autoscaling_config."""
    target = settings.side_latency_target(side) if side in LATENCY_POLICIES else None
    if target is None or options["autoscaling_config"] is None:
        return
    ms, percentile = target
    # Serve calls a plain function's policy without its kwargs (serve/config.py, AutoscalingPolicy).
    options["autoscaling_config"]["policy"] = {"policy_function": LATENCY_POLICIES[side], "policy_kwargs": {}}
    # No ongoing-requests target: a null one fails Serve's controller as it applies the config (application_state.py,
    # override_deployment_info compares max_ongoing_requests with it); left out, Serve's default stands, unused.
    options["autoscaling_config"].pop("target_ongoing_requests", None)
    options["user_config"] = {
        **(options.get("user_config") or {}),
        LATENCY_TARGET_MS_KEY: ms,
        LATENCY_TARGET_PERCENTILE_KEY: percentile,
    }


def _client_facing(settings: Settings) -> str:
    """The engines the ingress calls: decode, or the aggregated ones."""
    return "aggregated" if settings.serving_mode == "aggregated" else DECODE


def ingress_replicas() -> int:
    """The ingress's replicas outside a surge: the builder's args (pd_application.yaml)."""
    replicas: int = data_file("pd_application.yaml")["ingress"]["deployment_config"]["num_replicas"]
    return replicas


def ingress_surge_replicas(settings: Settings) -> int:
    """The ingress's replicas: one more under `replica_surge`. Serve 2.58 stops an outdated replica before it
    starts its replacement unless the target stands above the replicas running (deployment_state.py, the rolling
    update), and a change that restarts the engines changes the args, so the ingress's code version too."""
    return ingress_replicas() + (sizing.ingress_surge_room(settings) if settings.replica_surge else 0)


def ingress_options(settings: Settings) -> dict[str, Any]:
    """The ingress's replicas, queue bounds and drain: it passes on everything the engines behind it can hold or
    queue, so the bound a burst meets is theirs (settings/sizing/admission.py, ingress_max_ongoing_requests). Its
    home is structural and stays in the builder's args (pd_application.yaml). Its count is here too, so that
    `replica_surge` raises it in place by one (ingress_surge_replicas) and lowers it again
    without a restart: num_replicas is not in Serve's code version."""
    options: dict[str, Any] = {"num_replicas": ingress_surge_replicas(settings)}
    options |= _queue_bounds(
        settings,
        ongoing=sizing.ingress_max_ongoing_requests(settings),
        queued=sizing.max_queued_requests(settings, _client_facing(settings)),
    )
    options["graceful_shutdown_timeout_s"] = sizing.graceful_shutdown(settings, "ingress")[1]
    return options


def serve_deployments(settings: Settings) -> list[dict[str, Any]]:
    """The application's `deployments` list: each engine deployment's options, then the ingress's."""
    found = [
        {"name": engine_deployment_name(settings, side), **engine_options(settings, side)} for side in engines(settings)
    ]
    found.append({"name": ingress_deployment_name(settings), **ingress_options(settings)})
    return found


def options_of(app: dict[str, Any], name: str) -> dict[str, Any]:
    """One deployment's entry in an application's `deployments` list, by name."""
    (entry,) = [d for d in app.get("deployments", []) if d["name"] == name]
    return dict(entry)
