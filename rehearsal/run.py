"""Run the product's own P/D application on this CPU: real vLLM engines, real NIXL LIBFABRIC transfers.

    python -m rehearsal.run [--case pd|aggregated|ucx|wrong-side-channel|no-plugin] [--logs DIR] [--results DIR]

The serve config and the workers' environment come from the synthesized
template (the RayService's serveConfigV2 and worker container), changed only
by the CPU deltas (rehearsal/deploy.py, CPU_DELTAS). It is deployed the way
KubeRay deploys it (PUT to the dashboard's /api/serve/applications/, with the
cluster's token in the x-ray-authorization header when the RayService turns Ray
token authentication on, as KubeRay does), and checked with `verify`'s own
functions, with libfabric's tcp provider expected instead of efa. With token
authentication on, it also checks that the dashboard refuses a deploy and a job
without the token.

It runs as two Ray nodes in two network namespaces of its own (unshare --net,
as root or with --map-root-user), joined by a veth pair with private
addresses, as the prefill and decode pods are on two nodes: libfabric's tcp
provider refuses the loopback interface, an address of one node is remote to
the other, and no traffic leaves the sandbox. Exit 0 when every check passes; on failure the Ray and
engine logs are copied to --logs.

The pieces, one concern each: network.py (namespaces, veth, addresses), cluster.py
(Ray start and stop, logs), deploy.py (the product's config, the CPU deltas, the
deploy and its status), checks.py (verify's checks, bench), cases.py (what each case
changes and the phases it runs on its one deployed app), context.py (what a phase gets).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rehearsal import head_loss, keys, native
from rehearsal.case_settings import CASE_SETTINGS
from rehearsal.cases import CASE_NAMES, apply_case, deploy_fault, is_failure_case, phases
from rehearsal.checks import auth_checks
from rehearsal.cluster import ray_cluster, ray_logs
from rehearsal.context import Context, Setup
from rehearsal.deploy import (
    CPU_ENV,
    cpu_serve_config,
    deploy,
    kuberay_auth_env,
    kuberay_headers,
    product_head_env,
    product_manifests,
    product_worker_env,
    rayservice_of,
)
from rehearsal.make_model import made
from rehearsal.native import NativeError
from rehearsal.network import IN_NAMESPACE, Nodes, RehearsalError, in_namespace, two_nodes
from tools.checks import table
from tools.polling import EXPORT_INTERVAL_ENV


def run_phases(ctx: Context) -> list[Any]:
    """The case's phases in order on the one deployed app; a phase with a failed check ends the case."""
    found: list[Any] = []
    for phase in phases(ctx.case):
        started = time.monotonic()
        found += phase(ctx)
        # Each phase's share of the case, for the budget (rehearsal/margins.py).
        print(f"phase {phase.__name__} took {time.monotonic() - started:.0f} s", flush=True)
        if not all(c.ok for c in found):
            break
    return found


def run(case: str, logs_out: Path | None, results: Path | None = None) -> int:
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="pd-rehearsal-"))
    try:
        with two_nodes() as nodes:
            return _run(case, nodes, work, logs_out, results, started)
    except (RehearsalError, NativeError, subprocess.CalledProcessError, OSError, urllib.error.URLError) as err:
        print(f"rehearsal FAILED ({case}): {err}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run(case: str, nodes: Nodes, work: Path, logs_out: Path | None, results: Path | None, started: float) -> int:
    timings: dict[str, float] = {}
    libs = native.ensure()
    timings["native"] = time.monotonic() - started
    model_dir = made(work / "model")
    timings["model"] = time.monotonic() - started
    manifests = product_manifests(CASE_SETTINGS.get(case))
    rayservice = rayservice_of(manifests)
    config = cpu_serve_config(rayservice, model_dir)
    env = {**os.environ, **product_worker_env(rayservice), **kuberay_auth_env(rayservice), **CPU_ENV}
    env["LD_LIBRARY_PATH"] = ":".join([*libs.library_dirs, env.get("LD_LIBRARY_PATH", "")])
    # The waits for Ray's export (tools.polling) read the interval Ray is given.
    os.environ[EXPORT_INTERVAL_ENV] = env[EXPORT_INTERVAL_ENV]
    # The product's HF_HOME and VLLM_CACHE_ROOT are on the GPU node's NVMe hostPath, which does not exist here.
    env["HF_HOME"] = str(work / "huggingface")
    env["VLLM_CACHE_ROOT"] = str(work / "vllm")
    setup = Setup(case, config, env, libs, work)
    endpoint_keys = keys.prepare(setup, manifests)
    apply_case(setup)
    timings["config"] = time.monotonic() - started
    temp_dir = work / "ray"
    headers = kuberay_headers(env)
    ctx = Context(
        case, config, env, headers, temp_dir, work, model_dir, results, endpoint_keys=endpoint_keys, nodes=nodes
    )
    head_env = product_head_env(rayservice)
    ray: contextlib.AbstractContextManager[Callable[[], Any]] = (
        head_loss.cluster(env, temp_dir, nodes, head_env, rayservice)
        if case == head_loss.CASE
        else ray_cluster(env, temp_dir, nodes, head_env)
    )
    with ray as restart:
        if case == head_loss.CASE:
            ctx.restart_head = restart
        else:
            ctx.restart_node_b = restart
        try:
            refusals = auth_checks(config, env)
            deploying = time.monotonic()
            with deploy_fault(case, temp_dir, nodes.node_b_namespace) as fault:
                deploy(config, temp_dir, headers, to_terminal_state=is_failure_case(case))
            refusals += [] if fault is None else [fault.check(deploying)]
            timings["deploy"] = time.monotonic() - started
            found = refusals + run_phases(ctx)
            timings["checks"] = time.monotonic() - started
        except Exception:
            _keep_logs(temp_dir, logs_out)
            _print_evidence(temp_dir)
            raise
    print(table(found))
    print("NIXL log lines seen:", *ctx.log_lines, sep="\n  ")
    print(f"metrics: {ctx.metrics}")
    print("phases (s, cumulative): " + ", ".join(f"{k} {v:.0f}" for k, v in timings.items()))
    failed = [c for c in found if not c.ok]
    if failed:
        _keep_logs(temp_dir, logs_out)
        _print_evidence(temp_dir)
        print(f"rehearsal FAILED ({case}): {failed[0].name}: {failed[0].detail}", file=sys.stderr)
        return 1
    print(f"rehearsal passed ({case}) in {time.monotonic() - started:.0f} s")
    return 0


# What NIXL, vLLM and Ray say when the KV path breaks: shown with a failed run.
EVIDENCE = re.compile(
    r"Skipping backend registration|unsupported backend|KeyError|Backend UCX was instantiated|"
    r"NIXL transfer failure: \w+|NIXL_ERR|Failed to load KV|No network devices"
)


def _print_evidence(temp_dir: Path) -> None:
    lines = sorted({line.strip()[:300] for line in ray_logs(temp_dir).splitlines() if EVIDENCE.search(line)})
    if lines:
        print("what the logs say:", *lines[:10], sep="\n  ", file=sys.stderr)


def _keep_logs(temp_dir: Path, logs_out: Path | None) -> None:
    if logs_out is None:
        return
    source = temp_dir / "session_latest" / "logs"
    if source.exists():
        try:
            shutil.copytree(source, logs_out, dirs_exist_ok=True, symlinks=False, ignore_dangling_symlinks=True)
        except shutil.Error as err:
            # Ray's log monitor moves a dead process's files into logs/old/ while we copy:
            # keeping logs is best effort and must never replace the failure being reported.
            print(f"{len(err.args[0])} log files moved while being kept", file=sys.stderr)
        print(f"Ray and engine logs kept in {logs_out}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--case", default="pd", choices=CASE_NAMES)
    parser.add_argument("--logs", type=Path, default=None, help="where to keep the logs of a failed run")
    parser.add_argument("--results", type=Path, default=None, help="where the P/D case writes its short bench")
    raw = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(raw)
    if os.environ.get(IN_NAMESPACE) != "1":
        return in_namespace(raw)
    return run(args.case, args.logs, args.results)


if __name__ == "__main__":
    sys.exit(main())
