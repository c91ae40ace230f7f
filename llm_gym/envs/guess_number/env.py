"""GuessNumber: find a secret integer in a range from "higher" / "lower" feedback.

Document 002's ``env setup --multi-turn`` starter, made a native, synchronous :class:`Env`. The
module reads top to bottom: constants, the seeded task generator, parsing, the per-turn reward,
the environment and its oracle (binary search over the feedback).
"""

from __future__ import annotations

import functools
import itertools
import random
import re
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, ClassVar

from llm_gym.core.env import StepResult, SyncEnv
from llm_gym.core.task import Task, pick_split
from llm_gym.core.tool_env import extract_answer
from llm_gym.core.types import FrozenMessage, Message, ToolSpec
from llm_gym.errors import InvalidArgumentError

__all__ = [
    "BUDGET_SLACK",
    "INVALID_GUESS_REWARD",
    "LOWS",
    "MAX_GUESS_DIGITS",
    "SHRINK_WEIGHT",
    "SIZES",
    "SOLVE_REWARD",
    "SPLIT_SIZES",
    "SYSTEM_PROMPT",
    "VERSION",
    "GuessNumberEnv",
    "binary_search_guesses",
    "generate_tasks",
    "get_tasks",
    "make_task",
    "oracle_action",
    "split_of",
    "parse_guess",
    "turn_reward",
]

# --- constants -----------------------------------------------------------------------------------

VERSION = "0"
"""Bumped whenever tasks, feedback or rewards change (records carry it)."""

SYSTEM_PROMPT = (
    "You are playing a number-guessing game. Each of your replies is one guess: an integer "
    "written in digits, for example 42. If a reply contains several integers, the last one is "
    "your guess. After each guess you are told whether the secret is higher or lower."
)

SOLVE_REWARD = 1.0
"""The episode reward (and the per-turn reward of the guess) when the secret is found."""
SHRINK_WEIGHT = 0.5
"""A wrong in-range guess earns ``SHRINK_WEIGHT`` x the fraction of the still-possible secrets it
ruled out (a halving guess earns about 0.25)."""
INVALID_GUESS_REWARD = -0.1
"""Per-turn reward of a reply with no usable guess (no integer, not an integer, out of range)."""

SIZES = (10, 20, 50, 100, 100, 100, 200, 500, 1000)
"""How many integers a task's range holds (repeats weight the draw; 100 is the classic game)."""
LOWS = (1, 1, 1, 0, 10, 100)
"""Where a task's range starts (weighted the same way)."""
BUDGET_SLACK = 2
"""Guesses allowed beyond what binary search needs in the worst case (1..100: 7 + 2 = 9)."""
MAX_GUESS_DIGITS = 12
"""Longer digit runs are reported as far out of range without being converted to ``int``."""
_NO_METRICS: Mapping[str, Any] = MappingProxyType({})
"""The metrics of a step that does not end the episode (never read; shared, read-only)."""

SPLIT_SIZES = {"train": 1000, "val": 200, "test": 200}
"""Tasks per split; no (range, secret) pair appears in two splits (see :func:`split_of`)."""
VAL_FRACTION = 0.15
"""The share of each range's secrets that belongs to ``val`` (and again to ``test``)."""
TASK_SEED = 20261201
"""Seed of the task universe: the same seed always gives the same tasks in the same splits."""


# --- the seeded task generator -----------------------------------------------------------------


def binary_search_guesses(low: int, high: int) -> int:
    """Guesses binary search needs in the worst case to find any secret in ``low..high``.

    Example:
        >>> binary_search_guesses(1, 100)
        7
    """
    return (high - low + 1).bit_length()


def make_task(low: int, high: int, secret: int, id: str | None = None) -> Task:
    """The task "find ``secret`` in ``low..high``" with a budget that binary search always meets.

    Example:
        >>> make_task(1, 100, 37).metadata["budget"]
        9
    """
    if not (isinstance(low, int) and isinstance(high, int) and low <= high):
        raise InvalidArgumentError(
            f"Expected integers low <= high, actual values: low={low!r}, high={high!r}."
        )
    if not (isinstance(secret, int) and low <= secret <= high):
        raise InvalidArgumentError(f"Expected a secret in {low}..{high}, actual value: {secret!r}.")
    budget = binary_search_guesses(low, high) + BUDGET_SLACK
    prompt = (
        f"I am thinking of an integer between {low} and {high} (both included). Find it in at "
        f"most {budget} guesses. After each guess I will tell you whether the secret is higher "
        "or lower. What is your first guess?"
    )
    metadata = {"low": low, "high": high, "budget": budget}
    return Task(prompt=prompt, target=secret, metadata=metadata, id=id)


def split_of(low: int, high: int, secret: int) -> str:
    """The split that owns the task (``low``, ``high``, ``secret``): a fixed pseudo-random draw.

    About ``VAL_FRACTION`` of each range's secrets belong to ``val``, as many to ``test``, the
    rest to ``train``; no pattern a model could learn (such as ``secret % 10``) separates them.
    """
    draw = random.Random(f"{TASK_SEED}/{low}/{high}/{secret}").random()
    return "val" if draw < VAL_FRACTION else "test" if draw < 2 * VAL_FRACTION else "train"


def generate_tasks(seed: int, n: int, split: str | None = None) -> list[Task]:
    """``n`` distinct tasks (no two share range and secret) drawn from ``random.Random(seed)``.

    A pure function of its arguments: the same seed always gives the same list. With ``split``,
    only tasks that :func:`split_of` gives to that split are drawn.
    """
    if split is not None and split not in SPLIT_SIZES:
        raise InvalidArgumentError(
            f"split must be None or one of {sorted(SPLIT_SIZES)}, actual value: {split!r}."
        )
    rng = random.Random(seed)
    seen: set[tuple[int, int, int]] = set()
    tasks: list[Task] = []
    attempts = 0
    while len(tasks) < n:
        attempts += 1
        if attempts > 50 * n:
            raise InvalidArgumentError(f"Could not draw {n} distinct tasks; asked for too many.")
        low = rng.choice(LOWS)
        high = low + rng.choice(SIZES) - 1
        secret = rng.randint(low, high)
        if (low, high, secret) in seen:
            continue
        if split is not None and split_of(low, high, secret) != split:
            continue
        seen.add((low, high, secret))
        tasks.append(make_task(low, high, secret))
    return tasks


@functools.cache
def _splits() -> dict[str, tuple[Task, ...]]:
    return {
        split: tuple(
            Task(t.prompt, t.target, t.metadata, id=f"guess_number/{split}/{i:04d}")
            for i, t in enumerate(generate_tasks(TASK_SEED + k, size, split))
        )
        for k, (split, size) in enumerate(SPLIT_SIZES.items())
    }


def get_tasks(split: str = "train") -> tuple[Task, ...]:
    """The tasks of ``split`` (``"train"``, ``"val"`` or ``"test"``)."""
    return pick_split(_splits(), split)


# --- parsing -------------------------------------------------------------------------------------

# Matched against the *reversed* text, so the first match is the last number of the message and
# the regular expression never looks at the text before it.
# Reversed, a thousands-separated "1,000" reads "000,1" and a minus sign follows the digits; the
# sign counts only when no word character or period stands before it ("5-3" is 5 then 3).
_LAST_INTEGER = re.compile(r"(?:\d{3},)+\d{1,3}(?![\d,])|\d+", re.ASCII)
_WORD_CHAR = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.")


def parse_guess(text: str) -> int | str:
    """The guess in an assistant reply: the last integer in it, or why there is none.

    Rules: ``<think>`` blocks are ignored; the guess is the last run of ASCII digits, optionally
    with a leading minus sign and thousands commas ("1,000"); a run that is the fraction part of
    a decimal ("37.5") is not an integer. Never raises, and never converts more than
    ``MAX_GUESS_DIGITS`` digits.

    Returns:
        The guess as an ``int``, or a ``str`` saying why the reply holds no usable guess.

    Example:
        >>> parse_guess("Between 40 and 60, so I guess 50.")
        50
        >>> parse_guess("no idea")
        'no integer found'
    """
    stripped = text.strip()
    if stripped.isdigit() and stripped.isascii() and len(stripped) <= MAX_GUESS_DIGITS:
        return int(stripped)  # the common case: the reply is just the number
    if "think>" in text:
        text = extract_answer(text)
    reversed_text = text[::-1]
    match = _LAST_INTEGER.search(reversed_text)
    if match is None:
        return "no integer found"
    end = match.end()
    after = reversed_text[end : end + 2]  # the two characters before the number, reversed
    digits = match.group()[::-1].replace(",", "")
    if len(after) == 2 and after[0] == "." and after[1].isdigit():
        return f"{digits[:MAX_GUESS_DIGITS]} is the fraction part of a decimal, not an integer"
    negative = after[:1] == "-" and after[1:2] not in _WORD_CHAR
    if len(digits) > MAX_GUESS_DIGITS:
        return f"{'-' if negative else ''}{digits[:MAX_GUESS_DIGITS]}... ({len(digits)} digits)"
    return -int(digits) if negative else int(digits)


# --- the per-turn reward -------------------------------------------------------------------------


def turn_reward(guess: int | None, secret: int, lo: int, hi: int) -> float:
    """The per-turn reward of one guess, given the still-possible secrets ``lo..hi``.

    ``SOLVE_REWARD`` for the secret; for a wrong guess, ``SHRINK_WEIGHT`` times the fraction of
    ``lo..hi`` it rules out (0.0 for a guess outside ``lo..hi``, which rules out nothing new);
    ``INVALID_GUESS_REWARD`` when the reply held no usable guess (``guess`` is None).

    Example:
        >>> turn_reward(50, 37, 1, 100)  # rules out 50..100: 51 of 100
        0.255
    """
    if guess is None:
        return INVALID_GUESS_REWARD
    if guess == secret:
        return SOLVE_REWARD
    if guess < lo or guess > hi:
        return 0.0
    ruled_out = guess - lo + 1 if guess < secret else hi - guess + 1
    return SHRINK_WEIGHT * ruled_out / (hi - lo + 1)


# --- the environment -----------------------------------------------------------------------------


class GuessNumberEnv(SyncEnv):
    """Find the secret integer of a range from "higher" / "lower" feedback.

    ## Description
    The task gives a range ``low..high`` (``task.metadata``) and a guess budget; the secret is
    ``task.target``. The budget is what binary search needs in the worst case plus
    ``BUDGET_SLACK``, so a halving strategy always wins.

    ## Action Space
    Plain text in the assistant message's content (no tools). The guess is the last integer in
    it (see :func:`parse_guess`). The env reads the raw text (``raw_text_actions``), so a reply
    is never a parse failure: a reply without a usable guess gets feedback saying what is allowed.

    ## Observation Space
    One user message per guess: ``Higher: ...`` / ``Lower: ...`` / ``Correct! ...``, or what was
    wrong with the reply, with the guesses left.

    ## Reward
    ``SOLVE_REWARD`` (1.0) when the secret is found within the budget, else 0.0.
    ``metrics["per_turn_rewards"]``: one value per assistant turn from :func:`turn_reward`.

    ## Episode End
    Terminated when the secret is guessed or the budget is spent (every reply counts, usable
    or not). ``max_turns`` is the current task's budget.

    ## Info
    Final metrics: ``per_turn_rewards``, ``guesses`` (replies), ``invalid_guesses``.

    ## Version History
    * v0: first release.
    """

    raw_text_actions: ClassVar[bool] = True
    """The env parses the assistant text itself (no tool-call parsing, no parse failures)."""
    max_tokens_per_turn: ClassVar[int] = 16
    """A reply is one guess ("My guess is 500." is 8 tokens); longer prose is cut there and
    read for its last integer."""

    def __init__(self) -> None:
        self._task: Task | None = None
        self._messages: list[Message] = []
        self._secret = 0
        self._low = self._high = 0
        self._lo = self._hi = 0
        self._turn = 0
        self._invalid = 0
        self._per_turn: list[tuple[int, int, int] | None] = []  # (guess, lo, hi) or invalid
        self._done = False
        self._range_hint = ""
        self.max_turns = 1
        """The current task's guess budget (the loop and ``TextEnv`` cap episodes at it)."""

    def reset_sync(self, task: Task) -> list[Message]:
        metadata = task.metadata
        secret = task.target
        try:
            low, high = metadata["low"], metadata["high"]
            budget = metadata.get("budget", binary_search_guesses(low, high) + BUDGET_SLACK)
        except (KeyError, TypeError) as exc:
            raise InvalidArgumentError(
                "A GuessNumber task needs metadata {'low': int, 'high': int} (optionally "
                f"'budget') and the secret as target; actual metadata: {dict(metadata)!r:.200}. "
                "make_task(low, high, secret) builds one."
            ) from exc
        if not all(type(v) is int for v in (low, high, secret, budget)) or not (
            low <= secret <= high and budget >= 1
        ):
            raise InvalidArgumentError(
                "Expected integers low <= target <= high and budget >= 1, actual values: "
                f"low={low!r}, high={high!r}, target={secret!r}, budget={budget!r}."
            )
        self._task = task
        self._secret, self._low, self._high = secret, low, high
        self._lo, self._hi = low, high
        self._turn = self._invalid = 0
        self._per_turn = []
        self._done = False
        self._range_hint = f"guess an integer between {low} and {high}, written in digits"
        self.max_turns = budget
        self._messages = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": task.prompt},
        ]
        return list(self._messages)

    def step_sync(self, message: Message) -> StepResult:
        if self._task is None or self._done:
            raise RuntimeError("No episode is running: call reset(task) first.")
        messages = self._messages
        messages.append(message)
        turn = self._turn = self._turn + 1
        if "tool_calls" in message:  # only a direct caller can send these; answer each one
            self._answer_tool_calls(message)
        content = message.get("content")
        if (
            type(content) is str
            and content.isdigit()
            and content.isascii()
            and len(content) <= MAX_GUESS_DIGITS
        ):
            guess: int | str = int(content)  # parse_guess's fast path, inlined: just digits
        else:
            guess = parse_guess(content) if isinstance(content, str) else "no text"
        secret = self._secret
        if type(guess) is int and self._low <= guess <= self._high:
            lo, hi = self._lo, self._hi
            self._per_turn.append((guess, lo, hi))  # scored by turn_reward when it ends
            if guess == secret:
                messages.append(
                    FrozenMessage(
                        role="user",
                        content=f"Correct! The secret is {secret}. Guesses used: {turn}.",
                    )
                )
                return self._finish(SOLVE_REWARD)
            if guess < secret:
                if guess >= lo:
                    self._lo = guess + 1
                feedback = f"Higher: the secret is greater than {guess}."
            else:
                if guess <= hi:
                    self._hi = guess - 1
                feedback = f"Lower: the secret is less than {guess}."
        else:
            self._invalid += 1
            self._per_turn.append(None)
            if type(guess) is int:
                feedback = f"{guess} is outside the range: {self._range_hint}."
            else:
                feedback = f"No usable guess ({guess}): {self._range_hint}."
        left = self.max_turns - turn
        if left > 0:
            plural = "es" if left > 1 else ""
            # Built read-only: TextEnv shares a FrozenMessage in its infos without copying it.
            messages.append(
                FrozenMessage(role="user", content=f"{feedback} {left} guess{plural} left.")
            )
            return StepResult(False, False, messages.copy(), 0.0, _NO_METRICS)
        messages.append(
            FrozenMessage(role="user", content=f"{feedback} No guesses left: it was {secret}.")
        )
        return self._finish(0.0)

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

    def _finish(self, reward: float) -> StepResult:
        self._done = True
        metrics: dict[str, Any] = {
            "per_turn_rewards": [
                INVALID_GUESS_REWARD if g is None else turn_reward(g[0], self._secret, g[1], g[2])
                for g in self._per_turn
            ],
            "guesses": self._turn,
            "invalid_guesses": self._invalid,
        }
        return StepResult(True, False, self._messages.copy(), reward, metrics)

    @property
    def tool_specs(self) -> list[ToolSpec]:
        return []

    @property
    def messages(self) -> list[Message]:
        return list(self._messages)


# --- the oracle ---------------------------------------------------------------------------------


def oracle_action(task: Task, messages: Sequence[Message]) -> Message:
    """The expert's next guess: binary search over the feedback in ``messages``.

    Replays every (assistant guess, feedback) pair of the conversation to narrow ``low..high``
    (from ``task.metadata``), then guesses the middle. Never reads ``task.target``.
    """
    lo, hi = task.metadata["low"], task.metadata["high"]
    for previous, reply in itertools.pairwise(messages):
        if previous.get("role") != "assistant" or reply.get("role") != "user":
            continue
        guess = parse_guess(previous.get("content") or "")
        feedback = reply.get("content") or ""
        if type(guess) is not int:
            continue
        if feedback.startswith("Higher"):
            lo = max(lo, guess + 1)
        elif feedback.startswith("Lower"):
            hi = min(hi, guess - 1)
    return Message(role="assistant", content=str((lo + hi) // 2))
