"""A NIXL engine id of its own for every start of an engine (ray_pods/nixl_incarnation.py, vllm#49238).

The rehearsal's engine-death phase shows the failure this prevents and the fix at work
(rehearsal/engine_deaths.py); these tests pin the pieces on the synthesized template,
with Ray's own config classes and Ray's own NIXL backend doing the naming.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from ray_pods.nixl_incarnation import with_incarnation
from serve_config import endpoint_keys
from tests.conftest import ROOT, manifests, rayservice_from, require_serve_deps, synth


def _llm_configs(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    args = yaml.safe_load(rayservice_from(template)["spec"]["serveConfigV2"])["applications"][0]["args"]
    if "llm_configs" in args:
        return {"aggregated": args["llm_configs"][0]}
    return {side: args[f"{side}_config"] for side in ("prefill", "decode")}


def test_the_incarnation_goes_after_the_side_and_before_rays_address() -> None:
    assert with_incarnation("prefill-10.0.1.5-20000", "a1b2c3d4") == "prefill-a1b2c3d4-10.0.1.5-20000"
    assert with_incarnation("decode", "a1b2c3d4") == "decode-a1b2c3d4"


def test_both_sides_name_the_callback_and_every_ray_pod_gets_the_code(template: dict[str, Any]) -> None:
    for side, config in _llm_configs(template).items():
        assert config["callback_config"] == {"callback_class": endpoint_keys.NIXL_INCARNATION_CALLBACK}, side
    (configmap,) = [m for m in manifests(template) if m["kind"] == "ConfigMap"]
    assert "nixl_incarnation.py" in configmap["data"]
    cluster = rayservice_from(template)["spec"]["rayClusterConfig"]
    for pod in [cluster["headGroupSpec"]["template"], *(g["template"] for g in cluster["workerGroupSpecs"])]:
        container = pod["spec"]["containers"][0]
        assert {"name": "PYTHONPATH", "value": endpoint_keys.RAY_PODS_PYTHONPATH} in container["env"]
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        assert mounts["ray-pods-code"] == f"{endpoint_keys.RAY_PODS_PYTHONPATH}/ray_pods"
        assert "api-keys" not in mounts  # no keys on the defaults


def test_aggregated_mode_names_no_callback_and_keeps_the_same_ray_cluster(template: dict[str, Any]) -> None:
    aggregated = synth(serving_mode="aggregated")
    assert "callback_config" not in _llm_configs(aggregated)["aggregated"]
    # The code is shipped all the same: a mode switch must not change (and so rebuild) the Ray cluster.
    cluster = rayservice_from(aggregated)["spec"]["rayClusterConfig"]
    assert cluster == rayservice_from(template)["spec"]["rayClusterConfig"]


# Ray's own NIXL backend names the engine, then the callback, loaded from the synthesized
# ConfigMap laid out as the kubelet mounts it, renames it; vLLM's config is built from what is left.
_PROBE = textwrap.dedent(
    """
    import asyncio, json, sys
    from ray.llm._internal.common.utils.import_utils import load_class
    from ray.serve.llm import LLMConfig

    config = LLMConfig.model_validate(json.loads(sys.argv[1]))
    config.setup_engine_backend()  # Ray 2.58: NixlConnectorBackend.setup, "<engine_id>-<host>-<port>"
    named_by_ray = config.engine_kwargs["kv_transfer_config"]["engine_id"]
    engine_config = config.get_engine_config()
    callback = load_class(config.callback_config.callback_class)(llm_config=config)
    asyncio.run(callback.run_callback("on_before_node_init"))
    print(json.dumps({
        "ray": named_by_ray,
        "vllm": engine_config.get_initialization_kwargs()["kv_transfer_config"]["engine_id"],
        "file": sys.modules[type(callback).__module__].__file__,
    }))
    """
)


@pytest.mark.parametrize("side", ["prefill", "decode"])
def test_each_start_of_an_engine_gets_a_name_no_earlier_start_had(
    side: str, template: dict[str, Any], tmp_path: Path
) -> None:
    require_serve_deps()
    (configmap,) = [m for m in manifests(template) if m["kind"] == "ConfigMap"]
    package = tmp_path / "python" / "ray_pods"
    package.mkdir(parents=True)
    for name, text in configmap["data"].items():
        (package / name).write_text(text)
    config = _llm_configs(template)[side]
    env = {
        **os.environ,
        "PYTHONPATH": str(tmp_path / "python"),
        # What Ray sets from the node's address and the replica's rank, given here without a cluster.
        "VLLM_NIXL_SIDE_CHANNEL_HOST": "10.0.1.5",
        "VLLM_NIXL_SIDE_CHANNEL_PORT": "20000",
    }
    names = []
    for _ in range(2):
        result = subprocess.run(
            [sys.executable, "-c", _PROBE, json.dumps(config)],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
        found = json.loads(result.stdout.strip().splitlines()[-1])
        assert found["file"] == str(package / "nixl_incarnation.py")
        assert found["ray"] == f"{side}-10.0.1.5-20000"
        prefix, incarnation, rest = found["vllm"].split("-", 2)
        assert (prefix, rest) == (side, "10.0.1.5-20000") and len(incarnation) == 8
        names.append(found["vllm"])
    assert names[0] != names[1]


def test_the_package_imports_only_what_the_image_has() -> None:
    source = (ROOT / "ray_pods" / "nixl_incarnation.py").read_text()
    imported = {line.split()[1].split(".")[0] for line in source.splitlines() if line.startswith(("import ", "from "))}
    assert imported <= {"__future__", "logging", "secrets", "typing", "ray"}
