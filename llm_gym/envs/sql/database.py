"""``ReadOnlyDatabase``: an in-memory SQLite database the model may only read.

The database is built from plain rows, then locked: ``PRAGMA query_only=ON``, a default-deny
authorizer (only ``SELECT``, reads, functions other than ``load_extension``, recursive CTEs and a
few read-only introspection pragmas pass), no attached databases (``SQLITE_LIMIT_ATTACHED = 0``),
bounded strings and blobs, temporary storage in memory. Each query runs under a wall-clock
deadline enforced by a progress handler, returns at most :data:`MAX_ROWS` rows and
:data:`MAX_OUTPUT_CHARS` characters, and is a single statement. Every refusal raises
:class:`~llm_gym.errors.ToolArgumentError` with a message that names the problem, which
``ToolEnv`` turns into a ``tool_error: ...`` tool message.
"""

from __future__ import annotations

import ctypes
import functools
import os
import resource
import sqlite3
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

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

# --- limits --------------------------------------------------------------------------------------

MAX_SQL_CHARS = 4_000
"""Longest SQL text accepted by :meth:`ReadOnlyDatabase.query`."""
MAX_ROWS = 50
"""Rows shown per query; more are cut with a note."""
MAX_CELL_CHARS = 200
"""Characters shown per cell; longer values are cut with ``...``."""
MAX_OUTPUT_CHARS = 4_000
"""Characters of one query result; longer output is cut with a note."""
QUERY_TIMEOUT_S = 1.0
"""Wall-clock budget of one query (preparing, running and fetching its rows)."""
MAX_VALUE_BYTES = 100_000
"""``SQLITE_LIMIT_LENGTH``: the largest string or blob a query may build."""
MAX_QUERY_MEMORY_BYTES = 64 * 2**20
"""How much SQLite's memory may grow while one query runs (sorts, DISTINCT and temporary tables
live in memory); a query that passes it is stopped."""
PROGRESS_INTERVAL = 1_000
"""SQLite virtual-machine instructions between two deadline checks."""
MEMORY_CHECK_EVERY = 10
"""Deadline checks between two memory checks."""

_READ_ONLY_PRAGMAS = frozenset(
    {"table_info", "table_xinfo", "table_list", "index_list", "index_info", "foreign_key_list"}
)
"""Introspection pragmas the model may run (none of them can change anything)."""

_ALLOWED_ACTIONS = frozenset({sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_RECURSIVE})

_ACTION_NAMES = {
    getattr(sqlite3, f"SQLITE_{name}"): name.replace("_", " ")
    for name in (
        "CREATE_INDEX",
        "CREATE_TABLE",
        "CREATE_TEMP_INDEX",
        "CREATE_TEMP_TABLE",
        "CREATE_TEMP_TRIGGER",
        "CREATE_TEMP_VIEW",
        "CREATE_TRIGGER",
        "CREATE_VIEW",
        "DELETE",
        "DROP_INDEX",
        "DROP_TABLE",
        "DROP_TEMP_INDEX",
        "DROP_TEMP_TABLE",
        "DROP_TEMP_TRIGGER",
        "DROP_TEMP_VIEW",
        "DROP_TRIGGER",
        "DROP_VIEW",
        "INSERT",
        "PRAGMA",
        "TRANSACTION",
        "UPDATE",
        "ATTACH",
        "DETACH",
        "ALTER_TABLE",
        "REINDEX",
        "ANALYZE",
        "CREATE_VTABLE",
        "DROP_VTABLE",
        "FUNCTION",
        "SAVEPOINT",
    )
}
"""Authorizer action codes by name, for refusal messages."""


_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_memory_bytes() -> int:
    """The process's resident memory now (Linux), else its peak resident memory."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE_SIZE
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak * (1 if sys.platform == "darwin" else 1024)


@functools.cache
def memory_meter() -> Callable[[], int]:
    """A function returning the memory SQLite holds now (``sqlite3_memory_used``).

    Read through ``ctypes`` from the library the ``sqlite3`` module uses. Where that counter is
    unavailable (a build without memory statistics), the process's resident memory stands in:
    coarser, since memory SQLite frees may stay in the process.
    """
    try:
        import _sqlite3

        used = ctypes.CDLL(_sqlite3.__file__).sqlite3_memory_used
        used.restype, used.argtypes = ctypes.c_int64, []
        probe = sqlite3.connect(":memory:")
        try:
            if used() > 0:
                return used
        finally:
            probe.close()
    except (ImportError, OSError, AttributeError):
        pass
    return resident_memory_bytes


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
        self._refused: str | None = None
        self._tables = tuple(tables)
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
            connection.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
            connection.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
            connection.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, MAX_SQL_CHARS * 4)
            connection.set_authorizer(self._authorize)
            connection.set_progress_handler(self._check_limits, PROGRESS_INTERVAL)
        except BaseException:
            connection.close()
            raise
        self._connection: sqlite3.Connection | None = connection

    # --- guards -----------------------------------------------------------------------------------
    def _authorize(
        self, action: int, arg1: str | None, arg2: str | None, _db: str | None, _src: str | None
    ) -> int:
        if action in _ALLOWED_ACTIONS:
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_FUNCTION and (arg2 or "").lower() != "load_extension":
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_PRAGMA and (arg1 or "").lower() in _READ_ONLY_PRAGMAS:
            return sqlite3.SQLITE_OK
        what = _ACTION_NAMES.get(action, f"action {action}")
        if action == sqlite3.SQLITE_FUNCTION:
            detail = f"function {arg2}()"
        elif action == sqlite3.SQLITE_PRAGMA:
            detail = f"PRAGMA {arg1}" + (f" = {arg2}" if arg2 is not None else "")
        elif action in (sqlite3.SQLITE_ATTACH, sqlite3.SQLITE_DETACH):
            detail = f"{what} {arg1!r}"
        else:
            detail = f"{what} on {arg1}" if arg1 else what
        if self._refused is None:
            self._refused = detail[:120]
        return sqlite3.SQLITE_DENY

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

    def execute(
        self, sql: str, *, max_rows: int = MAX_ROWS, timeout_s: float | None = None
    ) -> tuple[list[str], list[tuple], bool]:
        """Run one read-only statement; return (column names, up to ``max_rows`` rows, cut).

        ``timeout_s`` (default: the database's) bounds the wall-clock time of this statement.

        Raises:
            ToolArgumentError: the SQL is empty, too long, not a single statement, writes,
                fails, or runs past the deadline.
        """
        connection = self._require_open()
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
        self._refused = None
        self._stop_reason = None
        self._progress_calls = 0
        self._memory_start = self._memory_used()
        budget = self._timeout_s if timeout_s is None else min(timeout_s, self._timeout_s)
        self._deadline = time.perf_counter() + budget
        cursor = connection.cursor()
        try:
            cursor.execute(sql)
            rows = cursor.fetchmany(max_rows + 1)
            columns = [d[0] for d in cursor.description or ()]
        except sqlite3.ProgrammingError as exc:
            if "one statement at a time" in str(exc):
                raise ToolArgumentError(
                    "only one SQL statement per query is allowed; send the statements one at a "
                    "time (a trailing semicolon is fine)."
                ) from None
            raise ToolArgumentError(f"SQL error: {exc}") from None
        except sqlite3.Error as exc:
            raise self._explain(exc) from None
        finally:
            cursor.close()
        return columns, rows[:max_rows], len(rows) > max_rows

    def _explain(self, exc: sqlite3.Error) -> ToolArgumentError:
        message = str(exc)
        denied = ("not authorized", "authorization", "readonly", "read-only")
        if self._refused is not None or any(word in message for word in denied):
            refused = f" (refused: {self._refused})" if self._refused else ""
            return ToolArgumentError(
                f"the database is read-only: only reading statements (SELECT, WITH, PRAGMA "
                f"table_info) are allowed{refused}."
            )
        if message == "interrupted" and self._stop_reason == "time":
            return ToolArgumentError(
                f"the query ran longer than its time limit ({self._timeout_s:g} s at most) and "
                "was stopped; add a WHERE clause or LIMIT, or check a recursive CTE for an end "
                "condition."
            )
        if message == "interrupted" and self._stop_reason == "memory":
            return ToolArgumentError(
                f"the query needed more than {MAX_QUERY_MEMORY_BYTES // 2**20} MiB of memory "
                "and was stopped; select fewer or shorter values, or add LIMIT."
            )
        if "too big" in message:
            return ToolArgumentError(
                f"SQL error: {message} (values are limited to {MAX_VALUE_BYTES:,} bytes)."
            )
        if "attached" in message:
            return ToolArgumentError("attaching other databases is not allowed.")
        return ToolArgumentError(f"SQL error: {message}")

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
                f"(showing the first {MAX_ROWS} rows; the query returned more: "
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
        """Close the connection. Safe to call more than once."""
        if self._connection is not None:
            connection, self._connection = self._connection, None
            connection.close()
