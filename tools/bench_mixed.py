"""The `mixed` workload of tools/bench.py: short, medium and long prompts and outputs in the proportions of a
public production trace, as the file vLLM's `timed_trace` dataset reads (one JSON line per request)."""

from __future__ import annotations

import json
import random
from pathlib import Path

# mixed: why. A sweep at one prompt length never has short and long prompts in the engines at once, yet that
# is what selective P/D, chunked prefill and the router decide on. The mix is a public production trace's:
# the Azure LLM inference trace 2023, conversation (Patel et al., "Splitwise: Efficient generative LLM
# inference using phase splitting", ISCA 2024; github.com/Azure/AzurePublicDataset,
# data/AzureLLMInferenceTrace_conv.csv, 19,366 requests; median prompt 1,020 tokens, median output 129).
# Counted from that file, by this project's prompt classes (short <= 512 tokens, long >= 2,048):
# (class, requests, median prompt tokens, median output tokens in that class)
MIXED_TRACE_CLASSES = (
    ("short", 7_643, 386, 98),
    ("medium", 9_020, 1_085, 396),
    ("long", 2_703, 4_077, 67),
)
# Derived: each request is of one class, in the trace's proportions (39.5%, 46.6%, 14.0%), at that class's
# median lengths, shuffled; a prompt longer than max_model_len leaves for its output is cut to fit.
TRACE_CHUNK_TOKENS = 16  # tokens per hash id in vLLM's timed_trace dataset (its default)


def mixed_lengths(num_prompts: int, max_model_len: int) -> list[tuple[int, int]]:
    """The mixed workload's (prompt, output) tokens per request: MIXED_TRACE_CLASSES in the trace's proportions
    (largest remainders, so the counts add up to num_prompts), shuffled with a fixed seed."""
    total = sum(count for _, count, _, _ in MIXED_TRACE_CLASSES)
    exact = [num_prompts * count / total for _, count, _, _ in MIXED_TRACE_CLASSES]
    counts = [int(x) for x in exact]
    by_remainder = sorted(range(len(exact)), key=lambda i: exact[i] - counts[i], reverse=True)
    for i in by_remainder[: num_prompts - sum(counts)]:
        counts[i] += 1
    lengths = [
        (min(prompt, max_model_len - output), output)
        for (_, _, prompt, output), n in zip(MIXED_TRACE_CLASSES, counts, strict=True)
        for _ in range(n)
    ]
    random.Random(0).shuffle(lengths)  # noqa: S311 - a fixed order, not a secret
    return lengths


def mixed_input_len(max_model_len: int) -> int:
    """The mix's mean prompt length: what a mixed point's input_len column says."""
    total = sum(count for _, count, _, _ in MIXED_TRACE_CLASSES)
    return round(
        sum(count * min(prompt, max_model_len - output) for _, count, prompt, output in MIXED_TRACE_CLASSES) / total
    )


def mixed_requests_path(result_dir: Path, result_file: str) -> Path:
    return result_dir / f"{Path(result_file).stem}-requests.jsonl"


def write_mixed_requests(path: Path, num_prompts: int, max_model_len: int) -> list[int]:
    """The requests file vLLM's timed_trace dataset reads: each request's lengths, and hash ids (one per
    TRACE_CHUNK_TOKENS of prompt) that no two requests share, so each prompt is new as in `random`. Returns the
    prompt lengths."""
    lengths, lines, next_id = mixed_lengths(num_prompts, max_model_len), [], 0
    for prompt, output in lengths:
        blocks = -(-prompt // TRACE_CHUNK_TOKENS)
        ids = list(range(next_id, next_id + blocks))
        next_id += blocks
        lines.append(json.dumps({"timestamp": 0, "input_length": prompt, "output_length": output, "hash_ids": ids}))
    path.write_text("\n".join(lines) + "\n")
    return [prompt for prompt, _ in lengths]
