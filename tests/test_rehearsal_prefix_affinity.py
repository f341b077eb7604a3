"""The prefix-routing run's parts (rehearsal/prefix_affinity.py): a replica's counters are its own, the workload is
what it says, and a run with a request unanswered or not split, or one prefill replica, fails."""

from __future__ import annotations

import gzip
from pathlib import Path

from rehearsal import prefix_affinity, streams
from rehearsal.context import Context
from rehearsal.prefix_affinity import AFFINITY, COUNTERS, HITS, POW2, PROMPT, QUERIES, Run
from tools.cluster_access import metric_total

DATA = Path(__file__).parent / "data"


def _scrape(name: str) -> str:
    return gzip.decompress((DATA / name).read_bytes()).decode()


def test_each_counter_is_read_from_a_real_scrape_by_the_replica_that_counted_it() -> None:
    """The names and the ReplicaId label as Ray 2.58 exports vLLM's counters (a rehearsal's live scrape)."""
    decode, prefill = _scrape("observability_scrape_decode.prom.gz"), _scrape("observability_scrape_prefill.prom.gz")
    reading = prefix_affinity.parse([prefill, decode])
    replicas = [r for r in reading.by_replica if r]
    assert len(replicas) == 2
    (decode_replica,) = (r for r in replicas if f'ReplicaId="{r}"' in decode)
    for name in COUNTERS:
        assert metric_total(decode, name.removesuffix("_total")) == reading.by_replica[decode_replica][name], name
    assert reading.by_replica[decode_replica][prefix_affinity.NIXL_TRANSFERS] > 0
    itl = reading.itl[decode_replica]
    assert itl.count > 0 and itl.quantile(0.5) is not None


def test_the_workload_repeats_each_prefix_round_by_round_and_each_run_has_new_ones() -> None:
    texts = prefix_affinity.prompts(1)
    assert len(texts) == prefix_affinity.PREFIXES * prefix_affinity.PER_PREFIX
    prefixes = [t.split("\nQuestion")[0] for t in texts]
    for start in range(0, len(texts), prefix_affinity.PREFIXES):
        assert len(set(prefixes[start : start + prefix_affinity.PREFIXES])) == prefix_affinity.PREFIXES
    assert len(set(texts)) == len(texts)
    assert not set(prefixes) & {t.split("\nQuestion")[0] for t in prefix_affinity.prompts(2)}


def _run(tokens: dict[str, float], transfers: float | None = None) -> Run:
    outcomes = [
        streams.Outcome(started=0.0, status=200, chunks=8, done=True, ended=1.0, first_chunk=0.1 + i / 100)
        for i in range(prefix_affinity.PREFIXES * prefix_affinity.PER_PREFIX)
    ]
    prefill = {n: {**dict.fromkeys(COUNTERS, 0.0), PROMPT: t, QUERIES: t, HITS: t / 2} for n, t in tokens.items()}
    transfers = float(len(outcomes)) if transfers is None else transfers
    return Run(AFFINITY, outcomes, prefill, 1.0, transfers, client_tokens=int(sum(tokens.values())))


def test_a_run_passes_only_answered_split_on_two_replicas_with_the_prompt_tokens_the_client_counted() -> None:
    (good,) = prefix_affinity.run_checks(_run({"10.0.0.1": 900.0, "10.0.0.3": 400.0}))
    assert good.ok, good.detail
    assert "hit rate 50%" in good.detail
    (pinned,) = prefix_affinity.run_checks(_run({"10.0.0.1": 900.0, "10.0.0.3": 0.0}))
    assert pinned.ok, "a light load kept on one replica is the router's choice, reported"
    (one,) = prefix_affinity.run_checks(_run({"10.0.0.1": 900.0}))
    assert not one.ok
    (local,) = prefix_affinity.run_checks(_run({"10.0.0.1": 900.0, "10.0.0.3": 400.0}, transfers=3.0))
    assert not local.ok
    failed = _run({"10.0.0.1": 900.0, "10.0.0.3": 400.0})
    failed.outcomes[0].done = False
    (cut,) = prefix_affinity.run_checks(failed)
    assert not cut.ok
    other = _run({"10.0.0.1": 900.0, "10.0.0.3": 400.0})
    other.client_tokens -= 1
    (different,) = prefix_affinity.run_checks(other)
    assert not different.ok, "the engines computed other prompts than the client counted"


def _timed(router: str, ttfts_ms: list[float], hit: float) -> Run:
    outcomes = [
        streams.Outcome(started=0.0, status=200, chunks=8, done=True, ended=1.0, first_chunk=ms / 1e3)
        for ms in ttfts_ms
    ]
    prefill = {"10.0.0.1": {**dict.fromkeys(COUNTERS, 0.0), PROMPT: 1000.0, QUERIES: 1000.0, HITS: 1000.0 * hit}}
    return Run(router, outcomes, prefill, 1.0, float(len(outcomes)), client_tokens=1000)


def test_the_side_by_side_verdict_needs_intervals_apart_and_says_which_router_was_lower() -> None:
    fast = [100.0 + i % 5 for i in range(32)]
    slow = [200.0 + i % 5 for i in range(32)]
    assert "prefix-aware lower" in prefix_affinity.comparison(_timed(AFFINITY, fast, 0.6), _timed(POW2, slow, 0.5))
    assert "power of two choices lower" in prefix_affinity.comparison(
        _timed(AFFINITY, slow, 0.6), _timed(POW2, fast, 0.5)
    )
    overlapping = [100.0 + i * 3 for i in range(32)]
    shifted = [103.0 + i * 3 for i in range(32)]
    same = prefix_affinity.comparison(_timed(AFFINITY, overlapping, 0.6), _timed(POW2, shifted, 0.5))
    assert "TTFT p50 +3 ms" in same and f"]: {prefix_affinity.NOT_SHOWN}" in same
    assert "hit rate -10 points" in same


def test_the_report_names_each_routers_figures_and_compares_them(tmp_path: Path) -> None:
    ctx = Context("scaling", {}, {}, {}, tmp_path, tmp_path, tmp_path, None)
    fast = [100.0 + i % 5 for i in range(32)]
    prefix_affinity.report(ctx, [_timed(AFFINITY, fast, 0.6), _timed(POW2, fast, 0.5)])
    assert ctx.metrics["prefix_affinity_hit_rate"] == 0.6
    assert ctx.metrics["prefix_pow2_hit_rate"] == 0.5
    assert any(line.startswith("prefix routing side by side: power of two choices less") for line in ctx.log_lines)
