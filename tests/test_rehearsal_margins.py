"""The rehearsal's time limits (rehearsal/margins.py): each at least its margin over the slowest run
seen, every case and timed check reading its limit there, and all of CI inside CI's time."""

from __future__ import annotations

from pathlib import Path

import yaml

from rehearsal import burst, disconnects, engine_deaths, margins, node_loss, scaling
from rehearsal.__main__ import CASES, COMPARE_CAP_S, COMPARE_SEEN_S
from rehearsal.burst import RefusalTiming
from rehearsal.margins import CASE_CAPS, MARGIN, TIMED_CHECKS, Limit
from tests.conftest import ROOT

LIMITS = [*CASE_CAPS.values(), *TIMED_CHECKS]


def test_every_limit_is_at_least_its_margin_over_the_slowest_run_seen() -> None:
    short = [f"{lim.what}: {lim.limit_s:.0f} s < {MARGIN} x {lim.slowest_anywhere_s:.0f} s" for lim in LIMITS
             if not lim.within_margin]  # fmt: skip
    assert not short
    assert MARGIN >= 1.5
    assert all(lim.seen for lim in LIMITS)
    assert all(lim.slower_seen for lim in LIMITS if lim.slower_s)


def test_a_slower_machines_run_is_covered_by_the_margin_too() -> None:
    """A limit at 1.5x its run on the machines CI counts, but not at 1.5x a slower machine's run, is short: that
    machine's CI would fail the case for time."""
    covers_seen_only = Limit("a case", 100.0, "the counted run", 200.0, 150.0, "a slower machine's run")
    assert covers_seen_only.slowest_anywhere_s == 150.0
    assert not covers_seen_only.within_margin
    assert Limit("a case", 100.0, "the counted run", 225.0, 150.0, "a slower machine's run").within_margin
    assert Limit("a case", 100.0, "the counted run", 150.0).slowest_anywhere_s == 100.0
    assert all(lim.slowest_anywhere_s == max(lim.slowest_seen_s, lim.slower_s) for lim in LIMITS)


def test_the_budget_is_the_time_ci_gives_a_run() -> None:
    """Read from the workflow as GitHub reads it: every job's timeout-minutes (one job runs the whole suite)."""
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "ci.yml").read_text(encoding="utf-8"))
    timeouts = [job["timeout-minutes"] for job in workflow["jobs"].values()]
    assert len(timeouts) == 1
    assert timeouts[0] * 60 == margins.CI_BUDGET_S


def test_the_budget_follows_the_workflow(tmp_path: Path) -> None:
    workflow = tmp_path / "ci.yml"
    workflow.write_text("jobs:\n  test:\n    runs-on: ubuntu-latest\n    timeout-minutes: 75\n")
    assert margins.ci_time_limit_s(workflow) == 75 * 60


def test_every_case_has_its_cap_and_each_timed_check_reads_its_limit() -> None:
    assert [case.name for case in CASES] == list(CASE_CAPS)
    assert all(case.cap is CASE_CAPS[case.name] for case in CASES)
    # A literal written back into a phase would escape the margin test above.
    assert margins.SCALE_UP.limit_s == scaling.UP_WITHIN_S
    assert margins.SCALE_DOWN.limit_s == scaling.DOWN_WITHIN_S
    assert margins.ENGINE_RECOVERY.limit_s == engine_deaths.RECOVER_WITHIN_S
    assert margins.NODE_RECOVERY.limit_s == node_loss.RECOVER_WITHIN_S
    assert margins.ENGINES_IDLE.limit_s == disconnects.IDLE_WITHIN_S


def test_the_set_up_pytest_and_every_case_at_the_run_margin_fit_ci() -> None:
    before = sum(seconds for seconds, _ in margins.BEFORE_REHEARSAL_S.values())
    # bench compare as a case: at its slowest seen, its cap at its margin over that.
    seen = [*(cap.slowest_seen_s for cap in CASE_CAPS.values()), COMPARE_SEEN_S]
    rehearsal = sum(margins.CI_MARGIN * seconds for seconds in seen)
    assert before + rehearsal <= margins.CI_BUDGET_S, f"{(before + rehearsal) / 60:.1f} min"
    assert COMPARE_CAP_S >= MARGIN * COMPARE_SEEN_S
    assert 1.05 <= margins.CI_MARGIN <= MARGIN


def test_a_run_reports_how_much_of_its_limit_it_used() -> None:
    line = CASE_CAPS["pd"].used(930.0)
    assert f"took 930 s of its {CASE_CAPS['pd'].limit_s:.0f} s limit" in line
    assert f"({CASE_CAPS['pd'].limit_s / 930:.2f}x headroom; slowest seen 1412 s; 1657 s on a slower machine)" in line


def test_refusals_at_once_is_judged_by_a_ratio_within_the_run_not_by_a_clock() -> None:
    # A machine twice as slow: refusals take 2 s, admitted requests 16 s. Still at once.
    slow = RefusalTiming.of(refusals=[1.5, 2.0, 2.2, 9.0], admitted=[10.0, 16.0, 20.0])
    assert slow.at_once(), slow.detail()
    # Refusals that wait as long as admitted requests are not at once, however fast the machine.
    queued = RefusalTiming.of(refusals=[0.5, 0.6, 0.7], admitted=[0.8, 1.0, 1.2])
    assert not queued.at_once(), queued.detail()
    # One refusal after the slowest admitted request: an endless wait, not a refusal.
    late = RefusalTiming.of(refusals=[0.1, 0.1, 25.0], admitted=[5.0, 10.0, 20.0])
    assert not late.at_once(), late.detail()
    assert "headroom" in slow.detail()
    assert burst.REFUSAL_RATIO < 1
