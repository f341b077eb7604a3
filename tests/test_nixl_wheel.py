"""What the pinned NIXL wheel carries, behind the README's reason for LIBFABRIC.

The image runs CUDA 13, so NIXL's nixl-cu13 build. It bundles its own UCX, and that UCX
has an EFA transport: UCX over EFA is not simply "TCP". The transport links the
image's libefa.so.1, and UCX picks its transports itself, so where that library does
not load UCX moves the KV over TCP without a word; LIBFABRIC names the provider it
chose in NIXL's log, which verify requires to be efa.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.conftest import require_serve_deps

pytestmark = pytest.mark.serve


def _libs(package: str) -> Path:
    require_serve_deps()
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.origin is not None, f"{package} is not installed (requirements-serve.lock)"
    return Path(spec.origin).parent.parent / f"{package}.libs"


def test_the_images_nixl_bundles_ucx_with_an_efa_transport_that_needs_the_images_libefa() -> None:
    transports = sorted(p.name for p in (_libs("nixl_cu13") / "ucx").glob("libuct_ib_efa.so*"))
    assert transports, "nixl-cu13 no longer bundles UCX's EFA transport: revisit README 'How a request flows'"
    efa = _libs("nixl_cu13") / "ucx" / "libuct_ib_efa.so.0"
    # The NEEDED entries live in the dynamic string table: the transport loads only where libefa does.
    assert b"libefa.so.1\x00" in efa.read_bytes()


def test_the_images_nixl_bundles_the_libfabric_plugin_the_product_asks_for() -> None:
    plugins = [p.name for p in _libs("nixl_cu13").rglob("libplugin_*.so")]
    assert "libplugin_LIBFABRIC.so" in plugins and "libplugin_UCX.so" in plugins, plugins
