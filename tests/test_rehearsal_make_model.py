"""The rehearsal's tiny model is made once a run and copied to each case (rehearsal/make_model.py, made)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rehearsal import make_model


def test_the_cases_of_a_run_share_one_made_model_each_with_a_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[Path] = []

    def fake_make(out: Path) -> Path:
        calls.append(out)
        (out / "model.safetensors").write_bytes(b"weights")
        return out

    monkeypatch.setattr(make_model, "make", fake_make)
    cache = tmp_path / "cache"
    first = make_model.made(tmp_path / "a" / "model", cache)
    second = make_model.made(tmp_path / "b" / "model", cache)
    assert len(calls) == 1
    assert (first / "model.safetensors").read_bytes() == (second / "model.safetensors").read_bytes() == b"weights"
    assert first != second
    # What makes the model changing makes it again, and the stale one goes.
    monkeypatch.setattr(make_model, "corpus", lambda: ["other text"])
    make_model.made(tmp_path / "c" / "model", cache)
    assert len(calls) == 2
    assert len(list(cache.glob("model-*"))) == 1
