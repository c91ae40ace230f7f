"""Models that ship with llm_gym: the tiny default model, built offline (see :mod:`.tiny`).

Importing this package imports no torch, transformers or tokenizers; the names below load their
module (:mod:`.tiny`: the model and its cache, :mod:`.tokenizer`, :mod:`.corpus`) on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llm_gym.lazy import lazy_names

if TYPE_CHECKING:
    from llm_gym.models.corpus import default_corpus
    from llm_gym.models.tiny import build_tiny_model, default_model_dir, load_tiny_model
    from llm_gym.models.tokenizer import build_tokenizer

__all__ = [
    "build_tiny_model",
    "load_tiny_model",
    "default_model_dir",
    "build_tokenizer",
    "default_corpus",
]

_MODULES = {
    "build_tiny_model": "llm_gym.models.tiny",
    "load_tiny_model": "llm_gym.models.tiny",
    "default_model_dir": "llm_gym.models.tiny",
    "build_tokenizer": "llm_gym.models.tokenizer",
    "default_corpus": "llm_gym.models.corpus",
}
"""The module each name of ``__all__`` lives in."""


__getattr__, __dir__ = lazy_names(__name__, _MODULES, __all__)
