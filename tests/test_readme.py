"""The README and docs stay true: the first two commands, the settings, the plan, every link, the layout map."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from settings import SETTING_NAMES, Settings
from settings.estimates import cost_summary, plan_table
from tests.conftest import ROOT

README = (ROOT / "README.md").read_text()
PAGES = [ROOT / "README.md", ROOT / "DEVELOPMENT.md", *sorted((ROOT / "docs").glob("*.md"))]
# Pages another change adds (the generated settings reference): links to them may dangle until then.
# The product's own packages, whose modules the layout map must name (tests/ is not among them).
PACKAGES = ["settings", "stacks", "cdk_constructs", "serve_config", "ray_pods", "tools", "rehearsal"]


def test_the_first_two_commands_set_up_and_test_as_ci_does() -> None:
    block = README.split("```bash", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in block.strip().splitlines()]
    assert commands == ["make synth", "make test"]
    development = README.split("## Development", 1)[1]
    assert "`make test`" in development and "`make test-fast`" in development
    makefile = (ROOT / "Makefile").read_text()
    for target in ("synth", "test", "test-fast"):
        assert re.search(rf"^{target}:", makefile, re.MULTILINE), target
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in ci


def test_readme_is_short() -> None:
    assert len(README.splitlines()) < 130, "README.md: a short quick start; move detail into docs/"


def test_every_setting_is_in_the_settings_reference() -> None:
    reference = (ROOT / "docs" / "settings.md").read_text()
    documented = set(re.findall(r"`([a-z0-9_]+)`", reference))  # digits too: alarm_ttft_p99_seconds
    missing = sorted(set(SETTING_NAMES) - documented)
    assert missing == [], f"settings missing from docs/settings.md: {missing}"


def test_should_i_disaggregate_shows_the_plan_on_the_defaults() -> None:
    page = (ROOT / "docs" / "architecture.md").read_text()
    section = page.split("## Should I disaggregate?", 1)[1]
    after_command = section.split("<!-- offline: plan -->\n```bash\nmake plan\n```\n", 1)[1]
    block = after_command.split("```\n", 1)[1].split("```", 1)[0]
    assert block == f"{plan_table(Settings())}\nEstimated cost: {cost_summary(Settings())}\n"


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
    return {slug(m) for m in re.findall(r"^#{1,6} (.+)$", text, re.MULTILINE)}


def relative_links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
    return [t for t in re.findall(r"\]\(([^)\s]+)\)", text) if not re.match(r"[a-z]+:", t)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for link in relative_links(page):
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        if not target.exists():
            broken.append(f"{link}: no such file")
        elif anchor and target.suffix == ".md" and anchor not in anchors(target):
            broken.append(f"{link}: no heading with that anchor in {target.relative_to(ROOT)}")
    assert broken == [], f"{page.relative_to(ROOT)}: {broken}"


def layout_map() -> str:
    development = (ROOT / "DEVELOPMENT.md").read_text()
    section = development.split("## Layout", 1)[1].split("\n## ", 1)[0]
    return section.split("```\n", 1)[1].split("```", 1)[0]


def test_layout_map_names_every_module() -> None:
    names = set(re.findall(r"[\w.]+", layout_map()))
    missing = []
    for package in PACKAGES:
        assert (ROOT / package / "__init__.py").exists(), package
        if f"{package}/" not in layout_map():
            missing.append(f"{package}/")
        for child in sorted((ROOT / package).iterdir()):
            if child.name in {"__init__.py", "__pycache__"}:
                continue
            if child.suffix == ".py" and child.name not in names:
                missing.append(f"{package}/{child.name}")
            if child.is_dir() and (child / "__init__.py").exists() and f"{child.name}/" not in layout_map():
                missing.append(f"{package}/{child.name}/")
    assert missing == [], f"DEVELOPMENT.md's layout map does not name: {missing}"


def test_layout_map_names_no_module_that_is_gone() -> None:
    existing = {p.name for package in PACKAGES for p in (ROOT / package).rglob("*.py")}
    gone = sorted(set(re.findall(r"\b\w+\.py\b", layout_map())) - existing - {"app.py"})
    assert gone == [], f"DEVELOPMENT.md's layout map names modules that do not exist: {gone}"
