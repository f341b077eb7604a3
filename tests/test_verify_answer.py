"""verify's chat row: an answer, or a thinking model's reasoning when max_tokens ran out first (vLLM 0.26's fields)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import require_serve_deps
from tools.verify_judgement import answer_check


def _body(content: str | None, reasoning: str | None) -> dict[str, Any]:
    """A chat completion as vLLM 0.26 serializes it, from its own response models."""
    require_serve_deps()
    from vllm.entrypoints.openai.chat_completion.protocol import (
        ChatCompletionResponse,
        ChatCompletionResponseChoice,
        ChatMessage,
    )
    from vllm.entrypoints.openai.engine.protocol import UsageInfo

    message = ChatMessage(role="assistant", content=content, reasoning=reasoning)
    choice = ChatCompletionResponseChoice(index=0, message=message, finish_reason="length")
    response = ChatCompletionResponse(model="m", choices=[choice], usage=UsageInfo(prompt_tokens=1))
    body: dict[str, Any] = response.model_dump(mode="json")
    return body


@pytest.mark.serve
def test_a_thinking_model_cut_by_max_tokens_passes_on_its_reasoning() -> None:
    check = answer_check(_body(None, "Okay, the user said hello"))
    assert check.ok and "25 characters of reasoning" in check.detail


@pytest.mark.serve
def test_an_answer_passes_and_counts_both_fields() -> None:
    check = answer_check(_body("Hello!", "The user greets me."))
    assert check.ok and check.detail == "6 characters of answer, 19 of reasoning"
    assert answer_check(_body("Hello!", None)).detail == "6 characters of answer"


@pytest.mark.serve
def test_no_text_at_all_fails() -> None:
    assert not answer_check(_body(None, None)).ok
    assert not answer_check(_body("", None)).ok


def test_a_body_without_choices_fails_with_what_came_back() -> None:
    check = answer_check({"object": "error", "message": "boom"})
    assert not check.ok and "boom" in check.detail
