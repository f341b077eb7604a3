"""What a phase of a case gets: the one deployed app, and where to find and put things.

A case deploys the product once; its phases (rehearsal.cases.CASE_PHASES) then run
in order against that one app, each returning verify-style checks. A phase whose
checks fail ends the case: the later phases (the bench) do not run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rehearsal import deploy
from rehearsal.native import Libraries
from rehearsal.network import DASHBOARD, SERVE, Nodes


@dataclass
class EndpointKeys:
    """The endpoint's API keys in this run (rehearsal/keys.py): the file's folder, the key in force, the others."""

    folder: Path  # laid out as the kubelet lays out a Secret volume
    current: str
    retired: list[str]
    wrong: str  # never in the file

    def all(self) -> dict[str, str]:
        """Every key this run made, by role: none may appear in a log."""
        return {"current": self.current, "wrong": self.wrong, **{f"retired-{i}": k for i, k in enumerate(self.retired)}}


@dataclass
class Setup:
    """What a case may change before Ray starts: the CPU serve config, the Ray processes' environment."""

    case: str
    config: dict[str, Any]
    env: dict[str, str]
    libs: Libraries
    work: Path  # a temporary directory of this run, removed at its end


@dataclass
class Context:
    """The deployed app, for a phase; a phase adds what it saw to log_lines and metrics."""

    case: str
    config: dict[str, Any]
    env: dict[str, str]
    headers: dict[str, str]  # KubeRay's dashboard header (the Ray token), for DASHBOARD calls
    temp_dir: Path  # Ray's --temp-dir: its logs are under session_latest/logs
    work: Path
    model_dir: Path
    results: Path | None  # where a passing case writes its bench; None: no bench
    serve: str = SERVE
    dashboard: str = DASHBOARD
    endpoint_keys: EndpointKeys | None = None  # set when the product's serve config has the key ingress
    nodes: Nodes | None = None  # the two namespaces, for the phases that break a node or an engine
    restart_node_b: Callable[[], None] | None = None  # starts node B's Ray again, as KubeRay recreates a pod
    restart_head: Callable[..., Path] | None = None  # head-loss: starts the head again (store=False: without GCS FT)
    log_lines: list[str] = field(default_factory=list)
    metrics: dict[str, float | None] = field(default_factory=dict)

    @property
    def model_id(self) -> str:
        return deploy.model_id(self.config)

    @property
    def api_key(self) -> str | None:
        """The key the endpoint admits now (None: the endpoint has no keys)."""
        return None if self.endpoint_keys is None else self.endpoint_keys.current

    @property
    def aggregated(self) -> bool:
        return deploy.is_aggregated(self.config)


# A phase: checks against the deployed app (tools.checks.Check, each with ok, name, detail).
Phase = Callable[[Context], list[Any]]
