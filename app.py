#!/usr/bin/env python3
"""The CDK app: settings, the one stack, tags, cdk-nag."""

from __future__ import annotations

import sys

import aws_cdk as cdk
from cdk_nag import AwsSolutionsChecks

from serve_config import ServeConfigError
from settings import Settings, SettingsError, settings_from, sizing
from settings.estimates import cost_summary, plan_table
from settings.model import s3_model_location
from settings.project import STACK_NAME
from stacks.nag_acknowledgements import acknowledge_findings, acknowledge_imported_vpc, acknowledge_model_prefix
from stacks.pd_inference_stack import PdInferenceStack


def build_app(context: dict[str, object] | None = None) -> tuple[cdk.App, PdInferenceStack, Settings]:
    """The app, its one stack and the settings it was built from.

    Raises SettingsError before any construct exists if a setting is bad.
    """
    # CDK's built-in template validator runs on every synth, as CDK ships it, so
    # each user's own settings are checked too. CDK itself reads
    # CDK_VALIDATION=false to turn it off (the test suite does, where cfn-lint runs).
    app = cdk.App(context=context)
    settings = settings_from(app.node.get_all_context())
    env = None
    if settings.effective_region or settings.account:
        env = cdk.Environment(account=settings.account, region=settings.effective_region)
    stack = PdInferenceStack(
        app,
        STACK_NAME,
        settings=settings,
        env=env,
        description="Disaggregated LLM inference on EKS: Ray Serve LLM prefill/decode with NIXL over EFA",
    )
    cdk.Tags.of(app).add("project", "pd-inference")
    cdk.Tags.of(app).add("managed-by", "aws-cdk")
    acknowledge_findings(stack)
    if settings.vpc_id is not None:
        acknowledge_imported_vpc(stack)
    location = s3_model_location(settings)
    if location is not None:
        acknowledge_model_prefix(stack, *location)
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    return app, stack, settings


def warnings(settings: Settings) -> list[str]:
    """One line each, printed at synth: deployable, but worth a second look."""
    found = []
    if settings.endpoint_access != "private" and not settings.public_access_cidrs:
        found.append(
            "warning: the EKS API endpoint is public to 0.0.0.0/0 (authenticated); "
            "set public_access_cidrs to your office or VPN ranges, or endpoint_access=private"
        )
    if settings.internal_endpoint_cidrs and settings.endpoint_api_keys_secret_name is None:
        found.append(
            "warning: the internal NLB admits anyone in internal_endpoint_cidrs to the model with no key; "
            "set endpoint_api_keys_secret_name to require API keys"
        )
    if settings.ray_cluster_upgrade == "auto" and not sizing.holds_second_cluster(settings):
        low, high = sizing.gpu_serving_node_bounds(settings)
        found.append(
            f"warning: the GPU group's maximum ({high} nodes) cannot hold a second Ray cluster beside the first "
            f"({low} more): a Ray cluster change recreates it, with the endpoint down for a cluster start; "
            f'a maximum of {2 * low} or more makes it blue/green (docs/operations.md, "Upgrades")'
        )
    fixed = [side for side in sizing.engine_sides(settings) if not sizing.surge_room(settings, side)]
    if fixed:
        down = sizing.engine_restart_seconds(settings, new_weights=False, image_pull=False)
        keys = " or ".join(f"{side}_max_replicas" for side in fixed if side != "aggregated") or "a maximum"
        found.append(
            f"warning: no room for a surge replica on {' and '.join(fixed)} (no range): a change that restarts "
            f"replicas (an engine setting such as max_model_len) takes each down for one engine start, about "
            f"{down[0] / 60:.1f}-{down[1] / 60:.1f} min; {keys} above the minimum lets `make upgrade` keep it serving "
            '(docs/operations.md, "Upgrades")'
        )
    return found


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def main() -> int:
    try:
        app, _, settings = build_app()
    except (SettingsError, ServeConfigError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except RuntimeError as err:
        # jsii raises RuntimeError for anything the CDK refuses while the stack is built.
        print(f"error: the stack could not be built: {_first_line(err)}", file=sys.stderr)
        return 1
    # On stderr: `cdk synth` prints the template on stdout.
    for line in warnings(settings):
        print(line, file=sys.stderr)
    print(f"Estimated cost: {cost_summary(settings)}", file=sys.stderr)
    print(f"KV-transfer plan:\n{plan_table(settings)}", file=sys.stderr)
    try:
        app.synth()
    except RuntimeError as err:
        # cdk-nag findings and CDK validation arrive here; CDK has already
        # printed the details above this line.
        print(f"error: synth failed: {_first_line(err)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
