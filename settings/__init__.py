"""Typed, validated settings for the stack (see README "Settings")."""

from settings.loading import SETTINGS_FILE_KEY, read_settings_file, settings_from, settings_from_cli
from settings.model import SETTING_NAMES, Settings, SettingsError, validate

__all__ = [
    "SETTINGS_FILE_KEY",
    "SETTING_NAMES",
    "Settings",
    "SettingsError",
    "read_settings_file",
    "settings_from",
    "settings_from_cli",
    "validate",
]
