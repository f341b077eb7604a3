"""The ingress pods' preStop behind the internal NLB ends early once no connection is open on the Serve port, never
before the NLB's propagation, never after the drain: the script the stack ships, run for real under sh and bash
against a local listening socket, with every sleep scaled down."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

import serve_config
from serve_config.ingress_prestop import prestop_script
from settings import settings_from, sizing
from settings.sizing.admission import (
    INGRESS_PRESTOP_POLL_S,
    INGRESS_PRESTOP_QUIET_POLLS,
    ingress_prestop_idle_seconds,
    ingress_prestop_min_seconds,
)
from tests.conftest import PROJECT_CONTEXT, rayservice_from, resources, synth

NLB = {"internal_endpoint_cidrs": "10.0.0.0/8"}
SCALE = 0.05  # 130 s of propagation become 6.5 s, a 5 s poll 0.25 s
# What a poll costs besides its sleep (a subshell reading /proc/net/tcp): unscaled, so allowed for per poll.
POLL_COST_S = 0.3
# The image's /bin/sh and the bash KubeRay runs `ray start` with (on Debian /bin/sh is dash).
SHELLS = sorted({os.path.realpath(s) for s in ("/bin/sh", "/bin/bash") if os.path.exists(s)})
QUIET = INGRESS_PRESTOP_QUIET_POLLS + 1
POLL = INGRESS_PRESTOP_POLL_S * SCALE + POLL_COST_S


@contextmanager
def listening() -> Iterator[socket.socket]:
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen()
    try:
        yield server
    finally:
        server.close()


def _run(shell: str, script: str) -> float:
    start = time.monotonic()
    subprocess.run([shell, "-c", script], check=True, timeout=120)
    return time.monotonic() - start


@pytest.mark.parametrize("shell", SHELLS)
def test_without_a_connection_it_ends_after_the_propagation(shell: str) -> None:
    settings = settings_from({**PROJECT_CONTEXT, **NLB})
    with listening() as server:
        took = _run(shell, prestop_script(settings, server.getsockname()[1], scale=SCALE))
    minimum = ingress_prestop_min_seconds(settings) * SCALE
    assert minimum <= took < minimum + QUIET * POLL + 1.0, took


@pytest.mark.parametrize("shell", SHELLS)
def test_an_open_connection_holds_it_until_it_closes(shell: str) -> None:
    settings = settings_from({**PROJECT_CONTEXT, **NLB})
    hold = ingress_prestop_min_seconds(settings) * SCALE + 3.0  # past the scaled propagation
    with listening() as server:
        client = socket.create_connection(server.getsockname())
        accepted, _ = server.accept()
        process = subprocess.Popen([shell, "-c", prestop_script(settings, server.getsockname()[1], scale=SCALE)])
        start = time.monotonic()
        time.sleep(hold)
        assert process.poll() is None, "the preStop ended with a connection open"
        client.close()
        accepted.close()
        process.wait(timeout=60)
        took = time.monotonic() - start
    # Ended within a few polls of the close, long before the drain's end.
    assert hold <= took < hold + QUIET * POLL + 1.0, took
    assert took < sizing.ingress_prestop_seconds(settings) * SCALE


@pytest.mark.parametrize("shell", SHELLS)
def test_a_connection_that_never_closes_ends_at_the_drain(shell: str) -> None:
    settings = settings_from({**PROJECT_CONTEXT, **NLB, "request_timeout_seconds": "60"})
    with listening() as server:
        client = socket.create_connection(server.getsockname())
        accepted, _ = server.accept()
        took = _run(shell, prestop_script(settings, server.getsockname()[1], scale=SCALE))
        client.close()
        accepted.close()
    drain = sizing.ingress_prestop_seconds(settings)
    polls = (drain - ingress_prestop_min_seconds(settings)) / INGRESS_PRESTOP_POLL_S + 1
    assert drain * SCALE <= took < drain * SCALE + polls * POLL_COST_S + POLL + 1.0, took


def _kubectl_handler_timeout(template: dict[str, Any]) -> int:
    (handler,) = [f for k, f in resources(template, "AWS::Lambda::Function").items() if "KubectlProviderHandler" in k]
    return int(handler["Properties"]["Timeout"])


def test_a_destroy_without_clients_ends_inside_the_kubectl_handlers_limit() -> None:
    """`cdk destroy` deletes the serving namespace through the kubectl handler, which waits for its pods; an ingress
    pod with no open connection stops after its propagation wait and Ray's own stop."""
    template = synth(**NLB)
    settings = settings_from({**PROJECT_CONTEXT, **NLB})
    groups = rayservice_from(template)["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    (ingress,) = [g for g in groups if g["groupName"] == serve_config.INGRESS_GROUP]
    (container,) = ingress["template"]["spec"]["containers"]
    assert container["lifecycle"]["preStop"]["exec"]["command"] == [
        "/bin/sh",
        "-c",
        prestop_script(settings, serve_config.SERVE_PORT),
    ]
    worst = ingress_prestop_idle_seconds(settings) + sizing.RAY_STOP_GRACE_S
    limit = _kubectl_handler_timeout(template)
    assert worst < limit, (worst, limit)
    # Without the early end the drain alone outlasts the handler at the longest timeout the NLB allows.
    longest = settings_from({**PROJECT_CONTEXT, **NLB, "request_timeout_seconds": "900"})
    assert sizing.ingress_prestop_seconds(longest) > limit
    assert ingress_prestop_idle_seconds(longest) + sizing.RAY_STOP_GRACE_S < limit
