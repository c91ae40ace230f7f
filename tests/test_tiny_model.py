"""The embedded tiny model: offline build, tokenizer, chat template, cache, CLI."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
pytest.importorskip("trl")

from llm_gym.errors import InvalidArgumentError
from llm_gym.models import tiny
from tests.conftest import SMALL_MODEL

SMALL = SMALL_MODEL
SPECIAL_AND_ADDED = [*tiny.SPECIAL_TOKENS, *tiny.ADDED_TOKENS]


def _load(path: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="module")
def small_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny.build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", **SMALL)


@pytest.fixture(scope="module")
def loaded(small_build: Path):
    return _load(small_build)


def test_import_pulls_no_heavy_dependency() -> None:
    code = (
        "import sys, llm_gym, llm_gym.models\n"
        "from llm_gym.models import default_model_dir, build_tiny_model, load_tiny_model\n"
        "default_model_dir()\n"
        "heavy = [m for m in ('torch', 'transformers', 'tokenizers', 'trl') if m in sys.modules]\n"
        "print(heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_public_names() -> None:
    import llm_gym.models

    assert all(hasattr(llm_gym.models, name) for name in llm_gym.models.__all__)
    assert llm_gym.models.build_tiny_model is tiny.build_tiny_model
    with pytest.raises(AttributeError):
        _ = llm_gym.models.no_such_name


def test_builds_and_loads_with_from_pretrained(small_build: Path, loaded) -> None:
    model, tokenizer = loaded
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert model.config.tie_word_embeddings
    assert model.config.hidden_size == 32 and model.config.num_hidden_layers == 2
    assert model.config.vocab_size == len(tokenizer) == 512
    assert next(model.parameters()).dtype.is_floating_point
    assert str(next(model.parameters()).dtype) == "torch.float32"
    assert model.generation_config.eos_token_id == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert model.generation_config.pad_token_id == tokenizer.convert_tokens_to_ids("<|endoftext|>")
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    info = json.loads((small_build / "build_info.json").read_text())
    assert info["args"]["hidden_size"] == 32 and info["num_parameters"] == model.num_parameters()
    assert (small_build / "model.safetensors").is_file()


def test_loaded_tokenizer_matches_the_trained_one(loaded) -> None:
    _, tokenizer = loaded
    trained = tiny.build_tokenizer(tiny.default_corpus(SMALL["max_tasks_per_env"]), 512)
    text = 'What is 1234 + 56? <tool_call>\n{"key": "Velmora.population"}</tool_call> ü 中'
    assert trained.encode(text) == tokenizer.encode(text)
    assert trained.backend_tokenizer.to_str() == tokenizer.backend_tokenizer.to_str()


@pytest.mark.parametrize(
    "text",
    [
        "plain ascii: The quick brown fox, 3.14159!",
        "unicode: héllo wörld — naïve café, 中文字符, Ελληνικά, emoji 🚀🎉, \u00e9",
        "whitespace\t\ttabs\n\nnewlines   spaces \r\n",
        'json {"name": "lookup", "arguments": {"key": "Tarsk.area"}}',
        "digits 0123456789 and -42, 1e10, 2,500,000",
        "",
    ],
)
def test_tokenizer_round_trips_any_text(loaded, text: str) -> None:
    _, tokenizer = loaded
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text
    assert tokenizer.unk_token_id is None or tokenizer.unk_token_id not in ids


def test_text_is_nfc_normalised_like_qwen(loaded) -> None:
    _, tokenizer = loaded
    text = "e\u0301"  # decomposed é
    decoded = tokenizer.decode(tokenizer.encode(text))
    assert decoded == unicodedata.normalize("NFC", text) == "\u00e9"


def test_every_digit_is_its_own_token(loaded) -> None:
    _, tokenizer = loaded
    for text in ["1234567890", "population 250000", "x=2024;", "  99 "]:
        ids = tokenizer.encode(text, add_special_tokens=False)
        pieces = [tokenizer.decode([i]) for i in ids]
        for piece in pieces:
            if any(c.isdigit() for c in piece):
                assert len(piece) == 1, (text, pieces)


def test_special_and_added_tokens_are_single_ids(loaded) -> None:
    _, tokenizer = loaded
    ids = [tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_AND_ADDED]
    assert ids == list(range(9))
    for token, token_id in zip(SPECIAL_AND_ADDED, ids, strict=True):
        assert tokenizer.encode(token, add_special_tokens=False) == [token_id]
        assert tokenizer.encode(f"a{token}b", add_special_tokens=False).count(token_id) == 1
    text = "<|im_start|>assistant\n<tool_call>\n{}\n</tool_call><|im_end|>"
    kept = tokenizer.decode(tokenizer.encode(text), skip_special_tokens=True)
    assert kept == "assistant\n<tool_call>\n{}\n</tool_call>"  # tool tags are not special
    assert tokenizer.encode("hello", add_special_tokens=True) == tokenizer.encode(
        "hello", add_special_tokens=False
    )  # no BOS/EOS added


CONVERSATION = [
    {"role": "system", "content": "You answer questions about towns."},
    {"role": "user", "content": "What is the population of Velmora?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "type": "function",
                "function": {"name": "lookup", "arguments": {"key": "Velmora.population"}},
            }
        ],
    },
    {"role": "tool", "name": "lookup", "content": "123456"},
    {"role": "assistant", "content": "123456"},
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look up one fact by its key.",
            "parameters": {
                "type": "object",
                "properties": {"key": {"type": "string"}},
                "required": ["key"],
            },
        },
    }
]


def test_chat_template_renders_tools_calls_and_results(loaded) -> None:
    _, tokenizer = loaded
    text = tokenizer.apply_chat_template(CONVERSATION, tools=TOOLS, tokenize=False)
    assert text.startswith("<|im_start|>system\nYou answer questions about towns.\n\n# Tools")
    assert '"name": "lookup"' in text and "<tools>" in text
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "lookup", "arguments": '
        '{"key": "Velmora.population"}}\n</tool_call><|im_end|>' in text
    )
    assert "<|im_start|>user\n<tool_response>\n123456\n</tool_response><|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n123456<|im_end|>\n")
    prompt = tokenizer.apply_chat_template(
        CONVERSATION[:4], tools=TOOLS, tokenize=False, add_generation_prompt=True
    )
    assert prompt.endswith("<|im_start|>assistant\n")
    ids = tokenizer.apply_chat_template(CONVERSATION, tools=TOOLS, tokenize=True, return_dict=False)
    assert tokenizer.decode(ids) == text


def test_chat_template_is_trls_qwen2_5(loaded) -> None:
    from trl.chat_template_utils import (
        get_training_chat_template,
        is_chat_template_prefix_preserving,
        qwen2_5_chat_template,
        qwen2_5_training_chat_template,
    )

    _, tokenizer = loaded
    assert tokenizer.chat_template == qwen2_5_chat_template  # TRL identifies models by it
    assert is_chat_template_prefix_preserving(tokenizer)
    # SFT's assistant_only_loss swaps in this {% generation %} variant on its own.
    assert get_training_chat_template(tokenizer) == qwen2_5_training_chat_template


def test_generate_runs(loaded) -> None:
    import torch

    model, tokenizer = loaded
    ids = tokenizer.apply_chat_template(
        CONVERSATION[:2], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=4, do_sample=False)
    assert out.shape[0] == 1 and ids.shape[1] < out.shape[1] <= ids.shape[1] + 4


def _files(path: Path) -> dict[str, bytes]:
    return {name: (path / name).read_bytes() for name in ("model.safetensors", "tokenizer.json")}


def test_same_seed_same_files(small_build: Path, tmp_path: Path) -> None:
    again = tiny.build_tiny_model(tmp_path / "again", **SMALL)
    assert _files(again) == _files(small_build)
    other = tiny.build_tiny_model(tmp_path / "other", seed=1, **SMALL)
    assert _files(other)["model.safetensors"] != _files(small_build)["model.safetensors"]
    assert _files(other)["tokenizer.json"] == _files(small_build)["tokenizer.json"]


@pytest.mark.slow  # a build each (~10 s): with the slow checks, which CI runs
def test_cache_reuses_a_build_and_force_rebuilds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("LLM_GYM_CACHE", str(tmp_path / "cache"))
    first = tiny.build_tiny_model(**SMALL)
    assert first == tiny.default_model_dir(**SMALL)
    assert first.parent == tmp_path / "cache" / "models" and first.name.startswith("tiny-qwen2-")
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    capsys.readouterr()

    assert tiny.build_tiny_model(**SMALL) == first
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp
    assert "using the existing build" in capsys.readouterr().err

    assert tiny.build_tiny_model(force=True, **SMALL) == first
    assert (first / "model.safetensors").stat().st_mtime_ns != stamp
    assert (first / "build_info.json").is_file()
    assert [p.name for p in first.parent.iterdir()] == [first.name]  # no temp dirs left

    # another recipe, another directory
    assert tiny.default_model_dir(**{**SMALL, "hidden_size": 64}) != first
    monkeypatch.setattr(tiny, "BUILD_VERSION", "test")
    assert tiny.default_model_dir(**SMALL) != first


@pytest.mark.slow  # a build each (~10 s): with the slow checks, which CI runs
def test_half_built_dir_is_rebuilt(small_build: Path, tmp_path: Path) -> None:
    target = tmp_path / "half"
    target.mkdir()
    (target / "config.json").write_text("{")  # a build that died before build_info.json
    (target / "model.safetensors").write_bytes(b"truncated")
    assert tiny.build_tiny_model(target, **SMALL) == target.absolute()
    assert _files(target) == _files(small_build)
    assert (target / "build_info.json").is_file()

    (target / "build_info.json").unlink()
    stamp = (target / "model.safetensors").stat().st_mtime_ns
    tiny.build_tiny_model(target, **SMALL)
    assert (target / "model.safetensors").stat().st_mtime_ns != stamp


@pytest.mark.slow  # a build each (~10 s): with the slow checks, which CI runs
def test_a_build_with_other_arguments_is_replaced(small_build: Path, tmp_path: Path) -> None:
    target = tmp_path / "model"
    tiny.build_tiny_model(target, **{**SMALL, "seed": 5})
    tiny.build_tiny_model(target, **SMALL)
    assert _files(target) == _files(small_build)


def test_never_deletes_a_foreign_directory(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="not a tiny-model build"):
        tiny.build_tiny_model(tmp_path, **SMALL)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_load_tiny_model(small_build: Path) -> None:
    model, tokenizer = tiny.load_tiny_model(small_build)
    assert model.config.vocab_size == len(tokenizer)


def test_default_corpus_holds_oracle_transcripts() -> None:
    corpus = tiny.default_corpus(max_tasks_per_env=3, envs=["ToolUseGame-v0"])
    transcripts = [t for t in corpus if t.startswith("<|im_start|>system")]
    assert len(transcripts) == 3
    for text in transcripts:
        assert "# Tools" in text and '"name": "lookup"' in text
        assert "<|im_start|>assistant\n<tool_call>\n" in text
        assert "<tool_response>" in text and text.endswith("<|im_end|>\n")


def test_corpus_of_selected_envs() -> None:
    every = tiny.default_corpus(max_tasks_per_env=2)
    one = tiny.default_corpus(max_tasks_per_env=2, envs=["ToolUseGame-v0"])
    assert set(one) < set(every)
    with pytest.raises(InvalidArgumentError, match="Did you mean 'ToolUseGame-v0'"):
        tiny.default_corpus(max_tasks_per_env=2, envs=["ToolUseGame-v1"])


def test_build_args_name_the_corpus_envs() -> None:
    args = tiny._build_args(["ToolUseGame-v0"], seed=0)
    assert args["envs"] == [["ToolUseGame-v0", "0"]]
    assert tiny.default_model_dir(envs=["ToolUseGame-v0"]) != tiny.default_model_dir()


def test_cli_prints_the_path_last(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from llm_gym.cli import main
    from llm_gym.models import corpus

    monkeypatch.setattr(corpus, "DEFAULT_CORPUS_ENVS", ("GuessNumber-v0",))  # a small corpus

    out = io.StringIO()
    target = tmp_path / "cli-model"
    argv = ["build-tiny-model", "--output", str(target), "--hidden-size", "32"]
    assert main([*argv, "--num-layers", "2"], out=out) == 0
    assert out.getvalue().splitlines()[-1] == str(target.absolute())
    assert (target / "build_info.json").is_file()
    info = json.loads((target / "build_info.json").read_text())
    assert info["args"]["hidden_size"] == 32 and info["args"]["num_layers"] == 2

    out = io.StringIO()
    assert main([*argv, "--num-layers", "2", "--force"], out=out) == 0
    assert out.getvalue().splitlines()[-1] == str(target.absolute())
