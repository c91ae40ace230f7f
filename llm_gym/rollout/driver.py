"""The episode driver: every rule of an episode, in one place.

:class:`EpisodeDriver` plays one environment through episodes: :meth:`~EpisodeDriver.start` a task,
:meth:`~EpisodeDriver.act` with the assistant's text, and when an act ends the episode it returns
the episode's :class:`~llm_gym.rollout.Episode` record with its ending written (reward,
terminated or truncated, cause, metrics, error: :meth:`~llm_gym.rollout.Episode.end`).
``TextEnv`` (the gymnasium face) is a text view over one driver; ``collect_groups`` drives many
concurrently. The rules, here and nowhere else:

* Text is valid UTF-8 both ways: the assistant's text, the opening messages, the tool specs and
  each message a step adds pass :mod:`llm_gym.core.text` (a lone surrogate becomes U+FFFD).
* The text is parsed with the action format. Text that cannot be parsed ends the episode:
  truncated, ``PARSE_FAILURE``, reward ``failed_parse_reward``, the parser's reason in
  :attr:`~EpisodeDriver.parsed`; the environment never sees it. Text longer than
  ``max_action_chars`` is such a failure too, before any parsing.
* An environment with ``raw_text_actions`` gets the raw text as the assistant message's
  ``content`` and parses it itself, so there is no parse failure (the parse is kept as a record
  when ``record_parse`` is set).
* The episode ends when the environment's step says so: terminated (its reward and metrics), or
  truncated (cause ``ENV``, at whatever turn: an environment's own limit is ``ENV``).
* A step that raises or returns a malformed StepResult (an ending reward that is not a finite
  number, say) ends the episode: truncated, ``ENV``, reward 0, the traceback in ``error``.
  With ``env_timeout_s``, a ``reset``, ``step``, ``conclude`` or ``close`` of the async methods
  that has not returned by then is cancelled and counts as raising (``EnvTimeoutError``).
* After the loop's turn limit without an end: truncated, ``MAX_TURNS``, reward 0. The limit is
  the smaller of the run's ``max_turns`` and the cap an environment asks the loop to enforce
  (``Env.max_turns``, for example document 002's ``max_episode_turns``). Only this limit is
  ``MAX_TURNS``: an environment that truncates the episode itself is ``ENV``, at its cap too.
* The caller may end an episode itself (:meth:`~EpisodeDriver.end`): ``CONTEXT_OVERFLOW`` when
  the next turn would not fit the model's context, ``ENV`` when starting the episode failed.
* An environment that scores whatever transcript it has (``conclude(cause)``, document 002's
  environments) is concluded when the run's turn limit or the caller (:meth:`~EpisodeDriver.cut`)
  ends its episode: the ending takes its reward and metrics instead of 0.

The driver never renders text and never tokenizes: those belong to its callers.
"""

from __future__ import annotations

import traceback
from collections.abc import Awaitable
from typing import Any

from llm_gym.actions import ActionFormat, ParsedAction, ParseKind, get_action_format
from llm_gym.aio import LoopRunner, within
from llm_gym.core.env import (
    Env,
    StepResult,
    SyncEnv,
    TruncationCause,
    check_messages,
    check_step,
    finite_reward,
    require_turn_limit,
    step_outcome,
    turn_cap,
)
from llm_gym.core.factories import EnvFactory
from llm_gym.core.task import Task
from llm_gym.core.text import clean_json, clean_messages, clean_text
from llm_gym.core.types import Message, ToolSpec
from llm_gym.errors import EnvTimeoutError, InvalidArgumentError
from llm_gym.rollout.episode import Episode

__all__ = [
    "DEFAULT_FAILED_PARSE_REWARD",
    "MAX_ACTION_CHARS",
    "EpisodeDriver",
    "require_turn_limit",
]

DEFAULT_FAILED_PARSE_REWARD = -0.1
"""The reward of an episode whose last action could not be parsed (the seeds' default)."""
MAX_ACTION_CHARS = 1_000_000
"""The longest assistant text the driver hands to a parser (longer: a parse failure)."""


class EpisodeDriver:
    """Plays episodes of one environment factory, one at a time, by the rules above.

    Args:
        env_factory: A resolved factory ``task -> Env`` (see
            :func:`~llm_gym.core.factories.as_env_factory`); a fresh env per episode.
        action_format: How the assistant's text is parsed (a name or an :class:`ActionFormat`).
        max_turns: Assistant turns before ``MAX_TURNS`` (unless the env caps its own episodes).
        failed_parse_reward: The reward of an episode that ends on an unparseable action.
        record_parse: Also parse the text handed raw to a ``raw_text_actions`` env, as a record
            (:attr:`parsed`); the rollout loop counts tool calls with it.
        runner: The event loop runner of the synchronous methods (``start_sync``,
            ``act_sync``, ``close_sync``) for the calls an env does not complete without one
            (made when needed).
        max_action_chars: Longer assistant text is a parse failure, never parsed.
        env_timeout_s: Seconds an env's async ``reset``/``step``/``conclude``/``close`` may take
            (None: no limit). It cannot stop a call that blocks the event loop (a SyncEnv's
            plain methods), nor work in threads or processes (that is the env's ``close``).

    After each :meth:`act`: :attr:`messages` is the whole conversation, :attr:`action` the
    assistant message the environment got, :attr:`parsed` the parse (or None), and
    :meth:`replies` the messages the environment added after the action.
    """

    # Slots: the attributes of the step's hot path are read and written several times a step.
    __slots__ = (
        "_acting",
        "_cut",
        "_dirty",
        "_eager",
        "_env_step",
        "_step_sync",
        "action",
        "action_format",
        "ended",
        "env",
        "env_cap",
        "env_factory",
        "env_timeout_s",
        "episode",
        "failed_parse_reward",
        "limit",
        "max_action_chars",
        "max_turns",
        "messages",
        "parsed",
        "parser",
        "raw_text",
        "record_parse",
        "reply_start",
        "runner",
        "task",
        "tool_specs",
        "turn",
    )

    def __init__(
        self,
        env_factory: EnvFactory,
        *,
        action_format: str | ActionFormat = "hermes",
        max_turns: int = 8,
        failed_parse_reward: float = DEFAULT_FAILED_PARSE_REWARD,
        record_parse: bool = False,
        runner: LoopRunner | None = None,
        max_action_chars: int = MAX_ACTION_CHARS,
        env_timeout_s: float | None = None,
    ) -> None:
        if env_timeout_s is not None and not env_timeout_s > 0:
            raise InvalidArgumentError(
                f"env_timeout_s must be None or > 0 seconds, actual value: {env_timeout_s!r}."
            )
        self.max_action_chars = require_turn_limit(max_action_chars, "max_action_chars")
        self.env_timeout_s = env_timeout_s
        self.env_factory = env_factory
        self.action_format = get_action_format(action_format)
        self.parser = self.action_format
        """The format bound to the current episode's tools (``action_format.with_tool_specs``):
        what parses each reply."""
        self.max_turns = require_turn_limit(max_turns)
        self.failed_parse_reward = finite_reward(failed_parse_reward, "failed_parse_reward")
        self.record_parse = record_parse
        self.runner = runner
        self.env: Env | None = None
        """The current episode's environment (None before the first start and after close)."""
        self.task: Task | None = None
        """The current episode's task."""
        self.tool_specs: list[ToolSpec] = []
        """The current episode's tool specs, read from the env once after its reset."""
        self.messages: list[Message] = []
        """The conversation so far (a parse failure's message included): the list the env's last
        step returned, never changed in place by the driver. Copy it to keep it past the next
        act (an env may return, and later extend, its own list)."""
        self.turn = 0
        """Assistant turns taken this episode."""
        self.limit = max_turns
        self.env_cap: int | None = None
        """This episode's turn limit (the env's own cap when it declares one)."""
        self.raw_text = False
        """Whether this episode's env reads the raw text (``raw_text_actions``)."""
        self.action: Message | None = None
        """The last assistant message (as the environment got it)."""
        self.parsed: ParsedAction | None = None
        """The last parse (None for a raw-text env without ``record_parse``)."""
        self.reply_start = 0
        """Where the environment's replies to the last action start in :attr:`messages`."""
        self.episode: Episode | None = None
        """The current episode's record (None before the first start). The driver writes its
        task, opening size, tool specs and action format, and its ending (:meth:`Episode.end`)
        when the episode ends; its transcript, turns and token samples are the caller's to fill
        (``collect_groups`` does)."""
        self.ended = False
        """Whether the current episode has ended (its record's ending is written)."""
        self._acting = self._cut = self._dirty = False

    # --- starting -----------------------------------------------------------------------------
    def _begin(self, env: Env, task: Task, opening: list[Message]) -> list[Message]:
        # The synchronous step (TextEnv's hot path): a SyncEnv's plain method (cheaper than its
        # coroutine: benchmarks/results/env_step_sync_path.md), else the env's coroutine.
        self._eager, self._env_step = env.synchronous, env.step
        plain = isinstance(env, SyncEnv)
        self._step_sync = env.step_sync if plain else self._step_now  # type: ignore[attr-defined]
        opening = check_messages(opening, f"{type(env).__name__}.reset")
        cleaned = clean_messages(opening)
        self._dirty = cleaned is not None  # then each step's whole list is checked
        self.messages = cleaned or list(opening)
        self.tool_specs = clean_json(list(env.tool_specs or ()))
        self.parser = self.action_format.with_tool_specs(self.tool_specs)
        self.task, self.turn, self.ended, self._acting = task, 0, False, True
        episode = self.episode
        assert episode is not None  # made by _new_env
        episode.num_opening_messages, episode.tool_specs = len(self.messages), self.tool_specs
        self.action, self.parsed, self.reply_start = None, None, len(self.messages)
        self.raw_text = bool(env.raw_text_actions)
        self.env_cap = turn_cap(env)
        self.limit = self.max_turns if self.env_cap is None else min(self.env_cap, self.max_turns)
        return self.messages

    def _new_env(self, task: Task) -> Env:
        self.ended, self._acting, self._cut = False, False, False
        fmt = self.action_format
        self.episode = Episode(task, 0, 0, [], [], 0.0, False, False, action_format=fmt)
        self.env = env = self.env_factory(task)
        if not isinstance(env, Env):
            raise InvalidArgumentError(
                f"The env factory returned a {type(env).__name__}; it must return an "
                "llm_gym.Env (subclass Env, or SyncEnv for an env that never awaits)."
            )
        return env

    async def start(self, task: Task) -> list[Message]:
        """Build a fresh environment for ``task`` and reset it; returns the opening messages.

        Raises whatever the factory or ``reset`` raises (the env, if built, is kept for
        :meth:`close`). Close the previous episode first.
        """
        env = self._new_env(task)
        return self._begin(env, task, await self._bounded(env.reset(task), "reset"))

    def start_sync(self, task: Task) -> list[Message]:
        """:meth:`start` without an event loop for a ``synchronous`` env (else on
        :attr:`runner`)."""
        env = self._new_env(task)
        if isinstance(env, SyncEnv):  # its plain method: see _begin
            return self._begin(env, task, env.reset_sync(task))
        return self._begin(env, task, self._run(env.reset(task), env.synchronous))

    # --- acting -------------------------------------------------------------------------------
    def _prepare(self, text: str) -> Message | None:
        """The assistant message for the env, or None when ``text`` ended the episode."""
        if not self._acting:
            raise InvalidArgumentError(
                "act() needs a started episode that has not ended; call start(task) first."
            )
        self.turn = turn = self.turn + 1
        self.reply_start = len(self.messages)
        if not text.isascii():
            text = clean_text(text)
        if len(text) > (limit := self.max_action_chars):
            reason = f"the reply has {len(text):,} characters, over max_action_chars={limit:,}"
            self.parsed = parsed = ParsedAction.failure(text, reason)
            self.action = parsed.message
            return self._failed(parsed)
        if self.raw_text:
            if self.record_parse:
                self.parsed = self.parser.parse(text, call_id_prefix=f"call_t{turn}")
            self.action = action = {"role": "assistant", "content": text}
            return action
        self.parsed = parsed = self.parser.parse(text, call_id_prefix=f"call_t{turn}")
        self.action = action = parsed.message
        if parsed.kind is ParseKind.PARSE_FAILURE:
            return self._failed(parsed)
        return action

    def _failed(self, parsed: ParsedAction) -> None:  # the env never sees an unparsed action
        self.messages = [*self.messages, parsed.message]
        self.reply_start = len(self.messages)
        cause = TruncationCause.PARSE_FAILURE
        self._finish(self.failed_parse_reward, cause)

    def _absorb(self, result: StepResult) -> Episode | None:
        """Take the environment's step result; the ended episode, if this step ended it."""
        # No copy per step: the driver never edits the list, and every consumer that keeps it
        # past the next act copies it (the loop's records, TextEnv's info).
        start = check = self.reply_start
        messages = check_step(result, f"{type(self.env).__name__}.step", start)
        if len(messages) > start:
            echo = messages[start]
            if echo is self.action:  # the env echoed the action: replies start after it
                self.reply_start = check = start + 1  # (valid: the driver made it)
            elif echo.get("role") == "assistant":
                self.reply_start = start + 1
        # What the step added must be valid text. The env's list is never edited (a copy); once
        # it held invalid text, all of it is checked.
        if (cleaned := clean_messages(messages, 0 if self._dirty else check)) is not None:
            self._dirty, messages = True, cleaned
        self.messages = messages
        if result.terminated or result.truncated:  # positional arguments: it runs at every end
            cause = None if result.terminated else TruncationCause.ENV
            reward, metrics = step_outcome(result, f"{type(self.env).__name__}.step")
            return self._finish(reward, cause, clean_json(metrics))
        if self.turn >= self.limit:
            self._cut = True  # the loop's limit, not the env: the env may score what it has
            return self._finish(0.0, TruncationCause.MAX_TURNS)
        return None

    def _conclusion(self) -> Any:
        """The env's ``conclude(cause)`` coroutine when the last ending cut its episode short
        and the env scores cut episodes; else None."""
        if not self._cut or not self.ended:
            return None
        self._cut = False
        assert self.episode is not None
        return self.env.conclude(str(self.episode.truncation_cause))

    def _concluded(self, result: StepResult | None) -> Episode:
        episode = self.episode
        assert episode is not None
        if result is not None:
            episode.reward, metrics = step_outcome(result, f"{type(self.env).__name__}.conclude")
            episode.metrics = clean_json(metrics)
        return episode

    async def _conclude(self) -> Episode | None:
        conclusion = self._conclusion()
        if conclusion is None:
            return self.episode if self.ended else None
        try:
            return self._concluded(await self._bounded(conclusion, "conclude"))
        except Exception:
            return self._finish(0.0, TruncationCause.ENV, error=traceback.format_exc())

    def _raised(self, action: Message) -> Episode:
        self.messages = [*self.messages, action]
        self.reply_start = len(self.messages)
        return self._finish(0.0, TruncationCause.ENV, error=traceback.format_exc())

    def _finish(
        self,
        reward: float,
        cause: TruncationCause | None,
        metrics: dict[str, Any] | None = None,
        error: str | None = None,
    ) -> Episode:
        """End the episode: its record's ending (:meth:`Episode.end`); returns the record."""
        if error is not None:  # a traceback may quote the env's invalid text
            error = clean_text(error)
        episode = self.episode
        assert episode is not None
        episode.end(reward, cause, metrics, error)
        self.ended, self._acting = True, False
        return episode

    async def _bounded(self, call: Awaitable[Any], name: str, env: Any = None) -> Any:
        """Await an env call within ``env_timeout_s`` (cancelled after, as EnvTimeoutError)."""
        if (limit := self.env_timeout_s) is None:
            return await call
        what = f"{type(env or self.env).__name__}.{name} did not return within env_timeout_s"
        return await within(call, limit, lambda: EnvTimeoutError(f"{what}={limit} s: cancelled."))

    async def act(self, text: str) -> Episode | None:
        """Act with the assistant's ``text``: None while the episode goes on, else the episode's
        record with its ending written."""
        action = self._prepare(text)
        if action is None:
            return self.episode
        try:
            result = await self._bounded(self.env.step(action), "step")  # type: ignore[union-attr]
            done = self._absorb(result)
        except Exception:
            return self._raised(action)
        if done is not None and self._cut:
            return await self._conclude()
        return done

    def act_sync(self, text: str) -> Episode | None:
        """:meth:`act` without an event loop for a ``synchronous`` env (else on
        :attr:`runner`)."""
        action = self._prepare(text)
        if action is None:
            return self.episode
        try:
            done = self._absorb(self._step_sync(action))
        except Exception:
            return self._raised(action)
        if done is not None and self._cut:
            return self._run(self._conclude(), self.env.synchronous)
        return done

    def end(self, cause: TruncationCause, error: str | None = None) -> Episode:
        """End the episode from outside (``CONTEXT_OVERFLOW``, or ``ENV`` with the traceback of
        a failure around it): truncated, reward 0; returns its record."""
        return self._finish(0.0, cause, error=error)

    async def cut(self, cause: TruncationCause, error: str | None = None) -> Episode:
        """:meth:`end` the episode for a budget or a failure outside the env
        (``CONTEXT_OVERFLOW``, ``DEADLINE``, ``POLICY_ERROR`` with its ``error``); an env that
        scores cut episodes is concluded, and the ending takes its reward and metrics."""
        self.end(cause, error)
        self._cut = True
        ending = await self._conclude()
        assert ending is not None
        return ending

    def replies(self) -> list[Message]:
        """The messages the environment added after the last action (tool results, a user
        turn), without the echoed assistant message."""
        return self.messages[self.reply_start :]

    # --- closing ------------------------------------------------------------------------------
    async def close(self) -> None:
        """Close the current environment (always call it; safe to call twice)."""
        env, self.env, self._acting = self.env, None, False
        if env is not None:
            await self._bounded(env.close(), "close", env)

    def close_sync(self) -> None:
        """:meth:`close` without an event loop for a ``synchronous`` env (else on
        :attr:`runner`)."""
        env, self.env, self._acting = self.env, None, False
        if isinstance(env, SyncEnv):  # its plain method: see _begin
            env.close_sync()
        elif env is not None:
            self._run(env.close(), env.synchronous)

    def _step_now(self, action: Message) -> StepResult:
        """The step on :attr:`runner`, driven by hand first for a ``synchronous`` env."""
        return self._run(self._env_step(action), self._eager)

    def _run(self, coroutine: Any, eager: bool) -> Any:
        if self.runner is None:
            self.runner = LoopRunner()
        return self.runner.run(coroutine, eager)

    def __getstate__(self) -> dict[str, Any]:
        state = {name: getattr(self, name) for name in self.__slots__ if hasattr(self, name)}
        state["runner"] = None  # an event loop does not pickle; a new one is made on demand
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            setattr(self, name, value)
