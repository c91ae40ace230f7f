"""Load a causal LM and its tokenizer to generate with: ``hf:PATH`` policies, ``llm-gym serve``.

The one place a user's model path and dtype name are read: the dtype is checked against the
dtypes a model can be loaded in before any file is read (``getattr(torch, name)`` took any torch
attribute: ``--dtype manual_seed`` got as far as transformers).
"""

from __future__ import annotations

from typing import Any

from llm_gym.errors import InvalidArgumentError

__all__ = ["TORCH_DTYPES", "load_for_generation", "torch_dtype"]

TORCH_DTYPES = ("float32", "bfloat16", "float16")
"""The dtype names a model is loaded in."""


def torch_dtype(name: object) -> Any:
    """The torch dtype called ``name``, one of :data:`TORCH_DTYPES`.

    Example:
        >>> torch_dtype("bfloat16")
        torch.bfloat16
        >>> torch_dtype("manual_seed")
        Traceback (most recent call last):
        ...
        llm_gym.errors.InvalidArgumentError: dtype must be one of ['float32', 'bfloat16', \
'float16'], actual value: 'manual_seed'.
    """
    if not isinstance(name, str) or name not in TORCH_DTYPES:
        shown = repr(name) if len(repr(name)) <= 60 else f"{repr(name)[:60]}..."
        raise InvalidArgumentError(
            f"dtype must be one of {list(TORCH_DTYPES)}, actual value: {shown}."
        )
    import torch

    return getattr(torch, name)


def load_for_generation(
    path: str,
    *,
    dtype: str = "float32",
    device: str | None = None,
    chat_template: str | None = None,
) -> tuple[Any, Any]:
    """``(model, tokenizer)`` from ``from_pretrained`` on ``path``, in eval mode.

    ``path`` is a local folder, a ``.gguf`` file, a packaged model's name or a hub id
    (:func:`~llm_gym.policies.pretrained.resolve_model_path`); the model is loaded in ``dtype``
    on ``device`` (default: CUDA when available, else the CPU). Remote code is never run
    (``trust_remote_code`` stays off). ``chat_template`` (a named template or a ``.jinja``
    file) replaces the model's own (:func:`~llm_gym.policies.chat_templates.apply_chat_template`).

    Raises:
        ChatTemplateError: the model has no chat template and ``chat_template`` gives none;
            refused before the weights are read.
    """
    torch_type = torch_dtype(dtype)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from llm_gym.policies.chat_templates import (
        apply_chat_template,
        require_chat_template,
        resolve_chat_template,
    )
    from llm_gym.policies.pretrained import resolve_model_path

    if chat_template is not None:
        resolve_chat_template(chat_template)  # an unknown name: refused before any download
    path = resolve_model_path(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    if chat_template is None:
        require_chat_template(tokenizer, _config(path), what=f"model {path!r}")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_type)
    apply_chat_template(tokenizer, chat_template, model)
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return model.to(device).eval(), tokenizer


def _config(path: str) -> Any:
    """An object whose ``config`` is the model's config (for the refusal's suggestion), or
    None when it cannot be read."""
    from types import SimpleNamespace

    from transformers import AutoConfig

    try:
        return SimpleNamespace(config=AutoConfig.from_pretrained(path))
    except Exception:  # only a hint rides on it
        return None
