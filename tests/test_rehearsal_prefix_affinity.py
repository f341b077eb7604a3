"""The prefix-routing run's parts (rehearsal/prefix_affinity.py): a replica's counters are its own, the workload is
what it says, and a run with a request unanswered or not split, or one prefill replica, fails."""

from __future__ import annotations

import gzip
from pathlib import Path

from rehearsal import prefix_affinity, streams
from rehearsal.prefix_affinity import AFFINITY, COUNTERS, HITS, PROMPT, QUERIES, Run
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
    return Run(AFFINITY, outcomes, prefill, 1.0, float(len(outcomes)) if transfers is None else transfers)


def test_a_run_passes_only_with_every_request_answered_and_split_while_two_prefill_replicas_run() -> None:
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
