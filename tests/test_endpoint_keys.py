"""API keys on the OpenAI endpoint: the settings, what the template carries, and the key check itself.

The key check is tested through Ray 2.58's own FastAPI ingress (``init`` and
``make_fastapi_ingress``, as the builder makes it), with only the model
deployment's handle answered here; the rehearsal runs it with real engines.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

import app as cdk_app
import serve_config
from rehearsal.keys import write_like_the_kubelet
from serve_config import endpoint_keys
from settings import SettingsError, settings_from
from tests.conftest import (
    PROJECT_CONTEXT,
    ROOT,
    manifest_resource,
    manifests,
    pod_identity_policy,
    rayservice_from,
    require_serve_deps,
    synth,
    synth_leaks,
)
from tests.support.template_graph import depends_on
from tools.template_text import render

pytestmark = pytest.mark.private_internals

KEYS = {"endpoint_api_keys_secret_name": "prod/llm-keys"}
# The keys alone in the External Secrets role and manifests (the GCS store's token: tests/test_gcs_store.py).
KEYS_ONLY = {**KEYS, "gcs_fault_tolerance": "false"}
NLB = {"internal_endpoint_cidrs": "10.0.0.0/8"}
CERT = "arn:aws:acm:us-east-1:123456789012:certificate/11111111-2222-3333-4444-555555555555"
serve = pytest.mark.serve
one_ray = pytest.mark.xdist_group("ray")


def _app_args(template: dict[str, Any]) -> dict[str, Any]:
    args: dict[str, Any] = yaml.safe_load(rayservice_from(template)["spec"]["serveConfigV2"])["applications"][0]["args"]
    return args


def _pods(template: dict[str, Any]) -> list[dict[str, Any]]:
    cluster = rayservice_from(template)["spec"]["rayClusterConfig"]
    return [cluster["headGroupSpec"]["template"], *(g["template"] for g in cluster["workerGroupSpecs"])]


# --- Settings -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("overrides", "key", "allowed"),
    [
        ({"endpoint_api_keys_secret_name": "bad name!"}, "endpoint_api_keys_secret_name", "a Secrets Manager secret"),
        (
            {"endpoint_api_keys_secret_name": "prod/hf", "hf_token_secret_name": "prod/hf"},
            "endpoint_api_keys_secret_name",
            "another secret than hf_token_secret_name",
        ),
        ({"endpoint_api_keys_refresh_seconds": 14}, "endpoint_api_keys_refresh_seconds", "15 to 86400"),
        ({"endpoint_api_keys_refresh_seconds": 86401}, "endpoint_api_keys_refresh_seconds", "15 to 86400"),
        ({"endpoint_rate_limit_rpm": -1}, "endpoint_rate_limit_rpm", "0 to 1000000 requests per minute"),
        ({"endpoint_rate_limit_rpm": 60}, "endpoint_rate_limit_rpm", "unless endpoint_api_keys_secret_name is set"),
        (
            {**NLB, "endpoint_tls_certificate_arn": "arn:aws:acm:us-east-1:1:cert"},
            "endpoint_tls_certificate_arn",
            "ACM",
        ),
        ({"endpoint_tls_certificate_arn": CERT}, "endpoint_tls_certificate_arn", "only with internal_endpoint_cidrs"),
    ],
    ids=["name", "same-as-token", "refresh-low", "refresh-high", "rpm-negative", "rpm-without-keys", "arn", "no-nlb"],
)
def test_a_bad_key_setting_ends_synth_in_one_line(overrides: dict[str, Any], key: str, allowed: str) -> None:
    with pytest.raises(SettingsError) as raised:
        settings_from({**PROJECT_CONTEXT, **overrides})
    assert raised.value.key == key
    assert allowed in str(raised.value)
    assert "\n" not in str(raised.value)


def test_the_boundaries_of_the_refresh_interval_are_accepted() -> None:
    for seconds in (15, 86400):
        settings_from({**PROJECT_CONTEXT, **KEYS, "endpoint_api_keys_refresh_seconds": seconds})


def test_an_nlb_without_keys_warns_in_one_line_and_port_forward_alone_does_not() -> None:
    open_nlb = [w for w in cdk_app.warnings(settings_from({**PROJECT_CONTEXT, **NLB})) if "NLB" in w]
    assert len(open_nlb) == 1 and "endpoint_api_keys_secret_name" in open_nlb[0] and "\n" not in open_nlb[0]
    for quiet in ({**NLB, **KEYS}, {}):
        assert not [w for w in cdk_app.warnings(settings_from({**PROJECT_CONTEXT, **quiet})) if "NLB" in w]


# --- What the template carries ----------------------------------------------------------------
@pytest.mark.parametrize("mode", ["disaggregated", "aggregated"])
def test_on_the_defaults_the_products_ingress_serves_without_keys_and_no_key_is_mounted(mode: str) -> None:
    """Ray's own OpenAiIngress lets a client's headers turn off Serve's timeout and hang-up cancel: the
    product's ingress serves on the defaults too, with its deadline and no keys file."""
    template = synth(serving_mode=mode, request_timeout_seconds=900)
    assert _app_args(template)["ingress_cls_config"] == {
        "ingress_cls": "ray_pods.api_keys:ApiKeyIngress",
        "ingress_extra_kwargs": {"request_timeout_s": 900, "code_digest": endpoint_keys.ray_pods_digest()},
    }
    # The one ExternalSecret is the GCS store's token.
    synced = [m["spec"]["target"]["name"] for m in manifests(template) if m["kind"] == "ExternalSecret"]
    assert synced == [serve_config.GCS_STORE_SECRET]
    for pod in _pods(template):
        assert "api-keys" not in {v["name"] for v in pod["spec"].get("volumes", [])}
        assert "ray-pods-code" in {v["name"] for v in pod["spec"].get("volumes", [])}


@pytest.mark.parametrize("mode", ["disaggregated", "aggregated"])
def test_the_serve_config_names_the_key_ingress_with_the_mounted_file(mode: str) -> None:
    args = _app_args(synth(**KEYS, serving_mode=mode, endpoint_rate_limit_rpm=120, request_timeout_seconds=900))
    assert args["ingress_cls_config"] == {
        "ingress_cls": "ray_pods.api_keys:ApiKeyIngress",
        "ingress_extra_kwargs": {
            "keys_file": "/etc/pd-inference/api-keys/keys.json",
            "request_timeout_s": 900,
            "requests_per_minute": 120,
            "prefill_header_keys": [],
            "code_digest": endpoint_keys.ray_pods_digest(),
        },
    }


def test_the_keys_allowed_the_route_header_reach_the_ingress_and_only_with_keys_in_pd_mode() -> None:
    args = _app_args(synth(**KEYS, pd_prefill_header_keys="ops,verify"))
    assert args["ingress_cls_config"]["ingress_extra_kwargs"]["prefill_header_keys"] == ["ops", "verify"]
    for overrides in ({}, {**KEYS, "serving_mode": "aggregated"}):
        with pytest.raises(SettingsError) as raised:
            settings_from({**PROJECT_CONTEXT, **overrides, "pd_prefill_header_keys": "ops"})
        assert raised.value.key == "pd_prefill_header_keys" and "\n" not in str(raised.value)


def test_external_secrets_syncs_the_keys_with_the_interval_setting() -> None:
    template = synth(**KEYS_ONLY, endpoint_api_keys_refresh_seconds=90)
    (external,) = [m for m in manifests(template) if m["kind"] == "ExternalSecret"]
    assert external["metadata"] == {**external["metadata"], "name": "endpoint-api-keys", "namespace": "llm"}
    assert external["spec"]["refreshInterval"] == "90s"
    assert external["spec"]["target"]["name"] == endpoint_keys.API_KEYS_SECRET
    assert external["spec"]["data"] == [{"secretKey": "keys.json", "remoteRef": {"key": "prod/llm-keys"}}]
    (statement,) = pod_identity_policy(template, "external-secrets")["PolicyDocument"]["Statement"]
    assert render(statement["Resource"]).endswith(":secret:prod/llm-keys-??????")


def test_token_and_keys_share_one_operator_and_the_tokens_ids_do_not_move() -> None:
    both = synth(**KEYS_ONLY, hf_token_secret_name="prod/hf-token")
    token_only = synth(hf_token_secret_name="prod/hf-token", gcs_fault_tolerance="false")
    assert sorted(m["spec"]["refreshInterval"] for m in manifests(both) if m["kind"] == "ExternalSecret") == [
        "1h",
        "1m",
    ]
    releases = [r for r in both["Resources"].values() if r["Properties"].get("Release") == "external-secrets"]
    assert len(releases) == 1
    # Every resource a token-only stack has keeps its logical id when keys are added.
    assert set(token_only["Resources"]) - set(both["Resources"]) == set()
    (statement,) = pod_identity_policy(both, "external-secrets")["PolicyDocument"]["Statement"]
    readable = sorted(render(arn).rsplit(":secret:", 1)[1] for arn in statement["Resource"])
    assert readable == ["prod/hf-token-??????", "prod/llm-keys-??????"]


def test_every_ray_pod_mounts_the_code_and_the_keys_whole_and_imports_from_there() -> None:
    template = synth(**KEYS)
    for pod in _pods(template):
        spec, container = pod["spec"], pod["spec"]["containers"][0]
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert volumes["ray-pods-code"]["configMap"] == {"name": "ray-pods-code"}
        assert volumes["api-keys"]["secret"] == {"secretName": "endpoint-api-keys"}
        mounts = {m["name"]: m for m in container["volumeMounts"]}
        # A subPath mount is never refreshed by the kubelet: rotation would need a restart.
        assert mounts["api-keys"] == {"name": "api-keys", "mountPath": "/etc/pd-inference/api-keys", "readOnly": True}
        assert mounts["ray-pods-code"]["mountPath"] == "/opt/pd-inference/python/ray_pods"
        assert "subPath" not in mounts["ray-pods-code"]
        assert {"name": "PYTHONPATH", "value": "/opt/pd-inference/python"} in container["env"]
        assert pod["metadata"]["annotations"][endpoint_keys.RAY_PODS_CODE_ANNOTATION] == endpoint_keys.ray_pods_digest()


def test_the_configmap_carries_exactly_the_ray_pods_package() -> None:
    (configmap,) = [m for m in manifests(synth(**KEYS)) if m["kind"] == "ConfigMap"]
    on_disk = {p.name: p.read_text() for p in sorted((ROOT / "ray_pods").glob("*.py"))}
    assert configmap["data"] == on_disk
    assert {"__init__.py", "api_keys.py"} <= set(on_disk)
    assert configmap["metadata"]["name"] == "ray-pods-code"
    assert len(json.dumps(configmap["data"]).encode()) < 1024 * 1024  # a ConfigMap's limit


def test_the_rayservice_waits_for_the_keys_and_the_code() -> None:
    template = synth(**KEYS)
    rayservice = manifest_resource(template, "RayService")
    assert depends_on(template, rayservice, manifest_resource(template, "ExternalSecret", "endpoint-api-keys"))
    assert depends_on(template, rayservice, manifest_resource(template, "ConfigMap"))
    assert depends_on(template, manifest_resource(template, "ConfigMap"), manifest_resource(template, "Namespace"))


def test_a_certificate_makes_the_nlb_listen_with_tls_on_443_only() -> None:
    (service,) = [
        m
        for m in manifests(synth(**KEYS, **NLB, endpoint_tls_certificate_arn=CERT))
        if m["kind"] == "Service" and m["spec"]["type"] == "LoadBalancer"
    ]
    annotations = service["metadata"]["annotations"]
    assert annotations["service.beta.kubernetes.io/aws-load-balancer-ssl-cert"] == CERT
    assert annotations["service.beta.kubernetes.io/aws-load-balancer-ssl-ports"] == "443"
    assert annotations["service.beta.kubernetes.io/aws-load-balancer-ssl-negotiation-policy"].startswith(
        "ELBSecurityPolicy-TLS13"
    )
    assert service["spec"]["ports"] == [{"name": "serve-tls", "port": 443, "targetPort": 8000, "protocol": "TCP"}]
    (plain,) = [
        m for m in manifests(synth(**KEYS, **NLB)) if m["kind"] == "Service" and m["spec"]["type"] == "LoadBalancer"
    ]
    assert plain["spec"]["ports"] == [{"name": "serve", "port": 8000, "targetPort": 8000, "protocol": "TCP"}]
    assert not [a for a in plain["metadata"]["annotations"] if "ssl" in a]


def test_the_curl_example_sends_the_key() -> None:
    example = synth(**KEYS)["Outputs"]["ChatCompletionExample"]
    assert '-H "Authorization: Bearer $OPENAI_API_KEY"' in example["Value"]
    assert "prod/llm-keys" in example["Description"]
    assert "Authorization" not in synth()["Outputs"]["ChatCompletionExample"]["Value"]


def test_no_key_reaches_the_template_or_cdk_out(tmp_path: Path) -> None:
    """Synth as the CLI runs it, with a key in the environment a user might have: no file in cdk.out holds it."""
    key = "sk-" + "Xq9" * 16  # made up here
    assert synth_leaks(key, tmp_path, {**KEYS, **NLB}, {"OPENAI_API_KEY": key}) == []


# --- Ray accepts it, and the pods can import it -------------------------------------------------
@serve
@one_ray
@pytest.mark.parametrize("keys", [True, False], ids=["keys", "defaults"])
@pytest.mark.parametrize("mode", ["disaggregated", "aggregated"])
def test_rays_builders_put_the_products_ingress_in_front(
    mode: str, keys: bool, local_ray: None, tmp_path: Path
) -> None:
    from ray.serve._private.build_app import build_app
    from ray.serve.llm import build_openai_app, build_pd_openai_app
    from ray.serve.schema import ServeDeploySchema

    from ray_pods.api_keys import ApiKeyIngress  # imports ray: make test-fast runs without it

    doc = yaml.safe_load(rayservice_from(synth(**(KEYS if keys else {}), serving_mode=mode))["spec"]["serveConfigV2"])
    ServeDeploySchema.model_validate(doc)
    (app,) = doc["applications"]
    args = app["args"]
    keys_file = tmp_path / "keys.json"
    keys_file.write_text(json.dumps({"a": "k" * 32}))
    if keys:
        args["ingress_cls_config"]["ingress_extra_kwargs"]["keys_file"] = str(keys_file)
    builder = build_pd_openai_app if mode == "disaggregated" else build_openai_app
    built = build_app(builder(args), name="llm")
    (ingress,) = [d for d in built.deployments if d.name == built.ingress_deployment_name]
    assert issubclass(ingress._replica_config.deployment_def, ApiKeyIngress)
    init_kwargs = ingress._replica_config.init_kwargs
    assert init_kwargs.get("keys_file") == (str(keys_file) if keys else None)
    assert init_kwargs["request_timeout_s"] == settings_from(PROJECT_CONTEXT).request_timeout_seconds
    # Serve applies the app's `deployments` by name, and refuses one the builder did not make.
    assert ingress.name in {d["name"] for d in app["deployments"]}


@serve
def test_the_configmap_alone_is_importable_as_the_pods_import_it(tmp_path: Path) -> None:
    """Lay the synthesized ConfigMap out as the kubelet does, on PYTHONPATH, and load the class with Ray's loader."""
    require_serve_deps()
    (configmap,) = [m for m in manifests(synth(**KEYS)) if m["kind"] == "ConfigMap"]
    package = tmp_path / "python" / "ray_pods"
    package.mkdir(parents=True)
    for name, text in configmap["data"].items():
        (package / name).write_text(text)
    probe = textwrap.dedent(
        """
        import inspect, json, sys
        from ray.llm._internal.common.utils.import_utils import load_class
        cls = load_class(sys.argv[1])
        print(json.dumps({"file": inspect.getfile(cls), "bases": [b.__name__ for b in cls.__mro__]}))
        """
    )
    path = endpoint_keys.ingress_cls_config(settings_from({**PROJECT_CONTEXT, **KEYS}))["ingress_cls"]
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "python")}
    result = subprocess.run(
        [sys.executable, "-c", probe, path], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found["file"] == str(package / "api_keys.py")
    assert "OpenAiIngress" in found["bases"]


@serve
def test_direct_streaming_would_refuse_the_key_ingress_and_nothing_turns_it_on() -> None:
    require_serve_deps()
    from ray.llm._internal.serve.core.ingress.builder import IngressClsConfig, _validate_direct_streaming_ingress_config

    config = IngressClsConfig.model_validate({"ingress_cls": "ray_pods.api_keys:ApiKeyIngress"})
    with pytest.raises(ValueError, match="RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING"):
        _validate_direct_streaming_ingress_config(None, config)
    template = synth(**KEYS)
    text = json.dumps(rayservice_from(template))
    assert "RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING" not in text


# --- The key check, through Ray's own FastAPI ingress ------------------------------------------
MODEL = "Qwen/Qwen3-8B"
GOOD, OTHER = "good-key-" + "a" * 24, "other-key-" + "b" * 24


class FakeModelHandle:
    """Stands in for the decode deployment's handle: answers every call with one error the test can see."""

    def __init__(self) -> None:
        self.calls = 0
        self.cancelled = 0
        self.sent: list[tuple[Any, ...]] = []
        # What the model's call raises instead of answering (a replica's death reaches the ingress this way).
        self.raises: Exception | None = None

    def options(self, **_: Any) -> FakeModelHandle:
        return self

    def __getattr__(self, method: str) -> Any:
        handle = self

        class Remote:
            def remote(self, *args: Any) -> FakeCall:
                handle.calls += 1
                handle.sent.append(args)
                return FakeCall(handle)

        return Remote()

    async def _answer(self) -> AsyncIterator[Any]:
        from ray.llm._internal.serve.core.configs.openai_api_models import ErrorInfo, ErrorResponse

        if self.raises is not None:
            raise self.raises
        yield ErrorResponse(error=ErrorInfo(message="the model answered", type="test", code=418))


class FakeCall:
    """What a handle call returns: the answer's chunks, and cancel() as Serve's DeploymentResponseGenerator has it."""

    def __init__(self, handle: FakeModelHandle) -> None:
        self._handle = handle
        self._chunks = handle._answer()

    def __aiter__(self) -> FakeCall:
        return self

    async def __anext__(self) -> Any:
        return await self._chunks.__anext__()

    def cancel(self) -> None:
        self._handle.cancelled += 1


@contextlib.contextmanager
def _serving(cls: Any, monkeypatch: pytest.MonkeyPatch, **kwargs: Any) -> Iterator[SimpleNamespace]:
    """An ingress class as Ray's builder routes it (init, make_fastapi_ingress), its instance made with kwargs."""
    require_serve_deps()
    from fastapi.testclient import TestClient
    from ray import serve as ray_serve
    from ray.llm._internal.serve.core.configs.openai_api_models import ModelCard
    from ray.llm._internal.serve.core.ingress.ingress import init, make_fastapi_ingress

    app = init()
    make_fastapi_ingress(cls, app=app)
    handle = FakeModelHandle()
    card = ModelCard(id=MODEL, object="model", owned_by="test", permission=[], metadata={})
    instance = cls({MODEL: handle}, {MODEL: card}, **kwargs)
    # What Ray's class-based view asks for each request: the replica's own instance.
    monkeypatch.setattr(ray_serve, "get_replica_context", lambda: SimpleNamespace(servable_object=instance))
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(self.format(record))

    keep = Keep()
    logging.getLogger("ray.serve").addHandler(keep)
    try:
        with TestClient(app) as client:
            yield SimpleNamespace(client=client, handle=handle, records=records, app=app, instance=instance)
    finally:
        logging.getLogger("ray.serve").removeHandler(keep)


@pytest.fixture
def ingress(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SimpleNamespace]:
    """The product's ingress with keys: a keys file of one key, GOOD."""
    require_serve_deps()
    from ray_pods.api_keys import ApiKeyIngress  # imports ray: make test-fast runs without it

    keys_dir = tmp_path / "api-keys"
    keys_dir.mkdir()
    keys_file = write_like_the_kubelet(keys_dir, {"team-a": GOOD}, 1)
    with _serving(ApiKeyIngress, monkeypatch, keys_file=str(keys_file), request_timeout_s=600) as served:
        yield SimpleNamespace(**vars(served), keys_dir=keys_dir, auth=_auth(GOOD))


def _defaults_ingress() -> tuple[Any, dict[str, Any]]:
    """The ingress class and kwargs Ray's builder takes from the defaults' serve config (its own
    IngressClsConfig; with none named, Ray's OpenAiIngress)."""
    require_serve_deps()
    from ray.llm._internal.serve.core.ingress.builder import IngressClsConfig

    config = IngressClsConfig.model_validate(_app_args(synth()).get("ingress_cls_config") or {})
    return config.ingress_cls, dict(config.ingress_extra_kwargs)


@pytest.fixture
def open_ingress(monkeypatch: pytest.MonkeyPatch) -> Iterator[SimpleNamespace]:
    """The ingress of the defaults' serve config (keys off), as Ray's builder makes it; its callers send no key."""
    cls, kwargs = _defaults_ingress()
    with _serving(cls, monkeypatch, **kwargs) as served:
        yield SimpleNamespace(**vars(served), auth={})


@pytest.fixture(params=["keys", "defaults"])
def any_ingress(request: pytest.FixtureRequest) -> SimpleNamespace:
    """The product's ingress with keys (its callers send the key) and on the defaults (they send none)."""
    found: SimpleNamespace = request.getfixturevalue("ingress" if request.param == "keys" else "open_ingress")
    return found


CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_no_key_and_a_wrong_key_get_401_in_openais_shape(ingress: SimpleNamespace) -> None:
    for headers in ({}, _auth(OTHER), {"Authorization": GOOD}, {"Authorization": "Basic " + GOOD}):
        response = ingress.client.post("/v1/chat/completions", json=CHAT, headers=headers)
        assert response.status_code == 401, headers
        assert response.headers["www-authenticate"] == "Bearer"
        error = response.json()["error"]
        assert error["code"] == "invalid_api_key" and error["type"] == "invalid_request_error"
        assert "team-a" not in response.text and GOOD not in response.text
    assert ingress.handle.calls == 0


def test_the_right_key_reaches_the_model_streaming_or_not(ingress: SimpleNamespace) -> None:
    assert ingress.client.get("/v1/models", headers=_auth(GOOD)).json()["data"][0]["id"] == MODEL
    for stream in (False, True):
        response = ingress.client.post("/v1/chat/completions", json={**CHAT, "stream": stream}, headers=_auth(GOOD))
        assert response.status_code == 418, response.text  # the fake model's own answer: the request got through
    assert ingress.handle.calls == 2


# A well-formed request for each of Ray's nine routes (FastAPI validates the body before the route runs).
WELL_FORMED: dict[str, dict[str, Any]] = {
    "models": {},
    "model_data": {},
    "completions": {"json": {"model": MODEL, "prompt": "hi"}},
    "chat": {"json": CHAT},
    "embeddings": {"json": {"model": MODEL, "input": "hi"}},
    "transcriptions": {"data": {"model": MODEL}, "files": {"file": ("a.wav", b"RIFF0000WAVE", "audio/wav")}},
    "score": {"json": {"model": MODEL, "text_1": "a", "text_2": "b"}},
    "tokenize": {"json": {"model": MODEL, "prompt": "hi"}},
    "detokenize": {"json": {"model": MODEL, "tokens": [1, 2]}},
}


def _routes(app: Any) -> dict[str, tuple[str, str]]:
    from ray.llm._internal.serve.core.ingress.ingress import DEFAULT_ENDPOINTS

    return {
        route.endpoint.__name__: (route.path.replace("{model:path}", MODEL), sorted(route.methods)[0])
        for route in app.routes
        if getattr(route, "endpoint", None) is not None and route.endpoint.__name__ in DEFAULT_ENDPOINTS
    }


def test_every_route_of_rays_ingress_refuses_a_caller_without_a_key(ingress: SimpleNamespace) -> None:
    routes = _routes(ingress.app)
    assert set(routes) == set(WELL_FORMED)
    for name, (path, method) in routes.items():
        response = ingress.client.request(method, path, **WELL_FORMED[name])
        assert response.status_code == 401, (name, response.status_code, response.text[:200])
        with_key = ingress.client.request(method, path, headers=_auth(GOOD), **WELL_FORMED[name])
        assert with_key.status_code != 401, name
    assert ingress.handle.calls == 7  # every route but the two model listings reached the model


def test_on_the_defaults_every_route_admits_every_caller_as_rays_own_ingress_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Keys off: no caller is refused (no 401, no 503 for a missing keys file), on every route, and each
    gets what Ray's own OpenAiIngress gives it; a key sent is ignored, as Ray ignores it."""
    from ray.llm._internal.serve.core.ingress.ingress import OpenAiIngress

    callers: list[dict[str, str]] = [{}, _auth(OTHER), {"Authorization": "Basic " + GOOD}]

    def answers(cls: Any, **kwargs: Any) -> tuple[dict[tuple[str, int], tuple[int, bool]], int]:
        found = {}
        with _serving(cls, monkeypatch, **kwargs) as served:
            for name, (path, method) in _routes(served.app).items():
                for index, headers in enumerate(callers):
                    response = served.client.request(method, path, headers=headers, **WELL_FORMED[name])
                    found[(name, index)] = (response.status_code, "www-authenticate" in response.headers)
            return found, served.handle.calls

    cls, kwargs = _defaults_ingress()
    products, product_calls = answers(cls, **kwargs)
    rays, ray_calls = answers(OpenAiIngress)
    assert set(products) == {(name, index) for name in WELL_FORMED for index in range(len(callers))}
    assert products == rays
    assert not [key for key, (status, challenge) in products.items() if status in (401, 503) or challenge]
    assert product_calls == ray_calls == 7 * len(callers)  # every route but the two model listings, each caller


def test_the_key_is_checked_before_the_body_is_read(ingress: SimpleNamespace) -> None:
    """A JSON route parses its own body, after the key: a bad body without a key is a 401, not a 400."""
    for body in ({"model": MODEL}, "{not json"):
        kwargs: dict[str, Any] = {"json": body} if isinstance(body, dict) else {"content": body}
        response = ingress.client.post("/v1/chat/completions", headers={"Content-Type": "application/json"}, **kwargs)
        assert response.status_code == 401, response.text
    assert ingress.handle.calls == 0


def test_a_bad_body_with_the_key_is_an_openai_400_naming_the_field(ingress: SimpleNamespace) -> None:
    response = ingress.client.post("/v1/chat/completions", json={"model": MODEL}, headers=_auth(GOOD))
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_parameter" and "messages" in error["message"]
    malformed = ingress.client.post(
        "/v1/chat/completions", content=b'{"model": "', headers={**_auth(GOOD), "Content-Type": "application/json"}
    )
    assert malformed.status_code == 400 and malformed.json()["error"]["code"] == "invalid_parameter"
    assert ingress.handle.calls == 0


def test_a_body_that_is_not_json_is_a_415_not_rays_500(ingress: SimpleNamespace) -> None:
    """Ray 2.58 answers a text/plain body with 500: its validation handler cannot serialize the raw bytes."""
    body = json.dumps(CHAT)
    for content_type in ("text/plain", "application/x-www-form-urlencoded"):
        headers = {**_auth(GOOD), "Content-Type": content_type}
        response = ingress.client.post("/v1/chat/completions", content=body, headers=headers)
        assert response.status_code == 415, (content_type, response.text)
        assert response.json()["error"]["code"] == "unsupported_media_type"
    charset = {**_auth(GOOD), "Content-Type": "application/json; charset=utf-8"}
    assert ingress.client.post("/v1/chat/completions", content=body, headers=charset).status_code == 418
    assert ingress.handle.calls == 1


def test_an_unknown_model_is_openais_model_not_found(ingress: SimpleNamespace) -> None:
    response = ingress.client.post("/v1/chat/completions", json={**CHAT, "model": "no/such"}, headers=_auth(GOOD))
    assert response.status_code == 404
    error = response.json()["error"]
    assert error["code"] == "model_not_found" and "no/such" in error["message"]
    assert ingress.handle.calls == 0


def test_a_rotated_file_refuses_the_old_key_and_admits_the_new_without_a_restart(ingress: SimpleNamespace) -> None:
    assert ingress.client.get("/v1/models", headers=_auth(GOOD)).status_code == 200
    write_like_the_kubelet(ingress.keys_dir, {"team-b": OTHER}, 2)
    assert ingress.client.get("/v1/models", headers=_auth(GOOD)).status_code == 401
    assert ingress.client.get("/v1/models", headers=_auth(OTHER)).status_code == 200


def test_an_unreadable_keys_file_refuses_everyone(ingress: SimpleNamespace) -> None:
    target = ingress.keys_dir / "..bad"
    target.mkdir()
    (target / "keys.json").write_text("{not json")
    (ingress.keys_dir / "..tmp").symlink_to(target.name)
    os.replace(ingress.keys_dir / "..tmp", ingress.keys_dir / "..data")
    response = ingress.client.get("/v1/models", headers=_auth(GOOD))
    assert response.status_code == 503 and response.json()["error"]["code"] == "keys_unavailable"


SHORT = "short-key"  # under MIN_KEY_LENGTH


@pytest.mark.parametrize("rotated", [{}, {"team-c": SHORT, "team-d": "x" * 15}], ids=["empty", "all-too-short"])
def test_a_rotation_to_no_usable_key_refuses_every_caller_with_503(
    ingress: SimpleNamespace, rotated: dict[str, str]
) -> None:
    """A Secret rotated to `{}` or to keys all too short must not leave the old keys, or the short ones, working."""
    assert ingress.client.get("/v1/models", headers=_auth(GOOD)).status_code == 200
    write_like_the_kubelet(ingress.keys_dir, rotated, 2)
    callers: list[dict[str, str]] = [{}, _auth(GOOD), _auth(OTHER), *(_auth(key) for key in rotated.values())]
    for headers in callers:
        for method, path, kwargs in (("GET", "/v1/models", {}), ("POST", "/v1/chat/completions", {"json": CHAT})):
            response = ingress.client.request(method, path, headers=headers, **kwargs)
            assert response.status_code == 503, (headers, path, response.status_code)
            assert response.json()["error"]["code"] == "keys_unavailable"
    assert ingress.handle.calls == 0
    assert any("no usable API key" in record for record in ingress.records)


def test_a_key_past_its_rate_gets_429_with_retry_after(ingress: SimpleNamespace) -> None:
    from ray_pods.api_keys import RateLimit  # imports ray: make test-fast runs without it

    ingress.instance._limit = RateLimit(3)
    codes = [ingress.client.get("/v1/models", headers=_auth(GOOD)).status_code for _ in range(4)]
    assert codes == [200, 200, 200, 429]
    response = ingress.client.get("/v1/models", headers=_auth(GOOD))
    assert 1 <= int(response.headers["retry-after"]) <= 60
    assert response.json()["error"]["code"] == "rate_limit_exceeded"


def test_logs_name_the_key_id_and_never_a_key(ingress: SimpleNamespace) -> None:
    ingress.client.get("/v1/models", headers=_auth(GOOD))
    ingress.client.get("/v1/models", headers=_auth(OTHER))
    text = "\n".join(ingress.records)
    assert "key id team-a" in text
    assert "unknown key sha256:" in text
    assert GOOD not in text and OTHER not in text


def test_no_refusal_logs_the_key_it_was_shown(ingress: SimpleNamespace) -> None:
    """Every refusal the ingress makes, each with a key in the request: none may reach a log record."""
    from ray_pods.api_keys import RateLimit  # imports ray: make test-fast runs without it

    chat = "/v1/chat/completions"
    statuses = [
        ingress.client.post(chat, json=CHAT).status_code,
        ingress.client.post(chat, json=CHAT, headers=_auth(OTHER)).status_code,
        ingress.client.post(chat, json={"model": MODEL}, headers=_auth(GOOD)).status_code,
        ingress.client.post(chat, json={**CHAT, "model": "no/such"}, headers=_auth(GOOD)).status_code,
        ingress.client.post(
            chat, content=json.dumps(CHAT), headers={**_auth(GOOD), "Content-Type": "text/plain"}
        ).status_code,
    ]
    ingress.instance._limit = RateLimit(1)
    statuses += [ingress.client.get("/v1/models", headers=_auth(GOOD)).status_code for _ in range(2)]
    write_like_the_kubelet(ingress.keys_dir, {}, 2)
    statuses.append(ingress.client.post(chat, json=CHAT, headers=_auth(GOOD)).status_code)
    assert statuses == [401, 401, 400, 404, 415, 200, 429, 503]
    assert ingress.records, "nothing was logged: the test would prove nothing"
    for key in (GOOD, OTHER):
        leaked = [record for record in ingress.records if key in record]
        assert not leaked, leaked


def test_the_replica_refuses_to_start_without_a_usable_key(tmp_path: Path) -> None:
    require_serve_deps()
    from ray_pods.api_keys import ApiKeyIngress  # imports ray: make test-fast runs without it

    for content in ("", "[]", json.dumps({"short": "abc"})):
        path = tmp_path / "keys.json"
        path.write_text(content)
        with pytest.raises(ValueError, match="no usable API key"):
            ApiKeyIngress({}, {}, keys_file=str(path), request_timeout_s=600)


def test_the_rate_window_slides() -> None:
    require_serve_deps()
    from ray_pods.api_keys import RateLimit  # imports ray: make test-fast runs without it

    now = [0.0]
    limit = RateLimit(2, clock=lambda: now[0])
    assert [limit.retry_after("k") for _ in range(3)] == [0, 0, 60]
    now[0] = 59.5
    assert limit.retry_after("k") == 1
    now[0] = 60.0
    assert limit.retry_after("k") == 0
    assert limit.retry_after("other") == 0


class DyingStreamHandle(FakeModelHandle):
    """Decode's handle when its replica dies mid-stream (its node went away): two chunks, then Ray's error."""

    def __init__(self, texts: tuple[str, ...] = ("Once", " upon")) -> None:
        super().__init__()
        self.texts = texts

    async def _answer(self) -> AsyncIterator[Any]:
        from ray.exceptions import ActorUnavailableError
        from ray.llm._internal.serve.core.configs.openai_api_models import ChatCompletionStreamResponse

        for text in self.texts:
            yield ChatCompletionStreamResponse.model_validate(
                {"id": "c", "created": 0, "model": MODEL, "choices": [{"index": 0, "delta": {"content": text}}]}
            )
        raise ActorUnavailableError("The actor is temporarily unavailable: RpcError: Socket closed", None)


def test_a_stream_cut_by_a_dying_replica_ends_with_an_error_event_not_a_silent_end(
    any_ingress: SimpleNamespace,
) -> None:
    """Measured in the rehearsal's node-loss phase: without this, the client saw a 200 that ended quietly."""
    any_ingress.instance._default_serve_handles[MODEL] = DyingStreamHandle()
    response = any_ingress.client.post("/v1/chat/completions", json={**CHAT, "stream": True}, headers=any_ingress.auth)
    assert response.status_code == 200
    events = [line[len("data: ") :] for line in response.text.splitlines() if line.startswith("data: ")]
    contents = [json.loads(e)["choices"][0]["delta"].get("content") for e in events[:-1]]
    assert contents == ["Once", " upon"]
    assert "[DONE]" not in events
    assert json.loads(events[-1])["error"]["code"] == "stream_interrupted"
    assert any("cut: ActorUnavailableError" in record for record in any_ingress.records)


@pytest.mark.parametrize("token", ["[DONE]", "data: [DONE]", "data: [DONE]\n\n"])
def test_a_generated_done_token_does_not_hide_a_later_cut(any_ingress: SimpleNamespace, token: str) -> None:
    """The model may write "[DONE]" itself; only the packet Ray's wrapper ends a stream with is its end."""
    any_ingress.instance._default_serve_handles[MODEL] = DyingStreamHandle(("Once", token))
    response = any_ingress.client.post("/v1/chat/completions", json={**CHAT, "stream": True}, headers=any_ingress.auth)
    events = [line[len("data: ") :] for line in response.text.split("\n\n") if line.startswith("data: ")]
    assert "error" in json.loads(events[-1]), f"the cut stream ended silently: {events[-1]}"
    assert json.loads(events[-1])["error"]["code"] == "stream_interrupted"
    assert [json.loads(e)["choices"][0]["delta"].get("content") for e in events[:-1]] == ["Once", token]


class StreamingHandle(FakeModelHandle):
    """Decode's handle streaming `count` chunks (None: for ever), one every `interval` s, then ending."""

    def __init__(self, count: int | None, interval: float = 0.0, first_after: float = 0.0) -> None:
        super().__init__()
        self.count, self.interval, self.first_after = count, interval, first_after

    async def _answer(self) -> AsyncIterator[Any]:
        import asyncio
        import itertools

        from ray.llm._internal.serve.core.configs.openai_api_models import ChatCompletionStreamResponse

        await asyncio.sleep(self.first_after)
        for index in itertools.count() if self.count is None else range(self.count):
            yield ChatCompletionStreamResponse.model_validate(
                {"id": "c", "created": 0, "model": MODEL, "choices": [{"index": 0, "delta": {"content": f"t{index}"}}]}
            )
            await asyncio.sleep(self.interval)


def _events(text: str) -> list[str]:
    return [line[len("data: ") :] for line in text.split("\n\n") if line.startswith("data: ")]


def test_a_stream_that_ends_normally_gets_no_error_event_and_nothing_is_cancelled(any_ingress: SimpleNamespace) -> None:
    any_ingress.instance._default_serve_handles[MODEL] = handle = StreamingHandle(2)
    response = any_ingress.client.post("/v1/chat/completions", json={**CHAT, "stream": True}, headers=any_ingress.auth)
    events = _events(response.text)
    assert events[-1] == "[DONE]" and len(events) == 3, events
    assert handle.cancelled == 0


# What a caller sends Serve's proxy to keep a stream past its timeout and past a hang-up (Ray 2.58
# serve/_private/http_util.py): the ingress must hold its own deadline whatever they say.
OUTLIVE_THE_DRAIN = {"x-request-timeout-seconds": "0", "x-request-disconnect-disabled": "?1"}


def test_a_stream_ends_at_the_request_timeout_with_an_error_event_and_the_model_call_cancelled(
    any_ingress: SimpleNamespace,
) -> None:
    import time

    # 15 s of chunks: without a deadline of its own the ingress would stream them all.
    any_ingress.instance._default_serve_handles[MODEL] = handle = StreamingHandle(300, interval=0.05)
    any_ingress.instance._timeout_s = 1.0
    started = time.monotonic()
    response = any_ingress.client.post(
        "/v1/chat/completions", json={**CHAT, "stream": True}, headers={**any_ingress.auth, **OUTLIVE_THE_DRAIN}
    )
    took = time.monotonic() - started
    assert response.status_code == 200 and 1.0 <= took < 10, took
    events = _events(response.text)
    assert len(events) > 2 and "[DONE]" not in events
    error = json.loads(events[-1])["error"]
    assert error["code"] == "request_timeout" and "1 s" in error["message"], error
    assert handle.cancelled == 1


def test_no_first_token_within_the_request_timeout_is_an_openai_408_and_the_call_is_cancelled(
    any_ingress: SimpleNamespace,
) -> None:
    any_ingress.instance._default_serve_handles[MODEL] = handle = StreamingHandle(1, first_after=30)
    any_ingress.instance._timeout_s = 0.5
    for stream in (True, False):
        response = any_ingress.client.post(
            "/v1/chat/completions", json={**CHAT, "stream": stream}, headers={**any_ingress.auth, **OUTLIVE_THE_DRAIN}
        )
        assert response.status_code == 408, response.text
        assert response.json()["error"]["code"] == "request_timeout"
    assert handle.cancelled == 2


# --- What a client may not send, keys on or off ----------------------------------------------------------
@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"kv_transfer_params": {"do_remote_decode": True}}, "kv_transfer_params"),
        ({"kv_transfer_params": {"do_remote_prefill": True, "remote_host": "127.0.0.1", "remote_port": 1}}, None),
        ({"kv_transfer_params": {}}, "kv_transfer_params"),
        ({"ec_transfer_params": {"x": 1}}, "ec_transfer_params"),
        ({"vllm_xargs": {"kv_transfer_params": "x"}}, "vllm_xargs.kv_transfer_params"),
    ],
    ids=["remote-decode", "remote-prefill", "empty", "ec", "xargs"],
)
def test_a_clients_kv_transfer_params_is_an_openai_400_and_reaches_no_model(
    any_ingress: SimpleNamespace, fields: dict[str, Any], param: str | None
) -> None:
    """On decode's local path vLLM would act on them: pin blocks for a remote reader, or pull from the address
    named. Refused at the ingress, keys on and off, chat and completion."""
    for path, body in (("/v1/chat/completions", CHAT), ("/v1/completions", {"model": MODEL, "prompt": "hi"})):
        response = any_ingress.client.post(path, json={**body, **fields}, headers=any_ingress.auth)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error" and error["param"] == (param or "kv_transfer_params")
    assert any_ingress.handle.calls == 0
    # null is what every client sends when it does not set it.
    response = any_ingress.client.post(
        "/v1/chat/completions", json={**CHAT, "kv_transfer_params": None}, headers=any_ingress.auth
    )
    assert response.status_code == 418, response.text


ALLOWED, NOT_ALLOWED = "ops-key-" + "c" * 24, "team-key-" + "d" * 24


@pytest.fixture
def header_ingress(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SimpleNamespace]:
    """The product's ingress with two keys, one of them allowed the route header."""
    require_serve_deps()
    from ray_pods.api_keys import ApiKeyIngress  # imports ray: make test-fast runs without it

    keys_file = write_like_the_kubelet(tmp_path / "api-keys", {"ops": ALLOWED, "team": NOT_ALLOWED}, 1)
    with _serving(
        ApiKeyIngress, monkeypatch, keys_file=str(keys_file), request_timeout_s=600, prefill_header_keys=["ops"]
    ) as served:
        yield served


def test_the_route_header_is_a_403_unless_the_key_is_allowed_it(header_ingress: SimpleNamespace) -> None:
    from ray_pods.api_keys import PREFILL_ROUTE_HEADER  # imports ray: make test-fast runs without it

    route = {PREFILL_ROUTE_HEADER: "local"}
    response = header_ingress.client.post("/v1/chat/completions", json=CHAT, headers={**_auth(NOT_ALLOWED), **route})
    assert response.status_code == 403 and response.json()["error"]["code"] == "header_not_allowed", response.text
    assert header_ingress.handle.calls == 0
    # The same key without the header, and the allowed key with it, reach the model; the header goes on to decode.
    for headers in (_auth(NOT_ALLOWED), {**_auth(ALLOWED), **route}):
        assert header_ingress.client.post("/v1/chat/completions", json=CHAT, headers=headers).status_code == 418
    assert [args[1].headers.get(PREFILL_ROUTE_HEADER) for args in header_ingress.handle.sent] == [None, "local"]


def test_without_keys_nobody_may_send_the_route_header(open_ingress: SimpleNamespace) -> None:
    from ray_pods.api_keys import PREFILL_ROUTE_HEADER  # imports ray: make test-fast runs without it

    for value in ("local", "split", "anything"):
        response = open_ingress.client.post("/v1/chat/completions", json=CHAT, headers={PREFILL_ROUTE_HEADER: value})
        assert response.status_code == 403, response.text
    assert open_ingress.handle.calls == 0


def test_the_header_the_ingress_gates_is_the_one_decode_reads() -> None:
    require_serve_deps()
    from ray_pods.api_keys import PREFILL_ROUTE_HEADER  # imports ray: make test-fast runs without it
    from ray_pods.selective_pd import ROUTE_HEADER  # imports ray: make test-fast runs without it

    assert PREFILL_ROUTE_HEADER == ROUTE_HEADER


def test_the_ingress_refuses_allowed_header_keys_without_keys() -> None:
    require_serve_deps()
    from ray_pods.api_keys import ApiKeyIngress  # imports ray: make test-fast runs without it

    with pytest.raises(ValueError, match="prefill_header_keys needs keys_file"):
        ApiKeyIngress({}, {}, request_timeout_s=60, prefill_header_keys=["ops"])


INTERNAL = "ray::ServeReplica:llm:Decode:Qwen--Qwen3-8B.chat() (pid=4242, ip=10.1.2.3, actor_id=abcdef0123456789)"


def test_an_exception_from_the_model_reaches_the_client_without_the_replicas_actor_pid_or_ip(
    any_ingress: SimpleNamespace,
) -> None:
    """Ray's own answer to an exception carries its text (get_response_for_error: 'original exception')."""
    any_ingress.handle.raises = RuntimeError(INTERNAL)
    for stream in (False, True):
        response = any_ingress.client.post(
            "/v1/chat/completions", json={**CHAT, "stream": stream}, headers=any_ingress.auth
        )
        assert response.status_code == 500, response.text
        assert response.json()["error"]["code"] == "internal_error"
        for detail in ("pid=", "10.1.2.3", "actor_id", "ServeReplica"):
            assert detail not in response.text
    assert any("10.1.2.3" in line for line in any_ingress.records), "the replica's log keeps the detail"


def test_a_models_client_error_reaches_the_client_with_its_own_message_only(any_ingress: SimpleNamespace) -> None:
    response = any_ingress.client.post("/v1/chat/completions", json=CHAT, headers=any_ingress.auth)
    assert response.status_code == 418
    assert response.json()["error"]["message"] == "the model answered"


def test_serves_queue_bound_refusal_is_left_to_serves_handler_with_its_retry_after() -> None:
    """Serve adds handlers for these to the ingress app (replica.py, service_unavailable_exceptions): a 503 with
    Retry-After (backpressure_retry_after_seconds). Made a 500 here, a client would retry at once."""
    require_serve_deps()
    from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError

    from ray_pods.client_input import answered  # imports ray: make test-fast runs without it

    for err in (
        BackPressureError(num_queued_requests=9, max_queued_requests=8, retry_after_s=10),
        DeploymentUnavailableError("x"),
    ):

        async def refused(err: Exception = err) -> None:
            raise err

        with pytest.raises(type(err)):
            asyncio.run(answered(refused()))
