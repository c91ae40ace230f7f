"""Files read as input (task files, configs, leaderboard records): regular, bounded, shallow.

A path a user names may be anything: a FIFO (an ``open`` blocks until a writer comes), a device
(``/dev/zero`` never ends), a directory, or a regular file far larger than any input of its kind.
:func:`open_input` opens without blocking (``O_NONBLOCK``) and judges the opened descriptor
(``fstat``), so what is checked is what is read, whatever the path names a moment later;
:func:`read_input` and :func:`input_lines` read no more than the kind's limit, even from a file
that grows while it is read. :func:`loads_json` parses with a limit on nesting depth, checked on
the text before the parser runs (a document nested 100,000 deep is refused, never a
``RecursionError``). Every refusal is an :class:`~llm_gym.errors.InvalidArgumentError` that names
the path, what it is, and the limit by name.

The outputs' counterpart is :mod:`llm_gym.eval.files`.
"""

from __future__ import annotations

import codecs
import json
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from llm_gym.errors import InvalidArgumentError

__all__ = [
    "MAX_JSON_DEPTH",
    "InputLimit",
    "check_json_depth",
    "input_lines",
    "loads_json",
    "open_input",
    "read_input",
    "read_input_text",
]

MAX_JSON_DEPTH = 100
"""The deepest nesting of lists and objects a JSON input may hold: deep enough for any record
the project writes (a leaderboard record is 4 deep), shallow enough that code walking the
values recursively stays far below Python's recursion limit."""

_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_OPEN_FLAGS = os.O_RDONLY | _O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)


@dataclass(frozen=True)
class InputLimit:
    """What a kind of input file is called and how large one may be.

    Example:
        >>> InputLimit("task file", 1 << 20, "trainers.grpo.train.MAX_TASK_FILE_BYTES").max_bytes
        1048576
    """

    what: str
    """The kind, as errors name it (``"task file"``, ``"config"``)."""
    max_bytes: int
    """The largest file of this kind read, in bytes."""
    name: str
    """The constant that sets :attr:`max_bytes`, named in the error that refuses a file."""
    form: str = "a file"
    """What to give instead of a path that is not a regular file (``"a YAML file"``)."""

    def too_large(self, path: str | Path) -> InvalidArgumentError:
        """The error for a file of this kind past :attr:`max_bytes`."""
        return InvalidArgumentError(
            f"{path}: the {self.what} is larger than {self.max_bytes:,} bytes (the limit "
            f"{self.name}); is it the right file?"
        )


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    return "a socket" if stat.S_ISSOCK(mode) else "not a regular file"


def open_input(path: str | Path, limit: InputLimit) -> BinaryIO:
    """The regular file at ``path``, opened for reading in binary mode.

    The open never blocks (a FIFO opens at once, and is refused); the type and size are those of
    the opened descriptor.

    Raises:
        InvalidArgumentError: ``path`` is missing, unreadable, not a regular file (a directory,
            a device, a FIFO, a socket), or larger than ``limit.max_bytes``.
    """
    shown = str(path)
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except FileNotFoundError:
        raise InvalidArgumentError(f"No such {limit.what}: {shown!r}.") from None
    except OSError as exc:
        raise InvalidArgumentError(
            f"Cannot open the {limit.what} {shown!r}: {exc.strerror or exc}."
        ) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InvalidArgumentError(
                f"The {limit.what} {shown!r} is {_kind(info.st_mode)}, not a regular file; "
                f"give {limit.form}."
            )
        if info.st_size > limit.max_bytes:
            raise limit.too_large(shown)
        if _O_NONBLOCK:
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_input(path: str | Path, limit: InputLimit) -> bytes:
    """The bytes of the regular file at ``path`` (:func:`open_input`), at most
    ``limit.max_bytes`` of them: a file that grows past the limit while read is refused."""
    with open_input(path, limit) as f:
        raw = f.read(limit.max_bytes + 1)
    if len(raw) > limit.max_bytes:
        raise limit.too_large(path)
    return raw


def read_input_text(path: str | Path, limit: InputLimit) -> str:
    """:func:`read_input` decoded as UTF-8 (a leading byte-order mark dropped).

    Raises:
        InvalidArgumentError: what :func:`read_input` raises, or bytes that are not UTF-8 (the
            offset and the byte named).
    """
    raw = read_input(path, limit)
    start = 3 if raw.startswith(codecs.BOM_UTF8) else 0
    try:
        return raw[start:].decode("utf-8")
    except UnicodeDecodeError as exc:
        at = start + exc.start  # an offset in the file
        raise InvalidArgumentError(
            f"{path}: not UTF-8 text (byte {at}: {raw[at : at + 1]!r})."
        ) from None


def input_lines(path: str | Path, limit: InputLimit) -> Iterator[tuple[int, bytes]]:
    """``(line number, line)`` for each line of the regular file at ``path`` (numbered from 1,
    line ends kept), read one at a time: the whole file is never held at once, and reading stops
    with an error once ``limit.max_bytes`` are read."""
    left = limit.max_bytes
    with open_input(path, limit) as f:
        number = 0
        while line := f.readline(left + 1):
            number += 1
            left -= len(line)
            if left < 0:
                raise limit.too_large(path)
            yield number, line


_JSON_TOKENS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?|[\[\]{}]', re.DOTALL)
"""A string (its brackets are text), or a bracket."""


def check_json_depth(text: str, max_depth: int = MAX_JSON_DEPTH) -> None:
    """Refuse JSON ``text`` whose lists and objects nest deeper than ``max_depth``; linear in
    the text and without recursion.

    Example:
        >>> check_json_depth('{"a": [[1]], "b": "[[[["}', max_depth=3)
        >>> check_json_depth("[[[1]]]", max_depth=2)
        Traceback (most recent call last):
        ...
        llm_gym.errors.InvalidArgumentError: the JSON is nested more than 2 levels deep (at \
character 2); nested too deeply for an input (llm_gym.core.input_files.MAX_JSON_DEPTH).
    """
    if text.count("[") + text.count("{") <= max_depth:  # the common case: no scan
        return
    depth = 0
    for match in _JSON_TOKENS.finditer(text):
        char = text[match.start()]
        if char in "[{":
            depth += 1
            if depth > max_depth:
                raise InvalidArgumentError(
                    f"the JSON is nested more than {max_depth} levels deep (at character "
                    f"{match.start()}); nested too deeply for an input "
                    "(llm_gym.core.input_files.MAX_JSON_DEPTH)."
                )
        elif char in "]}":
            depth -= 1


def loads_json(text: str | bytes, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads`` of an input, nested at most ``max_depth`` deep (:func:`check_json_depth`).

    Raises:
        InvalidArgumentError: not JSON (the reason and position), nested too deeply, or an
            integer with more digits than Python converts.

    Example:
        >>> loads_json('{"a": [1, 2]}')
        {'a': [1, 2]}
    """
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise InvalidArgumentError(f"not UTF-8 text ({exc}).") from None
    check_json_depth(text, max_depth)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidArgumentError(f"not valid JSON ({exc.msg} at character {exc.pos}).") from None
    except ValueError as exc:  # an integer past the digit limit
        raise InvalidArgumentError(f"not valid JSON ({exc}).") from None
