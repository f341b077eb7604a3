"""`make plan`'s line on which requests are split: what a prompt at the threshold costs when decode prefills it,
against what splitting it would add to its TTFT (the KV staged through host memory on both sides and the wire)."""

from __future__ import annotations

import re

import pytest

from settings import sizing
from settings.cli import cli_settings
from tools import plan

SPLIT_LINE = re.compile(
    r"a (?P<tokens>\d+)-token prompt prefilled on decode stalls its other streams for (?P<chunks>\d+)x(?P<stall>\d+)ms "
    r"\(agg stall\) where split adds (?P<ttft>\d+)ms to its TTFT"
)


@pytest.mark.parametrize("context", [[], ["-c", "local_prefill_max_tokens=2048"]], ids=["default", "2048"])
def test_the_split_line_gives_the_whole_transfer_as_the_ttft_cost(
    capsys: pytest.CaptureFixture[str], context: list[str]
) -> None:
    assert plan.main(context) == 0
    (line,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("Which requests are split")]
    found = SPLIT_LINE.search(line)
    assert found, line
    s = cli_settings(context[1::2])
    threshold = sizing.local_prefill_threshold(s)
    p = sizing.transfer_plan(s, threshold)
    assert int(found["tokens"]) == threshold
    # The staging copies alone are well short of the cost on this GPU (no GPUDirect RDMA): the wire is added.
    assert not s.gpu_instance.gpudirect_rdma and round(p.staging_seconds * 1e3) < round(p.efa_seconds * 1e3)
    assert int(found["ttft"]) == round((p.staging_seconds + p.efa_wire_seconds) * 1e3)
    # The same figure the verdict for that length gives.
    assert f"split adds {found['ttft']} ms to TTFT" in sizing.disaggregation_verdict(s, threshold)[1]
    assert (int(found["chunks"]), int(found["stall"])) == (p.aggregated_chunks, round(p.aggregated_stall_seconds * 1e3))
