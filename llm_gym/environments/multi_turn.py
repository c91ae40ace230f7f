"""``EnvironmentMultiTurn``: document 002's multi-turn environment base class.

Subclass it and implement the episode hooks (``start_episode``, ``max_episode_turns``,
``step_episode``, ``score_episode``; ``score_episodes`` has a concurrent default). The hooks are
plain synchronous methods, as in the document; ``async def`` overrides work too when the
environment runs through llm_gym's loop (:class:`~llm_gym.environments.MultiTurnEnvAdapter`).

The environment object is shared by every concurrent rollout: keep per-episode state in the
transcript (see :mod:`llm_gym.environments.replay`), not in attributes.
"""

from __future__ import annotations

import asyncio
import inspect
import re
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar

from llm_gym.environments.records import (
    ChatMessage,
    EnvironmentEpisode,
    EnvironmentStepResult,
    RewardResult,
    TaskExample,
)
from llm_gym.errors import InvalidArgumentError

__all__ = [
    "EnvironmentMultiTurn",
    "map_limited",
    "opening_messages",
    "parse_chatml",
    "sft_messages",
    "sft_target_messages",
]


class EnvironmentMultiTurn:
    """A multi-turn environment in document 002's style.

    The loop that drives it (document 002's "episode loop", which llm_gym runs through
    :class:`~llm_gym.environments.MultiTurnEnvAdapter`)::

        messages = env.start_episode(example, prompt_text)
        for _ in range(env.max_episode_turns(example)):
            action = policy.sample(messages)
            messages.append({"role": "assistant", "content": action})
            result = env.step_episode(example, messages, action)
            messages.extend(result.messages)
            if result.done:
                break
        reward = env.score_episode(example, EnvironmentEpisode(tuple(messages), response_text))
    """

    max_score_concurrency: ClassVar[int] = 8
    """How many ``score_episode`` calls the default ``score_episodes`` runs at once."""

    def start_episode(self, example: TaskExample, prompt_text: str) -> list[ChatMessage]:
        """The opening messages. Default: a system message with ``prompt_text`` (when it is not
        empty) and a user message with ``example.input``."""
        return opening_messages(example, prompt_text)

    def max_episode_turns(self, example: TaskExample) -> int:
        """How many assistant actions may be sampled before the episode is forced to end."""
        raise NotImplementedError(
            f"{type(self).__qualname__} must implement max_episode_turns(example) -> int."
        )

    def step_episode(
        self,
        example: TaskExample,
        messages: list[ChatMessage],
        assistant_response: str,
    ) -> EnvironmentStepResult:
        """React to the action ``assistant_response`` (already ``messages[-1]``)."""
        raise NotImplementedError(
            f"{type(self).__qualname__} must implement step_episode(example, messages, "
            "assistant_response) -> EnvironmentStepResult."
        )

    def score_episode(self, example: TaskExample, episode: EnvironmentEpisode) -> RewardResult:
        """Grade one finished trajectory."""
        raise NotImplementedError(
            f"{type(self).__qualname__} must implement score_episode(example, episode) -> "
            "RewardResult (or override score_episodes)."
        )

    def score_episodes(
        self,
        example: TaskExample,
        episodes: list[EnvironmentEpisode],
    ) -> list[RewardResult]:
        """Grade a group of trajectories of one example. Default: ``score_episode`` for each,
        up to :attr:`max_score_concurrency` at a time (in worker threads), results in order."""
        return map_limited(self.score_episode, example, episodes, self.max_score_concurrency)

    def sft_completion(self, example: TaskExample) -> list[ChatMessage]:
        """The SFT target messages of ``example`` (SFT never runs ``step_episode``).

        Default, from ``example.output``: a list of message dicts (or one dict) is the target
        transcript; a ChatML string (``<|im_start|>role ... <|im_end|>`` blocks) is parsed into
        messages; any other string or scalar is one assistant message. A ChatML-looking string
        that does not parse stays one assistant message, with a warning.
        """
        return sft_target_messages(example)


def opening_messages(example: TaskExample, prompt_text: str) -> list[ChatMessage]:
    """The default opening: a system message with ``prompt_text`` (when it is not empty) and a
    user message with ``example.input``.

    Example:
        >>> opening_messages(TaskExample(input="2 + 2?"), "")
        [{'role': 'user', 'content': '2 + 2?'}]
    """
    messages: list[ChatMessage] = []
    if prompt_text.strip():
        messages.append({"role": "system", "content": prompt_text.strip()})
    messages.append({"role": "user", "content": example.input})
    return messages


def map_limited(
    hook: Callable[[TaskExample, Any], Any],
    example: TaskExample,
    items: Iterable[Any],
    max_concurrency: int,
) -> list[Any]:
    """``[hook(example, item) for item in items]``, up to ``max_concurrency`` calls at a time:
    synchronous hooks in worker threads, ``async def`` ones on an event loop; results in order.
    (The default batch scorers, ``score_episodes`` and ``score_responses``, are this.)"""
    items = list(items)
    if inspect.iscoroutinefunction(hook):
        from llm_gym.aio import run_sync

        return run_sync(_gather_limited(hook, example, items, max_concurrency))
    workers = min(max(1, int(max_concurrency)), len(items))
    if workers <= 1:
        return [hook(example, item) for item in items]
    name = getattr(hook, "__name__", "hook")
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name) as pool:
        return list(pool.map(lambda item: hook(example, item), items))


def sft_target_messages(example: TaskExample) -> list[ChatMessage]:
    """The default ``sft_completion``: the SFT target messages of ``example.output`` (see
    :meth:`EnvironmentMultiTurn.sft_completion`)."""
    output = example.output
    if output is None:
        raise InvalidArgumentError(
            f"Example {example.id or example.input[:40]!r} has no output to train on; give it "
            "an output (a reply or a target transcript) or override sft_completion."
        )
    if isinstance(output, Mapping):
        return [_check_message(output, 0)]
    if isinstance(output, Sequence) and not isinstance(output, str | bytes):
        return [_check_message(m, i) for i, m in enumerate(output)]
    text = output if isinstance(output, str) else str(output)
    if "<|im_start|>" in text:
        parsed = parse_chatml(text)
        if parsed is not None:
            return parsed
        warnings.warn(
            "sft_completion: example.output looks like a ChatML transcript but does not "
            "parse; it is used as one assistant message (observation masking unproven).",
            stacklevel=3,
        )
    return [{"role": "assistant", "content": text}]


async def _gather_limited(
    hook: Callable[[TaskExample, Any], Any],
    example: TaskExample,
    items: list[Any],
    max_concurrency: int,
) -> list[Any]:
    limit = asyncio.Semaphore(max(1, int(max_concurrency)))

    async def one(item: Any) -> Any:
        async with limit:
            return await hook(example, item)

    return list(await asyncio.gather(*(one(item) for item in items)))


def _check_message(message: Any, index: int) -> ChatMessage:
    if (
        not isinstance(message, Mapping)
        or not isinstance(message.get("role"), str)
        or not isinstance(message.get("content", ""), str)
    ):
        raise InvalidArgumentError(
            f"Target message {index} must be a dict with a string 'role' and 'content', "
            f"actual value: {message!r:.200}."
        )
    return dict(message)


_CHATML_BLOCK = re.compile(r"\s*<\|im_start\|>([A-Za-z_]+)\n(.*?)<\|im_end\|>", re.DOTALL)


def parse_chatml(text: str) -> list[ChatMessage] | None:
    """Parse a ChatML transcript (``<|im_start|>role\\ncontent<|im_end|>`` blocks, whitespace
    between them) into messages; ``None`` when ``text`` is not made only of such blocks.

    Example:
        >>> parse_chatml("<|im_start|>assistant\\nhi<|im_end|>")
        [{'role': 'assistant', 'content': 'hi'}]
    """
    messages: list[ChatMessage] = []
    pos = 0
    while pos < len(text):
        match = _CHATML_BLOCK.match(text, pos)
        if match is None:
            return None if text[pos:].strip() or not messages else messages
        messages.append({"role": match.group(1), "content": match.group(2)})
        pos = match.end()
    return messages or None


def sft_messages(
    env: EnvironmentMultiTurn, example: TaskExample, prompt_text: str = ""
) -> tuple[list[ChatMessage], list[ChatMessage]]:
    """Document 002's SFT row: ``(env.start_episode(example, prompt_text),
    env.sft_completion(example))``; the chat template renders ``prompt + target``."""
    example = TaskExample.coerce(example)
    return list(env.start_episode(example, prompt_text)), list(env.sft_completion(example))
