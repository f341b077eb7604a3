"""The cases: what each changes in the product before Ray starts, and the phases it runs on the deployed app.

- CASE_SETTINGS (rehearsal/case_settings.py): the product's settings for a case, as a user would set
  them (the stack is synthesized with them).
- CASE_CHANGES: what a case changes on the CPU serve config or the Ray processes' environment
  (rehearsal.context.Setup), after the CPU deltas: a failure case, what it breaks. A failure
  case also gets FAILURE_DELTAS (rehearsal/deploy.py) and must end with the app DEPLOY_FAILED.
- CASE_PHASES: what a passing case runs, in order, against its one deployed app
  (rehearsal.context.Phase). A phase whose checks fail ends the case, so the bench comes last.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

from rehearsal import (
    bad_requests,
    burst,
    checks,
    disconnects,
    engine_deaths,
    faults,
    head_loss,
    keys,
    metric_names,
    node_loss,
    readiness,
    scaling,
    selective,
    selective_mix,
    surge,
    sustained_load,
)
from rehearsal.context import Phase, Setup
from rehearsal.deploy import apply_failure_deltas, apply_scaling_deltas
from rehearsal.faults import Fault
from rehearsal.network import RehearsalError

CASE_NAMES = ("pd", "aggregated", "scaling", "head-loss", "ucx", "wrong-side-channel", "no-plugin")
# Each breaks one thing the product relies on, and must fail: the app DEPLOY_FAILED, the endpoint refusing.
FAILURE_CASES = ("ucx", "wrong-side-channel", "no-plugin")


def _ucx(setup: Setup) -> None:
    args = setup.config["applications"][0]["args"]
    for side in ("prefill", "decode"):
        kv = args[f"{side}_config"]["engine_kwargs"]["kv_transfer_config"]
        kv["kv_connector_extra_config"]["backends"] = ["UCX"]


def _wrong_side_channel(setup: Setup) -> None:
    # Prefill advertises a side-channel host decode cannot reach (ray-project/ray#60817):
    # its own loopback, which on decode's node is decode's loopback.
    args = setup.config["applications"][0]["args"]
    env_vars = args["prefill_config"].setdefault("runtime_env", {}).setdefault("env_vars", {})
    env_vars["VLLM_NIXL_SIDE_CHANNEL_HOST"] = "127.0.0.1"


def _no_plugin(setup: Setup) -> None:
    # NIXL's LIBFABRIC plugin cannot find libfabric.so.1.
    dirs = setup.env["LD_LIBRARY_PATH"].split(":")
    setup.env["LD_LIBRARY_PATH"] = ":".join(d for d in dirs if d != setup.libs.libfabric_dir)


def _scaling(setup: Setup) -> None:
    apply_scaling_deltas(setup.config)


# The failure cases: each breaks one thing the product relies on; the scaling case: Serve's delays.
CASE_CHANGES: dict[str, Callable[[Setup], None]] = {
    "scaling": _scaling,
    "ucx": _ucx,
    "wrong-side-channel": _wrong_side_channel,
    "no-plugin": _no_plugin,
}

# A fault made while a case deploys: the app must come up all the same.
CASE_DEPLOY_FAULTS: dict[str, Callable[[Path, str], AbstractContextManager[Fault]]] = {
    "pd": faults.kill_decode_in_prewarm,
}


@contextlib.contextmanager
def deploy_fault(case: str, temp_dir: Path, node_b_namespace: str) -> Iterator[Fault | None]:
    """The case's fault while the block deploys, if it has one."""
    make = CASE_DEPLOY_FAULTS.get(case)
    if make is None:
        yield None
        return
    with make(temp_dir, node_b_namespace) as fault:
        yield fault


CASE_PHASES: dict[str, tuple[Phase, ...]] = {
    # The pre-warm probe first: it reads what decode's pre-warm moved before any request.
    "pd": (
        checks.prewarm_probe,
        keys.key_checks,
        checks.verify_checks,
        # Before the names: its requests make the route counter's and the prefix-cache hits' series. It leaves
        # the threshold at the case's 0 (every request split), as it found it.
        selective.selective_check,
        metric_names.names_check,
        bad_requests.bad_requests_check,
        burst.burst_check,
        checks.bench,
        disconnects.disconnects_check,
        sustained_load.sustained_load_check,
        # The faults last: each leaves the app serving again, or the case has failed.
        # Decode's engine is lost with its node below (and killed in its pre-warm as the case deploys): an engine
        # killed alone is prefill's, whose new name decode must learn (rehearsal/engine_deaths.py).
        engine_deaths.prefill_death_check,
        node_loss.node_loss_check,
        keys.key_log_scan,
    ),
    # The mix before the bench: the third column of selective's comparison (rehearsal/selective_mix.py).
    "aggregated": (
        keys.key_checks,
        readiness.readiness_check,
        checks.verify_checks,
        selective_mix.aggregated_mix_check,
        checks.bench,
        keys.key_log_scan,
    ),
    # The bound change first: the scaling then runs on the target it set in place; the surge last (it restarts
    # every replica, then stops node C, where the new ones run).
    "scaling": (scaling.bound_change_check, scaling.scaling_check, surge.surge_check),
    # The contrast without the store ends the cluster: last.
    "head-loss": (head_loss.head_loss_check, head_loss.without_store_check),
}


def is_failure_case(case: str) -> bool:
    return case in FAILURE_CASES


def apply_case(setup: Setup) -> None:
    if setup.case not in CASE_NAMES:
        raise RehearsalError(f"unknown case {setup.case!r}")
    change = CASE_CHANGES.get(setup.case)
    if change is not None:
        change(setup)
    if is_failure_case(setup.case):
        apply_failure_deltas(setup.config)


# For working on one phase: only the phases named here (comma-separated function names) run.
# A development aid; `make test` never sets it, and a run with it says so.
ONLY_PHASES = "REHEARSAL_ONLY_PHASES"


def phases(case: str) -> tuple[Phase, ...]:
    """A failure case that deploys after all runs verify's checks, which must then find what is wrong."""
    found = CASE_PHASES.get(case, (checks.verify_checks,))
    only = os.environ.get(ONLY_PHASES)
    if only:
        names = set(only.split(","))
        print(f"{ONLY_PHASES}={only}: only these phases run", flush=True)
        found = tuple(phase for phase in found if phase.__name__ in names)
    return found
