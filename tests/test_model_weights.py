"""Weights from the user's own S3 prefix: the Pod Identity role's scope, the pods' ServiceAccount, Ray's builder."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdk_constructs.gpu_nodes import gpu_toleration
from serve_config import pod_templates
from settings import Settings, catalog
from tests.conftest import (
    manifest_resource,
    manifests,
    only,
    pod_identity_policy,
    rayservice_from,
    require_serve_deps,
    resources,
    synth,
)
from tests.support.template_graph import depends_on
from tools.template_text import render

pytestmark = pytest.mark.private_internals

S3 = {"model_source": "s3://acme-models/approved/qwen3-8b"}


def reader_policy(template: dict[str, Any]) -> list[dict[str, Any]]:
    association = only(template, "AWS::EKS::PodIdentityAssociation", ServiceAccount="ray-model-reader")
    assert association["Properties"]["Namespace"] == "llm"
    statements: list[dict[str, Any]] = pod_identity_policy(template, "ray-model-reader")["PolicyDocument"]["Statement"]
    return statements


def test_the_role_reads_the_prefix_and_nothing_wider() -> None:
    statements = reader_policy(synth(**S3))
    by_action = {s["Action"]: s for s in statements}
    assert sorted(by_action) == ["s3:GetObject", "s3:ListBucket"]
    get = by_action["s3:GetObject"]
    assert render(get["Resource"]) == "arn:${AWS::Partition}:s3:::acme-models/approved/qwen3-8b/*"
    assert "Condition" not in get
    listing = by_action["s3:ListBucket"]
    assert render(listing["Resource"]) == "arn:${AWS::Partition}:s3:::acme-models"
    assert listing["Condition"] == {"StringLike": {"s3:prefix": ["approved/qwen3-8b/", "approved/qwen3-8b/*"]}}
    assert all(s["Effect"] == "Allow" for s in statements)


def test_the_rayservice_waits_for_the_association_and_its_policy() -> None:
    """Pods admitted before the association exists never get credentials, and Ray's S3 download only logs a failure.

    The Pod Identity webhook injects the credentials at admission: the RayService
    must come after the ServiceAccount, the association, the role and its policy.
    """
    template = synth(**S3)
    rayservice = manifest_resource(template, "RayService")
    (association,) = [
        k
        for k, r in resources(template, "AWS::EKS::PodIdentityAssociation").items()
        if r["Properties"]["ServiceAccount"] == "ray-model-reader"
    ]
    role = template["Resources"][association]["Properties"]["RoleArn"]["Fn::GetAtt"][0]
    (policy,) = [
        k for k, p in resources(template, "AWS::IAM::Policy").items() if {"Ref": role} in p["Properties"]["Roles"]
    ]
    account = manifest_resource(template, "ServiceAccount", name_prefix="ray-model-reader")
    for needed in (association, policy, role, account):
        assert depends_on(template, rayservice, needed), needed


def test_every_ray_pod_runs_as_the_reader_service_account() -> None:
    template = synth(**S3)
    (account,) = [
        m for m in manifests(template) if m["kind"] == "ServiceAccount" and m["metadata"]["name"] == "ray-model-reader"
    ]
    assert account["metadata"]["namespace"] == "llm"
    cluster = rayservice_from(template)["spec"]["rayClusterConfig"]
    pods = [cluster["headGroupSpec"]["template"]["spec"]] + [g["template"]["spec"] for g in cluster["workerGroupSpecs"]]
    assert [p.get("serviceAccountName") for p in pods] == ["ray-model-reader"] * 4  # head, prefill, decode, ingress


def test_a_hugging_face_source_gets_no_s3_access(template: dict[str, Any]) -> None:
    assert not [
        r
        for r in resources(template, "AWS::EKS::PodIdentityAssociation").values()
        if r["Properties"]["ServiceAccount"] == "ray-model-reader"
    ]
    cluster = rayservice_from(template)["spec"]["rayClusterConfig"]
    assert "serviceAccountName" not in cluster["headGroupSpec"]["template"]["spec"]


@pytest.mark.serve
def test_ray_reads_an_s3_source_as_a_cloud_mirror() -> None:
    """Ray's own LLMConfig and engine config accept the S3 source and turn it into a bucket mirror."""
    require_serve_deps()
    from ray.llm._internal.serve.engines.vllm.vllm_models import VLLMEngineConfig
    from ray.serve.llm import LLMConfig

    doc = yaml.safe_load(rayservice_from(synth(**S3))["spec"]["serveConfigV2"])
    for key in ("prefill_config", "decode_config"):
        llm = LLMConfig.model_validate(doc["applications"][0]["args"][key])
        engine = VLLMEngineConfig.from_llm_config(llm)
        assert engine.hf_model_id == "Qwen/Qwen3-8B"
        assert engine.mirror_config is not None
        assert engine.mirror_config.bucket_uri == "s3://acme-models/approved/qwen3-8b"


@pytest.mark.serve
def test_a_streaming_load_format_would_hand_vllm_the_model_id_not_the_s3_prefix() -> None:
    """Why the product does not stream weights with Run:ai's streamer (docs/hardware-and-models.md): with
    load_format runai_streamer, Ray 2.58 skips the node's download (llm_config.py get_or_create_callback,
    STREAMING_LOAD_FORMATS), yet its engine config still makes the S3 source a mirror and passes vLLM the
    model id, a Hugging Face name (vllm_models.py from_llm_config, get_initialization_kwargs; vllm_engine.py
    resolves it to a local path only where a download put one). vLLM would stream from the Hub, not the
    user's bucket. When a Ray upgrade passes the prefix through, this fails: then offer the streamer."""
    require_serve_deps()
    from ray.llm._internal.common.utils.download_utils import STREAMING_LOAD_FORMATS, get_model_location_on_disk
    from ray.serve.llm import LLMConfig

    doc = yaml.safe_load(rayservice_from(synth(**S3))["spec"]["serveConfigV2"])
    for key in ("prefill_config", "decode_config"):
        config = doc["applications"][0]["args"][key]
        config["engine_kwargs"]["load_format"] = "runai_streamer"
        llm = LLMConfig.model_validate(config)
        assert llm.engine_kwargs["load_format"] in STREAMING_LOAD_FORMATS
        engine = llm.get_engine_config()
        # Nothing was downloaded, so the lookup vllm_engine.py makes finds no local copy.
        assert get_model_location_on_disk(engine.actual_hf_model_id) == "Qwen/Qwen3-8B"
        assert engine.get_initialization_kwargs()["model"] == "Qwen/Qwen3-8B"


@pytest.mark.serve
def test_rays_own_s3_download_fetches_the_weights_with_pod_identity_style_credentials(tmp_path: Path) -> None:
    """Ray 2.58's download path (download_model_files, boto3) against moto on a local port.

    The process has no keys: botocore's container provider fetches them from a local endpoint with a
    token file, as the EKS Pod Identity agent serves them (AWS_CONTAINER_CREDENTIALS_FULL_URI and
    AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE).
    """
    require_serve_deps()
    import boto3
    from moto.server import ThreadedMotoServer

    seen: list[str] = []

    class Credentials(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("Authorization", ""))
            body = json.dumps(
                {
                    "AccessKeyId": "ASIAPODIDENTITYTEST1",
                    "SecretAccessKey": "pod-identity-secret",
                    "Token": "pod-identity-session",
                    "Expiration": "2099-01-01T00:00:00Z",
                }
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: Any) -> None:
            return

    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    moto.start()
    agent = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Credentials)
    threading.Thread(target=agent.serve_forever, daemon=True).start()
    try:
        endpoint = f"http://127.0.0.1:{moto.get_host_and_port()[1]}"
        s3 = boto3.client(
            "s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="y"
        )
        s3.create_bucket(Bucket="acme-models")
        files = {"config.json": b'{"model_type": "qwen3"}', "tokenizer.json": b"{}", "model.safetensors": b"\0" * 4096}
        for name, data in files.items():
            s3.put_object(Bucket="acme-models", Key=f"approved/qwen3-8b/{name}", Body=data)
        s3.put_object(Bucket="acme-models", Key="other/secret.bin", Body=b"not the model")
        token = tmp_path / "eks-pod-identity-token"
        token.write_text("projected-service-account-token")
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update(
            AWS_CONTAINER_CREDENTIALS_FULL_URI=f"http://127.0.0.1:{agent.server_address[1]}/v1/credentials",
            AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE=str(token),
            AWS_ENDPOINT_URL_S3=endpoint,
            AWS_REGION="us-east-1",
            AWS_DEFAULT_REGION="us-east-1",
            AWS_CONFIG_FILE=str(tmp_path / "none"),
            AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
            AWS_EC2_METADATA_DISABLED="true",
            HF_HOME=str(tmp_path / "hf"),
        )
        script = (
            "from ray.llm._internal.common.utils.download_utils import download_model_files\n"
            "from ray.llm._internal.common.utils.cloud_utils import CloudMirrorConfig\n"
            "print(download_model_files(model_id='Qwen/Qwen3-8B', "
            "mirror_config=CloudMirrorConfig(bucket_uri='s3://acme-models/approved/qwen3-8b')))\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300, check=False
        )
    finally:
        agent.shutdown()
        moto.stop()
    assert done.returncode == 0, done.stderr[-2000:]
    snapshot = Path(done.stdout.strip().splitlines()[-1])
    assert snapshot.is_relative_to(tmp_path / "hf")
    assert {p.name: p.read_bytes() for p in snapshot.iterdir()} == files
    # The keys came from the agent, with the token file's content as the Authorization header.
    assert seen and set(seen) == {"projected-service-account-token"}


@pytest.mark.serve
@pytest.mark.xdist_group("ray")
def test_build_pd_openai_app_builds_with_the_s3_source(local_ray: None) -> None:
    from ray.serve._private.build_app import build_app
    from ray.serve.llm import build_pd_openai_app

    doc = yaml.safe_load(rayservice_from(synth(**S3))["spec"]["serveConfigV2"])
    built = build_app(build_pd_openai_app(doc["applications"][0]["args"]), name="llm")
    assert len(built.deployments) == 3


def test_the_cache_is_made_writable_before_ray_starts(rayservice: dict[str, Any]) -> None:
    # The GPU groups; the ingress group on the system nodes loads no weights.
    for group in rayservice["spec"]["rayClusterConfig"]["workerGroupSpecs"][:2]:
        (init,) = group["template"]["spec"]["initContainers"]
        assert init["securityContext"] == {"runAsUser": 0}
        assert init["volumeMounts"] == [{"name": "model-cache", "mountPath": "/model-cache"}]
        assert "chmod -R a+rwX /model-cache" in init["command"][-1]


def test_a_type_without_instance_store_keeps_the_cache_in_the_container(monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses

    no_nvme = dataclasses.replace(catalog.INSTANCE_TYPES["g6.8xlarge"], instance_store_gb=0)
    monkeypatch.setattr(catalog, "INSTANCE_TYPES", {**catalog.INSTANCE_TYPES, "g6.8xlarge": no_nvme})
    doc = pod_templates.rayservice(
        Settings(), system_node_labels={"role": "system"}, gpu_node_labels={"role": "gpu-worker"},
        gpu_toleration=gpu_toleration(),
    )  # fmt: skip
    for group in doc["spec"]["rayClusterConfig"]["workerGroupSpecs"][:2]:
        pod = group["template"]["spec"]
        assert "initContainers" not in pod
        # /dev/shm and the product's own code (ray_pods), no model cache.
        assert [v["name"] for v in pod["volumes"]] == ["dshm", "ray-pods-code"]
        assert not [e for e in pod["containers"][0]["env"] if e["name"] == "HF_HOME"]
