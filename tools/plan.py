"""Print the KV-transfer plan, whether splitting pays, the cost, and the time to add a replica on a new
GPU node, for the settings: `python -m tools.plan [-c key=value ...]`.

The first table is the one `cdk synth` prints; settings as on the cdk command line
(including -c settings_file=path). Every number comes from settings/ (sizing/, estimates.py).
"""

from __future__ import annotations

import argparse
import sys

from settings.cli import cli_settings
from settings.estimates import cost_summary, plan_table, scale_up_table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="KV-transfer plan, whether splitting pays, cost, and the scale-up budget for the settings"
    )
    parser.add_argument("-c", "--context", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    settings = cli_settings(args.context)
    print(plan_table(settings))
    print(f"Estimated cost: {cost_summary(settings)}")
    print(scale_up_table(settings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
