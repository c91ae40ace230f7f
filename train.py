"""Train an agent on an llm_gym environment: ``accelerate launch train.py --config CONFIG``.

Thin on purpose: read the config, run :func:`trainers.pipeline.run_pipeline`. Override single
keys with ``--set grpo.num_steps=2 sft.time_budget_s=60``.
"""

from __future__ import annotations

import argparse
import sys


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="a YAML file from configs/")
    parser.add_argument(
        "--set",
        nargs="*",
        action="extend",  # --set a=1 --set b=2 keeps both (the default "store" kept the last)
        default=[],
        metavar="KEY=VALUE",
        help="override config keys, e.g. grpo.num_steps=2 (values are parsed as YAML)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    from llm_gym.errors import InvalidArgumentError, LlmGymError
    from trainers.pipeline import check_pipeline, run_pipeline
    from trainers.pipeline_config import load_config, yaml_load

    args = parse_args(argv)
    overrides = {}
    # A mistake in the config or on the command line is one clear line, not a traceback: the
    # file, the --set values, and what the pipeline checks before any model work (the env, its
    # tasks, the GRPO fields).
    try:
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
        config = load_config(args.config, overrides)
        check_pipeline(config)
    except LlmGymError as exc:
        sys.exit(f"train.py: {exc}")
    return run_pipeline(config)


if __name__ == "__main__":
    main()
