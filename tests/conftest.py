"""Shared fixtures: synthesize the real app, with cdk.json's context, once per settings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings as hypothesis_settings

from settings import project_context
from settings.project import STACK_NAME
from tools.dev.fetch_schemas import find
from tools.template_text import render

ROOT = Path(__file__).resolve().parent.parent
# What `cdk synth` reads from files (cdk.json over cdk.context.json), through the same loader as the tools.
PROJECT_CONTEXT: dict[str, Any] = project_context(ROOT)

os.environ.setdefault("CDK_DISABLE_CLI_TELEMETRY", "true")
# cfn-lint runs on the synthesized templates here (tests/test_cfn_lint.py), so the
# suite skips CDK's built-in validator, which app.py runs by default; a test
# proves it is on by default and passes.
os.environ.setdefault("CDK_VALIDATION", "false")
os.environ.pop("CDK_DEFAULT_ACCOUNT", None)
os.environ.pop("CDK_DEFAULT_REGION", None)

# CI explores the same examples every run, so a landing never depends on luck;
# local runs keep exploring new ones.
hypothesis_settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
if os.environ.get("CI") == "true":
    hypothesis_settings.load_profile("ci")

_CACHE: dict[str, dict[str, Any]] = {}


def synth(**overrides: Any) -> dict[str, Any]:
    """The synthesized CloudFormation template of the one stack, as `cdk synth` makes it."""
    key = json.dumps(overrides, sort_keys=True)
    if key not in _CACHE:
        from app import build_app  # loads aws_cdk, whose Node kernel reads CDK_VALIDATION as it starts: set above

        app, _, _ = build_app({**PROJECT_CONTEXT, **overrides})
        assembly = app.synth()
        _CACHE[key] = assembly.get_stack_by_name(STACK_NAME).template
    return _CACHE[key]


def resources(template: dict[str, Any], type_: str) -> dict[str, dict[str, Any]]:
    return {k: v for k, v in template["Resources"].items() if v["Type"] == type_}


def only(template: dict[str, Any], type_: str, **match: Any) -> dict[str, Any]:
    """The one resource of this type whose Properties contain `match`."""
    found = [
        r
        for r in resources(template, type_).values()
        if all(r.get("Properties", {}).get(k) == v for k, v in match.items())
    ]
    assert len(found) == 1, f"expected one {type_} with {match}, found {len(found)}"
    return found[0]


def manifests(template: dict[str, Any]) -> list[dict[str, Any]]:
    """Every Kubernetes object the stack applies with kubectl, decoded."""
    docs: list[dict[str, Any]] = []
    for r in resources(template, "Custom::AWSCDK-EKS-KubernetesResource").values():
        docs.extend(json.loads(render(r["Properties"]["Manifest"])))
    return docs


def manifest_resource(template: dict[str, Any], kind: str, name_prefix: str = "") -> str:
    """The logical id of the one manifest resource that applies an object of this kind (and name prefix)."""
    found = [
        logical_id
        for logical_id, r in resources(template, "Custom::AWSCDK-EKS-KubernetesResource").items()
        if any(
            doc.get("kind") == kind and doc.get("metadata", {}).get("name", "").startswith(name_prefix)
            for doc in json.loads(render(r["Properties"]["Manifest"]))
        )
    ]
    assert len(found) == 1, f"{kind}: {found}"
    return found[0]


def pod_identity_policy(template: dict[str, Any], service_account: str) -> dict[str, Any]:
    """The properties of the one IAM policy on the Pod Identity role of this service account."""
    association = only(template, "AWS::EKS::PodIdentityAssociation", ServiceAccount=service_account)
    role_id = association["Properties"]["RoleArn"]["Fn::GetAtt"][0]
    (policy,) = [
        p["Properties"]
        for p in resources(template, "AWS::IAM::Policy").values()
        if {"Ref": role_id} in p["Properties"]["Roles"]
    ]
    found: dict[str, Any] = policy
    return found


def helm_releases(template: dict[str, Any]) -> dict[str, str]:
    """Release name -> logical id of its Helm chart resource."""
    return {
        r["Properties"]["Release"]: logical_id
        for logical_id, r in resources(template, "Custom::AWSCDK-EKS-HelmChart").items()
    }


def rayservice_from(template: dict[str, Any]) -> dict[str, Any]:
    found = [m for m in manifests(template) if m.get("kind") == "RayService"]
    assert len(found) == 1
    return found[0]


@pytest.fixture(scope="session")
def template() -> dict[str, Any]:
    return synth()


@pytest.fixture(scope="session")
def rayservice(template: dict[str, Any]) -> dict[str, Any]:
    return rayservice_from(template)


def shared_file(relative: str) -> Path:
    """A file from ../shared (or .schemas/, which `make fetch-schemas` fills); a missing one fails, never skips."""
    found = find(relative)
    if found is None:
        pytest.fail(f"{relative} is in neither ../shared nor .schemas/: run `make fetch-schemas` to download it")
    return found


def require_serve_deps() -> None:
    """Skip (or, with REQUIRE_SERVE_DEPS=1 as in `make test` and CI, fail) without ray[serve,llm]."""
    try:
        import ray.serve.llm  # noqa: F401
        import vllm.config  # noqa: F401
    except ImportError as err:
        if os.environ.get("REQUIRE_SERVE_DEPS") == "1":
            pytest.fail(f"ray[serve,llm] is required here: {err}; run `make setup-serve`")
        pytest.skip(f"needs ray[serve,llm] ({err}); run `make setup-serve` or `make test`")


@pytest.fixture(scope="session")
def local_ray() -> Iterator[None]:
    """Ray's LLM builders read the runtime context, which starts Ray; start a small one once."""
    require_serve_deps()
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


def synth_leaks(secret: str, tmp_path: Path, overrides: dict[str, Any], env: dict[str, str]) -> list[str]:
    """Synth as the CLI runs app.py, with `env` in its environment; where `secret` shows (cdk.out files, output)."""
    full_env = {
        **os.environ,
        **env,
        "CDK_CONTEXT_JSON": json.dumps({**PROJECT_CONTEXT, **overrides}),
        "CDK_OUTDIR": str(tmp_path),
    }
    result = subprocess.run(
        [sys.executable, "app.py"], cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stderr
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.name.endswith(".template.json") for p in files)
    leaks = [str(p) for p in files if secret.encode() in p.read_bytes()]
    return leaks + (["the app's output"] if secret in result.stdout + result.stderr else [])
