"""Math: arithmetic word problems solved with a calculator tool, scored on the exact answer.

The seeds' ``MathEnv`` (documents 000 and 001) made a real environment: a seeded generator of
word problems in four families (shopping, rates, sharing, multi-step), each with an arithmetic
plan kept in ``task.metadata["expression"]`` and an exact answer (an integer or a terminating
decimal). The module reads top to bottom: constants, the exact evaluator, the task templates, the
seeded generator and its splits, the environment, its oracle.
"""

from __future__ import annotations

import ast
import functools
import json
import random
from collections.abc import Callable, Sequence
from decimal import Decimal
from fractions import Fraction
from typing import Any

from llm_gym.core.task import Task, cut_splits, distinct_tasks, pick_split
from llm_gym.core.tool_env import ToolEnv, answers_match
from llm_gym.core.types import Message, ToolCall
from llm_gym.errors import InvalidArgumentError
from llm_gym.tools.calculator import CalculatorTool

__all__ = [
    "ANSWER_ABS_TOL",
    "MAX_ANSWER_DECIMALS",
    "SPLIT_SIZES",
    "SYSTEM_PROMPT",
    "TEMPLATES",
    "VERSION",
    "MathEnv",
    "canonical_answer",
    "exact_value",
    "generate_tasks",
    "get_tasks",
    "oracle_action",
]

# --- constants ------------------------------------------------------------------------------------

VERSION = "0"
"""Bumped whenever tasks, tools or rewards change (records carry it)."""

SYSTEM_PROMPT = (
    "Solve the word problem. Use the calculator tool for the arithmetic, then reply with only "
    "the final number: no words, no units, no currency sign (for $12.50 reply 12.5)."
)

SPLIT_SIZES = {"train": 2000, "val": 200, "test": 200}
"""Tasks per split; the splits are disjoint (no prompt appears in two)."""
TASK_SEED = 20261207
"""Seed of the task universe: the same seed always gives the same tasks in the same splits."""

MAX_ANSWER_DECIMALS = 4
"""Answers are integers or terminating decimals with at most this many decimal places."""
ANSWER_ABS_TOL = 1e-9
"""A reply matches when it is within this of the exact answer (no relative tolerance): far below
the answers' last decimal place, so only the exact value (in any spelling: ``12.5``, ``12.50``,
``1,250``) scores."""
MAX_ANSWER = 1_000_000

# --- exact arithmetic -----------------------------------------------------------------------------


def exact_value(expression: str) -> Fraction:
    """The exact value of one of this module's plans (numbers, ``+ - * /``, parentheses).

    Only for the generator's own expressions (model text goes through the calculator's
    ``safe_eval``); decimal literals are read exactly, so ``0.1 * 3`` is ``3/10``.
    """

    def walk(node: ast.expr) -> Fraction:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return Fraction(ast.get_source_segment(expression, node) or repr(node.value))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -walk(node.operand)
        if isinstance(node, ast.BinOp):
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Add):
                return left + right
            if isinstance(node.op, ast.Sub):
                return left - right
            if isinstance(node.op, ast.Mult):
                return left * right
            if isinstance(node.op, ast.Div):
                return left / right
        raise InvalidArgumentError(
            f"Expected a plan of numbers, + - * / and parentheses, actual expression: "
            f"{expression!r}."
        )

    return walk(ast.parse(expression, mode="eval").body)


def canonical_answer(value: Fraction) -> str | None:
    """The canonical text of an exact answer (``"12"``, ``"9.75"``), or None when ``value`` is
    not a terminating decimal with at most :data:`MAX_ANSWER_DECIMALS` places."""
    scaled = value * 10**MAX_ANSWER_DECIMALS
    if scaled.denominator != 1:
        return None
    if value.denominator == 1:
        return str(value.numerator)
    text = format(Decimal(scaled.numerator).scaleb(-MAX_ANSWER_DECIMALS), "f")
    return text.rstrip("0").rstrip(".")


# --- task templates -------------------------------------------------------------------------------

NAMES = (
    "Maya", "Omar", "Lena", "Theo", "Priya", "Jonas", "Aiko", "Mateo", "Zara", "Felix",
    "Nadia", "Hugo", "Ines", "Kofi", "Rosa", "Emil", "Yara", "Luca", "Sana", "Milo",
)  # fmt: skip

ITEMS = (
    # (singular, plural, lowest price in cents, highest price in cents)
    ("notebook", "notebooks", 95, 495),
    ("pen", "pens", 45, 295),
    ("apple", "apples", 25, 120),
    ("sandwich", "sandwiches", 295, 895),
    ("bottle of juice", "bottles of juice", 110, 390),
    ("ticket", "tickets", 450, 2450),
    ("candle", "candles", 150, 1250),
    ("loaf of bread", "loaves of bread", 180, 560),
    ("pack of cards", "packs of cards", 199, 899),
    ("plant pot", "plant pots", 350, 1999),
    ("towel", "towels", 499, 1999),
    ("bag of rice", "bags of rice", 225, 1150),
)

SALE_ITEMS = ("jacket", "lamp", "backpack", "pair of boots", "kettle", "desk chair", "guitar")

GOODS = (
    # (containers, contents) for counting problems
    ("crates", "jars"),
    ("boxes", "pencils"),
    ("packs", "stickers"),
    ("cartons", "eggs"),
    ("trays", "cookies"),
    ("bags", "marbles"),
    ("cases", "bottles"),
    ("rolls", "stamps"),
)

MACHINES = (
    # (subject, verb, verb in the question, unit plural, per-minute rate range)
    ("A printer", "prints", "print", "pages", (12, 60)),
    ("A bottling machine", "fills", "fill", "bottles", (20, 90)),
    ("A bakery oven", "bakes", "bake", "rolls", (6, 30)),
    ("A robot arm", "packs", "pack", "parcels", (4, 25)),
    ("A loom", "weaves", "weave", "centimetres of cloth", (8, 40)),
)

VEHICLES = (
    # (subject, speed range in km per hour)
    ("A cyclist", (12, 32)),
    ("A train", (60, 160)),
    ("A delivery van", (30, 90)),
    ("A ferry", (15, 40)),
    ("A hiker", (3, 6)),
    ("A bus", (25, 80)),
)

SHOPS = (
    # (shop, what it sells, plural)
    ("a bakery", "loaves of bread"),
    ("a bookshop", "books"),
    ("a toy shop", "kites"),
    ("a flower stall", "bouquets"),
    ("a cafe", "cakes"),
    ("a bike shop", "bike bells"),
)

RESTAURANTS = ("a restaurant", "a cafe", "a pizzeria", "a noodle bar", "a diner")


def _cents(rng: random.Random, low: int, high: int, step: int = 5) -> int:
    return rng.randrange(low // step, high // step + 1) * step


def _money(cents: int) -> str:
    """``$2.45`` for the prompt."""
    return f"${cents // 100}.{cents % 100:02d}"


def _dec(cents: int) -> str:
    """``2.45`` (``2.4``, ``3``) for the plan: the canonical decimal of ``cents / 100``."""
    text = canonical_answer(Fraction(cents, 100))
    assert text is not None
    return text


def _two_items(rng: random.Random) -> tuple[tuple[int, str, int], tuple[int, str, int], str]:
    (_, p1, lo1, hi1), (_, p2, lo2, hi2) = rng.sample(ITEMS, 2)
    n1, n2 = rng.randint(2, 9), rng.randint(2, 9)
    c1, c2 = _cents(rng, lo1, hi1), _cents(rng, lo2, hi2)
    return (n1, p1, c1), (n2, p2, c2), rng.choice(NAMES)


def _shopping_total(rng: random.Random) -> tuple[str, str]:
    (n1, w1, c1), (n2, w2, c2), name = _two_items(rng)
    prompt = (
        f"{name} buys {n1} {w1} at {_money(c1)} each and {n2} {w2} at {_money(c2)} each. "
        "How much does that cost in total, in dollars?"
    )
    return prompt, f"{n1} * {_dec(c1)} + {n2} * {_dec(c2)}"


def _shopping_change(rng: random.Random) -> tuple[str, str]:
    (n1, w1, c1), (n2, w2, c2), name = _two_items(rng)
    total = n1 * c1 + n2 * c2
    bill = next(b for b in (10, 20, 50, 100, 200, 500) if b * 100 > total)
    prompt = (
        f"{name} buys {n1} {w1} at {_money(c1)} each and {n2} {w2} at {_money(c2)} each, and "
        f"pays with a ${bill} note. How much change, in dollars, does {name} get back?"
    )
    return prompt, f"{bill} - ({n1} * {_dec(c1)} + {n2} * {_dec(c2)})"


def _discount(rng: random.Random) -> tuple[str, str]:
    single = rng.choice(SALE_ITEMS)
    # Whole-dollar prices: every percentage off then leaves a whole number of cents.
    price = rng.randint(12, 240) * 100
    percent = rng.choice((5, 10, 15, 20, 25, 30, 40, 50))
    coupon = rng.choice((0, 100, 200, 500))
    shop = rng.choice(("a market", "a department store", "a corner shop", "an online shop"))
    prompt = f"At {shop}, a {single} costs {_money(price)} and is on sale at {percent}% off."
    plan = f"{_dec(price)} * (100 - {percent}) / 100"
    if coupon:
        prompt += f" A {_money(coupon)} coupon is then taken off the sale price."
        plan += f" - {_dec(coupon)}"
    return prompt + " What is the final price in dollars?", plan


def _machine_rate(rng: random.Random) -> tuple[str, str]:
    subject, verb, question_verb, unit, (low, high) = rng.choice(MACHINES)
    rate = rng.randint(low, high)
    t1, t2 = rng.sample(range(3, 41), 2)
    prompt = (
        f"{subject} {verb} {rate * t1} {unit} in {t1} minutes. Working at the same rate, how "
        f"many {unit} does it {question_verb} in {t2} minutes?"
    )
    return prompt, f"{rate * t1} / {t1} * {t2}"


def _journey(rng: random.Random) -> tuple[str, str]:
    vehicle, (low, high) = rng.choice(VEHICLES)
    s1, s2 = (rng.randint(low, high) + rng.choice((0, 0, 0.5)) for _ in range(2))
    h1, h2 = rng.choice((1.5, 2, 2.5, 3, 4)), rng.choice((0.5, 1, 2, 3))
    fmt = _fmt_half
    prompt = (
        f"{vehicle} travels at {fmt(s1)} km per hour for {fmt(h1)} hours, then at {fmt(s2)} km "
        f"per hour for {fmt(h2)} {'hour' if h2 == 1 else 'hours'}. How many kilometres does it "
        "travel in total?"
    )
    return prompt, f"{fmt(s1)} * {fmt(h1)} + {fmt(s2)} * {fmt(h2)}"


def _fmt_half(value: float) -> str:
    """``3`` or ``3.5``: a whole or half number as the prompt and the plan write it."""
    return str(int(value)) if float(value).is_integer() else str(value)


def _equal_share(rng: random.Random) -> tuple[str, str]:
    containers, plural = rng.choice(GOODS)
    while True:
        packs, size = rng.randint(2, 15), rng.choice((6, 8, 10, 12, 15, 18, 20, 24, 30, 36))
        people = [n for n in range(3, 13) if packs * size % n == 0 and n != packs]
        if people:
            break
    friends = rng.choice(people)
    name = rng.choice(NAMES)
    prompt = (
        f"{name} has {packs} {containers} of {size} {plural} and shares all the {plural} "
        f"equally among {friends} friends. How many {plural} does each friend get?"
    )
    return prompt, f"{packs} * {size} / {friends}"


def _split_bill(rng: random.Random) -> tuple[str, str]:
    people = rng.randint(2, 8)
    share = _cents(rng, 800, 6000)
    total = share * people
    tip = rng.choice((0, 500, 1000, 1500)) if total > 2500 else 0
    shop = rng.choice(RESTAURANTS)
    prompt = f"{people} friends eat at {shop}. The bill is {_money(total - tip)}"
    if tip:
        prompt += f" and they add a {_money(tip)} tip"
        plan = f"({_dec(total - tip)} + {_dec(tip)}) / {people}"
    else:
        plan = f"{_dec(total)} / {people}"
    prompt += ". They split the total equally. How much does each friend pay, in dollars?"
    return prompt, plan


def _stock(rng: random.Random) -> tuple[str, str]:
    containers, plural = rng.choice(GOODS)
    crates, size = rng.randint(5, 40), rng.choice((12, 18, 24, 30, 36, 48))
    stock = crates * size
    first = rng.randint(stock // 20 + 1, stock // 5 + 1)
    times = rng.randint(2, 3)
    if first * (1 + times) >= stock:
        return _stock(rng)
    prompt = (
        f"A warehouse receives {crates} {containers} of {size} {plural}. It ships {first} "
        f"{plural} on Monday and {times} times as many on Tuesday. How many {plural} are left?"
    )
    return prompt, f"{crates} * {size} - {first} - {times} * {first}"


def _average(rng: random.Random) -> tuple[str, str]:
    days = rng.choice((2, 4, 5, 8))
    shop, plural = rng.choice(SHOPS)
    sales = [rng.randint(5, 99) for _ in range(days)]
    listed = ", ".join(str(s) for s in sales[:-1]) + f" and {sales[-1]}"
    prompt = (
        f"Over {days} days, {shop} sold {listed} {plural}. What is the average number of "
        f"{plural} sold per day?"
    )
    return prompt, f"({' + '.join(str(s) for s in sales)}) / {days}"


TEMPLATES: dict[str, tuple[str, Callable[[random.Random], tuple[str, str]]]] = {
    # type: (family, template drawing (prompt, plan))
    "shopping_total": ("shopping", _shopping_total),
    "shopping_change": ("shopping", _shopping_change),
    "discount": ("shopping", _discount),
    "machine_rate": ("rates", _machine_rate),
    "journey": ("rates", _journey),
    "equal_share": ("sharing", _equal_share),
    "split_bill": ("sharing", _split_bill),
    "stock": ("multi_step", _stock),
    "average": ("multi_step", _average),
}
"""The word-problem templates, by task type."""


# --- the seeded task generator --------------------------------------------------------------------


def _one_task(rng: random.Random) -> Task | None:
    kind = rng.choice(list(TEMPLATES))
    family, template = TEMPLATES[kind]
    prompt, expression = template(rng)
    value = exact_value(expression)
    answer = canonical_answer(value)
    if answer is None or not 0 <= value < MAX_ANSWER:
        return None  # not an exact decimal answer: draw again
    target: int | float = int(value) if value.denominator == 1 else float(value)
    metadata = {"type": kind, "family": family, "expression": expression, "answer": answer}
    return Task(prompt=prompt, target=target, metadata=metadata)


def generate_tasks(seed: int, n: int) -> list[Task]:
    """``n`` distinct word problems (no two share a prompt) drawn from ``random.Random(seed)``.

    A pure function of its arguments: the same seed always gives the same list. Each task's
    ``metadata`` holds its ``type`` and ``family``, the arithmetic plan (``expression``, what the
    oracle sends to the calculator) and the canonical ``answer`` text.
    """
    rng = random.Random(seed)
    return distinct_tasks(lambda: _one_task(rng), n)


@functools.cache
def _splits() -> dict[str, tuple[Task, ...]]:
    universe = generate_tasks(TASK_SEED, sum(SPLIT_SIZES.values()))
    return cut_splits(universe, SPLIT_SIZES, "math")


def get_tasks(split: str = "train") -> tuple[Task, ...]:
    """The tasks of ``split`` (``"train"``, ``"val"`` or ``"test"``)."""
    return pick_split(_splits(), split)


# --- the environment ------------------------------------------------------------------------------


class MathEnv(ToolEnv):
    """Solve an arithmetic word problem with the ``calculator`` tool.

    ## Reward
    1.0 when the final reply is the exact answer (any spelling of the number: ``12.5``,
    ``12.50``, ``1,250``; an integer exactly, a fraction within :data:`ANSWER_ABS_TOL`, no
    relative tolerance), else 0.0.
    The reply must be the number alone (``<think>`` blocks are ignored).

    ## Episode End
    Terminated by a reply without tool calls (the final answer).
    """

    system_prompt = SYSTEM_PROMPT
    tools = (CalculatorTool(),)
    max_tokens_per_turn = 96
    """A turn is one calculator call (a four-operation expression is about 52 tokens) or the
    final number."""

    def score(self, answer: str, task: Task) -> float:
        """1.0 for the exact answer, else 0.0."""
        exact = answers_match(answer, task.target, rel_tol=0.0, abs_tol=ANSWER_ABS_TOL)
        return 1.0 if exact else 0.0

    def metrics(self, answer: str | None, task: Task) -> dict[str, Any]:
        return {"answered": answer is not None}


# --- the oracle -----------------------------------------------------------------------------------


def _call(name: str, arguments: dict[str, Any]) -> ToolCall:
    return {
        "id": "oracle_0",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


def oracle_action(task: Task, messages: Sequence[Message]) -> Message:
    """The expert's next assistant message: send the plan to the calculator, answer its result.

    The answer is what the calculator returned (read from ``messages``), never the task's target.
    """
    computed = [
        m.get("content") or ""
        for m in messages
        if m.get("role") == "tool" and m.get("name") == "calculator"
    ]
    if not computed:
        calls = [_call("calculator", {"expression": task.metadata["expression"]})]
        return Message(role="assistant", content="", tool_calls=calls)
    return Message(role="assistant", content=computed[-1])
