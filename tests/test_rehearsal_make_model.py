"""The rehearsal's tiny model (rehearsal/make_model.py): made once a run and copied to each case; it thinks as Qwen3
does, so the rehearsal can check where the serving path puts its thinking."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rehearsal import make_model
from settings import catalog
from tests.conftest import require_serve_deps


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


# --- The tiny model thinks as Qwen3 does: its template's thinking branch, its think tokens ------------------

HELLO = [{"role": "user", "content": "Hello"}]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return make_model.make_tokenizer()


def test_the_tiny_models_prompt_thinks_unless_the_request_turns_thinking_off(tokenizer: Any) -> None:
    def prompt(**kwargs: Any) -> str:
        text: str = tokenizer.apply_chat_template(HELLO, tokenize=False, add_generation_prompt=True, **kwargs)
        return text

    # Qwen3's template: the model opens its own think block, unless enable_thinking is false.
    assert prompt() == prompt(enable_thinking=True) == "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n"
    assert prompt(enable_thinking=False) == prompt() + "<think>\n\n</think>\n\n"


def test_the_think_tokens_are_single_ids_the_model_can_embed(tokenizer: Any) -> None:
    ids = [tokenizer.convert_tokens_to_ids(token) for token in make_model.THINK]
    assert [tokenizer.encode(token) for token in make_model.THINK] == [[i] for i in ids]
    assert all(0 <= i < make_model.CONFIG["vocab_size"] for i in ids)
    assert len(tokenizer) <= make_model.CONFIG["vocab_size"]


@pytest.mark.serve
def test_vllms_qwen3_parser_reads_the_tiny_models_switch(tokenizer: Any) -> None:
    """What vLLM 0.26 passes on to the template, and where its qwen3 parser puts the model's text, either way."""
    require_serve_deps()
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.reasoning import ReasoningParserManager
    from vllm.renderers.hf import resolve_chat_template_kwargs

    off = dict(catalog.THINKING_OFF["qwen3"])
    # vLLM keeps only the kwargs the template reads: the switch reaches this template.
    assert resolve_chat_template_kwargs(tokenizer, make_model.CHAT_TEMPLATE, off) == off
    parser_cls = ReasoningParserManager.get_reasoning_parser(catalog.MODELS[catalog.DEFAULT_MODEL_ID].reasoning_parser)
    request = ChatCompletionRequest(model="m", messages=HELLO)
    text = "tokens with no closing think tag"
    assert parser_cls(tokenizer, chat_template_kwargs={}).extract_reasoning(text, request) == (text, None)
    assert parser_cls(tokenizer, chat_template_kwargs=off).extract_reasoning(text, request) == (None, text)
