"""ToolUseGame: answer questions about a fictional country's towns with three tools.

The reference environment of the seeds (``ToolUseGameEnv`` with ``list_fact_keys``, ``lookup``
and ``calculator``). The module reads top to bottom: constants, the fact table, the seeded task
generator, the tools, the environment and its oracle.
"""

from __future__ import annotations

import difflib
import functools
import random
from collections.abc import Sequence
from typing import Any

from llm_gym.core.task import Task, cut_splits, distinct_tasks, pick_split
from llm_gym.core.tool import tool
from llm_gym.core.tool_env import ToolEnv
from llm_gym.core.types import Message, ToolCall
from llm_gym.errors import ToolArgumentError
from llm_gym.tools.arithmetic import format_number, safe_eval
from llm_gym.tools.calculator import CalculatorTool

__all__ = [
    "ATTRIBUTES",
    "FACTS",
    "SPLIT_SIZES",
    "SYSTEM_PROMPT",
    "TOOL_USE_GAME_TASKS",
    "TOWNS",
    "VERSION",
    "ToolUseGameEnv",
    "generate_tasks",
    "get_tasks",
    "list_fact_keys",
    "lookup",
    "oracle_action",
]

# --- constants -----------------------------------------------------------------------------------

VERSION = "0"
"""Bumped whenever tasks, tools or rewards change (records carry it)."""

SYSTEM_PROMPT = (
    "You answer questions about the towns of a fictional country. You cannot know the facts: "
    "look them up. Fact keys have the form 'Town.attribute', for example 'Velmora.population' "
    "(list_fact_keys lists them). Use lookup to read facts and calculator for arithmetic. "
    "When you know the answer, reply with only the answer: a number, or a town's name when the "
    "question asks which town."
)

TOWNS = (
    "Velmora",
    "Tarsk",
    "Quillon",
    "Brennick",
    "Ostava",
    "Marrowby",
    "Caldris",
    "Fenwick",
    "Lunhaven",
    "Drossel",
    "Ysolde",
    "Harrowgate",
    "Kestrel",
    "Pellow",
    "Vantis",
    "Corwen",
    "Elderby",
    "Mistral",
    "Thornbury",
    "Ashvale",
    "Rookmere",
    "Galen",
    "Saltmarsh",
    "Wyncliff",
)

ATTRIBUTES: dict[str, tuple[str, int, int]] = {
    # attribute: (noun phrase, low, high). Each key word appears in its phrase, so a model can
    # build a key by copying words of the question ("the area in square kilometres of Tarsk"
    # -> "Tarsk.area").
    "population": ("population", 2_000, 500_000),
    "founding_year": ("founding year", 1100, 1950),
    "area": ("area in square kilometres", 5, 900),
    "elevation": ("elevation in metres", 0, 2500),
    "schools": ("number of schools", 1, 120),
    "bridges": ("number of bridges", 0, 40),
}

SPLIT_SIZES = {"train": 1000, "val": 200, "test": 200}
"""Tasks per split; the splits are disjoint (no prompt appears in two)."""
TASK_SEED = 20261130
"""Seed of the task universe: the same seed always gives the same tasks in the same splits."""
MAX_LISTED_KEYS = 200


def _build_facts(seed: int = 7) -> dict[str, int]:
    rng = random.Random(seed)
    return {
        f"{town}.{attribute}": rng.randint(low, high)
        for town in TOWNS
        for attribute, (_, low, high) in ATTRIBUTES.items()
    }


FACTS: dict[str, int] = _build_facts()
"""The fact table: ``"Town.attribute" -> int`` (``lookup`` ignores case)."""
_FACTS_BY_LOWER_KEY = {key.lower(): value for key, value in FACTS.items()}
_KEYS_BY_LOWER_KEY = {key.lower(): key for key in FACTS}


# --- the seeded task generator -----------------------------------------------------------------


def _key(town: str, attribute: str) -> str:
    return f"{town}.{attribute}"


def _phrase(town: str, attribute: str) -> str:
    return f"the {ATTRIBUTES[attribute][0]} of {town}"


_OPS = {"plus": "+", "minus": "-", "times": "*"}


def _apply(op: str, a: int, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


def _one_task(rng: random.Random) -> Task:
    kind = rng.choices(["lookup", "lookup_arith", "compare", "chain"], weights=[2, 3, 2, 3])[0]
    attribute = rng.choice(list(ATTRIBUTES))
    towns = rng.sample(TOWNS, 3)
    a, b, c = towns
    if kind == "lookup":
        keys, expression = [_key(a, attribute)], None
        prompt = f"What is {_phrase(a, attribute)}?"
        target: Any = FACTS[keys[0]]
    elif kind == "lookup_arith":
        word = rng.choice(list(_OPS))
        n = rng.randint(2, 9) if word == "times" else rng.randint(2, 999)
        keys = [_key(a, attribute)]
        expression = f"{{0}} {_OPS[word]} {n}"
        prompt = f"What is {_phrase(a, attribute)} {word} {n}?"
        target = _apply(_OPS[word], FACTS[keys[0]], n)
    elif kind == "compare":
        keys = [_key(a, attribute), _key(b, attribute)]
        if FACTS[keys[0]] == FACTS[keys[1]]:
            return _one_task(rng)
        expression = None
        prompt = (
            f"Which town has the larger {ATTRIBUTES[attribute][0]}, {a} or {b}? "
            "Reply with the town's name."
        )
        target = a if FACTS[keys[0]] > FACTS[keys[1]] else b
    else:
        variant = rng.choice(["sum2", "diff2", "sum3", "sum2_times"])
        if variant == "sum3":
            keys = [_key(t, attribute) for t in towns]
            expression = "{0} + {1} + {2}"
            prompt = f"What is the total {ATTRIBUTES[attribute][0]} of {a}, {b} and {c}?"
        else:
            other = rng.choice(list(ATTRIBUTES))
            keys = [_key(a, attribute), _key(b, other)]
            if variant == "diff2":
                expression = "{0} - {1}"
                prompt = f"What is {_phrase(a, attribute)} minus {_phrase(b, other)}?"
            elif variant == "sum2":
                expression = "{0} + {1}"
                prompt = f"What is {_phrase(a, attribute)} plus {_phrase(b, other)}?"
            else:
                n = rng.randint(2, 9)
                expression = f"({{0}} + {{1}}) * {n}"
                prompt = f"What is {_phrase(a, attribute)} plus {_phrase(b, other)}, times {n}?"
        values = [FACTS[k] for k in keys]
        target = _evaluate_plan(expression, values)
        kind = f"chain_{variant}"
    metadata = {"type": kind, "keys": keys, "expression": expression}
    return Task(prompt=prompt, target=target, metadata=metadata)


def _evaluate_plan(expression: str, values: Sequence[int]) -> int:
    result = safe_eval(expression.format(*values))
    return int(result)


def generate_tasks(seed: int, n: int) -> list[Task]:
    """``n`` distinct tasks (no two share a prompt) drawn from a ``random.Random(seed)``.

    A pure function of its arguments: the same seed always gives the same list.
    """
    rng = random.Random(seed)
    return distinct_tasks(lambda: _one_task(rng), n)


@functools.cache
def _splits() -> dict[str, tuple[Task, ...]]:
    universe = generate_tasks(TASK_SEED, sum(SPLIT_SIZES.values()))
    return cut_splits(universe, SPLIT_SIZES, "tool_use_game")


def get_tasks(split: str = "train") -> tuple[Task, ...]:
    """The tasks of ``split`` (``"train"``, ``"val"`` or ``"test"``)."""
    return pick_split(_splits(), split)


TOOL_USE_GAME_TASKS: tuple[Task, ...] = get_tasks("train")
"""The training tasks (the seeds' bundled task list)."""


# --- tools ---------------------------------------------------------------------------------------


@tool
def list_fact_keys(prefix: str = "") -> str:
    """List the keys of the fact table, one per line.

    Args:
        prefix: Only list keys that start with this text, for example 'Velmora.'.
    """
    keys = [k for k in FACTS if k.lower().startswith(prefix.lower())]
    if not keys:
        return f"no keys start with {prefix[:80]!r}"
    shown = keys[:MAX_LISTED_KEYS]
    more = len(keys) - len(shown)
    return "\n".join(shown) + (f"\n... and {more} more (use a prefix)" if more else "")


@tool
def lookup(key: str) -> str:
    """Look up one fact by its key.

    Args:
        key: A fact key of the form 'Town.attribute', for example 'Velmora.population'.
    """
    normalized = key.strip().lower()
    if normalized in _FACTS_BY_LOWER_KEY:
        return str(_FACTS_BY_LOWER_KEY[normalized])
    close = difflib.get_close_matches(normalized, list(_KEYS_BY_LOWER_KEY), n=3)
    suggestions = [_KEYS_BY_LOWER_KEY[c] for c in close]
    hint = f" Did you mean {', '.join(repr(c) for c in suggestions)}?" if close else ""
    raise ToolArgumentError(f"unknown key {key[:80]!r}.{hint} list_fact_keys lists every key.")


# --- the environment ------------------------------------------------------------------------------


class ToolUseGameEnv(ToolEnv):
    """Answer a question about the fact table using ``list_fact_keys``, ``lookup``, ``calculator``.

    ## Reward
    1.0 when the final reply matches the target (numbers within a relative tolerance of 1e-6,
    thousands separators and a trailing period ignored; town names case-insensitively), else 0.0.

    ## Episode End
    Terminated by a reply without tool calls (the final answer).
    """

    system_prompt = SYSTEM_PROMPT
    tools = (list_fact_keys, lookup, CalculatorTool())

    def metrics(self, answer: str | None, task: Task) -> dict[str, Any]:
        return {"answered": answer is not None}


# --- the oracle ---------------------------------------------------------------------------------


def _call(index: int, name: str, arguments: dict[str, Any]) -> ToolCall:
    import json

    return {
        "id": f"oracle_{index}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


def oracle_action(task: Task, messages: Sequence[Message]) -> Message:
    """The expert's next assistant message: look up every fact, compute, answer.

    Reads the values from the tool results in ``messages`` (never from the task's target).
    """
    keys: list[str] = list(task.metadata["keys"])
    expression: str | None = task.metadata.get("expression")
    looked_up = [
        m["content"] for m in messages if m.get("role") == "tool" and m.get("name") == "lookup"
    ]
    computed = [
        m["content"] for m in messages if m.get("role") == "tool" and m.get("name") == "calculator"
    ]
    if len(looked_up) < len(keys):
        calls = [_call(i, "lookup", {"key": key}) for i, key in enumerate(keys)]
        return Message(role="assistant", content="", tool_calls=calls)
    values = [int(v) for v in looked_up[-len(keys) :]]
    if task.metadata["type"] == "compare":
        a_town, b_town = (k.split(".")[0] for k in keys)
        answer = a_town if values[0] > values[1] else b_town
        return Message(role="assistant", content=answer)
    if expression is not None and not computed:
        calls = [_call(0, "calculator", {"expression": expression.format(*values)})]
        return Message(role="assistant", content="", tool_calls=calls)
    answer = computed[-1] if computed else format_number(values[0])
    return Message(role="assistant", content=answer)
