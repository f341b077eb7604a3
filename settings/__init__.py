"""Typed, validated settings for the stack (see docs/settings.md)."""

from settings.loading import (
    CONTEXT_FILE,
    SETTINGS_FILE_KEY,
    context_with,
    project_context,
    read_settings_file,
    settings_from,
    settings_from_cli,
)
from settings.model import SETTING_NAMES, Settings, SettingsError
from settings.rules import validate

__all__ = [
    "CONTEXT_FILE",
    "SETTINGS_FILE_KEY",
    "SETTING_NAMES",
    "Settings",
    "SettingsError",
    "context_with",
    "project_context",
    "read_settings_file",
    "settings_from",
    "settings_from_cli",
    "validate",
]
