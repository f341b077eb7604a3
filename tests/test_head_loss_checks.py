"""The head-loss case's first-token check (rehearsal/head_loss.py): a request frozen behind a lost prefix tree, or
never answered, is caught; one that paid the routers' bounded waits is not."""

from __future__ import annotations

from rehearsal.head_loss import slow_first_tokens
from rehearsal.margins import FIRST_TOKEN_WITHOUT_HEAD, MARGIN
from rehearsal.streams import Outcome
from tests.conftest import require_serve_deps


def _sent(at: float, first_token_after: float | None) -> Outcome:
    return Outcome(started=at, first_chunk=None if first_token_after is None else at + first_token_after)


def test_a_frozen_or_unanswered_request_is_slow_and_the_routers_bounded_waits_are_not() -> None:
    require_serve_deps()
    from ray_pods.prefix_routing import TREE_CALL_TIMEOUT_S  # imports ray

    # The first request after the kill waits for the tree at each of its two routers, then a usual first token.
    bounded = _sent(100.0, 2 * TREE_CALL_TIMEOUT_S + 0.2)
    frozen = _sent(101.0, 36.0)  # the router before its tree calls were bounded, the head back at once
    never = _sent(102.0, None)
    assert slow_first_tokens([bounded], FIRST_TOKEN_WITHOUT_HEAD.limit_s) == []
    assert slow_first_tokens([bounded, frozen, never], FIRST_TOKEN_WITHOUT_HEAD.limit_s) == [frozen, never]
    assert FIRST_TOKEN_WITHOUT_HEAD.limit_s >= MARGIN * 2 * TREE_CALL_TIMEOUT_S
