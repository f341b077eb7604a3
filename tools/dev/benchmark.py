"""Synth speed against an empty aws-cdk-lib app, and the test suite's wall time. Prints; asserts nothing.

    python -m tools.dev.benchmark [--runs 5] [--no-tests]

Each synth is a fresh `python app.py` process, as `cdk synth` runs it, after one
warm-up run (so the OS file cache is warm). The empty app imports aws-cdk-lib,
makes a Stack with one placeholder resource and synthesizes it: the floor any CDK app pays (jsii and
Node start-up).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from settings.project import ROOT

# One resource: with cdk.json's flags CDK's template validation refuses an empty Resources section.
EMPTY_APP = (
    "import aws_cdk as cdk\napp = cdk.App()\nstack = cdk.Stack(app, 'Empty')\n"
    "cdk.CfnWaitConditionHandle(stack, 'Nothing')\napp.synth()\n"
)


def _timed(command: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, cwd=ROOT, env=env, check=True, capture_output=True)
    return time.perf_counter() - started


def synth_seconds(command: list[str], runs: int, extra_env: dict[str, str] | None = None) -> list[float]:
    context = json.loads((ROOT / "cdk.json").read_text())["context"]
    with tempfile.TemporaryDirectory() as out:
        env = {**os.environ, "CDK_OUTDIR": out, "CDK_CONTEXT_JSON": json.dumps(context), **(extra_env or {})}
        _timed(command, env)  # warm-up
        return [_timed(command, env) for _ in range(runs)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--no-tests", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as empty:
        empty.write(EMPTY_APP)
    # Like with like: both apps with CDK's built-in validator on (as CDK ships it,
    # and app.py's default), then both with it off (CDK_VALIDATION=false).
    for label, env in (("validator on", {}), ("validator off", {"CDK_VALIDATION": "false"})):
        ours = statistics.median(synth_seconds([sys.executable, "app.py"], args.runs, env))
        floor = statistics.median(synth_seconds([sys.executable, empty.name], args.runs, env))
        print(
            f"warm synth, median of {args.runs}, {label} in both: app.py {ours:.2f}s, "
            f"empty aws-cdk-lib app {floor:.2f}s; ratio {ours / floor:.2f}x (target <= 1.3x)"
        )
    os.unlink(empty.name)
    if not args.no_tests:
        started = time.perf_counter()
        env = {**os.environ, "REQUIRE_SERVE_DEPS": "1"}
        command = [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-q", "-p", "no:warnings"]
        result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
        elapsed = time.perf_counter() - started
        summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else "no output"
        print(f"full test suite: {elapsed:.1f}s wall ({summary}) (target <= 90s after install)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
