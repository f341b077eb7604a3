"""What Ray Serve's controller does with a serve config, through its own code (Ray 2.58).

The deployments it runs for an application (the build task's deployments with the application's
`deployments` list applied), and which replicas a redeploy restarts: apply_app_config
(serve/_private/application_state.py) rebuilds an application whose code version changed
(deploy_utils.py, get_app_code_version), and otherwise applies the new `deployments` list over the
options in force; each deployment then rolls to the DeploymentVersion DeploymentTargetState.create
makes, restarting the replicas whose version `requires_actor_restart` (version.py) and
reconfiguring the rest in place (deployment_state.py, _stop_or_update_outdated_version_replicas).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def local_ray() -> Iterator[None]:
    """Ray LLM's builders read the runtime context: a small local Ray unless one runs already."""
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        yield
    finally:
        if started:
            ray.shutdown()


def code_version(app: dict[str, Any]) -> str:
    from ray.serve._private.deploy_utils import get_app_code_version
    from ray.serve.schema import ServeApplicationSchema

    return str(get_app_code_version(ServeApplicationSchema.model_validate(app)))


def deployment_infos(app: dict[str, Any]) -> dict[str, Any]:
    """What Serve's controller runs for one application: the builder's deployments, as the build task
    makes them (application_state.py, build_serve_application), with the application's `deployments`
    applied by Serve's own override_deployment_info. DeploymentInfo per deployment name."""
    import ray
    from ray._common.utils import import_attr
    from ray.serve._private.api import call_user_app_builder_with_args_if_necessary
    from ray.serve._private.application_state import override_deployment_info
    from ray.serve._private.build_app import build_app
    from ray.serve._private.deploy_utils import deploy_args_to_deployment_info, get_deploy_args
    from ray.serve.schema import ServeApplicationSchema

    with local_ray():
        application = call_user_app_builder_with_args_if_necessary(import_attr(app["import_path"]), app.get("args"))
        built = build_app(application, name=app["name"], default_runtime_env=ray.get_runtime_context().runtime_env)
    app_version = code_version(app)
    infos = {}
    for deployment in built.deployments:
        ingress = deployment.name == built.ingress_deployment_name
        deploy_args = get_deploy_args(
            name=deployment._name,
            replica_config=deployment._replica_config,
            ingress=ingress,
            deployment_config=deployment._deployment_config,
            version=app_version,
            route_prefix="/" if ingress else None,
        )
        infos[deployment.name] = deploy_args_to_deployment_info(**deploy_args, app_name=app["name"])
    found: dict[str, Any] = override_deployment_info(infos, ServeApplicationSchema.model_validate(app))
    return found


def version(info: Any) -> Any:
    """The DeploymentVersion Serve rolls a deployment's replicas to."""
    from ray.serve._private.deployment_state import DeploymentTargetState

    return DeploymentTargetState.create(info, target_num_replicas=0).version


# What requires_actor_restart compares besides the code version, for the reviewer's message only.
_RESTART_FIELDS = {
    "ray_actor_options": "ray_actor_options_hash",
    "placement group": "placement_group_options_hash",
    "max_replicas_per_node": "max_replicas_per_node",
    "gang scheduling": "gang_scheduling_config_hash",
}


def redeploy(old: dict[str, Any], new: dict[str, Any]) -> dict[str, list[str] | None] | None:
    """Serve redeploying application `old` as `new`: None when the code version changed (every replica
    restarts); otherwise each deployment whose options changed, with what restarts its replicas, or None
    where Serve applies them to the running replicas (or, like autoscaling bounds, in its controller)."""
    from ray.serve._private.application_state import override_deployment_info
    from ray.serve.schema import ServeApplicationSchema

    if code_version(old) != code_version(new):
        return None
    running = deployment_infos(old)
    proposed = override_deployment_info(running, ServeApplicationSchema.model_validate(new))
    found: dict[str, list[str] | None] = {}
    for name, info in proposed.items():
        before, after = version(running[name]), version(info)
        if before.requires_actor_restart(after):
            found[name] = [k for k, attr in _RESTART_FIELDS.items() if getattr(before, attr) != getattr(after, attr)]
        elif before != after or running[name].deployment_config != info.deployment_config:
            found[name] = None
    return found
