"""The paths at which two templates differ."""

from __future__ import annotations

from typing import Any


def differing_paths(old: Any, new: Any, prefix: str = "") -> set[str]:
    """Dotted paths where new differs from old; list items are compared element-wise as []."""
    if isinstance(old, dict) and isinstance(new, dict):
        found: set[str] = set()
        for key in set(old) | set(new):
            where = f"{prefix}.{key}" if prefix else str(key)
            if key in old and key in new:
                found |= differing_paths(old[key], new[key], where)
            elif isinstance(new.get(key), dict):
                found |= differing_paths({}, new[key], where)  # every leaf that was added
            else:
                found.add(where)
        return found
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return {p for a, b in zip(old, new, strict=True) for p in differing_paths(a, b, f"{prefix}[]")}
    return set() if old == new else {prefix}
