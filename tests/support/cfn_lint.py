"""cfn-lint on a synthesized template, with the rules the product waives."""

from __future__ import annotations

import json
from typing import Any

from cfnlint.api import ManualArgs, lint

IGNORED = ["W3005"]


def lint_errors(template: dict[str, Any], also_ignored: tuple[str, ...] = ()) -> list[str]:
    config = ManualArgs(regions=["us-east-1"], ignore_checks=[*IGNORED, *also_ignored])
    matches = lint(json.dumps(template), config=config)
    return [f"{m.rule.id} {m.message} ({'/'.join(map(str, m.path))})" for m in matches]
