"""The rehearsal's endpoint-key pieces: what prepare changes in the product, and the kubelet-style key file."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import yaml

from rehearsal import keys
from rehearsal.case_settings import CASE_SETTINGS
from rehearsal.cases import CASE_PHASES
from rehearsal.checks import verify_checks
from rehearsal.context import Setup
from rehearsal.deploy import product_worker_env
from rehearsal.native import Libraries
from tests.conftest import manifests, rayservice_from, synth


def _setup(tmp_path: Path) -> tuple[Setup, list[dict[str, Any]], dict[str, Any], dict[str, str]]:
    template = synth(**keys.KEY_SETTINGS)
    rayservice = rayservice_from(template)
    config = yaml.safe_load(rayservice["spec"]["serveConfigV2"])
    env = product_worker_env(rayservice)
    libs = Libraries(libfabric_dir="", stub_dir="", cudart_dir="")
    return Setup("pd", copy.deepcopy(config), dict(env), libs, tmp_path), manifests(template), config, env


def test_prepare_changes_exactly_the_documented_key_deltas(tmp_path: Path) -> None:
    setup, docs, product_config, product_env = _setup(tmp_path)
    assert product_env["PYTHONPATH"] == "/opt/pd-inference/python"
    made = keys.prepare(setup, docs)
    assert made is not None
    before = product_config["applications"][0]["args"]["ingress_cls_config"]["ingress_extra_kwargs"]
    after = setup.config["applications"][0]["args"]["ingress_cls_config"]["ingress_extra_kwargs"]
    changed = {f"ingress_cls_config.ingress_extra_kwargs.{k}" for k in before if before[k] != after[k]}
    changed |= {f"env {k}" for k in product_env if product_env[k] != setup.env[k]}
    assert changed == set(keys.KEY_DELTAS)
    others = copy.deepcopy(setup.config)
    others["applications"][0]["args"]["ingress_cls_config"]["ingress_extra_kwargs"]["keys_file"] = before["keys_file"]
    assert others == product_config
    # The package the pods would mount, byte for byte, on the Ray processes' PYTHONPATH.
    (configmap,) = [d for d in docs if d["kind"] == "ConfigMap"]
    package = Path(setup.env["PYTHONPATH"]) / "ray_pods"
    assert {p.name: p.read_text() for p in package.iterdir()} == configmap["data"]
    assert json.loads(Path(after["keys_file"]).read_text()) == {"team-a": made.current}


def test_prepare_gives_a_product_without_keys_its_code_and_nothing_else(tmp_path: Path) -> None:
    rayservice = rayservice_from(synth())
    config = yaml.safe_load(rayservice["spec"]["serveConfigV2"])
    setup = Setup("pd", copy.deepcopy(config), {}, Libraries(libfabric_dir="", stub_dir="", cudart_dir=""), tmp_path)
    assert keys.prepare(setup, manifests(synth())) is None
    # The NIXL callback is the product's code on every P/D deployment, with or without keys.
    assert setup.config == config and setup.env == {"PYTHONPATH": str(tmp_path / "python")}
    assert (tmp_path / "python" / "ray_pods" / "nixl_incarnation.py").is_file()


def test_the_key_file_is_swapped_as_the_kubelet_swaps_a_secret_volume(tmp_path: Path) -> None:
    path = keys.write_like_the_kubelet(tmp_path, {"a": "1" * 20}, 1)
    first = os.stat(path).st_ino
    keys.write_like_the_kubelet(tmp_path, {"b": "2" * 20}, 2)
    assert os.readlink(path) == "..data/keys.json" and (tmp_path / "..data").is_symlink()
    assert json.loads(path.read_text()) == {"b": "2" * 20}
    assert os.stat(path).st_ino != first


def test_the_serving_cases_check_keys_before_verify_and_scan_the_logs_last() -> None:
    for case in ("pd", "aggregated"):
        assert keys.KEY_SETTINGS.items() <= CASE_SETTINGS[case].items()
        phases = CASE_PHASES[case]
        assert phases.index(keys.key_checks) < phases.index(verify_checks)
        assert phases[-1] is keys.key_log_scan
