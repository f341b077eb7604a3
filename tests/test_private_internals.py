"""Every test module that imports Ray's or vLLM's private internals carries the `private_internals`
marker, so that on a Ray or vLLM version bump `pytest -m private_internals --collect-only` lists the
tests to re-read. Private means a module path component that starts with `_` or is named `internal`
(`ray.serve._private`, `ray.llm._internal`, `vllm.v1.engine._x`), or an imported name that starts
with `_`. Helper modules (conftest, tests/support/) may not import them at all: a marker there marks
no test."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
MARKER = "private_internals"


def _private(module: str) -> bool:
    parts = module.split(".")
    return parts[0] in {"ray", "vllm"} and any(p.startswith("_") or p == "internal" for p in parts[1:])


def private_imports(tree: ast.Module) -> list[str]:
    """The private Ray or vLLM modules and names the module imports, at any depth."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if _private(alias.name)]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            root = node.module.split(".")[0]
            if _private(node.module):
                found.append(node.module)
            elif root in {"ray", "vllm"}:
                found += [f"{node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
    return found


def marked(tree: ast.Module) -> bool:
    """Whether a module-level `pytestmark` (one mark or a list of them) includes the marker."""
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        if any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in targets):
            for mark in ast.walk(value):
                if isinstance(mark, ast.Attribute) and mark.attr == MARKER:
                    return True
    return False


def offenders(root: Path) -> list[str]:
    lines = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        imports = private_imports(tree)
        if not imports:
            continue
        name = path.relative_to(root.parent)
        found = ", ".join(sorted(set(imports)))
        if not path.name.startswith("test_"):
            lines.append(f"{name}: a helper module imports {found}; move that into the test module")
        elif not marked(tree):
            lines.append(f"{name}: imports {found} without pytestmark = pytest.mark.{MARKER}")
    return lines


def test_every_module_importing_private_internals_is_marked() -> None:
    assert offenders(TESTS) == []


def test_the_checker_sees_a_private_import_inside_a_function_and_the_marker_in_a_list(tmp_path: Path) -> None:
    tests = tmp_path / "tests"
    tests.mkdir()
    body = "def test_x() -> None:\n    from ray.serve._private.common import DeploymentID\n"
    (tests / "test_bare.py").write_text(body)
    (tests / "test_marked.py").write_text(
        f"import pytest\npytestmark = [pytest.mark.serve, pytest.mark.{MARKER}]\n" + body
    )
    (tests / "test_public.py").write_text("from ray.serve.llm import LLMConfig\nimport vllm.config\n")
    assert offenders(tests) == [
        f"tests/test_bare.py: imports ray.serve._private.common without pytestmark = pytest.mark.{MARKER}"
    ]
