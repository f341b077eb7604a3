"""The README's and docs' offline shell blocks run exactly as written, within a time budget.

Each block is marked in its page by `<!-- offline: NAME -->` on the line before its fence, and its text
is read from the page, so a block that drifts from what works fails here. The list below is explicit:
only blocks that need no AWS account (synth, plan, preflight without credentials, the settings
examples); never `make test` itself, never a deploy. The blocks run in the repository, as a user runs
them (a synth writes cdk.out/), with no AWS credentials in their environment.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import ROOT

# The blocks run the CDK CLI into the one cdk.out/ as a user would, and the CLI refuses a second
# synth into a folder another is writing: the blocks take turns, whichever xdist worker runs them
# (pytest-xdist 3.8's xdist_group does not group under pytest 9.2, whose nodes have no _nodeid).
TURNS = Path(tempfile.gettempdir()) / f"docs-commands-{hashlib.sha256(str(ROOT).encode()).hexdigest()[:12]}.lock"

# A synth takes about a minute on two busy cores; plan and preflight a few seconds.
BLOCK_TIMEOUT_S = 300
TOTAL_BUDGET_S = 900
MARKER = re.compile(r"<!-- offline: ([\w-]+) -->\n```bash\n(.*?)```\n", re.DOTALL)
CREATED_FILES = ["my-settings.yaml"]  # what the blocks write outside cdk.out/, removed afterwards
TEMPLATE = ROOT / "cdk.out" / "PdInference.template.json"

_spent: list[float] = []


@dataclass(frozen=True)
class Run:
    returncode: int
    output: str


def blocks(page: Path) -> dict[str, str]:
    return dict(MARKER.findall(page.read_text()))


def block_after(page: Path, name: str) -> str:
    """The fenced block that follows the marked one: what the page says the command prints."""
    text = page.read_text()
    rest = text.split(f"<!-- offline: {name} -->\n```bash\n", 1)[1].split("```\n", 1)[1]
    return rest.split("```\n", 1)[1].split("```", 1)[0]


def offline_env() -> dict[str, str]:
    # Nor a parent make's variables: under `make test`, a block's `make` would otherwise run as a
    # sub-make and print "make[1]: Entering directory", which a user's shell never shows.
    inherited = ("AWS_", "MAKE", "MFLAGS")
    env = {k: v for k, v in os.environ.items() if not k.startswith(inherited)}
    env.update(
        AWS_EC2_METADATA_DISABLED="true",
        AWS_CONFIG_FILE=os.devnull,
        AWS_SHARED_CREDENTIALS_FILE=os.devnull,
        CDK_DISABLE_CLI_TELEMETRY="true",
    )
    return env


def run(page: str, name: str) -> Run:
    text = blocks(ROOT / page)[name]
    with TURNS.open("w") as turn:
        fcntl.flock(turn, fcntl.LOCK_EX)
        return _run_alone(text)


def _run_alone(text: str) -> Run:
    start = time.monotonic()
    try:
        done = subprocess.run(
            ["bash", "-eo", "pipefail", "-c", text],
            cwd=ROOT,
            env=offline_env(),
            capture_output=True,
            text=True,
            timeout=BLOCK_TIMEOUT_S,
        )
    finally:
        _spent.append(time.monotonic() - start)
        for created in CREATED_FILES:
            (ROOT / created).unlink(missing_ok=True)
    assert sum(_spent) < TOTAL_BUDGET_S, f"the docs' offline blocks took {sum(_spent):.0f} s, over {TOTAL_BUDGET_S}"
    return Run(done.returncode, done.stdout + done.stderr)


def template() -> dict[str, object]:
    loaded: dict[str, object] = json.loads(TEMPLATE.read_text())
    return loaded


def settings_file(result: Run) -> None:
    assert result.returncode == 0, result.output
    text = json.dumps(template())
    # The file's settings reached the template: the API endpoint's CIDR, the alarms' address.
    assert "203.0.113.0/24" in text
    assert "you@example.com" in text


def set_up(result: Run) -> None:
    """The quick start's first command: the template, and the defaults' warnings the README explains."""
    assert result.returncode == 0, result.output
    assert template()["Resources"]
    printed = [line for line in result.output.splitlines() if line.startswith("warning: ")]
    section = (ROOT / "README.md").read_text().split("## What `make synth` warns on the defaults", 1)[1]
    quoted = re.findall(r"^- \*\*(.+?)\*\*", section.split("\n## ", 1)[0], re.MULTILINE)
    assert [line.removeprefix("warning: ")[: len(q)] for line, q in zip(printed, quoted, strict=True)] == quoted


def settings_override(result: Run) -> None:
    assert result.returncode == 0, result.output
    outputs = template()["Outputs"]
    assert isinstance(outputs, dict)
    assert outputs["GpuNodeAvailabilityZone"]["Value"] == "us-east-1c"


def settings_bad_value(result: Run) -> None:
    assert result.returncode != 0
    (documented,) = block_after(ROOT / "docs/getting-started.md", "settings-bad-value").splitlines()
    assert documented in result.output.splitlines(), result.output
    assert "Traceback" not in result.output


def preflight_no_credentials(result: Run) -> None:
    assert result.returncode == 2, result.output  # make's own code for a failed recipe; preflight's is 2 too
    (documented,) = block_after(ROOT / "docs/getting-started.md", "preflight-no-credentials").splitlines()
    assert documented in result.output.splitlines(), result.output
    assert "Traceback" not in result.output


def plan(result: Run) -> None:
    assert result.returncode == 0, result.output
    printed = "".join(line + "\n" for line in result.output.splitlines() if "-m tools.plan" not in line)
    assert printed.startswith(block_after(ROOT / "docs/architecture.md", "plan")), printed


# (page, block, what its run must show). Cheap ones first.
OFFLINE: list[tuple[str, str, Callable[[Run], None]]] = [
    ("docs/architecture.md", "plan", plan),
    ("docs/getting-started.md", "preflight-no-credentials", preflight_no_credentials),
    ("docs/getting-started.md", "settings-bad-value", settings_bad_value),
    ("docs/getting-started.md", "settings-override", settings_override),
    ("README.md", "set-up", set_up),
    ("README.md", "settings-file", settings_file),
]


@pytest.mark.parametrize(("page", "name", "check"), OFFLINE, ids=[name for _, name, _ in OFFLINE])
def test_offline_block_runs_as_written(page: str, name: str, check: Callable[[Run], None]) -> None:
    check(run(page, name))


def test_every_marked_block_is_in_the_list() -> None:
    listed = {(page, name) for page, name, _ in OFFLINE}
    pages = [ROOT / "README.md", ROOT / "DEVELOPMENT.md", *sorted((ROOT / "docs").glob("*.md"))]
    marked = {(str(p.relative_to(ROOT)), name) for p in pages for name in blocks(p)}
    assert marked == listed
    for page in pages:  # a marker whose fence the pattern missed would otherwise go unrun
        assert page.read_text().count("<!-- offline:") == len(blocks(page)), page


def test_no_block_deploys_or_runs_the_suite() -> None:
    for page, name, _ in OFFLINE:
        text = blocks(ROOT / page)[name]
        assert not re.search(r"\b(deploy|destroy|bootstrap|diff|make test|make rehearse)\b", text), (page, name)
