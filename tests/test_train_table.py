"""Document 002's ``[train]`` table and TOML configs (trainers.pipeline.train_table, through
``load_config`` and ``train.py``): the names mapped onto ``grpo``'s, unknown keys and a setting
given under both names refused, and hostile TOML (nested thousands deep) one clear error."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from llm_gym.errors import InvalidArgumentError
from trainers.pipeline.config import load_config
from trainers.pipeline.train_table import MAX_TOML_DEPTH, TRAIN_KEYS, merge_train_table, toml_load

ROOT = Path(__file__).resolve().parents[1]
FLASH = ROOT / "configs" / "flash_example.toml"


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_the_flash_example_sets_grpo_fields_by_document_002s_names() -> None:
    config = load_config(FLASH)
    assert config.env == "Refund-v0" and config.model == "tiny"
    assert config.grpo["max_tokens_per_turn"] == 96  # max_completion_tokens
    assert config.grpo["max_model_length"] == 2048  # max_context_tokens
    assert config.grpo["episodes_per_task"] == 8  # group_size
    assert config.grpo["credit_assignment"] == "per_episode"
    assert config.grpo["learning_rate"] == 2.0e-4 and config.grpo["num_steps"] == 20
    assert config.sft is not None and config.sft.source == "sft_completion"
    assert not any(key.name in config.grpo for key in TRAIN_KEYS if key.name != key.field)


def test_a_yaml_config_takes_the_same_train_table(tmp_path: Path) -> None:
    toml = _write(tmp_path, "c.toml", '[train]\ngroup_size = 4\ncredit_assignment = "per_turn"\n'
                  "[grpo]\nnum_steps = 3\n")  # fmt: skip
    yaml = _write(tmp_path, "c.yaml", "train: {group_size: 4, credit_assignment: per_turn}\n"
                  "grpo: {num_steps: 3}\n")  # fmt: skip
    expected = {"num_steps": 3, "episodes_per_task": 4, "credit_assignment": "per_turn"}
    assert load_config(toml).grpo == load_config(yaml).grpo == expected


def test_set_overrides_a_train_key(tmp_path: Path) -> None:
    assert load_config(FLASH, {"train.group_size": 4}).grpo["episodes_per_task"] == 4
    bare = _write(tmp_path, "bare.toml", 'env = "Refund-v0"\n')
    config = load_config(bare, {"train.max_completion_tokens": 32})
    assert config.grpo == {"max_tokens_per_turn": 32}


def test_train_py_set_reaches_the_grpo_config() -> None:
    pytest.importorskip("trl")
    spec = importlib.util.spec_from_file_location("train_script", ROOT / "train.py")
    train_script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train_script)
    args = train_script.parse_args(["--config", str(FLASH), "--set", "train.group_size=4"])
    config = train_script._checked_config(args)  # loads and checks it as train.py does
    assert config.grpo["episodes_per_task"] == 4


@pytest.mark.parametrize(
    ("key", "hint"),
    [("group_sise", " Did you mean 'group_size'?"), ("learning_rate", "goes in [grpo]")],
)
def test_an_unknown_train_key_is_refused_by_name(tmp_path: Path, key: str, hint: str) -> None:
    path = _write(tmp_path, "c.toml", f"[train]\n{key} = 4\n")
    with pytest.raises(InvalidArgumentError) as info:
        load_config(path)
    text = str(info.value)
    assert text.startswith(f"{path}: unknown key {key!r} in [train]") and hint in text
    assert all(repr(k.name) in text for k in TRAIN_KEYS)  # the known keys, listed


@pytest.mark.parametrize(
    ("text", "overrides"),
    [
        ("[train]\ngroup_size = 8\n[grpo]\nepisodes_per_task = 4\n", {}),
        ("[train]\ngroup_size = 8\n", {"grpo.episodes_per_task": 4}),
        ("[grpo]\nepisodes_per_task = 4\n", {"train.group_size": 8}),
    ],
)
def test_one_setting_under_both_names_with_different_values_is_refused(
    tmp_path: Path, text: str, overrides: dict
) -> None:
    path = _write(tmp_path, "c.toml", text)
    with pytest.raises(InvalidArgumentError) as info:
        load_config(path, overrides)
    assert "train.group_size = 8 and grpo.episodes_per_task = 4" in str(info.value)


def test_one_setting_under_both_names_with_one_value_is_accepted(tmp_path: Path) -> None:
    path = _write(tmp_path, "c.toml", "[train]\ngroup_size = 8\n[grpo]\nepisodes_per_task = 8\n")
    assert load_config(path).grpo == {"episodes_per_task": 8}
    with pytest.raises(InvalidArgumentError, match="different values"):
        merge_train_table({"train": {"group_size": 8}, "grpo": {"episodes_per_task": 8.0}}, "c")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("train = 3\n", "train must be a table of keys to values, actual value: 3"),
        ("grpo = [1]\n[train]\ngroup_size = 2\n", "grpo must be a table of keys to values"),
    ],
)
def test_train_and_grpo_must_be_tables(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message.replace("[", r"\[")):
        load_config(_write(tmp_path, "c.toml", text))


def test_toml_errors_are_one_line_with_the_place(tmp_path: Path) -> None:
    path = _write(tmp_path, "c.toml", 'env = "Refund-v0"\nseed =\n')
    with pytest.raises(InvalidArgumentError) as info:
        load_config(path)
    assert str(info.value) == f"{path}: not valid TOML: Invalid value (at line 2, column 7)."


# --- hostile TOML: nested far deeper than any config ------------------------------------------

DEEP = {
    "arrays": "x = " + "[" * 100_000 + "]" * 100_000,  # tomllib: RecursionError
    "inline tables": "x = " + "{a = " * 50_000 + "1" + "}" * 50_000,  # tomllib: RecursionError
    "table header": "[" + ".".join(["a"] * 5_000) + "]\nb = 1\n",  # parsed; 5,000 deep
    "dotted keys": ".".join(["a"] * 5_000) + " = 1\n",  # parsed; 5,000 deep
}


@pytest.mark.parametrize("name", list(DEEP))
def test_a_deep_toml_config_is_refused_naming_the_limit(name: str, tmp_path: Path) -> None:
    path = _write(tmp_path, "config.toml", DEEP[name])
    with pytest.raises(InvalidArgumentError) as info:
        load_config(path)
    text = str(info.value)
    assert text.startswith(f"{path}: the TOML document nests more than {MAX_TOML_DEPTH} levels")
    assert "trainers.pipeline.train_table.MAX_TOML_DEPTH" in text and len(text) < 400


def test_the_toml_depth_limit_leaves_room_for_any_config() -> None:
    inner = MAX_TOML_DEPTH - 1  # the document's own table is the first level
    value = toml_load("x = " + "[" * inner + "1" + "]" * inner)["x"]
    for _ in range(inner):
        (value,) = value
    assert value == 1
    with pytest.raises(InvalidArgumentError, match="nests more than"):
        toml_load("x = " + "[" * (inner + 1) + "1" + "]" * (inner + 1))
    with pytest.raises(InvalidArgumentError, match="nests more than"):
        toml_load("[" + ".".join(["a"] * MAX_TOML_DEPTH) + "]\n")
