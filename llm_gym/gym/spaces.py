"""Text spaces that hold any Unicode string up to a maximum length."""

from __future__ import annotations

import string
from typing import Any

import numpy as np
from gymnasium.spaces import Text

__all__ = ["SAMPLE_CHARSET", "UnicodeText"]

SAMPLE_CHARSET = (
    string.ascii_letters + string.digits + string.punctuation + " \n" + "éüßçñ中文字日本語😀→≤"
)
"""Characters :meth:`UnicodeText.sample` draws from (membership accepts any character)."""


class UnicodeText(Text):
    """A :class:`gymnasium.spaces.Text` whose ``contains`` accepts any Unicode string.

    Gymnasium's ``Text`` only holds strings over a fixed charset; a language model's output and an
    environment's observations can hold any character. Membership here is: a ``str`` whose length
    is within ``[min_length, max_length]``. ``sample()`` draws from :data:`SAMPLE_CHARSET` with a
    length of at most ``sample_max_length`` so that samples stay cheap.

    Example:
        >>> space = UnicodeText(10)
        >>> "héllo 中" in space, "x" * 11 in space
        (True, False)
    """

    def __init__(
        self,
        max_length: int,
        *,
        min_length: int = 0,
        sample_max_length: int = 64,
        seed: int | np.random.Generator | None = None,
    ) -> None:
        super().__init__(max_length, min_length=min_length, charset=SAMPLE_CHARSET, seed=seed)
        self.sample_max_length = min(sample_max_length, max_length)

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        """A random string over :data:`SAMPLE_CHARSET` of length ≤ ``sample_max_length``."""
        if mask is not None or probability is not None:
            return super().sample(mask=mask, probability=probability)
        length = int(self.np_random.integers(self.min_length, self.sample_max_length + 1))
        chars = self.np_random.choice(len(self.character_list), size=length)
        return "".join(self.character_list[i] for i in chars)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"UnicodeText({self.min_length}, {self.max_length})"

    def __eq__(self, other: Any) -> bool:
        return (
            isinstance(other, UnicodeText)
            and self.min_length == other.min_length
            and self.max_length == other.max_length
        )

    def __hash__(self) -> int:
        return hash((UnicodeText, self.min_length, self.max_length))
