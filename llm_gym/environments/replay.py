"""Rebuild per-episode state from the transcript (document 002's "Keep step_episode stateless").

An :class:`~llm_gym.environments.EnvironmentMultiTurn` is shared by every concurrent rollout, so
a stateful task keeps its state in the transcript and replays it::

    def step_episode(self, example, messages, assistant_response):
        state = replay_state(initial_state(example), reduce_action, messages, assistant_response)
        ...

The three replay invariants, enforced here:

1. ``messages[-1]`` is the current action, equal to ``assistant_response``: the history is
   ``messages[:-1]`` and the current action is applied once, last.
2. Only *sampled* actions are replayed, not assistant-role prompt demonstrations nor
   assistant-role environment replies. llm_gym's adapter marks every assistant message it hands
   to the hooks: ``message["sampled"]`` is True for the policy's actions and False for any other
   assistant-role message (see :func:`is_sampled_action`).
3. Historical replay is pure: ``reduce_action`` replays history; pass ``apply_current`` to run
   the one effectful update (an external call) for the current action only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from llm_gym.errors import InvalidArgumentError

__all__ = ["SAMPLED_KEY", "is_sampled_action", "replay_state", "sampled_actions"]

S = TypeVar("S")

SAMPLED_KEY = "sampled"
"""The message key that marks assistant messages: True for sampled actions, False otherwise."""


def is_sampled_action(message: Mapping[str, Any]) -> bool:
    """Whether ``message`` is an assistant action the policy sampled (marked by the adapter)."""
    return message.get("role") == "assistant" and message.get(SAMPLED_KEY) is True


def _content(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    return content if isinstance(content, str) else ""


def sampled_actions(
    messages: Sequence[Mapping[str, Any]],
    *,
    prompt_length: int | None = None,
    is_sampled: Callable[[Mapping[str, Any]], bool] | None = None,
) -> list[str]:
    """The texts of the sampled assistant actions in ``messages``, in order.

    Which assistant messages count, first rule that applies:

    1. ``is_sampled`` given: the messages it accepts.
    2. Some assistant message carries the ``"sampled"`` marker (llm_gym's adapter marks them
       all): the assistant messages marked True.
    3. ``prompt_length`` given: assistant messages at index ``>= prompt_length`` (after the
       seeded ``start_episode`` prompt).
    4. Otherwise every assistant message (role alone: right only when neither the prompt nor the
       environment uses the assistant role).

    Example:
        >>> sampled_actions([
        ...     {"role": "user", "content": "guess"},
        ...     {"role": "assistant", "content": "5", "sampled": False},  # a demonstration
        ...     {"role": "assistant", "content": "7", "sampled": True},
        ... ])
        ['7']
    """
    if prompt_length is not None and (not isinstance(prompt_length, int) or prompt_length < 0):
        raise InvalidArgumentError(
            f"prompt_length must be None or an int >= 0, actual value: {prompt_length!r}."
        )
    if is_sampled is not None:
        return [_content(m) for m in messages if is_sampled(m)]
    assistant = [(i, m) for i, m in enumerate(messages) if m.get("role") == "assistant"]
    if any(SAMPLED_KEY in m for _, m in assistant):
        return [_content(m) for _, m in assistant if m.get(SAMPLED_KEY) is True]
    if prompt_length is not None:
        return [_content(m) for i, m in assistant if i >= prompt_length]
    return [_content(m) for _, m in assistant]


def replay_state(
    initial_state: S,
    reduce_action: Callable[[S, str], S],
    messages: Sequence[Mapping[str, Any]],
    assistant_response: str | None = None,
    *,
    apply_current: Callable[[S, str], S] | None = None,
    prompt_length: int | None = None,
    is_sampled: Callable[[Mapping[str, Any]], bool] | None = None,
) -> S:
    """The state after replaying the sampled actions of ``messages``.

    Args:
        initial_state: The state before any action (build a fresh one per call).
        reduce_action: ``(state, action_text) -> state``; pure (replayed on every step).
        messages: The transcript, as ``step_episode`` or ``score_episode`` gets it.
        assistant_response: In ``step_episode``: the current action, which must be
            ``messages[-1]``. History is then ``messages[:-1]`` and the current action is
            applied once, last. ``None`` (in ``score_episode``): replay every sampled action.
        apply_current: Applies the current action instead of ``reduce_action``: the one place
            for external effects (make them idempotent).
        prompt_length, is_sampled: How sampled actions are told apart; see
            :func:`sampled_actions`.

    Returns:
        The final state.

    Raises:
        InvalidArgumentError: ``assistant_response`` is given but is not ``messages[-1]``.
    """
    history = messages
    if assistant_response is not None:
        last = messages[-1] if messages else None
        if last is None or last.get("role") != "assistant" or _content(last) != assistant_response:
            raise InvalidArgumentError(
                "replay_state: messages[-1] must be the current assistant action, equal to "
                f"assistant_response; actual last message: {last!r:.200}."
            )
        history = messages[:-1]
    state = initial_state
    for action in sampled_actions(history, prompt_length=prompt_length, is_sampled=is_sampled):
        state = reduce_action(state, action)
    if assistant_response is not None:
        state = (apply_current or reduce_action)(state, assistant_response)
    return state
