"""The hash that says whether a local model is still the one a leaderboard record was made with.

A model's answers depend on its weights, its config, its tokenizer and its chat template: a new
chat template (``chat_template.jinja``, or the ``chat_template`` of ``tokenizer_config.json``)
changes every prompt the model sees, with the weights unchanged. :func:`model_files_hash` hashes
every file of a model folder under one of those names (:func:`is_model_file`), each by its
name and bytes, so a change to any of them makes the records made with the folder stale.

A path named in ``leaderboard.json`` may be anything. Each file is opened without blocking and
judged by its descriptor (:func:`~llm_gym.core.input_files.open_input`): a FIFO, a device
(``/dev/zero`` never ends) or a link to one under a hashed name is refused with one
:class:`~llm_gym.errors.InvalidArgumentError`, never read.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from llm_gym.core.input_files import InputLimit, open_input

__all__ = ["MAX_MODEL_FILE_BYTES", "MODEL_FILE_NAMES", "is_model_file", "model_files_hash"]

MODEL_FILE_NAMES = frozenset(
    {
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "added_tokens.json",
        "tokenizer.model",
        "vocab.json",
        "vocab.txt",
        "merges.txt",
        "chat_template.jinja",
        "chat_template.json",
    }
)
"""The files beside the weights that a model's answers depend on: config, tokenizer, template."""

MAX_MODEL_FILE_BYTES = 1 << 40
"""The largest file hashed: a terabyte, past the largest published weights."""

_LIMIT = InputLimit(
    "model file", MAX_MODEL_FILE_BYTES, "llm_gym.eval.model_hash.MAX_MODEL_FILE_BYTES"
)


def is_model_file(name: str) -> bool:
    """Whether a model folder's file ``name`` is hashed: weights (``*.safetensors``,
    ``pytorch_model*``), a chat template (``*.jinja`` in ``additional_chat_templates``
    aside), or one of :data:`MODEL_FILE_NAMES`."""
    return (
        name.endswith(".safetensors")
        or name.startswith("pytorch_model")
        or (name in MODEL_FILE_NAMES)
    )


def model_files_hash(folder: Path) -> str | None:
    """A short sha256 of a model folder's weights, config, tokenizer and chat template files
    (:func:`is_model_file`), each by name and bytes, in name order. None: no folder, or no
    weights in it.

    Raises:
        InvalidArgumentError: A file under a hashed name is not a regular file (a device, a
            FIFO, a folder, a link to one), or unreadable: one line naming it.
    """
    if not folder.is_dir():
        return None
    names = sorted(p.name for p in folder.iterdir() if is_model_file(p.name))
    if not any(n.endswith(".safetensors") or n.startswith("pytorch_model") for n in names):
        return None
    digest = hashlib.sha256()
    for name in names:
        with open_input(folder / name, _LIMIT) as handle:
            digest.update(f"{name}\0".encode())
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
    return digest.hexdigest()[:12]
