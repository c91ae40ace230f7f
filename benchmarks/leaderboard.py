"""The leaderboard of the repository: ``llm-gym leaderboard``, writing to ``benchmarks/results/``.

    python -m benchmarks.leaderboard            # all envs x random,oracle,tiny-sft,tiny-grpo
    python -m benchmarks.leaderboard --policies hf:path/to/model --envs Math-v0,SQL-v0

Run it from the repository root (the ``tiny-sft`` / ``tiny-grpo`` aliases name folders under
``outputs/``). Everything else (records, staleness, runs, options) is
:mod:`llm_gym.eval.leaderboard_cli`; ``--help`` lists the options.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from benchmarks.common import RESULTS_DIR
from llm_gym.eval.leaderboard_cli import cli


def main(argv: Sequence[str] | None = None) -> int:
    """``llm-gym leaderboard`` with ``--out-dir`` defaulting to ``benchmarks/results/``."""
    return cli(argv, out_dir=RESULTS_DIR)


if __name__ == "__main__":
    sys.exit(main())
