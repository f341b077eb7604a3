"""Modules hold one concern, a few hundred lines: no product module is over LIMIT lines unless it is
named in LONG_MODULES with the reason it is one concern (or that it is still to be split). Tests are
exempt. An entry that is no longer long must leave the list, so the list stays true."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import ROOT

LIMIT = 400

LONG_MODULES = {
    "settings/catalog.py": "data tables: the pinned versions, charts and instance types, each with its source",
    "tools/bench.py": "one CLI: the sweep, its CSV and chart, and the comparison of two sweeps: to be split",
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
