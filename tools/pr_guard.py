"""Fail a pull request whose template would replace or delete a stateful resource.

    python -m tools.pr_guard DEPLOYED.json PROPOSED.json [--allow true|false] [--markdown FILE]

The comparison is @aws-cdk/cloudformation-diff's (tools/template_diff.py runs tools/destructive_changes.mjs),
the same library `cdk diff` uses; this script adds the opt-in and the summary.
The summary also names what the change interrupts, and for how long (tools/change_impact.py:
in place, replicas restarted, a new Ray cluster, nodes replaced, a stateful resource replaced).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from settings import settings_from_cli
from tools import change_impact
from tools.template_diff import destructive_changes

OPT_IN_LABEL = "allow-destructive-change"


def impact_summary(before: dict[str, Any], after: dict[str, Any], changes: list[dict[str, str]]) -> str:
    """What the change interrupts and for how long (tools/change_impact.py), on the project's settings."""
    try:
        found = change_impact.classify(before, after, changes)
    except ImportError as err:
        return f"**Interruption: not computed**: it runs Serve's own code ({err}); run `make setup-serve`.\n"
    return change_impact.markdown(found, settings_from_cli([]))


def summary(changes: list[dict[str, str]], allowed: bool) -> str:
    if not changes:
        return "No stateful resource is replaced or deleted.\n"
    lines = [f"**{len(changes)} stateful resource(s) would be replaced or deleted:**", ""]
    lines += [f"- `{c['logicalId']}` ({c['type']}): {c['impact']}" for c in changes]
    lines.append("")
    if allowed:
        lines.append(f"Allowed by the `{OPT_IN_LABEL}` label.")
    else:
        lines.append(f"Blocked. If this is intended, add the `{OPT_IN_LABEL}` label to the pull request.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("deployed", type=Path)
    parser.add_argument("proposed", type=Path)
    parser.add_argument("--allow", default="false", help="true when the PR carries the opt-in label")
    parser.add_argument("--markdown", type=Path, help="also write the summary here")
    args = parser.parse_args(argv)
    allowed = args.allow.strip().lower() == "true"
    changes = destructive_changes(args.deployed, args.proposed)
    before, after = (json.loads(p.read_text()) for p in (args.deployed, args.proposed))
    text = summary(changes, allowed) + "\n" + impact_summary(before, after, changes)
    print(text, end="")
    if args.markdown:
        args.markdown.write_text(text)
    return 1 if changes and not allowed else 0


if __name__ == "__main__":
    sys.exit(main())
