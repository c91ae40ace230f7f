"""Trajectories as data: episodes written as JSONL, read back (as hostile input), as a dataset.

One line per episode, one JSON object each (:func:`episode_record`):

* ``messages``: the conversation as the model saw and wrote it: the opening messages, then per
  assistant turn its raw text (``content``, as sampled: tool calls in the action format's text)
  and the environment's replies (``tool`` messages keep ``tool_call_id`` and ``name``);
  ``num_opening_messages`` of them are the prompt;
* ``tool_specs``, ``action_format``;
* ``reward`` (the environment's), ``terminated``, ``truncated``, ``truncation_cause`` (a
  :class:`~llm_gym.core.env.TruncationCause` value or null), ``metrics``, ``error``;
* ``turns``: per assistant turn its parse (``parse_kind``, the structured ``tool_calls``,
  ``parse_error``), ``finish_reason``, its own ``reward`` (per-turn credit), and where a model
  sampled it ``token_ids``, ``logprobs`` and ``policy_versions``;
* ``samples``: the token sequences RL trains on, where a tokenizer built them: ``prompt_ids``,
  ``completion_ids``, ``env_mask`` (1 = sampled by the policy), ``logprobs``, ``turn_index``,
  ``policy_versions``;
* provenance: ``env_id``, ``env_version``, ``policy`` (the policy's description),
  ``policy_version`` (the trainer's step whose weights sampled it; null outside training),
  ``task_id``, ``group``, ``index``, ``format`` (:data:`EPISODE_FORMAT`).

``datasets.load_dataset("json", data_files=PATH)`` reads a file as it is; :func:`episodes_dataset`
gives the conversational rows TRL's SFT reads (``messages``, ``tools`` as JSON text), filtered
by reward. :func:`read_episodes` treats the file as hostile input: a bounded regular file
(:mod:`llm_gym.core.input_files`), JSON nested at most
:data:`~llm_gym.core.input_files.MAX_JSON_DEPTH` deep, every field checked; a bad line is an
:class:`~llm_gym.errors.InvalidArgumentError` naming ``path:line`` and the field.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llm_gym.core.env import TruncationCause
from llm_gym.core.input_files import InputLimit, input_lines, loads_json
from llm_gym.errors import InvalidArgumentError
from llm_gym.eval.files import write_atomic
from llm_gym.rollout.episode import Episode

if TYPE_CHECKING:
    from datasets import Dataset

__all__ = [
    "EPISODE_FORMAT",
    "MAX_EPISODES_FILE_BYTES",
    "check_record",
    "episode_record",
    "episodes_dataset",
    "read_episodes",
    "sft_rows",
    "write_episodes",
]

EPISODE_FORMAT = "llm_gym.episode/1"
"""The ``format`` of a record :func:`episode_record` writes (a record without one is read as
this format; another is refused)."""

MAX_EPISODES_FILE_BYTES = 4 << 30
"""The most bytes of episode files read at once (one file, or a folder's files together), read a
line at a time: a device, a FIFO or an unrelated huge file is refused rather than read until
memory runs out."""

_LIMIT = InputLimit(
    "episodes file",
    MAX_EPISODES_FILE_BYTES,
    "llm_gym.eval.episode_files.MAX_EPISODES_FILE_BYTES",
    "a JSONL file (or a folder of them)",
)


def _json_ready(value: Any) -> Any:
    """``value`` as strict JSON holds it: a non-finite float is null, a tuple a list, any other
    object its text."""
    if isinstance(value, dict):
        return {str(k): _json_ready(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_ready(v) for v in value]
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, bool | int | str):
        return value
    return str(value)


def episode_record(
    episode: Episode,
    *,
    env_id: str | None,
    env_version: str | None,
    policy: dict[str, Any] | None = None,
    policy_version: int | None = None,
) -> dict[str, Any]:
    """The JSON record of one finished episode (see the module docstring for its fields)."""
    cause = episode.truncation_cause
    record = {
        "format": EPISODE_FORMAT,
        "env_id": env_id,
        "env_version": env_version,
        "policy": dict(policy or {}),
        "policy_version": policy_version,
        "task_id": episode.task.id,
        "group": episode.group,
        "index": episode.index,
        "messages": episode.transcript(),
        "num_opening_messages": episode.num_opening_messages,
        "tool_specs": list(episode.tool_specs),
        "action_format": episode.action_format.name,
        "reward": float(episode.reward),
        "terminated": episode.terminated,
        "truncated": episode.truncated,
        "truncation_cause": None if cause is None else str(cause.value),
        "metrics": dict(episode.metrics),
        "error": episode.error,
        "turns": [
            {
                "parse_kind": str(turn.parse_kind.value),
                "tool_calls": list(turn.message.get("tool_calls") or []),
                "parse_error": turn.parse_error,
                "finish_reason": turn.finish_reason,
                "reward": turn.reward,
                "token_ids": turn.token_ids,
                "logprobs": turn.logprobs,
                "policy_versions": turn.policy_versions,
            }
            for turn in episode.turns
        ],
        "samples": [
            {
                "prompt_ids": s.prompt_ids,
                "completion_ids": s.completion_ids,
                "env_mask": s.env_mask,
                "logprobs": s.logprobs,
                "turn_index": s.turn_index,
                "policy_versions": s.policy_versions,
            }
            for s in episode.samples
        ],
        "prompt_tokens": episode.prompt_tokens,
        "completion_tokens": episode.completion_tokens,
        "wall_time_s": episode.wall_time_s,
    }
    return _json_ready(record)


def write_episodes(path: str | Path, records: Iterable[dict[str, Any]]) -> Path:
    """Write ``records`` (:func:`episode_record`) to ``path`` as JSONL, one per line, whole or
    not at all (:func:`~llm_gym.eval.files.write_atomic`); returns the file written."""
    lines = [json.dumps(r, ensure_ascii=False, allow_nan=False) + "\n" for r in records]
    return write_atomic(path, "".join(lines))


def _fail(where: str, reason: str) -> InvalidArgumentError:
    return InvalidArgumentError(
        f"{where}: not an episode record ({reason}); each line is one JSON object as "
        "`llm-gym eval --save-episodes` or the trainer's save_episodes writes it."
    )


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _int_list(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    )


def _check_messages(messages: Any, where: str) -> None:
    if not isinstance(messages, list):
        raise _fail(where, f"'messages' must be a list of messages, got {type(messages).__name__}")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise _fail(where, f"messages[{i}] must be an object with a string 'role'")
        if not isinstance(message.get("content"), str | None):
            raise _fail(where, f"messages[{i}].content must be a string or null")


def _check_samples(samples: Any, where: str) -> None:
    if not isinstance(samples, list) or not all(isinstance(s, dict) for s in samples):
        raise _fail(where, "'samples' must be a list of objects")
    for i, sample in enumerate(samples):
        ids = sample.get("completion_ids", [])
        if not _int_list(sample.get("prompt_ids", [])) or not _int_list(ids):
            raise _fail(where, f"samples[{i}]: prompt_ids and completion_ids must be integers")
        mask = sample.get("env_mask", [])
        if not _int_list(mask) or len(mask) != len(ids) or set(mask) - {0, 1}:
            raise _fail(where, f"samples[{i}].env_mask must be 0s and 1s, one per completion id")
        logprobs = sample.get("logprobs", [])
        if not isinstance(logprobs, list) or not all(v is None or _is_number(v) for v in logprobs):
            raise _fail(where, f"samples[{i}].logprobs must be finite numbers")


def check_record(data: Any, where: str) -> dict[str, Any]:
    """``data`` (one parsed line) checked as an episode record; returns it.

    Needs ``messages`` (objects with a string ``role``, ``content`` a string or null) and a
    finite ``reward``; the other fields, where present, must have their written types
    (``tool_specs`` a list of objects, ``metrics`` an object, ``truncation_cause`` a
    :class:`~llm_gym.core.env.TruncationCause` value, ``samples`` token lists with a 0/1
    ``env_mask`` per completion id, ...).

    Raises:
        InvalidArgumentError: the field that is wrong, named with ``where`` (``path:line``).
    """
    if not isinstance(data, dict):
        raise _fail(where, f"a JSON object is expected, got a JSON {type(data).__name__}")
    kind = data.get("format", EPISODE_FORMAT)
    if kind != EPISODE_FORMAT:
        raise _fail(where, f"format {kind!r:.60} is not {EPISODE_FORMAT!r}")
    if "messages" not in data or "reward" not in data:
        raise _fail(where, "it needs 'messages' and 'reward'")
    _check_messages(data["messages"], where)
    if not _is_number(data["reward"]):
        raise _fail(where, f"'reward' must be a finite number, got {data['reward']!r:.60}")
    specs = data.get("tool_specs", [])
    if not isinstance(specs, list) or not all(isinstance(s, dict) for s in specs):
        raise _fail(where, "'tool_specs' must be a list of objects")
    if not isinstance(data.get("metrics", {}), dict):
        raise _fail(where, "'metrics' must be an object")
    cause = data.get("truncation_cause")
    if cause is not None and cause not in {c.value for c in TruncationCause}:
        raise _fail(
            where,
            f"truncation_cause {cause!r:.60} is not one of {[c.value for c in TruncationCause]}",
        )
    if not isinstance(data.get("error"), str | None):
        raise _fail(where, "'error' must be a string or null")
    opening = data.get("num_opening_messages", 0)
    if not isinstance(opening, int) or isinstance(opening, bool):
        raise _fail(where, "'num_opening_messages' must be an integer")
    if not 0 <= opening <= len(data["messages"]):
        raise _fail(where, f"num_opening_messages {opening} is outside [0, len(messages)]")
    if not isinstance(data.get("turns", []), list):
        raise _fail(where, "'turns' must be a list")
    _check_samples(data.get("samples", []), where)
    return data


def _files(path: Path) -> list[Path]:
    """``path``, or the ``*.jsonl`` files of a folder in name order."""
    if not path.is_dir():
        return [path]
    files = sorted(p for p in path.iterdir() if p.suffix == ".jsonl")
    if not files:
        raise InvalidArgumentError(
            f"{str(path)!r} is a folder without .jsonl files; give an episodes file or the "
            "folder the trainer's save_episodes writes."
        )
    return files


def read_episodes(path: str | Path) -> list[dict[str, Any]]:
    """The episode records of a JSONL file, or of every ``*.jsonl`` file of a folder (in name
    order: the trainer's ``step-000001.jsonl``, ...), each checked (:func:`check_record`).
    Blank lines are skipped.

    Raises:
        InvalidArgumentError: not a regular file or a folder of them, past
            :data:`MAX_EPISODES_FILE_BYTES`, or a line that is not UTF-8 JSON or not an episode
            record (named ``path:line``).
    """
    records: list[dict[str, Any]] = []
    read = 0
    for file in _files(Path(path)):
        for number, raw in input_lines(file, _LIMIT):
            read += len(raw)
            if read > _LIMIT.max_bytes:
                raise _LIMIT.too_large(path)
            if not raw.strip():
                continue
            where = f"{file}:{number}"
            try:
                data = loads_json(raw)
            except InvalidArgumentError as exc:
                raise _fail(where, str(exc).rstrip(".")) from None
            records.append(check_record(data, where))
    return records


def _sft_message(message: dict[str, Any]) -> dict[str, Any]:
    """Role and content as strings, and a tool message's ``name``: one Arrow column holds them."""
    role = str(message["role"])
    out = {"role": role, "content": str(message.get("content") or "")}
    if role == "tool" and message.get("name") is not None:
        out["name"] = str(message["name"])
    return out


def sft_rows(
    records: Sequence[dict[str, Any]], *, min_reward: float | None = None
) -> list[dict[str, Any]]:
    """The conversational rows of ``records`` that can train: those without an ``error`` (an
    episode the environment or the infrastructure broke is never a demonstration), with an
    assistant message, and with ``reward >= min_reward`` (None: every reward).

    Each row: ``messages`` (role, content, a tool message's name), ``tools`` (the tool specs as
    JSON text, as :mod:`trainers.sft.data` writes them), ``reward``, ``task_id``, ``env_id``,
    ``action_format`` (the format its tool calls are written in; ``""`` when not recorded).
    """
    if min_reward is not None and not _is_number(min_reward):
        raise InvalidArgumentError(
            f"min_reward must be a finite number (or None: every reward), actual: {min_reward!r}."
        )
    rows = []
    for record in records:
        if record.get("error") or (min_reward is not None and record["reward"] < min_reward):
            continue
        if not any(m["role"] == "assistant" for m in record["messages"]):
            continue
        rows.append(
            {
                "messages": [_sft_message(m) for m in record["messages"]],
                "tools": json.dumps(record.get("tool_specs", []), ensure_ascii=False),
                "reward": float(record["reward"]),
                "task_id": str(record.get("task_id") or ""),
                "env_id": str(record.get("env_id") or ""),
                "action_format": str(record.get("action_format") or ""),
            }
        )
    return rows


def episodes_dataset(
    source: str | Path | Sequence[dict[str, Any]], *, min_reward: float | None = None
) -> Dataset:
    """The episodes of ``source`` (a path for :func:`read_episodes`, or records) as a
    ``datasets.Dataset`` of conversational rows (:func:`sft_rows`): what
    :func:`trainers.sft.train.sft_warm_start` trains on, rejection-sampling fine-tuning with
    ``min_reward``.

    Raises:
        InvalidArgumentError: what :func:`read_episodes` raises, or no row left (the error
            counts the records and says what dropped them).
    """
    from datasets import Dataset

    records = read_episodes(source) if isinstance(source, str | Path) else list(source)
    rows = sft_rows(records, min_reward=min_reward)
    if not rows:
        kept = "" if min_reward is None else f" reached min_reward={min_reward:g} and"
        raise InvalidArgumentError(
            f"none of the {len(records)} episodes{kept} can train (an episode with an error or "
            "without an assistant message is dropped); lower min_reward or collect more."
        )
    return Dataset.from_list(rows)
