"""Download the pinned KubeRay CRD and the charts' default values into .schemas/.

The tests read these from ../shared/ where it exists (CI, the team's machines);
a user's clone has no ../shared, so this fetches the same files from each pinned
chart's own Helm repository (index.yaml -> the chart archive of that version).
"""

from __future__ import annotations

import io
import sys
import tarfile
import urllib.request
from pathlib import Path
from urllib.parse import urljoin

import yaml

from settings.catalog import EFA_DEVICE_PLUGIN, KUBERAY_OPERATOR, NVIDIA_DEVICE_PLUGIN, HelmChartPin

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / ".schemas"


def _get(url: str) -> bytes:
    if not url.startswith("https://"):
        raise ValueError(f"refusing non-https URL {url}")
    with urllib.request.urlopen(url, timeout=60) as response:  # noqa: S310 - https only, checked above
        data: bytes = response.read()
        return data


def chart_archive(pin: HelmChartPin) -> tarfile.TarFile:
    index = yaml.safe_load(_get(urljoin(pin.repository.rstrip("/") + "/", "index.yaml")))
    (entry,) = [e for e in index["entries"][pin.chart] if e["version"] == pin.version]
    url = urljoin(pin.repository.rstrip("/") + "/", entry["urls"][0])
    return tarfile.open(fileobj=io.BytesIO(_get(url)), mode="r:gz")


def member(archive: tarfile.TarFile, path: str) -> bytes:
    file = archive.extractfile(path)
    if file is None:
        raise FileNotFoundError(path)
    return file.read()


def main() -> int:
    for pin in (KUBERAY_OPERATOR, NVIDIA_DEVICE_PLUGIN, EFA_DEVICE_PLUGIN):
        archive = chart_archive(pin)
        target = OUT / "helm-values" / f"{pin.chart}-{pin.version}.values.yaml"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(member(archive, f"{pin.chart}/values.yaml"))
        print(f"wrote {target.relative_to(ROOT)}")
        if pin is KUBERAY_OPERATOR:
            crd = OUT / f"kuberay-v{pin.version}" / "ray.io_rayservices.yaml"
            crd.parent.mkdir(parents=True, exist_ok=True)
            crd.write_bytes(member(archive, f"{pin.chart}/crds/ray.io_rayservices.yaml"))
            print(f"wrote {crd.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
