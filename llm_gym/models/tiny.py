"""A tiny, randomly initialised Qwen2 model with a tokenizer trained on the environments' text.

The embedded default model: built offline in seconds (nothing comes from a model hub), small
enough to train on a CPU, and loadable with ``AutoTokenizer`` / ``AutoModelForCausalLM``::

    >>> from llm_gym.models import build_tiny_model, load_tiny_model
    >>> path = build_tiny_model()             # doctest: +SKIP
    >>> model, tokenizer = load_tiny_model()  # doctest: +SKIP

The tokenizer is a byte-level BPE in Qwen2's pipeline (any text encodes, nothing is unknown,
text decodes back in NFC form; every digit is a token of its own) with Qwen2.5's special tokens
and chat template (TRL's ``qwen2_5.jinja``, byte for byte, so TRL recognises it). Builds are
cached under ``$LLM_GYM_CACHE/models`` (default ``~/.cache/llm_gym/models``) in a directory
named by a hash of the recipe.

torch, transformers and tokenizers are imported inside the functions only.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llm_gym.errors import InvalidArgumentError

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerFast

    from llm_gym.core.types import Message, ToolSpec

__all__ = [
    "ADDED_TOKENS",
    "BUILD_VERSION",
    "CHAT_TEMPLATE_NAME",
    "EOS_TOKEN",
    "PAD_TOKEN",
    "SPECIAL_TOKENS",
    "build_tiny_model",
    "build_tokenizer",
    "default_corpus",
    "default_model_dir",
    "load_tiny_model",
]

BUILD_VERSION = "2"
"""Bumped whenever the recipe (corpus, tokenizer, model) changes: it is part of the cache key."""

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

# The Qwen2.5 template's tool section, so the corpus holds the prompts the model will really see.
_TOOLS_PREAMBLE = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_TOOLS_POSTAMBLE = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)

_GENERIC_TEXT = """\
The quick brown fox jumps over the lazy dog. THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG.
You are a helpful assistant. Answer the question, and think step by step when it helps.
What is the answer? The answer is 42. Which one is larger, the first or the second?
I will look that up, then use the calculator to add, subtract, multiply and divide.
The result of the calculation is a number; reply with only the number, or with a name.
Please call a tool when you need a fact. Tool calls return results, or an error message.
It is not possible to know the facts without looking them up: use the tools first.
This is a test of the system. There are many towns, and each town has a population.
0 1 2 3 4 5 6 7 8 9 10 100 1000 2024 3.14 -7 +8 12,345 0.5 1e6 50% $20 #3 (a + b) * c / d = e
a b c d e f g h i j k l m n o p q r s t u v w x y z
A B C D E F G H I J K L M N O P Q R S T U V W X Y Z
! " # $ % & ' ( ) * + , - . / : ; < = > ? @ [ \\ ] ^ _ ` { | } ~
{"name": "lookup", "arguments": {"key": "value"}} ["list", "of", "strings"] true false null
def main(): return x if x > 0 else -x  # code, paths/like/this.py and snake_case_names
"""


def _log(message: str) -> None:
    print(f"[llm_gym.models] {message}", file=sys.stderr, flush=True)


# --- the corpus --------------------------------------------------------------------------------


def _render_transcript(messages: Sequence[Message], tool_specs: Sequence[ToolSpec]) -> str:
    """One episode in the Qwen2.5 (ChatML) layout; assistant contents are their raw text."""
    parts: list[str] = []
    rest = list(messages)
    system = ""
    if rest and rest[0].get("role") == "system":
        system = str(rest.pop(0).get("content") or "")
    if tool_specs:
        tools = "".join("\n" + json.dumps(spec, ensure_ascii=False) for spec in tool_specs)
        parts.append(f"{IM_START}system\n{system}{_TOOLS_PREAMBLE}{tools}{_TOOLS_POSTAMBLE}")
        parts.append(f"{EOS_TOKEN}\n")
    elif system:
        parts.append(f"{IM_START}system\n{system}{EOS_TOKEN}\n")
    previous = None
    for i, message in enumerate(rest):
        role = message.get("role")
        content = str(message.get("content") or "")
        if role == "tool":
            if previous != "tool":
                parts.append(f"{IM_START}user")
            parts.append(f"\n<tool_response>\n{content}\n</tool_response>")
            if i + 1 == len(rest) or rest[i + 1].get("role") != "tool":
                parts.append(f"{EOS_TOKEN}\n")
        else:
            parts.append(f"{IM_START}{role}\n{content}{EOS_TOKEN}\n")
        previous = role
    return "".join(parts)


def _env_transcripts(entry: Any, max_tasks: int) -> list[str]:
    from llm_gym.policies import Generation, OraclePolicy, Policy
    from llm_gym.rollout import collect_groups

    class _Silent(Policy):  # for environments without an oracle: only the opening prompt
        async def act(self, requests: Sequence[Any]) -> list[Generation]:
            return [Generation(text="") for _ in requests]

    tasks = entry.tasks("train")[:max_tasks]
    if not tasks:
        return []
    oracle = entry.oracle()
    groups = collect_groups(
        entry.env_factory(),
        tasks,
        OraclePolicy() if oracle is not None else _Silent(),
        max_turns=entry.max_turns,
        action_format=entry.action_format,
        oracle=oracle,
    )
    texts = []
    for group in groups:
        for episode in group:
            if oracle is None:
                opening = episode.messages[: episode.num_opening_messages]
                texts.append(_render_transcript(opening, episode.tool_specs))
                continue
            # The assistant's raw text, as the environment's action format rendered the oracle's
            # message (HermesFormat().render_message for hermes environments).
            messages = list(episode.messages[: episode.num_opening_messages])
            for turn in episode.turns:
                messages.append({"role": "assistant", "content": turn.text})
                messages.extend(turn.env_messages)
            texts.append(_render_transcript(messages, episode.tool_specs))
    return texts


def _selected_envs(envs: Sequence[str] | None) -> list[Any]:
    """The registry entries of ``envs`` (None: every registered environment), in registry order."""
    from llm_gym.core.registry import registered_envs

    entries = list(registered_envs())
    if envs is None:
        return entries
    if isinstance(envs, str):
        envs = [envs]
    known = {entry.id: entry for entry in entries}
    unknown = [e for e in envs if e not in known]
    if unknown:
        import difflib

        close = difflib.get_close_matches(unknown[0], list(known), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise InvalidArgumentError(
            f"envs must be registered environment ids, actual value: {unknown!r}.{hint} "
            f"Registered: {sorted(known)}."
        )
    if not envs:
        raise InvalidArgumentError("envs must name at least one environment (or be None: all).")
    wanted = set(envs)
    return [entry for entry in entries if entry.id in wanted]


def _corpus_envs(envs: Sequence[str] | None = None) -> list[tuple[str, str]]:
    return [(entry.id, str(entry.version)) for entry in _selected_envs(envs)]


def default_corpus(max_tasks_per_env: int = 400, envs: Sequence[str] | None = None) -> list[str]:
    """The text the tokenizer is trained on: oracle transcripts of the registered environments.

    For each environment of :func:`llm_gym.gym.registered_envs` (or of ``envs``), the oracle plays
    up to ``max_tasks_per_env`` training tasks (through :func:`llm_gym.rollout.collect_groups` with
    an :class:`~llm_gym.rollout.OraclePolicy`); each episode is rendered in the Qwen2.5 chat layout
    (system prompt, the ``# Tools`` section with the tool specs as JSON, the user prompt, the
    assistant's raw text in the environment's action format, the tool results). An environment
    without an oracle contributes its opening prompts. A small fixed English/ASCII/digits text comes
    first. Special and added tokens in the text are never split into merges (see
    :func:`build_tokenizer`).

    Args:
        max_tasks_per_env: Training tasks played per environment (the first ones of the split).
        envs: The environment ids (None: every registered one). A model trained on one
            environment gets a tokenizer fitted to its text: with all eight environments a
            1,024-token vocabulary no longer holds ToolUseGame's town names as single tokens.

    Returns:
        The corpus, one transcript per string.
    """
    import warnings

    corpus = [_GENERIC_TEXT] * 4
    for entry in _selected_envs(envs):
        try:
            corpus.extend(_env_transcripts(entry, max_tasks_per_env))
        except Exception as exc:  # one broken environment must not block the default model
            warnings.warn(
                f"default_corpus: skipping {entry.id}: {exc!r}", RuntimeWarning, stacklevel=2
            )
    return corpus


# --- the tokenizer -----------------------------------------------------------------------------


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


# --- the model ---------------------------------------------------------------------------------


def _cache_root() -> Path:
    root = os.environ.get("LLM_GYM_CACHE") or "~/.cache/llm_gym"
    return Path(root).expanduser()


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
    return _cache_root() / "models" / f"tiny-qwen2-{_build_hash(args)}"


def _complete(path: Path, args: dict[str, Any]) -> bool:
    try:
        info = json.loads((path / BUILD_INFO).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(info, dict) and info.get("args") == args


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
        envs: The environments whose transcripts make the tokenizer corpus (None: every
            registered one); ``train.py`` builds its model for the environment it trains on.
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
    if hidden_size % num_heads or num_heads % num_kv_heads:
        raise InvalidArgumentError(
            f"hidden_size ({hidden_size}) must be divisible by num_heads ({num_heads}), and "
            f"num_heads by num_kv_heads ({num_kv_heads})."
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
