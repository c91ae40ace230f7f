"""What SQL-v0's ``query`` tool lets through: SQLite's limits, the authorizer's allow-lists, and a
deadline check in front of the built-in functions that may take milliseconds in one call.

The progress handler of :class:`~llm_gym.envs.sql.database.ReadOnlyDatabase` enforces the time
limit, but SQLite calls it only at jumps between virtual-machine instructions: one long
instruction, or a row of many, runs past it (``LIKE`` with a 49,000-byte pattern took 2.6 s in one
instruction). So:

* **Every operand is bounded** (:data:`SQLITE_LIMITS`): strings and blobs
  (``SQLITE_LIMIT_LENGTH``, which also caps ``printf`` widths, ``replace`` growth, ``zeroblob``,
  ``randomblob``, ``hex``, ``group_concat``), ``LIKE``/``GLOB`` patterns, expression depth,
  compound terms, columns, function arguments, program size; no parameters, no attached files.
  Every linear function then takes microseconds.
* **Quadratic built-ins are checked per call** (:class:`CheckedFunctions`): ``LIKE``, ``GLOB``,
  ``instr``, ``replace`` and ``trim`` with a set of characters cost the product of two lengths
  (tens of milliseconds at the limits); each call first checks the deadline. ``json_patch``
  (quadratic in keys) is not allowed. ``printf``/``format`` are checked too: ``%c`` with a repeat
  count loops past the length limit inside one instruction, so counts above it are lowered first
  (:mod:`llm_gym.envs.sql.printf`).
* **Compilation** is bounded by the limits and, for common table expressions, by
  :mod:`llm_gym.envs.sql.expansion`.
* **Reach.** The authorizer (:class:`Authorizer`) is default-deny: ``SELECT`` and recursive CTEs,
  reads of the task's tables, the query's own CTEs, the schema table and a few table-valued
  functions, the functions of :data:`ALLOWED_FUNCTIONS` (so no ``load_extension``, no
  ``fts3_tokenizer``, which returns a pointer and, with two arguments, installs one) and the
  read-only pragmas of :data:`READ_ONLY_PRAGMAS`.

``tests/test_env_sql_hostile.py`` has one timed test per class of attack.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import resource
import sqlite3
import sys
from collections.abc import Callable, Iterable
from typing import Any

from llm_gym.envs.sql.expansion import fold_name
from llm_gym.envs.sql.printf import bound_printf_arguments

__all__ = [
    "ALLOWED_FUNCTIONS",
    "CHECKED_FUNCTIONS",
    "FORMAT_FUNCTIONS",
    "MAX_LIKE_PATTERN_BYTES",
    "MAX_SQL_CHARS",
    "MAX_VALUE_BYTES",
    "READ_ONLY_PRAGMAS",
    "SQLITE_LIMITS",
    "TABLE_VALUED_FUNCTIONS",
    "Authorizer",
    "CheckedFunctions",
    "apply_limits",
    "explain_limit",
    "memory_meter",
    "resident_memory_bytes",
]

# --- limits --------------------------------------------------------------------------------------

MAX_SQL_CHARS = 4_000
"""Longest SQL text accepted by the ``query`` tool."""
MAX_VALUE_BYTES = 20_000
"""``SQLITE_LIMIT_LENGTH``: the largest string or blob a query may build. A whole table of the task
databases written out as text is under 4,000 characters."""
MAX_LIKE_PATTERN_BYTES = 200
"""``SQLITE_LIMIT_LIKE_PATTERN_LENGTH``: the longest ``LIKE``/``GLOB`` pattern."""
SQLITE_LIMITS: dict[int, int] = {
    sqlite3.SQLITE_LIMIT_LENGTH: MAX_VALUE_BYTES,
    sqlite3.SQLITE_LIMIT_SQL_LENGTH: MAX_SQL_CHARS * 4,  # UTF-8: 4 bytes a character at most
    sqlite3.SQLITE_LIMIT_LIKE_PATTERN_LENGTH: MAX_LIKE_PATTERN_BYTES,
    sqlite3.SQLITE_LIMIT_COLUMN: 200,
    sqlite3.SQLITE_LIMIT_EXPR_DEPTH: 250,
    sqlite3.SQLITE_LIMIT_COMPOUND_SELECT: 20,
    sqlite3.SQLITE_LIMIT_VDBE_OP: 50_000,
    sqlite3.SQLITE_LIMIT_FUNCTION_ARG: 32,
    sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER: 0,  # no parameters are ever bound
    sqlite3.SQLITE_LIMIT_ATTACHED: 0,
    sqlite3.SQLITE_LIMIT_WORKER_THREADS: 0,  # a query runs on its own thread only
    sqlite3.SQLITE_LIMIT_TRIGGER_DEPTH: 1,
}
"""``Connection.setlimit`` values. The task databases' reference queries need far less (at most 72
instructions, an expression depth under 10, no compound ``SELECT``); so do the queries a model
writes to explore them (tested in ``tests/test_env_sql_hostile.py``)."""

_LIMIT_HINTS = (
    ("too big", f"values are limited to {MAX_VALUE_BYTES:,} bytes"),
    ("pattern too complex", f"LIKE/GLOB patterns are limited to {MAX_LIKE_PATTERN_BYTES} bytes"),
    ("compound select", "at most 20 terms in a compound SELECT"),
    ("variable", "parameters (?, :name) are not supported; write the values into the SQL"),
    ("bindings", "parameters (?, :name) are not supported; write the values into the SQL"),
)


def apply_limits(connection: sqlite3.Connection) -> None:
    """Set :data:`SQLITE_LIMITS` on ``connection``."""
    for limit, value in SQLITE_LIMITS.items():
        connection.setlimit(limit, value)


def explain_limit(message: str) -> str:
    """SQLite's error ``message`` with the limit it hit named, when it is one of ours."""
    lower = message.lower()
    for fragment, hint in _LIMIT_HINTS:
        if fragment in lower:
            return f"{message} ({hint})"
    return message


# --- memory --------------------------------------------------------------------------------------

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


# --- the authorizer ------------------------------------------------------------------------------

_FUNCTION_NAMES = """
    abs char coalesce concat concat_ws format glob hex ifnull iif if instr length like
    likelihood likely lower ltrim max min nullif octet_length printf quote random randomblob
    replace round rtrim sign soundex sqlite_version substr substring trim typeof unhex unicode
    unlikely upper zeroblob
    avg count group_concat string_agg sum total
    row_number rank dense_rank percent_rank cume_dist ntile lag lead first_value last_value
    nth_value
    date time datetime julianday unixepoch strftime timediff current_date current_time
    current_timestamp
    acos acosh asin asinh atan atan2 atanh ceil ceiling cos cosh degrees exp floor ln log log2
    log10 mod pi pow power radians sin sinh sqrt tan tanh trunc
    json json_array json_array_length json_error_position json_extract json_group_array
    json_group_object json_insert json_object json_pretty json_quote json_remove json_replace
    json_set json_type json_valid jsonb jsonb_array jsonb_extract jsonb_group_array
    jsonb_group_object jsonb_insert jsonb_object jsonb_remove jsonb_replace jsonb_set -> ->>
"""
ALLOWED_FUNCTIONS = frozenset(_FUNCTION_NAMES.split())
"""SQL functions a query may call: the core scalar, aggregate, window, date, math and JSON
functions (some only in newer SQLite versions). Not: ``load_extension``, ``fts3_tokenizer``,
``fts5`` and the FTS and R*Tree helpers, ``sqlite_log``, ``sqlite_compileoption_*``,
``changes``, and ``json_patch`` (quadratic in the number of keys)."""
READ_ONLY_PRAGMAS = frozenset(
    {"table_info", "table_xinfo", "table_list", "index_list", "index_info", "foreign_key_list"}
)
"""Introspection pragmas the model may run (none of them can change anything)."""
TABLE_VALUED_FUNCTIONS = ("json_each", "json_tree", *(f"pragma_{p}" for p in READ_ONLY_PRAGMAS))
"""Table-valued functions a query may read. SQLite creates such a table on first use, which the
authorizer refuses (an ``UPDATE`` of the schema table), so the database uses each once before the
authorizer is installed; any other (``dbstat``, ``sqlite_stmt``, ``pragma_compile_options``, ...)
stays refused."""
_SCHEMA_TABLES = ("sqlite_master", "sqlite_schema", "sqlite_temp_master", "sqlite_temp_schema")
_ALLOWED_ACTIONS = frozenset({sqlite3.SQLITE_SELECT, sqlite3.SQLITE_RECURSIVE})
_ACTIONS = """
    CREATE_INDEX CREATE_TABLE CREATE_TEMP_INDEX CREATE_TEMP_TABLE CREATE_TEMP_TRIGGER
    CREATE_TEMP_VIEW CREATE_TRIGGER CREATE_VIEW DELETE DROP_INDEX DROP_TABLE DROP_TEMP_INDEX
    DROP_TEMP_TABLE DROP_TEMP_TRIGGER DROP_TEMP_VIEW DROP_TRIGGER DROP_VIEW INSERT PRAGMA READ
    TRANSACTION UPDATE ATTACH DETACH ALTER_TABLE REINDEX ANALYZE CREATE_VTABLE DROP_VTABLE
    FUNCTION SAVEPOINT
"""
_ACTION_NAMES = {getattr(sqlite3, f"SQLITE_{n}"): n.replace("_", " ") for n in _ACTIONS.split()}
"""Authorizer action codes by name, for refusal messages."""


def function_allowed(name: str) -> bool:
    """Whether a query may call the SQL function ``name``."""
    return fold_name(name) in ALLOWED_FUNCTIONS


class Authorizer:
    """SQLite's authorizer callback: allow-lists, default deny; remembers the first refusal.

    Args:
        tables: The names of the tables queries may read.
    """

    def __init__(self, tables: Iterable[str]) -> None:
        self.readable = frozenset(
            fold_name(name) for name in (*tables, *_SCHEMA_TABLES, *TABLE_VALUED_FUNCTIONS)
        )
        self.defined: frozenset[str] = frozenset()
        """The names the statement defines (its CTEs, folded by ``fold_name``): readable too."""
        self.refused: str | None = None
        """What the statement was refused, for the error message (None: nothing)."""

    def begin(self, defined: frozenset[str]) -> None:
        """Get ready for a statement that defines the CTEs ``defined``."""
        self.defined, self.refused = defined, None

    def __call__(
        self, action: int, arg1: str | None, arg2: str | None, _db: str | None, _src: str | None
    ) -> int:
        if action in _ALLOWED_ACTIONS:
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_READ and (
            fold_name(arg1 or "") in self.readable or fold_name(arg1 or "") in self.defined
        ):
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_FUNCTION and function_allowed(arg2 or ""):
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_PRAGMA and fold_name(arg1 or "") in READ_ONLY_PRAGMAS:
            return sqlite3.SQLITE_OK
        if self.refused is None:
            self.refused = self.describe(action, arg1, arg2)[:120]
        return sqlite3.SQLITE_DENY

    @staticmethod
    def describe(action: int, arg1: str | None, arg2: str | None) -> str:
        """The refused action in words (``DELETE on orders``, ``function load_extension()``)."""
        what = _ACTION_NAMES.get(action, f"action {action}")
        if action == sqlite3.SQLITE_FUNCTION:
            return f"function {arg2}()"
        if action == sqlite3.SQLITE_PRAGMA:
            return f"PRAGMA {arg1}" + (f" = {arg2}" if arg2 is not None else "")
        if action in (sqlite3.SQLITE_ATTACH, sqlite3.SQLITE_DETACH):
            return f"{what} {arg1!r}"
        if action == sqlite3.SQLITE_READ:
            return f"reading {arg1}"
        if action == sqlite3.SQLITE_UPDATE and arg1 == "sqlite_master":
            return "UPDATE on sqlite_master, as a virtual table such as dbstat does on first use"
        return f"{what} on {arg1}" if arg1 else what


# --- functions that may take milliseconds in one call --------------------------------------------

CHECKED_FUNCTIONS: dict[str, tuple[int, ...]] = {
    "like": (2, 3),
    "glob": (2,),
    "instr": (2,),
    "replace": (3,),
    "trim": (2,),
    "ltrim": (2,),
    "rtrim": (2,),
    "unhex": (2,),
}
"""Built-in functions (name: argument counts) whose one call costs the product of two arguments'
lengths (tens of milliseconds at the limits). SQLite checks its progress handler only at jumps
between instructions, so a row of many such calls would run far past the query's time limit:
:class:`CheckedFunctions` puts a deadline check in front of each call."""
FORMAT_FUNCTIONS = ("printf", "format")
"""``printf`` and its newer name: checked like :data:`CHECKED_FUNCTIONS`, and each call's ``%c``
repeat counts bounded (:func:`~llm_gym.envs.sql.printf.bound_printf_arguments`)."""


@functools.cache
def _checked_calls() -> tuple[tuple[str, int, str], ...]:
    """(name, argument count, SQL) of each checked function this SQLite has (unhex: 3.41+); a
    format function's SQL is its name, its argument count -1 (any)."""
    probe = sqlite3.connect(":memory:")
    found = []
    try:
        for name, arities in CHECKED_FUNCTIONS.items():
            for arity in arities:
                sql = f"SELECT {name}({', '.join('?' * arity)})"
                try:
                    probe.execute(sql, (None,) * arity)
                except sqlite3.Error:
                    continue
                found.append((name, arity, sql))
        for name in FORMAT_FUNCTIONS:  # any number of arguments (format: SQLite 3.38+)
            with contextlib.suppress(sqlite3.Error):
                probe.execute(f"SELECT {name}('')")
                found.append((name, -1, name))
    finally:
        probe.close()
    return tuple(found)


class CheckedFunctions:
    """Replaces :data:`CHECKED_FUNCTIONS` and :data:`FORMAT_FUNCTIONS` on ``connection`` by
    Python functions that call ``check`` (which raises to stop the statement), then have SQLite
    compute the built-in on a helper connection with the same limits: the same results, and a
    deadline check per call.

    Args:
        connection: The connection whose queries are checked.
        check: Called before each call; an exception stops the statement.
    """

    def __init__(self, connection: sqlite3.Connection, check: Callable[[], None]) -> None:
        self.error: str | None = None
        """The message of the last error of the built-in (SQLite reports only that a
        user-defined function raised); the database resets it per statement."""
        self._helper: sqlite3.Connection | None = None  # made on first use
        for name, arity, sql in _checked_calls():
            connection.create_function(name, arity, self._delegate(sql, check), deterministic=True)

    def _connect(self) -> sqlite3.Connection:
        helper = sqlite3.connect(":memory:", check_same_thread=False)
        apply_limits(helper)
        most = SQLITE_LIMITS[sqlite3.SQLITE_LIMIT_FUNCTION_ARG]  # a printf call's arguments
        helper.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, most)
        self._helper = helper
        return helper

    def _delegate(self, sql: str, check: Callable[[], None]) -> Callable[..., Any]:
        """``sql`` is the call's SQL with ``?`` for the arguments, or a function's bare name
        (a format function: any number of arguments)."""
        formats = sql in FORMAT_FUNCTIONS
        most = SQLITE_LIMITS[sqlite3.SQLITE_LIMIT_FUNCTION_ARG] if formats else -1
        arities = [f"SELECT {sql}({', '.join('?' * n)})" for n in range(most + 1)]

        def call(*args: Any) -> Any:
            check()
            query = sql
            if formats:
                args = bound_printf_arguments(args, MAX_VALUE_BYTES)
                query = arities[len(args)]
            try:
                return (self._helper or self._connect()).execute(query, args).fetchone()[0]
            except sqlite3.Error as exc:
                self.error = str(exc)
                raise

        return call

    def close(self) -> None:
        """Close the helper connection."""
        if self._helper is not None:
            self._helper.close()
