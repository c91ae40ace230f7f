"""The Wordle oracle's solver: keep the words consistent with all feedback, split them well.

A guess is scored by the expected number of candidates left after it (the sum of the squared
sizes of the groups its feedback splits the candidates into), with a solved game counted as
nothing left, so a candidate wins ties. Every word of the list may be guessed, also one that
is no longer possible, when it splits the candidates better.

Feedback for every (guess, secret) pair comes from a table built once, lazily, with numpy
(about 3.7 million entries, a fraction of a second); it agrees with
:func:`llm_gym.envs.wordle.rules.score_guess` (the tests check it).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

__all__ = ["PATTERNS", "best_guess", "candidates", "feedback_table", "pattern_code"]

PATTERNS = 3**5
"""Distinct feedback patterns of a five-letter guess."""
_VALUE = {"X": 0, "Y": 1, "G": 2}


def pattern_code(pattern: str) -> int:
    """A feedback pattern such as ``"GYXXG"`` as a number in ``0..242`` (first letter highest).

    Example:
        >>> pattern_code("XXXXX"), pattern_code("GGGGG")
        (0, 242)
    """
    code = 0
    for mark in pattern:
        code = code * 3 + _VALUE[mark]
    return code


@functools.cache
def feedback_table(words: tuple[str, ...]) -> np.ndarray:
    """``table[g, s]``: the :func:`pattern_code` of guessing ``words[g]`` when ``words[s]`` is
    the secret (uint8, ``len(words)`` squared entries).

    Duplicate letters follow the game's rule: greens first, then each remaining guess letter,
    left to right, is yellow while the secret has unmatched copies of it left.
    """
    letters = np.array([[ord(c) - 97 for c in w] for w in words], dtype=np.intp)
    n, length = letters.shape
    counts = np.zeros((n, 26), dtype=np.int8)  # counts[s, letter]: copies in word s
    for position in range(length):
        counts[np.arange(n), letters[:, position]] += 1
    green = [letters[:, j][:, None] == letters[:, j][None, :] for j in range(length)]  # (n, n)
    codes = np.zeros((n, n), dtype=np.int16)
    for i in range(length):
        # copies of guess letter i in the secret that no green took ...
        available = counts[:, letters[:, i]].T.astype(np.int8)
        # ... of which earlier non-green copies of the same letter in the guess take the first
        earlier = np.zeros((n, n), dtype=np.int8)
        for j in range(length):
            same = (letters[:, j] == letters[:, i])[:, None]
            available -= same & green[j]
            if j < i:
                earlier += same & ~green[j]
        value = np.where(green[i], 2, (earlier < available).astype(np.int16))
        codes = codes * 3 + value
    return codes.astype(np.uint8)


def candidates(words: tuple[str, ...], history: Sequence[tuple[str, str]]) -> np.ndarray:
    """Indices of the words consistent with every ``(guess, pattern)`` of ``history``.

    Guesses that are not in ``words`` are skipped (they carry no usable feedback).
    """
    table = feedback_table(words)
    index = _index(words)
    alive = np.arange(len(words))
    for guess, pattern in history:
        row = index.get(guess)
        if row is not None:
            alive = alive[table[row, alive] == pattern_code(pattern)]
    return alive


@functools.cache
def _index(words: tuple[str, ...]) -> dict[str, int]:
    return {w: i for i, w in enumerate(words)}


@functools.lru_cache(maxsize=8192)
def best_guess(words: tuple[str, ...], history: tuple[tuple[str, str], ...]) -> str:
    """The solver's next guess after ``history`` (pairs of guess and feedback pattern).

    With one or two candidates left it guesses the first; otherwise the word (of all
    ``words``) that leaves the fewest candidates in expectation. When no word fits the
    history (feedback from another word list), it starts over as if nothing were known.
    """
    alive = candidates(words, history)
    if len(alive) == 0:
        alive = np.arange(len(words))
    if len(alive) <= 2:
        return words[int(alive[0])]
    table = feedback_table(words)
    n = len(words)
    groups = table[:, alive].astype(np.int64) + PATTERNS * np.arange(n)[:, None]
    counts = np.bincount(groups.ravel(), minlength=n * PATTERNS).reshape(n, PATTERNS)
    is_candidate = np.zeros(n, dtype=np.int64)
    is_candidate[alive] = 1
    # expected leftovers x len(alive), the win not counted; doubled so candidates win ties
    score = 2 * ((counts * counts).sum(axis=1) - is_candidate) - is_candidate
    return words[int(np.argmin(score))]
