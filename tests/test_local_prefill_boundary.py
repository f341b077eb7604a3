"""A prompt exactly at local_prefill_max_tokens is prefilled on decode (ray_pods/selective_pd.py, choose_route:
"at most"): bench's recompute flag and verify's short-prompt judgement read the threshold the same way."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import require_serve_deps
from tests.support.bench_result import RESULT
from tools import bench_results
from tools.cluster_access import NixlSnapshot
from tools.verify_judgement import local_prefill_check

THRESHOLD = 1024
QUIET = (NixlSnapshot(3, 0.3, 0), 180.0)  # no NIXL transfer, prefill's prompt counter still


def _bench_row(prompt_tokens: int, transfers: int) -> dict[str, Any]:
    """A selective point of 4 completed requests, every prompt this long, with this many NIXL transfers."""
    return bench_results.row(
        bench_results.Point(prompt_tokens, 4),
        RESULT,
        NixlSnapshot(0, 0.0, 0),
        NixlSnapshot(transfers, 0.1 * transfers, 0),
        serving_mode="disaggregated",
        local_prefill_max_tokens=THRESHOLD,
    )


def test_a_bench_point_at_the_threshold_is_decodes_own_prefill_not_recompute() -> None:
    at = _bench_row(THRESHOLD, 0)
    assert at["requests_without_transfer"] is None, at["notes"]
    assert "local recompute" not in at["notes"]
    assert f"prefilled on decode: prompts of at most local_prefill_max_tokens = {THRESHOLD}" in at["notes"]
    # One token more is split: with no transfer every request was prefilled again on decode.
    above = _bench_row(THRESHOLD + 1, 0)
    assert above["requests_without_transfer"] == 4 and "local recompute" in above["notes"]


def test_verify_takes_a_prompt_at_the_threshold_as_short() -> None:
    assert local_prefill_check(THRESHOLD, THRESHOLD, QUIET, QUIET).ok
    assert not local_prefill_check(THRESHOLD, THRESHOLD + 1, QUIET, QUIET).ok


@pytest.mark.serve
@pytest.mark.parametrize("tokens", [THRESHOLD - 1, THRESHOLD, THRESHOLD + 1])
def test_bench_and_verify_agree_with_the_route_decode_takes(tokens: int) -> None:
    require_serve_deps()
    from ray_pods.selective_pd import LOCAL, choose_route  # ray: imported only with the serving stack

    local = choose_route(None, THRESHOLD, tokens)[0] == LOCAL
    assert local_prefill_check(THRESHOLD, tokens, QUIET, QUIET).ok is local
    assert (_bench_row(tokens, 0)["requests_without_transfer"] is None) is local
