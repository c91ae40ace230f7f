"""``ReadOnlyDatabase``: an in-memory SQLite database the model may only read.

The database is built from plain rows, then locked: ``PRAGMA query_only=ON``, a default-deny
authorizer with allow-lists, SQLite's limits set low (:mod:`llm_gym.envs.sql.guard`), temporary
storage in memory. Each query runs under a wall-clock deadline enforced by a progress handler,
returns at most :data:`MAX_ROWS` rows and :data:`MAX_OUTPUT_CHARS` characters, and is a single
statement. Every refusal raises :class:`~llm_gym.errors.ToolArgumentError` with a message that
names the problem, which ``ToolEnv`` turns into a ``tool_error: ...`` tool message.

A query may run on any thread (the env runs it on a worker thread, off the event loop), one at a
time per database; :meth:`ReadOnlyDatabase.close` may be called from another thread meanwhile: it
interrupts the running query, whose thread then closes the connection.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from llm_gym.envs.sql.expansion import check_expansion
from llm_gym.envs.sql.guard import (
    MAX_SQL_CHARS,
    MAX_VALUE_BYTES,
    TABLE_VALUED_FUNCTIONS,
    Authorizer,
    CheckedFunctions,
    apply_limits,
    explain_limit,
    memory_meter,
    resident_memory_bytes,
)
from llm_gym.errors import ToolArgumentError

__all__ = [
    "MAX_CELL_CHARS",
    "MAX_OUTPUT_CHARS",
    "MAX_QUERY_MEMORY_BYTES",
    "MAX_ROWS",
    "MAX_SQL_CHARS",
    "MAX_VALUE_BYTES",
    "QUERY_TIMEOUT_S",
    "ReadOnlyDatabase",
    "Table",
    "format_value",
    "memory_meter",
    "resident_memory_bytes",
]

# --- limits (SQLite's own limits and the allow-lists are in llm_gym.envs.sql.guard) ---------------

MAX_ROWS = 50
"""Rows shown per query; more are cut with a note."""
MAX_CELL_CHARS = 200
"""Characters shown per cell; longer values are cut with ``...``."""
MAX_OUTPUT_CHARS = 4_000
"""Characters of one query result; longer output is cut with a note."""
QUERY_TIMEOUT_S = 1.0
"""Wall-clock budget of one query (preparing, running and fetching its rows)."""
MAX_QUERY_MEMORY_BYTES = 64 * 2**20
"""How much SQLite's memory may grow while one query runs (sorts, DISTINCT and temporary tables
live in memory); a query that passes it is stopped. The counter is the process's (SQLite keeps
no count per connection): queries of several episodes running at once add up in it."""
PROGRESS_INTERVAL = 1_000
"""SQLite virtual-machine instructions between two deadline checks."""
MEMORY_CHECK_EVERY = 10
"""Deadline checks between two memory checks."""
WARM_UP_SQL = " UNION ALL ".join(f"SELECT NULL FROM {f}" for f in TABLE_VALUED_FUNCTIONS)
"""Uses each of :data:`~llm_gym.envs.sql.guard.TABLE_VALUED_FUNCTIONS` once."""
MAX_FETCH_CHARS = 1_000_000
"""Characters of text and blob values fetched per query before the rest is cut (the output shows
4,000): 51 rows of 199 values of 20,000 bytes took 240 MB and 1.3 s to fetch."""
BUSY_WAIT_S = 5.0
"""How long a query waits for the same database's previous query (still running on another
thread after its caller gave up on it) before it is refused."""


# --- schema ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Table:
    """One table to create: its name, its column definitions and its rows."""

    name: str
    """The table's name (an SQL identifier)."""
    columns: tuple[tuple[str, str], ...]
    """``(column name, SQL type and constraints)`` pairs, in order."""
    rows: tuple[tuple[Any, ...], ...]
    """The rows, each a tuple with one value per column."""

    @property
    def create_sql(self) -> str:
        """The ``CREATE TABLE`` statement of this table."""
        lines = []
        for i, (name, kind) in enumerate(self.columns):
            # A column's type may end in an SQL "-- comment": one line per column, comma first.
            declaration, _, comment = kind.partition("--")
            comma = "," if i < len(self.columns) - 1 else ""
            note = f"  -- {comment.strip()}" if comment else ""
            lines.append(f"  {name} {declaration.strip()}{comma}{note}")
        body = "\n".join(lines)
        return f"CREATE TABLE {self.name} (\n{body}\n)"


def format_value(value: Any) -> str:
    """A cell as the model sees it: ``NULL``, numbers as Python writes them, text on one line."""
    if value is None:
        return "NULL"
    if isinstance(value, bytes):
        text = f"<blob {len(value)} bytes>"
    elif isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        text = f"{value:.1f}"
    else:
        text = str(value)
    text = text.replace("\r", "\\r").replace("\n", "\\n")
    return text if len(text) <= MAX_CELL_CHARS else text[: MAX_CELL_CHARS - 3] + "..."


# --- the database ---------------------------------------------------------------------------------


class ReadOnlyDatabase:
    """An in-memory SQLite database, built from ``tables`` and then read-only.

    Example:
        >>> db = ReadOnlyDatabase([Table("t", (("x", "INTEGER"),), ((1,), (2,)))])
        >>> print(db.query("SELECT SUM(x) AS total FROM t"))
        total
        3
        (1 row)
        >>> db.query("DELETE FROM t")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        llm_gym.errors.ToolArgumentError: the database is read-only: ... (refused: DELETE on t).
        >>> db.close()
    """

    def __init__(self, tables: Sequence[Table], *, timeout_s: float = QUERY_TIMEOUT_S) -> None:
        self._timeout_s = timeout_s
        self._deadline = 0.0
        self._stop_reason: str | None = None
        self._progress_calls = 0
        self._memory_start = 0
        self._memory_used = memory_meter()
        self._tables = tuple(tables)
        self._authorizer = Authorizer(t.name for t in self._tables)
        self._state = threading.Lock()  # guards _connection and _running
        self._running = False
        connection = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        try:
            connection.execute("BEGIN")
            for table in self._tables:
                connection.execute(table.create_sql)
                marks = ", ".join("?" * len(table.columns))
                connection.executemany(f"INSERT INTO {table.name} VALUES ({marks})", table.rows)
            connection.execute("COMMIT")
            connection.execute("PRAGMA temp_store = MEMORY")
            connection.execute("PRAGMA query_only = ON")
            # Table-valued functions are created on first use: before the authorizer.
            connection.execute(f"{WARM_UP_SQL} LIMIT 0").fetchall()
            apply_limits(connection)
            self._functions = CheckedFunctions(connection, self._check_deadline)
            connection.set_authorizer(self._authorizer)
            connection.set_progress_handler(self._check_limits, PROGRESS_INTERVAL)
        except BaseException:
            connection.close()
            raise
        self._connection: sqlite3.Connection | None = connection

    # --- guards -----------------------------------------------------------------------------------
    def _check_deadline(self) -> None:
        """Raise (which stops the statement) once the deadline has passed."""
        if time.perf_counter() > self._deadline:
            self._stop_reason = "time"
            raise TimeoutError("the query's deadline has passed")

    def _check_limits(self) -> int:
        """SQLite's progress handler: a nonzero return interrupts the running statement."""
        if time.perf_counter() > self._deadline:
            self._stop_reason = "time"
            return 1
        self._progress_calls += 1
        if (
            self._progress_calls % MEMORY_CHECK_EVERY == 0
            and self._memory_used() - self._memory_start > MAX_QUERY_MEMORY_BYTES
        ):
            self._stop_reason = "memory"
            return 1
        return 0

    # --- queries ----------------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._connection is None

    def _require_open(self) -> sqlite3.Connection:
        if self._connection is None:
            raise ToolArgumentError("no database is open: the episode has ended.")
        return self._connection

    def _check_text(self, sql: str) -> None:
        if not isinstance(sql, str):
            raise ToolArgumentError(f"Expected SQL text, actual type: {type(sql).__name__}.")
        if not sql.strip():
            raise ToolArgumentError("the SQL text is empty; send one SELECT statement.")
        if len(sql) > MAX_SQL_CHARS:
            raise ToolArgumentError(
                f"the SQL text has {len(sql):,} characters; at most {MAX_SQL_CHARS:,} are allowed."
            )
        if "\x00" in sql:
            raise ToolArgumentError("the SQL text contains a NUL character.")
        try:
            sql.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ToolArgumentError(
                f"the SQL text is not valid Unicode (a lone surrogate at character {exc.start})."
            ) from None

    def _claim(self, defined: frozenset[str], budget_s: float) -> sqlite3.Connection:
        """The open connection, marked running with the statement's state set (one query at a
        time per database; under the lock, so that :meth:`close` cannot come in between)."""
        waited_until = time.perf_counter() + BUSY_WAIT_S
        while True:
            with self._state:
                connection = self._require_open()
                if not self._running:
                    self._running = True
                    self._authorizer.begin(defined)
                    self._functions.error = None
                    self._stop_reason = None
                    self._progress_calls = 0
                    self._memory_start = self._memory_used()
                    self._deadline = time.perf_counter() + budget_s
                    return connection
            if time.perf_counter() > waited_until:
                raise ToolArgumentError(
                    "the previous query of this episode is still running; wait for its result."
                )
            time.sleep(0.005)

    def _release(self, connection: sqlite3.Connection) -> None:
        with self._state:
            self._running = False
            closed = self._connection is None
        if closed:  # close() came while the query ran: this thread closes the connection
            self._close(connection)

    def _close(self, connection: sqlite3.Connection) -> None:
        connection.close()
        self._functions.close()

    def execute(
        self, sql: str, *, max_rows: int = MAX_ROWS, timeout_s: float | None = None
    ) -> tuple[list[str], list[tuple], bool]:
        """Run one read-only statement; return (column names, up to ``max_rows`` rows, cut).

        ``timeout_s`` (default: the database's) bounds the wall-clock time of this statement.
        Callable from any thread; queries of one database run one at a time.

        Raises:
            ToolArgumentError: the SQL is empty, too long, not a single statement, too large
                once its CTEs are expanded, writes, fails, or runs past the deadline.
        """
        self._require_open()
        self._check_text(sql)
        defined = check_expansion(sql)
        budget = self._timeout_s if timeout_s is None else min(timeout_s, self._timeout_s)
        connection = self._claim(defined, budget)
        try:
            return self._run(connection, sql, max_rows)
        finally:
            self._release(connection)

    def _run(
        self, connection: sqlite3.Connection, sql: str, max_rows: int
    ) -> tuple[list[str], list[tuple], bool]:
        cursor = connection.cursor()
        try:
            cursor.execute(sql)
            rows, fetched = [], 0
            while len(rows) <= max_rows and fetched <= MAX_FETCH_CHARS:
                row = cursor.fetchone()
                if row is None:
                    break
                rows.append(row)
                fetched += sum(len(v) for v in row if isinstance(v, str | bytes))
            columns = [d[0] for d in cursor.description or ()]
        except sqlite3.ProgrammingError as exc:
            if "one statement at a time" in str(exc):
                raise ToolArgumentError(
                    "only one SQL statement per query is allowed; send the statements one at a "
                    "time (a trailing semicolon is fine)."
                ) from None
            raise ToolArgumentError(f"SQL error: {explain_limit(str(exc))}") from None
        except sqlite3.Error as exc:
            raise self._explain(exc) from None
        except MemoryError:  # SQLITE_NOMEM: the program outgrew SQLITE_LIMIT_VDBE_OP
            raise ToolArgumentError(
                "the query is too complex to compile (its program grew past SQLite's limit); "
                "split it into smaller queries."
            ) from None
        finally:
            cursor.close()
        return columns, rows[:max_rows], len(rows) > max_rows or fetched > MAX_FETCH_CHARS

    def _explain(self, exc: sqlite3.Error) -> ToolArgumentError:
        message, refused = str(exc), self._authorizer.refused
        if self._stop_reason == "time":
            return ToolArgumentError(
                f"the query ran longer than its time limit ({self._timeout_s:g} s at most) and "
                "was stopped; add a WHERE clause or LIMIT, or check a recursive CTE for an end "
                "condition."
            )
        if self._stop_reason == "memory":
            return ToolArgumentError(
                f"the query needed more than {MAX_QUERY_MEMORY_BYTES // 2**20} MiB of memory "
                "and was stopped; select fewer or shorter values, or add LIMIT."
            )
        if "user-defined function" in message:  # a checked built-in: its own error
            message = self._functions.error or (
                "LIKE, GLOB, instr, replace, trim or printf could not read its arguments (text "
                "that is not valid UTF-8?)"
            )
        if refused is not None and refused.startswith("function "):
            return ToolArgumentError(
                f"the SQL {refused} is not allowed; allowed: SQLite's core, aggregate, window, "
                "date and time, math and JSON functions."
            )
        if refused is not None and refused.startswith("reading "):
            return ToolArgumentError(
                f"{refused} is not allowed; the tables are: {', '.join(self.table_names())} "
                "(and sqlite_schema, json_each, json_tree, pragma_table_info, ...)."
            )
        denied = ("not authorized", "authorization", "readonly", "read-only")
        if refused is not None or any(word in message for word in denied):
            detail = f" (refused: {refused})" if refused else ""
            return ToolArgumentError(
                f"the database is read-only: only reading statements (SELECT, WITH, PRAGMA "
                f"table_info) are allowed{detail}."
            )
        if "attached" in message:
            return ToolArgumentError("attaching other databases is not allowed.")
        return ToolArgumentError(f"SQL error: {explain_limit(message)}")

    def query(self, sql: str, *, timeout_s: float | None = None) -> str:
        """Run one read-only statement and render its result as text.

        The first line holds the column names, then one line per row, cells separated by
        ``" | "``, then a count line; long results are cut with a note.
        """
        columns, rows, cut = self.execute(sql, timeout_s=timeout_s)
        lines = [" | ".join(columns) if columns else "(no columns)"]
        lines.extend(" | ".join(format_value(v) for v in row) for row in rows)
        text = "\n".join(lines)
        if cut:
            footer = (
                f"(showing the first {len(rows)} rows; the query returned more: "
                "aggregate or add LIMIT)"
            )
        else:
            footer = f"({len(rows)} row{'' if len(rows) == 1 else 's'})"
        if len(text) > MAX_OUTPUT_CHARS:
            text = text[:MAX_OUTPUT_CHARS].rsplit("\n", 1)[0]
            footer = (
                f"(output cut at {MAX_OUTPUT_CHARS:,} characters; select fewer columns or rows)"
            )
        return f"{text}\n{footer}"

    def table_names(self) -> list[str]:
        """The names of the tables, in creation order."""
        return [t.name for t in self._tables]

    def describe(self, table: str) -> str:
        """The row count and columns (name, type, notes) of ``table``; its name ignores case."""
        self._require_open()
        by_lower = {t.name.lower(): t for t in self._tables}
        found = by_lower.get(str(table).strip().strip('"`[]').lower())
        if found is None:
            raise ToolArgumentError(
                f"no table named {str(table)[:80]!r}; tables: {', '.join(self.table_names())}."
            )
        lines = [f"table {found.name} ({len(found.rows)} rows)"]
        lines.extend(f"  {name} {kind}" for name, kind in found.columns)
        return "\n".join(lines)

    def summary(self) -> Mapping[str, int]:
        """Row counts by table."""
        return {t.name: len(t.rows) for t in self._tables}

    def close(self) -> None:
        """Close the connection. Safe to call more than once, and from any thread: a query
        running meanwhile is interrupted, and its thread closes the connection."""
        with self._state:
            connection, self._connection = self._connection, None
            running = self._running
            self._deadline = 0.0  # a running query also stops at its next check
        if connection is None:
            return
        if running:
            connection.interrupt()
        else:
            self._close(connection)
