"""A chat template for a model that has none: named templates, template files, and the refusal.

Every path a model goes (``llm-gym eval``/``serve``, ``hf:`` policies, GRPO, SFT, ``train.py``)
renders conversations with the tokenizer's chat template. A base model (Gemma 3 270M from the
package index, say) carries none: :func:`require_chat_template` refuses it before any episode,
naming the remedy, and :func:`apply_chat_template` gives it one from the ``chat_template``
option:

* a name of :data:`NAMED_CHAT_TEMPLATES`: ``"chatml"`` (``<|im_start|>role ... <|im_end|>``) or
  ``"gemma"`` (``<start_of_turn>role ... <end_of_turn>``). Its turn tokens are added to the
  tokenizer as special tokens where the vocabulary lacks them and the model's embeddings are
  resized (TRL's ``clone_chat_template`` does the same for SFT; as special tokens, an
  environment's text cannot forge them, :func:`llm_gym.policies.chat.neutralize_control_tokens`).
  Its end-of-turn token becomes the tokenizer's ``eos_token`` and joins the model's generation
  ``eos_token_id``, so sampling stops at the end of a turn. A tokenizer that adds a BOS token
  when it encodes gets it at the head of the rendering (the tracker encodes without special
  tokens);
* a path to a Jinja file (``.jinja``, ``.j2``): its text, as it is; the tokens it writes must
  be in the vocabulary already (nothing is added).

For Gemma models ``"gemma"`` needs no new token (``<start_of_turn>`` and ``<end_of_turn>`` are in
Gemma's vocabulary), so nothing untrained enters the model; ``"chatml"`` on Gemma adds two
embeddings that only training gives a meaning.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llm_gym.core.input_files import InputLimit, read_input_text
from llm_gym.errors import ChatTemplateError, InvalidArgumentError, did_you_mean

__all__ = [
    "MAX_TEMPLATE_FILE_BYTES",
    "NAMED_CHAT_TEMPLATES",
    "NamedChatTemplate",
    "apply_chat_template",
    "has_chat_template",
    "missing_tokens",
    "require_chat_template",
    "resolve_chat_template",
    "suggested_chat_template",
]

MAX_TEMPLATE_FILE_BYTES = 1 << 20
"""The largest template file read (a published template is a few KB)."""


@dataclass(frozen=True)
class NamedChatTemplate:
    """A chat template known by name."""

    name: str
    """What users pass: ``--chat-template NAME``, ``chat_template: NAME``."""
    template: str
    """The Jinja text (without the BOS prefix :func:`apply_chat_template` adds where the
    tokenizer encodes with one)."""
    turn_tokens: tuple[str, ...]
    """The special tokens it writes, added to a tokenizer that lacks them."""
    end_of_turn: str
    """The token that ends an assistant turn: the tokenizer's ``eos_token`` once applied."""
    description: str
    """One line for help texts."""


_CONTENT = "{%- set content = message['content'] if message['content'] is string else '' %}"

CHATML = NamedChatTemplate(
    name="chatml",
    template=(
        "{%- for message in messages %}" + _CONTENT + "{{- '<|im_start|>' + message['role'] + "
        "'\\n' + content + '<|im_end|>' + '\\n' }}{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    ),
    turn_tokens=("<|im_start|>", "<|im_end|>"),
    end_of_turn="<|im_end|>",
    description="ChatML (<|im_start|>role ... <|im_end|>), the tokens added where missing",
)

GEMMA = NamedChatTemplate(
    name="gemma",
    template=(
        "{%- for message in messages %}" + _CONTENT + "{%- set role = 'model' if "
        "message['role'] == 'assistant' else 'user' %}{{- '<start_of_turn>' + role + '\\n' + "
        "content + '<end_of_turn>' + '\\n' }}{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<start_of_turn>model\\n' }}{%- endif %}"
    ),
    turn_tokens=("<start_of_turn>", "<end_of_turn>"),
    end_of_turn="<end_of_turn>",
    description="Gemma's turns (<start_of_turn>user|model ... <end_of_turn>; system and tool "
    "messages as user turns): no new token on a Gemma tokenizer",
)

NAMED_CHAT_TEMPLATES: dict[str, NamedChatTemplate] = {t.name: t for t in (CHATML, GEMMA)}
"""The templates :func:`resolve_chat_template` knows by name."""

_BOS = "{{- bos_token }}"


def has_chat_template(tokenizer: Any) -> bool:
    """Whether ``tokenizer`` holds a chat template (a non-empty string, or a non-empty dict of
    named ones)."""
    template = getattr(tokenizer, "chat_template", None)
    return bool(template) and isinstance(template, str | dict)


def suggested_chat_template(model: Any = None) -> str:
    """The named template to suggest for ``model``: ``"gemma"`` for a Gemma model (its
    ``config.model_type`` starts with ``gemma``), else ``"chatml"``."""
    config = getattr(model, "config", None)
    kind = str(getattr(config, "model_type", "") or "")
    return "gemma" if kind.startswith("gemma") else "chatml"


def require_chat_template(tokenizer: Any, model: Any = None, what: str = "the model") -> None:
    """Refuse a tokenizer without a chat template, naming the remedy.

    Raises:
        ChatTemplateError: ``tokenizer`` has none.
    """
    if has_chat_template(tokenizer):
        return
    name = suggested_chat_template(model)
    raise ChatTemplateError(
        f"{what} has no chat template (a base model?), so no conversation can be rendered; "
        f"give it one with the chat_template option: --chat-template {name} on "
        f"llm-gym eval/serve, chat_template: {name} in a training config, or a path to a "
        f".jinja file (named: {', '.join(NAMED_CHAT_TEMPLATES)})."
    )


def resolve_chat_template(option: str | os.PathLike[str]) -> NamedChatTemplate | str:
    """The template ``option`` names: a :class:`NamedChatTemplate`, or a Jinja file's text.

    Raises:
        InvalidArgumentError: neither a known name nor a readable template file (at most
            :data:`MAX_TEMPLATE_FILE_BYTES`, UTF-8).

    Example:
        >>> resolve_chat_template("chatml").end_of_turn
        '<|im_end|>'
        >>> resolve_chat_template("chatlm")
        Traceback (most recent call last):
        ...
        llm_gym.errors.InvalidArgumentError: chat_template must be a named template (chatml, \
gemma) or a path to a .jinja file, actual value: 'chatlm'. Did you mean 'chatml'?
    """
    text = os.fspath(option) if isinstance(option, str | os.PathLike) else None
    if text in NAMED_CHAT_TEMPLATES:
        return NAMED_CHAT_TEMPLATES[text]
    path = Path(text).expanduser() if text else None
    if path is None or not path.is_file():
        raise InvalidArgumentError(
            "chat_template must be a named template "
            f"({', '.join(NAMED_CHAT_TEMPLATES)}) or a path to a .jinja file, actual value: "
            f"{option!r}." + did_you_mean(text, NAMED_CHAT_TEMPLATES)
        )
    limit = InputLimit(
        "chat template", MAX_TEMPLATE_FILE_BYTES, "llm_gym.policies.chat_templates."
        "MAX_TEMPLATE_FILE_BYTES"
    )  # fmt: skip
    template = read_input_text(path, limit)
    if not template.strip():
        raise InvalidArgumentError(f"chat_template file {text!r} is empty.")
    return template


def _adds_bos(tokenizer: Any) -> bool:
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None:
        return False
    try:
        ids = tokenizer.encode("a", add_special_tokens=True)
    except Exception:  # a tokenizer that cannot say: no BOS
        return False
    return bool(ids) and ids[0] == bos


def missing_tokens(tokenizer: Any, option: str | os.PathLike[str] | None) -> list[str]:
    """The turn tokens of the named template ``option`` that ``tokenizer``'s vocabulary lacks
    (adding them needs the model: its embeddings grow); empty for None or a file."""
    if option is None:
        return []
    found = resolve_chat_template(option)
    if isinstance(found, str):
        return []
    vocabulary = tokenizer.get_vocab()
    return [t for t in found.turn_tokens if t not in vocabulary]


def apply_chat_template(
    tokenizer: Any, option: str | os.PathLike[str] | None, model: Any = None
) -> list[str]:
    """Give ``tokenizer`` (and ``model``) the chat template ``option`` names (see the module
    docstring); None leaves them as they are. Returns the tokens it added.

    Raises:
        InvalidArgumentError: an unknown name or an unreadable file
            (:func:`resolve_chat_template`), or a named template whose tokens the tokenizer
            lacks with no ``model`` to resize.
    """
    if option is None:
        return []
    found = resolve_chat_template(option)
    if isinstance(found, str):
        tokenizer.chat_template = found
        return []
    missing = missing_tokens(tokenizer, option)
    if missing and model is None:
        raise InvalidArgumentError(
            f"chat_template {found.name!r} writes {missing}, which the tokenizer lacks; adding "
            "them needs the model (its embeddings grow): apply it where the model is loaded."
        )
    # Special (also those already in the vocabulary): an environment's text cannot forge them.
    tokenizer.add_special_tokens(
        {"additional_special_tokens": list(found.turn_tokens)}, replace_extra_special_tokens=False
    )
    old_eos = getattr(tokenizer, "eos_token_id", None)
    if getattr(tokenizer, "pad_token_id", None) is None and old_eos is not None:
        tokenizer.pad_token = tokenizer.eos_token
    template = found.template
    if _adds_bos(tokenizer):
        template = _BOS + template
    tokenizer.chat_template = template
    tokenizer.eos_token = found.end_of_turn
    if model is not None:
        _fit_model(model, tokenizer, old_eos)
    return missing


def _fit_model(model: Any, tokenizer: Any, old_eos: int | None) -> None:
    """Resize ``model``'s embeddings to hold every id of ``tokenizer`` (never shrink them) and
    add the new end-of-turn id to its generation ``eos_token_id``."""
    embeddings = model.get_input_embeddings()
    rows = int(embeddings.weight.shape[0]) if embeddings is not None else 0
    if len(tokenizer) > rows:
        model.resize_token_embeddings(len(tokenizer))
    eos_ids: list[int] = [int(tokenizer.eos_token_id)]
    config = getattr(model, "generation_config", None)
    if config is not None:
        known = config.eos_token_id
        known = [known] if isinstance(known, int) else list(known or [])
        if old_eos is not None:
            known.append(int(old_eos))
        eos_ids += [int(i) for i in known if int(i) not in eos_ids]
        config.eos_token_id = eos_ids
