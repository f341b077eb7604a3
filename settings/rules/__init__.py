"""Every rule a setting must meet, by domain; validate() runs them all once, before any construct is made.

The order is the order a user meets the errors in: the first bad key is the one reported."""

from __future__ import annotations

from collections.abc import Collection

from settings.model import Settings
from settings.rules.arns import check_arn_placement
from settings.rules.effect import check_effect, given_in_code
from settings.rules.endpoint import check_endpoint_keys, check_internal_endpoint
from settings.rules.latency import check_latency_targets
from settings.rules.network import check_network
from settings.rules.nodes import (
    check_capacity_block,
    check_gpu_ami_release,
    check_gpu_nodes,
    check_system_nodes,
    check_tensor_parallel,
    check_warm_nodes,
)
from settings.rules.observability import check_observability
from settings.rules.serving import (
    check_backpressure,
    check_memory_fit,
    check_model,
    check_names_and_secrets,
    check_prefill_header_keys,
    check_scaling_bounds,
)

__all__ = ["validate"]


def validate(s: Settings, given: Collection[str] | None = None) -> Settings:
    """Check every setting once. Raises SettingsError naming the first bad key, its value and what is allowed.

    `given`: the settings the user gave (settings/loading.py knows them); None, every value other than its
    default. A setting given where it has no effect is refused, after every value is known to be valid.
    """
    check_network(s)
    check_system_nodes(s)
    check_gpu_nodes(s)
    check_model(s)
    check_scaling_bounds(s)
    check_tensor_parallel(s)
    check_warm_nodes(s)
    check_capacity_block(s)
    check_gpu_ami_release(s)
    check_memory_fit(s)
    check_names_and_secrets(s)
    check_internal_endpoint(s)
    check_endpoint_keys(s)
    check_prefill_header_keys(s)
    check_observability(s)
    check_backpressure(s)
    check_latency_targets(s)
    check_arn_placement(s)
    check_effect(s, given_in_code(s) if given is None else given)
    return s
