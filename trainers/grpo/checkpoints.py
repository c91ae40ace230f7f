"""Atomic checkpoints: each is written to a hidden staging folder, then renamed into place.

A run killed mid-save never leaves a half-written ``checkpoint-N`` to resume from: the trainer
lets TRL write ``checkpoint-N`` under :func:`staging_dir` and :func:`promote_staged_checkpoint`
moves it into the run's folder, cleans up staging folders of killed runs and rotates old
checkpoints as TRL would have.
"""

from __future__ import annotations

import os
import shutil

__all__ = ["STAGING_PREFIX", "promote_staged_checkpoint", "staging_dir"]

STAGING_PREFIX = ".staging-"
"""The name of a staging folder is this prefix and the step."""


def staging_dir(run_dir: str, step: int) -> str:
    """The staging folder of step ``step``'s checkpoint.

    Example:
        >>> staging_dir("out", 20)
        'out/.staging-20'
    """
    return os.path.join(run_dir, f"{STAGING_PREFIX}{step}")


def promote_staged_checkpoint(
    run_dir: str,
    step: int,
    best_model_checkpoint: str | None,
    save_total_limit: int | None,
) -> str | None:
    """Move ``checkpoint-<step>`` from its staging folder into ``run_dir``.

    Replaces a checkpoint of the same step, deletes every staging folder left in ``run_dir``
    (also those of runs killed while saving) and rotates checkpoints over ``save_total_limit``
    (keeping the best one).

    Args:
        run_dir: The run's output folder.
        step: The checkpoint's step.
        best_model_checkpoint: The trainer state's best checkpoint (a path inside the staging
            folder when the staged checkpoint is the best one).
        save_total_limit: The checkpoints to keep (None: all).

    Returns:
        ``best_model_checkpoint``, pointing into ``run_dir`` instead of the staging folder.
    """
    from transformers.trainer_utils import rotate_checkpoints

    staging_root = staging_dir(run_dir, step)
    staged = os.path.join(staging_root, f"checkpoint-{step}")
    final = os.path.join(run_dir, f"checkpoint-{step}")
    if os.path.exists(final):
        shutil.rmtree(final)
    os.replace(staged, final)
    best = best_model_checkpoint
    if best and best.startswith(staging_root):
        best = run_dir + best[len(staging_root) :]
    for stale in os.listdir(run_dir):  # left over by runs killed while saving
        if stale.startswith(STAGING_PREFIX):
            shutil.rmtree(os.path.join(run_dir, stale), ignore_errors=True)
    rotate_checkpoints(
        output_dir=run_dir,
        save_total_limit=save_total_limit,
        best_model_checkpoint=best,
        use_mtime=False,
    )
    return best
