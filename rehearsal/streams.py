"""A streaming chat client that records what a caller of the endpoint sees, and the engines' processes.

Used by the fault phases (engine deaths, node loss): each request ends in one Outcome,
which tells an explicit error (a 4xx/5xx status, or an error event in the stream) from
a stream that was cut without one, the failure a client cannot tell from a finished answer.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from rehearsal.context import Context

# Ray's process title for a Serve replica of the product's app; vLLM's for its engine process.
REPLICA_TITLE = "ServeReplica:llm:{deployment}:"
ENGINE_TITLE = "EngineCore"
DEPLOYMENTS = {"prefill": "Prefill", "decode": "Decode"}
# A request of the fault phases' traffic waits at most this long: a replica's restart (about 40 s
# here) and a margin. One that waits longer is recorded as an error, not waited for.
TRAFFIC_TIMEOUT_S = 150.0


@dataclass
class Outcome:
    """One request as its client saw it."""

    started: float  # time.monotonic()
    status: int | None = None  # None: no HTTP answer at all (connection refused, reset, timeout)
    chunks: int = 0
    done: bool = False  # the stream ended with `data: [DONE]`
    error: str = ""  # the error event's or the error body's text, or the client's exception
    ended: float = 0.0
    retry_after: str | None = None  # the Retry-After header of a refusal
    first_chunk: float | None = None  # time.monotonic() of the first data event: started to it is the TTFT seen

    @property
    def kind(self) -> str:
        """ok, error (an explicit one the client can act on), or cut (the stream stopped with no error)."""
        if self.status == 200 and self.done and not self.error:
            return "ok"
        if self.status == 200 and not self.error:
            return "cut"
        return "error"

    def label(self) -> str:
        if self.kind == "ok":
            return "200 complete"
        if self.kind == "cut":
            return f"200 cut after {self.chunks} chunks, no error"
        shown = self.error.replace("\n", " ")[:80]
        return f"{self.status if self.status is not None else 'no answer'}: {shown}"


DEFAULT_PROMPT = "Count slowly."


def stream_chat(
    ctx: Context,
    max_tokens: int,
    timeout: float = 300.0,
    prompt: str = DEFAULT_PROMPT,
    extra_headers: dict[str, str] | None = None,
) -> Outcome:
    """One streaming chat through the endpoint, read to its end."""
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens}
    return _stream(ctx, "/v1/chat/completions", body, timeout, extra_headers)


def stream_completion(ctx: Context, max_tokens: int, prompt: str | list[int], timeout: float = 300.0) -> Outcome:
    """One streaming completion through the endpoint, read to its end: its prompt text, or its token ids."""
    return _stream(ctx, "/v1/completions", {"prompt": prompt, "max_tokens": max_tokens}, timeout, None)


def _stream(
    ctx: Context, path: str, request: dict[str, object], timeout: float, extra_headers: dict[str, str] | None
) -> Outcome:
    outcome = Outcome(started=time.monotonic())
    headers = {"Content-Type": "application/json", **(extra_headers or {})}
    if ctx.api_key is not None:
        headers["Authorization"] = f"Bearer {ctx.api_key}"
    body = json.dumps({"model": ctx.model_id, **request, "ignore_eos": True, "stream": True}).encode()
    parts = urlsplit(ctx.serve)
    connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=timeout)
    try:
        connection.request("POST", path, body=body, headers=headers)
        response = connection.getresponse()
        outcome.status = response.status
        if response.status != 200:
            outcome.retry_after = response.getheader("Retry-After")
            outcome.error = response.read().decode(errors="replace") or response.reason
            return outcome
        for raw in response:
            line = raw.decode(errors="replace").strip()
            if not line.startswith("data:"):
                continue
            data = line[len("data:") :].strip()
            if data == "[DONE]":
                outcome.done = True
                break
            with contextlib.suppress(ValueError):
                event = json.loads(data)
                if isinstance(event, dict) and "error" in event:
                    outcome.error = json.dumps(event["error"])[:300]
                    continue
            if outcome.first_chunk is None:
                outcome.first_chunk = time.monotonic()
            outcome.chunks += 1
    except (OSError, http.client.HTTPException) as err:
        outcome.error = outcome.error or f"{type(err).__name__}: {err}"
    finally:
        outcome.ended = time.monotonic()
        connection.close()
    return outcome


@dataclass
class Traffic:
    """Clients that keep `concurrency` streams in flight until stopped: what a service sees during a fault."""

    ctx: Context
    concurrency: int
    max_tokens: int
    # Each request's prompt (called once per request); None: DEFAULT_PROMPT.
    prompt: Callable[[], str] | None = None
    outcomes: list[Outcome] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _client(self) -> None:
        while not self._stop.is_set():
            text = DEFAULT_PROMPT if self.prompt is None else self.prompt()
            outcome = stream_chat(self.ctx, self.max_tokens, timeout=TRAFFIC_TIMEOUT_S, prompt=text)
            with self._lock:
                self.outcomes.append(outcome)
            if outcome.kind != "ok":
                # A failing endpoint answers at once: do not spin on it.
                self._stop.wait(1.0)

    def __enter__(self) -> Traffic:
        self._threads = [threading.Thread(target=self._client, daemon=True) for _ in range(self.concurrency)]
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=TRAFFIC_TIMEOUT_S + 30)

    def since(self, moment: float) -> list[Outcome]:
        with self._lock:
            return [o for o in self.outcomes if o.ended >= moment]


def summary(outcomes: list[Outcome]) -> str:
    """How many requests ended each way, e.g. `12 x 200 complete; 2 x 500: ...`."""
    counts = Counter(o.label() for o in outcomes)
    return "; ".join(f"{n} x {label}" for label, n in counts.most_common()) or "none"


def _processes() -> Iterator[tuple[int, int, str, str]]:
    """(pid, parent pid, command line, network namespace) of every process we can read."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            yield int(entry.name), parent, cmdline, os.readlink(entry / "ns" / "net")


def engine_processes(side: str, namespace: str) -> dict[str, list[int]]:
    """A side's Serve replica processes and their engine processes, in one node's network namespace only.

    Found by Ray's and vLLM's process titles and the parent chain, never by a name match on the whole
    machine: another Ray running here (another case, another user) is left alone."""
    title = REPLICA_TITLE.format(deployment=DEPLOYMENTS[side])
    table = [p for p in _processes() if p[3] == namespace]
    replicas = [pid for pid, _, cmdline, _ in table if title in cmdline]
    children: dict[int, list[tuple[int, str]]] = {}
    for pid, parent, cmdline, _ in table:
        children.setdefault(parent, []).append((pid, cmdline))
    engines: list[int] = []
    pending = list(replicas)
    while pending:
        for pid, cmdline in children.get(pending.pop(), []):
            if ENGINE_TITLE in cmdline:
                engines.append(pid)
            pending.append(pid)
    return {"replicas": replicas, "engines": engines}


def rss_mib(pids: list[int]) -> float:
    """Resident memory of these processes and all their descendants, MiB."""
    table = list(_processes())
    children: dict[int, list[int]] = {}
    for pid, parent, _, _ in table:
        children.setdefault(parent, []).append(pid)
    seen: set[int] = set()
    pending = list(pids)
    while pending:
        pid = pending.pop()
        if pid not in seen:
            seen.add(pid)
            pending += children.get(pid, [])
    total = 0.0
    for pid in seen:
        with contextlib.suppress(OSError, ValueError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += float(line.split()[1]) / 1024
    return total
