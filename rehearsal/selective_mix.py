"""Short and long prompts at one concurrency, always split against selective, and aggregated's figures.

The claim for selective P/D: a short prompt's TTFT is better than always-split's (no second hop), and a long prompt
keeps the split's inter-token latency although decode now also prefills the short ones. Both are measured here on
the same engines, like with like: blocks of CLIENTS requests at once, half short and half long, each new to both
prefix caches; the blocks alternate between always-split (every request sent with `x-pd-prefill: split`, which
takes the path a threshold of 0 takes: no count, every request split) and selective (the threshold in force
decides). The aggregated case sends the same blocks to its own app for the third column.

Per class and route: TTFT and the client's time per output token after the first (Ray may batch tokens into one
chunk, so a request's mean is read, not each gap), p50 with its 95% bootstrap interval and p99. A verdict comes from
paired differences, each request against the same client slot's in the adjacent block of the other route, so that
a drift of the machine stays out of it: a difference only where their median's interval excludes 0. Required:
every request answered, the NIXL transfers the routes imply (every request of a split block, the long ones of a
selective block) and decode's route counter by reason. The figures are the CPU's: docs/architecture.md says what
they show and what they cannot.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rehearsal import streams
from rehearsal.context import Context
from serve_config.deployments import PREFILL_ROUTE_HEADER
from tools.bench_compare import NOT_SHOWN, percentile_interval
from tools.checks import Check

SHORT, LONG = "short", "long"
ALWAYS_SPLIT, SELECTIVE, AGGREGATED = "always split", "selective", "aggregated"
SELECTIVE_ROUTES = (ALWAYS_SPLIT, SELECTIVE)
# ray_pods/selective_pd.py's values of the x-pd-prefill header and of the route counter's `prefill` label.
LOCAL, SPLIT = "local", "split"
# Two short and two long at once: decode holds both kinds of stream in every block.
CLIENTS = 4
# Blocks in all, alternating split and selective; the aggregated case sends half as many (one route).
BLOCKS = 16
MAX_TOKENS = 16
# About 21 tokens with the chat template, and about 338: either side of selective.THRESHOLD by far.
SHORT_TEXT = "Count slowly."
LONG_TEXT = "Please count the apples in this long basket. " * 25
WHAT = ("TTFT", "TPOT")
# Fewer paired differences than this give no verdict.
MIN_PAIRS = 4


def prompt(kind: str, tag: str) -> str:
    """A prompt of its class that no cache holds: the tag comes first, so every block of it is new."""
    return f"{tag}: {SHORT_TEXT if kind == SHORT else LONG_TEXT}"


def block_routes(blocks: int, routes: tuple[str, ...]) -> list[str]:
    """Each block's route, alternating, the first route changing each pair so neither always goes first."""
    if len(routes) == 1:
        return [routes[0]] * blocks
    found: list[str] = []
    for pair in range(blocks // 2):
        found += list(routes) if pair % 2 == 0 else list(reversed(routes))
    return found


@dataclass(frozen=True)
class Sent:
    """One request of the mix: its block, the block's route, its class and its client slot in the block."""

    block: int
    route: str
    kind: str
    slot: int
    outcome: streams.Outcome

    @property
    def ok(self) -> bool:
        return self.outcome.kind == "ok" and self.outcome.first_chunk is not None

    def ms(self, what: str) -> float:
        """TTFT, or the time per output token after the first (ms)."""
        first = self.outcome.first_chunk or self.outcome.started
        if what == "TTFT":
            return (first - self.outcome.started) * 1e3
        return (self.outcome.ended - first) * 1e3 / (MAX_TOKENS - 1)


@dataclass
class Mix:
    """Every request of the mix, and decode's NIXL growth over the whole mix (read by the caller)."""

    sent: list[Sent] = field(default_factory=list)
    transfers: float = 0.0
    nixl_bytes: float = 0.0
    took_s: float = 0.0

    def ok(self, route: str, kind: str) -> list[Sent]:
        return [s for s in self.sent if s.route == route and s.kind == kind and s.ok]

    def failed(self) -> list[str]:
        return [s.outcome.label() for s in self.sent if not s.ok]

    def values(self, route: str, kind: str, what: str) -> list[float]:
        return [s.ms(what) for s in self.ok(route, kind)]

    def paired(self, kind: str, what: str) -> list[float]:
        """Always-split minus selective, for each client slot of each pair of adjacent blocks (one of each route,
        sent back to back)."""
        by_key = {(s.block, s.slot): s for s in self.sent if s.kind == kind and s.ok}
        slots = sorted({s.slot for s in self.sent if s.kind == kind})
        found = []
        for first in range(0, max((s.block for s in self.sent), default=-1) + 1, 2):
            for slot in slots:
                a, b = by_key.get((first, slot)), by_key.get((first + 1, slot))
                if a is None or b is None or a.route == b.route:
                    continue
                split, selective = (a, b) if a.route == ALWAYS_SPLIT else (b, a)
                found.append(split.ms(what) - selective.ms(what))
        return found


@dataclass(frozen=True)
class Figure:
    """A p50 with its 95% bootstrap interval, a p99, and how many requests gave them (ms)."""

    p50: tuple[float, float, float]
    p99: float
    n: int

    @classmethod
    def of(cls, values: list[float]) -> Figure | None:
        if not values:
            return None
        return cls(
            percentile_interval(values, 50, np.random.default_rng(0)), float(np.percentile(values, 99)), len(values)
        )

    def text(self) -> str:
        return f"p50 {self.p50[0]:.0f} ms [{self.p50[1]:.0f}, {self.p50[2]:.0f}], p99 {self.p99:.0f} ms (n={self.n})"


def figures(mix: Mix, route: str) -> dict[str, Figure | None]:
    """TTFT and time per output token for each class on one route."""
    return {f"{kind} {what}": Figure.of(mix.values(route, kind, what)) for kind in (SHORT, LONG) for what in WHAT}


def paired_verdict(differences: list[float]) -> tuple[str, tuple[float, float, float] | None]:
    """By always-split minus selective, block pair by block pair: a difference only where the median's 95% bootstrap
    interval excludes 0."""
    if len(differences) < MIN_PAIRS:
        return "no verdict", None
    found = percentile_interval(differences, 50, np.random.default_rng(0))
    if found[1] > 0:
        return f"{SELECTIVE} lower", found
    if found[2] < 0:
        return f"{ALWAYS_SPLIT} lower", found
    return NOT_SHOWN, found


def interval_ms(found: tuple[float, float, float] | None) -> str:
    """A median and its interval, in ms: '62 ms [57, 66]'."""
    return "none" if found is None else f"{found[0]:.0f} ms [{found[1]:.0f}, {found[2]:.0f}]"


def _block(ctx: Context, route: str, index: int) -> list[tuple[str, streams.Outcome]]:
    headers = {PREFILL_ROUTE_HEADER: SPLIT} if route == ALWAYS_SPLIT else None
    kinds = [SHORT, LONG] * (CLIENTS // 2)

    def one(slot: int) -> tuple[str, streams.Outcome]:
        kind = kinds[slot]
        text = prompt(kind, f"Mix {route} {index}-{slot}")
        return kind, streams.stream_chat(ctx, MAX_TOKENS, streams.TRAFFIC_TIMEOUT_S, text, headers)

    with ThreadPoolExecutor(CLIENTS) as pool:
        return list(pool.map(one, range(CLIENTS)))


def send(ctx: Context, routes: tuple[str, ...], blocks: int) -> Mix:
    """The blocks, one at a time. The caller reads decode's NIXL counters around them, once Ray's export holds still
    (selective.selective_check shares those readings with its other requests)."""
    mix = Mix()
    began = time.monotonic()
    for index, route in enumerate(block_routes(blocks, routes)):
        for slot, (kind, outcome) in enumerate(_block(ctx, route, index)):
            mix.sent.append(Sent(index, route, kind, slot, outcome))
    mix.took_s = round(time.monotonic() - began, 1)
    return mix


def expected_transfers(blocks: int, routes: tuple[str, ...] = SELECTIVE_ROUTES) -> int:
    """One transfer for each request a route splits: every one of a split block, the long ones of a selective one."""
    per_block = {ALWAYS_SPLIT: CLIENTS, SELECTIVE: CLIENTS // 2, AGGREGATED: 0}
    return sum(per_block[route] for route in block_routes(blocks, routes))


def summary(mix: Mix, routes: tuple[str, ...]) -> str:
    per_route = "; ".join(
        f"{route}: "
        + ", ".join(f"{name} {'none' if f is None else f.text()}" for name, f in figures(mix, route).items())
        for route in routes
    )
    kib = mix.nixl_bytes / mix.transfers / 1024 if mix.transfers else 0.0
    return (
        f"{CLIENTS} at once ({CLIENTS // 2} short, {CLIENTS // 2} long), {MAX_TOKENS} tokens each, in {mix.took_s} s: "
        f"{per_route}; {mix.transfers:g} NIXL transfers, {kib:.0f} KiB each; failed {mix.failed()}"
    )


def verdicts(mix: Mix) -> str:
    """The two claims, by the paired differences: short prompts' TTFT and long prompts' time per output token,
    always-split against selective."""
    found = []
    for kind, what in ((SHORT, "TTFT"), (LONG, "TPOT"), (SHORT, "TPOT"), (LONG, "TTFT")):
        verdict, interval = paired_verdict(mix.paired(kind, what))
        found.append(f"{kind} {what} split - selective {interval_ms(interval)}: {verdict}")
    return "; ".join(found)


def _metrics(ctx: Context, mix: Mix, routes: tuple[str, ...]) -> None:
    for route in routes:
        for name, figure in figures(mix, route).items():
            key = f"mix_{route.replace(' ', '_')}_{name.replace(' ', '_').lower()}_p50_ms"
            ctx.metrics[key] = None if figure is None else round(figure.p50[0], 1)


def expected_routes(blocks: int) -> dict[tuple[str, str], float]:
    """What decode's route counter adds for the mix, by (prefill, reason): the header splits every request of an
    always-split block; the threshold keeps a selective block's short ones local and splits its long ones."""
    per_route = blocks // 2 * CLIENTS // 2
    return {(SPLIT, "header"): 2.0 * per_route, (LOCAL, "short prompt"): per_route, (SPLIT, "long prompt"): per_route}


def selective_checks(ctx: Context, mix: Mix, routes_added: dict[tuple[str, str], float]) -> list[Any]:
    """The mix's requests all answered, the KV its routes imply (mix.transfers, read by the caller), decode's route
    counter by reason; figures and the paired verdicts in the log and the metrics."""
    routes = SELECTIVE_ROUTES
    _metrics(ctx, mix, routes)
    ctx.log_lines.append(f"short and long prompts mixed: {summary(mix, routes)}; {verdicts(mix)}")
    answered = all(len(mix.ok(route, kind)) == BLOCKS * CLIENTS // 4 for route in routes for kind in (SHORT, LONG))
    wanted = expected_transfers(BLOCKS, routes)
    wanted_routes = expected_routes(BLOCKS)
    return [
        Check(
            "selective prefill: short and long prompts at once, every request answered; KV moved by every split "
            "request and by the long ones alone under the threshold",
            answered and not mix.failed() and mix.transfers == wanted,
            f"{mix.transfers:g} NIXL transfers, {wanted} expected; {summary(mix, routes)}; {verdicts(mix)}",
        ),
        Check(
            "selective prefill: decode's route counter counts the mix by reason",
            routes_added == wanted_routes,
            f"ray_pd_prefill_requests_total added {routes_added}, expected {wanted_routes}",
        ),
    ]


def aggregated_mix_check(ctx: Context) -> list[Any]:
    """The same blocks on the aggregated app, for the third column: every request answered."""
    if not ctx.aggregated:
        return []
    routes = (AGGREGATED,)
    mix = send(ctx, routes, BLOCKS // 2)
    _metrics(ctx, mix, routes)
    ctx.log_lines.append(f"short and long prompts mixed: {summary(mix, routes)}")
    answered = all(len(mix.ok(AGGREGATED, kind)) == BLOCKS * CLIENTS // 4 for kind in (SHORT, LONG))
    return [
        Check(
            "aggregated: short and long prompts at once, every request answered",
            answered and not mix.failed(),
            summary(mix, routes),
        )
    ]
