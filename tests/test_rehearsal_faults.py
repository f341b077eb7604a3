"""The fault phases' own pieces (rehearsal/streams.py, engine_deaths.py, node_loss.py, __main__.py).

The phases themselves run in `make rehearse` against the deployed app; these tests pin what
they rely on: how a client's outcome is classified and how an engine's process is found (by
Ray's and vLLM's titles, in one network namespace only). The cases' caps: test_rehearsal_margins.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator

import pytest

from rehearsal import cases, streams
from rehearsal.head_loss import WITHOUT_STORE_QUIET_S, stopped_answering


def test_a_complete_stream_an_error_and_a_silent_cut_are_told_apart() -> None:
    assert streams.Outcome(0.0, status=200, chunks=5, done=True).kind == "ok"
    # An error event in a 200 stream is an error the client can see, not a cut.
    assert streams.Outcome(0.0, status=200, chunks=5, error='{"code": "stream_interrupted"}').kind == "error"
    assert streams.Outcome(0.0, status=500, error="Internal Server Error").kind == "error"
    assert streams.Outcome(0.0, status=None, error="ConnectionResetError").kind == "error"
    # The failure a client cannot tell from a finished answer.
    assert streams.Outcome(0.0, status=200, chunks=5).kind == "cut"
    assert streams.Outcome(0.0, status=200, chunks=5).label() == "200 cut after 5 chunks, no error"


def _ended(kind: str, ended: float) -> streams.Outcome:
    if kind == "ok":
        return streams.Outcome(ended - 3.0, status=200, chunks=5, done=True, ended=ended)
    return streams.Outcome(ended - 0.1, status=None, error="ConnectionRefusedError", ended=ended)


def test_the_endpoint_counts_as_stopped_only_after_a_quiet_stretch_with_a_failure_in_it() -> None:
    back = 100.0
    # Still answering 17 s after the head came back (as CI once saw): not stopped, however long since the restart.
    answering = [_ended("ok", back + t) for t in (2.0, 9.0, 17.0)]
    assert stopped_answering(answering, back, back + 17.0 + WITHOUT_STORE_QUIET_S - 1) is None
    # Quiet long enough after the last completed request, and a request failed in that time.
    after = [*answering, _ended("error", back + 20.0)]
    assert stopped_answering(after, back, back + 17.0 + WITHOUT_STORE_QUIET_S) == 17.0
    # Quiet with nothing failed is a slow endpoint, not a stopped one.
    assert stopped_answering(answering, back, back + 60.0) is None
    # Refused from the restart on: stopped at once.
    assert stopped_answering([_ended("error", back + 1.0)], back, back + WITHOUT_STORE_QUIET_S) == 0.0


@pytest.fixture
def fake_replica() -> Iterator[tuple[int, int]]:
    """A process titled as Ray titles prefill's Serve replica, with a child titled as vLLM titles its engine."""
    code = textwrap.dedent(
        """
        import os, sys, time, setproctitle
        child = os.fork()
        if child == 0:
            setproctitle.setproctitle("VLLM::EngineCore")
            time.sleep(120)
            os._exit(0)
        setproctitle.setproctitle("ray::ServeReplica:llm:Prefill:Qwen--Qwen3-8B")
        print(child, flush=True)
        time.sleep(120)
        """
    )
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        engine = int(process.stdout.readline())
        time.sleep(1.0)  # the child's title is set after it starts
        yield process.pid, engine
    finally:
        process.kill()
        process.wait()
        subprocess.run(["kill", "-9", str(engine)], check=False, capture_output=True)


def test_an_engine_is_found_by_its_titles_in_its_own_namespace_only(fake_replica: tuple[int, int]) -> None:
    replica, engine = fake_replica
    here = os.readlink("/proc/self/ns/net")
    found = streams.engine_processes("prefill", here)
    assert found == {"replicas": [replica], "engines": [engine]}
    assert streams.engine_processes("decode", here) == {"replicas": [], "engines": []}
    # Another node's namespace: nothing here is touched.
    assert streams.engine_processes("prefill", "net:[0]") == {"replicas": [], "engines": []}
    assert streams.rss_mib([replica]) > streams.rss_mib([engine]) > 0


def test_the_pd_case_runs_every_fault_phase_on_its_one_app_after_the_bench() -> None:
    names = [phase.__name__ for phase in cases.CASE_PHASES["pd"]]
    faults = ["sustained_load_check", "prefill_death_check", "node_loss_check"]
    assert names[names.index("bench") + 2 : names.index("bench") + 5] == faults
    assert names[-1] == "key_log_scan"  # after every phase, so it reads every request's log line


def test_only_the_named_phases_run_when_asked_and_all_of_them_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(cases.ONLY_PHASES, raising=False)
    assert cases.phases("pd") == cases.CASE_PHASES["pd"]
    monkeypatch.setenv(cases.ONLY_PHASES, "node_loss_check")
    assert [p.__name__ for p in cases.phases("pd")] == ["node_loss_check"]
