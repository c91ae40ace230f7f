"""A judge's rubric: weighted criteria, the score they give, and how a judge's reply is read.

A :class:`Rubric` is a list of :class:`Criterion` s, each a question the judge answers with
yes/no (``kind="yes_no"``) or a whole number from 0 to 10 (``kind="scale"``), and a weight. The
judged score of an episode is the weighted mean of the answers, each mapped onto [0, 1]
(yes = 1, no = 0, a scale answer ``v`` = ``v / 10``)::

    score = sum_k weight_k * value_k / sum_k weight_k

**Parse rules** (:func:`parse_verdict`, :func:`parse_group_verdicts`). The judge's reply is text
of at most ``max_chars`` characters (a longer one is refused unread). The JSON object in it is
the whole reply, else the first fenced code block, else the text from its first ``{`` to its
last ``}``. A verdict is an object with one key per criterion name (keys compare without case;
other keys, an ``explanation`` say, are ignored):

* a ``yes_no`` answer is ``true``/``false``, ``"yes"``/``"no"`` (any case) or the integers 1/0;
* a ``scale`` answer is a number (or a numeric string) in [0, 10]; fractions are kept.

A missing criterion, an answer of the wrong kind or out of range refuses the verdict
(:class:`JudgeReplyError`, naming the criterion and what came). A group's reply is an object
keyed by the attempt numbers ``"1"`` to ``"n"``, each a verdict; each attempt is read on its
own, so one malformed entry refuses only its attempt.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from llm_gym.errors import InvalidArgumentError

__all__ = [
    "CRITERION_KINDS",
    "Criterion",
    "JudgeReplyError",
    "Rubric",
    "extract_json",
    "parse_group_verdicts",
    "parse_verdict",
]

CRITERION_KINDS = ("yes_no", "scale")
"""The answers a criterion takes: yes/no, or a whole number from 0 to 10."""
SCALE_MAX = 10
"""The top of a ``scale`` criterion's answers."""
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
_YES = {"yes": 1.0, "true": 1.0, "no": 0.0, "false": 0.0}


class JudgeReplyError(InvalidArgumentError):
    """A judge's reply that the parse rules refuse (the module docstring); the episode it judged
    falls back as configured."""


@dataclass(frozen=True)
class Criterion:
    """One question of a rubric."""

    name: str
    """The key of its answer in the judge's reply (a Python-style identifier, at most 64
    characters)."""
    question: str
    """What the judge decides, in words."""
    kind: str = "yes_no"
    """``yes_no`` or ``scale`` (0 to 10)."""
    weight: float = 1.0
    """Its share of the score (a finite number > 0)."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise InvalidArgumentError(
                "A criterion's name must be an identifier of letters, digits and _ (at most 64 "
                f"characters, not starting with a digit), actual value: {self.name!r:.80}."
            )
        if not isinstance(self.question, str) or not self.question.strip():
            raise InvalidArgumentError(
                f"Criterion {self.name!r} needs a question (non-empty text), actual value: "
                f"{self.question!r:.80}."
            )
        if self.kind not in CRITERION_KINDS:
            raise InvalidArgumentError(
                f"Criterion {self.name!r}: kind must be one of {list(CRITERION_KINDS)}, actual "
                f"value: {self.kind!r:.40}."
            )
        weight = self.weight
        if (
            isinstance(weight, bool)
            or not isinstance(weight, int | float)
            or not (math.isfinite(weight) and weight > 0)
        ):
            raise InvalidArgumentError(
                f"Criterion {self.name!r}: weight must be a finite number > 0, actual value: "
                f"{weight!r:.40}."
            )
        object.__setattr__(self, "weight", float(weight))

    def value(self, answer: Any) -> float:
        """The answer mapped onto [0, 1]; :class:`JudgeReplyError` when the parse rules refuse it.

        Example:
            >>> Criterion("clear", "Is it clear?", kind="scale").value("7")
            0.7
            >>> Criterion("polite", "Is it polite?").value("Yes")
            1.0
        """
        where = f"criterion {self.name!r}"
        if self.kind == "yes_no":
            if isinstance(answer, bool):
                return float(answer)
            if isinstance(answer, int) and answer in (0, 1):
                return float(answer)
            if isinstance(answer, str) and answer.strip().lower() in _YES:
                return _YES[answer.strip().lower()]
            raise JudgeReplyError(
                f"The judge answered {where} with {answer!r:.60}; expected true/false, "
                "yes/no or 1/0."
            )
        number: Any = answer
        if isinstance(answer, str) and len(answer) <= 32:
            try:
                number = float(answer.strip())
            except ValueError:
                number = answer
        if isinstance(number, bool) or not isinstance(number, int | float):
            raise JudgeReplyError(
                f"The judge answered {where} with {answer!r:.60}; expected a number from 0 to "
                f"{SCALE_MAX}."
            )
        if not 0 <= number <= SCALE_MAX:  # NaN fails too; a huge int compares exactly
            raise JudgeReplyError(
                f"The judge answered {where} with {answer!r:.60}, out of range; expected a "
                f"number from 0 to {SCALE_MAX}."
            )
        return float(number) / SCALE_MAX

    def schema(self) -> dict[str, Any]:
        """The JSON schema of its answer (what a structured-output endpoint enforces)."""
        if self.kind == "yes_no":
            return {"type": "boolean"}
        return {"type": "integer", "minimum": 0, "maximum": SCALE_MAX}

    def describe(self) -> str:
        """Its line in the judge's prompt."""
        kind = "yes/no" if self.kind == "yes_no" else f"0-{SCALE_MAX}"
        return f"- {self.name} ({kind}, weight {self.weight:g}): {self.question.strip()}"


@dataclass(frozen=True)
class Rubric:
    """Weighted criteria (see the module docstring)."""

    criteria: tuple[Criterion, ...]
    """The questions, in the order the prompt lists them; names are unique."""

    def __post_init__(self) -> None:
        if not self.criteria:
            raise InvalidArgumentError("A rubric needs at least one criterion, actual value: [].")
        names = [c.name.lower() for c in self.criteria]
        if len(set(names)) != len(names):
            raise InvalidArgumentError(
                f"A rubric's criterion names must be unique (without case), actual value: "
                f"{[c.name for c in self.criteria]!r:.200}."
            )

    @classmethod
    def of(cls, spec: Any) -> Rubric:
        """A rubric from a config: a :class:`Rubric`, or a list whose items are
        :class:`Criterion` s, mappings of its fields or plain questions (yes/no, weight 1,
        named ``c1``, ``c2``, ...).

        Example:
            >>> Rubric.of(["Is it polite?", {"name": "clear", "question": "Clear?",
            ...            "kind": "scale", "weight": 2}]).score({"c1": 1.0, "clear": 0.7})
            0.8
        """
        if isinstance(spec, Rubric):
            return spec
        if isinstance(spec, str | bytes | Mapping) or not isinstance(spec, Sequence):
            raise InvalidArgumentError(
                "rubric must be a list of criteria ({'name', 'question', 'kind': 'yes_no' | "
                f"'scale', 'weight'}} or a question), actual value: {spec!r:.120}."
            )
        criteria = []
        for i, item in enumerate(spec):
            if isinstance(item, Criterion):
                criteria.append(item)
            elif isinstance(item, str):
                criteria.append(Criterion(f"c{i + 1}", item))
            elif isinstance(item, Mapping):
                unknown = set(item) - {"name", "question", "kind", "weight"}
                if unknown:
                    raise InvalidArgumentError(
                        f"rubric[{i}] has unknown keys {sorted(map(str, unknown))}; a criterion "
                        "takes name, question, kind (yes_no or scale) and weight."
                    )
                criteria.append(Criterion(**{"name": f"c{i + 1}", **item}))
            else:
                raise InvalidArgumentError(
                    f"rubric[{i}] must be a mapping or a question, actual value: {item!r:.80}."
                )
        return cls(tuple(criteria))

    def score(self, values: Mapping[str, float]) -> float:
        """The weighted mean of the answers' values (each in [0, 1]), by criterion name.

        Example:
            >>> rubric = Rubric.of([{"name": "a", "question": "A?", "weight": 3},
            ...                     {"name": "b", "question": "B?", "kind": "scale"}])
            >>> rubric.score({"a": 1.0, "b": 0.2})  # (3 * 1 + 1 * 0.2) / 4
            0.8
        """
        total = sum(c.weight for c in self.criteria)
        return round(sum(c.weight * values[c.name] for c in self.criteria) / total, 12)

    def schema(self) -> dict[str, Any]:
        """The JSON schema of one verdict."""
        return {
            "type": "object",
            "properties": {c.name: c.schema() for c in self.criteria},
            "required": [c.name for c in self.criteria],
        }

    def group_schema(self, n: int) -> dict[str, Any]:
        """The JSON schema of a group's reply: attempts ``"1"`` to ``"n"``, each a verdict."""
        keys = [str(i + 1) for i in range(n)]
        return {
            "type": "object",
            "properties": {key: self.schema() for key in keys},
            "required": keys,
        }

    def example(self) -> str:
        """A verdict as the prompt shows it."""
        return json.dumps({c.name: True if c.kind == "yes_no" else 7 for c in self.criteria})


def extract_json(text: Any, max_chars: int) -> Any:
    """The JSON value of a judge's reply by the parse rules (the module docstring).

    Example:
        >>> extract_json('Sure.\\n```json\\n{"polite": true}\\n```', 1000)
        {'polite': True}
    """
    if not isinstance(text, str):
        raise JudgeReplyError(f"The judge's reply is {type(text).__name__}, not text.")
    if len(text) > max_chars:
        raise JudgeReplyError(
            f"The judge's reply has {len(text)} characters, over the {max_chars} read; raise "
            "max_reply_chars or ask for less (max_tokens)."
        )
    candidates = [text.strip()]
    fenced = re.search(r"```(?:json)?\s*(.*?)```", text, re.DOTALL)
    if fenced:
        candidates.append(fenced.group(1).strip())
    start, end = text.find("{"), text.rfind("}")
    if 0 <= start < end:
        candidates.append(text[start : end + 1])
    for candidate in candidates:
        try:
            return json.loads(candidate)
        except (ValueError, RecursionError):
            continue
    raise JudgeReplyError(f"The judge's reply holds no JSON object: {text[:80]!r}.")


def _verdict(obj: Any, rubric: Rubric, where: str) -> dict[str, float]:
    if not isinstance(obj, Mapping):
        raise JudgeReplyError(
            f"{where} is {type(obj).__name__}, not an object of criterion answers."
        )
    answers = {str(k).lower(): v for k, v in obj.items()}
    values = {}
    for criterion in rubric.criteria:
        key = criterion.name.lower()
        if key not in answers:
            raise JudgeReplyError(f"{where} has no answer for criterion {criterion.name!r}.")
        values[criterion.name] = criterion.value(answers[key])
    return values


def parse_verdict(text: Any, rubric: Rubric, max_chars: int = 20_000) -> dict[str, float]:
    """The value in [0, 1] of each criterion, from one episode's reply (the parse rules).

    Example:
        >>> rubric = Rubric.of([{"name": "ok", "question": "OK?"}])
        >>> parse_verdict('{"ok": "no", "explanation": "rude"}', rubric)
        {'ok': 0.0}
    """
    return _verdict(extract_json(text, max_chars), rubric, "The judge's verdict")


def parse_group_verdicts(
    text: Any, rubric: Rubric, n: int, max_chars: int = 20_000
) -> list[dict[str, float] | JudgeReplyError]:
    """Each attempt's values from a group's reply (keys ``"1"`` to ``"n"``), or the reason its
    entry was refused; a reply that is not such an object refuses all of them.

    Example:
        >>> rubric = Rubric.of([{"name": "ok", "question": "OK?"}])
        >>> parse_group_verdicts('{"1": {"ok": true}, "2": {"ok": 5}}', rubric, 2)[0]
        {'ok': 1.0}
    """
    obj = extract_json(text, max_chars)
    if not isinstance(obj, Mapping):
        raise JudgeReplyError(
            f"The judge's group reply is {type(obj).__name__}, not an object keyed by attempt."
        )
    entries = {str(k).strip(): v for k, v in obj.items()}
    out: list[dict[str, float] | JudgeReplyError] = []
    for i in range(1, n + 1):
        if str(i) not in entries:
            out.append(JudgeReplyError(f"The judge's group reply has no entry for attempt {i}."))
            continue
        try:
            out.append(_verdict(entries[str(i)], rubric, f"The judge's verdict on attempt {i}"))
        except JudgeReplyError as exc:
            out.append(exc)
    return out
