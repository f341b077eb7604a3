"""The names phase: every name a panel or alarm reads from the Ray pods is in their live scrape.

After verify's own checks and the selective phase have sent requests (so the latency and NIXL
histograms, the route counter and the prefix-cache hits have samples), it sends one more and
scrapes both nodes' metrics endpoints until every name is there or 30 s pass, as the managed collector scrapes the
pods' `metrics` port, writes the scrape to the case's results folder, and fails on each
name that observability/dashboard.json or rules.yaml uses and the scrape lacks
(names cited in observability/names.yaml excepted: they exist only after a failure,
or the collector adds them).
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
from tools.verify_observability import missing_from_scrape, ray_pod_names

SCRAPE_FILES = {"prefill": "metrics_prefill_node.prom", "decode": "metrics_decode_node.prom"}
# Ray's metric exports after the request, with a margin.
SCRAPE_WAIT_S = 30.0


def _scrape() -> dict[str, str]:
    return {"prefill": metrics_text(PREFILL_METRICS), "decode": metrics_text(DECODE_METRICS)}


def names_check(ctx: Context) -> list[Any]:
    settings = validate(Settings())
    # Ray's scrape drops vLLM's gauges (running, waiting, KV-cache use) once the engines have been idle a while
    # (seen after the selective phase's three idle minutes): a request first, then the scrape that shows them.
    chat_check(ctx.serve, ctx.model_id, api_key=ctx.api_key)
    texts = poll(_scrape, lambda found: not missing_from_scrape(settings, found.values()), timeout=SCRAPE_WAIT_S)
    if ctx.results is not None:
        ctx.results.mkdir(parents=True, exist_ok=True)
        for side, text in texts.items():
            (ctx.results / SCRAPE_FILES[side]).write_text(text)
    missing = missing_from_scrape(settings, texts.values())
    need = ray_pod_names(settings)
    ctx.metrics.update(names_needed=float(len(need.metrics) + len(need.labels)), names_missing=float(len(missing)))
    return [
        Check(
            "every name a panel or alarm reads from the Ray pods is in their scrape",
            not missing,
            ", ".join(missing) or f"{len(need.metrics)} metric and {len(need.labels)} label names present",
        )
    ]
