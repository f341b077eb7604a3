"""The pinned Helm chart archives and the KubeRay CRD, for a clone without ../shared.

    python -m tools.dev.fetch_schemas [--if-missing]

The tests render every chart the stack installs with the real helm, and check
the RayService against KubeRay's CRD. CI and the team's machines read these
from ../shared/; a user's clone has none, so this fetches each pinned chart
from its own Helm repository (index.yaml -> the archive of that version),
checks the archive against the sha256 digest the index publishes, and caches
it in .schemas/charts/. The KubeRay CRD is taken from the KubeRay chart archive
so it is covered by the same digest. --if-missing does nothing for files that
../shared/ or .schemas/ already has (`make test` runs it that way; offline CI
fetches nothing).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import ipaddress
import sys
import tarfile
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import urljoin, urlparse

import yaml

from settings.catalog import ALL_CHARTS, KUBERAY_OPERATOR, HelmChartPin
from settings.project import ROOT

SHARED = ROOT.parent / "shared"
OUT = ROOT / ".schemas"
KUBERAY_CRD = f"kuberay-v{KUBERAY_OPERATOR.version}/ray.io_rayservices.yaml"


class FetchError(RuntimeError):
    """A file the tests need could not be fetched or did not match its published digest."""


def chart_file(pin: HelmChartPin) -> str:
    """Where a chart archive lives, relative to ../shared or .schemas."""
    return f"charts/{pin.chart}-{pin.version}.tgz"


def find(relative: str, bases: Iterable[Path] = (SHARED, OUT)) -> Path | None:
    for base in bases:
        if (base / relative).is_file():
            return base / relative
    return None


def _get(url: str) -> bytes:
    parsed = urlparse(url)
    host = parsed.hostname or ""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    # Plain http only to this machine (the tests' local repository); every real repository is https.
    if parsed.scheme != "https" and not (parsed.scheme == "http" and loopback):
        raise FetchError(f"refusing {url}: only https (or http to localhost)")
    try:
        with urllib.request.urlopen(url, timeout=60) as response:  # noqa: S310 - scheme checked above
            data: bytes = response.read()
    except OSError as err:
        raise FetchError(f"cannot fetch {url}: {err}") from None
    return data


def fetch_chart(pin: HelmChartPin, *, repository: str | None = None, out: Path = OUT) -> Path:
    """Download one pinned chart, verify it against the index's digest, and cache it under out/."""
    base = (repository or pin.repository).rstrip("/") + "/"
    index = yaml.safe_load(_get(urljoin(base, "index.yaml")))
    entries = [e for e in index.get("entries", {}).get(pin.chart, []) if str(e.get("version")) == pin.version]
    if not entries:
        raise FetchError(f"{pin.chart} {pin.version} is not in {base}index.yaml")
    entry = entries[0]
    data = _get(urljoin(base, entry["urls"][0]))
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry.get("digest"):
        raise FetchError(f"{pin.chart} {pin.version}: sha256 {digest} does not match the index's {entry.get('digest')}")
    target = out / chart_file(pin)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    return target


def chart_member(archive: Path, path: str) -> bytes:
    """One file from a chart archive, e.g. kuberay-operator/crds/ray.io_rayservices.yaml."""
    with tarfile.open(fileobj=io.BytesIO(archive.read_bytes()), mode="r:gz") as tar:
        member = tar.extractfile(path)
        if member is None:
            raise FetchError(f"{path} is not a file in {archive}")
        return member.read()


def extract_kuberay_crd(archive: Path, out: Path = OUT) -> Path:
    target = out / KUBERAY_CRD
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(chart_member(archive, f"{KUBERAY_OPERATOR.chart}/crds/ray.io_rayservices.yaml"))
    return target


def ensure(*, if_missing: bool, out: Path = OUT, bases: Iterable[Path] = (SHARED, OUT)) -> list[Path]:
    """Every chart archive and the KubeRay CRD, fetched where missing; the paths written."""
    bases = tuple(bases)
    written = []
    for pin in ALL_CHARTS:
        if if_missing and find(chart_file(pin), bases):
            continue
        written.append(fetch_chart(pin, out=out))
    if not (if_missing and find(KUBERAY_CRD, bases)):
        archive = find(chart_file(KUBERAY_OPERATOR), (*bases, out))
        if archive is None:
            raise FetchError(f"no {chart_file(KUBERAY_OPERATOR)} to take the CRD from")
        written.append(extract_kuberay_crd(archive, out))
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--if-missing", action="store_true", help="fetch only what ../shared and .schemas lack")
    args = parser.parse_args(argv)
    try:
        written = ensure(if_missing=args.if_missing)
    except FetchError as err:
        print(f"error: {err}; the tests need these files (../shared/ or .schemas/)", file=sys.stderr)
        return 1
    for path in written:
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
