"""The CPU rehearsal's own pieces: the delta set it applies, and how it gets libfabric's source.

The rehearsal itself runs in `make rehearse` (serially, outside pytest's workers).
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from rehearsal import native
from rehearsal.deploy import CPU_DELTAS, cpu_serve_config, kuberay_auth_env, kuberay_headers, product_worker_env
from tests.conftest import shared_file


def _paths(old: Any, new: Any, prefix: str = "") -> set[str]:
    """Dotted paths where new differs from old; list items are compared element-wise as []."""
    if isinstance(old, dict) and isinstance(new, dict):
        found: set[str] = set()
        for key in set(old) | set(new):
            where = f"{prefix}.{key}" if prefix else str(key)
            if key in old and key in new:
                found |= _paths(old[key], new[key], where)
            elif isinstance(new.get(key), dict):
                found |= _paths({}, new[key], where)  # every leaf that was added
            else:
                found.add(where)
        return found
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return {p for a, b in zip(old, new, strict=True) for p in _paths(a, b, f"{prefix}[]")}
    return set() if old == new else {prefix}


def test_the_rehearsal_changes_exactly_the_documented_cpu_deltas(rayservice: dict[str, Any]) -> None:
    """Any other change to the product's serve config flows into the rehearsal unchanged."""
    product = yaml.safe_load(rayservice["spec"]["serveConfigV2"])
    cpu = cpu_serve_config(rayservice, Path("/models/tiny"))
    changed: set[str] = set()
    for before, after in zip(product["applications"], cpu["applications"], strict=True):
        for key in before["args"]:
            changed |= _paths(before["args"][key], after["args"][key])
        assert {k: v for k, v in before.items() if k != "args"} == {k: v for k, v in after.items() if k != "args"}
    assert changed == set(CPU_DELTAS)
    args = cpu["applications"][0]["args"]
    # The product's own NIXL setup is untouched.
    for side in ("prefill", "decode"):
        kv = args[f"{side}_config"]["engine_kwargs"]["kv_transfer_config"]
        assert kv["kv_connector_extra_config"]["backends"] == ["LIBFABRIC"]
        assert kv["kv_buffer_device"] == "cpu" and kv["engine_id"] == side
        assert args[f"{side}_config"]["placement_group_config"]["bundles"] == [{"CPU": 4, side: 1}]


def test_the_rehearsal_uses_the_workers_environment(rayservice: dict[str, Any]) -> None:
    env = product_worker_env(rayservice)
    assert env["NIXL_LOG_LEVEL"] == "INFO" and env["FI_EFA_USE_HUGE_PAGE"] == "0"
    assert env["FI_PROVIDER"] == "efa"  # the rehearsal replaces this one with tcp


def test_the_rehearsal_runs_ray_as_kuberay_does_with_token_authentication(rayservice: dict[str, Any]) -> None:
    """authOptions mode token: RAY_AUTH_MODE and a random token on every node, and KubeRay's header on each call."""
    env = kuberay_auth_env(rayservice)
    assert env["RAY_AUTH_MODE"] == "token"
    assert len(env["RAY_AUTH_TOKEN"]) == 64 and env["RAY_AUTH_TOKEN"] != kuberay_auth_env(rayservice)["RAY_AUTH_TOKEN"]
    assert kuberay_headers(env) == {"x-ray-authorization": f"Bearer {env['RAY_AUTH_TOKEN']}"}
    without = {**rayservice, "spec": {**rayservice["spec"], "rayClusterConfig": {}}}
    assert kuberay_auth_env(without) == {} and kuberay_headers({}) == {}


def test_debian_mirrors_are_read_from_apt_sources(tmp_path: Path) -> None:
    (tmp_path / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm\n\n"
        "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\n"
    )
    (tmp_path / "extra.list").write_text("deb https://other.example/debian bookworm main\n")
    assert native.apt_debian_mirrors(tmp_path) == ["http://mirror.example/debian", "https://other.example/debian"]


@contextlib.contextmanager
def _serve(root: Path) -> Iterator[str]:
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *args: None  # type: ignore[attr-defined]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/debian"
    finally:
        server.shutdown()
        server.server_close()


def test_libfabric_source_is_fetched_from_a_mirror_and_digest_checked(tmp_path: Path) -> None:
    tarball = shared_file(f"sources/{native.LIBFABRIC_TARBALL}")
    pool = tmp_path / "mirror" / "debian" / Path(native.DEBIAN_POOL_PATH).parent
    pool.mkdir(parents=True)
    (pool / native.LIBFABRIC_TARBALL).write_bytes(tarball.read_bytes())
    with _serve(tmp_path / "mirror") as mirror:
        fetched = native.fetch_libfabric_source(tmp_path / "out" / native.LIBFABRIC_TARBALL, [mirror])
    assert fetched.read_bytes() == tarball.read_bytes()


def test_a_libfabric_source_with_another_digest_is_refused(tmp_path: Path) -> None:
    pool = tmp_path / "mirror" / "debian" / Path(native.DEBIAN_POOL_PATH).parent
    pool.mkdir(parents=True)
    (pool / native.LIBFABRIC_TARBALL).write_bytes(b"not libfabric")
    with _serve(tmp_path / "mirror") as mirror, pytest.raises(native.NativeError, match="sha256"):
        native.fetch_libfabric_source(tmp_path / "out" / native.LIBFABRIC_TARBALL, [mirror])
    assert not (tmp_path / "out").exists()
