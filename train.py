"""Train an agent on an llm_gym environment: ``accelerate launch train.py --config CONFIG``.

Thin on purpose: read the config (YAML, or TOML for a ``.toml`` path), run
:func:`trainers.pipeline.run.run_pipeline`. Override single keys with ``--set grpo.num_steps=2
sft.time_budget_s=60`` (document 002's ``[train]`` names too: ``train.group_size=8``). A
``"module:attr"`` reference in the config (``sft.oracle``) may name llm_gym's and trainers'
modules; ``--trust-module my_pkg`` lets it name ``my_pkg``'s too (see
:mod:`llm_gym.core.references`). ``--dtype bfloat16`` (or ``float32``, ``auto``) sets
``grpo.dtype``, whatever the config and ``--set`` say.
"""

from __future__ import annotations

import argparse
from typing import Any


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="a YAML or TOML (.toml) file from configs/")
    parser.add_argument(
        "--set",
        nargs="*",
        action="extend",  # --set a=1 --set b=2 keeps both (the default "store" kept the last)
        default=[],
        metavar="KEY=VALUE",
        help="override config keys, e.g. grpo.num_steps=2 (values are parsed as YAML)",
    )
    parser.add_argument(
        "--dtype",
        choices=["auto", "float32", "bfloat16"],
        help="precision of sampling and training, overriding the config's grpo.dtype (auto: "
        "bf16 where a start-up probe measures it faster; see docs/guides/training.md)",
    )
    parser.add_argument(
        "--trust-module",
        action="append",
        default=[],
        metavar="PREFIX",
        help="let the config's 'module:attr' references name modules under PREFIX (my_pkg), "
        "beside llm_gym and trainers; repeatable",
    )
    return parser.parse_args(argv)


def trust(prefixes: list[str]) -> None:
    """Trust ``prefixes`` here and in the processes this one starts (the environment variable
    :data:`~llm_gym.core.references.TRUSTED_MODULES_ENV` carries them)."""
    import os

    from llm_gym.core.references import TRUSTED_MODULES_ENV, trust_modules

    trust_modules(*prefixes)  # checks each prefix first
    if prefixes:
        inherited = [p for p in os.environ.get(TRUSTED_MODULES_ENV, "").split(",") if p.strip()]
        os.environ[TRUSTED_MODULES_ENV] = ",".join([*inherited, *prefixes])


def show_trainer_log() -> None:
    """Print the trainers' start-up lines (their ``logging`` INFO records: the precision the
    run chose and why) on stderr, once per process."""
    import logging

    log = logging.getLogger("trainers")
    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("   %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)


def main(argv: list[str] | None = None) -> dict:
    """Read the config, check it and run the pipeline; the pipeline's results.

    An error ends the process with one line on stderr
    (:func:`llm_gym.command_errors.report_failure`): exit code 2 for a mistake in the config or
    on the command line (the line names it), 1 for an unexpected error (the line names the log
    file with its traceback, under the config's ``output_dir`` once it is read).
    """
    from llm_gym.command_errors import report_failure

    args = parse_args(argv)
    show_trainer_log()
    config = None
    try:
        trust(args.trust_module)
        config = _checked_config(args)
        from trainers.pipeline.run import run_pipeline

        return run_pipeline(config)
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    except Exception as exc:
        folder = getattr(config, "output_dir", None)
        raise SystemExit(report_failure("train.py", exc, log_folder=folder)) from None


def _checked_config(args: argparse.Namespace) -> Any:
    """The config of ``args`` with its --set values, checked as far as it can be before any
    model work (the env, its tasks, the GRPO fields)."""
    from llm_gym.errors import InvalidArgumentError, LlmGymError
    from trainers.pipeline.config import load_config, yaml_load
    from trainers.pipeline.run import check_pipeline

    overrides = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not all(key.split(".")):
            raise InvalidArgumentError(
                f"--set expects KEY=VALUE with KEY a dotted name (grpo.num_steps=2), got "
                f"{item!r:.80}."
            )
        try:
            overrides[key] = yaml_load(value)
        except LlmGymError as exc:
            raise InvalidArgumentError(f"--set {key}: {exc}") from None
    if args.dtype is not None:  # after --set: the flag wins
        overrides["grpo.dtype"] = args.dtype
    config = load_config(args.config, overrides)
    check_pipeline(config)
    return config


if __name__ == "__main__":
    main()
