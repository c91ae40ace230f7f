"""SQL-v0 (:mod:`llm_gym.envs.sql`) under hostile queries: one test per class of attack, each
fast, each an outcome.

Every hostile query ends quickly in a result or a ``tool_error`` naming the limit, never a crash,
a hang or a change to the database, and queries run off the event loop. The classes: pattern
matching (``LIKE``, ``GLOB``, ``ESCAPE``) over long strings, per-row work of many expensive calls,
``ltrim`` with large sets, CTEs that expand exponentially, ``fts3_tokenizer``, ``ATTACH`` and
``VACUUM INTO``, pragmas and their look-alikes, hidden tables and views, JSON and window
functions, parser depth, joins past the time limit, and ``printf``'s ``%c`` repeat count (lowered
to one past the length limit before SQLite sees it, with SQLite's own results otherwise). The
measured cost of each class without its bound is in ``benchmarks/results/README.md``.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import os
import random
import sqlite3
import threading
import time
from typing import Any

import pytest

import llm_gym.envs.sql.database as database_module
import llm_gym.envs.sql.env as env_module
from llm_gym import ToolArgumentError
from llm_gym.envs.sql import ReadOnlyDatabase, SQLEnv, build_tables, get_tasks, oracle_action
from llm_gym.envs.sql.expansion import MAX_EXPANDED_TOKENS, check_expansion, expanded_size
from llm_gym.envs.sql.guard import CHECKED_FUNCTIONS, SQLITE_LIMITS, apply_limits

FOREVER = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"
SLACK_S = 1.0
"""Generous margin over a time limit (shared, loaded cores)."""
A = "printf('%.*c', 19990, 'a')"  # a string near the 20,000-byte limit


def rep(n: int, c: str = "a") -> str:
    return f"printf('%.*c', {n}, '{c}')"


S = f"WITH s(a, p) AS (SELECT {A}, "
ISSUE_QUERY = (
    "WITH s(a,p) AS (SELECT printf('%.*c',99990,'a'), '%'||printf('%.*c',49000,'a')||'b') "
    "SELECT (a LIKE p) FROM s"
)


@pytest.fixture(scope="module")
def db() -> ReadOnlyDatabase:
    database = ReadOnlyDatabase(build_tables("shop", 1), timeout_s=0.3)
    yield database
    database.close()


def timed(db: ReadOnlyDatabase, sql: str) -> tuple[str, float]:
    """(the result text or ``tool_error: ...``, seconds)."""
    start = time.perf_counter()
    try:
        text = db.query(sql)
    except ToolArgumentError as exc:
        text = f"tool_error: {exc}"
    return text, time.perf_counter() - start


# --- one instruction, or a row of them ------------------------------------------------------------

BOUNDED = {
    # Each is one SQLite instruction whose cost grows with its operands: bounded by the limits.
    "issue 15": (ISSUE_QUERY, "NULL"),  # the 99,990-byte printf is over the limit: NULL
    "like": (S + f"'%' || {rep(198)} || 'b') SELECT a LIKE p FROM s", "(1 row)"),
    "like escape": (S + f"'%' || {rep(198)} || 'b') SELECT a LIKE p ESCAPE '!' FROM s", "(1 row)"),
    "glob class": (S + f"'*' || replace({rep(66)}, 'a', '[a]') || 'b') SELECT a GLOB p FROM s", ""),
    "long pattern": (S + f"'%' || {rep(300)}) SELECT a LIKE p FROM s", "limited to 200 bytes"),
    "instr": (S + f"{rep(9990)} || 'b') SELECT instr(a, p) FROM s", "(1 row)"),
    "replace": (S + f"{rep(9990)} || 'b') SELECT length(replace(a, p, 'x')) FROM s", "19990"),
    "replace growth": (f"SELECT replace({A}, 'a', 'aaaaaaaaaa')", "limited to 20,000 bytes"),
    "trim set": (S + f"{rep(1600, 'b')} || 'a') SELECT length(ltrim(a, p)) FROM s", "(1 row)"),
    "printf width": ("SELECT printf('%*d', 2000000000, 1)", "NULL"),
    "printf precision": ("SELECT printf('%.*f', 2000000000, 1.5)", "NULL"),
    "zeroblob": ("SELECT zeroblob(2000000000)", "limited to 20,000 bytes"),
    "randomblob": ("SELECT randomblob(2000000000)", "limited to 20,000 bytes"),
    "hex": (f"SELECT hex({A})", "limited to 20,000 bytes"),
    "char": ("SELECT char(" + ", ".join(["65"] * 40) + ")", "too many arguments"),
    "upper substr": (f"SELECT length(upper(substr({A}, 2)))", "19989"),
    "json deep": (f"SELECT json_valid({rep(19990, '[')})", "0"),
    "json_patch": ("SELECT json_patch('{}', '{}')", "function json_patch() is not allowed"),
    "group_concat": (
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 100) "
        f"SELECT length(group_concat({rep(1000)})) FROM c",
        "limited to 20,000 bytes",
    ),
    "sort big strings": (
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 20000) "
        f"SELECT x FROM c ORDER BY {rep(2000)} || x DESC LIMIT 1",
        "",
    ),
    "parameters": ("SELECT ?1", "parameters (?, :name) are not supported"),
    # 51 rows of 199 values of 20 kB: 240 MB and 1.3 s to fetch before; cut at 1 M characters
    "wide rows": (
        f"SELECT {', '.join(['a'] * 199)} FROM (SELECT {A} AS a), order_items",
        "output cut at 4,000 characters",
    ),
}


@pytest.mark.parametrize("name", list(BOUNDED))
def test_one_long_instruction_is_bounded(db: ReadOnlyDatabase, name: str) -> None:
    """Each class in one instruction, at the limits: well under the time limit (before: up to
    8 s for one ``GLOB``), a result or a tool error that names the limit."""
    sql, expected = BOUNDED[name]
    text, elapsed = timed(db, sql)
    assert expected in text, text
    assert elapsed < 0.3 + SLACK_S, (name, elapsed)


ROWS = {
    "glob row": S
    + f"'*' || replace({rep(66)}, 'a', '[a]') || 'b') SELECT "
    + ", ".join(["a GLOB p"] * 190)
    + " FROM s",
    "trim row": S
    + f"{rep(1600, 'b')} || 'a') SELECT "
    + ", ".join(["ltrim(a, p)"] * 150)
    + " FROM s",
    "trim in one call": S
    + f"{rep(1600, 'b')} || 'a') SELECT max("
    + ", ".join(["ltrim(a, p)"] * 30)
    + ") FROM s",
    "like in a loop": "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) "
    f"SELECT count(*) FROM c, (SELECT {A} AS a) WHERE a || x LIKE '%' || {rep(198)} || 'b'",
    "recursive": FOREVER,
}


@pytest.mark.parametrize("name", list(ROWS))
def test_many_long_instructions_stop_at_the_time_limit(db: ReadOnlyDatabase, name: str) -> None:
    """SQLite runs its progress handler only at jumps, so a row of many quadratic calls ran
    past the limit (190 ``GLOB``: 4.8 s; 150 ``ltrim``: 15.7 s at a 1 s limit): each checked
    built-in now checks the deadline first, so the query stops at the limit plus one call."""
    text, elapsed = timed(db, ROWS[name])
    assert text.startswith("tool_error: the query ran longer than its time limit (0.3 s"), text
    assert elapsed < 0.3 + SLACK_S, (name, elapsed)


def test_checked_functions_give_the_built_ins_results(db: ReadOnlyDatabase) -> None:
    plain = sqlite3.connect(":memory:")
    values = ["'abc'", "'ABC'", "'a%c'", "'%b%'", "'_b_'", "NULL", "12", "1.5", "x'6162'", "'é'"]
    pairs = [(x, y) for x in values for y in values]
    calls = [f"{x} LIKE {y}" for x, y in pairs] + [f"{x} GLOB {y}" for x, y in pairs]
    calls += [f"{x} LIKE {y} ESCAPE '%'" for x, y in pairs[:30]]
    calls += [f"{f}({x}, {y})" for f in ("instr", "trim", "ltrim", "rtrim") for x, y in pairs]
    calls += [f"replace({x}, {y}, 'Z')" for x, y in pairs]
    for start in range(0, len(calls), 30):
        sql = "SELECT " + ", ".join(calls[start : start + 30])
        columns, rows, _cut = db.execute(sql)
        assert rows == plain.execute(sql).fetchall(), sql
    assert set(CHECKED_FUNCTIONS) >= {"like", "glob", "instr", "replace", "trim"}
    with pytest.raises(ToolArgumentError, match="ESCAPE expression must be a single character"):
        db.execute("SELECT 'a' LIKE 'a' ESCAPE 'xy'")


# --- compilation ----------------------------------------------------------------------------------


NAMES = ["".join(letters) for letters in itertools.product("éÉ", repeat=5)]


def cte_chain(levels: int, hint: str = "") -> str:
    parts = ["a0(x) AS (SELECT 1)"] + [
        f"a{i + 1}(x) AS {hint} (SELECT (SELECT x FROM a{i}) + (SELECT x FROM a{i}))"
        for i in range(levels)
    ]
    return "WITH " + ", ".join(parts) + f" SELECT x FROM a{levels}"


@pytest.mark.parametrize(
    "sql",
    [
        cte_chain(20),  # before: 25 s and 3 GB to compile; 25 levels would exhaust memory
        cte_chain(30, "MATERIALIZED"),
        cte_chain(30, "NOT MATERIALIZED"),
        "WITH a0 AS (SELECT 1 x), "
        + ", ".join(f"a{i + 1} AS (SELECT p.x FROM a{i} p, a{i} q)" for i in range(30))
        + " SELECT * FROM a30",
        # quoted names, comments and odd spellings name the same CTE
        'WITH "a0"(x) AS (SELECT 1), '
        + ", ".join(
            f"[a{i + 1}](x) AS (SELECT x FROM `a{i}` UNION ALL SELECT x FROM 'A{i}')"
            for i in range(30)
        )
        + " SELECT count(*) FROM a30",
        # names SQLite tells apart though Python's lower() would not (only ASCII folds)
        "WITH "
        + ", ".join(
            [f'"{NAMES[0]}"(x) AS (SELECT 1)']
            + [
                f'"{NAMES[i + 1]}"(x) AS (SELECT p.x FROM "{NAMES[i]}" p, "{NAMES[i]}" q)'
                for i in range(20)
            ]
        )
        + f' SELECT x FROM "{NAMES[20]}"',
        # alternating names in nested WITH clauses (each level copies the outer one twice)
        "WITH a(x) AS (SELECT 1) SELECT * FROM "
        + "(WITH b(x) AS (SELECT p.x FROM a p, a q) SELECT * FROM "
        "(WITH a(x) AS (SELECT p.x FROM b p, b q) " * 12 + "SELECT x FROM a" + "))" * 12,
    ],
)
def test_cte_expansion_is_refused_before_compiling(db: ReadOnlyDatabase, sql: str) -> None:
    text, elapsed = timed(db, sql)
    assert text.startswith("tool_error: the query is too large once each reference"), text
    assert elapsed < 0.5, elapsed


def test_expansion_counts_and_legitimate_ctes_pass(db: ReadOnlyDatabase) -> None:
    assert expanded_size("WITH a AS (SELECT 1 x) SELECT * FROM a, a") == 14 + 2 * 5
    assert expanded_size("SELECT 'as (' /* a AS ( */ -- b AS (\n") == 2  # no definitions
    assert expanded_size(cte_chain(8)) < MAX_EXPANDED_TOKENS < expanded_size(cte_chain(16))
    recursive = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 5) "
    assert check_expansion(recursive + "SELECT sum(x) FROM c") == {"c"}
    legit = (
        "WITH t AS (SELECT customer_id, COUNT(*) n FROM orders GROUP BY 1), "
        "u AS (SELECT * FROM t WHERE n > (SELECT AVG(n) FROM t)) "
        "SELECT (SELECT COUNT(*) FROM u), (SELECT MAX(n) FROM t), (SELECT MIN(n) FROM u)"
    )
    assert "(1 row)" in db.query(legit)
    for hostile in ("'" * 4000, "/*" * 2000, "(" * 4000, "a AS (" * 660, "[" * 4000):
        start = time.perf_counter()  # the tokenizer is linear: no input makes it slow
        expanded_size(hostile)
        assert time.perf_counter() - start < 0.5


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("SELECT 1" + " UNION SELECT 1" * 25, "at most 20 terms"),
        ("SELECT " + "(" * 300 + "1" + ")" * 300, ""),  # parser stack or expression depth
        ("SELECT " + " + ".join(["1"] * 300), "Expression tree is too large"),
        ("SELECT " + ", ".join(["1"] * 250), "too many columns"),
        ("SELECT count(*) FROM " + ", ".join(f"customers t{i}" for i in range(70)), "64 tables"),
    ],
)
def test_compilation_limits(db: ReadOnlyDatabase, sql: str, expected: str) -> None:
    text, elapsed = timed(db, sql)
    assert text.startswith("tool_error: SQL error: ") and expected in text, text
    assert elapsed < 0.5


# --- reach: functions, pragmas, virtual tables ----------------------------------------------------


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("SELECT hex(fts3_tokenizer('simple'))", "function fts3_tokenizer() is not allowed"),
        ("SELECT fts3_tokenizer('x', x'0000000000000000')", "function fts3_tokenizer()"),
        ("SELECT load_extension('/tmp/evil.so')", "function load_extension() is not allowed"),
        ("SELECT sqlite_compileoption_get(0)", "function sqlite_compileoption_get()"),
        ("SELECT sqlite_log(1, 'x')", "function sqlite_log()"),
        ("SELECT fts5(NULL)", "function fts5()"),
        ("SELECT rtreenode(2, x'00')", "function rtreenode()"),
        ("SELECT changes()", "function changes()"),
        ("SELECT * FROM dbstat", "read-only"),
        ("SELECT * FROM sqlite_stmt", "read-only"),
        ("SELECT * FROM pragma_compile_options", "read-only"),
        ("SELECT * FROM pragma_function_list", "read-only"),
        ("PRAGMA compile_options", "PRAGMA compile_options"),
        ("PRAGMA case_sensitive_like = 1", "PRAGMA case_sensitive_like"),
        ("SELECT * FROM pragma_table_info('orders') WHERE pragma_query_only", "no such column"),
        ("CREATE VIRTUAL TABLE temp.f USING fts4(x)", "read-only"),
    ],
)
def test_dangerous_functions_pragmas_and_virtual_tables_are_refused(
    db: ReadOnlyDatabase, sql: str, expected: str
) -> None:
    text, _elapsed = timed(db, sql)
    assert text.startswith("tool_error: ") and expected in text, text


def test_what_models_write_to_explore_still_works(db: ReadOnlyDatabase) -> None:
    queries = [
        "SELECT name FROM sqlite_schema WHERE type = 'table'",
        "SELECT name, type FROM pragma_table_info('orders')",
        "PRAGMA table_list",
        "SELECT count(*) FROM json_each('[1, 2, 3]')",
        "SELECT json_group_array(json_object('id', customer_id, 'name', name)) FROM customers",
        "SELECT name, RANK() OVER (ORDER BY price DESC) FROM products LIMIT 3",
        "SELECT strftime('%Y', order_date) y, count(*) FROM orders GROUP BY y",
        "SELECT name FROM customers WHERE name LIKE '%a\\_%' ESCAPE '\\' OR name GLOB '[A-M]*'",
        "SELECT category FROM products UNION SELECT status FROM orders UNION SELECT city "
        "FROM customers",
        "SELECT length(group_concat(order_id || ',' || order_date || ',' || status, ';')) "
        "FROM orders",
        "SELECT round(avg(price), 2), printf('%.2f', sum(price)), instr(max(name), 'a'), "
        "replace(min(name), 'a', 'b'), trim(' x '), '{\"a\": 1}' ->> '$.a' FROM products",
        "EXPLAIN QUERY PLAN SELECT * FROM orders WHERE customer_id = 3",
    ]
    for sql in queries:
        assert db.query(sql).splitlines()[-1].endswith(("row)", "rows)")), sql


def test_every_reference_query_runs_under_the_limits() -> None:
    for split in ("train", "val", "test"):
        for task in get_tasks(split):
            meta = task.metadata
            db = ReadOnlyDatabase(build_tables(meta["schema"], meta["db_seed"]))
            assert db.execute(meta["sql"])[1][0][0] == task.target
            db.close()


# --- off the event loop ---------------------------------------------------------------------------


def _call(*sqls: str) -> dict[str, Any]:
    calls = [
        {"id": f"c{i}", "function": {"name": "query", "arguments": json.dumps({"sql": sql})}}
        for i, sql in enumerate(sqls)
    ]
    return {"role": "assistant", "content": "", "tool_calls": calls}


def test_hostile_queries_are_tool_errors_and_the_episode_goes_on() -> None:
    """Through ``SQLEnv.step``: the issue's query, a row of quadratic calls, a doubling CTE,
    ``fts3_tokenizer``, a lone surrogate, invalid UTF-8 for a checked built-in."""
    env = SQLEnv()
    asyncio.run(env.reset(get_tasks("val")[0]))
    sqls = [ISSUE_QUERY, ROWS["glob row"], cte_chain(20), "SELECT fts3_tokenizer('simple')"]
    sqls += ["SELECT '\ud800'", "SELECT instr(CAST(x'ff' AS TEXT), 'a')", "SELECT 1"]
    start = time.perf_counter()
    result = asyncio.run(env.step(_call(*sqls)))
    assert time.perf_counter() - start < 1.0 + SLACK_S  # the one time limit is 1 s here
    assert not result.terminated
    issue, row, cte, fts3, surrogate, utf8, fine = [m["content"] for m in result.messages[-7:]]
    assert issue.endswith("(1 row)") and fine.endswith("(1 row)")
    assert row.startswith("tool_error: the query ran longer than its time limit (1 s")
    assert cte.startswith("tool_error: the query is too large once each reference")
    assert "function fts3_tokenizer() is not allowed" in fts3
    assert "not valid Unicode (a lone surrogate at character 8)" in surrogate
    assert "could not read its arguments (text that is not valid UTF-8?)" in utf8
    asyncio.run(env.close())


def test_a_program_past_the_instruction_limit_is_a_tool_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(SQLITE_LIMITS, sqlite3.SQLITE_LIMIT_VDBE_OP, 20)
    db = ReadOnlyDatabase(build_tables("shop", 1))
    text, _elapsed = timed(db, "SELECT " + ", ".join(["1"] * 50))
    assert text.startswith("tool_error: the query is too complex to compile"), text
    db.close()


def test_a_slow_query_does_not_stall_another_episode(monkeypatch: pytest.MonkeyPatch) -> None:
    """Deterministic: the slow episode's query holds its thread until the other episode has run
    to its end; on the event loop it would hold the loop and the test would fail."""
    started, release = threading.Event(), threading.Event()
    slow_task, fast_task = get_tasks("val")[:2]

    async def run() -> None:
        slow, fast = SQLEnv(), SQLEnv()
        await slow.reset(slow_task)
        messages = await fast.reset(fast_task)
        real = slow._db.query

        def held_query(sql: str, **kwargs: Any) -> str:
            started.set()
            release.wait(10)  # a slow (but bounded) query
            return real(sql, **kwargs)

        monkeypatch.setattr(slow._db, "query", held_query)
        slow_step = asyncio.create_task(slow.step(_call("SELECT 1")))
        await asyncio.to_thread(started.wait, 10)
        step = await fast.step(oracle_action(fast_task, messages))
        done = await fast.step(oracle_action(fast_task, step.messages))
        assert done.terminated and done.reward == 1.0
        assert not slow_step.done()  # the other episode finished while this one ran
        release.set()
        result = await slow_step
        assert result.messages[-1]["content"].endswith("(1 row)")
        await slow.close()
        await fast.close()

    asyncio.run(run())


def test_the_time_limit_holds_on_the_query_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two episodes at once, one with a runaway query (3 s limit here): the other finishes first,
    the runaway query is stopped at its limit on its thread."""
    slower = functools.partial(ReadOnlyDatabase, timeout_s=3.0)
    monkeypatch.setattr(env_module, "ReadOnlyDatabase", slower)
    order: list[str] = []

    async def episode(task_index: int, sql: str, name: str) -> str:
        env = SQLEnv()
        await env.reset(get_tasks("val")[task_index])
        result = await env.step(_call(sql))
        order.append(name)
        await env.close()
        return result.messages[-1]["content"]

    async def run() -> tuple[str, str]:
        slow = asyncio.create_task(episode(0, FOREVER, "slow"))
        await asyncio.sleep(0.05)
        return await episode(1, "SELECT COUNT(*) FROM sqlite_schema", "fast"), await slow

    start = time.perf_counter()
    fast, slow = asyncio.run(run())
    assert order == ["fast", "slow"] and fast.endswith("(1 row)")
    assert slow.startswith("tool_error: the query ran longer than its time limit (3 s")
    assert time.perf_counter() - start < 3.0 + SLACK_S


def test_close_during_a_query_interrupts_it() -> None:
    db = ReadOnlyDatabase(build_tables("shop", 2), timeout_s=30.0)
    outcome: list[str] = []
    worker = threading.Thread(target=lambda: outcome.append(timed(db, FOREVER)[0]))
    worker.start()
    for _ in range(500):  # until the query runs
        if db._running:
            break
        time.sleep(0.01)
    start = time.perf_counter()
    db.close()  # from another thread, while the query runs
    assert db.closed and time.perf_counter() - start < 0.1  # close() does not wait
    worker.join(5)
    assert not worker.is_alive() and outcome[0].startswith("tool_error: ")
    with pytest.raises(ToolArgumentError, match="no database is open"):
        db.query("SELECT 1")


def test_one_query_at_a_time_per_database(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(database_module, "BUSY_WAIT_S", 0.1)
    db = ReadOnlyDatabase(build_tables("shop", 2), timeout_s=1.0)
    worker = threading.Thread(target=timed, args=(db, FOREVER))
    worker.start()
    time.sleep(0.2)
    text, _elapsed = timed(db, "SELECT 1")
    assert text.startswith("tool_error: the previous query of this episode is still running")
    worker.join(5)
    assert db.query("SELECT 1").endswith("(1 row)")
    db.close()


# --- attach, pragmas, hidden tables, JSON, windows, parser depth, joins ---------------------------

R = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT {n}) "
SQL_CASES = {
    # name: (query, what the result or the tool_error must contain)
    "attach by URI": ("ATTACH 'file:/etc/passwd?mode=ro' AS x", "refused: ATTACH"),
    "vacuum into": ("VACUUM INTO '/tmp/llm_gym_hostile.db'", "refused: ATTACH"),
    "writable_schema": ("PRAGMA writable_schema=1", "refused: PRAGMA writable_schema"),
    "database_list": ("PRAGMA database_list", "refused: PRAGMA database_list"),
    "pragma look-alike": ("PRAGMA table_\u0131nfo(orders)", "refused: PRAGMA"),  # dotless i
    "function look-alike": ("SELECT load_extens\u0131on('x')", "no such function"),
    "kelvin sign": ("SELECT \u212aoalesce(1)", "no such function"),
    "pragma function_list": ("SELECT * FROM pragma_function_list", "read-only"),
    "dbstat": ("SELECT * FROM dbstat", "read-only"),
    "CTE named dbstat": ("WITH dbstat(x) AS (SELECT 1) SELECT * FROM dbstat", "(1 row)"),
    "temp view": ("CREATE TEMP VIEW v AS SELECT 1", "read-only"),
    "temp trigger": (
        "CREATE TEMP TRIGGER t AFTER INSERT ON orders BEGIN SELECT 1; END",
        "read-only",
    ),
    "returning": ("INSERT INTO orders DEFAULT VALUES RETURNING *", "refused: INSERT"),
    "savepoint": ("SAVEPOINT a", "read-only"),
    "json deep": ("SELECT json(printf('%.*c', 9990, '[') || printf('%.*c', 9990, ']'))", "JSON"),
    "json path": ("SELECT json_extract('{}', '$' || printf('%.*c', 19000, '.'))", "JSON path"),
    "window": (
        R.format(n=20000) + "SELECT max(s) FROM (SELECT sum(x) OVER (ORDER BY x ROWS BETWEEN "
        "UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING) s FROM c)",
        "(1 row)",
    ),
    "huge IN": ("SELECT 1 WHERE 1 IN (" + ",".join(map(str, range(900))) + ")", "(1 row)"),
    "deep subquery": ("SELECT " + "(SELECT " * 120 + "1" + ")" * 120, "parser stack overflow"),
    "deep parentheses": ("SELECT " + "(" * 1900 + "1" + ")" * 1900, "parser stack overflow"),
    "cross join": ("SELECT count(*) FROM orders a, orders b, orders c, orders d, orders e", "time"),
    "60 joins": ("SELECT count(*) FROM " + ", ".join(["orders"] * 60), "time limit"),
    "printf float": ("SELECT length(printf('%.1000f', 1e308))", "(1 row)"),
    "integer overflow": ("SELECT abs(-9223372036854775808)", "integer overflow"),
    "recursive doubling": (
        "WITH RECURSIVE c(s) AS (SELECT 'a' UNION ALL SELECT s || s FROM c "
        "WHERE length(s) < 100000) SELECT max(length(s)) FROM c",
        "limited to 20,000 bytes",
    ),
    "distinct of long rows": (R.format(n=3000) + f"SELECT count(DISTINCT x || {A}) FROM c", ""),
    "explain": ("EXPLAIN SELECT 1", "opcode"),
}


@pytest.mark.parametrize("name", list(SQL_CASES))
def test_hostile_queries_are_results_or_tool_errors(db: ReadOnlyDatabase, name: str) -> None:
    sql, expected = SQL_CASES[name]
    start = time.perf_counter()
    try:
        text = db.query(sql)
    except ToolArgumentError as exc:
        text = f"tool_error: {exc}"
    assert time.perf_counter() - start < 1.5
    assert expected in text, text[:300]
    assert db.summary()["orders"] > 0  # nothing changed
    assert not os.path.exists("/tmp/llm_gym_hostile.db")


# --- printf's %c repeat count ---------------------------------------------------------------------


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
def test_sql_printf_repeat_count_is_bounded(db: ReadOnlyDatabase, call: str) -> None:
    """``%c`` with a precision repeats the character inside one SQLite instruction, where no
    deadline check runs: the count is lowered to one past the length limit first, so the call
    gives SQLite's NULL at once."""
    start = time.perf_counter()
    _columns, rows, _cut = db.execute(f"SELECT {call}, {call}")
    assert rows == [(None, None)]
    assert time.perf_counter() - start < 1.0


def test_sql_printf_gives_sqlites_results(db: ReadOnlyDatabase) -> None:
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
        assert db.execute(sql)[1] == plain.execute(sql).fetchall(), sql
    plain.close()
