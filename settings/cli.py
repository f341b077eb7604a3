"""How every command-line tool reads its settings: `-c key=value` pairs and the settings file.

A bad value ends the tool with one line that names the setting and what is allowed, and exit
code 2, as `cdk synth` does; never a stack trace.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NoReturn

from settings.loading import settings_from_cli
from settings.model import Settings, SettingsError
from settings.project import ROOT

# The exit code for "could not start": a bad setting, or a cluster or account out of reach.
USAGE_EXIT = 2


def fail(message: str) -> NoReturn:
    """One line on stderr, exit code 2."""
    print(message.splitlines()[0] if message else "error", file=sys.stderr)
    raise SystemExit(USAGE_EXIT)


def cli_settings(pairs: list[str], root: Path = ROOT) -> Settings:
    """The settings `cdk synth` would read with these `-c` pairs; exits 2 with one line on a bad value."""
    try:
        return settings_from_cli(pairs, root)
    except SettingsError as err:
        fail(str(err))
