"""Modules hold one concern, a few hundred lines: no product module is over LIMIT lines unless it is
named in LONG_MODULES with the reason it is one concern (or that it is still to be split). Tests are
exempt. An entry that is no longer long must leave the list, so the list stays true.

Imports of the project's own modules sit at the top of their files, tests' too: one inside a function
hides a cycle or a cost, so it stays only with a comment on its line saying which."""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

from tests.conftest import ROOT

LIMIT = 400

LONG_MODULES = {
    "settings/catalog.py": "data tables: the pinned versions, charts and instance types, each with its source",
}

SKIPPED = {"tests", "node_modules", ".git", ".mypy_cache", ".ruff_cache", ".hypothesis", ".schemas"}


def _skipped(part: str) -> bool:
    return part in SKIPPED or part.startswith((".venv", "cdk.out"))


def line_counts(root: Path) -> dict[str, int]:
    """Every product module's path relative to the root, and its number of lines."""
    counts = {}
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root)
        if not any(_skipped(part) for part in relative.parts[:-1]):
            counts[relative.as_posix()] = len(path.read_text().splitlines())
    return counts


def test_no_product_module_is_over_the_limit_unless_named() -> None:
    counts = line_counts(ROOT)
    assert "app.py" in counts
    assert "settings/model.py" in counts
    long = {name: lines for name, lines in counts.items() if lines > LIMIT and name not in LONG_MODULES}
    assert long == {}, f"over {LIMIT} lines: split them, or name each in LONG_MODULES with why it is one concern"


def test_every_named_long_module_is_still_long() -> None:
    counts = line_counts(ROOT)
    short = {name: counts.get(name, 0) for name in LONG_MODULES if counts.get(name, 0) <= LIMIT}
    assert short == {}, "no longer over the limit (or gone): remove them from LONG_MODULES"


# The project's own top-level packages and modules.
PROJECT = {"settings", "tools", "serve_config", "cdk_constructs", "stacks", "rehearsal", "ray_pods", "tests", "app"}


def python_files(root: Path) -> list[Path]:
    """Every Python file of the product and of tests/, outside the venvs, node_modules and cdk.out."""
    skipped = SKIPPED - {"tests"}
    return [
        path
        for path in sorted(root.rglob("*.py"))
        if not any(part in skipped or part.startswith((".venv", "cdk.out")) for part in path.relative_to(root).parts)
    ]


def _imports_project(node: ast.Import | ast.ImportFrom) -> bool:
    if isinstance(node, ast.ImportFrom):
        return node.level > 0 or (node.module or "").split(".")[0] in PROJECT
    return any(alias.name.split(".")[0] in PROJECT for alias in node.names)


def function_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import of the project's modules inside a function body, nested functions' too."""
    return [
        node
        for function in ast.walk(tree)
        if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef)
        for node in ast.walk(function)
        if isinstance(node, ast.Import | ast.ImportFrom) and _imports_project(node)
    ]


def uncommented_function_imports(source: str) -> list[int]:
    """The lines of imports of the project's modules inside a function body that carry no comment."""
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    commented = {token.start[0] for token in tokens if token.type == tokenize.COMMENT}
    return sorted(
        {
            node.lineno
            for node in function_imports(ast.parse(source))
            if not commented & set(range(node.lineno, (node.end_lineno or node.lineno) + 1))
        }
    )


def test_the_projects_modules_are_imported_at_the_top_unless_a_comment_says_why() -> None:
    files = python_files(ROOT)
    assert ROOT / "tests" / "support" / "fake_cluster.py" in files
    assert ROOT / "rehearsal" / "scaling.py" in files
    inside = {
        f"{path.relative_to(ROOT).as_posix()}:{line}"
        for path in files
        for line in uncommented_function_imports(path.read_text())
    }
    assert inside == set(), "import these at the top, or say on the line why it must wait (a cycle, ray, aws_cdk)"


def test_an_uncommented_import_inside_a_function_is_found() -> None:
    source = "import os\n\n\ndef f() -> None:\n    from tools import checks\n    from ray_pods import api_keys  # ray\n"
    assert uncommented_function_imports(source) == [5]
