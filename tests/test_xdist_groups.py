"""The suite's xdist groups hold with the pinned pytest and pytest-xdist: `make test` runs `--dist loadgroup`, and a
test marked `xdist_group("ray")` shares its worker (and the session's local Ray, and a module's one Serve start)
with every other test of that group.

pytest-xdist 3.8.0 groups by appending `@group` to `item._nodeid`; pytest 9.2.0 keeps the node id in `item._id`,
so with that pair the suffix is lost and every group is split across the workers without a word (seen here: the
stream-deadline module's Serve start made twice, 105 s each). A suite run here, with the installed pair, must keep
a group on one worker."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

GROUPED = """import time
import pytest
pytestmark = pytest.mark.xdist_group("ray")
def test_{0}_1(): time.sleep(0.3)
def test_{0}_2(): time.sleep(0.3)
"""


def test_a_group_runs_on_one_worker_with_the_pinned_pytest_and_xdist(tmp_path: Path) -> None:
    for name in ("a", "b"):
        (tmp_path / f"test_{name}.py").write_text(GROUPED.format(name))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v", "-p", "no:cacheprovider"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:]
    ran = re.findall(r"\[(gw\d+)\] \[[ \d]+%\] PASSED (\S+)", result.stdout)
    assert len(ran) == 4, result.stdout[-2000:]
    assert all(test.endswith("@ray") for _, test in ran), ran
    assert len({worker for worker, _ in ran}) == 1, ran
