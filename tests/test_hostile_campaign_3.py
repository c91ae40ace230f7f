"""The third hostile-input campaign: cases neither earlier campaign covered, one test per class.

Each case is bounded (well under a few seconds) and asserts containment: the same result in
bounded time, an episode outcome, or an error naming what was wrong, never a crash, a hang or a
change outside. What happened before the fix (2 shared cores) and what happens now:

TABLE
"""

from __future__ import annotations

import random
import sqlite3
import time

import pytest

from llm_gym.envs.sql import ReadOnlyDatabase, build_tables
from llm_gym.envs.sql.guard import apply_limits

# --- SQL-v0: printf's %c repeat count ------------------------------------------------------------


@pytest.fixture(scope="module")
def shop_db() -> ReadOnlyDatabase:
    database = ReadOnlyDatabase(build_tables("shop", 1), timeout_s=0.3)
    yield database
    database.close()


@pytest.mark.parametrize(
    "call",
    [
        "printf('%.*c', 268435456, 'x')",
        "format('%.*c', -268435456, 'x')",  # a negative count counts by its size
        "printf('%.268435456c', 'x')",  # a literal count
        "printf('%.4563402752c', 'x')",  # wraps to 268,435,456 in C's unsigned arithmetic
        "printf('%5.*c', '268435456', 'é')",  # read from text, a width in front
        "printf('%d%%%n%.*c', 1, 268435456.5, 'x')",  # after conversions that take 1 or 0 args
    ],
)
def test_sql_printf_repeat_count_is_bounded(shop_db: ReadOnlyDatabase, call: str) -> None:
    """``%c`` with a precision repeats the character, and SQLite kept looping past the length
    limit in one instruction (no deadline check): 2**28 took 3.5 s, 2**31 - 1 28 s, a row of 32
    such calls 15 minutes, for a NULL. The count is now lowered to one past the limit first."""
    start = time.perf_counter()
    _columns, rows, _cut = shop_db.execute(f"SELECT {call}, {call}")
    assert rows == [(None, None)]
    assert time.perf_counter() - start < 1.0


def test_sql_printf_gives_sqlites_results(shop_db: ReadOnlyDatabase) -> None:
    """Random formats (flags, widths, ``*``, precisions over and under the limit, ``%n``, ``%%``,
    unknown conversions) give what SQLite's own ``printf`` gives under the same limits: the
    bound reads the format as SQLite does, so no other argument is touched."""
    plain = sqlite3.connect(":memory:")
    apply_limits(plain)
    rng = random.Random(3)
    parts = [*"%-+#!0,*.", "l", "ll", "5", "25000", "12", *"cdsqnTyxfgé", " "]
    values = ["25000", "-25000", "3", "'x'", "'é'", "NULL", "2.5", "'25000'", "x'41'", "''"]
    for _ in range(400):
        fmt = "".join(rng.choice(parts) for _ in range(rng.randint(1, 12)))
        args = "".join(f", {rng.choice(values)}" for _ in range(rng.randint(0, 5)))
        sql = f"SELECT printf('{fmt}'{args}), format('{fmt}'{args})"
        assert shop_db.execute(sql)[1] == plain.execute(sql).fetchall(), sql
    plain.close()
