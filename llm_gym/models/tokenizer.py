"""The tiny model's tokenizer: a byte-level BPE trained offline, with Qwen2.5's tokens and template.

Byte-level BPE in Qwen2's pipeline (any text encodes, nothing is unknown, text decodes back in NFC
form; every digit is a token of its own) with Qwen2.5's special tokens and chat template (TRL's
``qwen2_5.jinja``, byte for byte, so TRL recognises it). tokenizers and transformers are imported
inside :func:`build_tokenizer` only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from llm_gym.errors import InvalidArgumentError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

__all__ = [
    "ADDED_TOKENS",
    "CHAT_TEMPLATE_NAME",
    "EOS_TOKEN",
    "IM_START",
    "PAD_TOKEN",
    "SPECIAL_TOKENS",
    "build_tokenizer",
]

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
EOS_TOKEN = "<|im_end|>"
SPECIAL_TOKENS = (PAD_TOKEN, IM_START, EOS_TOKEN)
"""Special tokens (skipped by ``decode(..., skip_special_tokens=True)``), ids 0, 1, 2."""
ADDED_TOKENS = (
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)
"""Single tokens that are not special (as in Qwen2.5: they survive ``skip_special_tokens``)."""

CHAT_TEMPLATE_NAME = "qwen2_5.jinja"
"""The chat template, read from TRL's ``trl/chat_templates`` at build time."""


def _chat_template() -> str:
    import importlib.util

    spec = importlib.util.find_spec("trl")  # locate the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            "Building the tiny model reads TRL's Qwen2.5 chat template; install the training "
            "extra: pip install -e '.[train]'."
        )
    for location in spec.submodule_search_locations:
        path = Path(location) / "chat_templates" / CHAT_TEMPLATE_NAME
        if path.is_file():
            return path.read_text(encoding="utf-8")
    raise FileNotFoundError(f"trl/chat_templates/{CHAT_TEMPLATE_NAME} not found in {spec.origin}")


_TOKEN_SPLIT = re.compile("|".join(re.escape(t) for t in (*SPECIAL_TOKENS, *ADDED_TOKENS)))


def _pieces(corpus: Iterable[str]) -> Iterator[str]:
    """The corpus with special and added tokens cut out (BPE training does not skip them)."""
    for text in corpus:
        for piece in _TOKEN_SPLIT.split(text):
            if piece:
                yield piece


def build_tokenizer(
    corpus: Iterable[str], vocab_size: int = 1024, seed: int = 0
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on ``corpus``, offline, with Qwen2.5's tokens and template.

    * Byte-level, with exactly ``Qwen2Tokenizer``'s pipeline (NFC normalizer, Qwen2's split
      regex, byte-level BPE), because ``AutoTokenizer`` rebuilds that pipeline for any qwen2
      model: any text encodes with no unknown token and decodes back to its NFC form (so
      exactly, for NFC text); every digit is a token of its own.
    * Special tokens (ids 0-2): ``<|endoftext|>`` (pad), ``<|im_start|>``, ``<|im_end|>`` (eos).
    * Added, non-special single tokens (ids 3-8): ``<tool_call>``, ``</tool_call>``,
      ``<tool_response>``, ``</tool_response>``, ``<think>``, ``</think>``.
    * ``chat_template``: TRL's ``qwen2_5.jinja``, unchanged (renders system/user/assistant/tool
      messages, assistant ``tool_calls`` and a ``tools=`` list).

    Args:
        corpus: Training texts (occurrences of the special and added tokens are cut out first).
        vocab_size: Total size, special tokens and the 256 byte tokens included (smaller when
            the corpus runs out of pairs seen at least twice).
        seed: Recorded for symmetry with the model; BPE training has no randomness, so the same
            corpus and ``vocab_size`` always give the identical ``tokenizer.json``.

    Returns:
        A ``PreTrainedTokenizerFast`` (``save_pretrained`` / ``AutoTokenizer`` round-trip).
    """
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        trainers,
    )
    from transformers import Qwen2Tokenizer
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    del seed  # deterministic without it
    all_tokens = [*SPECIAL_TOKENS, *ADDED_TOKENS]
    if vocab_size < 256 + len(all_tokens):
        raise InvalidArgumentError(
            f"vocab_size must be at least {256 + len(all_tokens)} (bytes + special tokens), "
            f"actual value: {vocab_size}."
        )
    # Exactly Qwen2Tokenizer's pipeline: transformers rebuilds it from vocab and merges whenever
    # a model of type qwen2 is loaded with AutoTokenizer, so training with any other would
    # make the loaded tokenizer disagree with the trained one.
    trainable = Tokenizer(models.BPE())
    trainable.normalizer = normalizers.NFC()
    trainable.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    trainable.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=all_tokens,  # ids 0-8, in this order
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    trainable.train_from_iterator(_pieces(corpus), trainer)
    model = json.loads(trainable.to_str())["model"]
    tokenizer = Qwen2Tokenizer(
        vocab=model["vocab"],
        merges=[tuple(pair) for pair in model["merges"]],
        unk_token=None,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        model_max_length=32768,
        clean_up_tokenization_spaces=False,
        chat_template=_chat_template(),
    )
    tokenizer.add_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED_TOKENS])
    return tokenizer
