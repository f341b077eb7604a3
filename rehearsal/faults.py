"""One transient fault during decode's pre-warm, and what Serve does about it.

Decode pre-warms in its constructor (Ray 2.58 pd_server.py). A constructor that fails is
retried by Serve min(max_constructor_retry_count, replicas x RAY_SERVE_MAX_PER_REPLICA_RETRY_COUNT)
times (serve/_private/deployment_state.py); after that the deployment is failed for good. The
fault here: decode's replica process is killed as its pre-warm starts, once, as a node hiccup
or an OOM kill would. The app must still come up, on Serve's retry alone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tools.checks import Check

PREWARM_STARTED = "[PDDecodeServer] Starting pre-warm across all P replicas."
PREWARM_DONE = "[PDDecodeServer] Pre-warm complete"
# Ray's process title for a Serve replica of the product's decode deployment.
DECODE_REPLICA = "ServeReplica:llm:Decode:"
FAULT_TIMEOUT_S = 600.0


@dataclass
class Fault:
    """What happened: when the replica was killed (s after the fault was armed), and what the logs said then."""

    armed: float
    killed_after: float | None = None
    pid: int | None = None
    prewarm_done_before_kill: bool = False

    def check(self, started: float) -> Any:
        """Ok only for a kill inside the pre-warm: a kill after it is a replica death, which proves nothing
        about a constructor retried by Serve."""

        name = "one fault during pre-warm, the app still came up"
        if self.killed_after is None:
            return Check(name, False, "the fault was never injected")
        killed = f"decode's replica (pid {self.pid}) killed {self.killed_after:.0f} s after the deploy"
        if self.prewarm_done_before_kill:
            return Check(name, False, f"{killed}, but its pre-warm had already finished: no fault during pre-warm")
        came_up = f"the app RUNNING {time.monotonic() - started:.0f} s after the deploy"
        return Check(name, True, f"{killed}, in its pre-warm; Serve started another; {came_up}")


def _decode_log(temp_dir: Path) -> str:
    """Where Ray LLM's pre-warm lines land: the replica processes' stderr (worker-*.err; tens of KB).
    Read twice a second, the whole of Ray's logs would cost a core."""
    logs = temp_dir / "session_latest" / "logs"
    parts = []
    for path in sorted(logs.glob("worker-*.err")):
        with contextlib.suppress(OSError):
            parts.append(path.read_text(errors="replace"))
    return "\n".join(parts)


def _decode_replicas(namespace: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if DECODE_REPLICA in (entry / "cmdline").read_bytes().decode(errors="replace") and (
                os.readlink(entry / "ns" / "net") == namespace
            ):
                found.append(int(entry.name))
    return found


@contextlib.contextmanager
def kill_decode_in_prewarm(temp_dir: Path, node_b_namespace: str) -> Iterator[Fault]:
    """While the block runs (the deploy): kill decode's first replica once, as its pre-warm starts."""
    fault = Fault(armed=time.monotonic())
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set() and time.monotonic() - fault.armed < FAULT_TIMEOUT_S:
            text = _decode_log(temp_dir)
            if PREWARM_STARTED in text:
                pids = _decode_replicas(node_b_namespace)
                if pids:
                    fault.prewarm_done_before_kill = PREWARM_DONE in _decode_log(temp_dir)
                    for pid in pids:
                        with contextlib.suppress(OSError):
                            os.kill(pid, signal.SIGKILL)
                    fault.pid, fault.killed_after = pids[0], time.monotonic() - fault.armed
                    return
            stop.wait(0.5)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield fault
    finally:
        stop.set()
        thread.join(timeout=5)
