"""Ray Serve's Counter as the product's replicas make and increment it, recorded for the tests."""

from __future__ import annotations

from typing import Any, ClassVar


class RecordingCounter:
    """Each Counter made, with its tag keys and the tags of every increment; `made` is reset by each test."""

    made: ClassVar[list[dict[str, Any]]] = []

    def __init__(self, name: str, description: str = "", tag_keys: tuple[str, ...] = ()) -> None:
        self.record: dict[str, Any] = {"name": name, "tag_keys": tag_keys, "tags": []}
        RecordingCounter.made.append(self.record)

    def inc(self, value: float = 1.0, tags: dict[str, str] | None = None) -> None:
        assert set(tags or {}) <= set(self.record["tag_keys"]), "Ray refuses a tag not in tag_keys"
        self.record["tags"].append(dict(tags or {}))
