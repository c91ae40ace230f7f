"""The tiny model's tokenizer corpus: oracle transcripts of the registered environments.

:func:`default_corpus` plays each environment's oracle on its training tasks and renders every
episode in the Qwen2.5 (ChatML) layout the model will see at RL time, tool specs included.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from llm_gym.errors import InvalidArgumentError, did_you_mean
from llm_gym.models.tokenizer import EOS_TOKEN, IM_START

if TYPE_CHECKING:
    from llm_gym.core.types import Message, ToolSpec

__all__ = ["default_corpus", "selected_envs"]

# The Qwen2.5 template's tool section, so the corpus holds the prompts the model will really see.
_TOOLS_PREAMBLE = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_TOOLS_POSTAMBLE = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)

_GENERIC_TEXT = """\
The quick brown fox jumps over the lazy dog. THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG.
You are a helpful assistant. Answer the question, and think step by step when it helps.
What is the answer? The answer is 42. Which one is larger, the first or the second?
I will look that up, then use the calculator to add, subtract, multiply and divide.
The result of the calculation is a number; reply with only the number, or with a name.
Please call a tool when you need a fact. Tool calls return results, or an error message.
It is not possible to know the facts without looking them up: use the tools first.
This is a test of the system. There are many towns, and each town has a population.
0 1 2 3 4 5 6 7 8 9 10 100 1000 2024 3.14 -7 +8 12,345 0.5 1e6 50% $20 #3 (a + b) * c / d = e
a b c d e f g h i j k l m n o p q r s t u v w x y z
A B C D E F G H I J K L M N O P Q R S T U V W X Y Z
! " # $ % & ' ( ) * + , - . / : ; < = > ? @ [ \\ ] ^ _ ` { | } ~
{"name": "lookup", "arguments": {"key": "value"}} ["list", "of", "strings"] true false null
def main(): return x if x > 0 else -x  # code, paths/like/this.py and snake_case_names
"""


def _render_transcript(messages: Sequence[Message], tool_specs: Sequence[ToolSpec]) -> str:
    """One episode in the Qwen2.5 (ChatML) layout; assistant contents are their raw text."""
    parts: list[str] = []
    rest = list(messages)
    system = ""
    if rest and rest[0].get("role") == "system":
        system = str(rest.pop(0).get("content") or "")
    if tool_specs:
        tools = "".join("\n" + json.dumps(spec, ensure_ascii=False) for spec in tool_specs)
        parts.append(f"{IM_START}system\n{system}{_TOOLS_PREAMBLE}{tools}{_TOOLS_POSTAMBLE}")
        parts.append(f"{EOS_TOKEN}\n")
    elif system:
        parts.append(f"{IM_START}system\n{system}{EOS_TOKEN}\n")
    previous = None
    for i, message in enumerate(rest):
        role = message.get("role")
        content = str(message.get("content") or "")
        if role == "tool":
            if previous != "tool":
                parts.append(f"{IM_START}user")
            parts.append(f"\n<tool_response>\n{content}\n</tool_response>")
            if i + 1 == len(rest) or rest[i + 1].get("role") != "tool":
                parts.append(f"{EOS_TOKEN}\n")
        else:
            parts.append(f"{IM_START}{role}\n{content}{EOS_TOKEN}\n")
        previous = role
    return "".join(parts)


def _env_transcripts(entry: Any, max_tasks: int) -> list[str]:
    from llm_gym.policies import Generation, OraclePolicy, Policy
    from llm_gym.rollout import collect_groups

    class _Silent(Policy):  # for environments without an oracle: only the opening prompt
        async def act(self, requests: Sequence[Any]) -> list[Generation]:
            return [Generation(text="") for _ in requests]

    tasks = entry.tasks("train")[:max_tasks]
    if not tasks:
        return []
    oracle = entry.oracle()
    groups = collect_groups(
        entry.env_factory(),
        tasks,
        OraclePolicy() if oracle is not None else _Silent(),
        max_turns=entry.max_turns,
        action_format=entry.action_format,
        oracle=oracle,
    )
    texts = []
    for group in groups:
        for episode in group:
            if oracle is None:
                opening = episode.messages[: episode.num_opening_messages]
                texts.append(_render_transcript(opening, episode.tool_specs))
                continue
            # The assistant's raw text, as the environment's action format rendered the oracle's
            # message (HermesFormat().render_message for hermes environments).
            messages = list(episode.messages[: episode.num_opening_messages])
            for turn in episode.turns:
                messages.append({"role": "assistant", "content": turn.text})
                messages.extend(turn.env_messages)
            texts.append(_render_transcript(messages, episode.tool_specs))
    return texts


DEFAULT_CORPUS_ENVS = (
    "ToolUseGame-v0", "GuessNumber-v0", "Math-v0", "Wordle-v0", "Refund-v0", "SQL-v0", "Code-v0",
    "Maze-v0",
)  # fmt: skip
"""The environments the default tiny model's tokenizer is trained on: the core built-ins. Fixed,
so that registering more environments (reasoning-gym's, a user's, a test's) neither changes the
default model nor its cache key."""


def selected_envs(envs: Sequence[str] | None) -> list[Any]:
    """The registry entries of ``envs`` (None: :data:`DEFAULT_CORPUS_ENVS`), in registry order."""
    from llm_gym.core.registry import registered_envs

    entries = list(registered_envs())
    if envs is None:
        return [entry for entry in entries if entry.id in DEFAULT_CORPUS_ENVS]
    if isinstance(envs, str):
        envs = [envs]
    known = {entry.id: entry for entry in entries}
    unknown = [e for e in envs if e not in known]
    if unknown:
        hint = did_you_mean(unknown[0], known)
        raise InvalidArgumentError(
            f"envs must be registered environment ids, actual value: {unknown!r}.{hint} "
            f"Registered: {sorted(known)}."
        )
    if not envs:
        raise InvalidArgumentError("envs must name at least one environment (or be None: all).")
    wanted = set(envs)
    return [entry for entry in entries if entry.id in wanted]


def default_corpus(max_tasks_per_env: int = 400, envs: Sequence[str] | None = None) -> list[str]:
    """The text the tokenizer is trained on: oracle transcripts of the registered environments.

    For each environment of :func:`llm_gym.gym.registered_envs` (or of ``envs``), the oracle plays
    up to ``max_tasks_per_env`` training tasks (through :func:`llm_gym.rollout.collect_groups` with
    an :class:`~llm_gym.policies.OraclePolicy`); each episode is rendered in the Qwen2.5 chat layout
    (system prompt, the ``# Tools`` section with the tool specs as JSON, the user prompt, the
    assistant's raw text in the environment's action format, the tool results). An environment
    without an oracle contributes its opening prompts. A small fixed English/ASCII/digits text comes
    first. Special and added tokens in the text are never split into merges (see
    :func:`build_tokenizer`).

    Args:
        max_tasks_per_env: Training tasks played per environment (the first ones of the split).
        envs: The environment ids (None: the eight core built-ins, :data:`DEFAULT_CORPUS_ENVS`).
            A model trained on one environment gets a tokenizer fitted to its text: with all
            eight environments a 1,024-token vocabulary no longer holds ToolUseGame's town
            names as single tokens.

    Returns:
        The corpus, one transcript per string.
    """
    import warnings

    corpus = [_GENERIC_TEXT] * 4
    for entry in selected_envs(envs):
        try:
            corpus.extend(_env_transcripts(entry, max_tasks_per_env))
        except Exception as exc:  # one broken environment must not block the default model
            warnings.warn(
                f"default_corpus: skipping {entry.id}: {exc!r}", RuntimeWarning, stacklevel=2
            )
    return corpus
