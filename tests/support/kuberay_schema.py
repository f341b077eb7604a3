"""Validate a RayService (or any custom resource) against its published CRD schema, strictly.

The CRD's OpenAPI v3 schema does not forbid unknown fields (the API server
prunes them silently), so a typo like `replica:` would pass it. Here every
object schema with declared properties gets additionalProperties: false,
except where Kubernetes says unknown fields are kept; defaults are filled first,
as the API server would.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import yaml


def _strict(schema: dict[str, Any]) -> dict[str, Any]:
    schema = copy.deepcopy(schema)

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("x-kubernetes-int-or-string"):
                node.pop("type", None)
                node["anyOf"] = [{"type": "integer"}, {"type": "string"}]
            if (
                "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return schema


def _fill_defaults(validator_class: Any) -> Any:
    validate_properties = validator_class.VALIDATORS["properties"]

    def set_defaults(validator: Any, properties: Any, instance: Any, schema: Any) -> Iterator[Any]:
        if isinstance(instance, dict):
            for name, sub in properties.items():
                if "default" in sub:
                    instance.setdefault(name, copy.deepcopy(sub["default"]))
        yield from validate_properties(validator, properties, instance, schema)

    return jsonschema.validators.extend(validator_class, {"properties": set_defaults})


def crd_schema(crd: dict[str, Any], version: str) -> dict[str, Any]:
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    schema: dict[str, Any] = served["schema"]["openAPIV3Schema"]
    return schema


@functools.cache
def _schema(crd_path: Path, version: str = "v1") -> dict[str, Any]:
    return crd_schema(yaml.safe_load(crd_path.read_text()), version)


def validation_errors(rayservice: dict[str, Any], crd_path: Path) -> list[str]:
    """Schema errors of the RayService (defaults filled, unknown fields rejected); empty when valid."""
    return schema_errors(rayservice, _schema(crd_path))


def custom_resource_errors(obj: dict[str, Any], crds: list[dict[str, Any]]) -> list[str] | None:
    """Strict schema errors of a custom resource against the CRD that serves it; None if no CRD does."""
    group, _, version = obj["apiVersion"].rpartition("/")
    for crd in crds:
        if crd["spec"]["group"] == group and crd["spec"]["names"]["kind"] == obj["kind"]:
            return schema_errors(obj, crd_schema(crd, version))
    return None


def schema_errors(obj: dict[str, Any], schema: dict[str, Any]) -> list[str]:
    document = copy.deepcopy(obj)
    for _ in _fill_defaults(jsonschema.Draft7Validator)(schema).iter_errors(document):
        pass
    strict = jsonschema.Draft7Validator(_strict(schema))
    return sorted(f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in strict.iter_errors(document))
