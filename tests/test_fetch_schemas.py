"""A clone without ../shared fetches the pinned charts from Helm repositories and checks their digests.

This machine reaches no Helm repository, so a local HTTP server plays one: an
index.yaml in Helm's format and the same archives the tests use.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from settings.catalog import ALL_CHARTS, KUBERAY_OPERATOR, HelmChartPin
from tests.support.helm import chart_archive
from tools.dev import fetch_schemas
from tools.dev.fetch_schemas import KUBERAY_CRD, FetchError, chart_file


@contextlib.contextmanager
def helm_repository(root: Path, *, corrupt: str | None = None) -> Iterator[str]:
    """Serve root/ over http on a free loopback port, with an index.yaml of every pinned chart."""
    entries: dict[str, list[dict[str, object]]] = {}
    for pin in ALL_CHARTS:
        archive = root / f"{pin.chart}-{pin.version}.tgz"
        archive.write_bytes(chart_archive(pin).read_bytes())
        digest = hashlib.sha256(archive.read_bytes()).hexdigest()
        if pin.chart == corrupt:
            digest = "0" * 64
        entries[pin.chart] = [{"version": pin.version, "urls": [archive.name], "digest": digest}]
    (root / "index.yaml").write_text(yaml.safe_dump({"apiVersion": "v1", "entries": entries}))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *args: None  # type: ignore[attr-defined]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def _pointed_at(url: str) -> list[HelmChartPin]:
    return [HelmChartPin(p.chart, url, p.version, p.release, p.namespace) for p in ALL_CHARTS]


def test_fetch_verifies_digests_and_fills_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo, out = tmp_path / "repo", tmp_path / "schemas"
    repo.mkdir()
    with helm_repository(repo) as url:
        monkeypatch.setattr(fetch_schemas, "ALL_CHARTS", tuple(_pointed_at(url)))
        monkeypatch.setattr(
            fetch_schemas, "KUBERAY_OPERATOR", next(p for p in _pointed_at(url) if p.chart == KUBERAY_OPERATOR.chart)
        )
        written = fetch_schemas.ensure(if_missing=True, out=out, bases=(tmp_path / "no-shared", out))
    assert sorted(p.relative_to(out).as_posix() for p in written) == sorted(
        [chart_file(p) for p in ALL_CHARTS] + [KUBERAY_CRD]
    )
    for pin in ALL_CHARTS:
        assert (out / chart_file(pin)).read_bytes() == chart_archive(pin).read_bytes()
    assert yaml.safe_load((out / KUBERAY_CRD).read_text())["spec"]["names"]["kind"] == "RayService"
    # A second run finds everything cached and fetches nothing.
    assert fetch_schemas.ensure(if_missing=True, out=out, bases=(tmp_path / "no-shared", out)) == []


def test_a_digest_mismatch_fails(tmp_path: Path) -> None:
    with helm_repository(tmp_path, corrupt=KUBERAY_OPERATOR.chart) as url, pytest.raises(FetchError, match="sha256"):
        fetch_schemas.fetch_chart(KUBERAY_OPERATOR, repository=url, out=tmp_path / "out")
    assert not (tmp_path / "out" / chart_file(KUBERAY_OPERATOR)).exists()


def test_an_unreachable_repository_fails(tmp_path: Path) -> None:
    with pytest.raises(FetchError, match="cannot fetch"):
        fetch_schemas.fetch_chart(KUBERAY_OPERATOR, repository="http://127.0.0.1:9/", out=tmp_path)
    with pytest.raises(FetchError, match="only https"):
        fetch_schemas.fetch_chart(KUBERAY_OPERATOR, repository="http://example.com/", out=tmp_path)
