"""Print the KV-transfer plan, whether splitting pays, the cost, and the time to add a replica on a new
GPU node, for the settings: `python -m tools.plan [-c key=value ...]`. With a latency target, also each
side's floor and the replicas and cost a request rate needs (`--rate`, `--prompt-tokens`, `--output-tokens`).

The first table is the one `cdk synth` prints; settings as on the cdk command line
(including -c settings_file=path). Every number comes from settings/ (sizing/, estimates.py).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable

from settings import sizing
from settings.cli import cli_settings
from settings.estimates import (
    INSTANCE_PRICES_PER_HOUR,
    PRICE_DATE,
    PRICE_REGION,
    cost_summary,
    plan_table,
    priced_per_hour,
    scale_up_table,
)
from settings.model import Settings


def latency_target_table(s: Settings, rate: float, prompt_tokens: int, output_tokens: int) -> str:
    """For `make plan` when a side has a latency target: each side's floor, the replicas and cost a request rate
    needs (settings/sizing/latency.py, its models and why they are estimates), and the time a breach takes to
    fix, which is the scale-up budget above. Empty when no side has a target."""
    if all(s.side_latency_target(side) is None for side in sizing.SIDES):
        return ""
    sized = sizing.replicas_for_latency_targets(s, rate, prompt_tokens, output_tokens)
    rows = [
        f"Latency targets at {rate:g} requests/s of {prompt_tokens} prompt + {output_tokens} output tokens "
        "(estimates: settings/sizing/latency.py; --rate, --prompt-tokens, --output-tokens to change):"
    ]
    for side in sized.sides:
        # Rounded up, as settings/rules/latency.py refuses a target below it: a target at this number loads.
        floor_ms = math.ceil(side.floor_ms)
        what = "TTFT at the prefill replica" if side.side == "prefill" else "ITL"
        floor = f"floor {floor_ms} ms " + (
            f"(one replica, a {sizing.prefill_floor_prompt_tokens(s)}-token prompt, "
            f"MFU {sizing.PREFILL_MFU_RANGE[1]:.0%})"
            if side.side == "prefill"
            else f"(one step at {sizing.max_ongoing_requests(s, 'decode')} sequences)"
        )
        if side.replicas is None:
            needs = f"cannot be met at this length: {side.why}"
        elif side.replicas == 0:
            needs = side.why
        else:
            high = s.side_max_replicas(side.side)
            beyond = f"; above {side.side}_max_replicas = {high}: raise it" if side.replicas > high else ""
            needs = (
                f"{side.replicas} replicas ({side.per_replica_rate:.3g} requests/s each: {side.why}; "
                + (
                    f"one prefill alone {side.service_ms:.0f} ms)"
                    if side.side == "prefill"
                    else f"mean ITL {side.service_ms:.0f} ms at that load)"
                )
                + beyond
            )
        rows.append(f"  {side.side}: p{side.percentile} {what} <= {side.target_ms} ms, {floor}: {needs}")
    untargeted = [side for side in sizing.SIDES if s.side_latency_target(side) is None]
    counts = ", ".join(f"{side} {n}" for side, n in sized.replicas.items())
    cost = (
        f"~${priced_per_hour(s, sized.gpu_nodes):.2f}/h"
        if s.gpu_instance_type in INSTANCE_PRICES_PER_HOUR
        else f"no price for {s.gpu_instance_type}"
    )
    rows.append(
        f"  runs {counts} replicas on {sized.gpu_nodes} GPU nodes"
        + (f" (warm nodes included: {s.gpu_warm_nodes})" if s.gpu_warm_nodes else "")
        + f": {cost} for the whole stack (on demand, {PRICE_REGION} prices of {PRICE_DATE})"
        + (f"; {', '.join(untargeted)} at its minimum (it scales on ongoing requests)" if untargeted else "")
    )

    def minutes(case: str) -> str:
        fastest, slowest = sizing.scale_up_seconds(s, case)
        return f"{fastest / 60:.1f}-{slowest / 60:.1f} min"

    warm = f"{minutes(sizing.WARM)} on a warm node, " if s.gpu_warm_nodes else ""
    rows.append(
        f"  a breach is fixed when the replica it adds serves: {warm}{minutes(sizing.COLD)} on a new GPU node (the "
        "scale-up budget above); until then the share over the target stays over"
    )
    return "\n".join(rows)


def _positive(kind: type[int] | type[float]) -> Callable[[str], float]:
    def parse(text: str) -> float:
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{text}: must be above 0")
        return value

    return parse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="KV-transfer plan, whether splitting pays, cost, the scale-up budget, and with a latency target "
        "the replicas and cost it needs, for the settings"
    )
    parser.add_argument("-c", "--context", action="append", default=[], metavar="KEY=VALUE")
    # Only with a latency target: the traffic its replicas and cost are sized for.
    parser.add_argument("--rate", type=_positive(float), default=1.0, help="requests per second (default 1)")
    parser.add_argument(
        "--prompt-tokens", type=_positive(int), help="prompt length (default typical_request_tokens minus the output)"
    )
    parser.add_argument(
        "--output-tokens", type=_positive(int), default=sizing.OUTPUT_TOKENS, help="output length (default %(default)s)"
    )
    args = parser.parse_args(argv)
    settings = cli_settings(args.context)
    prompt = args.prompt_tokens or max(1, settings.typical_request_tokens - args.output_tokens)
    if prompt + args.output_tokens > settings.max_model_len:
        parser.error(f"--prompt-tokens plus --output-tokens: at most max_model_len {settings.max_model_len}")
    print(plan_table(settings))
    print(f"Estimated cost: {cost_summary(settings)}")
    print(scale_up_table(settings))
    latency = latency_target_table(settings, args.rate, prompt, args.output_tokens)
    if latency:
        print(latency)
    return 0


if __name__ == "__main__":
    sys.exit(main())
