"""Evaluation: ``run_and_report``, pass@k and intervals.

The leaderboard (``llm-gym leaderboard``) lives in its own modules: records and the table in
:mod:`~llm_gym.eval.leaderboard`, drawing in :mod:`~llm_gym.eval.leaderboard_render`, runs in
:mod:`~llm_gym.eval.leaderboard_run`, options in :mod:`~llm_gym.eval.leaderboard_cli`.
"""

from llm_gym.eval.metrics import (
    is_success,
    mean_pass_at_k,
    paired_difference_interval,
    pass_at_k,
    success_by_type,
    summarize_episodes,
    wilson_interval,
)
from llm_gym.eval.report import EvalReport, run_and_report, select_tasks

__all__ = [
    # the evaluator
    "run_and_report",
    "EvalReport",
    "select_tasks",
    # numbers
    "pass_at_k",
    "mean_pass_at_k",
    "wilson_interval",
    "paired_difference_interval",
    "summarize_episodes",
    "success_by_type",
    "is_success",
]
