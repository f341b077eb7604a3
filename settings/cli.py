"""How every command-line tool reads its settings: `-c key=value` pairs and the settings file.

A bad value ends the tool with one line that names the setting and what is allowed, and exit
code 2, as `cdk synth` does; never a stack trace.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, NoReturn

from settings.loading import context_with, settings_from
from settings.model import Settings, SettingsError
from settings.project import ROOT

# The exit code for "could not start": a bad setting, or a cluster or account out of reach.
USAGE_EXIT = 2


def fail(message: str) -> NoReturn:
    """One line on stderr, worded as `cdk synth` words it, and exit code 2."""
    print(f"error: {message.splitlines()[0]}" if message else "error", file=sys.stderr)
    raise SystemExit(USAGE_EXIT)


def cli_settings(pairs: list[str], root: Path = ROOT) -> Settings:
    """The settings `cdk synth` would read with these `-c` pairs; exits 2 with one line on a bad value."""
    return cli_context(pairs, root)[1]


def cli_context(pairs: list[str], root: Path = ROOT) -> tuple[dict[str, Any], Settings]:
    """The context `cdk synth` would see with these `-c` pairs, and its settings; exits 2 on a bad value."""
    try:
        context = context_with(pairs, root)
        return context, settings_from(context)
    except SettingsError as err:
        fail(str(err))
