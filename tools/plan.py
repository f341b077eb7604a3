"""Print the KV-transfer budget for the settings: `python tools/plan.py [-c key=value ...]`.

The same table `cdk synth` prints; settings as on the cdk command line
(including -c settings_file=path).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from settings import SettingsError, settings_from  # noqa: E402
from settings.estimates import cost_summary, plan_table  # noqa: E402


def context_from(pairs: list[str]) -> dict[str, object]:
    context: dict[str, object] = json.loads((ROOT / "cdk.json").read_text())["context"]
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SettingsError(key, pair, "-c key=value")
        context[key] = value
    return context


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="KV-transfer budget and cost for the settings")
    parser.add_argument("-c", "--context", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    try:
        settings = settings_from(context_from(args.context))
    except SettingsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(plan_table(settings))
    print(f"Estimated cost: {cost_summary(settings)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
