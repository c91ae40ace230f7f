"""SQL-v0: tasks and splits, the read-only database and its limits, the reward, the oracle."""

from __future__ import annotations

import asyncio
import doctest
import json
import pickle
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

import llm_gym.envs.sql.database as database_module
import llm_gym.envs.sql.env as env_module
from llm_gym import InvalidArgumentError, ToolArgumentError
from llm_gym.core.task import Task
from llm_gym.envs.sql import (
    MAX_ROWS,
    SCHEMAS,
    SPLIT_SIZES,
    ReadOnlyDatabase,
    SQLEnv,
    build_tables,
    generate_tasks,
    get_tasks,
    oracle_action,
)
from llm_gym.policies import PolicyRequest, RandomPolicy
from tests.conftest import play_text_episode

# --- tasks and splits -----------------------------------------------------------------------------


def test_splits_are_disjoint_with_their_own_databases() -> None:
    splits = {name: get_tasks(name) for name in SPLIT_SIZES}
    assert {name: len(tasks) for name, tasks in splits.items()} == SPLIT_SIZES
    prompts = [t.prompt for tasks in splits.values() for t in tasks]
    seeds = [t.metadata["db_seed"] for tasks in splits.values() for t in tasks]
    assert len(set(prompts)) == len(prompts) == sum(SPLIT_SIZES.values())
    assert len(set(seeds)) == len(seeds)  # no database instance is in two tasks, let alone splits
    assert len({t.id for tasks in splits.values() for t in tasks}) == len(prompts)
    with pytest.raises(InvalidArgumentError, match="split must be one of"):
        get_tasks("dev")


def test_val_covers_every_schema_and_the_question_types() -> None:
    tasks = get_tasks("val")
    assert {t.metadata["schema"] for t in tasks} == set(SCHEMAS)
    types = {t.metadata["type"] for t in tasks}
    assert {"count", "sum", "average", "top", "group_by", "join_count", "anti_join"} <= types
    rounded = [t for t in tasks if t.metadata["rounded"]]
    assert rounded and all("2 decimal places" in t.prompt for t in rounded)
    assert all("ROUND(" in t.metadata["sql"] for t in rounded)
    assert all(isinstance(t.target, str) for t in tasks if t.metadata["type"] == "top")


def test_generator_and_databases_are_pure_functions_of_their_seeds() -> None:
    assert generate_tasks(5, 20) == generate_tasks(5, 20)
    assert generate_tasks(5, 20) != generate_tasks(6, 20)
    first = build_tables("shop", 42)
    build_tables.cache_clear()
    assert build_tables("shop", 42) == first
    assert build_tables("shop", 43) != first
    with pytest.raises(InvalidArgumentError, match="metadata\\['schema'\\]"):
        build_tables("zoo", 1)


def test_the_reference_sql_gives_the_target_on_a_fresh_database() -> None:
    for task in get_tasks("val")[:40]:
        db = ReadOnlyDatabase(build_tables(task.metadata["schema"], task.metadata["db_seed"]))
        _columns, rows, _cut = db.execute(task.metadata["sql"])
        db.close()
        assert rows[0][0] == task.target, task.prompt


# --- the reward -----------------------------------------------------------------------------------


def _episode(task: Task, final_answer: str) -> float:
    async def run() -> float:
        env = SQLEnv()
        messages = await env.reset(task)
        result = await env.step(oracle_action(task, messages))
        assert not result.terminated
        result = await env.step({"role": "assistant", "content": final_answer})
        assert result.terminated and result.metrics["queries"] == 1
        await env.close()
        return result.reward

    return asyncio.run(run())


def _first(kind: str, **metadata: Any) -> Task:
    return next(
        t
        for t in get_tasks("val")
        if t.metadata["type"] == kind and all(t.metadata[k] == v for k, v in metadata.items())
    )


def test_reward_on_hand_made_transcripts() -> None:
    count = _first("count")
    assert _episode(count, str(count.target)) == 1.0
    assert _episode(count, f"{count.target}.") == 1.0
    assert _episode(count, str(count.target + 1)) == 0.0
    assert _episode(count, f"There are {count.target}.") == 0.0

    big = next(t for t in get_tasks("val") if isinstance(t.target, int) and t.target > 10_000)
    assert _episode(big, f"{big.target:,}") == 1.0
    assert _episode(big, str(big.target + 1)) == 0.0  # exact: no relative tolerance

    rounded = _first("average", rounded=True)
    assert _episode(rounded, f"{rounded.target:.2f}") == 1.0
    assert _episode(rounded, f"{rounded.target + 0.01:.2f}") == 1.0  # a half-way rounding
    assert _episode(rounded, f"{rounded.target + 0.02:.2f}") == 0.0

    top = _first("top")
    assert _episode(top, top.target.upper()) == 1.0
    assert _episode(top, f'"{top.target}"') == 1.0
    assert _episode(top, f"**{top.target}**") == 1.0
    assert _episode(top, f"<think>hmm</think> {top.target}") == 1.0
    assert _episode(top, f"{top.target} and others") == 0.0


def test_oracle_answers_from_the_tool_result_and_retries_errors() -> None:
    task = _first("count")
    opening = [
        {"role": "system", "content": "..."},
        {"role": "user", "content": task.prompt},
    ]
    first = oracle_action(task, opening)
    call = first["tool_calls"][0]["function"]
    assert call["name"] == "query" and json.loads(call["arguments"]) == {
        "sql": task.metadata["sql"]
    }

    def tool(content: str) -> dict[str, Any]:
        return {"role": "tool", "name": "query", "content": content, "tool_call_id": "x"}

    answered = oracle_action(task, [*opening, first, tool("COUNT(*)\n12345\n(1 row)")])
    assert answered == {"role": "assistant", "content": "12345"}
    error = tool("tool_error: SQL error: boom")
    retry = oracle_action(task, [*opening, first, error])
    assert retry["tool_calls"][0]["function"]["name"] == "query"
    gave_up = oracle_action(task, [*opening, first, error, first, error, first, error])
    assert not gave_up.get("tool_calls") and "could not" in gave_up["content"]
    with pytest.raises(InvalidArgumentError, match="metadata\\['sql'\\]"):
        oracle_action(Task("How many?", 3, {"schema": "shop", "db_seed": 1}), opening)


# --- tools, safety and limits ---------------------------------------------------------------------


def _tool_results(env: SQLEnv, calls: Sequence[tuple[str, Any]]) -> list[str]:
    message = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": str(i),
                "type": "function",
                "function": {
                    "name": name,
                    "arguments": args if isinstance(args, str) else json.dumps(args),
                },
            }
            for i, (name, args) in enumerate(calls)
        ],
    }
    result = asyncio.run(env.step(message))
    assert not result.terminated
    return [m["content"] for m in result.messages[-len(calls) :]]


@pytest.fixture
def shop_env() -> SQLEnv:
    env = SQLEnv()
    task = _first("count", schema="shop")
    asyncio.run(env.reset(task))
    yield env
    asyncio.run(env.close())


def test_list_tables_describe_and_query(shop_env: SQLEnv) -> None:
    tables, described, table_info, rows = _tool_results(
        shop_env,
        [
            ("list_tables", {}),
            ("describe", {"table": "ORDERS"}),
            ("query", {"sql": "PRAGMA table_info(orders)"}),
            ("query", {"sql": "SELECT name, city FROM customers ORDER BY customer_id LIMIT 2;"}),
        ],
    )
    assert [line.split()[0] for line in tables.splitlines()] == [
        "customers",
        "products",
        "orders",
        "order_items",
    ]
    assert "order_date TEXT NOT NULL  -- YYYY-MM-DD" in described
    assert "customer_id" in table_info
    lines = rows.splitlines()
    assert lines[0] == "name | city" and lines[-1] == "(2 rows)" and len(lines) == 4


def test_writes_attach_pragmas_and_extensions_are_refused(
    shop_env: SQLEnv, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    count = "SELECT COUNT(*) FROM orders"
    hostile = [
        ("ATTACH '/etc/passwd' AS p", "ATTACH '/etc/passwd'"),
        ("ATTACH 'x.db' AS x", "ATTACH 'x.db'"),
        ("VACUUM INTO 'copy.db'", "read-only"),
        ("DELETE FROM orders", "DELETE on orders"),
        ("UPDATE products SET price = 0", "UPDATE on products"),
        ("DROP TABLE orders", "DELETE on sqlite_master"),
        ("INSERT INTO orders VALUES (999, 1, '2024-01-01', 'shipped')", "INSERT on orders"),
        ("CREATE TEMP TABLE t(a)", "read-only"),
        ("PRAGMA query_only = OFF", "PRAGMA query_only = OFF"),
        ("PRAGMA writable_schema = ON", "PRAGMA writable_schema"),
        ("BEGIN", "read-only"),
    ]
    before = _tool_results(shop_env, [("query", {"sql": count})])[0]
    results = _tool_results(shop_env, [("query", {"sql": sql}) for sql, _ in hostile])
    for (sql, expected), content in zip(hostile, results, strict=True):
        assert content.startswith("tool_error: the database is read-only"), (sql, content)
        assert expected in content, (sql, content)
    assert _tool_results(shop_env, [("query", {"sql": count})])[0] == before
    assert list(tmp_path.iterdir()) == []  # nothing was written next to us


def test_bad_calls_are_tool_errors_that_name_the_problem(shop_env: SQLEnv) -> None:
    cases = [
        ("query", {"sql": "SELECT 1; DELETE FROM orders"}, "only one SQL statement"),
        ("query", {"sql": "SELEC 1"}, 'near "SELEC": syntax error'),
        ("query", {"sql": "SELECT * FROM nope"}, "no such table: nope"),
        ("query", {"sql": "x" * 100_000}, "at most 4,000 are allowed"),
        ("query", {"sql": "  "}, "the SQL text is empty"),
        ("query", {"sql": 5}, "'sql' must be of type string"),
        ("query", {}, "missing required argument(s) ['sql']"),
        ("query", '{"sql": ', "arguments are not valid JSON"),
        ("query", {"sql": "SELECT randomblob(10000000)"}, "string or blob too big"),
        ("describe", {"table": "passwords"}, "no table named 'passwords'; tables: customers"),
        ("drop_table", {"name": "orders"}, "unknown tool 'drop_table'"),
    ]
    results = _tool_results(shop_env, [(name, args) for name, args, _ in cases])
    for (name, _args, expected), content in zip(cases, results, strict=True):
        assert content.startswith("tool_error: ") and expected in content, (name, content)
        assert len(content) < 400


def test_row_and_output_limits(shop_env: SQLEnv) -> None:
    many, wide = _tool_results(
        shop_env,
        [
            ("query", {"sql": "SELECT * FROM order_items"}),
            ("query", {"sql": "SELECT printf('%.500c', 'x') FROM order_items"}),
        ],
    )
    lines = many.splitlines()
    assert len(lines) == MAX_ROWS + 2 and "showing the first 50 rows" in lines[-1]
    assert len(wide) <= database_module.MAX_OUTPUT_CHARS + 100
    assert "output cut at" in wide and all(len(line) <= 200 for line in wide.splitlines())


def test_a_runaway_query_stops_within_about_a_second(shop_env: SQLEnv) -> None:
    forever = (
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT COUNT(*) FROM c"
    )
    start = time.perf_counter()
    content = _tool_results(shop_env, [("query", {"sql": forever})])[0]
    elapsed = time.perf_counter() - start
    assert content.startswith("tool_error: the query ran longer than its time limit")
    assert 0.9 < elapsed < 2.0
    assert "(1 row)" in _tool_results(shop_env, [("query", {"sql": "SELECT 1"})])[0]


def test_a_memory_hungry_query_is_stopped(shop_env: SQLEnv) -> None:
    # 900-byte distinct rows (built without printf: a checked function, one Python call per row,
    # would take the query near its time limit before the memory limit on a loaded machine)
    hungry = (
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) "
        "SELECT DISTINCT x || hex(zeroblob(450)) FROM c ORDER BY 1 LIMIT 1"
    )
    content = _tool_results(shop_env, [("query", {"sql": hungry})])[0]
    assert content.startswith("tool_error: the query needed more than 64 MiB of memory")


def test_the_episode_query_time_budget(shop_env: SQLEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(env_module, "EPISODE_QUERY_BUDGET_S", 0.2)
    forever = (
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT COUNT(*) FROM c"
    )
    start = time.perf_counter()
    slow, refused = _tool_results(shop_env, [("query", {"sql": forever}), ("query", {"sql": "1"})])
    assert time.perf_counter() - start < 0.8
    assert slow.startswith("tool_error: the query ran longer than its time limit")
    assert refused.startswith("tool_error: this episode's query time budget (0.2 s) is spent")


def test_close_closes_the_connection() -> None:
    env = SQLEnv()
    asyncio.run(env.reset(get_tasks("val")[0]))
    database = env._db
    assert database is not None and not database.closed
    asyncio.run(env.close())
    asyncio.run(env.close())
    assert database.closed
    content = _tool_results(env, [("query", {"sql": "SELECT 1"})])[0]
    assert content.startswith("tool_error: No database is open")


def test_reset_rejects_a_task_without_a_database() -> None:
    with pytest.raises(InvalidArgumentError, match="metadata\\['schema'\\] in"):
        asyncio.run(SQLEnv().reset(Task("How many?", 3)))
    with pytest.raises(InvalidArgumentError, match="metadata\\['db_seed'\\] as an int"):
        asyncio.run(SQLEnv().reset(Task("How many?", 3, {"schema": "shop", "db_seed": "7"})))


def test_database_doctest_and_direct_errors() -> None:
    result = doctest.testmod(database_module)
    assert result.failed == 0 and result.attempted > 0
    db = ReadOnlyDatabase(build_tables("library", 1))
    db.close()
    with pytest.raises(ToolArgumentError, match="no database is open"):
        db.query("SELECT 1")


# --- through gymnasium ----------------------------------------------------------------------------


def test_pickle_mid_episode_rebuilds_the_database() -> None:
    env = gym.make("SQL-v0")
    env.reset(seed=3)
    call = {"name": "query", "arguments": {"sql": "SELECT COUNT(*) FROM sqlite_master"}}
    env.step(f"<tool_call>{json.dumps(call)}</tool_call>")
    clone = pickle.loads(pickle.dumps(env))
    for _ in range(2):  # the reference query on the rebuilt database, then the answer
        action = env.unwrapped.oracle_action()
        assert clone.unwrapped.oracle_action() == action
        step, cloned_step = env.step(action), clone.step(action)
        assert step[:4] == cloned_step[:4]
        assert step[4]["messages"] == cloned_step[4]["messages"]
    assert step[1] == 1.0 and step[2]


def test_random_stays_under_five_percent() -> None:
    env = gym.make("SQL-v0")
    tasks = env.unwrapped.tasks("val")
    policy, fmt = RandomPolicy(seed=0), env.unwrapped.action_format

    def act(e: gym.Env, observation: str, info: dict[str, Any]) -> str:
        request = PolicyRequest(info["messages"], info["tool_specs"], info["task"], fmt)
        return asyncio.run(policy.act([request]))[0].text

    lucky = sum(
        play_text_episode(env, act, options={"split": "val", "index": i})[0] == 1.0
        for i in range(len(tasks))
    )
    assert lucky / len(tasks) < 0.05
