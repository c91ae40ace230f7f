"""Grading: pull the code out of a reply, run it in the sandbox, compare outputs in the parent.

The verdict is computed here, in the parent process, from the values the sandbox reports and the
expected outputs that only this process holds. Nothing the child prints, exits with or writes
enters the verdict except the returned values themselves.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from llm_gym.core.tool_env import extract_answer
from llm_gym.envs.code.sandbox import SandboxLimits, SandboxResult, run_function
from llm_gym.envs.code.tasks import call_text

__all__ = [
    "MAX_CODE_CHARS",
    "TestOutcome",
    "Verdict",
    "check_source",
    "extract_code",
    "feedback",
    "fenced_blocks",
    "grade",
    "values_equal",
]

MAX_CODE_CHARS = 20_000
"""Longer code is refused before anything runs."""
MAX_FEEDBACK_OUTPUT_CHARS = 1_000
"""At most this much of the program's stdout/stderr is shown in ``run_tests`` feedback."""

_FENCE = "```"
_LANGUAGE_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_+-")


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """``(language, body)`` of each fenced block, in order: a fence opens with ``` and the rest
    of its line (spaces, then the language), the body runs to the next ``` or the end.

    Linear in the length of the text (``str.find`` scans; the regular expression it replaces
    took quadratic time on ``"```" * n``).

    Example:
        >>> fenced_blocks("a\\n```py x\\nprint(1)\\n```\\n```\\nopen")
        [('py', 'print(1)\\n'), ('', 'open')]
    """
    blocks: list[tuple[str, str]] = []
    pos = 0
    while (start := text.find(_FENCE, pos)) != -1:
        newline = text.find("\n", start + len(_FENCE))
        if newline == -1:  # no line ends after this fence, nor after any later one
            break
        info = text[start + len(_FENCE) : newline].lstrip(" \t")
        end = 0
        while end < len(info) and info[end] in _LANGUAGE_CHARS:
            end += 1
        close = text.find(_FENCE, newline + 1)
        body_end = len(text) if close == -1 else close
        blocks.append((info[:end], text[newline + 1 : body_end]))
        pos = body_end + len(_FENCE)
    return blocks


def extract_code(reply: str) -> str:
    """The code of a final reply: the last ```python fenced block, else the last fenced block,
    else the whole reply (``<think>`` blocks removed first).

    Example:
        >>> extract_code("Here:\\n```python\\ndef f():\\n    return 1\\n```\\nDone.")
        'def f():\\n    return 1\\n'
    """
    text = extract_answer(reply)
    blocks = [(language.lower(), body) for language, body in fenced_blocks(text)]
    python = [body for lang, body in blocks if lang in ("python", "py", "python3")]
    if python:
        return python[-1]
    if blocks:
        return blocks[-1][1]
    return text


def check_source(code: str, entry: str) -> str | None:
    """Why ``code`` cannot be run for ``entry``, or ``None``. Parses only; never executes.

    Refuses code over :data:`MAX_CODE_CHARS`, code that does not parse, and code that never
    binds the name ``entry`` (a ``def``, an assignment or an import ``as`` it).
    """
    if len(code) > MAX_CODE_CHARS:
        return f"the code has {len(code):,} characters; the limit is {MAX_CODE_CHARS:,}"
    if not code.strip():
        return "the code is empty"
    try:
        tree = ast.parse(code, filename="<solution>")
    except SyntaxError as exc:
        return f"SyntaxError: {exc.msg} (line {exc.lineno})"
    except (ValueError, RecursionError, MemoryError) as exc:
        return f"the code cannot be parsed: {type(exc).__name__}"
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            if node.name == entry:
                return None
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            if node.id == entry:
                return None
        elif isinstance(node, ast.alias) and (node.asname or node.name) == entry:
            return None
    return f"the code defines no function named {entry}"


def values_equal(actual: Any, expected: Any) -> bool:
    """Strict equality of plain JSON values: ``True`` is not ``1``, ``1.0`` is not ``1``;
    floats (when a float is expected) match within 1e-9; lists element-wise, dicts key-wise.
    """
    if isinstance(expected, bool) or expected is None or isinstance(expected, str):
        return type(actual) is type(expected) and actual == expected
    if isinstance(expected, int):
        return type(actual) is int and actual == expected
    if isinstance(expected, float):
        if isinstance(actual, bool) or not isinstance(actual, int | float):
            return False
        try:
            return math.isclose(actual, expected, rel_tol=1e-9, abs_tol=1e-9)
        except OverflowError:  # an int too large for a float (10**400) is no float's equal
            return False
    if isinstance(expected, list):
        return (
            isinstance(actual, list)
            and len(actual) == len(expected)
            and all(values_equal(a, e) for a, e in zip(actual, expected, strict=True))
        )
    if isinstance(expected, dict):
        return (
            isinstance(actual, dict)
            and actual.keys() == expected.keys()
            and all(values_equal(actual[k], expected[k]) for k in expected)
        )
    return False


@dataclass(frozen=True)
class TestOutcome:
    """One test's result."""

    passed: bool
    """The call returned the expected value."""
    detail: str
    """``"returned 5"``, ``"raised ValueError: ... (line 3)"`` or ``"no result (...)"``."""


@dataclass(frozen=True)
class Verdict:
    """The grade of one piece of code on a list of tests."""

    outcomes: tuple[TestOutcome, ...]
    """One per test, in order."""
    error: str | None
    """Why nothing could be called (refused, failed to define the function), else ``None``."""
    sandbox: SandboxResult | None
    """The raw run (``None`` when the code was refused before running)."""

    @property
    def passed(self) -> int:
        """How many tests passed."""
        return sum(o.passed for o in self.outcomes)

    @property
    def total(self) -> int:
        """How many tests there were."""
        return len(self.outcomes)

    @property
    def all_passed(self) -> bool:
        """Every test passed (and there was at least one)."""
        return self.total > 0 and self.passed == self.total


def _missing_reason(result: SandboxResult) -> str:
    if result.timed_out:
        return "no result: the run was stopped at its time limit"
    if result.output_exceeded:
        return "no result: the run was stopped for printing too much"
    return "no result: the program ended before this call returned"


def _short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."


def grade(
    code: str,
    entry: str,
    tests: Sequence[Mapping[str, Any]],
    *,
    limits: SandboxLimits | None = None,
    unsafe_no_sandbox: bool = False,
) -> Verdict:
    """Run ``code`` on the tests' ``args`` in the sandbox; compare with their ``expected`` here.

    Only the arguments go to the sandbox. Refused code (see :func:`check_source`) is not run.
    ``unsafe_no_sandbox`` runs it without isolation (see :mod:`llm_gym.envs.code.sandbox`).
    """
    refusal = check_source(code, entry)
    if refusal is not None:
        outcomes = tuple(TestOutcome(False, "not run") for _ in tests)
        return Verdict(outcomes=outcomes, error=refusal, sandbox=None)
    args = [list(t["args"]) for t in tests]
    result = run_function(code, entry, args, limits=limits, unsafe_no_sandbox=unsafe_no_sandbox)
    outcomes = []
    for test, call in zip(tests, result.calls, strict=True):
        if call is None:
            outcomes.append(TestOutcome(False, _missing_reason(result)))
        elif call.error is not None:
            outcomes.append(TestOutcome(False, f"raised {call.error}"))
        else:
            ok = values_equal(call.value, test["expected"])
            outcomes.append(TestOutcome(ok, f"returned {_short_repr(call.value)}"))
    return Verdict(outcomes=tuple(outcomes), error=result.definition_error, sandbox=result)


def _output_section(result: SandboxResult | None) -> list[str]:
    if result is None:
        return []
    lines = []
    for name, text in (("stdout", result.stdout), ("stderr", result.stderr)):
        if text.strip():
            shown = text[:MAX_FEEDBACK_OUTPUT_CHARS]
            cut = "\n[cut]" if len(text) > len(shown) else ""
            lines += [f"{name}:", shown.rstrip("\n") + cut]
    return lines


def feedback(verdict: Verdict, entry: str, tests: Sequence[Mapping[str, Any]]) -> str:
    """The ``run_tests`` report on visible examples: a summary line, then one line per example.

    Only for tests whose expected outputs the model may see (the prompt's examples).
    """
    if verdict.error is not None and verdict.passed == 0:
        head = f"Your code did not run: {verdict.error}"
        return "\n".join([head, *_output_section(verdict.sandbox)])
    failed = verdict.total - verdict.passed
    lines = [
        f"{verdict.passed}/{verdict.total} examples passed."
        if not failed
        else f"{failed}/{verdict.total} examples failed."
    ]
    for test, outcome in zip(tests, verdict.outcomes, strict=True):
        call = call_text(entry, list(test["args"]))
        if outcome.passed:
            lines.append(f"PASS {call} == {_short_repr(test['expected'])}")
        else:
            lines.append(f"FAIL {call}: {outcome.detail}, expected {_short_repr(test['expected'])}")
    return "\n".join(lines + _output_section(verdict.sandbox))
