"""The latency-target policy (ray_pods/latency_autoscaling.py) on Ray 2.58's own autoscaling objects.

Each context is Ray's `AutoscalingContext` with the per-replica values Serve's controller builds from what
replicas report; runs over several decision periods go through Serve's own wrapper (`_apply_autoscaling_config`:
factors, delays), and one test through Serve's `DeploymentAutoscalingState` itself: the policy cloudpickled by
value as Serve loads it, replicas' reports time-averaged by Serve, min/max applied by Serve.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import pytest

from ray_pods import latency_stats as ls
from tests.conftest import require_serve_deps

pytestmark = pytest.mark.private_internals

APP = "pd"
ALLOWED = 0.1  # a p90 target


@pytest.fixture(autouse=True)
def _serve() -> None:
    require_serve_deps()


def _dep(decode: bool) -> Any:
    from ray.serve._private.common import DeploymentID

    return DeploymentID(name="DecodeServer" if decode else "PrefillServer", app_name=APP)


def _replica(i: int, decode: bool = True) -> Any:
    from ray.serve._private.common import ReplicaID

    return ReplicaID(unique_id=f"r{i}", deployment_id=_dep(decode))


def _report(*rows: dict[str, float], decode: bool = True) -> dict[str, dict[Any, float]]:
    """aggregated_metrics as Serve builds it: {name: {replica: that replica's value}}, one row a replica."""
    metrics: dict[str, dict[Any, float]] = {}
    for i, row in enumerate(rows):
        for name, value in row.items():
            metrics.setdefault(name, {})[_replica(i, decode)] = value
    return metrics


def _row(requests: float, over: float, *, kv: float | None = None, local: float | None = None) -> dict[str, float]:
    """One replica's report, under the names the replicas use (ray_pods/latency_stats.py)."""
    row = {ls.REQUESTS: requests, ls.OVER_TARGET: over, ls.ALLOWED_OVER_FRACTION: ALLOWED}
    if kv is not None:
        row[ls.KV_CACHE_USAGE] = kv
    if local is not None:
        row[ls.LOCAL_PREFILLS] = local
    return row


def _config(**overrides: Any) -> Any:
    from ray.serve.config import AutoscalingConfig

    # No delays unless a test asks: whatever holds then is the policy's own doing.
    return AutoscalingConfig(
        **{"min_replicas": 1, "max_replicas": 8, "upscale_delay_s": 0, "downscale_delay_s": 0, **overrides}
    )


def _ctx(
    metrics: Any,
    *,
    running: int,
    target: int | None = None,
    state: dict[str, Any] | None = None,
    ongoing: float = 0.0,
    decode: bool = True,
    config: Any = None,
) -> Any:
    from ray.serve.config import AutoscalingContext

    return AutoscalingContext(
        deployment_id=_dep(decode),
        deployment_name=_dep(decode).name,
        app_name=APP,
        current_num_replicas=running,
        target_num_replicas=running if target is None else target,
        running_replicas=[_replica(i, decode) for i in range(running)],
        total_num_requests=ongoing,
        total_queued_requests=0.0,
        aggregated_metrics=metrics,
        raw_metrics=None,
        capacity_adjusted_min_replicas=1,
        capacity_adjusted_max_replicas=8,
        policy_state=state or {},
        last_scale_up_time=None,
        last_scale_down_time=None,
        current_time=time.time(),
        config=config or _config(),
        total_pending_async_requests=0,
    )


def _policy(decode: bool = True) -> Callable[[Any], tuple[int, dict[str, Any]]]:
    from ray_pods import latency_autoscaling as la  # imports ray

    return la.decode_latency_policy if decode else la.prefill_latency_policy


def _wrapped(decode: bool = True) -> Callable[[Any], tuple[int, dict[str, Any]]]:
    """The policy as Serve's DeploymentAutoscalingState.register wraps it."""
    from ray.serve.autoscaling_policy import _apply_autoscaling_config

    wrapped: Callable[[Any], tuple[int, dict[str, Any]]] = _apply_autoscaling_config(_policy(decode))
    return wrapped


def _run(load: Callable[[int], list[dict[str, float]]], *, replicas: int, periods: int, **ctx: Any) -> list[int]:
    """Decision periods through Serve's wrapper; a replica it asks for runs at once. The replica count per period."""
    policy, seen = _wrapped(), []
    state: dict[str, Any] = {}
    for _ in range(periods):
        replicas, state = policy(_ctx(_report(*load(replicas)), running=replicas, state=state, **ctx))
        seen.append(replicas)
    return seen


@pytest.mark.parametrize("decode", [True, False])
def test_a_breach_scales_the_side_up(decode: bool) -> None:
    from ray_pods import latency_autoscaling as la  # imports ray

    # 16 % of requests over the target where 10 % may be.
    metrics = _report(_row(50, 8), _row(50, 8), decode=decode)
    replicas, state = _policy(decode)(_ctx(metrics, running=2, decode=decode))
    assert (replicas, state[la.STATE_CODE]) == (3, la.UP_OVER)
    assert "16.0 of 100.0 requests over the target (16.0%, allowed 10.0%)" in state[la.STATE_REASON]
    assert _wrapped(decode)(_ctx(metrics, running=2, decode=decode))[0] == 3


def test_replicas_counts_are_summed_not_their_fractions_averaged() -> None:
    from ray_pods import latency_autoscaling as la  # imports ray

    # One busy replica at 5 % over, one quiet one at 50 %: the mean of the two fractions (27.5 %) says breach,
    # the fleet's fraction (10 of 110, 9.1 %) says in band.
    replicas, state = _policy()(_ctx(_report(_row(100, 5), _row(10, 5)), running=2))
    assert (replicas, state[la.STATE_CODE]) == (2, la.HOLD_BAND)


def test_one_or_two_slow_requests_are_not_a_breach() -> None:
    from ray_pods import latency_autoscaling as la  # imports ray

    replicas, state = _policy()(_ctx(_report(_row(4, 2)), running=1))
    assert (replicas, state[la.STATE_CODE]) == (1, la.HOLD_BAND)
    assert _policy()(_ctx(_report(_row(6, 3)), running=1))[0] == 2


def test_a_quiet_period_scales_down_by_one() -> None:
    from ray_pods import latency_autoscaling as la  # imports ray

    replicas, state = _policy()(_ctx(_report(_row(100, 1), _row(100, 2), _row(100, 1)), running=3))
    assert (replicas, state[la.STATE_CODE]) == (2, la.DOWN_UNDER)
    replicas, state = _policy()(_ctx(_report(_row(0, 0), _row(0, 0)), running=2))
    assert (replicas, state[la.STATE_CODE]) == (1, la.DOWN_IDLE)


def test_serves_downscale_delay_gives_the_longer_wait() -> None:
    from ray_pods import latency_autoscaling as la  # imports ray

    policy, state = _wrapped(), dict[str, Any]()
    quiet = _report(_row(100, 0), _row(100, 0))
    config = _config(downscale_delay_s=0.3)
    replicas, state = policy(_ctx(quiet, running=2, state=state, config=config))
    assert (replicas, state[la.STATE_CODE]) == (2, la.DOWN_UNDER), "the policy wants down, Serve's delay holds"
    time.sleep(0.35)
    assert policy(_ctx(quiet, running=2, state=state, config=config))[0] == 1


def test_a_steady_load_at_the_target_holds() -> None:
    from ray_pods import latency_autoscaling as la  # imports ray

    def hold(wander: list[float], config: Any) -> tuple[set[int], set[str]]:
        policy, state, seen, codes = _wrapped(), dict[str, Any](), set(), set()
        replicas = 2
        for period in range(30):
            row = _row(40, 40 * wander[period % len(wander)])
            replicas, state = policy(_ctx(_report(row, row), running=replicas, state=state, config=config))
            seen.add(replicas)
            codes.add(state[la.STATE_CODE])
        return seen, codes

    # Between half the allowed 10 % and all of it: the policy's own band holds, with no delay from Serve.
    assert hold([0.06, 0.09, 0.07, 0.095, 0.055, 0.08], _config()) == ({2}, {la.HOLD_BAND})
    # A load at the target also goes over it now and then, for a period: Serve's upscale delay absorbs that,
    # since a period back in the band resets it.
    seen, codes = hold([0.06, 0.09, 0.12, 0.08, 0.055, 0.11, 0.07], _config(upscale_delay_s=5))
    assert seen == {2} and codes == {la.HOLD_BAND, la.UP_OVER}


def test_a_steady_load_that_breached_does_not_cycle() -> None:
    from ray_pods import latency_autoscaling as la  # imports ray

    # 120 requests per window: two replicas are 15 % over the target, three are 1 % over. The band alone would
    # go 2, 3, 2, 3: one replica fewer breached at this very load, so three stay.
    fraction = {2: 0.15, 3: 0.01}

    def load(n: int) -> list[dict[str, float]]:
        return [_row(120 / n, 120 / n * fraction.get(n, 0.01))] * n

    seen = _run(load, replicas=2, periods=40)
    assert seen == [3] * 40
    # The load falls to half: back to two.
    state: dict[str, Any] = {la.STATE_BREACH_LOADS: {"2": 120.0}}
    replicas, state = _policy()(_ctx(_report(*[_row(20, 0)] * 3), running=3, state=state))
    assert (replicas, state[la.STATE_CODE]) == (2, la.DOWN_UNDER)


def test_held_by_the_breaching_load_says_so() -> None:
    from ray_pods import latency_autoscaling as la  # imports ray

    state: dict[str, Any] = {la.STATE_BREACH_LOADS: {"2": 120.0}}
    replicas, state = _policy()(_ctx(_report(*[_row(40, 0)] * 3), running=3, state=state))
    assert (replicas, state[la.STATE_CODE]) == (3, la.HOLD_BREACH_LOAD)
    assert "2 replicas breached at load 120.0 and the load is 120.0" in state[la.STATE_REASON]


def test_decode_kv_near_full_scales_up_with_latency_fine() -> None:
    from ray_pods import latency_autoscaling as la  # imports ray

    metrics = _report(_row(100, 0, kv=0.93), _row(100, 0, kv=0.91))
    replicas, state = _policy()(_ctx(metrics, running=2))
    assert (replicas, state[la.STATE_CODE]) == (3, la.UP_KV)
    assert _wrapped()(_ctx(metrics, running=2))[0] == 3


def test_decode_does_not_scale_down_into_a_full_kv_cache() -> None:
    from ray_pods import latency_autoscaling as la  # imports ray

    # Latency well under, but 60 % of two caches is 120 % of one.
    replicas, state = _policy()(_ctx(_report(_row(100, 0, kv=0.6), _row(100, 0, kv=0.6)), running=2))
    assert (replicas, state[la.STATE_CODE]) == (2, la.HOLD_KV)
    assert _policy()(_ctx(_report(_row(100, 0, kv=0.4), _row(100, 0, kv=0.4)), running=2))[0] == 1


def test_local_prefills_count_as_decodes_load() -> None:
    from ray_pods import latency_autoscaling as la  # imports ray

    # Two decode replicas breached at 50 requests per window. Now 35 requests, 20 of them prefilled on decode:
    # a load of 55, past 80 % of 50, so three stay; the same requests all split would be 35 and go down.
    state = {la.STATE_BREACH_LOADS: {"2": 50.0}}
    rows = [_row(35 / 3, 0, local=20 / 3)] * 3
    replicas, out = _policy()(_ctx(_report(*rows), running=3, state=state))
    assert (replicas, out[la.STATE_CODE]) == (3, la.HOLD_BREACH_LOAD)
    assert _policy()(_ctx(_report(*[_row(35 / 3, 0, local=0)] * 3), running=3, state=state))[0] == 2
    # Prefills decode did itself while no request finished yet: decode is busy, not idle.
    replicas, out = _policy()(_ctx(_report(_row(0, 0, local=3)), running=2))
    assert (replicas, out[la.STATE_CODE]) == (2, la.HOLD_IN_FLIGHT)


def test_long_streams_that_finish_nothing_in_the_window_are_not_idle() -> None:
    from ray_pods import latency_autoscaling as la  # imports ray

    replicas, state = _policy()(_ctx(_report(_row(0, 0), _row(0, 0)), running=2, ongoing=6.0))
    assert (replicas, state[la.STATE_CODE]) == (2, la.HOLD_IN_FLIGHT)


def test_a_replica_still_starting_is_neither_cancelled_nor_piled_on() -> None:
    from ray_pods import latency_autoscaling as la  # imports ray

    # Serve's target is 3, two run: the breach that asked for the third still shows.
    breach = _report(_row(50, 8), _row(50, 8))
    assert _policy()(_ctx(breach, running=2, target=3))[0] == 3
    band = _report(_row(50, 4), _row(50, 4))
    replicas, state = _policy()(_ctx(band, running=2, target=3))
    assert (replicas, state[la.STATE_CODE]) == (3, la.HOLD_BAND)
    # Through Serve's wrapper with its default delays, held for good: a wish below the target would cancel it.
    config = _config(downscale_delay_s=0.2, upscale_delay_s=0.2)
    policy, state = _wrapped(), dict[str, Any]()
    for _ in range(3):
        replicas, state = policy(_ctx(band, running=2, target=3, state=state, config=config))
        time.sleep(0.1)
    assert replicas == 3


@pytest.mark.parametrize(
    ("metrics", "running", "why"),
    [
        (None, 2, "no report at all"),
        ({}, 2, "an empty report"),
        ("drop-over", 2, "a name missing"),
    ],
)
def test_missing_stats_keep_the_side_where_it_is(metrics: Any, running: int, why: str) -> None:
    from ray_pods import latency_autoscaling as la  # imports ray

    if metrics == "drop-over":
        metrics = _report(_row(50, 40), _row(50, 40))
        del metrics[ls.OVER_TARGET]
    replicas, state = _policy()(_ctx(metrics, running=running, target=running))
    assert (replicas, state[la.STATE_CODE]) == (running, la.HOLD_NO_STATS), why


def test_a_replica_without_stats_counts_for_nothing() -> None:
    from ray_pods import latency_autoscaling as la  # imports ray

    # Three run, two have reported (the third is starting): their counts decide, and the reason says so.
    replicas, state = _policy()(_ctx(_report(_row(50, 8), _row(50, 8)), running=3))
    assert (replicas, state[la.STATE_CODE]) == (4, la.UP_OVER)
    assert "2 of 3 replicas reporting" in state[la.STATE_REASON]


def test_a_raising_input_keeps_the_side_and_logs_each_cause_once(caplog: pytest.LogCaptureFixture) -> None:
    from ray_pods import latency_autoscaling as la  # imports ray

    def broken() -> dict[str, dict[Any, float]]:
        raise RuntimeError("metrics store gone")

    caplog.set_level(logging.WARNING, logger="ray.serve")
    state: dict[str, Any] = {}
    for _ in range(3):
        replicas, state = _wrapped()(_ctx(broken, running=2, target=3, state=state))
        assert replicas == 3
    assert state[la.STATE_CODE] == la.HOLD_ERROR
    assert state[la.STATE_ERROR] == "RuntimeError: metrics store gone"
    nan = _report(_row(float("nan"), 0), _row(50, 0))
    replicas, state = _policy()(_ctx(nan, running=2, target=3, state=state))
    assert replicas == 3 and "not a finite number" in state[la.STATE_ERROR]
    warnings = [r.getMessage() for r in caplog.records if "Latency autoscaling" in r.getMessage()]
    assert len(warnings) == 2, warnings
    assert "metrics store gone" in warnings[0] and "latency_requests=nan" in warnings[1]


def test_the_reason_gauge_names_the_last_decision(monkeypatch: pytest.MonkeyPatch) -> None:
    from ray.util.metrics import Gauge

    from ray_pods import latency_autoscaling as la  # imports ray

    sets: list[tuple[float, dict[str, str]]] = []

    class RecordingGauge(Gauge):  # type: ignore[misc]
        def set(self, value: float | None, tags: dict[str, str] | None = None) -> None:
            sets.append((value or 0.0, dict(tags or {})))
            super().set(value, tags)

    monkeypatch.setattr(la, "Gauge", RecordingGauge)
    monkeypatch.setattr(la, "_GAUGE", [])
    state: dict[str, Any] = {}
    for _ in range(3):
        _, state = _policy()(_ctx(_report(_row(50, 8), _row(50, 8)), running=2, state=state))
    assert la._GAUGE[0].info["name"] == la.DECISION_METRIC
    assert la._GAUGE[0].info["tag_keys"] == ("deployment", "application", "reason")
    ones = [tags["reason"] for value, tags in sets if value == 1]
    assert ones == [la.UP_OVER], "set once, when the reason changes"
    assert {tags["reason"] for value, tags in sets if value == 0} == set(la.REASONS) - {la.UP_OVER}
    _policy()(_ctx(_report(_row(50, 0), _row(50, 0)), running=2, state=state))
    assert [tags["reason"] for value, tags in sets if value == 1] == [la.UP_OVER, la.DOWN_UNDER]


def test_through_serves_deployment_autoscaling_state() -> None:
    """Serve's controller object: the policy loaded by value, replicas' reports averaged, min/max applied."""
    from ray.serve._private.autoscaling_state import DeploymentAutoscalingState
    from ray.serve._private.common import ReplicaMetricReport, TimeStampedValue
    from ray.serve._private.config import DeploymentConfig
    from ray.serve._private.deployment_info import DeploymentInfo

    from ray_pods import latency_autoscaling as la  # imports ray

    config = _config(max_replicas=3, policy={"policy_function": la.DECODE_POLICY})
    assert config.policy.get_serialized_policy_def(), "Serve cloudpickles the policy"
    info = DeploymentInfo(
        deployment_config=DeploymentConfig(autoscaling_config=config),
        replica_config=None,  # register reads only the deployment config
        start_time_ms=0,
        deployer_job_id="",
    )
    state = DeploymentAutoscalingState(_dep(True))
    assert state.register(info, curr_target_num_replicas=2) == 2
    replicas = [_replica(0), _replica(1)]
    state.update_running_replica_ids(replicas)

    def report(rows: list[dict[str, float]]) -> None:
        now = time.time()
        for replica, row in zip(replicas, rows, strict=True):
            series = {k: [TimeStampedValue(now - 1, v), TimeStampedValue(now - 0.5, v)] for k, v in row.items()}
            state.record_request_metrics_for_replica(
                ReplicaMetricReport(replica_id=replica, aggregated_metrics={}, metrics=series, timestamp=now)
            )

    report([_row(50, 8), _row(50, 8)])
    assert state.get_decision_num_replicas(curr_target_num_replicas=2) == 3
    # At max_replicas (3) Serve's bounds hold it, whatever the policy wishes.
    assert state.get_decision_num_replicas(curr_target_num_replicas=3) == 3
    report([_row(-5, 0), _row(50, 0)])
    assert state.get_decision_num_replicas(curr_target_num_replicas=3) == 3, "an error holds, and does not raise"
    report([_row(50, 0), _row(50, 0)])
    assert state.get_decision_num_replicas(curr_target_num_replicas=3) == 3, "two breached at this load"
    report([_row(20, 0), _row(20, 0)])
    assert state.get_decision_num_replicas(curr_target_num_replicas=3) == 2


def test_the_controller_runs_the_policy_without_the_projects_code(tmp_path: Any) -> None:
    """Serve ships the policy by value (cloudpickle): a process that cannot import ray_pods still runs it."""
    import os
    import subprocess
    import sys

    from ray_pods import latency_autoscaling as la  # imports ray

    pickled = tmp_path / "policy.pkl"
    pickled.write_bytes(_config(policy={"policy_function": la.DECODE_POLICY}).policy.get_serialized_policy_def())
    script = f"""
import sys
from ray import cloudpickle
from ray.serve._private.common import DeploymentID, ReplicaID
from ray.serve.config import AutoscalingConfig, AutoscalingContext
try:
    import ray_pods
    sys.exit("ray_pods is importable here")
except ImportError:
    pass
policy = cloudpickle.loads(open({str(pickled)!r}, "rb").read())
dep = DeploymentID(name="DecodeServer", app_name="pd")
replicas = [ReplicaID(unique_id=f"r{{i}}", deployment_id=dep) for i in range(2)]
row = {_row(50, 8, kv=0.5)!r}
ctx = AutoscalingContext(
    deployment_id=dep, deployment_name=dep.name, app_name="pd", current_num_replicas=2, target_num_replicas=2,
    running_replicas=replicas, total_num_requests=0.0, total_queued_requests=0.0,
    aggregated_metrics={{k: {{r: v for r in replicas}} for k, v in row.items()}}, raw_metrics=None,
    capacity_adjusted_min_replicas=1, capacity_adjusted_max_replicas=8, policy_state={{}},
    last_scale_up_time=None, last_scale_down_time=None, current_time=0.0,
    config=AutoscalingConfig(min_replicas=1, max_replicas=8), total_pending_async_requests=0)
replicas_wanted, state = policy(ctx)
print(replicas_wanted, state["{la.STATE_CODE}"])
"""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["3", la.UP_OVER]
