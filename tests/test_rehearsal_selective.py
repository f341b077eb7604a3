"""The selective phase's mix of short and long prompts (rehearsal/selective_mix.py): blocks that alternate between
always-split and selective, paired block by block, a verdict only where the paired interval says so, and the KV
the routes imply."""

from __future__ import annotations

import random

from rehearsal import selective_mix
from rehearsal.selective_mix import (
    AGGREGATED,
    ALWAYS_SPLIT,
    BLOCKS,
    CLIENTS,
    LONG,
    MAX_TOKENS,
    SELECTIVE,
    SHORT,
    Mix,
    Sent,
)
from rehearsal.streams import Outcome
from tests.conftest import require_serve_deps


def _outcome(ttft_s: float, tpot_s: float) -> Outcome:
    return Outcome(
        started=0.0,
        status=200,
        chunks=MAX_TOKENS,
        done=True,
        first_chunk=ttft_s,
        ended=ttft_s + tpot_s * (MAX_TOKENS - 1),
    )


def _mix(short_ttft: dict[str, list[float]], long_tpot: dict[str, list[float]], blocks: int = BLOCKS) -> Mix:
    """A mix as the phase sends it: per block, slots alternate short and long; each route's values taken in order."""
    taken = {
        key: iter(values) for key, values in {**short_ttft, **{f"{r} tpot": v for r, v in long_tpot.items()}}.items()
    }
    mix = Mix()
    for block, route in enumerate(selective_mix.block_routes(blocks, (ALWAYS_SPLIT, SELECTIVE))):
        for slot in range(CLIENTS):
            if slot % 2 == 0:
                sent = Sent(block, route, SHORT, slot, _outcome(next(taken[route]), 0.03))
            else:
                sent = Sent(block, route, LONG, slot, _outcome(0.2, next(taken[f"{route} tpot"])))
            mix.sent.append(sent)
    return mix


def _per_route(values: list[float], shift: float) -> dict[str, list[float]]:
    return {ALWAYS_SPLIT: [v + shift for v in values], SELECTIVE: list(values)}


def test_blocks_alternate_and_neither_route_always_goes_first() -> None:
    routes = selective_mix.block_routes(8, (ALWAYS_SPLIT, SELECTIVE))
    assert routes.count(ALWAYS_SPLIT) == routes.count(SELECTIVE) == 4
    assert [routes[i] for i in range(0, 8, 2)] == [ALWAYS_SPLIT, SELECTIVE, ALWAYS_SPLIT, SELECTIVE]
    assert all(routes[i] != routes[i + 1] for i in range(0, 8, 2))
    assert selective_mix.block_routes(3, (AGGREGATED,)) == [AGGREGATED] * 3


def test_a_steady_paired_gap_is_a_difference_though_each_route_spreads_widely() -> None:
    """As the CPU rehearsal sees it: blocks vary by hundreds of ms, and the split is about 80 ms slower in each."""
    rng = random.Random(0)
    pairs = BLOCKS // 2 * CLIENTS // 2
    # Each block pair shares a base (the machine's state then); the split adds 50-110 ms to it.
    bases = [rng.uniform(0.08, 0.6) for _ in range(pairs)]
    split = [b + rng.uniform(0.05, 0.11) for b in bases]
    mix = _mix({ALWAYS_SPLIT: split, SELECTIVE: bases}, _per_route([0.04] * pairs, 0.0))
    figures = selective_mix.figures(mix, ALWAYS_SPLIT), selective_mix.figures(mix, SELECTIVE)
    split_short, selective_short = figures[0]["short TTFT"], figures[1]["short TTFT"]
    assert split_short is not None and selective_short is not None
    assert selective_short.p50[2] > split_short.p50[1]  # the routes' intervals overlap
    verdict, interval = selective_mix.paired_verdict(mix.paired(SHORT, "TTFT"))
    assert verdict == "selective lower" and interval is not None and 50 <= interval[0] <= 110
    swapped = _mix({ALWAYS_SPLIT: bases, SELECTIVE: split}, _per_route([0.04] * pairs, 0.0))
    assert selective_mix.paired_verdict(swapped.paired(SHORT, "TTFT"))[0] == "always split lower"


def test_noise_either_way_is_no_difference_shown_and_too_few_pairs_no_verdict() -> None:
    rng = random.Random(1)
    pairs = BLOCKS // 2 * CLIENTS // 2
    tpots = [rng.uniform(0.03, 0.05) for _ in range(pairs)]
    # As often faster as slower, by as much: noise with no side.
    noise = [u for v in (rng.uniform(0.0, 0.01) for _ in range(pairs // 2)) for u in (v, -v)]
    split = [t + n for t, n in zip(tpots, noise, strict=True)]
    mix = _mix(_per_route([0.1] * pairs, 0.05), {ALWAYS_SPLIT: split, SELECTIVE: tpots})
    assert selective_mix.paired_verdict(mix.paired(LONG, "TPOT"))[0] == "no difference shown"
    assert "long TPOT split - selective" in selective_mix.verdicts(mix)
    assert selective_mix.paired_verdict([0.1, 0.2, 0.3])[0] == "no verdict"


def test_pairs_are_the_same_slot_in_adjacent_blocks_of_different_routes() -> None:
    """A drift across the run must not show as a difference: pairs come from blocks sent back to back."""
    pairs = BLOCKS // 2 * CLIENTS // 2
    # Each block pair is 1 s slower than the one before; within a pair the routes are equal.
    drift = [float(i // (CLIENTS // 2)) for i in range(pairs)]
    mix = _mix(_per_route(drift, 0.0), _per_route([0.04] * pairs, 0.0))
    assert mix.paired(SHORT, "TTFT") == [0.0] * pairs
    assert selective_mix.paired_verdict(mix.paired(SHORT, "TTFT"))[0] == "no difference shown"


def test_the_kv_the_routes_imply() -> None:
    """Every request of an always-split block moves its KV; a selective block's long ones alone; aggregated none."""
    assert selective_mix.expected_transfers(BLOCKS, (ALWAYS_SPLIT, SELECTIVE)) == BLOCKS // 2 * CLIENTS * 3 // 2
    assert selective_mix.expected_transfers(BLOCKS // 2, (AGGREGATED,)) == 0


def test_a_failed_request_is_not_a_figure() -> None:
    mix = Mix([Sent(0, SELECTIVE, SHORT, 0, Outcome(started=0.0, status=503, error="busy"))])
    assert mix.failed() == ["503: busy"] and mix.values(SELECTIVE, SHORT, "TTFT") == []
    assert selective_mix.Figure.of([]) is None


def test_the_phase_names_the_routes_as_the_pods_do() -> None:
    require_serve_deps()
    from ray_pods import selective_pd  # imports ray: make test-fast runs without it

    assert (selective_mix.LOCAL, selective_mix.SPLIT) == (selective_pd.LOCAL, selective_pd.SPLIT)
    # What decode's choice gives the mix's requests at the phase's threshold of 64 (about 21 and 338 tokens).
    chosen = {
        selective_pd.choose_route(selective_mix.SPLIT, 64, None),
        selective_pd.choose_route(None, 64, 21),
        selective_pd.choose_route(None, 64, 338),
    }
    assert set(selective_mix.expected_routes(BLOCKS)) == chosen


def test_the_route_counter_adds_one_for_each_request_and_split_ones_match_the_transfers() -> None:
    routes = selective_mix.expected_routes(BLOCKS)
    assert sum(routes.values()) == BLOCKS * CLIENTS
    split = sum(n for (prefill, _), n in routes.items() if prefill == selective_mix.SPLIT)
    assert split == selective_mix.expected_transfers(BLOCKS)
