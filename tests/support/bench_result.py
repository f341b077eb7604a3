"""A vllm bench result as the benchmark writes it."""

from __future__ import annotations

import json
from pathlib import Path

DATA = Path(__file__).parents[1] / "data"


RESULT = {**json.loads((DATA / "vllm_bench_result.json").read_text()), "completed": 4}
