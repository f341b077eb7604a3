"""docs/settings.md is what settings/reference.py renders from the Settings dataclass and its descriptions."""

from __future__ import annotations

import dataclasses
import re

import pytest

from settings import reference
from settings.descriptions import SETTING_DOCS, SettingDoc
from settings.model import SETTING_NAMES, Settings
from settings.project import ROOT

PAGE = ROOT / reference.PAGE


def _rows(page: str) -> list[list[str]]:
    """The table's rows, each split into its cells (escaped pipes kept inside a cell)."""
    rows = []
    for line in page.splitlines():
        if line.startswith("| `"):
            rows.append([c.replace("\\|", "|").strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]])
    return rows


def test_the_page_is_what_the_code_renders() -> None:
    """Fails when a setting's type, default or description changed without `make settings-reference`."""
    assert PAGE.read_text(encoding="utf-8") == reference.render(), (
        "docs/settings.md is out of date: run `make settings-reference` and commit it"
    )


def test_every_setting_appears_exactly_once_with_its_default() -> None:
    rows = _rows(PAGE.read_text(encoding="utf-8"))
    names = [row[0].strip("`") for row in rows]
    assert sorted(names) == sorted(SETTING_NAMES)
    assert len(names) == len(set(names)), [n for n in names if names.count(n) > 1]
    defaults = {row[0].strip("`"): row[2] for row in rows}
    for f in dataclasses.fields(Settings):
        unset = SETTING_DOCS[f.name].unset
        assert defaults[f.name] == reference.default_text(f.default, unset), f.name


def test_defaults_read_as_a_settings_file_writes_them() -> None:
    assert reference.default_text(None) == "none"
    assert reference.default_text((), "0.0.0.0/0") == "none (0.0.0.0/0)"
    assert reference.default_text(True) == "`true`"
    assert reference.default_text(0.9) == "`0.9`"
    assert reference.default_text(("a", "b")) == "`a`, `b`"
    assert reference.type_text(str | None) == "text or none"
    assert reference.type_text(tuple[str, ...]) == "list of text"


def test_a_setting_without_a_description_is_refused() -> None:
    docs = dict(SETTING_DOCS)
    del docs["max_model_len"]
    with pytest.raises(ValueError, match="max_model_len"):
        reference.render(docs)
    docs["max_model_len"] = SettingDoc(doc=" ", allowed="256 to the model's context length")
    with pytest.raises(ValueError, match="max_model_len"):
        reference.render(docs)


def test_a_description_of_no_setting_is_refused() -> None:
    docs = {**SETTING_DOCS, "max_model_length": SETTING_DOCS["max_model_len"]}
    with pytest.raises(ValueError, match="max_model_length"):
        reference.render(docs)


def test_check_mode_exits_1_in_one_line_when_the_page_is_stale(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert reference.main(["--check"]) == 0
    rendered = reference.render()
    monkeypatch.setattr(reference, "render", lambda: rendered + "x")
    assert reference.main(["--check"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "make settings-reference" in err
