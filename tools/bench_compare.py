"""`python -m tools.bench compare A B`: two bench result folders side by side, per load point, with a verdict.

    python -m tools.bench compare A B [--ttft-slo-ms 2000] [--itl-slo-ms 100] [--margin 0.05]
                                      [--out A/compare.png]

Each folder is what `tools.bench` writes: results.csv, one vLLM result per
point (run-<prompt>-<concurrency>.json, with every request's TTFT and
inter-token latencies) and metadata.json (the serving mode read from the live
RayService). Goodput is the requests per second that met both SLOs: TTFT at
most --ttft-slo-ms and a mean inter-token latency at most --itl-slo-ms (the
defaults, 2 s and 100 ms, are common interactive-chat targets; set your own).
A side wins a point when its goodput is more than --margin above the other's
(output throughput decides where neither met the SLOs at all).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_TTFT_SLO_MS = 2000.0
DEFAULT_ITL_SLO_MS = 100.0
DEFAULT_MARGIN = 0.05
# (results.csv column, label) per panel of the chart and per column of the table.
METRICS = (
    ("median_ttft_ms", "TTFT p50 (ms)"),
    ("p99_ttft_ms", "TTFT p99 (ms)"),
    ("median_itl_ms", "ITL p50 (ms)"),
    ("p99_itl_ms", "ITL p99 (ms)"),
    ("output_throughput", "output tok/s"),
    ("goodput", "goodput (req/s)"),
)


@dataclass(frozen=True)
class ResultSet:
    label: str
    # (prompt tokens, concurrency) -> the row of results.csv, plus "goodput"
    points: dict[tuple[int, int], dict[str, float | None]]


def goodput(result: Mapping[str, Any], ttft_slo_ms: float, itl_slo_ms: float) -> float | None:
    """Requests per second that met both SLOs, from vLLM's per-request detail; None without it."""
    ttfts, itls, duration = result.get("ttfts"), result.get("itls"), result.get("duration")
    if ttfts is None or itls is None or not duration:
        return None
    # A failed request carries an error and a zero TTFT: it never counts.
    errors = result.get("errors") or [""] * len(ttfts)
    good = 0
    for ttft, gaps, error in zip(ttfts, itls, errors, strict=False):
        mean_itl = sum(gaps) / len(gaps) if gaps else 0.0
        if not error and ttft is not None and ttft * 1e3 <= ttft_slo_ms and mean_itl * 1e3 <= itl_slo_ms:
            good += 1
    return good / float(duration)


def _number(text: str | None) -> float | None:
    return float(text) if text not in (None, "", "None") else None


def load(folder: Path, ttft_slo_ms: float, itl_slo_ms: float) -> ResultSet:
    metadata_file = folder / "metadata.json"
    metadata = json.loads(metadata_file.read_text()) if metadata_file.exists() else {}
    label = str(metadata.get("serving_mode") or folder.name)
    points: dict[tuple[int, int], dict[str, float | None]] = {}
    with (folder / "results.csv").open() as handle:
        for row in csv.DictReader(handle):
            key = (int(row["input_len"]), int(row["concurrency"]))
            values = {name: _number(row.get(name)) for name, _ in METRICS if name != "goodput"}
            run = folder / f"run-{key[0]}-{key[1]}.json"
            values["goodput"] = goodput(json.loads(run.read_text()), ttft_slo_ms, itl_slo_ms) if run.exists() else None
            points[key] = values
    return ResultSet(label, points)


def winner(a: Mapping[str, float | None], b: Mapping[str, float | None], margin: float) -> str:
    """'a', 'b' or 'tie' for one point: goodput, or output throughput where neither met the SLOs."""
    field = "goodput" if (a.get("goodput") or b.get("goodput")) else "output_throughput"
    va, vb = a.get(field) or 0.0, b.get(field) or 0.0
    if va > vb * (1 + margin):
        return "a"
    if vb > va * (1 + margin):
        return "b"
    return "tie"


def verdict(a: ResultSet, b: ResultSet, margin: float) -> tuple[dict[tuple[int, int], str], str]:
    """Each shared point's winner (a label or 'tie'), and one line saying what that means overall."""
    shared = sorted(set(a.points) & set(b.points))
    names = {"a": a.label, "b": b.label, "tie": "tie"}
    per_point = {p: names[winner(a.points[p], b.points[p], margin)] for p in shared}
    wins = {label: [p for p, w in per_point.items() if w == label] for label in (a.label, b.label)}
    if not shared:
        return per_point, "no load point in common"
    if len(wins[a.label]) == len(shared):
        return per_point, f"{a.label} wins at every load point"
    if len(wins[b.label]) == len(shared):
        return per_point, f"{b.label} wins at every load point"
    if not wins[a.label] and not wins[b.label]:
        return per_point, f"no difference beyond {margin:.0%} at any load point"

    def where(points: list[tuple[int, int]]) -> str:
        return ", ".join(f"{n} tokens x {c}" for n, c in points)

    ties = [p for p, won in per_point.items() if won == "tie"]
    parts = [f"{label} wins at {where(wins[label])}" for label in (a.label, b.label) if wins[label]]
    if ties:
        parts.append(f"no difference beyond {margin:.0%} at {where(ties)}")
    return per_point, ("split: " if wins[a.label] and wins[b.label] else "") + "; ".join(parts)


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def table(a: ResultSet, b: ResultSet, per_point: Mapping[tuple[int, int], str]) -> str:
    head = f"{'prompt x conc':>14}  " + "  ".join(f"{label:>21}" for _, label in METRICS) + "  winner"
    sub = f"{'':>14}  " + "  ".join(f"{a.label[:10]:>10} {b.label[:10]:>10}" for _ in METRICS)
    rows = [head, sub]
    for point, won in per_point.items():
        cells = "  ".join(
            f"{_cell(a.points[point][name]):>10} {_cell(b.points[point][name]):>10}" for name, _ in METRICS
        )
        rows.append(f"{f'{point[0]} x {point[1]}':>14}  {cells}  {won}")
    return "\n".join(rows)


def write_csv(a: ResultSet, b: ResultSet, per_point: Mapping[tuple[int, int], str], path: Path) -> None:
    fields = ["input_len", "concurrency"] + [f"{side}_{name}" for name, _ in METRICS for side in ("a", "b")]
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=[*fields, "a", "b", "winner"])
        writer.writeheader()
        for (n, c), won in per_point.items():
            row: dict[str, Any] = {"input_len": n, "concurrency": c, "a": a.label, "b": b.label, "winner": won}
            for name, _ in METRICS:
                row[f"a_{name}"], row[f"b_{name}"] = a.points[(n, c)][name], b.points[(n, c)][name]
            writer.writerow(row)


def write_chart(a: ResultSet, b: ResultSet, per_point: Mapping[tuple[int, int], str], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = list(per_point)
    labels = [f"{n} x{c}\n{per_point[(n, c)]}" for n, c in points]
    figure, axes = plt.subplots(2, 3, figsize=(15, 8))
    width = 0.38
    for ax, (name, label) in zip(axes.flat, METRICS, strict=True):
        for offset, side in ((-width / 2, a), (width / 2, b)):
            values = [side.points[p][name] or 0.0 for p in points]
            ax.bar([i + offset for i in range(len(points))], values, width, label=side.label)
        ax.set_xticks(range(len(points)), labels, fontsize=8)
        ax.set_title(label)
        ax.grid(axis="y", alpha=0.3)
    axes.flat[0].legend()
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench compare", description=__doc__.splitlines()[0])
    parser.add_argument("a", type=Path, help="a bench result folder (e.g. the disaggregated run)")
    parser.add_argument("b", type=Path, help="another (e.g. the aggregated run)")
    parser.add_argument("--ttft-slo-ms", type=float, default=DEFAULT_TTFT_SLO_MS)
    parser.add_argument("--itl-slo-ms", type=float, default=DEFAULT_ITL_SLO_MS)
    parser.add_argument("--margin", type=float, default=DEFAULT_MARGIN)
    parser.add_argument("--out", type=Path, help="the chart (default: A/compare.png, and A/compare.csv)")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    missing = [str(f) for f in (args.a, args.b) if not (f / "results.csv").exists()]
    if missing:
        print(f"error: no results.csv in {', '.join(missing)}: run python -m tools.bench first", file=sys.stderr)
        return 1
    a = load(args.a, args.ttft_slo_ms, args.itl_slo_ms)
    b = load(args.b, args.ttft_slo_ms, args.itl_slo_ms)
    if a.label == b.label:
        a, b = ResultSet(f"{a.label} ({args.a.name})", a.points), ResultSet(f"{b.label} ({args.b.name})", b.points)
    per_point, overall = verdict(a, b, args.margin)
    print(f"SLOs: TTFT <= {args.ttft_slo_ms:g} ms, mean inter-token latency <= {args.itl_slo_ms:g} ms")
    print(table(a, b, per_point))
    print(f"verdict: {overall}")
    chart = args.out or args.a / "compare.png"
    write_chart(a, b, per_point, chart, f"{a.label} vs {b.label}: {overall}")
    write_csv(a, b, per_point, chart.with_suffix(".csv"))
    print(f"wrote {chart} and {chart.with_suffix('.csv')}")
    return 0
