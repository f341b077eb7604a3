"""Install ray[serve,llm] at the image's Ray version, for the serve-config tests.

The plain install works where pip may take vLLM's exact CUDA torch. Where pip
is capped to another torch (a CPU build, say), that install cannot resolve; then
this installs Ray and vLLM without their torch pins, keeps the torch the cap
allows, and removes CUDA-only companions (torchvision, torchaudio, torchcodec)
that cannot import beside it. The tests only use vLLM's config classes and Ray's
builders, which run on the CPU either way.
"""

from __future__ import annotations

import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REQUIREMENTS = ROOT / "requirements-serve.txt"
TORCH_FAMILY = ("torch", "torchvision", "torchaudio", "torchcodec")
CHECK = "import ray.serve.llm, vllm.config, vllm.engine.arg_utils"


def pip(*args: str) -> int:
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", *args]
    print("+", " ".join(cmd), flush=True)
    return subprocess.call(cmd)


def requirement_name(requirement: str) -> str:
    match = re.match(r"^\s*([A-Za-z0-9_.\-]+)", requirement)
    return match.group(1).lower().replace("_", "-") if match else ""


def requirements_of(dist: str, extra: str | None = None) -> list[str]:
    """A distribution's requirements (for one extra, or its base ones), without markers."""
    found = []
    for req in metadata.requires(dist) or []:
        spec, _, marker = req.partition(";")
        wanted = f'extra == "{extra}"' in marker if extra else "extra ==" not in marker
        if wanted and 'sys_platform == "darwin"' not in marker:
            found.append(spec.strip())
    return found


def imports(module: str) -> bool:
    return subprocess.call([sys.executable, "-c", f"import {module}"], stderr=subprocess.DEVNULL) == 0


def fallback(ray_spec: str) -> None:
    ray_version = ray_spec.split("==")[1]
    if pip(f"ray[serve]=={ray_version}"):
        sys.exit("could not install ray[serve]")
    llm_reqs = requirements_of("ray", "llm")
    vllm_spec = next(r for r in llm_reqs if requirement_name(r) == "vllm")
    others = [r for r in llm_reqs if requirement_name(r) not in ("vllm", *TORCH_FAMILY)]
    if pip("--no-deps", re.sub(r"\[.*?\]", "", vllm_spec)):
        sys.exit("could not install vllm")
    vllm_reqs = [r for r in requirements_of("vllm") if requirement_name(r) not in TORCH_FAMILY]
    # torch unpinned: whatever this machine's pip allows.
    if pip("torch", *others, *vllm_reqs):
        sys.exit("could not install vLLM's other requirements")
    for companion in TORCH_FAMILY[1:]:
        try:
            metadata.version(companion)
        except metadata.PackageNotFoundError:
            continue
        if not imports(companion):
            print(f"removing {companion}: it cannot import beside this torch", flush=True)
            subprocess.call([sys.executable, "-m", "pip", "uninstall", "--yes", "--quiet", companion])


def main() -> int:
    spec = next(
        line.strip() for line in REQUIREMENTS.read_text().splitlines() if line.strip() and not line.startswith("#")
    )
    if pip("-r", str(REQUIREMENTS)) != 0:
        print("plain install failed (is pip capped to another torch?); installing without vLLM's torch pin", flush=True)
        fallback(spec)
    if subprocess.call([sys.executable, "-c", CHECK]) != 0:
        print(f"installed, but `{CHECK}` fails", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
