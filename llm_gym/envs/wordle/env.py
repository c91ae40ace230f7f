"""Wordle: guess a secret five-letter word in six tries from per-letter feedback.

The word list and the feedback rule are in :mod:`llm_gym.envs.wordle.rules`. The module reads top
to bottom: constants, the seeded task generator, parsing, the per-turn reward, the environment
and its oracle (a solver that reads the feedback in the conversation).
"""

from __future__ import annotations

import functools
import random
import re
from collections.abc import Sequence
from typing import Any, ClassVar

from llm_gym.core.env import StepResult, SyncEnv
from llm_gym.core.task import Task
from llm_gym.core.tool_env import extract_answer
from llm_gym.core.types import Message, ToolSpec
from llm_gym.envs.wordle.rules import WORD_SET, WORDS, check_guess, consistent, score_guess
from llm_gym.errors import InvalidArgumentError

__all__ = [
    "INVALID_GUESS_REWARD",
    "MAX_GUESSES",
    "MAX_REPLIES",
    "PROMPT",
    "SHAPE_WEIGHT",
    "SOLVE_REWARD",
    "SPLIT_SIZES",
    "SYSTEM_PROMPT",
    "VERSION",
    "WordleEnv",
    "generate_tasks",
    "get_tasks",
    "make_task",
    "oracle_action",
    "parse_guess",
    "read_feedback",
    "turn_reward",
]

# --- constants ------------------------------------------------------------------------------------

VERSION = "0"
"""Bumped whenever tasks, feedback or rewards change (records carry it)."""

MAX_GUESSES = 6
"""Valid guesses per game."""
MAX_REPLIES = 10
"""Replies per game, valid or not: invalid guesses cost no guess, but the game ends here."""

SOLVE_REWARD = 1.0
"""The episode reward (and, shaped, the per-turn reward of the solving guess)."""
SHAPE_WEIGHT = 0.5
"""Shaped per-turn reward of a wrong valid guess: ``SHAPE_WEIGHT`` x the fraction of the words
still possible before it that its feedback rules out."""
INVALID_GUESS_REWARD = -0.1
"""Shaped per-turn reward of a reply without a valid guess."""

SYSTEM_PROMPT = (
    "You are playing Wordle. Find the secret five-letter English word in at most "
    f"{MAX_GUESSES} guesses. Each guess must be a five-letter word from the game's list of "
    f"{len(WORDS)} common English words. Reply with just your guess, for example: crane; if you "
    "write anything else, put the guess in square brackets, for example: My guess is [crane]. "
    "After each guess you get one mark per letter: G (green) = right letter in the right spot, "
    "Y (yellow) = the letter is in the word but in another spot, X (gray) = the letter is not in "
    "the word, or not as many times as you used it. An invalid guess costs no guess, but a game "
    f"ends after {MAX_REPLIES} replies."
)
PROMPT = f"Guess the secret five-letter word. You have {MAX_GUESSES} guesses."
"""The opening user message of every game (it cannot tell the secret)."""

SPLIT_SIZES = {"val": 200, "test": 200, "train": len(WORDS) - 400}
"""Secrets per split; the splits share no secret."""
TASK_SEED = 20261202
"""Seed of the split assignment: the same seed always gives the same secrets in each split."""


# --- the seeded task generator -----------------------------------------------------------------


def make_task(secret: str, id: str | None = None) -> Task:
    """The game whose secret is ``secret`` (a word of :data:`WORDS`).

    Example:
        >>> make_task("crane").target
        'crane'
    """
    if secret not in WORD_SET:
        raise InvalidArgumentError(
            f"Expected a secret from the word list ({len(WORDS)} words), actual value: "
            f"{secret!r:.40}."
        )
    return Task(prompt=PROMPT, target=secret, metadata={}, id=id)


@functools.cache
def _secrets_by_split() -> dict[str, tuple[str, ...]]:
    shuffled = list(WORDS)
    random.Random(TASK_SEED).shuffle(shuffled)
    out: dict[str, tuple[str, ...]] = {}
    start = 0
    for split, size in SPLIT_SIZES.items():
        out[split] = tuple(shuffled[start : start + size])
        start += size
    return out


def generate_tasks(seed: int, n: int, split: str | None = None) -> list[Task]:
    """``n`` games with distinct secrets drawn from ``random.Random(seed)``.

    A pure function of its arguments. Secrets come from the whole list, or from ``split``'s
    secrets only.
    """
    pool = WORDS if split is None else _pool(split)
    if not isinstance(n, int) or not 0 <= n <= len(pool):
        raise InvalidArgumentError(
            f"n must be an int in 0..{len(pool)} (distinct secrets available), actual value: {n!r}."
        )
    return [make_task(secret) for secret in random.Random(seed).sample(pool, n)]


def _pool(split: str) -> tuple[str, ...]:
    pools = _secrets_by_split()
    if split not in pools:
        raise InvalidArgumentError(
            f"split must be one of {sorted(pools)}, actual value: {split!r}."
        )
    return pools[split]


@functools.cache
def _splits() -> dict[str, tuple[Task, ...]]:
    return {
        split: tuple(
            make_task(t.target, id=f"wordle/{split}/{i:04d}")
            for i, t in enumerate(generate_tasks(TASK_SEED + k, size, split))
        )
        for k, (split, size) in enumerate(SPLIT_SIZES.items())
    }


def get_tasks(split: str = "train") -> tuple[Task, ...]:
    """The games of ``split`` (``"train"``, ``"val"`` or ``"test"``): one per secret."""
    _pool(split)
    return _splits()[split]


# --- parsing -------------------------------------------------------------------------------------

_EDGE_JUNK = " \t\r\n.,;:!?'\"`*_()"


def parse_guess(text: str) -> str | None:
    """The guess written in a reply, lowercased but not yet checked; None when there is none.

    Rules: ``<think>`` blocks are ignored; the last ``[...]`` in the reply is the guess when
    there is one; otherwise the whole reply is, once surrounding whitespace, quotes, markdown
    stars and punctuation are stripped, provided it is a single word.

    Example:
        >>> parse_guess("**CRANE**"), parse_guess("I think [slate] fits"), parse_guess("a b")
        ('crane', 'slate', None)
    """
    if "think>" in text:
        text = extract_answer(text)
    close = text.rfind("]")
    if close >= 0:
        open_ = text.rfind("[", 0, close)
        if open_ >= 0:
            return text[open_ + 1 : close].strip(_EDGE_JUNK).lower()
    word = text.strip(_EDGE_JUNK)
    if not word or any(c.isspace() for c in word):
        return None
    return word.lower()


_FEEDBACK = re.compile(r"Guess \d+ of \d+: ([A-Z]{5}) -> ([GYX]) ([GYX]) ([GYX]) ([GYX]) ([GYX])")


def read_feedback(messages: Sequence[Message]) -> list[tuple[str, str]]:
    """Every ``(guess, pattern)`` the environment reported in ``messages``, in order.

    Example:
        >>> read_feedback([{"role": "user", "content": "Guess 1 of 6: CRANE -> X Y X X G."}])
        [('crane', 'XYXXG')]
    """
    history = []
    for message in messages:
        if message.get("role") == "user":
            match = _FEEDBACK.match(message.get("content") or "")
            if match:
                history.append((match.group(1).lower(), "".join(match.group(2, 3, 4, 5, 6))))
    return history


# --- the per-turn reward -------------------------------------------------------------------------


def turn_reward(solved: bool, before: int, after: int) -> float:
    """The shaped reward of one valid guess: ``SOLVE_REWARD`` when it solved the game, else
    ``SHAPE_WEIGHT`` x the fraction of the ``before`` possible words it ruled out (``after``
    remain). Invalid replies get ``INVALID_GUESS_REWARD``.

    Example:
        >>> turn_reward(False, 100, 25)
        0.375
    """
    if solved:
        return SOLVE_REWARD
    return SHAPE_WEIGHT * (before - after) / before if before else 0.0


# --- the environment -----------------------------------------------------------------------------


def _count(n: int, singular: str, plural: str) -> str:
    return f"{n} {singular if n == 1 else plural}"


class WordleEnv(SyncEnv):
    """Guess the secret five-letter word (``task.target``) in six tries.

    ## Description
    Secrets and allowed guesses are the bundled list :data:`WORDS`. Each valid guess gets one
    mark per letter (G, Y, X; duplicate letters as in :func:`score_guess`).

    ## Action Space
    Plain text in the assistant message's content (no tools): the reply is the guess, or the
    last ``[word]`` in it (:func:`parse_guess`). The env reads the raw text
    (``raw_text_actions``), so a reply is never a parse failure.

    ## Observation Space
    One user message per reply: ``Guess 2 of 6: CRANE -> X Y X X G. 4 guesses left.``, or why
    the reply was not a valid guess (what is allowed), with what is left.

    ## Reward
    ``SOLVE_REWARD`` (1.0) when the word is found within six guesses, else 0.0. With
    ``shaped_reward=True``, ``metrics["per_turn_rewards"]`` holds one value per reply (see
    :func:`turn_reward`); without it the episode gets episode-level credit.

    ## Episode End
    Terminated when the word is found, after six valid guesses, or after ``MAX_REPLIES``
    replies in all (invalid guesses cost no guess). ``max_turns`` is ``MAX_REPLIES``.

    ## Info
    Final metrics: ``guesses`` (valid ones), ``invalid_guesses``; ``per_turn_rewards`` when
    shaped.

    ## Version History
    * v0: first release.
    """

    raw_text_actions: ClassVar[bool] = True
    """The env parses the assistant text itself (no tool-call parsing, no parse failures)."""
    max_turns: ClassVar[int] = MAX_REPLIES
    """Replies per game (the loop and ``TextEnv`` cap episodes here, not at six)."""
    max_tokens_per_turn: ClassVar[int] = 16
    """A reply is one word, bracketed in prose ("My guess is [crane]." is 7 tokens)."""

    def __init__(self, shaped_reward: bool = False) -> None:
        """Create the environment.

        Args:
            shaped_reward: Put shaped per-turn rewards (:func:`turn_reward`) in the final
                ``metrics["per_turn_rewards"]``; off by default.
        """
        if not isinstance(shaped_reward, bool):
            raise InvalidArgumentError(
                f"shaped_reward must be a bool, actual value: {shaped_reward!r}."
            )
        self.shaped_reward = shaped_reward
        self._task: Task | None = None
        self._secret = ""
        self._messages: list[Message] = []
        self._guesses = 0
        self._replies = 0
        self._per_turn: list[float] = []
        self._possible: Sequence[str] = WORDS
        self._done = False

    def reset_sync(self, task: Task) -> list[Message]:
        secret = task.target
        if not isinstance(secret, str) or secret not in WORD_SET:
            raise InvalidArgumentError(
                f"A Wordle task's target must be a word of the list ({len(WORDS)} words; "
                f"make_task(secret) builds one), actual value: {secret!r:.40}."
            )
        self._task, self._secret = task, secret
        self._guesses = self._replies = 0
        self._per_turn = []
        self._possible = WORDS
        self._done = False
        self._messages = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": task.prompt},
        ]
        return list(self._messages)

    def step_sync(self, message: Message) -> StepResult:
        if self._task is None or self._done:
            raise RuntimeError("No episode is running: call reset(task) first.")
        self._messages.append(message)
        self._replies += 1
        if "tool_calls" in message:  # only a direct caller can send these; answer each one
            self._answer_tool_calls(message)
        content = message.get("content")
        word = parse_guess(content) if isinstance(content, str) else None
        if word is None:
            problem = (
                "the reply is empty"
                if not isinstance(content, str) or not content.strip()
                else "a reply of several words needs the guess in square brackets"
            )
        else:
            problem = check_guess(word)
        if problem is not None:
            return self._invalid(problem)
        self._guesses += 1
        pattern = score_guess(self._secret, word)
        feedback = f"Guess {self._guesses} of {MAX_GUESSES}: {word.upper()} -> {' '.join(pattern)}."
        solved = word == self._secret
        if self.shaped_reward:
            before = len(self._possible)
            self._possible = consistent(self._possible, word, pattern)
            self._per_turn.append(turn_reward(solved, before, len(self._possible)))
        if solved:
            return self._finish(f"{feedback} Solved!", SOLVE_REWARD)
        left = MAX_GUESSES - self._guesses
        if left == 0:
            return self._finish(f"{feedback} No guesses left: the word was {self._reveal()}.")
        if self._replies >= MAX_REPLIES:
            return self._finish(f"{feedback} No replies left: the word was {self._reveal()}.")
        return self._reply(f"{feedback} {_count(left, 'guess', 'guesses')} left.")

    def _invalid(self, problem: str) -> StepResult:
        if self.shaped_reward:
            self._per_turn.append(INVALID_GUESS_REWARD)
        text = (
            f"Invalid guess: {problem}. Reply with one five-letter word from the list, for "
            "example: crane (or [crane] inside a longer reply)."
        )
        if self._replies >= MAX_REPLIES:
            return self._finish(f"{text} No replies left: the word was {self._reveal()}.")
        guesses = _count(MAX_GUESSES - self._guesses, "guess", "guesses")
        replies = _count(MAX_REPLIES - self._replies, "reply", "replies")
        return self._reply(f"{text} It cost no guess: {guesses} left, {replies} left.")

    def _reveal(self) -> str:
        return self._secret.upper()

    def _answer_tool_calls(self, message: Message) -> None:
        for call in message.get("tool_calls") or []:
            call_id = call.get("id", "") if isinstance(call, dict) else ""
            self._messages.append(
                {
                    "role": "tool",
                    "content": "tool_error: this game has no tools; write your guess as plain "
                    "text in your reply.",
                    "tool_call_id": str(call_id),
                }
            )

    def _reply(self, text: str) -> StepResult:
        self._messages.append({"role": "user", "content": text})
        return StepResult(False, False, list(self._messages))

    def _finish(self, text: str, reward: float = 0.0) -> StepResult:
        self._messages.append({"role": "user", "content": text})
        self._done = True
        metrics: dict[str, Any] = {
            "guesses": self._guesses,
            "invalid_guesses": self._replies - self._guesses,
        }
        if self.shaped_reward:
            metrics["per_turn_rewards"] = list(self._per_turn)
        return StepResult(True, False, list(self._messages), reward, metrics)

    @property
    def tool_specs(self) -> list[ToolSpec]:
        return []

    @property
    def messages(self) -> list[Message]:
        return list(self._messages)


# --- the oracle ---------------------------------------------------------------------------------


def oracle_action(task: Task, messages: Sequence[Message]) -> Message:
    """The solver's next guess, from the feedback in ``messages`` (never from the target).

    Keeps the words consistent with every reported ``(guess, marks)`` and guesses the word that
    leaves the fewest of them in expectation (:func:`llm_gym.envs.wordle.solver.best_guess`).
    """
    from llm_gym.envs.wordle.solver import best_guess

    guess = best_guess(WORDS, tuple(read_feedback(messages)))
    return Message(role="assistant", content=guess)
