"""Behind the internal NLB, a change never cuts a stream when its target deregisters.

The target group's deregistration delay is the ingress's drain (settings.sizing), set through the
AWS Load Balancer Controller's annotation; the ingress pods' preStop outlasts that delay after the
last connection the NLB may still open to a deregistering target, and their grace period outlasts
the preStop. On the defaults (no NLB) the ingress pods carry none of it.
"""

from __future__ import annotations

from typing import Any

import pytest

import serve_config
from settings import SettingsError, settings_from, sizing
from tests.conftest import PROJECT_CONTEXT, ROOT, manifests, rayservice_from, synth

NLB = {"internal_endpoint_cidrs": "10.0.0.0/8"}
# Read from kubernetes-sigs/aws-load-balancer-controller at v3.2.2, the pinned chart's appVersion:
# the Service annotation prefix (controllers/service/service_controller.go, serviceAnnotationPrefix)
# and suffix (pkg/annotations/constants.go, SvcLBSuffixTargetGroupAttributes), parsed as a
# stringMap: comma-separated key=value (pkg/annotations/parser.go, ParseStringMapAnnotation).
CONTROLLER_ANNOTATION = "service.beta.kubernetes.io/" + "aws-load-balancer-target-group-attributes"
# The NLB target group attributes on draining, as the controller's service annotations guide names
# them (docs/guide/service/annotations.md, v3.2.2); it passes the keys to ELB unchanged.
DELAY = "deregistration_delay.timeout_seconds"
TERMINATION = "deregistration_delay.connection_termination.enabled"


def _nlb_service(template: dict[str, Any]) -> dict[str, Any]:
    (service,) = [m for m in manifests(template) if m["kind"] == "Service" and m["spec"]["type"] == "LoadBalancer"]
    return service


def _attributes(service: dict[str, Any]) -> dict[str, str]:
    text = service["metadata"]["annotations"][CONTROLLER_ANNOTATION]
    return dict(pair.split("=", 1) for pair in text.split(","))


def _groups(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    groups = rayservice_from(template)["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    return {g["groupName"]: g for g in groups}


def _ingress_pod(template: dict[str, Any]) -> dict[str, Any]:
    pod: dict[str, Any] = _groups(template)[serve_config.INGRESS_GROUP]["template"]["spec"]
    return pod


@pytest.mark.parametrize("timeout", [None, 1800], ids=["default-timeout", "timeout-1800"])
def test_the_target_groups_delay_is_the_ingress_drain_from_sizing(timeout: int | None) -> None:
    overrides = NLB if timeout is None else {**NLB, "request_timeout_seconds": str(timeout)}
    settings = settings_from({**PROJECT_CONTEXT, **overrides})
    attributes = _attributes(_nlb_service(synth(**overrides)))
    assert attributes[DELAY] == str(sizing.nlb_deregistration_delay(settings))
    assert sizing.nlb_deregistration_delay(settings) >= sizing.graceful_shutdown(settings, "ingress")[1]
    # A stream the NLB opened after deregistration began may run past the delay: not cut there.
    assert attributes[TERMINATION] == "false"
    assert set(attributes) == {DELAY, TERMINATION}


@pytest.mark.parametrize("timeout", [None, 1800], ids=["default-timeout", "timeout-1800"])
def test_the_ingress_prestop_outlasts_the_delay_and_the_nlbs_lag_and_the_grace_outlasts_it(
    timeout: int | None,
) -> None:
    overrides = NLB if timeout is None else {**NLB, "request_timeout_seconds": str(timeout)}
    template = synth(**overrides)
    delay = int(_attributes(_nlb_service(template))[DELAY])
    pod = _ingress_pod(template)
    (container,) = pod["containers"]
    # The preStop's longest wait (it ends earlier once no connection is open: tests/test_ingress_prestop.py).
    assert container["lifecycle"]["preStop"]["exec"]["command"][:2] == ["/bin/sh", "-c"]
    prestop = sizing.ingress_prestop_seconds(settings_from({**PROJECT_CONTEXT, **overrides}))
    assert prestop > delay + sizing.NLB_DEREGISTRATION_PROPAGATION_S, (prestop, delay)
    assert pod["terminationGracePeriodSeconds"] > prestop


def test_only_the_ingress_group_waits_for_the_nlb() -> None:
    for name, group in _groups(synth(**NLB)).items():
        if name == serve_config.INGRESS_GROUP:
            continue
        pod = group["template"]["spec"]
        assert "terminationGracePeriodSeconds" not in pod, name
        assert all("lifecycle" not in c for c in pod["containers"]), name


def test_without_the_nlb_no_ray_pod_has_a_prestop_or_a_grace_period(template: dict[str, Any]) -> None:
    cluster = rayservice_from(template)["spec"]["rayClusterConfig"]
    pods = [cluster["headGroupSpec"]["template"]["spec"], *(g["template"]["spec"] for g in _groups(template).values())]
    for pod in pods:
        assert "terminationGracePeriodSeconds" not in pod
        assert all("lifecycle" not in c for c in pod["containers"])


def test_a_timeout_past_the_nlbs_longest_delay_ends_synth_in_one_line() -> None:
    defaults = settings_from(PROJECT_CONTEXT)
    drain_extra = sizing.nlb_deregistration_delay(defaults) - defaults.request_timeout_seconds
    longest = sizing.NLB_MAX_DEREGISTRATION_DELAY_S - drain_extra
    settings_from({**PROJECT_CONTEXT, **NLB, "request_timeout_seconds": str(longest)})
    # Without the NLB there is no target group to drain.
    settings_from({**PROJECT_CONTEXT, "request_timeout_seconds": str(longest + 1)})
    with pytest.raises(SettingsError) as raised:
        settings_from({**PROJECT_CONTEXT, **NLB, "request_timeout_seconds": str(longest + 1)})
    message = str(raised.value)
    assert raised.value.key == "request_timeout_seconds"
    assert f"at most {longest} seconds with internal_endpoint_cidrs" in message
    assert "\n" not in message


def test_the_operations_guide_gives_the_defaults_figures_from_sizing() -> None:
    defaults = settings_from(PROJECT_CONTEXT)
    text = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    section = text.split("### The internal NLB during a change", 1)[1].split("\n## ", 1)[0]
    delay = sizing.nlb_deregistration_delay(defaults)
    longest = sizing.NLB_MAX_DEREGISTRATION_DELAY_S - (delay - defaults.request_timeout_seconds)
    for figure in (
        f"({delay} s on the defaults)",
        f"+ {sizing.NLB_DEREGISTRATION_PROPAGATION_S} s + a {sizing.NLB_DEREGISTRATION_ALLOWANCE_S} s allowance",
        f"({sizing.ingress_prestop_seconds(defaults)} s)",
        f"+ {sizing.RAY_STOP_GRACE_S} s for Ray's own stop ({sizing.ingress_termination_grace_seconds(defaults)} s)",
        f"is {sizing.NLB_MAX_DEREGISTRATION_DELAY_S} s, so with the NLB",
        f"is at most\n{longest}; synth refuses more",
    ):
        assert figure in section, figure
