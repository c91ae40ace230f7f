"""``llm-gym sft``: multi-turn SFT of a model on saved episodes, filtered by reward.

Rejection-sampling fine-tuning in two commands: collect episodes (``llm-gym eval ENV --policy ...
--k 8 --save-episodes eps.jsonl``, or a training run's ``save_episodes`` folder), then train on
those that reached a reward::

    llm-gym sft --from-episodes eps.jsonl --min-reward 1 --model smollm2-135m-instruct \\
        --output runs/rft

The episodes are read as hostile input (:func:`llm_gym.eval.episode_files.read_episodes`) and
turned into conversational rows (:func:`~llm_gym.eval.episode_files.episodes_dataset`);
:func:`trainers.sft.train.sft_warm_start` trains exactly the tokens RL would train (the assistant
turns) and saves the model in ``--output``, whose path is the last line printed.
``python -m trainers.sft.command ...`` is the same command.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from trainers.sft.settings import SFTSettings

__all__ = ["FLAG_FIELDS", "build_parser", "main", "settings_from_args"]

FLAG_FIELDS = {
    "--min-reward": "min_reward",
    "--learning-rate": "learning_rate",
    "--batch-size": "batch_size",
    "--epochs": "epochs",
    "--max-steps": "max_steps",
    "--warmup-steps": "warmup_steps",
    "--time-budget": "time_budget_s",
}
"""The :class:`~trainers.sft.settings.SFTSettings` field each flag sets."""


def build_parser() -> argparse.ArgumentParser:
    """The arguments of ``llm-gym sft``."""
    p = argparse.ArgumentParser(
        prog="llm-gym sft",
        description="Fine-tune a model on saved episodes (JSONL from `llm-gym eval "
        "--save-episodes` or the trainer's save_episodes folder), keeping those whose reward "
        "reaches --min-reward: rejection-sampling fine-tuning. Needs the train extra. Prints "
        "the saved model's path last.",
    )
    p.add_argument(
        "--from-episodes",
        required=True,
        metavar="PATH",
        help="an episodes JSONL file, or a folder of them",
    )
    p.add_argument(
        "--min-reward",
        type=float,
        default=None,
        help="keep the episodes with reward >= this (default: all)",
    )
    p.add_argument(
        "--model",
        default="tiny",
        help="tiny (the embedded model, its tokenizer "
        "fitted to the episodes' envs) | a packaged model's name | PATH | PATH.gguf "
        "| a hub id (default: tiny)",
    )
    p.add_argument("--output", default="outputs/sft", help="the folder the model is saved to")
    p.add_argument("--epochs", type=float, default=1.0, help="passes over the episodes (1)")
    p.add_argument("--max-steps", type=int, default=None, help="optimizer steps (over --epochs)")
    p.add_argument("--learning-rate", type=float, default=5e-4, help="peak rate (5e-4)")
    p.add_argument("--batch-size", type=int, default=8, help="episodes per step (8)")
    p.add_argument("--warmup-steps", type=int, default=0, help="linear warmup steps (0)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--time-budget",
        type=float,
        default=None,
        metavar="SECONDS",
        help="stop training after this many seconds",
    )
    p.add_argument(
        "--action-format",
        default=None,
        help="the format the episodes' tool calls are written in (default: the one they "
        "record; auto: the one the model's chat template teaches, else hermes)",
    )
    p.add_argument(
        "--chat-template",
        default=None,
        metavar="NAME|PATH.jinja",
        help="the template of a model without one (chatml, gemma, a file)",
    )
    p.add_argument(
        "--lora-r",
        type=int,
        default=None,
        help="train a LoRA adapter of this rank "
        "(merged into the saved model); default: every weight",
    )
    p.add_argument("--no-progress", action="store_true")
    return p


def settings_from_args(args: argparse.Namespace) -> SFTSettings:
    """The warm start's settings from ``llm-gym sft``'s parsed arguments: the episodes as the
    source, the flags' fields (:data:`FLAG_FIELDS`), the rest at their defaults; a value the
    settings refuse is an error that names its flag.

    Example:
        >>> args = build_parser().parse_args(["--from-episodes", "e.jsonl", "--lora-r", "8"])
        >>> settings = settings_from_args(args)
        >>> settings.source, settings.batch_size, settings.warmup_steps, settings.lora
        ('episodes', 8, 0, {'r': 8, 'lora_alpha': 16})
        >>> args.epochs = 0.0
        >>> settings_from_args(args)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        llm_gym.errors.InvalidArgumentError: --epochs must be a finite number > 0, ...
    """
    from llm_gym.errors import InvalidArgumentError
    from trainers.sft.settings import SFTSettings

    if args.lora_r is not None and args.lora_r < 1:
        raise InvalidArgumentError(
            f"--lora-r must be an integer >= 1, actual value: {args.lora_r}."
        )
    lora = None if args.lora_r is None else {"r": args.lora_r, "lora_alpha": 2 * args.lora_r}
    values = {
        field: getattr(args, flag[2:].replace("-", "_")) for flag, field in FLAG_FIELDS.items()
    }
    try:
        return SFTSettings(
            source="episodes",
            from_episodes=args.from_episodes,
            lora=lora,
            progress=not args.no_progress,
            **values,
        )
    except InvalidArgumentError as exc:
        message = str(exc)
        for flag, field in FLAG_FIELDS.items():
            message = message.replace(f"sft.{field} ", f"{flag} ")
        raise InvalidArgumentError(message) from None


def _model_path(model: str, env_ids: list[str], seed: int) -> str:
    """``tiny``: the embedded model built for the episodes' registered envs; else the path of a
    packaged model, a ``.gguf`` file's conversion, a folder or a hub id."""
    if model != "tiny":
        from llm_gym.policies.pretrained import resolve_model_path

        return str(resolve_model_path(model))
    from llm_gym.core.registry import registered_envs
    from llm_gym.models import build_tiny_model

    known = {entry.id for entry in registered_envs()}
    envs = sorted({e for e in env_ids if e in known})
    return str(build_tiny_model(seed=seed, **({"envs": envs} if envs else {})))


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Run ``llm-gym sft`` with ``argv`` (its own arguments); returns 0. Errors raise (``llm-gym``
    reports them as one line)."""
    from llm_gym.eval.episode_files import episodes_dataset
    from trainers.sft.train import sft_warm_start

    out = out or sys.stdout
    args = build_parser().parse_args(argv)
    settings = settings_from_args(args)  # every flag checked before the episodes are read
    dataset = episodes_dataset(args.from_episodes, min_reward=args.min_reward)
    print(f"training on {len(dataset)} episodes of {args.from_episodes}", file=out, flush=True)
    model = _model_path(args.model, sorted(set(dataset["env_id"])), args.seed)
    formats = set(dataset["action_format"]) - {""}
    action_format = args.action_format or (formats.pop() if len(formats) == 1 else "auto")
    path = sft_warm_start(
        model,
        args.output,
        dataset,
        settings,
        seed=args.seed,
        action_format=action_format,
        chat_template=args.chat_template,
    )
    print(path, file=out)  # the last line of stdout: scripts read the path from it
    return 0


if __name__ == "__main__":
    from llm_gym.cli import main as llm_gym_main

    sys.exit(llm_gym_main(["sft", *sys.argv[1:]]))
