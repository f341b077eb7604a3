"""The selective phase's TTFT comparison (rehearsal/selective.py): a verdict only where the paired interval says so."""

from __future__ import annotations

import random

from rehearsal.selective import LOCAL, SPLIT, TTFT_ROUNDS, ShortTtfts
from tests.conftest import require_serve_deps


def _ttfts(local: list[float], split: list[float]) -> ShortTtfts:
    return ShortTtfts({LOCAL: local, SPLIT: split}, [], float(len(split)), 1.0, 1.0)


def test_a_steady_paired_gap_is_a_difference_though_each_route_spreads_widely() -> None:
    """As the CPU rehearsal sees it: rounds vary by hundreds of ms, and split is about 80 ms slower in each."""
    rng = random.Random(0)
    base = [rng.uniform(0.08, 0.6) for _ in range(TTFT_ROUNDS)]
    measured = _ttfts(base, [b + rng.uniform(0.05, 0.11) for b in base])
    local, split = measured.summary()[LOCAL], measured.summary()[SPLIT]
    assert local is not None and split is not None and local[2] > split[1]  # the routes' intervals overlap
    assert measured.verdict() == "local faster (the paired interval is above 0)"
    assert _ttfts([b + 0.08 for b in base], base).verdict() == "split faster (the paired interval is below 0)"


def test_noise_either_way_is_no_difference_shown() -> None:
    rng = random.Random(1)
    base = [rng.uniform(0.08, 0.6) for _ in range(TTFT_ROUNDS)]
    noisy = _ttfts(base, [b + rng.uniform(-0.1, 0.1) for b in base])
    assert noisy.verdict() == "no difference shown (the paired interval spans 0)"
    assert _ttfts([], []).verdict() == "no verdict"


def test_the_phase_names_the_routes_as_the_pods_do() -> None:
    require_serve_deps()
    from ray_pods import selective_pd  # imports ray: make test-fast runs without it

    assert (LOCAL, SPLIT) == (selective_pd.LOCAL, selective_pd.SPLIT)
