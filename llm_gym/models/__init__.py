"""Models that ship with llm_gym: the tiny default model, built offline (see :mod:`.tiny`).

Importing this package imports no torch, transformers or tokenizers; the names below load
:mod:`llm_gym.models.tiny` on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llm_gym.models.tiny import (
        build_tiny_model,
        build_tokenizer,
        default_corpus,
        default_model_dir,
        load_tiny_model,
    )

__all__ = [
    "build_tiny_model",
    "load_tiny_model",
    "default_model_dir",
    "build_tokenizer",
    "default_corpus",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        value = getattr(importlib.import_module("llm_gym.models.tiny"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
