"""Every user CLI reads settings the same way, and every make target passes the same settings."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


@pytest.mark.parametrize("module", ["tools.verify", "tools.bench", "tools.plan", "tools.preflight"])
def test_a_bad_setting_is_one_line_and_no_traceback(module: str) -> None:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run(
        [sys.executable, "-m", module, "-c", "gpu_instance_type=bogus"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if "gpu_instance_type" in line]
    assert len(lines) == 1, done.stderr
    if module in ("tools.verify", "tools.bench"):
        assert done.returncode == 2, done.stderr


TARGETS = ["synth", "diff", "deploy", "destroy", "preflight", "plan", "verify", "bench", "change-impact"]


@pytest.mark.parametrize("target", TARGETS)
def test_every_target_passes_the_settings_file_and_cdk_args(target: str) -> None:
    done = subprocess.run(
        [
            "make",
            "-n",
            "--always-make",
            target,
            "SETTINGS=prod.yaml",
            "CDK_ARGS=-c serving_mode=aggregated",
            "DEPLOYED=deployed.json",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    tool_lines = [line for line in done.stdout.splitlines() if "-m tools." in line or "node_modules/.bin/cdk " in line]
    tool_lines = [line for line in tool_lines if "fetch_schemas" not in line]
    assert tool_lines, done.stdout
    for line in tool_lines:
        assert "-c settings_file=prod.yaml" in line, line
        assert "-c serving_mode=aggregated" in line, line


def test_bench_says_before_it_installs_the_serving_environment() -> None:
    done = subprocess.run(
        ["make", "-n", "--always-make", "bench"], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True
    )
    notice = done.stdout.find("installing the serving environment")
    install = done.stdout.find("requirements-serve.lock")
    assert 0 <= notice < install, done.stdout
