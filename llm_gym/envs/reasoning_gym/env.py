"""ReasoningGym: one reasoning-gym question per episode, scored by reasoning-gym's own scorer.

The module reads top to bottom: constants (the system prompt, the answer tags, limits), answer
extraction (a pure function that never raises), scoring (the dataset's ``score_answer``, bounded
and contained), the environment (one answer, or several with feedback between them) and its
oracle. The tasks come from :mod:`llm_gym.envs.reasoning_gym.tasks`.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from llm_gym.core.env import StepResult, SyncEnv
from llm_gym.core.task import Task
from llm_gym.core.tool_env import extract_answer
from llm_gym.core.types import Message, ToolSpec
from llm_gym.envs.reasoning_gym.tasks import (
    DEFAULT_MAX_ATTEMPTS,
    MAX_ATTEMPTS_LIMIT,
    check_dataset,
    config_key,
    make_dataset,
)
from llm_gym.errors import InvalidArgumentError

__all__ = [
    "ANSWER_CLOSE",
    "ANSWER_OPEN",
    "MAX_ANSWER_CHARS",
    "SYSTEM_PROMPT",
    "VERSION",
    "ReasoningGymEnv",
    "Score",
    "dataset_scorer",
    "oracle_action",
    "parse_answer",
    "score_answer",
]

# --- constants ------------------------------------------------------------------------------------

VERSION = "0"
"""Bumped whenever tasks, prompts, feedback or rewards change (records carry it)."""

SYSTEM_PROMPT = """Given a problem, your task is to answer the question by thinking step-by-step in a clear and specific manner.
Once you have thought about the reasoning process, provide the answer in the following format:
<answer>answer here</answer>
Do not explain your reasoning inside the answer tags, provide only the final answer. When an example is provided, you should strictly follow the format of the output/answer in that example.
"""  # noqa: E501  (reasoning-gym's ``SYSTEM_PROMPTS["default"]``, verbatim; a test holds them equal)
"""The system prompt: reasoning-gym's own default, so scores compare with its published ones."""

ANSWER_OPEN = "<answer>"
ANSWER_CLOSE = "</answer>"
MAX_ANSWER_CHARS = 10_000
"""An extracted answer longer than this scores 0.0 without reaching the scorer (reasoning-gym's
answers are far shorter; its scorers were not written for megabytes of hostile text)."""
MAX_QUOTE_CHARS = 200
"""How much of a wrong answer the feedback quotes."""

# --- answer extraction ----------------------------------------------------------------------------


def parse_answer(text: str) -> tuple[str, str]:
    """The answer in an assistant reply and where it was found; never raises, linear time.

    ``<think>`` blocks are dropped first. Then the answer is what follows the last ``<answer>``,
    up to the next ``</answer>`` (``"tag"``) or to the end when none closes it (``"open_tag"``: a
    generation stopped at ``</answer>``); a reply without ``<answer>`` is the answer as a whole
    (``"reply"``). The answer is stripped of surrounding whitespace.

    Example:
        >>> parse_answer("<think>2 + 2</think>It is <answer> 4 </answer>.")
        ('4', 'tag')
        >>> parse_answer("<answer>4")
        ('4', 'open_tag')
        >>> parse_answer("  four ")
        ('four', 'reply')
    """
    if "think>" in text:
        text = extract_answer(text)
    start = text.rfind(ANSWER_OPEN)
    if start == -1:
        return text.strip(), "reply"
    start += len(ANSWER_OPEN)
    end = text.find(ANSWER_CLOSE, start)
    if end == -1:
        return text[start:].strip(), "open_tag"
    return text[start:end].strip(), "tag"


# --- scoring --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Score:
    """reasoning-gym's verdict on one answer."""

    value: float
    """The dataset's score in [0, 1] (1.0: accepted); 0.0 when the scorer could not run."""
    error: str | None = None
    """Why the scorer was not asked or failed (the answer too long, the scorer raised or
    returned no finite number); None when it scored."""


@functools.lru_cache(maxsize=256)
def dataset_scorer(dataset: str, config: str) -> Any:
    """The bound ``score_answer(answer, entry)`` of reasoning-gym's ``dataset`` built with the
    JSON ``config`` (built once per pair). Only an offered dataset's (``check_dataset``: its
    scorer is the base one or a reviewed one), whatever the task says, and only with a config
    that reasoning-gym builds within the generation time limit (``config_key``)."""
    try:
        fields = json.loads(config)
    except ValueError:
        fields = config  # not JSON: config_key refuses it by name
    config = config_key(check_dataset(dataset), fields)
    return make_dataset(dataset, config, seed=0, size=1).score_answer


def score_answer(answer: str, entry: Mapping[str, Any], dataset: str, config: str = "{}") -> Score:
    """reasoning-gym's score of ``answer`` for ``entry``: the dataset's own ``score_answer``.

    Contained: an answer over :data:`MAX_ANSWER_CHARS` scores 0.0 unasked; a scorer that raises
    (``prime_factorization`` does on text that is not a product) or returns a non-finite value
    scores 0.0; either way :attr:`Score.error` says why.

    Example:
        >>> entry = {"question": "What is 2 + 2?", "answer": "4", "metadata": {}}
        >>> score_answer("4", entry, "basic_arithmetic").value
        1.0
        >>> round(score_answer("The answer is 4", entry, "basic_arithmetic").value, 4)  # 1 / 15
        0.0667
    """
    if len(answer) > MAX_ANSWER_CHARS:
        return Score(0.0, f"answer of {len(answer):,} characters, over {MAX_ANSWER_CHARS:,}")
    scorer = dataset_scorer(dataset, config)
    try:
        value = float(scorer(answer, dict(entry)))
    except Exception as exc:  # a scorer on hostile text: the answer is wrong, the run goes on
        return Score(0.0, f"scorer raised {type(exc).__name__}: {str(exc)[:200]}")
    if not math.isfinite(value):
        return Score(0.0, f"scorer returned {value!r}")
    return Score(value)


# --- the environment ------------------------------------------------------------------------------


def _task_setup(task: Task) -> tuple[str, str, dict[str, Any], int, bool]:
    """``(dataset, config, entry, max_attempts, partial_credit)`` of a task, checked."""
    metadata = task.metadata
    dataset = check_dataset(metadata.get("dataset"))
    config = config_key(dataset, metadata.get("config"))
    entry = metadata.get("entry")
    if entry is None and task.target is not None:  # a hand-made task: question and answer
        entry = {"question": task.prompt, "answer": str(task.target), "metadata": {}}
    if not isinstance(entry, Mapping) or not isinstance(entry.get("answer"), str):
        raise InvalidArgumentError(
            "A ReasoningGym task needs metadata['entry'] (reasoning-gym's entry: question, answer, "
            f"metadata) or a target; actual entry: {entry!r:.200}. get_tasks() builds them."
        )
    attempts = metadata.get("max_attempts", DEFAULT_MAX_ATTEMPTS)
    if isinstance(attempts, bool) or not isinstance(attempts, int):
        attempts = -1
    if not 1 <= attempts <= MAX_ATTEMPTS_LIMIT:
        raise InvalidArgumentError(
            f"metadata['max_attempts'] must be an int in [1, {MAX_ATTEMPTS_LIMIT}], actual "
            f"value: {metadata.get('max_attempts')!r:.80}."
        )
    partial = metadata.get("partial_credit", True)
    if not isinstance(partial, bool):
        raise InvalidArgumentError(
            f"metadata['partial_credit'] must be true or false, actual value: {partial!r:.80}."
        )
    return dataset, config, dict(entry), attempts, partial


def _quote(answer: str) -> str:
    return repr(answer if len(answer) <= MAX_QUOTE_CHARS else answer[:MAX_QUOTE_CHARS] + "...")


class ReasoningGymEnv(SyncEnv):
    """Answer one reasoning-gym question; reasoning-gym's scorer gives the reward.

    ## Description
    The task is one entry of a reasoning-gym dataset (``task.metadata``: ``dataset``,
    ``config``, ``entry``, ``max_attempts``). The system prompt is reasoning-gym's default one:
    think step by step, then give the answer as ``<answer>...</answer>``.

    ## Action Space
    Plain text (no tools). The answer is read by :func:`parse_answer`: the last
    ``<answer>...</answer>`` block (``<think>`` blocks ignored; an unclosed last ``<answer>``
    runs to the end), or the whole reply when it has none. The env reads the raw text
    (``raw_text_actions``), so no reply is a parse failure.

    ## Observation Space
    After a rejected answer with attempts left, one user message: that the answer was not
    accepted, its score, the attempts left and the answer format. Nothing after the last one.

    ## Reward
    reasoning-gym's score (the dataset's own ``score_answer(answer, entry)``, in [0, 1]) of the
    episode's final answer: the first answer that scores 1.0 (accepted: the episode ends), else
    the answer given on the last attempt, partial credit as it is (an earlier, better partial
    answer does not count). An answer over :data:`MAX_ANSWER_CHARS`, or one the scorer raises
    on, scores 0.0. When the run's turn limit or context cuts the episode first, the reward is
    the score of the last answer given (0.0 if none).

    ## Episode End
    Terminated when an answer scores 1.0 or ``max_attempts`` answers have been given
    (``max_turns`` is the task's ``max_attempts``; 1 by default: a single-turn episode).

    ## Info
    Final metrics: ``attempts``, ``solved`` (1.0 when an answer was accepted), ``first_score``
    (the first answer's score), ``tagged`` (1.0 when the final answer came in ``<answer>``
    tags), ``unscored`` (answers the scorer did not score: too long, or it raised).

    ## Version History
    * v0: first release.
    """

    raw_text_actions: ClassVar[bool] = True
    """The env parses the assistant text itself (no tool calls, no parse failures)."""
    max_tokens_per_turn: ClassVar[int] = 256
    """A reply reasons step by step (reasoning-gym's own prompt asks for it) before its
    ``<answer>`` tag."""

    def __init__(self) -> None:
        self._task: Task | None = None
        self._messages: list[Message] = []
        self._dataset = ""
        self._config = "{}"
        self._entry: dict[str, Any] = {}
        self._scores: list[float] = []
        self._errors = 0
        self._partial = True
        self._tagged = False
        self._done = False
        self.max_turns = DEFAULT_MAX_ATTEMPTS
        """The current task's ``max_attempts`` (the loop and ``TextEnv`` cap episodes at it)."""

    @property
    def tool_specs(self) -> list[ToolSpec]:
        return []

    @property
    def messages(self) -> list[Message]:
        return list(self._messages)

    def reset_sync(self, task: Task) -> list[Message]:
        setup = _task_setup(task)
        self._dataset, self._config, self._entry, self.max_turns, self._partial = setup
        self._task = task
        self._scores, self._errors, self._tagged, self._done = [], 0, False, False
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
        for call in message.get("tool_calls") or []:  # only a direct caller can send these
            messages.append(
                {
                    "role": "tool",
                    "content": "tool_error: this environment has no tools; give your answer as "
                    "<answer>...</answer> in your reply.",
                    "tool_call_id": str(call.get("id", "") if isinstance(call, Mapping) else ""),
                }
            )
        content = message.get("content")
        answer, where = parse_answer(content) if isinstance(content, str) else ("", "reply")
        score = score_answer(answer, self._entry, self._dataset, self._config)
        self._scores.append(score.value)
        self._errors += score.error is not None
        self._tagged = where != "reply"
        left = self.max_turns - len(self._scores)
        if score.value >= 1.0 or left <= 0:
            self._done = True
            return StepResult(True, False, list(messages), self._reward(), self._metrics())
        if not answer:
            feedback = "No answer found in your reply."
        else:
            feedback = (
                f"Your answer {_quote(answer)} is not correct (reasoning-gym scored it "
                f"{score.value:.2f} out of 1)."
            )
        plural = "s" if left > 1 else ""
        messages.append(
            {
                "role": "user",
                "content": f"{feedback} Try again: {left} attempt{plural} left. Give your final "
                f"answer as {ANSWER_OPEN}...{ANSWER_CLOSE}.",
            }
        )
        return StepResult(False, False, list(messages), 0.0, {})

    async def conclude(self, cause: str) -> StepResult:
        """The score of the last answer when the run cut the episode short (turn limit or
        context): the final answer is the last one given."""
        return StepResult(False, True, list(self._messages), self._reward(), self._metrics())

    def _reward(self) -> float:
        """The last answer's score (0.0 without one); without partial credit 1.0 or 0.0."""
        score = self._scores[-1] if self._scores else 0.0
        return score if self._partial else float(score >= 1.0)

    def _metrics(self) -> dict[str, Any]:
        scores = self._scores
        return {
            "attempts": len(scores),
            "solved": 1.0 if scores and scores[-1] >= 1.0 else 0.0,
            "first_score": scores[0] if scores else 0.0,
            "tagged": 1.0 if self._tagged else 0.0,
            "unscored": self._errors,
        }


# --- the oracle -----------------------------------------------------------------------------------


def oracle_action(task: Task, messages: Sequence[Message]) -> Message:
    """The expert's reply: reasoning-gym's gold answer (the entry's ``answer``) in answer tags.

    Unlike the other envs' oracles it reads the task's answer: a generated question has no other
    solver. It scores 1.0 whenever the dataset's scorer accepts its own answer (every family
    registered with its own id does, on every task; a test checks it).
    """
    entry = task.metadata.get("entry")
    answer = entry.get("answer") if isinstance(entry, Mapping) else task.target
    return Message(role="assistant", content=f"{ANSWER_OPEN}{answer}{ANSWER_CLOSE}")
