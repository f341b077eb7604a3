"""Write the synthesized template, its asset manifest and its assets to one folder for a platform team.

    python -m tools.handoff [FOLDER]     (default: handoff/)

Run after `make synth`. The folder is what `cdk deploy --app FOLDER` (or
cdk-assets plus `aws cloudformation deploy`) needs; docs/getting-started.md, "Handing the
stack to a platform team", says how.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from settings.project import ROOT
from settings.project import STACK_NAME as STACK


def main(argv: list[str], source: Path = ROOT / "cdk.out") -> int:
    target = Path(argv[0]) if argv else ROOT / "handoff"
    template = source / f"{STACK}.template.json"
    if not template.exists():
        print("no cdk.out: run `make synth` first", file=sys.stderr)
        return 1
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    assets = json.loads((source / f"{STACK}.assets.json").read_text())
    wanted = {f"{STACK}.template.json", f"{STACK}.assets.json", "manifest.json", "cdk.out"}
    for kind in ("files", "dockerImages"):
        for asset in assets.get(kind, {}).values():
            wanted.add(asset["source"].get("path", asset["source"].get("directory", "")))
    for name in sorted(n for n in wanted if n):
        path = source / name
        if path.is_dir():
            shutil.copytree(path, target / name)
        elif path.exists():
            shutil.copy2(path, target / name)
    print(f"wrote {target} ({len(list(target.iterdir()))} entries): template, asset manifest, assets")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
