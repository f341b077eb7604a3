"""The stateful resources a template change replaces or deletes, by @aws-cdk/cloudformation-diff.

tools/destructive_changes.mjs runs the library `cdk diff` uses; pr_guard blocks on its answer and
change_impact classifies with it, so it lives below both."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from settings.project import ROOT


def node() -> str:
    found = shutil.which("node", path=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
    if found is None:
        raise SystemExit("node not found: run `make setup`")
    return found


def destructive_changes(before: Path, after: Path) -> list[dict[str, str]]:
    result = subprocess.run(
        [node(), str(ROOT / "tools" / "destructive_changes.mjs"), str(before), str(after)],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    if result.returncode not in (0, 1):
        raise SystemExit(f"template comparison failed: {result.stderr.strip()}")
    changes: list[dict[str, str]] = json.loads(result.stdout)
    return changes
