"""verify's check rows (one name, pass or fail, a detail) and what the workers' logs and drivers show."""

from __future__ import annotations

import re
from dataclasses import dataclass

from settings.catalog import IMAGE_NIXL_VERSION, IMAGE_RAY_VERSION, IMAGE_VLLM_VERSION

# Strings NIXL (nixl/_api.py) and vLLM (nixl/base_worker.py) log, read from their source.
_INSTANTIATED = re.compile(r"Backend (\w+) was instantiated")


_SKIPPED = re.compile(r"Skipping backend registration (\w+)")


_NIXL_MISSING = re.compile(r"NIXL is not available")


_TCP_PROVIDER = re.compile(r"provider\W{0,3}(tcp|sockets|udp)\b", re.IGNORECASE)


# nixl's libfabric rail manager: "Created 2 rails using provider=efa" (INFO).
_RAILS = re.compile(r"rails using provider\W{0,2}(\w+)")


_RAIL_COUNT = re.compile(r"Created (\d+) rails using provider")


_TCP_FALLBACK = re.compile(r"\(TCP fallback\)")


# The provider the GPU nodes' libfabric must use; the CPU rehearsal passes tcp.
DEFAULT_PROVIDER = "efa"


# What the image must hold (settings/catalog.py; requirements-serve.lock pins the same).
IMAGE_PINS = {"ray": IMAGE_RAY_VERSION, "vllm": IMAGE_VLLM_VERSION, "nixl": IMAGE_NIXL_VERSION}


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class LogFindings:
    instantiated: frozenset[str]
    skipped: frozenset[str]
    nixl_missing: bool
    tcp_provider: bool
    rail_providers: frozenset[str] = frozenset()
    tcp_fallback: bool = False
    expected_provider: str = DEFAULT_PROVIDER
    # The most rails one NIXL agent logged, and the EFA devices the pod holds (0: not checked):
    # a pod holding several cards should spread its rails across all of them.
    rails: int = 0
    expected_rails: int = 0

    @property
    def problems(self) -> list[str]:
        found = []
        if "LIBFABRIC" not in self.instantiated:
            found.append("no 'Backend LIBFABRIC was instantiated'")
        if self.expected_provider not in self.rail_providers:
            found.append(
                f"no NIXL 'rails using provider={self.expected_provider}' line "
                f"(providers seen: {sorted(self.rail_providers) or 'none'}; is NIXL_LOG_LEVEL=INFO set?)"
            )
        others = self.rail_providers - {self.expected_provider}
        if others:
            found.append(f"NIXL rails on {sorted(others)}, not {self.expected_provider}")
        if self.rails < self.expected_rails:
            found.append(f"NIXL created {self.rails} rail(s), fewer than the pod's {self.expected_rails} EFA devices")
        if self.tcp_fallback and self.expected_provider != "tcp":
            found.append("NIXL logged a TCP fallback")
        if self.skipped:
            found.append(f"skipped backend registration: {sorted(self.skipped)}")
        if "UCX" in self.instantiated:
            found.append("UCX backend instantiated (UCX picks its transports; without its EFA one it runs over TCP)")
        if self.nixl_missing:
            found.append("NIXL is not available")
        if self.tcp_provider and self.expected_provider not in ("tcp", "sockets"):
            found.append(f"libfabric on a TCP/sockets provider, not {self.expected_provider}")
        return found


def nixl_log_findings(text: str, expected_provider: str = DEFAULT_PROVIDER, expected_rails: int = 0) -> LogFindings:
    return LogFindings(
        instantiated=frozenset(_INSTANTIATED.findall(text)),
        skipped=frozenset(_SKIPPED.findall(text)),
        nixl_missing=bool(_NIXL_MISSING.search(text)),
        tcp_provider=bool(_TCP_PROVIDER.search(text)),
        rail_providers=frozenset(p.lower() for p in _RAILS.findall(text)),
        tcp_fallback=bool(_TCP_FALLBACK.search(text)),
        expected_provider=expected_provider,
        rails=max((int(n) for n in _RAIL_COUNT.findall(text)), default=0),
        expected_rails=expected_rails,
    )


def driver_check(versions: dict[str, str], minimum: int) -> Check:
    """Each worker's `nvidia-smi --query-gpu=driver_version` against the image's CUDA minimum."""
    problems = []
    for pod, text in sorted(versions.items()):
        first = text.strip().splitlines()[0] if text.strip() else ""
        try:
            major = int(first.split(".")[0])
        except ValueError:
            problems.append(f"{pod}: no driver version from nvidia-smi ({first!r})")
            continue
        if major < minimum:
            problems.append(f"{pod}: driver {first} < {minimum}, which the image's CUDA needs")
    detail = "; ".join(problems) or ", ".join(f"{p}: {v.strip()}" for p, v in sorted(versions.items()))
    return Check(f"NVIDIA driver >= {minimum}", bool(versions) and not problems, detail or "no workers")


def table(checks: list[Check]) -> str:
    width = max(len(c.name) for c in checks)
    rows = [f"{'check':<{width}}  result  detail", f"{'-' * width}  ------  ------"]
    rows += [f"{c.name:<{width}}  {'PASS' if c.ok else 'FAIL':<6}  {c.detail}" for c in checks]
    return "\n".join(rows)
