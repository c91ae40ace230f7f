"""The rules of Wordle: the word list, which guesses are allowed, and the feedback marks.

The word list ships with the package (``words.txt``: common English five-letter words), so the
game never downloads anything. The environment (:mod:`llm_gym.envs.wordle.env`) and the oracle's
solver (:mod:`llm_gym.envs.wordle.solver`) both play by these rules.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib import resources

__all__ = ["WORDS", "WORD_LENGTH", "WORD_SET", "check_guess", "consistent", "score_guess"]

WORD_LENGTH = 5
"""Letters per word."""


def _load_words() -> tuple[str, ...]:
    text = resources.files(__package__).joinpath("words.txt").read_text(encoding="ascii")
    return tuple(text.split())


WORDS: tuple[str, ...] = _load_words()
"""The bundled word list, sorted: every secret, and every allowed guess."""
WORD_SET = frozenset(WORDS)
"""The same words as a set (for membership tests)."""
_SHOWN_CHARS = 24


def score_guess(secret: str, guess: str) -> str:
    """The feedback marks of ``guess`` against ``secret``: G, Y or X per letter.

    Greens first; then, left to right, a guess letter is yellow while the secret still has a
    copy of it that no green or earlier yellow took, else gray. Both words have the same length.

    Example:
        >>> score_guess("abbey", "babes")
        'YYGGX'
        >>> score_guess("abbey", "bobby")
        'YXGXG'
    """
    marks = ["X"] * len(guess)
    left: dict[str, int] = {}
    for i, (s, g) in enumerate(zip(secret, guess, strict=True)):
        if s == g:
            marks[i] = "G"
        else:
            left[s] = left.get(s, 0) + 1
    for i, g in enumerate(guess):
        if marks[i] == "X" and left.get(g, 0) > 0:
            marks[i] = "Y"
            left[g] -= 1
    return "".join(marks)


def consistent(words: Sequence[str], guess: str, pattern: str) -> list[str]:
    """The words of ``words`` that would have given ``pattern`` for ``guess``."""
    return [w for w in words if score_guess(w, guess) == pattern]


def check_guess(word: str) -> str | None:
    """Why ``word`` is not a valid guess, or None when it is one.

    Example:
        >>> check_guess("crane") is None, check_guess("cranes")
        (True, "'cranes' has 6 letters; guesses have 5")
    """
    if word in WORD_SET:
        return None
    shown = word if len(word) <= _SHOWN_CHARS else word[:_SHOWN_CHARS] + "..."
    if len(word) != WORD_LENGTH:
        return f"{shown!r} has {len(word)} letters; guesses have {WORD_LENGTH}"
    if not (word.isascii() and word.isalpha()):
        return f"{shown!r} is not made of the letters a-z"
    return f"{shown!r} is not in the game's word list"
