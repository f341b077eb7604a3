"""`python -m tools.bench compare A B [C]`: bench result folders side by side, per load point, with a verdict.

    python -m tools.bench compare A B [C] [--ttft-slo-ms 2000] [--itl-slo-ms 100] [--margin 0.05]
                                          [--out A/compare.png]

With a third folder (always-split, aggregated and selective P/D, say) each pair is compared on its own,
and each pair's chart and CSV are named after it (A/compare-<a>-vs-<b>.png).

Each folder is what `tools.bench` writes: results.csv, one vLLM result per
point (run-<prompt>-<concurrency>.json, with every request's TTFT and
inter-token latencies) and metadata.json (the serving mode read from the live
RayService). Goodput is the requests per second that met both SLOs: TTFT at
most --ttft-slo-ms and a time per output token at most --itl-slo-ms (the
defaults, 2 s and 100 ms, are common interactive-chat targets; set your own).
A request's time per output token is (end - first token) / (tokens - 1): Ray's
stream batching moves when the client sees a token, not that sum, so it means
what it says; the client's single gaps (mostly 0, p99 about the batching
interval) do not, and are shown only beside the engine's own ITL.

A side wins a point only when its goodput is more than --margin above the
other's and the two 95% bootstrap intervals (requests resampled) do not
overlap; where they overlap the point says "no difference shown", with the
request counts. Where neither side met the SLOs, the median end-to-end latency
decides, by the same rule. A point with fewer than MIN_REQUESTS requests on a
side gets no verdict.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

DEFAULT_TTFT_SLO_MS = 2000.0
DEFAULT_ITL_SLO_MS = 100.0
DEFAULT_MARGIN = 0.05
# Below this many requests on a side, a point gets no verdict at all.
MIN_REQUESTS = 4
BOOTSTRAP_RESAMPLES = 2000
CONFIDENCE = 0.95
# (results.csv column, label) per panel of the chart and per column of the table.
METRICS = (
    ("median_ttft_ms", "TTFT p50 (ms)"),
    ("p99_ttft_ms", "TTFT p99 (ms)"),
    ("engine_median_itl_ms", "engine ITL p50 (ms)"),
    ("engine_p99_itl_ms", "engine ITL p99 (ms)"),
    ("median_tpot_ms", "TPOT p50 (ms)"),
    ("median_itl_ms", "client ITL p50 (ms, Ray batches)"),
    ("output_throughput", "output tok/s"),
    ("goodput", "goodput (req/s)"),
)
# Per point, from the per-request detail: each a value and its bootstrap interval (_lo, _hi).
INTERVALS = ("goodput", "median_ttft_s", "p99_ttft_s", "median_e2el_s")


@dataclass(frozen=True)
class ResultSet:
    label: str
    # (prompt tokens, concurrency) -> the row of results.csv, plus "goodput"
    points: dict[tuple[int, int], dict[str, float | None]]


@dataclass(frozen=True)
class Requests:
    """One point's requests, from vLLM's --save-detailed result (seconds)."""

    ok: tuple[bool, ...]  # no error
    ttft: tuple[float, ...]
    tpot: tuple[float, ...]  # (end - first token) / (tokens - 1)
    e2el: tuple[float, ...]
    duration: float

    def good(self, ttft_slo_ms: float, itl_slo_ms: float) -> np.ndarray:
        ttft, tpot = np.array(self.ttft), np.array(self.tpot)
        return np.array(self.ok) & (ttft * 1e3 <= ttft_slo_ms) & (tpot * 1e3 <= itl_slo_ms)


def requests_of(result: Mapping[str, Any]) -> Requests | None:
    ttfts, itls, duration = result.get("ttfts"), result.get("itls"), result.get("duration")
    if ttfts is None or itls is None or not duration:
        return None
    # A failed request carries an error and a zero TTFT: it never counts.
    errors = result.get("errors") or [""] * len(ttfts)
    lens = result.get("output_lens") or [len(gaps) + 1 for gaps in itls]
    ok, ttft, tpot, e2el = [], [], [], []
    for first, gaps, error, tokens in zip(ttfts, itls, errors, lens, strict=False):
        decode = sum(gaps)
        ok.append(not error and first is not None)
        ttft.append(first or 0.0)
        # Tokens, not gaps: Ray may put several tokens in one streamed message.
        tpot.append(decode / (tokens - 1) if tokens and tokens > 1 else 0.0)
        e2el.append((first or 0.0) + decode)
    return Requests(tuple(ok), tuple(ttft), tuple(tpot), tuple(e2el), float(duration))


def goodput(result: Mapping[str, Any], ttft_slo_ms: float, itl_slo_ms: float) -> float | None:
    """Requests per second that met both SLOs, from vLLM's per-request detail; None without it."""
    requests = requests_of(result)
    if requests is None:
        return None
    return float(requests.good(ttft_slo_ms, itl_slo_ms).sum()) / requests.duration


def intervals(
    requests: Requests, ttft_slo_ms: float, itl_slo_ms: float, *, resamples: int = BOOTSTRAP_RESAMPLES
) -> dict[str, float | None]:
    """Goodput and the latency percentiles, each with a percentile-bootstrap interval (requests resampled)."""
    rng = np.random.default_rng(0)  # the same data always gives the same verdict
    good = requests.good(ttft_slo_ms, itl_slo_ms).astype(float)
    ok = np.array(requests.ok)
    tail = (1 - CONFIDENCE) / 2 * 100
    found: dict[str, float | None] = {"requests": float(len(good))}
    idx = rng.integers(0, len(good), size=(resamples, len(good))) if len(good) else None
    found["goodput"] = float(good.sum()) / requests.duration
    if idx is not None:
        lo, hi = np.percentile(good[idx].sum(axis=1) / requests.duration, [tail, 100 - tail])
        found["goodput_lo"], found["goodput_hi"] = float(lo), float(hi)
    served = {"ttft": np.array(requests.ttft)[ok], "e2el": np.array(requests.e2el)[ok]}
    for name, values, q in (
        ("median_ttft_s", served["ttft"], 50),
        ("p99_ttft_s", served["ttft"], 99),
        ("median_e2el_s", served["e2el"], 50),
    ):
        if not len(values):
            continue
        found[name], found[f"{name}_lo"], found[f"{name}_hi"] = percentile_interval(values, q, rng, resamples)
    return found


def percentile_interval(
    values: Sequence[float] | np.ndarray, q: float, rng: np.random.Generator, resamples: int = BOOTSTRAP_RESAMPLES
) -> tuple[float, float, float]:
    """A percentile of the values and its percentile-bootstrap interval at CONFIDENCE (values resampled)."""
    data = np.asarray(values, dtype=float)
    tail = (1 - CONFIDENCE) / 2 * 100
    sample = data[rng.integers(0, len(data), size=(resamples, len(data)))]
    lo, hi = np.percentile(np.percentile(sample, q, axis=1), [tail, 100 - tail])
    return float(np.percentile(data, q)), float(lo), float(hi)


def _number(text: str | None) -> float | None:
    return float(text) if text not in (None, "", "None") else None


def mode_label(metadata: Mapping[str, Any]) -> str:
    """What a result measured: aggregated, disaggregated (every request split) or selective P/D (decode prefills
    prompts up to its threshold itself, tools/bench.py describe_serve_config); None without metadata."""
    mode = metadata.get("serving_mode")
    threshold = metadata.get("local_prefill_max_tokens") or 0
    if mode == "disaggregated" and threshold:
        return f"selective P/D (<= {threshold})"
    return str(mode) if mode else ""


def load(folder: Path, ttft_slo_ms: float, itl_slo_ms: float) -> ResultSet:
    metadata_file = folder / "metadata.json"
    metadata = json.loads(metadata_file.read_text()) if metadata_file.exists() else {}
    label = mode_label(metadata) or folder.name
    points: dict[tuple[int, int], dict[str, float | None]] = {}
    with (folder / "results.csv").open() as handle:
        for row in csv.DictReader(handle):
            key = (int(row["input_len"]), int(row["concurrency"]))
            values = {name: _number(row.get(name)) for name, _ in METRICS if name != "goodput"}
            run = folder / f"run-{key[0]}-{key[1]}.json"
            requests = requests_of(json.loads(run.read_text())) if run.exists() else None
            values["goodput"] = None
            if requests is not None:
                values.update(intervals(requests, ttft_slo_ms, itl_slo_ms))
            points[key] = values
    return ResultSet(label, points)


def winner(a: Mapping[str, float | None], b: Mapping[str, float | None], margin: float) -> str:
    """One point: 'a' or 'b' (better by more than the margin, intervals apart), 'tie' (within the
    margin), 'unshown' (the intervals overlap, or no per-request detail) or 'few' (too few requests).

    Goodput decides (higher is better); where neither side met the SLOs, the median end-to-end
    latency (lower is better)."""
    if min(a.get("requests") or 0, b.get("requests") or 0) < MIN_REQUESTS:
        return "few"
    field, sign = ("goodput", 1.0) if (a.get("goodput") or b.get("goodput")) else ("median_e2el_s", -1.0)
    va, vb = a.get(field), b.get(field)
    if va is None or vb is None:
        return "unshown"
    better, worse, side = (va, vb, "a") if sign * (va - vb) > 0 else (vb, va, "b")
    # The margin: relative to the worse side (higher goodput), or to the better (lower latency).
    if (sign > 0 and better <= worse * (1 + margin)) or (sign < 0 and better >= worse * (1 - margin)):
        return "tie"
    lo = {k: v.get(f"{field}_lo") for k, v in (("a", a), ("b", b))}
    hi = {k: v.get(f"{field}_hi") for k, v in (("a", a), ("b", b))}
    if None in (*lo.values(), *hi.values()):
        return "unshown"
    other = "b" if side == "a" else "a"
    apart = lo[side] > hi[other] if sign > 0 else hi[side] < lo[other]  # type: ignore[operator]
    return side if apart else "unshown"


NOT_SHOWN = "no difference shown"
TOO_FEW = "too few requests"


def verdict(a: ResultSet, b: ResultSet, margin: float) -> tuple[dict[tuple[int, int], str], str]:
    """Each shared point's winner (a label or 'tie'), and one line saying what that means overall."""
    shared = sorted(set(a.points) & set(b.points))
    names = {"a": a.label, "b": b.label, "tie": "tie", "unshown": NOT_SHOWN, "few": TOO_FEW}
    per_point = {p: names[winner(a.points[p], b.points[p], margin)] for p in shared}
    wins = {label: [p for p, w in per_point.items() if w == label] for label in (a.label, b.label)}
    if not shared:
        return per_point, "no load point in common"
    if len(wins[a.label]) == len(shared):
        return per_point, f"{a.label} wins at every load point"
    if len(wins[b.label]) == len(shared):
        return per_point, f"{b.label} wins at every load point"

    def count(p: tuple[int, int]) -> str:
        return f"{a.points[p].get('requests') or 0:.0f} vs {b.points[p].get('requests') or 0:.0f} requests"

    def where(points: list[tuple[int, int]], counts: bool = False) -> str:
        return ", ".join(f"{n} tokens x {c}" + (f" ({count((n, c))})" if counts else "") for n, c in points)

    groups = {kind: [p for p, won in per_point.items() if won == kind] for kind in ("tie", NOT_SHOWN, TOO_FEW)}
    if not wins[a.label] and not wins[b.label] and len(groups["tie"]) == len(shared):
        return per_point, f"no difference beyond {margin:.0%} at any load point"
    if not wins[a.label] and not wins[b.label] and len(groups[NOT_SHOWN]) == len(shared):
        return per_point, f"no difference shown at any load point: {where(shared, counts=True)}"
    parts = [f"{label} wins at {where(wins[label])}" for label in (a.label, b.label) if wins[label]]
    if groups["tie"]:
        parts.append(f"no difference beyond {margin:.0%} at {where(groups['tie'])}")
    if groups[NOT_SHOWN]:
        parts.append(f"no difference shown at {where(groups[NOT_SHOWN], counts=True)}")
    if groups[TOO_FEW]:
        parts.append(f"too few requests (under {MIN_REQUESTS}) at {where(groups[TOO_FEW], counts=True)}")
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
    names = (
        [name for name, _ in METRICS]
        + [f"{name}{end}" for name in INTERVALS for end in ("_lo", "_hi") if name != "goodput"]
        + ["goodput_lo", "goodput_hi", "requests"]
        + [n for n in INTERVALS if n != "goodput"]
    )
    fields = ["input_len", "concurrency"] + [f"{side}_{name}" for name in names for side in ("a", "b")]
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=[*fields, "a", "b", "winner"])
        writer.writeheader()
        for (n, c), won in per_point.items():
            row: dict[str, Any] = {"input_len": n, "concurrency": c, "a": a.label, "b": b.label, "winner": won}
            for name in names:
                row[f"a_{name}"], row[f"b_{name}"] = a.points[(n, c)].get(name), b.points[(n, c)].get(name)
            writer.writerow(row)


def write_chart(a: ResultSet, b: ResultSet, per_point: Mapping[tuple[int, int], str], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = list(per_point)
    labels = [f"{n} x{c}\n{per_point[(n, c)]}" for n, c in points]
    columns = (len(METRICS) + 1) // 2
    figure, axes = plt.subplots(2, columns, figsize=(5 * columns, 8))
    width = 0.38
    for ax, (name, label) in zip(axes.flat, METRICS, strict=True):
        for offset, side in ((-width / 2, a), (width / 2, b)):
            values = [side.points[p].get(name) or 0.0 for p in points]
            ax.bar([i + offset for i in range(len(points))], values, width, label=side.label)
        ax.set_xticks(range(len(points)), labels, fontsize=8)
        ax.set_title(label)
        ax.grid(axis="y", alpha=0.3)
    axes.flat[0].legend()
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def _slug(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", label).strip("-")


def compare_pair(a: ResultSet, b: ResultSet, args: argparse.Namespace, chart: Path) -> None:
    """One pair side by side: the table, the verdict, the chart and its CSV."""
    per_point, overall = verdict(a, b, args.margin)
    print(table(a, b, per_point))
    print(f"verdict: {overall}")
    write_chart(a, b, per_point, chart, f"{a.label} vs {b.label}: {overall}")
    write_csv(a, b, per_point, chart.with_suffix(".csv"))
    print(f"wrote {chart} and {chart.with_suffix('.csv')}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench compare", description=__doc__.splitlines()[0])
    parser.add_argument("a", type=Path, help="a bench result folder (e.g. the disaggregated run)")
    parser.add_argument("b", type=Path, help="another (e.g. the aggregated run)")
    parser.add_argument("c", type=Path, nargs="?", help="a third (e.g. selective P/D): each pair is compared")
    parser.add_argument("--ttft-slo-ms", type=float, default=DEFAULT_TTFT_SLO_MS)
    parser.add_argument("--itl-slo-ms", type=float, default=DEFAULT_ITL_SLO_MS)
    parser.add_argument("--margin", type=float, default=DEFAULT_MARGIN)
    parser.add_argument("--out", type=Path, help="the chart (default: A/compare.png, and A/compare.csv)")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    folders = [f for f in (args.a, args.b, args.c) if f is not None]
    missing = [str(f) for f in folders if not (f / "results.csv").exists()]
    if missing:
        print(f"error: no results.csv in {', '.join(missing)}: run python -m tools.bench first", file=sys.stderr)
        return 1
    results = [load(f, args.ttft_slo_ms, args.itl_slo_ms) for f in folders]
    if len({r.label for r in results}) < len(results):
        results = [ResultSet(f"{r.label} ({f.name})", r.points) for r, f in zip(results, folders, strict=True)]
    print(
        f"SLOs: TTFT <= {args.ttft_slo_ms:g} ms, time per output token <= {args.itl_slo_ms:g} ms; "
        f"a win needs more than {args.margin:.0%} and {CONFIDENCE:.0%} bootstrap intervals apart"
    )
    chart = args.out or args.a / "compare.png"
    if len(results) == 2:
        compare_pair(results[0], results[1], args, chart)
        return 0
    # Three: each pair on its own, like with like, each chart named by its pair beside the first.
    for i, j in ((0, 1), (0, 2), (1, 2)):
        a, b = results[i], results[j]
        print(f"\n== {a.label} vs {b.label}")
        compare_pair(a, b, args, chart.with_name(f"{chart.stem}-{_slug(a.label)}-vs-{_slug(b.label)}{chart.suffix}"))
    return 0
