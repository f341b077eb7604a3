"""The account and region a command acts on, checked before the CDK CLI runs.

    python -m tools.preflight.target [-c key=value ...] [--environment]

`make diff` and `make destroy` run it first, as `make deploy` runs preflight: without credentials,
or with another account's than the settings name, the command stops in one line with the fix,
before the CLI synthesizes and prints its own account errors. `--environment` prints
`aws://ACCOUNT/REGION` for `make bootstrap`: the settings' region, else the profile's (the region a
deploy with these settings lands in), and the caller's account.
"""

from __future__ import annotations

import argparse
import os
import sys

from settings.cli import USAGE_EXIT, cli_context
from tools.preflight.account import identity
from tools.preflight.base import Account, CannotCheckError, Session


def main(argv: list[str] | None = None, session: Session | None = None) -> int:
    parser = argparse.ArgumentParser(description="Check the credentials and region a command acts on.")
    parser.add_argument("-c", "--context", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--environment", action="store_true", help="print aws://ACCOUNT/REGION")
    args = parser.parse_args(argv)
    context, settings = cli_context(args.context)
    if session is None:
        import boto3

        # As preflight: the CDK CLI reads AWS_REGION before the profile; boto3 skips it.
        session = boto3.Session(region_name=os.environ.get("AWS_REGION") or None)
    account = Account(settings=settings, session=session, context=context)
    try:
        results = identity(account)
    except CannotCheckError as err:
        print(f"error: {err}", file=sys.stderr)
        return USAGE_EXIT
    for result in results:
        if result.status == "FAIL":
            print(f"error: {result.detail}: {result.fix}", file=sys.stderr)
            return USAGE_EXIT
    if args.environment:
        print(f"aws://{account.account_id}/{account.region}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
