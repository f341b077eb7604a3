"""A CloudFormation value as text a person reads: references shown as ${...} placeholders.

review/, change_impact's summary, the rehearsal and the tests all read the template's strings this way.
"""

from __future__ import annotations

import json
from typing import Any


def render(value: Any) -> str:
    """A template string, with CloudFormation references as ${...} placeholders."""
    if isinstance(value, str):
        return value
    if "Fn::Join" in value:
        separator, parts = value["Fn::Join"]
        return str(separator).join(render(p) for p in parts)
    if "Ref" in value:
        return "${" + str(value["Ref"]) + "}"
    if "Fn::Sub" in value and isinstance(value["Fn::Sub"], str):
        # Its text already writes references as ${...}.
        return str(value["Fn::Sub"])
    if "Fn::GetAtt" in value:
        return "${" + ".".join(value["Fn::GetAtt"]) + "}"
    return json.dumps(value, sort_keys=True)
