"""The README stays true: its first two commands exist, and every setting is documented."""

from __future__ import annotations

import re

from settings import SETTING_NAMES
from tests.conftest import ROOT

README = (ROOT / "README.md").read_text()


def test_first_two_commands_are_make_targets() -> None:
    block = README.split("```bash", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in block.strip().splitlines()]
    assert commands == ["make synth", "make test"]
    makefile = (ROOT / "Makefile").read_text()
    for target in ("synth", "test"):
        assert re.search(rf"^{target}:", makefile, re.MULTILINE), target
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in ci


def test_every_setting_is_in_the_settings_table() -> None:
    table = README.split("| setting | default | what it does |", 1)[1].split("\n\n", 1)[0]
    documented = set(re.findall(r"`([a-z0-9_]+)`", table))  # digits too: alarm_ttft_p99_seconds
    # A row like `system_nodes_min` / `_desired` / `_max` names a family once.
    for stem, *suffixes in re.findall(r"`([a-z_]+)_[a-z]+` / `(_[a-z]+)`(?: / `(_[a-z]+)`)?", table):
        documented.update(stem + suffix for suffix in suffixes if suffix)
    missing = sorted(set(SETTING_NAMES) - documented)
    assert missing == [], f"settings missing from README's table: {missing}"


def test_should_i_disaggregate_shows_the_plan_on_the_defaults() -> None:
    from settings import Settings
    from settings.estimates import cost_summary, plan_table

    section = README.split("## Should I disaggregate?", 1)[1]
    block = section.split("```\n", 1)[1].split("```", 1)[0]
    assert block == f"{plan_table(Settings())}\nEstimated cost: {cost_summary(Settings())}\n"
