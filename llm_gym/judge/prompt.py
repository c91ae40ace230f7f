"""What the judge is asked: the transcripts as text, and the chat messages of one request.

**An episode** (``mode="episode"``) is one request: :data:`EPISODE_SYSTEM`, then a user message
with the rubric (one line per criterion: name, kind, weight, question), the conversation and an
example verdict. **A group** (``mode="group"``, as ART's RULER judges a group) is one request for
all the episodes of one task: :data:`GROUP_SYSTEM`, then the rubric, the task once (the opening
messages the episodes share) and each attempt's continuation, numbered from 1; the judge answers
every criterion for every attempt side by side, so the attempts are ranked against each other.

Transcripts (:func:`render_messages`) are plain text, one block per message: ``[user]``,
``[assistant]``, ``[assistant calls NAME] ARGUMENTS``, ``[tool NAME]``; system messages are left
out (the tool specs and instructions the policy saw are not the judge's business); text that
is not valid UTF-8 has its surrogates replaced (U+FFFD). A transcript
over ``max_chars`` keeps its first quarter and its last three quarters of that budget, with the
number of characters left out written between them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from llm_gym.core.text import clean_text
from llm_gym.judge.rubric import Rubric

__all__ = [
    "EPISODE_SYSTEM",
    "GROUP_SYSTEM",
    "episode_request",
    "group_request",
    "render_messages",
    "shorten",
]

EPISODE_SYSTEM = (
    "You are a careful, impartial judge of an AI assistant's conversation. Read the "
    "conversation, then answer every criterion of the rubric about the assistant's part. Reply "
    "with one JSON object and nothing else: one key per criterion name; a yes/no criterion "
    "takes true or false, a 0-10 criterion a whole number from 0 (worst) to 10 (best)."
)
"""The system message of an episode's request."""
GROUP_SYSTEM = (
    "You are a careful, impartial judge of an AI assistant. Several attempts at the same task "
    "follow, numbered from 1. Compare them side by side and answer every criterion of the "
    "rubric for each attempt, so that better attempts get better answers. Reply with one JSON "
    'object and nothing else: keys "1", "2", ... (one per attempt), each an object with one key '
    "per criterion name; a yes/no criterion takes true or false, a 0-10 criterion a whole "
    "number from 0 (worst) to 10 (best)."
)
"""The system message of a group's request."""

Messages = Sequence[Mapping[str, Any]]


def shorten(text: str, max_chars: int) -> str:
    """``text`` within ``max_chars`` (plus the marker): its head and tail, the middle left out.

    Example:
        >>> shorten("abcdefghijklmnopqrstuvwxyz", 8)
        'ab\\n[... 18 characters left out ...]\\nuvwxyz'
    """
    if len(text) <= max_chars:
        return text
    head = max_chars // 4
    tail = max_chars - head
    left_out = len(text) - head - tail
    return f"{text[:head]}\n[... {left_out} characters left out ...]\n{text[len(text) - tail :]}"


def _content(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping))
    return "" if content is None else str(content)


def render_messages(messages: Messages) -> str:
    """The transcript of ``messages`` as text (see the module docstring).

    Example:
        >>> print(render_messages([{"role": "system", "content": "rules"},
        ...                        {"role": "user", "content": "Refund me."},
        ...                        {"role": "assistant", "content": "Done."}]))
        [user] Refund me.
        [assistant] Done.
    """
    blocks = []
    for message in messages:
        if not isinstance(message, Mapping):
            blocks.append(f"[message] {message!s:.2000}")
            continue
        role = str(message.get("role", "?"))
        if role == "system":
            continue
        text = _content(message)
        if role == "tool":
            blocks.append(f"[tool {message.get('name') or ''}]".replace(" ]", "]") + f" {text}")
            continue
        if text.strip() or not message.get("tool_calls"):
            blocks.append(f"[{role}] {text}")
        for call in message.get("tool_calls") or []:
            function = call.get("function", {}) if isinstance(call, Mapping) else {}
            function = function if isinstance(function, Mapping) else {}
            blocks.append(
                f"[{role} calls {function.get('name', '?')}] {function.get('arguments', '')}"
            )
    return clean_text("\n".join(blocks))


def _rubric_text(rubric: Rubric) -> str:
    return "Rubric:\n" + "\n".join(c.describe() for c in rubric.criteria)


def episode_request(
    rubric: Rubric, opening: Messages, completion: Messages, max_chars: int
) -> list[dict[str, str]]:
    """The chat messages asking the judge about one episode (its opening and the rest)."""
    transcript = shorten(render_messages([*opening, *completion]), max_chars)
    user = (
        f"{_rubric_text(rubric)}\n\nConversation:\n{transcript}\n\n"
        f"Reply with the JSON verdict only, for example: {rubric.example()}"
    )
    return [{"role": "system", "content": EPISODE_SYSTEM}, {"role": "user", "content": user}]


def group_request(
    rubric: Rubric, opening: Messages, completions: Sequence[Messages], max_chars: int
) -> list[dict[str, str]]:
    """The chat messages asking the judge about a group: the shared opening once, then each
    attempt's continuation (each within ``max_chars``)."""
    task = shorten(render_messages(opening), max_chars)
    attempts = "\n\n".join(
        f"Attempt {i + 1}:\n{shorten(render_messages(c), max_chars)}"
        for i, c in enumerate(completions)
    )
    example = "{" + ", ".join(f'"{i + 1}": {rubric.example()}' for i in range(2)) + ", ...}"
    user = (
        f"{_rubric_text(rubric)}\n\nTask:\n{task}\n\n{attempts}\n\n"
        f"Reply with the JSON verdicts of all {len(completions)} attempts only, for example: "
        f"{example}"
    )
    return [{"role": "system", "content": GROUP_SYSTEM}, {"role": "user", "content": user}]
