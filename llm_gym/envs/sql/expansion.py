"""How far a query grows when SQLite copies its common table expressions into place.

SQLite replaces each reference to a CTE by a copy of the CTE's body (a materialized one too)
before it compiles anything, and the progress handler that enforces the time limit runs only
once the statement runs. ``a1`` naming ``a0`` twice, ``a2`` naming ``a1`` twice, ... doubles the
parse tree per line: 20 lines (1,200 characters) took 13 s and 3 GB to compile, 25 would take
the machine's memory. :func:`check_expansion` bounds the expanded size on the SQL text, before
SQLite sees it, with a coarse, linear tokenizer of SQLite's grammar that may only over-count.
"""

from __future__ import annotations

import re
import string
from collections import Counter

from llm_gym.errors import ToolArgumentError

__all__ = ["MAX_EXPANDED_TOKENS", "check_expansion", "expanded_size", "fold_name"]

MAX_EXPANDED_TOKENS = 50_000
"""Tokens a query may grow to when each reference to a CTE is replaced by its body (a bound on the
query's compilation time). The task's reference queries have at most 64 tokens, and a legitimate
query that names a CTE a few times stays far below."""


_TOKEN = re.compile(
    r"""
    (?P<skip>[ \t\n\f\r]+|--[^\n]*|/\*.*?(?:\*/|\Z))
    |'(?P<single>(?:[^']|'')*)'?
    |"(?P<double>(?:[^"]|"")*)"?
    |`(?P<back>(?:[^`]|``)*)`?
    |\[(?P<bracket>[^\]]*)\]?
    |(?P<word>[A-Za-z_\u0080-\U0010ffff][A-Za-z0-9_$\u0080-\U0010ffff]*|[0-9][\w.]*)
    |(?P<other>.)
    """,
    re.DOTALL | re.VERBOSE,
)
"""SQLite's lexical grammar, coarsely (its whitespace is ASCII only, any other non-ASCII character
is part of a name). Each alternative is one pass without nested repetition: the scan is linear. A
quoted string counts as a name too (SQLite accepts ``'a'`` where a name belongs)."""
_MARKS = frozenset({"(", ")", "."})
_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)


def fold_name(name: str) -> str:
    """``name`` as SQLite compares names: ASCII letters in lower case, any other character as is
    (``"É"`` and ``"é"`` are two names)."""
    return name.translate(_ASCII_LOWER)


def _tokens(sql: str) -> list[str]:
    """The tokens of ``sql``: names folded (:func:`fold_name`) and unquoted, ``(`` and ``)``,
    ``.`` for the rest."""
    tokens = []
    for match in _TOKEN.finditer(sql):
        kind = match.lastgroup or "skip"
        if kind == "skip":
            continue
        text = match.group(kind)
        if kind == "other":
            tokens.append(text if text in "()" else ".")
        else:  # a word, or a quoted name or string: the unquoted text names a CTE alike
            tokens.append(fold_name(text.replace("''", "'").replace('""', '"')))
    return tokens


def _pairs(tokens: list[str]) -> tuple[dict[int, int], dict[int, int]]:
    """``(`` index -> its ``)`` index (the end of the text when unclosed), and back."""
    closing, stack = {}, []
    for i, token in enumerate(tokens):
        if token == "(":
            stack.append(i)
        elif token == ")" and stack:
            closing[stack.pop()] = i
    closing.update((i, len(tokens)) for i in stack)
    return closing, {c: o for o, c in closing.items()}


def _definitions(tokens: list[str]) -> tuple[list[tuple[str, int, int]], set[int]]:
    """Each ``name [(columns)] AS [NOT] [MATERIALIZED] (body)`` as (name, "(" index, ")" index),
    and the indexes of the names."""
    closing, opening = _pairs(tokens)
    bodies: list[tuple[str, int, int]] = []
    name_at: set[int] = set()
    for i, token in enumerate(tokens):
        if token != "as":
            continue
        j = i + 1
        j += tokens[j : j + 1] == ["not"]
        j += tokens[j : j + 1] == ["materialized"]
        if tokens[j : j + 1] != ["("]:
            continue
        k = i - 1
        if k >= 0 and tokens[k] == ")":  # a column list: the name is before its "("
            k = opening.get(k, 0) - 1
        if k >= 0 and tokens[k] not in _MARKS:
            bodies.append((tokens[k], j, closing[j]))
            name_at.add(k)
    return bodies, name_at


def expanded_size(sql: str) -> int:
    """An upper bound on the tokens of ``sql`` once every reference to a CTE is replaced by the
    CTE's body, as SQLite does before it compiles (a materialized CTE too), capped just past
    :data:`MAX_EXPANDED_TOKENS`.

    Every ``name [(columns)] AS [NOT] [MATERIALIZED] (body)`` counts as a definition (a ``WINDOW``
    definition too: an over-count). A name defined twice (nested ``WITH`` clauses) counts as its
    largest body; a body naming its own CTE is a recursive CTE (not copied). References that
    form any other cycle can only come from such reuse of names and count as unbounded.

    Example:
        >>> expanded_size("WITH a AS (SELECT 1 x) SELECT * FROM a, a")  # 14 tokens + 2 x 5
        24
    """
    return _expanded_size(_tokens(sql))


def _expanded_size(tokens: list[str]) -> int:
    bodies, name_at = _definitions(tokens)
    # The definition each token is directly in (the innermost), then each one's references.
    owner = [len(bodies)] * len(tokens)  # len(bodies): the main text
    for index, (_name, start, end) in sorted(enumerate(bodies), key=lambda b: b[1][1]):
        owner[start : end + 1] = [index] * (min(end + 1, len(tokens)) - start)
    refs: list[Counter[str]] = [Counter() for _ in range(len(bodies) + 1)]
    defined: dict[str, list[int]] = {}
    for index, (name, _start, _end) in enumerate(bodies):
        defined.setdefault(name, []).append(index)
    for t, token in enumerate(tokens):
        if token in defined and t not in name_at:
            refs[owner[t]][token] += 1
    sizes: dict[str, int] = {}

    def size(name: str, path: set[str]) -> int:
        if name in sizes:
            return sizes[name]
        if name in path or len(path) > 200:
            return MAX_EXPANDED_TOKENS + 1  # a cycle through reused names: unbounded
        path.add(name)
        largest = 0
        for index in defined[name]:
            _name, start, end = bodies[index]
            total = end - start + 1
            for other, n in refs[index].items():
                if other != name and total <= MAX_EXPANDED_TOKENS:
                    total += n * size(other, path)
            largest = max(largest, min(total, MAX_EXPANDED_TOKENS + 1))
        path.discard(name)
        sizes[name] = largest
        return largest

    main = len(tokens)
    for name, n in refs[-1].items():
        if main <= MAX_EXPANDED_TOKENS:
            main += n * size(name, set())
    return min(main, MAX_EXPANDED_TOKENS + 1)


def check_expansion(sql: str) -> frozenset[str]:
    """Refuse ``sql`` when its CTEs expand past :data:`MAX_EXPANDED_TOKENS` tokens; else return
    the names it defines (its CTEs, folded), which the query may read besides the tables.

    Raises:
        ToolArgumentError: naming the bound and how to stay under it.
    """
    tokens = _tokens(sql)
    if _expanded_size(tokens) > MAX_EXPANDED_TOKENS:
        raise ToolArgumentError(
            f"the query is too large once each reference to a WITH clause is replaced by its "
            f"body (over {MAX_EXPANDED_TOKENS:,} tokens; SQLite copies a CTE into every place "
            "that names it): name each CTE fewer times, or nest them less deeply."
        )
    return frozenset(name for name, _start, _end in _definitions(tokens)[0])
