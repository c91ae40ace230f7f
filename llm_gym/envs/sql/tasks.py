"""SQL-v0 tasks: questions about seeded databases, answered by reference SQL, and the splits.

A task names a schema (``shop``, ``company`` or ``library``) and a database seed; the database is a
pure function of the two (:func:`~llm_gym.envs.sql.schemas.build_tables`), so the same task always
gives the same rows. Each question comes from a template (:mod:`llm_gym.envs.sql.questions`) that
picks its parameters from the rows and writes a reference query; the generator runs it on the
task's database: the result is the target. Questions whose answer would be ambiguous (a tie for
"which ... the most") or empty are drawn again.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Sequence
from typing import Any

from llm_gym.core.task import Task, cut_splits, pick_split
from llm_gym.envs.sql.database import ReadOnlyDatabase, Table
from llm_gym.envs.sql.questions import QUESTION_TEMPLATES, Question, Rows
from llm_gym.envs.sql.schemas import SCHEMA_DESCRIPTIONS, SCHEMAS, build_tables
from llm_gym.errors import InvalidArgumentError

__all__ = [
    "EXACT_TOLERANCE",
    "QUESTION_ATTEMPTS",
    "ROUNDED_TOLERANCE",
    "SPLIT_SIZES",
    "TASK_SEED",
    "generate_tasks",
    "get_tasks",
    "prompt_of",
]

# --- constants -----------------------------------------------------------------------------------

SPLIT_SIZES = {"train": 1000, "val": 200, "test": 200}
"""Tasks per split. Every task has its own database seed, so no database (and no prompt) is in two
splits."""
TASK_SEED = 20260505
"""Seed of the task universe: the same seed always gives the same tasks in the same splits."""
MAX_DB_SEED = 10**6
"""Database seeds are drawn from ``range(MAX_DB_SEED)``."""
ROUNDED_TOLERANCE = 0.01 * (1 + 1e-9)
"""Absolute tolerance of answers asked "rounded to 2 decimal places": one unit in the last place,
so either rounding of a half-way value (and the unrounded value) counts."""
QUESTION_ATTEMPTS = 20
"""Questions drawn per database before its seed is skipped (ties and empty answers are redrawn)."""
EXACT_TOLERANCE = 1e-6
"""Absolute tolerance of every other numeric answer (counts and integer sums must be exact)."""


# --- the seeded task generator -------------------------------------------------------------------


def _rows(tables: Sequence[Table]) -> Rows:
    return {
        t.name: [dict(zip((c for c, _ in t.columns), row, strict=True)) for row in t.rows]
        for t in tables
    }


def _answer(db: ReadOnlyDatabase, question: Question) -> Any | None:
    """The target of ``question`` on ``db``, or None when it is empty or ambiguous."""
    _columns, rows, _cut = db.execute(question.sql, max_rows=1_000)
    if not rows or rows[0][0] is None:
        return None
    if question.ranked and len(rows) > 1 and rows[0][1] == rows[1][1]:
        return None  # a tie: "which ... the most" would have two answers
    return rows[0][0]


def prompt_of(question: str, schema: str, db_seed: int) -> str:
    """The user message of a task: the question and which database it is about."""
    return f"{question}\n(Database: {SCHEMA_DESCRIPTIONS[schema]}, instance #{db_seed}.)"


def _one_task(rng: random.Random, db_seed: int) -> Task | None:
    schema = rng.choice(SCHEMAS)
    tables = build_tables(schema, db_seed)
    rows = _rows(tables)
    db = ReadOnlyDatabase(tables)
    try:
        for _ in range(QUESTION_ATTEMPTS):
            question = QUESTION_TEMPLATES[schema](rng, rows)
            target = _answer(db, question)
            if target is not None:
                break
        else:
            return None
    finally:
        db.close()
    sql = f"{question.sql} LIMIT 1" if question.ranked else question.sql
    metadata = {
        "schema": schema,
        "db_seed": db_seed,
        "type": question.type,
        "sql": sql,
        "rounded": question.rounded,
        "tolerance": ROUNDED_TOLERANCE if question.rounded else EXACT_TOLERANCE,
    }
    return Task(prompt_of(question.text, schema, db_seed), target, metadata)


def generate_tasks(seed: int, n: int) -> list[Task]:
    """``n`` tasks drawn from a ``random.Random(seed)``, each with its own database seed.

    A pure function of its arguments: the same seed always gives the same list. No two tasks
    share a database seed (so no two share a prompt).
    """
    if not isinstance(n, int) or n < 0 or n > MAX_DB_SEED // 10:
        raise InvalidArgumentError(
            f"n must be an int in [0, {MAX_DB_SEED // 10}], actual value: {n!r}."
        )
    rng = random.Random(seed)
    used: set[int] = set()
    tasks: list[Task] = []
    while len(tasks) < n:
        db_seed = rng.randrange(MAX_DB_SEED)
        if db_seed in used:
            continue
        used.add(db_seed)
        task = _one_task(rng, db_seed)
        if task is not None:
            tasks.append(task)
    return tasks


@functools.cache
def _splits() -> dict[str, tuple[Task, ...]]:
    universe = generate_tasks(TASK_SEED, sum(SPLIT_SIZES.values()))
    return cut_splits(universe, SPLIT_SIZES, "sql")


def get_tasks(split: str = "train") -> tuple[Task, ...]:
    """The tasks of ``split`` (``"train"``, ``"val"`` or ``"test"``)."""
    return pick_split(_splits(), split)
