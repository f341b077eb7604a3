"""The rehearsal's scaling case and burst phase, on the serve config the product synthesizes for them.

The case and the phase themselves run in `make rehearse`; here: that the scaling case changes only
the documented delays, which Ray's own schema accepts, and that the burst's bound is the one the
product sized (settings/sizing/), read from the deployed config as the phase reads it.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from rehearsal import burst, case_settings, cases, scaling, surge
from rehearsal.context import Setup
from rehearsal.deploy import SCALING_DELTAS, apply_scaling_deltas, cpu_serve_config, product_rayservice
from settings import settings_from, sizing
from tests.conftest import PROJECT_CONTEXT, require_serve_deps
from tests.support.template_paths import differing_paths

serve = pytest.mark.serve


def _cpu_config(case: str) -> dict[str, Any]:
    return cpu_serve_config(product_rayservice(case_settings.CASE_SETTINGS[case]), Path("/models/tiny"))


@pytest.fixture(scope="module")
def scaling_config() -> dict[str, Any]:
    return _cpu_config("scaling")


def _scaling_options(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    (app,) = config["applications"]
    return {d["name"].split(":")[0]: d for d in app["deployments"]}


def test_the_scaling_case_ranges_both_sides_and_only_prefill_scales_with_its_load(
    scaling_config: dict[str, Any],
) -> None:
    """Prefill scales with the traffic; decode's range is the surge's room (rehearsal/surge.py), its target above
    every stream the case sends at once, so decode never scales on the load."""
    options = _scaling_options(scaling_config)
    assert options["Prefill"]["autoscaling_config"] == {
        "min_replicas": 1,
        "max_replicas": 2,
        "target_ongoing_requests": 2.0,
    }
    decode = options["Decode"]["autoscaling_config"]
    assert options["Decode"]["num_replicas"] is None and decode["min_replicas"] == 1 and decode["max_replicas"] == 2
    assert decode["target_ongoing_requests"] > max(scaling.LOAD, surge.LOAD)
    assert scaling.SIDE == "prefill" and float(scaling.CHANGED_TARGET) != 2.0


@serve
def test_the_scaling_case_changes_only_serves_delays_which_rays_schema_keeps(scaling_config: dict[str, Any]) -> None:
    require_serve_deps()
    from ray.serve.config import AutoscalingConfig
    from ray.serve.schema import ServeApplicationSchema

    changed = copy.deepcopy(scaling_config)
    apply_scaling_deltas(changed)
    (before,), (after,) = scaling_config["applications"], changed["applications"]
    assert differing_paths(before, after) == set(SCALING_DELTAS)
    (prefill,) = [d for d in ServeApplicationSchema.model_validate(after).deployments if d.name.startswith("Prefill:")]
    # Serve's AutoscalingConfig, as override_deployment_info builds it: the values must come back out of it.
    validated = AutoscalingConfig(**prefill.autoscaling_config)
    assert (validated.upscale_delay_s, validated.downscale_delay_s, validated.look_back_period_s) == (5, 20, 10)
    assert (validated.min_replicas, validated.max_replicas, validated.target_ongoing_requests) == (1, 2, 2)


def test_the_case_wires_its_delta_and_its_phases() -> None:
    config = _cpu_config("scaling")
    setup = Setup("scaling", config, {}, None, Path("/tmp"))  # type: ignore[arg-type]
    cases.apply_case(setup)
    assert _scaling_options(setup.config)["Prefill"]["autoscaling_config"]["downscale_delay_s"] == 20.0
    assert cases.CASE_PHASES["scaling"] == (scaling.bound_change_check, scaling.scaling_check, surge.surge_check)
    assert "burst_check" in [phase.__name__ for phase in cases.CASE_PHASES["pd"]]


def test_the_burst_meets_the_bound_the_product_sized() -> None:
    s = settings_from({**PROJECT_CONTEXT, **case_settings.CASE_SETTINGS["pd"]})
    bound, status, retry_after = burst.admitted_bound(_cpu_config("pd"))
    ingress = sizing.ingress_max_ongoing_requests(s) + sizing.max_queued_requests(s, "decode")
    assert bound == ingress
    assert (status, retry_after) == (503, s.backpressure_retry_after_seconds)


def test_the_timeline_lists_each_change_of_the_replica_counts() -> None:
    timeline = scaling.Timeline(ctx=None, deployment="Prefill:x")  # type: ignore[arg-type]
    running, starting = ("RUNNING", "10.99.0.1"), ("STARTING", "10.99.1.2")
    timeline.seen = [
        (0.0, {"a": running}),
        (2.0, {"a": running}),
        (4.0, {"a": running, "b": starting}),
        (9.0, {"a": running, "b": ("RUNNING", "10.99.1.2")}),
        (30.0, {"b": ("RUNNING", "10.99.1.2")}),
    ]
    assert timeline.changes() == ["t=0s 1 RUNNING", "t=4s 1 RUNNING 1 STARTING", "t=9s 2 RUNNING", "t=30s 1 RUNNING"]
    assert timeline.nodes_of() == {"a": "10.99.0.1", "b": "10.99.1.2"}


def test_the_surge_phase_counts_a_stop_first_restart_and_not_serve_listing_nothing() -> None:
    """Stop-first shows the old replica STOPPING, then the new one STARTING, none RUNNING: each such sample is a
    gap. While Serve builds the app anew its answer lists no deployment (seen in CI: about 40 s after the PUT,
    every request served meanwhile): unknown, not a gap."""
    timeline = scaling.Timeline(ctx=None, deployment="ApiKeyIngress")  # type: ignore[arg-type]
    running, node = "RUNNING", "10.99.0.1"
    timeline.seen = [
        (0.0, {"a": (running, node)}),
        (4.0, {}),
        (40.0, {"a": (running, node), "b": ("STARTING", node)}),
        (90.0, {"a": ("STOPPING", node)}),
        (92.0, {"b": ("STARTING", node)}),
        (140.0, {"b": (running, node)}),
    ]
    assert surge.without_a_running_replica(timeline) == [90, 92]
    assert surge.unlisted(timeline) == 1


def test_each_prefill_engine_start_is_read_once_and_a_reused_name_shows(tmp_path: Path) -> None:
    """One entry per replica (its Serve log), though the line also stands in the worker's .err."""
    serve_logs = tmp_path / "session_latest" / "logs" / "serve"
    serve_logs.mkdir(parents=True)
    line = "INFO llm_Prefill:x {replica} -- NIXL engine id {given} (was prefill-10.99.1.2-20001)\n"
    for replica, given in (("aaa", "prefill-10.99.1.2-20001"), ("bbb", "prefill-10.99.1.2-20001")):
        (serve_logs / f"replica_llm_Prefill_Qwen--Qwen3-8B_{replica}.log").write_text(
            line.format(replica=replica, given=given) * 2
        )
    (serve_logs.parent / "worker-1.err").write_text(line.format(replica="aaa", given="prefill-10.99.1.2-20001"))
    (serve_logs / "replica_llm_Decode_Qwen--Qwen3-8B_ccc.log").write_text(
        "NIXL engine id decode-1-10.99.0.2-22000 (was decode-10.99.0.2-22000)\n"
    )
    names = scaling.prefill_names(tmp_path)
    # Without the incarnation (the scratch run of this case): two starts, one name, so the check fails.
    assert names == [("prefill-10.99.1.2-20001", "prefill-10.99.1.2-20001")] * 2
    assert len({given for given, _ in names}) < len(names)
