"""The metric names the rehearsal recorded."""

from __future__ import annotations

import gzip
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "data"


RECORDED = (DATA / "observability_scrape_prefill.prom.gz", DATA / "observability_scrape_decode.prom.gz")


def recorded() -> list[str]:
    return [gzip.decompress(path.read_bytes()).decode() for path in RECORDED]
