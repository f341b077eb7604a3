"""Print the KV-transfer plan and whether splitting pays, for the settings: `python -m tools.plan [-c key=value ...]`.

The same table `cdk synth` prints; settings as on the cdk command line
(including -c settings_file=path).
"""

from __future__ import annotations

import argparse
import sys

from settings import SettingsError, settings_from_cli
from settings.estimates import cost_summary, plan_table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="KV-transfer plan, whether splitting pays, and cost for the settings")
    parser.add_argument("-c", "--context", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    try:
        settings = settings_from_cli(args.context)
    except SettingsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(plan_table(settings))
    print(f"Estimated cost: {cost_summary(settings)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
