"""SQLite's ``printf`` / ``format`` with its one unbounded case bounded: ``%c``'s repeat count.

``SQLITE_LIMIT_LENGTH`` caps the string ``printf`` builds, and every conversion's width and
precision stop at it, but for one: ``%c`` with a precision repeats its character that many times,
and SQLite (3.40) keeps looping once per repetition after the string has outgrown the limit. It is
one virtual-machine instruction, so the progress handler (the query's deadline) never runs inside
it, and the call's time grows with the count, for a NULL result. :func:`bound_printf_arguments`
reads the format as SQLite does and lowers every ``%c`` repeat count above the length limit to one
past it: the string is over the limit either way, so the result is the same (NULL), and the call's
time does not depend on the count. The measured cost of the unbounded loop is in
``benchmarks/results/README.md``.
"""

from __future__ import annotations

import contextlib
import sqlite3
from typing import Any

__all__ = ["bound_printf_arguments", "sqlite_c_int"]

_FLAGS = frozenset("-+ #!0,")
_NO_ARGUMENT = frozenset("%n")
"""Conversions that read no argument (``%n`` writes nothing in SQL functions)."""
_CONVERSIONS = frozenset("dsgzqQwcouxXfeEGipr") | _NO_ARGUMENT
"""The conversions SQL ``printf`` accepts; any other ends the output there."""


def sqlite_c_int(value: Any) -> int:
    """An argument as SQLite's ``printf`` reads a ``*`` width or precision: the 64-bit integer of
    the value (``CAST(... AS INTEGER)``), then its low 32 bits as a C ``int``."""
    if isinstance(value, bool):
        number = int(value)
    elif isinstance(value, int):
        number = value
    elif value is None:
        number = 0
    else:
        with contextlib.closing(sqlite3.connect(":memory:")) as probe:  # text, blobs, floats
            number = probe.execute("SELECT CAST(? AS INTEGER)", (value,)).fetchone()[0] or 0
    number &= 0xFFFFFFFF
    return number - 2**32 if number >= 2**31 else number


def _precision(value: int) -> int:
    """A ``*`` precision as SQLite uses it: negative values count by their size."""
    if value < 0:
        return -value if value >= -(2**31 - 1) else -1
    return value


def bound_printf_arguments(args: tuple[Any, ...], max_repeat: int) -> tuple[Any, ...]:
    """``printf``'s arguments with every ``%c`` repeat count above ``max_repeat`` (the length
    limit, in bytes) lowered to one past it (see the module docstring); all else as it was.

    The format is read as SQLite 3.40's ``sqlite3_str_vappendf`` reads it: flags, a width (digits
    or ``*``), a precision (``.`` then digits or ``*``), ``l``/``ll``, the conversion; a ``*``
    takes the next argument, every conversion but ``%%`` and ``%n`` one more, and an unknown
    conversion ends the output.

    Example:
        >>> bound_printf_arguments(("%d %.*c", 7, 2**31 - 1, "x"), 20_000)
        ('%d %.*c', 7, 20001, 'x')
        >>> bound_printf_arguments(("%.99999999c|%.3c", "x", "y"), 20_000)
        ('%.20001c|%.3c', 'x', 'y')
        >>> bound_printf_arguments(("%.*s", 2**31 - 1, "x"), 20_000)  # not a repeat count
        ('%.*s', 2147483647, 'x')
    """
    if not args or not isinstance(args[0], str) or "c" not in args[0]:
        return args  # no %c conversion (the common case: a cheap test)
    fmt, values = args[0], list(args)
    pieces: list[str] = []  # the format, rewritten where a literal repeat count is lowered
    done_to = 0  # fmt[:done_to] is in pieces
    at, arg, end = 0, 1, len(fmt)
    while (at := fmt.find("%", at)) != -1:
        i = at + 1
        star: int | None = None  # the argument that holds a ``*`` precision
        digits: tuple[int, int] | None = None  # where a literal precision is in fmt
        while i < end:
            c = fmt[i]
            if c in _FLAGS:
                i += 1
            elif c == "l":
                i += 2 if fmt.startswith("ll", i) else 1
                break
            elif c.isascii() and c.isdigit():  # a width ("0" is a flag, caught above)
                while i < end and fmt[i].isascii() and fmt[i].isdigit():
                    i += 1
                if not fmt.startswith((".", "l"), i):
                    break
            elif c == "*":  # a width from the next argument
                arg += 1
                i += 1
                if not fmt.startswith((".", "l"), i):
                    break
            elif c == ".":
                i += 1
                if fmt.startswith("*", i):
                    star, arg, i = arg, arg + 1, i + 1
                else:
                    start = i
                    while i < end and fmt[i].isascii() and fmt[i].isdigit():
                        i += 1
                    digits = (start, i)
                if not fmt.startswith("l", i):
                    break
            else:
                break
        conversion = fmt[i] if i < end else ""
        if conversion not in _CONVERSIONS:
            break  # SQLite stops writing here: no later argument is read
        if conversion == "c":
            if star is not None and star < len(values):
                if _precision(sqlite_c_int(values[star])) > max_repeat:
                    values[star] = max_repeat + 1
            elif digits is not None and digits[1] > digits[0]:
                literal = 0
                for digit in fmt[digits[0] : digits[1]]:  # C's unsigned arithmetic, as SQLite
                    literal = (literal * 10 + int(digit)) & 0xFFFFFFFF
                literal &= 0x7FFFFFFF
                if literal > max_repeat:
                    pieces += [fmt[done_to : digits[0]], str(max_repeat + 1)]
                    done_to = digits[1]
        if conversion not in _NO_ARGUMENT:
            arg += 1
        at = i + 1
    if done_to:
        values[0] = "".join(pieces) + fmt[done_to:]
    return tuple(values)
