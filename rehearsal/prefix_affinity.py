"""Prefix-aware routing on two prefill replicas, one decode: where the router sends prompts that share prefixes.

At the end of the scaling phase's scale-up (rehearsal/scaling.py) prefill runs two replicas, the first and the
one the load added, under the product's default router (ray_pods/prefix_routing.py). Prefill's minimum is held at
two in place (a bound, as a user raises it) while one workload runs with nothing else in flight: PREFIXES long
shared prefixes, each asked PER_PREFIX times with a short suffix of its own, round by round (every prefix once,
then again), CLIENTS at a time. Its prefixes are new to every cache. Before and after it, every node's exporter is
read once Ray's export holds still; vLLM's counters carry the replica's id (ReplicaId), so each prefill replica's
prompt tokens and prefix-cache hit rate are its own.

Reported: each prefill replica's prompt tokens and hit rate, the clients' TTFT (median with its 95% bootstrap
interval) and time per output token as the client saw it (decode's event loop, where the router's calls run, is in
that path), decode's engine inter-token latency, and NIXL bytes per request. Required: every request answered and
split (one NIXL transfer each) while two prefill replicas run. The same run under power of two choices needs the
app restarted with the router off and a second prefill engine started again: not run here (docs/unverified.md).
"""

from __future__ import annotations

import random
import string
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from rehearsal import streams
from rehearsal.context import Context
from rehearsal.network import DECODE_METRICS, NODE_C_METRICS, PREFILL_METRICS, decode_nixl_counters, http, metrics_text
from rehearsal.selective_mix import interval_ms
from tools.bench_compare import percentile_interval
from tools.checks import Check
from tools.cluster_access import Histogram
from tools.polling import settled

PREFIXES = 8
PER_PREFIX = 4
# Enough that one replica's queue can run two ahead of the other's: prefill's imbalance threshold is 1.
CLIENTS = 4
PREFIX_WORDS = 300
SUFFIX_WORDS = 12
MAX_TOKENS = 8
# vLLM's counters as Ray's exporter names them, summed per ReplicaId.
QUERIES = "ray_vllm_prefix_cache_queries_total"
HITS = "ray_vllm_prefix_cache_hits_total"
PROMPT = "ray_vllm_prompt_tokens_total"
NIXL_BYTES = "ray_vllm_nixl_bytes_transferred_sum"
NIXL_TRANSFERS = "ray_vllm_nixl_xfer_time_seconds_count"
COUNTERS = (QUERIES, HITS, PROMPT, NIXL_BYTES, NIXL_TRANSFERS)
ENGINE_ITL = "ray_vllm_inter_token_latency_seconds"
EXPORTERS = (PREFILL_METRICS, DECODE_METRICS, NODE_C_METRICS)
AFFINITY = "prefix-aware"


def prompts(seed: int) -> list[str]:
    """PREFIXES prefixes of PREFIX_WORDS random words, each PER_PREFIX times with its own suffix, round by round."""
    rng = random.Random(seed)  # noqa: S311 - prompts, not secrets

    def words(n: int) -> str:
        return " ".join("".join(rng.choices(string.ascii_lowercase, k=rng.randint(3, 8))) for _ in range(n))

    shared = [f"Document {seed}-{i}: {words(PREFIX_WORDS)}" for i in range(PREFIXES)]
    found: list[str] = []
    for round_ in range(PER_PREFIX):
        order = list(range(PREFIXES))
        rng.shuffle(order)
        found += [f"{shared[i]}\nQuestion {round_}: {words(SUFFIX_WORDS)}" for i in order]
    return found


@dataclass(frozen=True)
class Reading:
    """Every node's counters, and the engines' inter-token latency histograms, by ReplicaId."""

    by_replica: dict[str, dict[str, float]]
    itl: dict[str, Histogram]


def parse(texts: list[str]) -> Reading:
    found: dict[str, dict[str, float]] = defaultdict(lambda: dict.fromkeys(COUNTERS, 0.0))
    buckets: dict[str, dict[float, float]] = defaultdict(dict)
    sums: dict[str, dict[str, float]] = defaultdict(lambda: {"sum": 0.0, "count": 0.0})
    for text in texts:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                replica = sample.labels.get("ReplicaId", "")
                if sample.name in COUNTERS:
                    found[replica][sample.name] += sample.value
                elif sample.name == f"{ENGINE_ITL}_bucket":
                    le = float(sample.labels["le"])
                    buckets[replica][le] = buckets[replica].get(le, 0.0) + sample.value
                elif sample.name in (f"{ENGINE_ITL}_sum", f"{ENGINE_ITL}_count"):
                    sums[replica][sample.name.rsplit("_", 1)[1]] += sample.value
    itl = {
        replica: Histogram(tuple(sorted(b.items())), sums[replica]["sum"], sums[replica]["count"])
        for replica, b in buckets.items()
    }
    return Reading(dict(found), itl)


def _read() -> Reading:
    texts = []
    for url in EXPORTERS:
        try:
            texts.append(metrics_text(url))
        except OSError:
            texts.append("")  # node C is not always up
    return parse(texts)


def _replica_sides(ctx: Context) -> dict[str, tuple[str, str]]:
    """Each RUNNING engine replica's id: (its side, its node's IP)."""
    live = http(f"{ctx.dashboard}/api/serve/applications/", headers=ctx.headers)
    found = {}
    for app in live["applications"].values():
        for name, deployment in app["deployments"].items():
            side = next((s for s, title in streams.DEPLOYMENTS.items() if name.startswith(title)), None)
            for replica in deployment["replicas"]:
                if side is not None and replica["state"] == "RUNNING":
                    found[replica["replica_id"]] = (side, replica.get("node_ip", ""))
    return found


@dataclass
class Run:
    """One router's run of the workload."""

    router: str
    outcomes: list[streams.Outcome] = field(default_factory=list)
    # Each prefill replica (by node): prompt tokens computed, prefix-cache queries and hits (tokens).
    prefill: dict[str, dict[str, float]] = field(default_factory=dict)
    decode_bytes: float = 0.0
    decode_transfers: float = 0.0
    itl: Histogram | None = None
    took_s: float = 0.0
    # Decode's node's NIXL (transfers, failed) once the export held still after the run: the phase's last requests.
    decode_node_after: tuple[float, float] = (0.0, 0.0)

    @property
    def ok(self) -> list[streams.Outcome]:
        return [o for o in self.outcomes if o.kind == "ok" and o.first_chunk is not None]

    def ttft_ms(self) -> tuple[float, float, float] | None:
        values = [(o.first_chunk - o.started) * 1e3 for o in self.ok if o.first_chunk is not None]
        return percentile_interval(values, 50, np.random.default_rng(0)) if values else None

    def client_tpot_ms(self) -> tuple[float, float, float] | None:
        """Time per output token after the first, as the client saw it (Ray may batch tokens into one chunk)."""
        values = [(o.ended - o.first_chunk) * 1e3 / (MAX_TOKENS - 1) for o in self.ok if o.first_chunk is not None]
        return percentile_interval(values, 50, np.random.default_rng(0)) if values else None

    def hit_rate(self, node: str | None = None) -> float | None:
        chosen = [v for n, v in self.prefill.items() if node is None or n == node]
        queries = sum(v[QUERIES] for v in chosen)
        return sum(v[HITS] for v in chosen) / queries if queries > 0 else None

    def summary(self) -> str:
        replicas = ", ".join(
            f"{node}: {v[PROMPT]:.0f} prompt tokens, hit rate {_pct(self.hit_rate(node))}"
            for node, v in sorted(self.prefill.items())
        )
        itl = self.itl
        engine = (
            f"{1e3 * (itl.quantile(0.5) or 0):.1f} / {1e3 * (itl.quantile(0.99) or 0):.1f} ms"
            if itl is not None and itl.count > 0
            else "none"
        )
        per_request = self.decode_bytes / self.decode_transfers if self.decode_transfers else 0.0
        return (
            f"{self.router}: {len(self.ok)}/{len(self.outcomes)} answered in {self.took_s:.0f} s; prefill replicas "
            f"{replicas}; overall hit rate {_pct(self.hit_rate())}; TTFT p50 {interval_ms(self.ttft_ms())}; client "
            f"time per output token p50 {interval_ms(self.client_tpot_ms())}; decode engine ITL p50/p99 {engine}; NIXL "
            f"{per_request / 1024:.0f} KiB a request over {self.decode_transfers:g} transfers"
        )


def _pct(value: float | None) -> str:
    return "none" if value is None else f"{value:.0%}"


def _send(ctx: Context, texts: list[str]) -> list[streams.Outcome]:
    queue = list(reversed(texts))
    lock = threading.Lock()
    outcomes: list[streams.Outcome] = []

    def client() -> None:
        while True:
            with lock:
                if not queue:
                    return
                text = queue.pop()
            outcome = streams.stream_chat(ctx, MAX_TOKENS, timeout=streams.TRAFFIC_TIMEOUT_S, prompt=text)
            with lock:
                outcomes.append(outcome)

    threads = [threading.Thread(target=client, daemon=True) for _ in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=streams.TRAFFIC_TIMEOUT_S * len(texts))
    return outcomes


def measure(ctx: Context, router: str = AFFINITY, seed: int = 1) -> Run:
    """The workload once, nothing else in flight, between two readings that Ray's export holds still."""
    before = settled(_read)
    began = time.monotonic()
    outcomes = _send(ctx, prompts(seed))
    took = time.monotonic() - began
    after, decode_node = settled(lambda: (_read(), decode_nixl_counters()))
    sides = _replica_sides(ctx)
    run = Run(router, outcomes, took_s=round(took, 1), decode_node_after=decode_node)
    for replica, (side, node) in sides.items():
        now = after.by_replica.get(replica, dict.fromkeys(COUNTERS, 0.0))
        then = before.by_replica.get(replica, dict.fromkeys(COUNTERS, 0.0))
        delta = {name: now[name] - then[name] for name in COUNTERS}
        if side == "prefill":
            run.prefill[node or replica] = delta
        else:
            run.decode_bytes += delta[NIXL_BYTES]
            run.decode_transfers += delta[NIXL_TRANSFERS]
            if replica in after.itl:
                run.itl = after.itl[replica].minus(before.itl.get(replica))
    return run


def run_checks(run: Run) -> list[Any]:
    """What each run requires: every request answered and split. Where the router sent them is reported: at a
    light load prefix-aware routing may keep every request on one replica, as it should."""
    answered = len(run.ok) == len(run.outcomes) == PREFIXES * PER_PREFIX
    return [
        Check(
            f"prefix routing ({run.router}), two prefill replicas: every request answered, one NIXL transfer each",
            answered and run.decode_transfers == len(run.ok) and len(run.prefill) == 2,
            run.summary(),
        )
    ]


def report(ctx: Context, run: Run) -> None:
    """The run in the case's log and metrics."""
    ctx.log_lines.append(
        f"prefix routing, two prefill replicas and one decode, {PREFIXES} prefixes x {PER_PREFIX}, {CLIENTS} clients: "
        f"{run.summary()}"
    )
    ttft = run.ttft_ms()
    kib = run.decode_bytes / run.decode_transfers / 1024 if run.decode_transfers else 0.0
    ctx.metrics.update(
        {
            "prefix_affinity_hit_rate": round(run.hit_rate() or 0.0, 3),
            "prefix_affinity_ttft_p50_ms": round(ttft[0], 1) if ttft else None,
            "prefix_affinity_nixl_kib_per_request": round(kib, 1),
        }
    )
