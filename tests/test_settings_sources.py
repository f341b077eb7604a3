"""The settings' reference tables cite public sources, never a file outside the repository a user's clone lacks."""

from __future__ import annotations

import re

from settings.project import ROOT

OUTSIDE = re.compile(r"\.\./shared|FACTS\.md")


def test_no_settings_comment_sends_the_reader_outside_the_repository() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in sorted((ROOT / "settings").rglob("*.py"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert not found, found
