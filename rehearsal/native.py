"""The native pieces the rehearsal needs, built once and cached in .rehearsal-cache/.

- libfabric 2.1.0 with only the tcp and sockets providers. NIXL 1.3.1's LIBFABRIC
  plugin needs symbol version FABRIC_1.7, which Debian 12's libfabric 1.17 lacks.
  The source is Debian's orig tarball of the upstream release: from ../shared/sources
  where it exists, else fetched from the Debian mirror this machine's apt uses,
  and checked against LIBFABRIC_SHA256 either way.
- libcuda.so.1, a stub that reports no device (rehearsal/native/cuda_stub.c).
- libcudart.so.13 comes from the nvidia-cuda-runtime wheel in the serving venv.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from settings.project import ROOT

CACHE = ROOT / ".rehearsal-cache"
SHARED_SOURCES = ROOT.parent / "shared" / "sources"
LIBFABRIC_VERSION = "2.1.0"
LIBFABRIC_TARBALL = f"libfabric_{LIBFABRIC_VERSION}.orig.tar.xz"
# ../shared/sources/SHA256SUMS, the digest of Debian's orig tarball.
LIBFABRIC_SHA256 = "1a66369772d5bb151737214af1c478993e969cf298e8f9ed369e7a2ab8d8c6df"
DEBIAN_POOL_PATH = f"pool/main/libf/libfabric/{LIBFABRIC_TARBALL}"
STUB_SOURCE = Path(__file__).parent / "native" / "cuda_stub.c"
# Only what the rehearsal uses; every other provider stays out of the build.
CONFIGURE = ["--enable-tcp", "--enable-sockets"] + [
    f"--disable-{p}"
    for p in ("verbs", "efa", "psm2", "psm3", "usnic", "rxm", "rxd", "shm", "udp", "opx", "cxi", "ucx", "lpp", "sm2")
]


class NativeError(RuntimeError):
    """A native piece could not be built or fetched."""


@dataclass(frozen=True)
class Libraries:
    libfabric_dir: str
    stub_dir: str
    cudart_dir: str

    @property
    def library_dirs(self) -> list[str]:
        return [self.libfabric_dir, self.stub_dir, self.cudart_dir]


def apt_debian_mirrors(sources: Path = Path("/etc/apt/sources.list.d")) -> list[str]:
    """The Debian mirrors this machine's apt is configured with (deb822 and one-line formats)."""
    found: list[str] = []
    files = [*sorted(sources.glob("*.sources")), *sorted(sources.glob("*.list")), Path("/etc/apt/sources.list")]
    for file in files:
        if not file.is_file():
            continue
        for match in re.finditer(r"(?:URIs:|^deb)\s+(https?://\S+/debian)\b(?!-)", file.read_text(), re.MULTILINE):
            if match.group(1) not in found:
                found.append(match.group(1))
    return found


def fetch_libfabric_source(target: Path, mirrors: list[str]) -> Path:
    """Download the orig tarball from the first mirror that has it; its digest must match."""
    errors = []
    for mirror in mirrors:
        url = f"{mirror.rstrip('/')}/{DEBIAN_POOL_PATH}"
        if not url.startswith(("https://", "http://")):
            continue
        try:
            with urllib.request.urlopen(url, timeout=120) as response:  # noqa: S310 - scheme checked
                data = response.read()
        except OSError as err:
            errors.append(f"{url}: {err}")
            continue
        digest = hashlib.sha256(data).hexdigest()
        if digest != LIBFABRIC_SHA256:
            errors.append(f"{url}: sha256 {digest}, expected {LIBFABRIC_SHA256}")
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        return target
    raise NativeError(f"could not fetch {LIBFABRIC_TARBALL}: {'; '.join(errors) or 'no Debian mirror configured'}")


def libfabric_source() -> Path:
    shared = SHARED_SOURCES / LIBFABRIC_TARBALL
    if shared.is_file():
        if hashlib.sha256(shared.read_bytes()).hexdigest() != LIBFABRIC_SHA256:
            raise NativeError(f"{shared}: digest differs from {LIBFABRIC_SHA256}")
        return shared
    cached = CACHE / "sources" / LIBFABRIC_TARBALL
    if cached.is_file() and hashlib.sha256(cached.read_bytes()).hexdigest() == LIBFABRIC_SHA256:
        return cached
    return fetch_libfabric_source(cached, apt_debian_mirrors())


def build_libfabric() -> Path:
    prefix = CACHE / f"libfabric-{LIBFABRIC_VERSION}"
    library = prefix / "lib" / "libfabric.so.1"
    if library.is_file():
        return library.parent
    for tool in ("autoreconf", "libtoolize", "make", "cc"):
        if shutil.which(tool) is None:
            raise NativeError(f"{tool} not found: apt-get install autoconf automake libtool make gcc")
    with tempfile.TemporaryDirectory() as build:
        with tarfile.open(libfabric_source()) as tar:
            tar.extractall(build, filter="data")
        (source,) = [p for p in Path(build).iterdir() if p.is_dir()]
        for command in (["./autogen.sh"], ["./configure", f"--prefix={prefix}", "--quiet", *CONFIGURE]):
            subprocess.run(command, cwd=source, check=True, capture_output=True)
        subprocess.run(["make", "-j2", "-s", "install"], cwd=source, check=True, capture_output=True)
    return library.parent


def build_cuda_stub() -> Path:
    out = CACHE / "cuda-stub"
    library = out / "libcuda.so.1"
    if library.is_file() and library.stat().st_mtime >= STUB_SOURCE.stat().st_mtime:
        return out
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["cc", "-shared", "-fPIC", "-O2", "-Wl,-soname,libcuda.so.1", "-o", str(library), str(STUB_SOURCE)],
        check=True,
    )
    return out


def cudart_dir() -> Path:
    site = Path(sys.executable).parent.parent / "lib"
    found = sorted(site.glob("python3*/site-packages/nvidia/cu13/lib/libcudart.so.13"))
    if not found:
        raise NativeError("libcudart.so.13 not found in the serving venv (nvidia-cuda-runtime wheel)")
    return found[0].parent


def ensure() -> Libraries:
    if not Path("/usr/lib/x86_64-linux-gnu/libhwloc.so.15").exists():
        raise NativeError("libhwloc.so.15 not found: apt-get install libhwloc15")
    return Libraries(str(build_libfabric()), str(build_cuda_stub()), str(cudart_dir()))


if __name__ == "__main__":
    # `make native`: the two built pieces, while the serving venv (which brings libcudart) may still be installing.
    print(build_libfabric(), build_cuda_stub())
