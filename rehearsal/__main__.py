"""`make rehearse`: the P/D run, which must pass, and the failure cases, each of which must fail as expected.

    python -m rehearsal [--only CASE ...] [--out rehearsal-results]

One case at a time (each starts its own Ray with two vLLM engines, ~9 GB).
A failed case's Ray and engine logs are kept in OUT/logs-CASE/.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from rehearsal.margins import CASE_CAPS, Limit
from settings.project import ROOT

# bench compare on the two cases' results: it reads files and draws one figure (seconds, not minutes).
# It took 1 s in every CI run seen (2026-12-02 to 12-04; printed rounded, so under 1.5 s); 25 s bounds a hang with
# room for a slow machine. CI's budget counts it as the cases are counted, at its slowest seen, rounded up to 2 s.
COMPARE_SEEN_S = 2.0
COMPARE_CAP_S = 25


@dataclass(frozen=True)
class Case:
    name: str
    passes: bool
    # For a failure case: what the one-line failure must say, and what the logs must show.
    failure: str = ""
    evidence: str = ""

    @property
    def cap(self) -> Limit:
        """Past it the case fails: the slowest run seen with its margin (rehearsal/margins.py)."""
        return CASE_CAPS[self.name]


# How deploy() ends a failure case: the app reached its terminal status and the endpoint served no chat.
_FAILED = r"deploy failed: app DEPLOY_FAILED after \d+ s, endpoint served no chat \(chat: [^)]*\); "

CASES = (
    Case("pd", passes=True),
    # The same GPUs serving aggregated (serving_mode=aggregated): it serves, with no NIXL anywhere.
    Case("aggregated", passes=True),
    # Prefill with a range: Serve scales it 1 -> 2 -> 1 with the traffic (rehearsal/scaling.py); then an engine
    # setting changed with a surge replica on each side (rehearsal/surge.py).
    Case("scaling", passes=True),
    # The Ray head's processes killed while streams run, under GCS fault tolerance (rehearsal/head_loss.py).
    Case("head-loss", passes=True),
    # A product config with backends [UCX]: across two nodes decode's pre-warm fails the NIXL
    # handshake and the app fails; where UCX does connect, verify flags the UCX backend.
    Case(
        "ucx",
        passes=False,
        failure=rf"UCX backend instantiated|{_FAILED}an engine could not start or pre-warm: NIXL transfer failure",
        evidence=r"Backend UCX was instantiated",
    ),
    # Prefill advertises a NIXL side channel decode cannot reach: decode's pre-warm fails its
    # handshake and the app never comes up.
    Case(
        "wrong-side-channel",
        passes=False,
        failure=rf"{_FAILED}an engine could not start or pre-warm: NIXL transfer failure: handshake_",
        evidence=r"NIXL transfer failure: handshake_\w+",
    ),
    # NIXL's LIBFABRIC plugin cannot load (no libfabric.so.1): NIXL's own message.
    Case(
        "no-plugin",
        passes=False,
        failure=rf"{_FAILED}an engine could not start.*(unsupported backend 'LIBFABRIC'|Skipping backend)",
        evidence=r"createBackend: unsupported backend 'LIBFABRIC'|Skipping backend registration LIBFABRIC",
    ),
)


def run_case(case: Case, out: Path) -> tuple[bool, str]:
    """Run one case in a fresh process; whether it behaved as expected, and a line saying how."""
    started = time.monotonic()
    command = [sys.executable, "-m", "rehearsal.run", "--case", case.name, "--logs", str(out / f"logs-{case.name}")]
    if case.passes:
        results = out / f"bench-{case.name}"
        shutil.rmtree(results, ignore_errors=True)
        command += ["--results", str(results)]
    try:
        result = subprocess.run(
            command, cwd=ROOT, capture_output=True, text=True, timeout=case.cap.limit_s, check=False
        )
    except subprocess.TimeoutExpired:
        return False, f"{case.name}: no result within its cap of {case.cap.limit_s:.0f} s"
    elapsed = time.monotonic() - started
    (out / f"{case.name}.stdout.txt").write_text(result.stdout)
    (out / f"{case.name}.stderr.txt").write_text(result.stderr)
    report = [line for line in result.stdout.splitlines() if not re.match(r"^\d{4}-\d\d-\d\d .*INFO scripts", line)]
    print("\n".join(report[-30:]))
    failure_lines = [line for line in result.stderr.splitlines() if line.startswith("rehearsal FAILED")]
    if case.passes:
        ok = result.returncode == 0
        outcome = "passed" if ok else failure_lines[-1:] or result.stderr[-500:]
        return ok, f"{case.name}: {outcome}; {case.cap.used(elapsed)}"
    if result.returncode == 0:
        return False, f"{case.name}: passed, but it must fail; {case.cap.used(elapsed)}"
    line = failure_lines[-1] if failure_lines else result.stderr.strip().splitlines()[-1:]
    said = re.search(case.failure, str(line)) is not None
    shown = not case.evidence or re.search(case.evidence, result.stderr + result.stdout) is not None
    evidence = [m.group(0) for m in re.finditer(case.evidence, result.stderr)][:1] if case.evidence else []
    return said and shown, f"{case.name}: failed as expected: {line} {evidence}; {case.cap.used(elapsed)}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--only", action="append", choices=[c.name for c in CASES])
    parser.add_argument("--out", type=Path, default=ROOT / "rehearsal-results")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    passed_cases = set()
    for case in CASES:
        if args.only and case.name not in args.only:
            continue
        print(f"=== rehearsal case {case.name}", flush=True)
        ok, line = run_case(case, args.out)
        print(("OK   " if ok else "FAIL ") + line, flush=True)
        results.append(ok)
        if ok:
            passed_cases.add(case.name)
    if {"pd", "aggregated"} <= passed_cases:
        results.append(compare(args.out))
    passed = sum(results)
    print(f"rehearsal: {passed} passed, {len(results) - passed} failed")
    return 0 if all(results) else 1


def compare(out: Path) -> bool:
    """`tools.bench compare` on the two real result sets this run made."""
    pd, aggregated = out / "bench-pd", out / "bench-aggregated"
    print("=== bench compare: disaggregated vs aggregated (CPU: the plumbing, not a GPU's answer)", flush=True)
    command = [
        sys.executable,
        "-m",
        "tools.bench",
        "compare",
        str(pd),
        str(aggregated),
        "--out",
        str(out / "compare.png"),
    ]
    started = time.monotonic()
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=COMPARE_CAP_S, check=False)
    print(result.stdout + result.stderr, flush=True)
    print(f"bench compare took {time.monotonic() - started:.0f} s of its {COMPARE_CAP_S} s cap", flush=True)
    ok = result.returncode == 0 and "verdict:" in result.stdout and (out / "compare.png").exists()
    print(("OK   " if ok else "FAIL ") + "bench compare", flush=True)
    return ok


if __name__ == "__main__":
    sys.exit(main())
