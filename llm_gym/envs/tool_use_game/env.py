"""ToolUseGame: answer questions about a fictional country's towns with three tools.

The reference environment of the seeds (``ToolUseGameEnv`` with ``list_fact_keys``, ``lookup``
and ``calculator``). The module reads top to bottom: constants, the fact tables (worlds), the
seeded task generator, the tools and the environment (its oracle and imperfect demonstrators are
in :mod:`.demonstrators`).

Worlds: the facts come from a seeded table, ``world_facts(world_seed)``. The splits read the
default world (:data:`DEFAULT_WORLD_SEED`); ``get_tasks(split, world_seed=s)`` asks the same
questions in another world (other facts, other answers), and ``world_seed="varied"`` puts each
task in a world of its own drawn from :data:`TRAINING_WORLD_SEEDS`. World seeds below 1,000 are
never drawn for training, so ``world_seed=1`` (:data:`NEW_WORLD_SEED`) is a world no
``"varied"`` training task has seen: success there is tool use, not memory.
"""

from __future__ import annotations

import difflib
import functools
import random
from collections.abc import Callable, Sequence
from typing import Any, Literal

from llm_gym.core.task import Task, cut_splits, distinct_tasks, pick_split
from llm_gym.core.tool import ToolResult, tool
from llm_gym.core.tool_env import ToolEnv
from llm_gym.core.types import Message
from llm_gym.errors import InvalidArgumentError, ToolArgumentError
from llm_gym.tools.arithmetic import safe_eval
from llm_gym.tools.calculator import CalculatorTool

# fmt: off
__all__ = ["ATTRIBUTES", "DEFAULT_WORLD_SEED", "FACTS", "NEW_WORLD_SEED", "SPLIT_SIZES",
           "SYSTEM_PROMPT", "TOOL_USE_GAME_TASKS", "TOWNS", "TRAINING_WORLD_SEEDS", "VERSION",
           "ToolUseGameEnv", "WorldLookup", "WorldSeed", "generate_tasks", "get_tasks",
           "list_fact_keys", "look_up", "lookup", "task_world", "world_facts"]
# fmt: on

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


DEFAULT_WORLD_SEED = 7
"""The world of the splits (and of :data:`FACTS`)."""
NEW_WORLD_SEED = 1
"""A held-out world: no ``"varied"`` training task is ever drawn from it."""
TRAINING_WORLD_SEEDS = range(1000, 2**31)
"""The worlds ``world_seed="varied"`` draws from (disjoint from seeds below 1,000)."""
MAX_WORLD_SEED = 2**64 - 1
"""The largest world seed (task ids name their world in digits)."""


def check_world_seed(world_seed: object, varied: bool = False) -> None:
    """Raise unless ``world_seed`` is an int in [0, MAX_WORLD_SEED] (or ``"varied"``)."""
    ok = type(world_seed) is int and 0 <= world_seed <= MAX_WORLD_SEED
    if not (ok or (varied and world_seed == "varied")):
        big = isinstance(world_seed, int) and world_seed.bit_length() > 200  # no 5,000 digits
        shown = f"an int of {world_seed.bit_length()} bits" if big else repr(world_seed)[:60]
        allowed = "an int in [0, 2**64) (or 'varied' where tasks are drawn)"
        raise InvalidArgumentError(f"world_seed must be {allowed}, actual value: {shown}.")


@functools.lru_cache(maxsize=1024)
def world_facts(world_seed: int) -> dict[str, int]:
    """The fact table of a world: ``"Town.attribute" -> int``, a pure function of the seed.

    The default world keeps its historical table (values drawn independently, so two towns can
    tie); every other world draws distinct values per attribute, so no comparison ties. Treat
    the returned dict as read-only (it is cached).
    """
    check_world_seed(world_seed)
    rng = random.Random(world_seed)
    if world_seed == DEFAULT_WORLD_SEED:
        return {
            f"{town}.{attribute}": rng.randint(low, high)
            for town in TOWNS
            for attribute, (_, low, high) in ATTRIBUTES.items()
        }
    columns = {
        attribute: rng.sample(range(low, high + 1), len(TOWNS))
        for attribute, (_, low, high) in ATTRIBUTES.items()
    }
    return {
        f"{town}.{attribute}": columns[attribute][i]
        for i, town in enumerate(TOWNS)
        for attribute in ATTRIBUTES
    }


FACTS: dict[str, int] = world_facts(DEFAULT_WORLD_SEED)
"""The default world's fact table: ``"Town.attribute" -> int`` (``lookup`` ignores case)."""
_KEYS_BY_LOWER_KEY = {key.lower(): key for key in FACTS}


def task_world(task: Task) -> int:
    """The world seed of ``task`` (``metadata["world_seed"]``; absent: the default world)."""
    world = task.metadata.get("world_seed", DEFAULT_WORLD_SEED)
    check_world_seed(world)  # a clear error names a bad one
    return int(world)


# --- the seeded task generator -----------------------------------------------------------------


def _key(town: str, attribute: str) -> str:
    return f"{town}.{attribute}"


def _phrase(town: str, attribute: str) -> str:
    return f"the {ATTRIBUTES[attribute][0]} of {town}"


_OPS = {"plus": "+", "minus": "-", "times": "*"}


def _apply(op: str, a: int, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


def _one_task(rng: random.Random, world_seed: int) -> Task:
    # The question is drawn from ``rng`` alone (a compare tie is judged in the default world, as
    # it always was), so every world asks the same questions; only the facts and answers differ.
    facts = world_facts(world_seed)
    kind = rng.choices(["lookup", "lookup_arith", "compare", "chain"], weights=[2, 3, 2, 3])[0]
    attribute = rng.choice(list(ATTRIBUTES))
    towns = rng.sample(TOWNS, 3)
    a, b, c = towns
    if kind == "lookup":
        keys, expression = [_key(a, attribute)], None
        prompt = f"What is {_phrase(a, attribute)}?"
        target: Any = facts[keys[0]]
    elif kind == "lookup_arith":
        word = rng.choice(list(_OPS))
        n = rng.randint(2, 9) if word == "times" else rng.randint(2, 999)
        keys = [_key(a, attribute)]
        expression = f"{{0}} {_OPS[word]} {n}"
        prompt = f"What is {_phrase(a, attribute)} {word} {n}?"
        target = _apply(_OPS[word], facts[keys[0]], n)
    elif kind == "compare":
        keys = [_key(a, attribute), _key(b, attribute)]
        if FACTS[keys[0]] == FACTS[keys[1]]:
            return _one_task(rng, world_seed)
        expression = None
        prompt = (
            f"Which town has the larger {ATTRIBUTES[attribute][0]}, {a} or {b}? "
            "Reply with the town's name."
        )
        target = a if facts[keys[0]] > facts[keys[1]] else b
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
        values = [facts[k] for k in keys]
        target = evaluate_plan(expression, values)
        kind = f"chain_{variant}"
    metadata: dict[str, Any] = {"type": kind, "keys": keys, "expression": expression}
    if world_seed != DEFAULT_WORLD_SEED:
        metadata["world_seed"] = world_seed
    return Task(prompt=prompt, target=target, metadata=metadata)


def evaluate_plan(expression: str, values: Sequence[int]) -> int:
    """A task's arithmetic (``metadata["expression"]``, e.g. ``"{} + {}"``) on ``values``."""
    return int(safe_eval(expression.format(*values)))


WorldSeed = int | Literal["varied"]
"""A world: its seed, or ``"varied"`` (each task in a world of its own)."""


def _world_draw(seed: int, world_seed: WorldSeed) -> Callable[[], int]:
    if world_seed == "varied":
        worlds = random.Random(f"worlds-{seed}")  # apart from the question stream
        return lambda: worlds.randrange(TRAINING_WORLD_SEEDS.start, TRAINING_WORLD_SEEDS.stop)
    check_world_seed(world_seed)
    return lambda: world_seed  # type: ignore[return-value]


def generate_tasks(
    seed: int, n: int, world_seed: WorldSeed = DEFAULT_WORLD_SEED, worlds_per_question: int = 1
) -> list[Task]:
    """``n`` distinct tasks (no two share a prompt) drawn from a ``random.Random(seed)``.

    A pure function of its arguments: the same seed always gives the same list, and the same
    questions in every world (``world_seed``: an int, or ``"varied"`` for a fresh world per
    task; a task outside the default world carries ``metadata["world_seed"]``).

    ``worlds_per_question`` > 1 (with ``world_seed="varied"``) asks each question that many
    times in a row, each in a fresh world: the answer can't be recalled from the question, only
    read from the tool results (on distinct questions a small model learns answers, not that).
    """
    if type(worlds_per_question) is not int or worlds_per_question < 1 or (
            worlds_per_question > 1 and world_seed != "varied"):  # fmt: skip
        raise InvalidArgumentError(
            "worlds_per_question must be an int >= 1, and above 1 only with world_seed='varied'"
            f"; actual values: {worlds_per_question!r} and {world_seed!r}."
        )
    rng = random.Random(seed)
    world = _world_draw(seed, world_seed)
    if worlds_per_question == 1:
        return distinct_tasks(lambda: _one_task(rng, world()), n)
    starts: dict[str, Any] = {}  # a question's prompt -> the generator's state that drew it

    def draw() -> Task:
        state = rng.getstate()
        task = _one_task(rng, world())
        starts.setdefault(task.prompt, state)
        return task

    tasks = []
    for question in distinct_tasks(draw, -(-n // worlds_per_question)):
        tasks.append(question)
        for _ in range(worlds_per_question - 1):  # the question drawn again, in another world
            replay = random.Random()
            replay.setstate(starts[question.prompt])
            tasks.append(_one_task(replay, world()))
    return tasks[:n]


@functools.lru_cache(maxsize=16)
def _splits(world_seed: WorldSeed = DEFAULT_WORLD_SEED) -> dict[str, tuple[Task, ...]]:
    universe = generate_tasks(TASK_SEED, sum(SPLIT_SIZES.values()), world_seed)
    name = "tool_use_game" if world_seed == DEFAULT_WORLD_SEED else f"tool_use_game@{world_seed}"
    return cut_splits(universe, SPLIT_SIZES, name)


def get_tasks(split: str = "train", world_seed: WorldSeed = DEFAULT_WORLD_SEED) -> tuple[Task, ...]:
    """The tasks of ``split`` (``"train"``, ``"val"`` or ``"test"``) in a world.

    Every world asks the same questions in each split (the splits stay disjoint across
    worlds); ``world_seed`` changes the facts and so the answers. ``world_seed="varied"`` gives
    each task its own training world; :data:`NEW_WORLD_SEED` is a world training never draws.
    """
    check_world_seed(world_seed, varied=True)
    return pick_split(_splits(world_seed), split)


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


def look_up(facts: dict[str, int], key: str) -> str:
    """``key``'s value in ``facts`` as text (case ignored); an unknown key raises a
    :class:`ToolArgumentError` that suggests close keys (the tool's error message)."""
    normalized = key.strip().lower()
    if normalized in _KEYS_BY_LOWER_KEY:
        return str(facts[_KEYS_BY_LOWER_KEY[normalized]])
    close = difflib.get_close_matches(normalized, list(_KEYS_BY_LOWER_KEY), n=3)
    suggestions = [_KEYS_BY_LOWER_KEY[c] for c in close]
    hint = f" Did you mean {', '.join(repr(c) for c in suggestions)}?" if close else ""
    raise ToolArgumentError(f"unknown key {key[:80]!r}.{hint} list_fact_keys lists every key.")


@tool
def lookup(key: str) -> str:
    """Look up one fact by its key.

    Args:
        key: A fact key of the form 'Town.attribute', for example 'Velmora.population'.
    """
    return look_up(FACTS, key)


class WorldLookup:
    """The ``lookup`` tool of one env instance: the same name, schema and errors as
    :func:`lookup`, reading the world of the current episode's task (:meth:`enter`, on reset:
    its table is built once an episode, however many worlds a collection cycles through)."""

    synchronous = True

    def __init__(self) -> None:
        self.name = lookup.name
        self.description = lookup.description
        self.parameters_schema = lookup.parameters_schema
        self.enter(DEFAULT_WORLD_SEED)

    def enter(self, world_seed: int) -> None:
        """Read ``world_seed``'s facts from now on."""
        self._world_seed, self.facts = world_seed, world_facts(world_seed)

    @property
    def world_seed(self) -> int:
        """The world it reads (set by :meth:`enter`)."""
        return self._world_seed

    async def execute(self, arguments: str) -> ToolResult:
        key = lookup.bind_arguments(arguments)["key"]
        return ToolResult(content=look_up(self.facts, key))


# --- the environment ------------------------------------------------------------------------------


class ToolUseGameEnv(ToolEnv):
    """Answer a question about the fact table using ``list_fact_keys``, ``lookup``, ``calculator``.

    ``lookup`` reads the task's world (``metadata["world_seed"]``, default
    :data:`DEFAULT_WORLD_SEED`).

    ## Reward
    1.0 when the final reply matches the target (every numeric target is an integer, matched
    exactly; thousands separators and a trailing period ignored; town names case-insensitively),
    else 0.0.

    ## Episode End
    Terminated by a reply without tool calls (the final answer).
    """

    system_prompt = SYSTEM_PROMPT
    tools = (list_fact_keys, lookup, CalculatorTool())
    max_tokens_per_turn = 64
    """A turn is one tool call (a lookup is about 32 tokens) or the short answer."""

    def __init__(
        self,
        tools: Sequence[Any] | None = None,
        system_prompt: str | None = None,
        *,
        tool_latency_s: float = 0.0,
    ) -> None:
        if tools is None:  # this instance's own lookup, which follows the task's world
            tools = [WorldLookup() if t is lookup else t for t in self.tools]
        super().__init__(tools, system_prompt, tool_latency_s=tool_latency_s)

    async def reset(self, task: Task) -> list[Message]:
        world = task_world(task)  # a bad world_seed fails here, before the episode starts
        for t in self._tools.values():
            if isinstance(t, WorldLookup):
                t.enter(world)
        return await super().reset(task)

    def metrics(self, answer: str | None, task: Task) -> dict[str, Any]:
        return {"answered": answer is not None}
