"""The dependency graph CloudFormation derives from a template: DependsOn, Ref and Fn::GetAtt."""

from __future__ import annotations

from typing import Any


def _references(node: Any, found: set[str]) -> None:
    if isinstance(node, dict):
        if "Ref" in node and isinstance(node["Ref"], str):
            found.add(node["Ref"])
        if "Fn::GetAtt" in node:
            target = node["Fn::GetAtt"]
            found.add(target[0] if isinstance(target, list) else str(target).split(".")[0])
        for value in node.values():
            _references(value, found)
    elif isinstance(node, list):
        for value in node:
            _references(value, found)


def direct_dependencies(template: dict[str, Any]) -> dict[str, set[str]]:
    resources = template["Resources"]
    graph: dict[str, set[str]] = {}
    for logical_id, resource in resources.items():
        deps: set[str] = set()
        depends_on = resource.get("DependsOn", [])
        deps.update([depends_on] if isinstance(depends_on, str) else depends_on)
        _references(resource.get("Properties", {}), deps)
        graph[logical_id] = {d for d in deps if d in resources}
    return graph


def depends_on(template: dict[str, Any], source: str, target: str) -> bool:
    """Whether CloudFormation creates `target` before `source` (and so deletes `source` first)."""
    graph = direct_dependencies(template)
    seen: set[str] = set()
    stack = [source]
    while stack:
        current = stack.pop()
        for dep in graph[current]:
            if dep == target:
                return True
            if dep not in seen:
                seen.add(dep)
                stack.append(dep)
    return False
