"""``Problem``: one generated function-writing problem, and helpers to build templates.

A template is a function ``(rng: random.Random) -> Problem``: it draws its parameters (a base, a
modulus, a bracket set, a tie rule...), writes the statement and a reference solution with those
parameters baked in, and draws the argument lists of the visible examples and hidden tests.
Expected outputs are not part of a ``Problem``: :mod:`llm_gym.envs.code.tasks` computes them by
running the reference solution in the parent process.
"""

from __future__ import annotations

import random
import string
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "N_HIDDEN",
    "N_VISIBLE",
    "Problem",
    "int_list",
    "make_problem",
    "text",
    "word",
]

N_VISIBLE = 3
"""Examples shown in the prompt (and run by ``run_tests``)."""
N_HIDDEN = 10
"""Hidden tests that grade the final answer."""

Draw = Callable[[random.Random], tuple[Any, ...]]
"""Draws one argument tuple."""


@dataclass(frozen=True)
class Problem:
    """A function-writing problem with its reference solution and inputs."""

    template: str
    """The template's name, e.g. ``"digit_sum"``."""
    signature: str
    """The function's signature as shown, e.g. ``"digit_sum(n: int) -> int"``."""
    description: str
    """What the function returns, a sentence starting with "returns"."""
    reference: str
    """Source code of a correct solution (defines the entry function)."""
    visible: tuple[tuple[Any, ...], ...]
    """Argument tuples of the examples shown in the prompt."""
    hidden: tuple[tuple[Any, ...], ...]
    """Argument tuples of the hidden tests (edge cases first)."""
    params: dict[str, Any] = field(default_factory=dict)
    """The drawn parameters (for analysis; never needed to grade)."""

    @property
    def entry(self) -> str:
        """The function's name."""
        return self.signature.split("(", 1)[0]


def _draw_distinct(
    rng: random.Random, draw: Draw, count: int, taken: set[str]
) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    for _ in range(50 * count):
        if len(out) == count:
            break
        args = draw(rng)
        key = repr(args)
        if key not in taken:
            taken.add(key)
            out.append(args)
    return out


def make_problem(
    rng: random.Random,
    *,
    template: str,
    signature: str,
    description: str,
    reference: str,
    draw: Draw,
    edges: Sequence[tuple[Any, ...]] = (),
    params: dict[str, Any] | None = None,
) -> Problem:
    """Build a :class:`Problem`: distinct visible examples from ``draw``, then hidden tests.

    The hidden tests are the ``edges`` (edge cases, never shown) followed by fresh draws; no
    argument tuple appears twice.
    """
    taken: set[str] = {repr(e) for e in edges}
    visible = _draw_distinct(rng, draw, N_VISIBLE, taken)
    hidden = list(edges)[:N_HIDDEN]
    hidden += _draw_distinct(rng, draw, N_HIDDEN - len(hidden), taken)
    return Problem(
        template=template,
        signature=signature,
        description=description,
        reference=textwrap.dedent(reference).strip() + "\n",
        visible=tuple(visible),
        hidden=tuple(hidden),
        params=dict(params or {}),
    )


# --- input helpers -------------------------------------------------------------------------------


def int_list(rng: random.Random, low: int, high: int, min_len: int = 0, max_len: int = 10) -> list:
    """A list of ``min_len..max_len`` random ints in ``[low, high]``."""
    return [rng.randint(low, high) for _ in range(rng.randint(min_len, max_len))]


def word(rng: random.Random, alphabet: str = string.ascii_lowercase, low=1, high=7) -> str:
    """A random word of ``low..high`` letters from ``alphabet``."""
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(low, high)))


def text(rng: random.Random, words: int = 6, alphabet: str = string.ascii_lowercase) -> str:
    """Up to ``words`` random words joined by single spaces."""
    return " ".join(word(rng, alphabet) for _ in range(rng.randint(0, words)))
