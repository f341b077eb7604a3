"""The pre-warm fault's own check (rehearsal/faults.py): it passes only when the kill landed inside decode's pre-warm.

The watcher runs here as in the rehearsal, on a log directory laid out as Ray's and on a process
titled as decode's replica in this network namespace. The title carries a marker of this test, so
the watcher can never match a replica some other run on the machine has started.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from rehearsal import faults


def test_a_kill_after_the_prewarm_finished_fails_the_check() -> None:
    now = time.monotonic()
    late = faults.Fault(armed=0.0, killed_after=12.0, pid=4242, prewarm_done_before_kill=True).check(now)
    assert late.ok is False, late.detail
    assert "pre-warm had already finished" in late.detail
    assert faults.Fault(armed=0.0, killed_after=12.0, pid=4242).check(now).ok is True
    assert faults.Fault(armed=0.0).check(now).ok is False


def _write_log(temp_dir: Path, lines: list[str]) -> None:
    logs = temp_dir / "session_latest" / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    (logs / "worker-0123.err").write_text("".join(f"{line}\n" for line in lines))


@pytest.mark.parametrize("prewarm_finished", [False, True], ids=["in-prewarm", "after-prewarm"])
def test_the_watcher_records_whether_the_prewarm_had_finished_and_the_check_follows(
    prewarm_finished: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    title = f"{faults.DECODE_REPLICA}test-{uuid.uuid4().hex}"
    monkeypatch.setattr(faults, "DECODE_REPLICA", title)
    replica = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", title])
    try:
        lines = [faults.PREWARM_STARTED] + ([f"{faults.PREWARM_DONE} in 0.4 s"] if prewarm_finished else [])
        _write_log(tmp_path, lines)
        with faults.kill_decode_in_prewarm(tmp_path, os.readlink("/proc/self/ns/net")) as fault:
            replica.wait(timeout=30)
        assert replica.returncode == -9
        assert fault.pid == replica.pid
        assert fault.prewarm_done_before_kill is prewarm_finished
        check = fault.check(time.monotonic())
        assert check.ok is (not prewarm_finished), check.detail
    finally:
        replica.kill()
        replica.wait()
