"""Scale a side to a latency target: the autoscaling policies Serve's controller calls for prefill and decode.

A side with a latency target names one of these functions as its deployment's `autoscaling_config.policy`
(`PREFILL_POLICY`, `DECODE_POLICY`); the other side, and every side without a target, keeps Serve's default
ongoing-requests policy. Replicas report counts through `record_autoscaling_stats` (ray_pods/latency_stats.py):
requests finished in their recent window, how many of them were over the target, the fraction the percentile
allows over it, and on decode the KV cache's use and the prompts decode prefilled itself.

Why one policy per deployment and not Serve's application-level policy (Ray 2.58):
- The schema still calls the application-level policy "under development and not yet supported"
  (serve/schema.py, ServeApplicationSchema.autoscaling_policy), though autoscaling_state.py implements it.
- An application-level policy takes over every autoscaling deployment of the application
  (autoscaling_state.py, ApplicationAutoscalingState.register_deployment: "The application-level policy will
  take precedence"): it would have to reimplement Serve's default for a side without a target, and for the
  ingress. Per deployment, the opt-in is per side and the default stays Serve's own code.
- Nothing here needs the other side: each side judges its own reports, and decode's local prefills are
  reported by decode.

How Serve calls it (serve/_private/autoscaling_state.py, DeploymentAutoscalingState): `register` wraps the
function in `_apply_autoscaling_config` (serve/autoscaling_policy.py), which applies the cold start from 0,
the scaling factors, `upscale_delay_s` / `downscale_delay_s` and, through `apply_bounds`, min/max and target
capacity. `get_decision_num_replicas` calls it every control-loop step (0.1 s) with an `AutoscalingContext`
(serve/config.py); it returns `(replicas, policy_state)` and gets that state back next call as
`ctx.policy_state`. None of that is rebuilt here: the functions return a wish, Serve delays and bounds it.
`ctx.aggregated_metrics` maps each reported name to {replica: value}, each value one replica's reports averaged
over `look_back_period_s` (`_get_aggregated_custom_metrics`, time-weighted with the default aggregation
function). So replicas report counts, and the policy sums them: a mean of percentiles is not a percentile,
while the sum of slow requests over the sum of requests is the fleet's fraction over the target.

It must never raise. Serve does not catch a policy's exception: it leaves `ApplicationStateManager.update`
(application_state.py) at `app.autoscale()`, so this application's update and every later one's are skipped
on every control-loop step until the exception stops (serve/_private/controller.py logs it each time). Any
error here keeps the side where it is and logs the cause once each time it changes.

The decision, per side:
- up by one when the reported fraction over the target is above the allowed fraction (1 - percentile/100)
  and at least `MIN_SLOW_REQUESTS` requests were slow: one or two slow requests at low traffic (a cold cache, a
  long prompt) are an outlier, not a percentile, and a GPU replica is too dear to add for one;
- decode also up by one when its KV cache is `KV_FULL` used or more (mean over replicas: each replica's use is a
  fraction of the same capacity, so the mean is the fleet's use), whatever its latency says: a full cache
  queues or preempts requests before the latency shows it;
- down by one when well under: below `UNDER_SHARE` of the allowed fraction, or no request at all (none
  finished, none in flight, no local prefill), and on decode only if the KV cache would stay under `KV_FULL`
  on one replica fewer;
- otherwise hold.
"Over" and "well under" are apart on purpose: between half the allowed fraction and the allowed fraction the
side holds, so a load at the target, whose fraction wanders around the allowed one, does not flip the decision
every period; Serve's delays then ask that a wish last `upscale_delay_s` (30 s) or `downscale_delay_s` (600 s)
before it is acted on, so the "for longer" of a scale-down is Serve's own. The band alone cannot stop a
steady load from cycling when one replica more moves the fraction from over the allowed to under half of it
(latency grows steeply near saturation): so a scale-up records the load (requests finished plus local
prefills, per window) at which that many replicas breached, and the side goes back down to that count only
when the load is under `BREACH_LOAD_SHARE` of it. At a steady load that breached with n replicas, n+1 hold. The
record lives in the policy state, which Serve starts afresh when the deployment's config changes (a new target
is one: user_config is part of it, and `register` resets the state) and when its controller restarts: each
costs at most one more cycle. A workload that later gets lighter per request keeps that one replica until its
rate drops.

Decisions are relative to Serve's target, not the running count: holding returns `ctx.target_num_replicas`
(a wish equal to the target is Serve's "do nothing", which resets its delay counters); up asks for one more
than is running but never less than the target, so while a replica it asked for is still starting a breach
does not pile up more; down asks for one less than the target. Returning the running count while a replica
starts would read to Serve as a wish to scale down, and after `downscale_delay_s` cancel the replica. Serve's
`upscaling_factor` multiplies the difference from the running count (`_apply_scaling_factors`); the product
leaves it at 1.

Each decision's reason is in the returned policy state (`STATE_REASON`, a sentence; `STATE_CODE`, one of
`REASONS`), is logged when the code changes, and is exported as the gauge `DECISION_METRIC`
(`ray_pd_latency_autoscaling_decision{deployment, application, reason}` once Ray's exporter prefixes it): 1 for
the current reason, 0 for the others. Serve exports the wish (`serve_autoscaling_desired_replicas`), not why.

The controller loads these functions by value (Serve cloudpickles the module, serve/config.py
AutoscalingPolicy.serialize_policy), so a change here lands with a redeploy of the app, not on a running one.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ray.util.metrics import Gauge

# Standard library alone behind these names: Serve's controller, which runs this, has no engine. Cloudpickle
# copies the strings into the policy it ships to the controller.
from ray_pods.latency_stats import ALLOWED_OVER_FRACTION, KV_CACHE_USAGE, LOCAL_PREFILLS, OVER_TARGET, REQUESTS

if TYPE_CHECKING:
    from ray.serve.config import AutoscalingContext

# Serve's own logger: in the controller it goes to the controller's log, beside Serve's scaling lines.
logger = logging.getLogger("ray.serve")

PREFILL_POLICY = "ray_pods.latency_autoscaling:prefill_latency_policy"
DECODE_POLICY = "ray_pods.latency_autoscaling:decode_latency_policy"

# Decode's KV cache use at which decode scales up whatever its latency says. vLLM starts preempting requests
# when it cannot allocate blocks; at 90 % a burst of long prompts is close to that.
KV_FULL = 0.9
# "Well under": the fraction over the target is below this share of the allowed fraction.
UNDER_SHARE = 0.5
# The fewest slow requests (summed over replicas) that make a breach.
MIN_SLOW_REQUESTS = 3.0
# Back down to a replica count that breached only when the load is below this share of the breaching load.
BREACH_LOAD_SHARE = 0.8

# Keys of the returned policy state (Serve keeps its own "__decision_*" keys beside them).
STATE_CODE = "latency_decision"
STATE_REASON = "latency_reason"
STATE_ERROR = "latency_error"
STATE_BREACH_LOADS = "latency_breach_loads"
STATE_EXPORTED = "latency_exported"

# Reason codes: a fixed set, so the gauge's reason tag stays a few series.
UP_OVER = "over_target"
UP_KV = "kv_full"
DOWN_UNDER = "well_under"
DOWN_IDLE = "idle"
HOLD_BAND = "in_band"
HOLD_KV = "held_kv"
HOLD_BREACH_LOAD = "held_breach_load"
HOLD_IN_FLIGHT = "in_flight"
HOLD_NO_STATS = "no_stats"
HOLD_ERROR = "error"
REASONS = (
    UP_OVER,
    UP_KV,
    DOWN_UNDER,
    DOWN_IDLE,
    HOLD_BAND,
    HOLD_KV,
    HOLD_BREACH_LOAD,
    HOLD_IN_FLIGHT,
    HOLD_NO_STATS,
    HOLD_ERROR,
)

DECISION_METRIC = "pd_latency_autoscaling_decision"

PolicyResult = tuple[int, dict[str, Any]]


def prefill_latency_policy(ctx: AutoscalingContext) -> PolicyResult:
    """Prefill's replicas for its time-to-first-token target."""
    return _decide_safely(ctx, decode=False)


def decode_latency_policy(ctx: AutoscalingContext) -> PolicyResult:
    """Decode's replicas for its inter-token-latency target and its KV cache."""
    return _decide_safely(ctx, decode=True)


def _decide_safely(ctx: AutoscalingContext, *, decode: bool) -> PolicyResult:
    try:
        state = dict(ctx.policy_state)
        replicas, code, reason = _decide(ctx, state, decode=decode)
        state[STATE_ERROR] = None
        _note(ctx, state, replicas, code, reason)
    except Exception as err:  # a raising policy stalls Serve's controller loop (module docstring)
        return _hold_on_error(ctx, err)
    return replicas, state


def _decide(ctx: AutoscalingContext, state: dict[str, Any], *, decode: bool) -> tuple[int, str, str]:
    target = int(ctx.target_num_replicas)
    running = int(ctx.current_num_replicas)
    metrics = ctx.aggregated_metrics or {}
    requests_by_replica = _values(metrics, REQUESTS)
    over_by_replica = _values(metrics, OVER_TARGET)
    allowed_by_replica = _values(metrics, ALLOWED_OVER_FRACTION)
    # Only replicas that reported all three: one that has not reported yet (still starting) counts for nothing.
    reporting = [r for r in requests_by_replica if r in over_by_replica and r in allowed_by_replica]
    requests = sum(requests_by_replica[r] for r in reporting)
    over = sum(over_by_replica[r] for r in reporting)
    local_prefills = sum(_values(metrics, LOCAL_PREFILLS).values()) if decode else 0.0
    kv_by_replica = _values(metrics, KV_CACHE_USAGE) if decode else {}
    kv = sum(kv_by_replica.values()) / len(kv_by_replica) if kv_by_replica else None
    # A local prefill is decode's work on top of the request it serves: it counts twice in the load.
    load = requests + local_prefills
    up = max(target, running + 1)
    down = max(0, target - 1)
    breach_loads: dict[str, float] = dict(state.get(STATE_BREACH_LOADS) or {})

    if kv is not None and kv >= KV_FULL:
        breach_loads[str(running)] = load
        state[STATE_BREACH_LOADS] = breach_loads
        return up, UP_KV, f"KV cache {kv:.0%} used (scale-up at {KV_FULL:.0%}), load {load:.1f} on {running}"
    if not reporting:
        return target, HOLD_NO_STATS, f"no latency counts from any of {running} running replicas yet"
    # The strictest while replicas disagree: only during a change of user_config, which reaches them one by one.
    allowed = min(allowed_by_replica[r] for r in reporting)
    seen = f"{over:.1f} of {requests:.1f} requests over the target"
    if requests > 0:
        seen += f" ({over / requests:.1%}, allowed {allowed:.1%})"
    seen += f", {len(reporting)} of {running} replicas reporting"
    if requests > 0 and over >= MIN_SLOW_REQUESTS and over / requests > allowed:
        breach_loads[str(running)] = load
        state[STATE_BREACH_LOADS] = breach_loads
        return up, UP_OVER, seen
    if requests <= 0:
        # Long streams can outlast the window: nothing finished is not nothing running.
        ongoing = ctx.total_num_requests
        if ongoing > 0 or local_prefills > 0:
            return (
                target,
                HOLD_IN_FLIGHT,
                f"no request finished in the window; {ongoing:.1f} in flight, {local_prefills:.1f} local prefills",
            )
        code, why = DOWN_IDLE, "no requests"
    elif over / requests < UNDER_SHARE * allowed:
        code, why = DOWN_UNDER, f"{seen}: under {UNDER_SHARE:.0%} of the allowed fraction"
    else:
        return target, HOLD_BAND, f"{seen}: between {UNDER_SHARE:.0%} of the allowed fraction and all of it"
    # On one replica fewer the same KV lands on running - 1 replicas.
    if kv is not None and kv * running > KV_FULL * (running - 1):
        return target, HOLD_KV, f"{why}, but KV cache {kv:.0%} used would pass {KV_FULL:.0%} on one replica fewer"
    breached = breach_loads.get(str(down))
    if breached is not None and load >= BREACH_LOAD_SHARE * breached:
        return (
            target,
            HOLD_BREACH_LOAD,
            f"{why}, but {down} replicas breached at load {breached:.1f} and the load is {load:.1f}"
            f" (back down under {BREACH_LOAD_SHARE * breached:.1f})",
        )
    return down, code, why


def _values(metrics: Mapping[str, Mapping[Any, float]], name: str) -> dict[Any, float]:
    """One reported name's {replica: value}; a value that is not a finite number >= 0 is an error."""
    values = dict(metrics.get(name) or {})
    for replica, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ValueError(f"replica {replica} reported {name}={value!r}, not a finite number >= 0")
    return values


def _hold_on_error(ctx: AutoscalingContext, err: Exception) -> PolicyResult:
    cause = f"{type(err).__name__}: {err}"
    replicas = _hold(ctx)
    try:
        state = dict(ctx.policy_state)
    except Exception:  # the state itself may be what is broken
        state = {}
    try:
        if state.get(STATE_ERROR) != cause:
            logger.warning(
                "Latency autoscaling of %s keeps %d replicas: %s",
                _name(ctx),
                replicas,
                cause,
                exc_info=(type(err), err, err.__traceback__),
            )
        state[STATE_ERROR] = cause
        _note(ctx, state, replicas, HOLD_ERROR, f"error, keeping {replicas} replicas: {cause}")
    except Exception:  # noqa: S110 - logging must not be the thing that raises
        pass
    return replicas, state


def _hold(ctx: AutoscalingContext) -> int:
    """Where the side is: Serve's target, or what runs if even that cannot be read."""
    for attribute in ("target_num_replicas", "current_num_replicas"):
        try:
            return int(getattr(ctx, attribute))
        except Exception:  # noqa: S112 - try the next
            continue
    # Serve's own bounds (apply_bounds) lift this to min_replicas.
    return 0


def _name(ctx: AutoscalingContext) -> str:
    try:
        return f"{ctx.app_name}/{ctx.deployment_name}"
    except Exception:
        return "a deployment"


def _note(ctx: AutoscalingContext, state: dict[str, Any], replicas: int, code: str, reason: str) -> None:
    """Put the reason in the state; log and export it when the code changes."""
    previous = state.get(STATE_CODE)
    state[STATE_CODE] = code
    state[STATE_REASON] = reason
    if code != previous:
        logger.info("Latency autoscaling of %s: %s -> %d replicas (%s)", _name(ctx), code, replicas, reason)
    if state.get(STATE_EXPORTED) != code:
        try:
            _export(ctx, code)
            state[STATE_EXPORTED] = code
        except Exception as err:  # a metric must not stop a decision
            logger.debug("Latency autoscaling could not export its decision: %s", err)


_GAUGE: list[Gauge] = []


def _export(ctx: AutoscalingContext, code: str) -> None:
    if not _GAUGE:
        _GAUGE.append(
            Gauge(
                DECISION_METRIC,
                description="Why the latency autoscaling policy made its last decision: 1 for that reason.",
                tag_keys=("deployment", "application", "reason"),
            )
        )
    tags = {"deployment": ctx.deployment_name, "application": ctx.app_name or ""}
    # All the others to 0, also any an earlier deployment of the app left at 1: reasons change rarely.
    for reason in REASONS:
        if reason != code:
            _GAUGE[0].set(0, tags={**tags, "reason": reason})
    _GAUGE[0].set(1, tags={**tags, "reason": code})
