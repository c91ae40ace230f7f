"""SQL-v0: answer a question about a per-task SQLite database through read-only SQL tools.

Every task names a schema and a database seed (``task.metadata``); ``reset`` builds that database
in memory (a few hundred rows) and locks it read-only. The model explores it
with ``list_tables``, ``describe`` and ``query`` and then replies with only the answer. The
module reads top to bottom: constants, scoring, the environment and its tools, the oracle.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from llm_gym.core.task import Task
from llm_gym.core.tool import FunctionTool
from llm_gym.core.tool_env import ToolEnv, answers_match
from llm_gym.core.types import Message, ToolCall
from llm_gym.envs.sql.database import MAX_ROWS, QUERY_TIMEOUT_S, ReadOnlyDatabase
from llm_gym.envs.sql.schemas import build_tables, check_database_spec
from llm_gym.envs.sql.tasks import EXACT_TOLERANCE
from llm_gym.errors import InvalidArgumentError, ToolArgumentError

__all__ = [
    "EPISODE_QUERY_BUDGET_S",
    "ORACLE_MAX_QUERIES",
    "QUERY_THREADS",
    "SYSTEM_PROMPT",
    "VERSION",
    "SQLEnv",
    "oracle_action",
    "query_pool",
    "strip_answer",
]

# --- constants -----------------------------------------------------------------------------------

VERSION = "0"
"""Bumped whenever tasks, tools or rewards change (records carry it)."""

SYSTEM_PROMPT = (
    "You answer questions about a SQLite database that you cannot see: look the data up. "
    "list_tables lists the tables, describe shows a table's columns, and query runs one "
    f"read-only SQL statement (SELECT or WITH; at most {MAX_ROWS} rows are shown, "
    f"{QUERY_TIMEOUT_S:g} s per query). When you know the answer, reply with only the answer: "
    "a number (rounded as the question asks) or a name, and nothing else."
)

EPISODE_QUERY_BUDGET_S = 10.0
"""Wall-clock seconds all the queries of one episode may take together (each query also stops
after ``QUERY_TIMEOUT_S``), so that many slow calls cannot stall a rollout."""
ORACLE_MAX_QUERIES = 3
"""The oracle re-runs its reference query at most this many times before giving up."""
QUERY_THREADS = min(32, (os.cpu_count() or 1) + 4)
"""Worker threads that run the queries of all SQL-v0 episodes of a process, off the event loop:
a slow query (up to ``QUERY_TIMEOUT_S``) holds one thread, never the loop. Python's default for
``asyncio.to_thread``; a pool of its own, so other work's threads are not taken."""

_QUOTES = ('"', "'", "`", "**", "*")


_MAX_QUOTE_LAYERS = 8
"""Layers of quotes :func:`strip_answer` removes at most (each copies the text: a bound keeps a
reply of a million backticks linear)."""


def strip_answer(answer: str) -> str:
    """A final reply without surrounding quotes, backticks or bold markers (``"Oslo"`` -> Oslo),
    up to :data:`_MAX_QUOTE_LAYERS` layers of them."""
    text = answer.strip()
    changed = True
    for _ in range(_MAX_QUOTE_LAYERS):
        if not changed or len(text) < 2:
            break
        changed = False
        for mark in _QUOTES:
            if len(text) > 2 * len(mark) - 1 and text.startswith(mark) and text.endswith(mark):
                text, changed = text[len(mark) : -len(mark)].strip(), True
                break
    return text


# --- the query threads ----------------------------------------------------------------------------

_pool: tuple[int, ThreadPoolExecutor] | None = None
_pool_lock = threading.Lock()


def _forget_pool() -> None:  # a forked child has none of its parent's threads
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_pool)


def query_pool() -> ThreadPoolExecutor:
    """The process's :data:`QUERY_THREADS` query threads (started on first use)."""
    global _pool
    with _pool_lock:
        if _pool is None or _pool[0] != os.getpid():
            executor = ThreadPoolExecutor(QUERY_THREADS, thread_name_prefix="llm_gym-sql")
            _pool = (os.getpid(), executor)
        return _pool[1]


# --- the environment ------------------------------------------------------------------------------


class SQLEnv(ToolEnv):
    """Answer a question about the task's SQLite database with ``list_tables``, ``describe``,
    ``query``.

    ## Observation
    The system prompt, then the question with the name of its database instance.

    ## Action Space
    Tool calls, or a final reply without tool calls (the answer).

    ## Reward
    1.0 when the final reply matches the target, else 0.0. Numbers: within 0.01 when the question
    asks for 2 decimal places, else exactly (absolute tolerance 1e-6); thousands separators and a
    trailing period are ignored and the whole reply must be the number. Names: case-insensitive.
    Surrounding quotes, backticks and ``**`` are ignored.

    ## Episode End
    Terminated by a reply without tool calls (the final answer).

    ## Version History
    - v0: first release.
    """

    system_prompt = SYSTEM_PROMPT
    max_tokens_per_turn = 160
    """A turn is one tool call (a query with a join, a grouping and an order is about 75
    tokens) or the short answer."""

    def __init__(self) -> None:
        self._db: ReadOnlyDatabase | None = None
        self._queries = 0
        self._query_seconds = 0.0
        super().__init__(tools=self._make_tools())

    def _make_tools(self) -> list[FunctionTool]:
        return [
            FunctionTool(self.list_tables, name="list_tables"),
            FunctionTool(self.describe, name="describe"),
            FunctionTool(self.query, name="query"),
        ]

    # --- tools (bound to this episode's database) -------------------------------------------
    def _database(self) -> ReadOnlyDatabase:
        if self._db is None or self._db.closed:
            raise InvalidArgumentError("No database is open: call reset(task) first.")
        return self._db

    def list_tables(self) -> str:
        """List the database's tables with their row counts, one per line."""
        return "\n".join(
            f"{name} ({rows} rows)" for name, rows in self._database().summary().items()
        )

    def describe(self, table: str) -> str:
        """Show a table's columns and their types.

        Args:
            table: The table's name, as list_tables shows it.
        """
        return self._database().describe(table)

    async def query(self, sql: str) -> str:
        """Run one read-only SQL statement (SELECT or WITH) and return the rows as text.

        Args:
            sql: A single SQLite statement, for example 'SELECT COUNT(*) FROM orders'.
        """
        database = self._database()
        remaining = EPISODE_QUERY_BUDGET_S - self._query_seconds
        if remaining <= 0:
            raise ToolArgumentError(
                f"this episode's query time budget ({EPISODE_QUERY_BUDGET_S:g} s) is spent; "
                "reply with your answer."
            )
        self._queries += 1
        await asyncio.sleep(0)  # suspend before asking for the loop (Env.synchronous's contract)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(query_pool(), self._timed_query, database, sql, remaining)

    def _timed_query(self, database: ReadOnlyDatabase, sql: str, budget_s: float) -> str:
        """One query, on a query thread; its time (not the wait for a thread) is the episode's."""
        start = time.perf_counter()
        try:
            return database.query(sql, timeout_s=budget_s)
        finally:
            if database is self._db:  # not a query the episode's caller gave up on
                self._query_seconds += time.perf_counter() - start

    @property
    def synchronous(self) -> bool:
        """True, although ``query`` awaits a query thread: it suspends before it asks for the
        event loop, so a synchronous caller (``TextEnv``) drives each step directly and
        finishes only a query step on its loop, as ``Env.synchronous`` allows; every other
        step costs no loop round trip."""
        return True

    # --- episode ----------------------------------------------------------------------------------
    async def reset(self, task: Task) -> list[Message]:
        schema, db_seed = task.metadata.get("schema"), task.metadata.get("db_seed")
        check_database_spec(schema, db_seed)
        self._close_database()
        self._db = ReadOnlyDatabase(build_tables(schema, db_seed))
        self._queries = 0
        self._query_seconds = 0.0
        return await super().reset(task)

    def score(self, answer: str, task: Task) -> float:
        tolerance = float(task.metadata.get("tolerance", EXACT_TOLERANCE))
        matched = answers_match(strip_answer(answer), task.target, rel_tol=0.0, abs_tol=tolerance)
        return 1.0 if matched else 0.0

    def metrics(self, answer: str | None, task: Task) -> dict[str, Any]:
        return {"answered": answer is not None, "queries": self._queries}

    def _close_database(self) -> None:
        if self._db is not None:
            db, self._db = self._db, None
            db.close()

    async def close(self) -> None:
        """Close the episode's database connection. Safe to call more than once."""
        self._close_database()

    # --- pickling: the connection is rebuilt from the task (the database is a pure function) ---
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_reopen"] = self._db is not None and not self._db.closed
        state["_db"] = None
        del state["_tools"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        reopen = state.pop("_reopen")
        self.__dict__.update(state)
        self._tools = {t.name: t for t in self._make_tools()}
        if reopen and self._task is not None:
            meta = self._task.metadata
            self._db = ReadOnlyDatabase(build_tables(meta["schema"], meta["db_seed"]))


# --- the oracle ---------------------------------------------------------------------------------


def _call(index: int, name: str, arguments: dict[str, Any]) -> ToolCall:
    return {
        "id": f"oracle_{index}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


def _first_cell(result: str) -> str | None:
    """The first cell of the first row of a ``query`` result, or None for an error/no rows."""
    if result.startswith("tool_error"):
        return None
    lines = result.splitlines()
    if len(lines) < 3:  # header, at least one row, footer
        return None
    return lines[1].split(" | ")[0]


def _reference_results(sql: str, messages: Sequence[Message]) -> list[str]:
    """The results of the ``query`` calls that ran ``sql``, in order.

    ``ToolEnv`` answers an assistant message's tool calls with tool messages in the same order,
    so the i-th tool message after an assistant message answers its i-th call.
    """
    results: list[str] = []
    pending: list[bool] = []
    for message in messages:
        if message.get("role") == "assistant":
            pending = []
            for call in message.get("tool_calls") or []:
                function = call.get("function") or {}
                try:
                    arguments = json.loads(function.get("arguments") or "{}")
                except (TypeError, ValueError, RecursionError):
                    arguments = {}
                pending.append(
                    function.get("name") == "query"
                    and isinstance(arguments, dict)
                    and arguments.get("sql") == sql
                )
        elif message.get("role") == "tool" and pending and pending.pop(0):
            results.append(str(message.get("content") or ""))
    return results


def oracle_action(task: Task, messages: Sequence[Message]) -> Message:
    """The expert's next assistant message: run the reference SQL, answer with its first cell.

    Reads the answer from the result of its own ``query`` call in ``messages`` (never from the
    target); an error result is retried up to :data:`ORACLE_MAX_QUERIES` queries in all.
    """
    sql = task.metadata.get("sql")
    if not isinstance(sql, str):
        raise InvalidArgumentError(
            f"The SQL-v0 oracle needs the reference query in metadata['sql'], actual value: "
            f"{sql!r:.80}."
        )
    results = _reference_results(sql, messages)
    answer = _first_cell(results[-1]) if results else None
    if answer is not None:
        return Message(role="assistant", content=answer)
    if len(results) < ORACLE_MAX_QUERIES:
        call = _call(len(results), "query", {"sql": sql})
        return Message(role="assistant", content="", tool_calls=[call])
    return Message(role="assistant", content="I could not find the answer.")
