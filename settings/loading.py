"""Build Settings from a settings file and CDK context (-c key=value).

Precedence: defaults < settings file < context. The context is what the CDK
CLI hands the app, merged as the pinned CLI merges it
(aws-cdk lib/cli/user-configuration.js: the first source that has a key
wins): -c on the command line, then cdk.json's "context", then
cdk.context.json (where `tools.preflight --write-context` records the GPU AZ
and region). Every value from the command line arrives as a string and is
coerced to the field's type here, so the rest of the code only sees typed values.
"""

from __future__ import annotations

import difflib
import json
import types
import typing
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

import yaml

from settings.model import SETTING_NAMES, Settings, SettingsError
from settings.project import ROOT as PROJECT_ROOT
from settings.rules import validate

SETTINGS_FILE_KEY = "settings_file"
# The CDK's own file of lookup answers; each deployment keeps its own.
CONTEXT_FILE = "cdk.context.json"

# Context keys that belong to the CDK itself, not to us.
_CDK_OWNED_PREFIXES = ("@aws-cdk", "aws:cdk", "aws-cdk", "cdk-", "@")
_CDK_OWNED_KEYS = frozenset({"acknowledged-issue-numbers", SETTINGS_FILE_KEY})

_TRUE = frozenset({"true", "yes", "1", "on"})
_FALSE = frozenset({"false", "no", "0", "off"})
_NONE = frozenset({"", "none", "null"})

_HINTS = typing.get_type_hints(Settings)


def _is_ours(key: str) -> bool:
    # Lookup results in cdk.context.json carry ':' in their keys.
    return ":" not in key and key not in _CDK_OWNED_KEYS and not key.startswith(_CDK_OWNED_PREFIXES)


def _coerce(key: str, raw: Any) -> Any:
    hint = _HINTS[key]
    optional = False
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        optional, hint = True, args[0]
    if raw is None or (isinstance(raw, str) and raw.strip().lower() in _NONE and hint is not str):
        if optional:
            return None
        if typing.get_origin(hint) is tuple:
            return ()
        raise SettingsError(key, raw, "a value is required")
    if optional and isinstance(raw, str) and raw.strip().lower() in _NONE:
        return None
    if hint is bool:
        if isinstance(raw, bool):
            return raw
        text = str(raw).strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        raise SettingsError(key, raw, "true or false")
    if hint is int:
        if isinstance(raw, bool):
            raise SettingsError(key, raw, "a whole number")
        try:
            return int(str(raw).strip())
        except ValueError:
            raise SettingsError(key, raw, "a whole number") from None
    if hint is float:
        try:
            return float(str(raw).strip())
        except ValueError:
            raise SettingsError(key, raw, "a number") from None
    if typing.get_origin(hint) is tuple:
        if isinstance(raw, str):
            text = raw.strip()
            try:
                items = json.loads(text) if text.startswith("[") else text.split(",")
            except json.JSONDecodeError:
                raise SettingsError(key, raw, "a JSON list or comma-separated text") from None
            if not isinstance(items, list):
                raise SettingsError(key, raw, "a JSON list or comma-separated text")
        elif isinstance(raw, (list, tuple)):
            items = list(raw)
        else:
            raise SettingsError(key, raw, "a list, or comma-separated text")
        return tuple(str(i).strip() for i in items if str(i).strip())
    if not isinstance(raw, (str, int, float)):
        raise SettingsError(key, raw, "text")
    return str(raw).strip()


def _nearest(key: str) -> str:
    close = difflib.get_close_matches(key, SETTING_NAMES, n=1, cutoff=0.6)
    if close:
        return f"did you mean '{close[0]}'? (README \"Settings\" lists them all)"
    return f"settings are {sorted(SETTING_NAMES)}"


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a key given twice in one mapping is refused: YAML 1.2 and JSON
    (RFC 8259: names "SHOULD be unique") leave it to the reader, and PyYAML silently keeps the last."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        # A merge key (<<) may be overridden by design: such a mapping is read as PyYAML reads it.
        if not any(key_node.tag == "tag:yaml.org,2002:merge" for key_node, _ in node.value):
            seen: dict[Any, int] = {}
            for key_node, value_node in node.value:
                key = self.construct_object(key_node, deep=deep)
                line = key_node.start_mark.line + 1
                if isinstance(key, str) and key in seen:
                    value = self.construct_object(value_node, deep=True)
                    raise _DuplicateKeyError(key, value, seen[key], line)
                if isinstance(key, str):
                    seen[key] = line
        return super().construct_mapping(node, deep=deep)


class _DuplicateKeyError(Exception):
    def __init__(self, key: str, value: object, first: int, second: int) -> None:
        super().__init__(key)
        self.key, self.value, self.first, self.second = key, value, first, second


def _yaml_error(err: yaml.YAMLError) -> str:
    """PyYAML's error in one line, with the line and column it names (its text spreads them over several)."""
    if isinstance(err, yaml.MarkedYAMLError) and err.problem_mark is not None:
        mark = err.problem_mark
        what = " ".join(part for part in (err.problem, err.context) if part) or type(err).__name__
        return f"line {mark.line + 1}, column {mark.column + 1}: {what}"
    return str(err).splitlines()[0]


def read_settings_file(path: str | Path) -> dict[str, Any]:
    """A YAML or JSON mapping of setting names to values; a key given twice is refused."""
    file = Path(path)
    try:
        data = yaml.load(file.read_text(encoding="utf-8"), Loader=_StrictLoader)  # noqa: S506 - a SafeLoader
    except OSError as err:
        raise SettingsError(SETTINGS_FILE_KEY, str(path), f"a readable file ({err.strerror})") from None
    except _DuplicateKeyError as dup:
        raise SettingsError(
            dup.key,
            dup.value,
            f"given twice in {path}, at lines {dup.first} and {dup.second} (only one would count); keep one",
        ) from None
    except yaml.YAMLError as err:
        raise SettingsError(SETTINGS_FILE_KEY, str(path), f"YAML or JSON ({_yaml_error(err)})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SettingsError(SETTINGS_FILE_KEY, str(path), "a mapping of setting names to values")
    for key in data:
        if key not in SETTING_NAMES:
            raise SettingsError(str(key), data[key], f"not a setting (in {path}); {_nearest(str(key))}")
    return dict(data)


def settings_from(context: Mapping[str, Any]) -> Settings:
    """Settings from CDK context, including the file it may name; validated."""
    merged: dict[str, Any] = {}
    file = context.get(SETTINGS_FILE_KEY)
    if file:
        merged.update(read_settings_file(str(file)))
    for key, value in context.items():
        if not _is_ours(key):
            continue
        if key not in SETTING_NAMES:
            raise SettingsError(key, value, f"not a setting; {_nearest(key)}")
        merged[key] = value
    typed = {f.name: _coerce(f.name, merged[f.name]) for f in fields(Settings) if f.name in merged}
    # The keys the user gave, not only their values: a setting given where it has no effect is refused
    # even at its default (settings/rules/effect.py).
    return validate(Settings(**typed), given=frozenset(typed))


def project_context(root: Path = PROJECT_ROOT) -> dict[str, Any]:
    """The context the CDK CLI reads from files: cdk.json's "context" over cdk.context.json."""
    context: dict[str, Any] = {}
    context_file = root / CONTEXT_FILE
    if context_file.exists():
        try:
            context.update(json.loads(context_file.read_text(encoding="utf-8")))
        except json.JSONDecodeError as err:
            raise SettingsError(CONTEXT_FILE, str(context_file), f"a JSON object ({err.msg})") from None
    context.update(json.loads((root / "cdk.json").read_text(encoding="utf-8"))["context"])
    return context


def context_with(pairs: list[str], root: Path = PROJECT_ROOT) -> dict[str, Any]:
    """The project's context with `-c key=value` pairs on top, as `cdk synth -c` merges them."""
    context = project_context(root)
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SettingsError(key, pair, "-c key=value")
        context[key] = value
    return context


def settings_from_cli(pairs: list[str], root: Path = PROJECT_ROOT) -> Settings:
    """Settings for a command run beside the stack, read as `cdk synth -c ...` would read them."""
    return settings_from(context_with(pairs, root))
