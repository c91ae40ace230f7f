"""A tiny, randomly initialised Qwen2 model with a tokenizer trained on the environments' text.

The embedded default model: built offline in seconds (nothing comes from a model hub), small
enough to train on a CPU, and loadable with ``AutoTokenizer`` / ``AutoModelForCausalLM``::

    >>> from llm_gym.models import build_tiny_model, load_tiny_model
    >>> path = build_tiny_model()             # doctest: +SKIP
    >>> model, tokenizer = load_tiny_model()  # doctest: +SKIP

The recipe: the corpus of oracle transcripts (:mod:`llm_gym.models.corpus`), a byte-level BPE
tokenizer trained on it with Qwen2.5's tokens and chat template
(:mod:`llm_gym.models.tokenizer`), and a random ``Qwen2ForCausalLM`` sized to it (here). Builds
are cached under ``$LLM_GYM_CACHE/models`` (default ``~/.cache/llm_gym/models``) in a directory
named by a hash of the recipe.

torch, transformers and tokenizers are imported inside the functions only.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llm_gym.errors import InvalidArgumentError
from llm_gym.models.corpus import default_corpus, selected_envs
from llm_gym.models.tokenizer import (
    ADDED_TOKENS,
    CHAT_TEMPLATE_NAME,
    EOS_TOKEN,
    IM_START,
    PAD_TOKEN,
    SPECIAL_TOKENS,
    build_tokenizer,
)
from llm_gym.policies.gguf import cache_root, read_build_info

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerFast

__all__ = [
    "BUILD_VERSION",
    "MAX_TINY_PARAMETERS",
    "build_tiny_model",
    "check_model_sizes",
    "default_model_dir",
    "load_tiny_model",
    # re-exported: the tokenizer (llm_gym.models.tokenizer) and its corpus (.corpus)
    "ADDED_TOKENS",
    "CHAT_TEMPLATE_NAME",
    "EOS_TOKEN",
    "IM_START",
    "PAD_TOKEN",
    "SPECIAL_TOKENS",
    "build_tokenizer",
    "default_corpus",
]

BUILD_VERSION = "2"
"""Bumped whenever the recipe (corpus, tokenizer, model) changes: it is part of the cache key."""

MAX_TINY_PARAMETERS = 1_000_000_000
"""The most parameters a tiny-model build may have (4 GB of fp32 weights): sizes past it are
refused before the corpus is read, never left to run out of memory."""

BUILD_INFO = "build_info.json"
_BUILD_FILES = frozenset(
    {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "added_tokens.json",
        "chat_template.jinja",
        "chat_template.json",
        BUILD_INFO,
    }
)
"""Files a build writes; a directory holding anything else is never deleted by a rebuild."""


def _log(message: str) -> None:
    print(f"[llm_gym.models] {message}", file=sys.stderr, flush=True)


def _corpus_envs(envs: Sequence[str] | None = None) -> list[tuple[str, str]]:
    return [(entry.id, str(entry.version)) for entry in selected_envs(envs)]


def _build_args(envs: Sequence[str] | None = None, **kwargs: Any) -> dict[str, Any]:
    args = {"build_version": BUILD_VERSION, **kwargs, "envs": _corpus_envs(envs)}
    return json.loads(json.dumps(args))  # as build_info.json stores it (lists, not tuples)


def _build_hash(args: dict[str, Any]) -> str:
    blob = json.dumps(args, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def default_model_dir(
    *,
    hidden_size: int = 192,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 512,
    vocab_size: int = 1024,
    max_position_embeddings: int = 4096,
    seed: int = 0,
    max_tasks_per_env: int = 400,
    envs: Sequence[str] | None = None,
) -> Path:
    """``$LLM_GYM_CACHE/models/tiny-qwen2-<hash>`` for these build arguments.

    ``$LLM_GYM_CACHE`` defaults to ``~/.cache/llm_gym``; ``<hash>`` covers the arguments, the
    registered environments (ids and versions: they make the corpus) and :data:`BUILD_VERSION`.
    """
    args = _build_args(
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        vocab_size=vocab_size,
        max_position_embeddings=max_position_embeddings,
        seed=seed,
        max_tasks_per_env=max_tasks_per_env,
        envs=envs,
    )
    return cache_root() / f"tiny-qwen2-{_build_hash(args)}"


def _complete(path: Path, args: dict[str, Any]) -> bool:
    info = read_build_info(path)
    return info is not None and info.get("args") == args


def _safe_to_replace(path: Path) -> bool:
    return path.is_dir() and all(
        p.name in _BUILD_FILES or p.name.startswith(f".{BUILD_INFO}.tmp-") for p in path.iterdir()
    )


def _write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _move_into_place(tmp_dir: Path, target: Path) -> None:
    """Rename ``tmp_dir`` to ``target``, replacing an incomplete or stale build there."""
    old = None
    if target.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
        os.rename(target, old / "build")
    try:
        os.rename(tmp_dir, target)
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def check_model_sizes(**sizes: Any) -> int:
    """Check a tiny model's sizes (keyword arguments of :func:`build_tiny_model`: ``seed`` an
    integer >= 0, the others integers >= 1, ``hidden_size`` divisible by ``num_heads`` and that
    by ``num_kv_heads``) and return its parameter count's upper bound, at most
    :data:`MAX_TINY_PARAMETERS`.

    Example:
        >>> check_model_sizes(hidden_size=192, num_layers=4, num_heads=4, num_kv_heads=2,
        ...                   intermediate_size=512, vocab_size=1024)
        1966080

    Raises:
        InvalidArgumentError: a size of another type or out of range, heads that do not divide,
            or more parameters than :data:`MAX_TINY_PARAMETERS`.
    """
    for name, value in sizes.items():
        least = 0 if name == "seed" else 1
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise InvalidArgumentError(
                f"{name} must be an integer >= {least}, actual value: {value!r:.80}."
            )
    h, heads, kv = sizes["hidden_size"], sizes["num_heads"], sizes["num_kv_heads"]
    if h % heads or heads % kv:
        raise InvalidArgumentError(
            f"hidden_size ({h}) must be divisible by num_heads ({heads}), and num_heads by "
            f"num_kv_heads ({kv})."
        )
    layer = 4 * h * h + 3 * h * sizes["intermediate_size"]  # attention (at most 4 h x h) + MLP
    parameters = sizes["num_layers"] * layer + sizes["vocab_size"] * h
    if parameters > MAX_TINY_PARAMETERS:
        raise InvalidArgumentError(
            f"These sizes make a model of about {parameters:,} parameters, more than "
            f"{MAX_TINY_PARAMETERS:,} (llm_gym.models.tiny.MAX_TINY_PARAMETERS); a tiny model "
            "is a few million (the defaults: hidden_size 192, num_layers 4)."
        )
    return parameters


def build_tiny_model(
    output_dir: str | os.PathLike[str] | None = None,
    *,
    hidden_size: int = 192,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 512,
    vocab_size: int = 1024,
    max_position_embeddings: int = 4096,
    seed: int = 0,
    max_tasks_per_env: int = 400,
    envs: Sequence[str] | None = None,
    force: bool = False,
) -> Path:
    """Build (or find) the tiny model: a tokenizer from :func:`default_corpus` and a random Qwen2.

    The model is a ``Qwen2ForCausalLM`` (fp32, tied input/output embeddings, vocabulary = the
    tokenizer's size) initialised after ``torch.manual_seed(seed)``; the same arguments give
    byte-identical ``model.safetensors`` and ``tokenizer.json``. Both are written with
    ``save_pretrained`` into a temporary directory that is renamed into place; ``build_info.json``
    is written last, so a directory without it is an incomplete build and is rebuilt.

    Args:
        output_dir: Where to build (default: :func:`default_model_dir` of the arguments). An
            existing directory is only replaced when it holds nothing but build files.
        hidden_size, num_layers, num_heads, num_kv_heads, intermediate_size,
        max_position_embeddings: The ``Qwen2Config``.
        vocab_size: The tokenizer's target size (see :func:`build_tokenizer`).
        seed: Seed of the weight initialisation.
        max_tasks_per_env: Training tasks per environment in the tokenizer corpus.
        envs: The environments whose transcripts make the tokenizer corpus (None: the eight core
            built-ins, ``DEFAULT_CORPUS_ENVS``); ``train.py`` builds its model for the environment
            it trains on.
        force: Rebuild even when a complete build of the same arguments is there.

    Returns:
        The directory (``AutoModelForCausalLM.from_pretrained`` / ``AutoTokenizer`` load it).
    """
    kwargs = dict(
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        vocab_size=vocab_size,
        max_position_embeddings=max_position_embeddings,
        seed=seed,
        max_tasks_per_env=max_tasks_per_env,
    )
    check_model_sizes(**kwargs)  # before any file, corpus or weight
    args = _build_args(envs, **kwargs)
    target = Path(output_dir) if output_dir is not None else default_model_dir(envs=envs, **kwargs)
    target = target.expanduser().absolute()
    if not force and _complete(target, args):
        _log(f"using the existing build in {target}")
        return target
    if target.exists() and not _safe_to_replace(target):
        raise InvalidArgumentError(
            f"{target} exists and holds files that are not a tiny-model build; pick another "
            "output directory (or empty it)."
        )

    start = time.perf_counter()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp_dir = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    umask = os.umask(0o022)
    os.umask(umask)
    tmp_dir.chmod(0o777 & ~umask)  # mkdtemp makes it private; the build is an ordinary directory
    try:
        _log(f"building a tiny Qwen2 model in {target}")
        corpus = default_corpus(max_tasks_per_env, envs)
        chars = sum(len(t) for t in corpus)
        _log(f"corpus: {len(corpus)} texts, {chars:,} chars ({time.perf_counter() - start:.1f}s)")
        tokenizer = build_tokenizer(corpus, vocab_size=vocab_size, seed=seed)
        tokenizer.model_max_length = max_position_embeddings
        _log(f"tokenizer: {len(tokenizer)} tokens ({time.perf_counter() - start:.1f}s)")
        model = _random_model(tokenizer, **kwargs)
        parameters = sum(p.numel() for p in model.parameters())
        _log(f"model: {parameters:,} parameters ({time.perf_counter() - start:.1f}s)")
        tokenizer.save_pretrained(tmp_dir)
        model.save_pretrained(tmp_dir, safe_serialization=True)
        for file in tmp_dir.iterdir():
            file.chmod(0o666 & ~umask)
        if not force and _complete(target, args):  # another process finished the same build
            shutil.rmtree(tmp_dir, ignore_errors=True)
            _log(f"using the build another process just finished in {target}")
            return target
        _move_into_place(tmp_dir, target)
    except BaseException:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        raise
    seconds = time.perf_counter() - start
    info = {
        "args": args,
        "hash": _build_hash(args),
        "num_parameters": parameters,
        "vocab_size": len(tokenizer),
        "corpus_texts": len(corpus),
        "corpus_chars": chars,
        "chat_template": f"trl/chat_templates/{CHAT_TEMPLATE_NAME}",
        "build_seconds": round(seconds, 2),
    }
    _write_json_atomic(target / BUILD_INFO, info)
    _log(f"done in {seconds:.1f}s: {target}")
    return target


def _random_model(tokenizer: Any, **kwargs: Any) -> PreTrainedModel:
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    pad_id = tokenizer.convert_tokens_to_ids(PAD_TOKEN)
    eos_id = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=kwargs["hidden_size"],
        intermediate_size=kwargs["intermediate_size"],
        num_hidden_layers=kwargs["num_layers"],
        num_attention_heads=kwargs["num_heads"],
        num_key_value_heads=kwargs["num_kv_heads"],
        max_position_embeddings=kwargs["max_position_embeddings"],
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        dtype="float32",
    )
    torch.manual_seed(kwargs["seed"])
    with _default_dtype(torch.float32):
        model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=eos_id, pad_token_id=pad_id)
    return model.eval()


@contextlib.contextmanager
def _default_dtype(dtype: Any) -> Iterator[None]:
    import torch

    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def load_tiny_model(
    path: str | os.PathLike[str] | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """``(model, tokenizer)`` loaded with ``from_pretrained`` from ``path``.

    With ``path=None`` the default build (:func:`build_tiny_model` with its defaults) is used,
    built first when the cache does not hold it yet.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory = Path(path) if path is not None else build_tiny_model()
    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = AutoModelForCausalLM.from_pretrained(directory)
    return model, tokenizer
