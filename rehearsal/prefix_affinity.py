"""Prefix-aware routing against power of two choices on two prefill replicas, one decode, in one app, side by side.

At the end of the scaling phase's scale-up (rehearsal/scaling.py) prefill runs two replicas, the first and the
one the load added, under the product's router (ray_pods/prefix_routing.py). Prefill's minimum is held at two in
place (a bound, as a user raises it) while one workload runs twice with nothing else in flight: PREFIXES long
shared prefixes, each asked PER_PREFIX times with a short suffix of its own, round by round (every prefix once,
then again), CLIENTS at a time, as completions. Each run's prefixes are new to every cache.

- **Prefix-aware**: the prompts as text. The router matches each against its tree.
- **Power of two choices**: the same kind of prompts (another seed) as the token ids the engine would make of the
  text (the model's tokenizer, special tokens added, as vLLM renders a completion's text). The router has no text
  to match and routes such a request by Serve's own power of two choices (`PowerOfTwoChoicesRequestRouter
  .choose_replicas`, which Ray's router calls first and falls back to), on the same replicas and engines, and
  puts nothing in its tree. So the comparison needs no restart and no second engine start, and decode's event loop
  runs no routing call to the tree actor in this run: its inter-token latency there is decode's without them.

Before, between and after the runs, every node's exporter is read once Ray's export holds still; vLLM's counters
carry the replica's id (ReplicaId), so each prefill replica's prompt tokens and prefix-cache hit rate are its own.

Reported for each run: each prefill replica's prompt tokens and hit rate, the prompt tokens the engines computed
against those the client's tokenizer counted (equal: the engines saw the same kind of prompt), the clients' TTFT
(median with its 95% bootstrap interval) and time per output token as the client saw it, decode's engine
inter-token latency, and NIXL bytes per request; then the differences, power of two less prefix-aware, with their
intervals. Required of each run: every request answered and split (one NIXL transfer each) while two prefill
replicas run.
"""

from __future__ import annotations

import random
import string
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
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
POW2 = "power of two choices"
# Each router's run: its prompts' seed. The prefix-aware run first, as the scale-up's load left the replicas.
RUNS = ((AFFINITY, 1), (POW2, 2))
NOT_SHOWN = "no difference shown"


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
    # The prompts' tokens as the client's tokenizer counted them.
    client_tokens: int = 0

    @property
    def ok(self) -> list[streams.Outcome]:
        return [o for o in self.outcomes if o.kind == "ok" and o.first_chunk is not None]

    def ttfts_ms(self) -> list[float]:
        return [(o.first_chunk - o.started) * 1e3 for o in self.ok if o.first_chunk is not None]

    def client_tpots_ms(self) -> list[float]:
        """Time per output token after the first, as the client saw it (Ray may batch tokens into one chunk)."""
        return [(o.ended - o.first_chunk) * 1e3 / (MAX_TOKENS - 1) for o in self.ok if o.first_chunk is not None]

    def ttft_ms(self) -> tuple[float, float, float] | None:
        values = self.ttfts_ms()
        return percentile_interval(values, 50, np.random.default_rng(0)) if values else None

    def client_tpot_ms(self) -> tuple[float, float, float] | None:
        values = self.client_tpots_ms()
        return percentile_interval(values, 50, np.random.default_rng(0)) if values else None

    def engine_prompt_tokens(self) -> float:
        return sum(v[PROMPT] for v in self.prefill.values())

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
            f"{per_request / 1024:.0f} KiB a request over {self.decode_transfers:g} transfers; prompt tokens "
            f"{self.engine_prompt_tokens():.0f} by the engines, {self.client_tokens} by the client's tokenizer"
        )


def _pct(value: float | None) -> str:
    return "none" if value is None else f"{value:.0%}"


def _send(ctx: Context, requests: list[str] | list[list[int]]) -> list[streams.Outcome]:
    queue: list[str | list[int]] = list(reversed(requests))
    lock = threading.Lock()
    outcomes: list[streams.Outcome] = []

    def client() -> None:
        while True:
            with lock:
                if not queue:
                    return
                prompt = queue.pop()
            outcome = streams.stream_completion(ctx, MAX_TOKENS, prompt, timeout=streams.TRAFFIC_TIMEOUT_S)
            with lock:
                outcomes.append(outcome)

    threads = [threading.Thread(target=client, daemon=True) for _ in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=streams.TRAFFIC_TIMEOUT_S * len(requests))
    return outcomes


def token_ids(model_dir: Path, texts: list[str]) -> list[list[int]]:
    """Each text's token ids as vLLM renders a completion's text prompt: the model's tokenizer, special tokens added
    (CompletionRequest's add_special_tokens defaults to true)."""
    from transformers import AutoTokenizer  # seconds to import, and only this phase needs it

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    return [list(tokenizer(text, add_special_tokens=True)["input_ids"]) for text in texts]


def measure(ctx: Context) -> list[Run]:
    """Each router's run of the workload (RUNS), one after the other with nothing else in flight, each between two
    readings that Ray's export holds still (the one between them is shared)."""
    runs = []
    before = settled(_read)
    for router, seed in RUNS:
        texts = prompts(seed)
        ids = token_ids(ctx.model_dir, texts)
        began = time.monotonic()
        outcomes = _send(ctx, texts if router == AFFINITY else ids)
        took = time.monotonic() - began
        after, decode_node = settled(lambda: (_read(), decode_nixl_counters()))
        run = Run(router, outcomes, took_s=round(took, 1), decode_node_after=decode_node)
        run.client_tokens = sum(len(one) for one in ids)
        _attribute(run, _replica_sides(ctx), before, after)
        runs.append(run)
        before = after
    return runs


def _attribute(run: Run, sides: dict[str, tuple[str, str]], before: Reading, after: Reading) -> None:
    """Each replica's counters over the run, to its side: prefill's by node, decode's NIXL and inter-token latency."""
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


def median_difference(a: list[float], b: list[float], resamples: int = 2000) -> tuple[float, float, float] | None:
    """b's median less a's, with a 95% bootstrap interval (each sample resampled on its own: the runs' requests are
    not paired)."""
    if len(a) < 2 or len(b) < 2:
        return None
    rng = np.random.default_rng(0)
    first, second = np.asarray(a), np.asarray(b)
    drawn_a = np.median(rng.choice(first, (resamples, len(first))), axis=1)
    drawn_b = np.median(rng.choice(second, (resamples, len(second))), axis=1)
    lo, hi = np.percentile(drawn_b - drawn_a, [2.5, 97.5])
    return float(np.median(second) - np.median(first)), float(lo), float(hi)


def difference_text(found: tuple[float, float, float] | None, lower: str, higher: str) -> str:
    """'+12 ms [3, 20]: <higher>', or the same with NOT_SHOWN where the interval holds 0."""
    if found is None:
        return "no verdict"
    verdict = higher if found[1] > 0 else lower if found[2] < 0 else NOT_SHOWN
    return f"{found[0]:+.0f} ms [{found[1]:.0f}, {found[2]:.0f}]: {verdict}"


def comparison(affinity: Run, pow2: Run) -> str:
    """Power of two less prefix-aware: hit rate, TTFT and the client's time per output token, with intervals."""
    ttft = median_difference(affinity.ttfts_ms(), pow2.ttfts_ms())
    tpot = median_difference(affinity.client_tpots_ms(), pow2.client_tpots_ms())
    a_rate, b_rate = affinity.hit_rate(), pow2.hit_rate()
    rate = "none" if a_rate is None or b_rate is None else f"{100 * (b_rate - a_rate):+.0f} points"
    return (
        f"{POW2} less {AFFINITY}: hit rate {rate}; TTFT p50 "
        f"{difference_text(ttft, f'{POW2} lower', f'{AFFINITY} lower')}; client time per output token p50 "
        f"{difference_text(tpot, f'{POW2} lower', f'{AFFINITY} lower')}"
    )


def run_checks(run: Run) -> list[Any]:
    """What each run requires: every request answered and split. Where the router sent them is reported: at a
    light load prefix-aware routing may keep every request on one replica, as it should. Also required: prefill's
    engines computed exactly the prompt tokens the client's tokenizer counted, so token ids and text gave the engines
    the same kind of prompts, each once."""
    answered = len(run.ok) == len(run.outcomes) == PREFIXES * PER_PREFIX
    same_tokens = run.client_tokens > 0 and run.engine_prompt_tokens() == run.client_tokens
    return [
        Check(
            f"prefix routing ({run.router}), two prefill replicas: every request answered, one NIXL transfer each, "
            "the prompt tokens the client counted",
            answered and run.decode_transfers == len(run.ok) and len(run.prefill) == 2 and same_tokens,
            run.summary(),
        )
    ]


METRIC_PREFIX = {AFFINITY: "prefix_affinity", POW2: "prefix_pow2"}


def report(ctx: Context, runs: list[Run]) -> None:
    """The runs in the case's log and metrics, and their comparison where both ran."""
    ctx.log_lines.append(
        f"prefix routing, two prefill replicas and one decode, {PREFIXES} prefixes x {PER_PREFIX}, {CLIENTS} clients: "
        + " | ".join(run.summary() for run in runs)
    )
    by_router = {run.router: run for run in runs}
    if AFFINITY in by_router and POW2 in by_router:
        ctx.log_lines.append(f"prefix routing side by side: {comparison(by_router[AFFINITY], by_router[POW2])}")
    for run in runs:
        ttft = run.ttft_ms()
        kib = run.decode_bytes / run.decode_transfers / 1024 if run.decode_transfers else 0.0
        name = METRIC_PREFIX[run.router]
        ctx.metrics.update(
            {
                f"{name}_hit_rate": round(run.hit_rate() or 0.0, 3),
                f"{name}_ttft_p50_ms": round(ttft[0], 1) if ttft else None,
                f"{name}_nixl_kib_per_request": round(kib, 1),
            }
        )
