"""Episodes as JSON lines: what the run report's episode browser shows.

:func:`episode_record` turns a finished :class:`~llm_gym.rollout.episode.Episode` into a plain
record: the task, how it ended, each assistant turn with what the environment answered and the
turn's own reward, and, for token-in/token-out policies with a ``decode`` function, the trained
tokens and the context tokens of each training sample told apart (its ``env_mask``: spans of
``[text, 1]`` sampled by the policy and ``[text, 0]`` from the environment).
:func:`write_episodes` writes them one per line.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from llm_gym.eval.files import write_atomic
from llm_gym.eval.metrics import is_success

__all__ = ["MAX_TEXT_CHARS", "episode_record", "mask_spans", "write_episodes"]

MAX_TEXT_CHARS = 4000
"""The most characters of one text a record keeps (the rest is cut, with a marker)."""

Decode = Callable[[list[int]], str]
"""Token ids to text (a tokenizer's ``decode``)."""


def _text(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    if len(text) <= MAX_TEXT_CHARS:
        return text
    return text[:MAX_TEXT_CHARS] + f" [... {len(text) - MAX_TEXT_CHARS} more characters]"


def mask_spans(token_ids: Sequence[int], mask: Sequence[int], decode: Decode) -> list[list[Any]]:
    """``token_ids`` as runs of equal ``mask``: ``[[text, mask], ...]`` in order.

    Example:
        >>> mask_spans([1, 2, 3, 4], [1, 1, 0, 1], lambda ids: "".join(map(str, ids)))
        [['12', 1], ['3', 0], ['4', 1]]
    """
    spans: list[list[Any]] = []
    start = 0
    for i in range(1, len(token_ids) + 1):
        if i == len(token_ids) or mask[i] != mask[start]:
            spans.append([decode(list(token_ids[start:i])), int(mask[start])])
            start = i
    return spans


def episode_record(episode: Any, decode: Decode | None = None) -> dict[str, Any]:
    """``episode`` as a JSON-ready record (texts longer than :data:`MAX_TEXT_CHARS` cut)."""
    task = episode.task
    metadata = getattr(task, "metadata", None) or {}
    cause = episode.truncation_cause
    turns = []
    for turn in episode.turns:
        turns.append(
            {
                "text": _text(turn.text),
                "parse": str(getattr(turn.parse_kind, "value", turn.parse_kind)),
                "tool_calls": turn.tool_calls,
                "finish_reason": turn.finish_reason,
                "reward": turn.reward,
                "env": [
                    {"role": str(m.get("role", "")), "content": _text(m.get("content") or "")}
                    for m in turn.env_messages
                ],
            }
        )
    samples = []
    if decode is not None:
        for sample in episode.samples:
            spans = mask_spans(sample.completion_ids, sample.env_mask, decode)
            samples.append([[_text(text), mask] for text, mask in spans])
    opening = episode.messages[: episode.num_opening_messages]
    return {
        "task_id": task.id,
        "kind": metadata.get("type") if isinstance(metadata.get("type"), str) else None,
        "prompt": [
            {"role": str(m.get("role", "")), "content": _text(m.get("content") or "")}
            for m in opening
        ],
        "target": None if task.target is None else _text(task.target),
        "reward": float(episode.reward),
        "success": bool(is_success(episode)),
        "ended": "terminated" if cause is None else str(cause.value),
        "turns": turns,
        "samples": samples,
    }


def write_episodes(
    path: str | Path,
    episodes: Sequence[Any],
    decode: Decode | None = None,
    limit: int | None = None,
) -> Path:
    """Write the first ``limit`` (None: all) of ``episodes`` as JSON lines to ``path``."""
    chosen = list(episodes)[:limit] if limit is not None else list(episodes)
    lines = [json.dumps(episode_record(e, decode), default=str) for e in chosen]
    path = Path(path)
    write_atomic(path, "".join(line + "\n" for line in lines))
    return path
