"""Day one as a new user meets it: the commands' one-line errors, `make help`, what `make synth` installs,
and the figures the README and Getting started quote, each from the function that computes it.

The commands run as subprocesses, as a user runs them, with no AWS credentials: a home of their own,
AWS config files that do not exist, no instance metadata. None reaches AWS or synthesizes: each stops
on its own check first, which is what these tests hold.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from app import warnings
from serve_config import SERVE_PORT, ingress_service_name
from settings import Settings, catalog, sizing
from settings.estimates import hourly_cost, hourly_cost_range
from settings.project import STACK_NAME
from tests.conftest import ROOT, synth

README = (ROOT / "README.md").read_text(encoding="utf-8")
GETTING_STARTED = (ROOT / "docs" / "getting-started.md").read_text(encoding="utf-8")
MAKEFILE = (ROOT / "Makefile").read_text(encoding="utf-8")
# Targets that only other targets run, so `make help` leaves them out.
INTERNAL_TARGETS = {"bench-notice", "schemas"}


def no_credentials_env(home: Path) -> dict[str, str]:
    """The caller's environment without AWS credentials, region or a parent make's variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "MAKE", "MFLAGS", "CDK_DEFAULT"))}
    env.update(
        HOME=str(home),
        AWS_CONFIG_FILE=str(home / "no-such-config"),
        AWS_SHARED_CREDENTIALS_FILE=str(home / "no-such-credentials"),
        AWS_EC2_METADATA_DISABLED="true",
    )
    return env


def make(home: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "--no-print-directory", *args],
        cwd=ROOT,
        env=no_credentials_env(home),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def said(done: subprocess.CompletedProcess[str]) -> list[str]:
    """What the command printed, without make's echo of each recipe line and its own closing line."""
    return [
        line
        for line in (done.stdout + done.stderr).splitlines()
        if line.strip() and not line.startswith(("make: ***", str(ROOT), "/")) and " -m tools." not in line
    ]


# --- make help -------------------------------------------------------------------------------------
def documented_targets() -> dict[str, str]:
    """Each target with a `##` line right above it, and that line."""
    found, doc = {}, ""
    for line in MAKEFILE.splitlines():
        if line.startswith("## "):
            doc = line[3:]
            continue
        target = re.match(r"^([a-z][a-z-]*):", line)
        if target and doc:
            found[target.group(1)] = doc
        doc = ""
    return found


def test_make_help_prints_every_target_with_its_line(tmp_path: Path) -> None:
    done = make(tmp_path, "help", timeout=30)
    assert done.returncode == 0, done.stderr
    expected = documented_targets()
    printed = [line.split(None, 1) for line in done.stdout.splitlines()]
    assert [(target, text.strip()) for target, text in printed] == list(expected.items())
    assert make(tmp_path, timeout=30).stdout == done.stdout, "`make` alone lists the targets"


def test_every_phony_target_but_the_internal_ones_has_a_line() -> None:
    (phony,) = re.findall(r"^\.PHONY: (.+)$", MAKEFILE, re.MULTILINE)
    undocumented = set(phony.split()) - set(documented_targets()) - INTERNAL_TARGETS
    assert undocumented == set()


# --- one line, with the fix, without credentials ---------------------------------------------------
@pytest.mark.parametrize("target", ["deploy", "diff", "destroy", "bootstrap"])
def test_an_account_command_without_credentials_says_one_line(target: str, tmp_path: Path) -> None:
    done = make(tmp_path, target, "CDK_ARGS=-c region=us-east-1")
    assert done.returncode == 2, done.stdout + done.stderr
    assert said(done) == [
        "error: no AWS credentials found: set AWS_PROFILE or run `aws configure` / `aws sso login`"
    ], done.stdout + done.stderr


def test_bootstrap_without_a_region_says_where_to_set_one(tmp_path: Path) -> None:
    env_region = make(tmp_path, "bootstrap")
    assert env_region.returncode == 2
    (line,) = said(env_region)
    assert line.startswith("error: no AWS region: set AWS_REGION"), line


def test_the_pinned_cli_reads_the_switch_that_silences_its_upgrade_banner() -> None:
    """The CLI advises `npm install -g aws-cdk` on a TTY unless this variable is set; the Makefile sets it."""
    source = (ROOT / "node_modules" / "aws-cdk" / "lib" / "cli" / "display-version.js").read_text(encoding="utf-8")
    assert "Upgrade recommended (npm install -g aws-cdk)" in source
    assert "!process.env.CDK_DISABLE_VERSION_CHECK" in source
    assert re.search(r"^export CDK_DISABLE_VERSION_CHECK := true$", MAKEFILE, re.MULTILINE)


# --- change-impact: its arguments before a 10 GB install ---------------------------------------------
@pytest.mark.parametrize(
    ("args", "start"),
    [
        ((), "error: DEPLOYED=deployed.json is required"),
        (("DEPLOYED=no-such.json",), "error: DEPLOYED=no-such.json: no such file"),
        (("DEPLOYED=Makefile", "PROPOSED=no-such.json"), "error: PROPOSED=no-such.json: no such file"),
    ],
)
def test_change_impact_checks_its_arguments_before_it_installs(
    args: tuple[str, ...], start: str, tmp_path: Path
) -> None:
    venv = tmp_path / "venv"  # would be created by any install the target started
    done = make(tmp_path, "change-impact", f"VENV={venv}", *args, timeout=30)
    assert done.returncode == 2
    (line,) = said(done)
    assert line.startswith(start), line
    assert not venv.exists()


def _write(path: Path, template: dict[str, Any]) -> Path:
    path.write_text(json.dumps(template), encoding="utf-8")
    return path


def test_change_impact_without_ray_says_what_to_install(tmp_path: Path) -> None:
    """A serve config change needs Serve's own code: without Ray, one line names what to install."""
    deployed = _write(tmp_path / "deployed.json", synth())
    proposed = _write(tmp_path / "proposed.json", synth(max_model_len=4096))
    # None in sys.modules is how Python refuses an import: as if Ray and vLLM were not installed.
    code = (
        "import sys; sys.modules.update(ray=None, vllm=None); from tools.change_impact import main; "
        f"sys.exit(main([{str(deployed)!r}, {str(proposed)!r}]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=no_credentials_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    (line,) = [line for line in done.stderr.splitlines() if line.startswith(("error", "Traceback", "  "))]
    assert line.startswith("error: ray is not installed:"), done.stderr
    assert "make setup-serve" in line


# --- what a deploying user installs ----------------------------------------------------------------
def requirement_names(path: Path) -> set[str]:
    names = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#")[0].strip()
        if line and not line.startswith("-r"):
            names.add(re.split(r"[=<>\[ ]", line)[0].lower())
    return names


def test_synth_installs_no_test_tool_and_every_kubectl_layer() -> None:
    user = requirement_names(ROOT / "requirements.txt")
    dev = requirement_names(ROOT / "requirements-dev.txt")
    assert not user & {"pytest", "pytest-xdist", "mypy", "ruff", "moto", "hypothesis", "cfn-lint", "zizmor"}
    assert not user & dev, "each package in one file"
    for version in catalog.KUBERNETES_VERSIONS:
        assert catalog.layer_package(version).lower() in user, version
    assert "cdk-nag" in user, "app.py runs cdk-nag at every synth"
    assert re.search(r"^\$\(VENV\)/\.installed: requirements\.txt$", MAKEFILE, re.MULTILINE)
    assert re.search(r"^synth: setup$", MAKEFILE, re.MULTILINE)
    assert re.search(r"^test: setup-dev$", MAKEFILE, re.MULTILINE)


def test_no_product_module_imports_a_test_tool() -> None:
    dev_only = {"pytest", "mypy", "moto", "hypothesis", "cfnlint", "kubernetes_validate", "jsonschema"}
    found = []
    for package in ("app.py", "settings", "stacks", "cdk_constructs", "serve_config", "tools", "ray_pods"):
        for module in [ROOT / package] if package.endswith(".py") else (ROOT / package).rglob("*.py"):
            if "dev" in module.relative_to(ROOT).parts:
                continue
            for name in re.findall(r"^\s*(?:import|from) (\w+)", module.read_text(encoding="utf-8"), re.MULTILINE):
                if name in dev_only:
                    found.append(f"{module.relative_to(ROOT)}: {name}")
    assert found == []


# --- the README's first screen ---------------------------------------------------------------------
def test_the_quick_start_is_on_the_first_screen() -> None:
    lines = README.splitlines()
    quick = lines.index("## Quick start")
    destroy = next(i for i, line in enumerate(lines) if "**Destroy**" in line)
    # The quick start, from its heading to destroy, fits one screen (about 60 lines).
    assert quick < 15 and destroy - quick < 62, (quick, destroy)
    steps = [
        "make synth",
        "SETTINGS=my-settings.yaml",
        "make bootstrap",
        "make preflight",
        "make deploy",
        "make status",
        "chat/completions",
        "make destroy",
    ]
    at = [README.index(step, README.index("## Quick start")) for step in steps]
    assert at == sorted(at), "the quick start's steps in the order they run"


def test_the_first_request_names_what_the_defaults_deploy() -> None:
    s = Settings()
    section = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    assert f"aws eks update-kubeconfig --name {s.cluster_name} " in section
    assert (
        f"kubectl -n {s.serving_namespace} port-forward svc/{ingress_service_name(s)} {SERVE_PORT}:{SERVE_PORT}"
        in section
    )
    assert section.count(f"localhost:{SERVE_PORT}/v1") == 2, "curl and the OpenAI client"
    assert section.count(s.model_id) == 3, "the settings file, curl and the client"
    python = section.split("```python\n", 1)[1].split("```", 1)[0]
    compile(python, "README.md", "exec")


def test_the_readme_says_what_each_default_warning_means() -> None:
    printed = [line.removeprefix("warning: ") for line in warnings(Settings())]
    section = README.split("## What `make synth` warns on the defaults", 1)[1].split("\n## ", 1)[0]
    quoted = re.findall(r"^- \*\*(.+?)\*\*", section, re.MULTILINE)
    assert len(quoted) == len(printed) == 3
    assert "three warnings" in section
    for text, line in zip(quoted, printed, strict=True):
        assert line.startswith(text), (text, line)


# --- figures, each from the function that computes it ----------------------------------------------
def test_the_cost_figures_are_the_estimates() -> None:
    s = Settings()
    low, high = hourly_cost_range(s)
    assert low == high
    assert f"**${low:.2f} an hour**" in README
    section = GETTING_STARTED.split("### Cost", 1)[1].split("\n## ", 1)[0]
    assert f"**~${low:.2f}/h**" in section
    lines = hourly_cost(s)
    disks = next(line for line in lines if line.item.startswith("gp3"))
    priced = {line.unit_per_hour for line in lines if line is not disks}
    assert {float(price) for price in re.findall(r"\(\$([\d.]+)", section)} == priced
    assert f"{disks.count} GB\nof gp3" in section
    gpu_nodes = sizing.gpu_node_bounds(s)[0]
    assert f"{gpu_nodes} × {s.gpu_instance_type}" in section
    assert f"{s.system_nodes_desired} × {s.system_instance_type}" in section
    assert f"{s.max_azs} NAT gateways" in section
    ranged = Settings(decode_max_replicas=3)
    r_low, r_high = hourly_cost_range(ranged)
    low_nodes, high_nodes = sizing.gpu_node_bounds(ranged)
    assert f"~${r_low:.2f}/h at {low_nodes} GPU nodes to ~${r_high:.2f}/h at {high_nodes}" in section


def test_the_quota_and_version_figures_are_the_catalog() -> None:
    s = Settings()
    gpu = catalog.INSTANCE_TYPES[s.gpu_instance_type]
    nodes = sizing.gpu_node_bounds(s)[1]
    vcpus = f"{nodes * gpu.vcpus} vCPUs"
    assert vcpus in README
    assert f"{vcpus} for the default {nodes} × {s.gpu_instance_type}" in GETTING_STARTED
    major, minor = catalog.DEFAULT_KUBERNETES_VERSION.split(".")
    skew = f"{major}.{int(minor) - 1} to {major}.{int(minor) + 1}"  # kubectl: one minor version either side
    assert f"`kubectl` {skew}" in README
    assert f"{skew} for the default `kubernetes_version`, {catalog.DEFAULT_KUBERNETES_VERSION}" in GETTING_STARTED


def test_the_template_size_is_the_synthesized_one() -> None:
    """The handoff's "about N KB, about M resources": within a tenth of the defaults' template as synth writes it."""
    template = synth()
    written_kb = len(json.dumps(template, indent=1)) / 1000
    found = re.search(
        r"about (\d+) KB on the defaults, as synth writes it, with about\s+(\d+) resources", GETTING_STARTED
    )
    assert found, "the handoff's size sentence"
    kb, count = int(found.group(1)), int(found.group(2))
    assert abs(kb - written_kb) <= written_kb / 10, (kb, written_kb)
    assert abs(count - len(template["Resources"])) <= len(template["Resources"]) / 10, (
        count,
        len(template["Resources"]),
    )


def test_clean_up_names_the_tag_the_app_sets() -> None:
    app_source = (ROOT / "app.py").read_text(encoding="utf-8")
    tags = dict(re.findall(r'cdk\.Tags\.of\(app\)\.add\("([\w-]+)", "([\w-]+)"\)', app_source))
    section = GETTING_STARTED.split("## Clean-up", 1)[1]
    assert GETTING_STARTED.rstrip().endswith(section.rstrip()), "clean-up ends the page"
    for key, value in tags.items():
        assert f"`{key}={value}`" in section
    assert f"Key=project,Values={tags['project']}" in section
    assert f"--stack-name {STACK_NAME} " in section
    assert f"Values={Settings().cluster_name}" in section
    assert "make destroy SETTINGS=" in section
    assert "(operations.md#what-cdk-destroy-removes)" in section


@pytest.mark.parametrize(("model_id", "thinks"), [("Qwen/Qwen3-8B", True), ("Qwen/Qwen2.5-7B-Instruct", False)])
def test_the_stacks_chat_example_turns_a_thinking_models_thinking_off(model_id: str, thinks: bool) -> None:
    """The output a user copies after a deploy answers in content at 64 tokens, as the README's example does."""
    example = synth(model_id=model_id)["Outputs"]["ChatCompletionExample"]["Value"]
    body = json.loads(example.split("-d '", 1)[1].rsplit("'", 1)[0])
    assert body["model"] == model_id and body["max_tokens"] == 64
    assert body.get("chat_template_kwargs") == ({"enable_thinking": False} if thinks else None)
