"""The GCS store's AUTH token never leaves its secret: the template names the secret, never its value, and every pod
that needs the token reads it from the synced Kubernetes Secret (docs/security.md, "The GCS store").

Every pod on the nodes passes the store's security group (docs/security.md says why it is not narrower), so the
token is the control: these tests are what keeps it one.
"""

from __future__ import annotations

import json
from typing import Any

import serve_config
from tests.conftest import manifests, resources

DYNAMIC_REFERENCE = "{{resolve:secretsmanager:"


def _secret_id(template: dict[str, Any]) -> str:
    (found,) = [k for k in resources(template, "AWS::SecretsManager::Secret") if k.startswith("GcsStore")]
    return found


def _env_entries(node: Any) -> list[dict[str, Any]]:
    """Every container `env` entry anywhere in a manifest."""
    found: list[dict[str, Any]] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "env" and isinstance(value, list):
                found.extend(e for e in value if isinstance(e, dict))
            else:
                found.extend(_env_entries(value))
    elif isinstance(node, list):
        for value in node:
            found.extend(_env_entries(value))
    return found


def test_only_the_store_resolves_the_token_and_nothing_else_reads_its_value(template: dict[str, Any]) -> None:
    secret = _secret_id(template)
    readers: dict[str, str] = {}
    for logical_id, resource in template["Resources"].items():
        if logical_id == secret:
            continue
        properties = json.dumps(resource.get("Properties", {}))
        if DYNAMIC_REFERENCE in properties:
            readers[logical_id] = resource["Type"]
        if secret in properties:
            # Anything else names the secret's ARN (who may read it, what External Secrets syncs), not its value.
            assert resource["Type"] in {
                "AWS::ElastiCache::ReplicationGroup",
                "AWS::IAM::Policy",
                "Custom::AWSCDK-EKS-KubernetesResource",
            }, logical_id
    # One dynamic reference in the whole template: the store's AuthToken, which CloudFormation resolves at deploy.
    assert list(readers.values()) == ["AWS::ElastiCache::ReplicationGroup"], readers
    (store,) = resources(template, "AWS::ElastiCache::ReplicationGroup").values()
    assert DYNAMIC_REFERENCE in json.dumps(store["Properties"]["AuthToken"])
    without_token = {k: v for k, v in store["Properties"].items() if k != "AuthToken"}
    assert DYNAMIC_REFERENCE not in json.dumps(without_token)


def test_the_only_manifest_naming_the_secret_is_its_external_secret(template: dict[str, Any]) -> None:
    secret = _secret_id(template)
    naming = [m for m in manifests(template) if secret in json.dumps(m)]
    assert [(m["kind"], m["metadata"]["name"]) for m in naming] == [("ExternalSecret", serve_config.GCS_STORE_SECRET)]


def test_every_env_that_carries_the_token_is_a_secret_key_ref(template: dict[str, Any]) -> None:
    """In the RayService (its head, its workers, KubeRay's cleanup Job built from the head) and every other
    manifest: the synced Secret is read only through secretKeyRef, and no env value holds a secret."""
    secret = _secret_id(template)
    references = 0
    for manifest in manifests(template):
        for entry in _env_entries(manifest):
            text = json.dumps(entry)
            assert DYNAMIC_REFERENCE not in text and secret not in text, entry
            if serve_config.GCS_STORE_SECRET in text:
                assert set(entry) == {"name", "valueFrom"}, entry
                assert entry["valueFrom"]["secretKeyRef"]["name"] == serve_config.GCS_STORE_SECRET, entry
                references += 1
            if "PASSWORD" in entry["name"].upper() or "TOKEN" in entry["name"].upper():
                assert "value" not in entry, entry
        # KubeRay's own field for it, which it turns into the head's REDIS_PASSWORD env.
        options = manifest.get("spec", {}).get("rayClusterConfig", {}).get("gcsFaultToleranceOptions")
        if options is not None:
            assert set(options["redisPassword"]) == {"valueFrom"}, options
            references += 1
    assert references >= 1
