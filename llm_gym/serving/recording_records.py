"""The records of the training endpoint (:mod:`llm_gym.serving.recording`): a call, an
episode, and how an episode id and a message are checked and compared."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from llm_gym.core.env import TruncationCause
from llm_gym.core.types import Message
from llm_gym.rollout.tokens import TokenSample
from llm_gym.serving.protocol import bad_request

__all__ = [
    "API_KEY_PREFIX",
    "EPISODE_FIELD",
    "EPISODE_HEADER",
    "MAX_EPISODE_ID",
    "MAX_OPEN_EPISODES",
    "RecordedCall",
    "RecordedEpisode",
    "check_episode_id",
    "message_shape",
]

EPISODE_HEADER = "x-episode-id"
"""The request header that names the episode."""
EPISODE_FIELD = "episode_id"
"""The body field that names the episode (``extra_body``)."""
API_KEY_PREFIX = "episode:"
"""An API key that starts with this names the episode after it."""
MAX_EPISODE_ID = 128
"""The longest episode id."""
MAX_OPEN_EPISODES = 4096
"""Episodes held at once; past it the least recently used one is dropped (``open_only``: a
new :meth:`Recorder.open` is refused instead)."""
_ID = re.compile(rf"[A-Za-z0-9._:-]{{1,{MAX_EPISODE_ID}}}")


def check_episode_id(value: object, where: str) -> str:
    """``value`` when it is a valid episode id, else a 400 that names ``where``.

    Example:
        >>> check_episode_id("step-3.group-1.0", "header")
        'step-3.group-1.0'
    """
    if not isinstance(value, str) or not _ID.fullmatch(value):
        shown = repr(value)[:60]
        raise bad_request(
            f"{where} must be an episode id of 1 to {MAX_EPISODE_ID} characters of A-Z a-z "
            f"0-9 . _ : - ; got {shown}",
            where,
        )
    return value


@dataclass
class RecordedCall:
    """One request of an episode, as the model served it."""

    prompt_ids: list[int]
    """The ids the model continued from."""
    completion_ids: list[int]
    """The ids it sampled, as sampled (the end-of-sequence one included)."""
    logprobs: list[float]
    """The logprob of each sampled id."""
    text: str
    """The sampled text (special tokens kept, the end-of-sequence one left out)."""
    message: Message
    """The assistant message the client got."""
    finish_reason: str
    """``"stop"``, ``"tool_calls"`` or ``"length"``."""
    messages: list[Message]
    """The request's conversation (as checked)."""
    policy_versions: list[int] | None = None
    """The weight version that sampled each id (None: the served weights are not versioned)."""


@dataclass
class RecordedEpisode:
    """An episode's calls and its token samples."""

    episode_id: str
    calls: list[RecordedCall] = field(default_factory=list)
    samples: list[TokenSample] = field(default_factory=list)
    """The training samples: one per stretch of calls that continued each other."""
    tool_specs: list[dict[str, Any]] = field(default_factory=list)
    """The tools the last call declared."""
    truncation: TruncationCause | None = None
    """Set when an episode rule ended it (``MAX_TURNS``, ``CONTEXT_OVERFLOW``)."""
    overflow_tokens: int = 0
    """The context a refused prompt would have needed (``CONTEXT_OVERFLOW``)."""
    refused: int = 0
    """Calls refused by the episode's rules."""

    @property
    def messages(self) -> list[Message]:
        """The last call's conversation and its reply (empty before any call)."""
        if not self.calls:
            return []
        last = self.calls[-1]
        return [*last.messages, last.message]


def _arguments(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value) if value.strip() else {}
        except ValueError:
            return value
    return value


def message_shape(message: Mapping[str, Any]) -> str:
    """What two copies of a message must share to be the same: role, content, tool calls by
    name and arguments, a tool result's call id (a client's copy may change ids of calls)."""
    calls = [
        (c.get("function", {}).get("name"), _arguments(c.get("function", {}).get("arguments")))
        for c in message.get("tool_calls") or ()
        if isinstance(c, Mapping)
    ]
    content = message.get("content") or ""
    content = content.strip() if isinstance(content, str) else content
    call_id = message.get("tool_call_id") if message.get("role") == "tool" else None
    return json.dumps([message.get("role"), content, calls, call_id], sort_keys=True, default=str)
