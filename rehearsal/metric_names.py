"""The names phase: every name a panel or alarm reads from the Ray pods is in their live scrape.

After verify's own checks and the selective phase have sent requests (so the latency and NIXL
histograms, the route counter and the prefix-cache hits have samples), it sends one more and
scrapes both nodes' metrics endpoints every 2 s until every name has been seen or 30 s pass, as the managed collector
scrapes the pods' `metrics` port, writes the scrapes to the case's results folder, and fails on each
name that observability/dashboard.json or rules.yaml uses and no scrape had
(names cited in observability/names.yaml excepted: they exist only after a failure,
or the collector adds them).

A name counts once any scrape has had it, as a collector scraping on its own schedule stores every series it saw:
Ray 2.58 keeps a gauge in the scrape for two of its export intervals after its last report
(open_telemetry_metric_recorder.py, _resolve_gauge_ttl_seconds), 4 s at the rehearsal's 2 s export. Serve's replica
health gauge, reported every few seconds, and vLLM's gauges after one request are then in some scrapes and not
in others: one scrape holding every name at once was luck (seen 2026-12-05: four gauges missing from every
scrape for 30 s, in the run after one that had them all in its first).
"""

from __future__ import annotations

from typing import Any

from rehearsal.context import Context
from rehearsal.network import DECODE_METRICS, PREFILL_METRICS, metrics_text
from settings.model import Settings
from settings.rules import validate
from tools.checks import Check
from tools.polling import poll
from tools.verify import chat_check
from tools.verify_observability import Names, missing_from_names, ray_pod_names, scrape_names

SCRAPE_FILES = {"prefill": "metrics_prefill_node.prom", "decode": "metrics_decode_node.prom"}
# Ray's metric exports after the request, with a margin.
SCRAPE_WAIT_S = 30.0
# tools.polling.poll's own interval.
SCRAPE_INTERVAL_S = 2.0


def _scrape() -> dict[str, str]:
    return {"prefill": metrics_text(PREFILL_METRICS), "decode": metrics_text(DECODE_METRICS)}


def _joined(texts: list[str]) -> str:
    """One node's scrapes in one file: the scrape alone, or each under a comment saying which it was."""
    if len(texts) == 1:
        return texts[0]
    return "".join(
        f"# scrape {n} of {len(texts)}, {SCRAPE_INTERVAL_S:g} s apart\n{text}" for n, text in enumerate(texts, 1)
    )


def names_check(ctx: Context) -> list[Any]:
    settings = validate(Settings())
    # Ray's scrape drops vLLM's gauges (running, waiting, KV-cache use) once the engines have been idle a while
    # (seen after the selective phase's three idle minutes): a request first, then the scrape that shows them.
    chat_check(ctx.serve, ctx.model_id, api_key=ctx.api_key)
    scrapes: list[dict[str, str]] = []
    seen = Names(frozenset(), frozenset())

    def scrape_again() -> list[str]:
        """The names no scrape so far has had."""
        nonlocal seen
        scrapes.append(_scrape())
        names = scrape_names(scrapes[-1].values())
        seen = Names(seen.metrics | names.metrics, seen.labels | names.labels)
        return missing_from_names(settings, seen)

    missing = poll(scrape_again, lambda still: not still, timeout=SCRAPE_WAIT_S, interval=SCRAPE_INTERVAL_S)
    if ctx.results is not None:
        ctx.results.mkdir(parents=True, exist_ok=True)
        for side, name in SCRAPE_FILES.items():
            (ctx.results / name).write_text(_joined([found[side] for found in scrapes]))
    need = ray_pod_names(settings)
    ctx.metrics.update(names_needed=float(len(need.metrics) + len(need.labels)), names_missing=float(len(missing)))
    return [
        Check(
            "every name a panel or alarm reads from the Ray pods is in their scrape",
            not missing,
            ", ".join(missing) or f"{len(need.metrics)} metric and {len(need.labels)} label names present",
        )
    ]
