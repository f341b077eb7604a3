"""`python -m tools.preflight`: the table, its exit code, and --write-context."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from botocore.exceptions import BotoCoreError, ClientError

from settings import CONTEXT_FILE
from settings.cli import USAGE_EXIT, cli_context
from settings.project import ROOT as PROJECT_ROOT
from tools.preflight.base import CannotCheckError, Result, Session, first_line
from tools.preflight.checks import run
from tools.preflight.context_file import REPLACE_FLAG, RefusedError, write_context
from tools.preflight.zones import RECORD_KEY


def table(results: Sequence[Result]) -> str:
    """One line per check: status, check, what was found, and for WARN and FAIL the fix."""
    width = max((len(r.check) for r in results), default=0)
    lines = []
    for r in results:
        line = f"{r.status}  {r.check:<{width}}  {r.detail}"
        if r.fix and r.status != "PASS":
            line += f"  -> fix: {r.fix}"
        lines.append(line)
    return "\n".join(lines)


def markdown(results: Sequence[Result]) -> str:
    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    rows = ["| | check | found | fix |", "|---|---|---|---|"]
    for r in results:
        fix = cell(r.fix) if r.status != "PASS" else ""
        rows.append(f"| {r.status} | {cell(r.check)} | {cell(r.detail)} | {fix} |")
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None, session: Session | None = None) -> int:
    parser = argparse.ArgumentParser(description="Check the AWS account before `cdk deploy` (read-only calls).")
    parser.add_argument("-c", "--context", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument(
        "--write-context",
        action="store_true",
        help=f"record the GPU AZ, its zone ID, the account and region in {CONTEXT_FILE}",
    )
    parser.add_argument(
        REPLACE_FLAG,
        dest="replace_deployed",
        action="store_true",
        help="record an AZ or region other than the deployed stack's (the next deploy replaces the cluster)",
    )
    parser.add_argument("--markdown", type=Path, help="also write the table as Markdown to this file")
    parser.add_argument("--root", type=Path, default=PROJECT_ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    context, settings = cli_context(args.context, args.root)
    if session is None:
        import boto3

        # The CDK CLI reads AWS_REGION before AWS_DEFAULT_REGION and the profile; boto3 skips it.
        session = boto3.Session(region_name=os.environ.get("AWS_REGION") or None)
    try:
        account, results = run(settings, session, context)
    except CannotCheckError as err:
        print(f"error: {err}", file=sys.stderr)
        return USAGE_EXIT
    print(table(results))
    if args.markdown:
        args.markdown.write_text(markdown(results), encoding="utf-8")
    failed = sum(r.status == "FAIL" for r in results)
    warned = sum(r.status == "WARN" for r in results)
    print(f"\npreflight: {len(results) - failed - warned} passed, {warned} warned, {failed} failed")
    if args.write_context:
        try:
            written = write_context(account, args.root / CONTEXT_FILE, replace_deployed=args.replace_deployed)
        except RefusedError as err:
            print(f"error: not written: {err}", file=sys.stderr)
            return 1
        except (BotoCoreError, ClientError) as err:
            # Whether the stack is deployed in the recorded region could not be read: nothing is written.
            print(f"error: not written: {type(err).__name__}: {first_line(err)}", file=sys.stderr)
            return 1
        pairs = ", ".join(f"{k}={v}" for k, v in written.items() if isinstance(v, str))
        record = written.get(RECORD_KEY)
        if record:
            pairs += f" (zone ID {record['zoneId']} in account {record['account']}, under {RECORD_KEY!r})"
        print(f"wrote {pairs} to {CONTEXT_FILE}; commit it in your deployment repository")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
