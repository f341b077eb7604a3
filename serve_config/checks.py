"""Checks on the RayService that neither Ray, vLLM nor KubeRay make.

Run at synth (app.py refuses a RayService with problems) and in the tests.
"""

from __future__ import annotations

import json
from typing import Any

import yaml

from serve_config import SIDES

REQUIRED_BACKENDS = ["LIBFABRIC"]


def _kv(config: dict[str, Any]) -> dict[str, Any]:
    kv: dict[str, Any] = config.get("engine_kwargs", {}).get("kv_transfer_config") or {}
    return kv


def kuberay_resources(raw: str) -> dict[str, float]:
    """rayStartParams.resources parsed the way KubeRay 1.7.0 parses it (common/pod.go, getResourcesMap):
    strip surrounding quotes, backticks and spaces, then a strict JSON object. Raises ValueError."""
    parsed = json.loads(raw.strip("'\"` "))
    if not isinstance(parsed, dict) or not all(isinstance(v, (int, float)) for v in parsed.values()):
        raise ValueError(f"not a JSON object of numbers: {raw!r}")
    return {str(k): float(v) for k, v in parsed.items()}


def _advertised(group: dict[str, Any]) -> dict[str, float]:
    """Custom resources a worker group advertises through rayStartParams.resources."""
    raw = group.get("rayStartParams", {}).get("resources")
    try:
        return kuberay_resources(raw) if raw else {}
    except ValueError:
        return {}  # reported on its own by problems()


def _aggregated_problems(configs: list[dict[str, Any]]) -> list[str]:
    """Aggregated mode: no KV transfer, and bundles any worker group can hold."""
    found = []
    for config in configs:
        name = config.get("model_loading_config", {}).get("model_id")
        if _kv(config):
            found.append(f"aggregated {name}: kv_transfer_config is set; aggregated replicas transfer no KV")
        bundles = config.get("placement_group_config", {}).get("bundles", [])
        pinned = sorted({k for b in bundles for k in b if k not in ("CPU", "GPU", "memory")})
        if pinned:
            found.append(f"aggregated {name}: bundles ask for {pinned}, which pins replicas to one worker group")
    return found


def problems(rayservice: dict[str, Any]) -> list[str]:
    """Every way the RayService breaks disaggregation over NIXL/LIBFABRIC; empty when sound."""
    found: list[str] = []
    spec = rayservice["spec"]
    groups = spec["rayClusterConfig"].get("workerGroupSpecs", [])
    for app in yaml.safe_load(spec["serveConfigV2"])["applications"]:
        args = app.get("args", {})
        if "llm_configs" in args:
            found += _aggregated_problems(args["llm_configs"])
            continue
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
    for group in groups:
        raw = group.get("rayStartParams", {}).get("resources")
        try:
            kuberay_resources(raw or "{}")
        except ValueError:
            found.append(
                f"worker group {group.get('groupName')}: rayStartParams.resources {raw!r} fails KubeRay's parse"
            )
        low, count, high = group.get("minReplicas", 0), group.get("replicas"), group.get("maxReplicas")
        if count is None or high is None or not low <= count <= high:
            found.append(f"worker group {group.get('groupName')}: replicas {count} not within [{low}, {high}]")
    return found
