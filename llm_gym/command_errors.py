"""How a command (``llm-gym``, ``train.py``) ends on an error: one line on stderr, never a
traceback on the terminal.

An error the command anticipates (:data:`ANTICIPATED`: a bad argument, value or file, a missing
path, a refused connection) is one line that names what to fix, and exit code 2; one raised by a
library rather than by llm_gym also names a log file with its traceback. Anything else is a bug
or an accident: one line with the error and the path of a log file that holds the whole
traceback (written under the output folder when the command has one, else the temp folder),
and exit code 1.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import traceback
from pathlib import Path
from typing import TextIO

from llm_gym.errors import LlmGymError

__all__ = [
    "ANTICIPATED",
    "EXIT_UNEXPECTED",
    "EXIT_USAGE",
    "positive_int",
    "report_failure",
    "write_error_log",
]

ANTICIPATED: tuple[type[BaseException], ...] = (LlmGymError, ValueError, OSError)
"""The errors a command reports as one line naming what to fix: llm_gym's own, a value a
library refused (``ValueError``), and what the system refused (``OSError``: a missing file, a
permission, a full disk, an unreachable server)."""

EXIT_USAGE = 2
"""The exit code of an anticipated error (argparse's for a usage error)."""

EXIT_UNEXPECTED = 1
"""The exit code of any other error."""

MAX_SHOWN = 300
"""Characters of an unexpected error's message shown on its line (the log holds all of it)."""


def write_error_log(
    program: str, exc: BaseException, folder: str | Path | None = None
) -> Path | None:
    """Write ``exc``'s traceback to a new file ``<program>-error-*.log`` in ``folder`` (default:
    the temp folder; the temp folder too when ``folder`` cannot take it). Returns the file, or
    None when no folder could take it."""
    stem = "".join(c if c.isalnum() or c in "-_" else "-" for c in program) or "llm-gym"
    text = f"{program}: {' '.join(sys.argv)}\n\n" + "".join(
        traceback.format_exception(type(exc), exc, exc.__traceback__)
    )
    for where in ([folder] if folder is not None else []) + [tempfile.gettempdir()]:
        try:
            Path(where).mkdir(parents=True, exist_ok=True)
            fd, name = tempfile.mkstemp(prefix=f"{stem}-error-", suffix=".log", dir=where)
            with os.fdopen(fd, "w", encoding="utf-8", errors="replace") as f:
                f.write(text)
            return Path(name)
        except OSError:
            continue
    return None


def report_failure(
    program: str,
    exc: BaseException,
    *,
    log_folder: str | Path | None = None,
    err: TextIO | None = None,
) -> int:
    """Print ``exc`` as one line on ``err`` (default: stderr); the exit code.

    Anticipated errors (:data:`ANTICIPATED`) print ``"<program>: error: <message>"`` (a
    library's error adds the path of a log file with its traceback) and give
    :data:`EXIT_USAGE`. Others print the error's type and the start of its message with the path
    of a log file holding the traceback (:func:`write_error_log`) and give
    :data:`EXIT_UNEXPECTED`.
    """
    err = err or sys.stderr
    if isinstance(exc, ANTICIPATED):
        message = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        message = message or type(exc).__name__
        if not isinstance(exc, LlmGymError):  # a library's message: its origin may help
            log = write_error_log(program, exc, log_folder)
            message += f" (the traceback is in {log})" if log else ""
        print(f"{program}: error: {message}", file=err)
        return EXIT_USAGE
    log = write_error_log(program, exc, log_folder)
    message = " ".join(str(exc).split())
    if len(message) > MAX_SHOWN:
        message = message[:MAX_SHOWN] + "..."
    shown = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    where = f"the traceback is in {log}" if log else "no folder could take the traceback's log"
    print(f"{program}: unexpected error: {shown} ({where}; please report it)", file=err)
    if log is None:
        traceback.print_exception(type(exc), exc, exc.__traceback__, file=err)
    return EXIT_UNEXPECTED


def positive_int(text: str) -> int:
    """An argparse ``type`` for a count: an integer >= 1 (a usage error otherwise, before the
    command does any work; ``--tasks -3`` would slice away the last three tasks).

    Example:
        >>> positive_int("8")
        8
    """
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r:.40}")
    return value
