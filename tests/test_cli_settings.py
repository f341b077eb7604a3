"""Every user CLI reads settings the same way, and every make target passes the same settings."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


# Each user CLI, with the arguments it needs besides the settings (change_impact's two templates are
# never read: the settings are checked first).
CLIS = {
    "tools.verify": [],
    "tools.bench": [],
    "tools.plan": [],
    "tools.preflight": [],
    "tools.change_impact": ["deployed.json", "proposed.json"],
}


@pytest.mark.parametrize("module", sorted(CLIS))
def test_a_bad_setting_is_one_line_no_traceback_and_exit_2(module: str) -> None:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run(
        [sys.executable, "-m", module, *CLIS[module], "-c", "gpu_instance_type=bogus"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert "Traceback" not in done.stderr
    assert done.stderr.splitlines() == [done.stderr.splitlines()[0]], done.stderr
    assert done.stderr.startswith("error: setting 'gpu_instance_type' = 'bogus' is not valid:"), done.stderr
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
