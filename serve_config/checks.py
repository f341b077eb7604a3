"""Checks on the RayService that neither Ray, vLLM nor KubeRay make.

Run at synth (app.py refuses a RayService with problems) and in the tests.
"""

from __future__ import annotations

import json
from typing import Any

import yaml

REQUIRED_BACKENDS = ["LIBFABRIC"]
# The two sides; each is also the name of its worker group and its custom resource.
PREFILL, DECODE = "prefill", "decode"
SIDES: tuple[str, str] = (PREFILL, DECODE)


def _kv(config: dict[str, Any]) -> dict[str, Any]:
    kv: dict[str, Any] = config.get("engine_kwargs", {}).get("kv_transfer_config") or {}
    return kv


def _advertised(group: dict[str, Any]) -> dict[str, float]:
    """Custom resources a worker group advertises through rayStartParams.resources."""
    raw = group.get("rayStartParams", {}).get("resources")
    if not raw:
        return {}
    text = json.loads(raw) if raw.startswith('"') else raw
    resources: dict[str, float] = json.loads(text)
    return resources


def problems(rayservice: dict[str, Any]) -> list[str]:
    """Every way the RayService breaks disaggregation over NIXL/LIBFABRIC; empty when sound."""
    found: list[str] = []
    spec = rayservice["spec"]
    groups = spec["rayClusterConfig"].get("workerGroupSpecs", [])
    for app in yaml.safe_load(spec["serveConfigV2"])["applications"]:
        args = app.get("args", {})
        sides = {side: args.get(f"{side}_config", {}) for side in SIDES}
        for side, config in sides.items():
            kv = _kv(config)
            backends = kv.get("kv_connector_extra_config", {}).get("backends")
            if backends != REQUIRED_BACKENDS:
                found.append(f"{side}: kv_connector_extra_config.backends is {backends}, must be {REQUIRED_BACKENDS}")
            if kv.get("kv_connector") != "NixlConnector":
                found.append(f"{side}: kv_connector is {kv.get('kv_connector')!r}, must be 'NixlConnector'")
            bundles = config.get("placement_group_config", {}).get("bundles", [])
            for resource in {k for b in bundles for k in b if k not in ("CPU", "GPU", "memory")}:
                advertisers = [g["groupName"] for g in groups if resource in _advertised(g)]
                if len(advertisers) != 1:
                    found.append(
                        f"{side}: bundle resource {resource!r} is advertised by {advertisers or 'no'} worker "
                        "group(s), must be exactly one"
                    )
            if not bundles or not any(set(b) - {"CPU", "GPU", "memory"} for b in bundles):
                found.append(f"{side}: placement bundles carry no custom resource to pin the side to a worker group")
        engine_ids = [_kv(c).get("engine_id") for c in sides.values()]
        if len(set(engine_ids)) != len(engine_ids):
            found.append(f"engine ids {engine_ids} must be distinct")
        block_sizes = [c.get("engine_kwargs", {}).get("block_size") for c in sides.values()]
        if len(set(block_sizes)) != 1 or block_sizes[0] is None:
            found.append(f"block_size {block_sizes} must be set and equal on both sides")
    for group in groups:
        low, count, high = group.get("minReplicas", 0), group.get("replicas"), group.get("maxReplicas")
        if count is None or high is None or not low <= count <= high:
            found.append(f"worker group {group.get('groupName')}: replicas {count} not within [{low}, {high}]")
    return found
