"""A model without a chat template (llm_gym.policies.chat_templates): refused before any episode
on every path (eval, serve, GRPO, SFT), with the remedy named; the ``chat_template`` option (a
named template or a .jinja file) gives it one; tokens a named template lacks are added as special
tokens and the embeddings grow (tiny model, built in a second)."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest

from llm_gym.errors import ChatTemplateError, InvalidArgumentError
from llm_gym.policies.chat_templates import (
    apply_chat_template,
    require_chat_template,
    resolve_chat_template,
)

pytest.importorskip("torch")


@pytest.fixture(scope="module")
def base_model_dir(small_model_dir, tmp_path_factory) -> Path:
    """The tiny model saved without a chat template: a base model."""
    folder = tmp_path_factory.mktemp("base") / "model"
    shutil.copytree(small_model_dir, folder)
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def _tokenizer(folder: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)


def test_a_model_without_a_template_is_refused_on_every_path(base_model_dir, capsys) -> None:
    from llm_gym.cli import main
    from llm_gym.policies import HFPolicy, policy_from_spec
    from llm_gym.serving.engine import Engine
    from trainers.chat_template import with_chat_template
    from trainers.sft.settings import SFTSettings
    from trainers.sft.train import build_sft_run

    path = str(base_model_dir)
    tokenizer = _tokenizer(base_model_dir)
    assert tokenizer.chat_template is None
    with pytest.raises(ChatTemplateError, match="--chat-template chatml"):
        policy_from_spec(f"hf:{path}")
    with pytest.raises(ChatTemplateError, match="no chat template"):
        HFPolicy(object(), tokenizer)  # a model object: refused before anything reads it
    with pytest.raises(ChatTemplateError, match="chat_template"):
        Engine(object(), tokenizer)  # llm-gym serve
    loaded: list[str] = []
    with pytest.raises(ChatTemplateError, match="chat_template: chatml"):  # GRPO, train.py
        with_chat_template(path, None, None, loaded.append, _tokenizer)
    assert loaded == []  # refused before the weights are read
    with pytest.raises(ChatTemplateError):
        build_sft_run(path, "unused", None, SFTSettings())  # SFT: before the data or the model

    out = io.StringIO()
    code = main(["eval", "GuessNumber-v0", "--policy", f"hf:{path}", "--episodes", "2"], out)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and out.getvalue() == ""  # no episode, no report
    assert len(err) == 1 and "no chat template" in err[0] and "--chat-template" in err[0]


def test_named_and_file_templates_are_resolved_and_a_misspelt_one_is_refused(tmp_path) -> None:
    assert resolve_chat_template("gemma").end_of_turn == "<end_of_turn>"
    with pytest.raises(InvalidArgumentError, match="Did you mean 'chatml'"):
        resolve_chat_template("chatlm")
    with pytest.raises(InvalidArgumentError, match="named template"):
        resolve_chat_template(str(tmp_path / "absent.jinja"))
    file = tmp_path / "mine.jinja"
    file.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    assert resolve_chat_template(str(file)) == file.read_text()
    (tmp_path / "empty.jinja").write_text(" \n")
    with pytest.raises(InvalidArgumentError, match="is empty"):
        resolve_chat_template(str(tmp_path / "empty.jinja"))


def test_a_named_template_adds_its_missing_tokens_and_grows_the_embeddings(
    base_model_dir,
) -> None:
    from llm_gym.policies.chat import control_token_strings
    from llm_gym.policies.loading import load_for_generation

    tokenizer = _tokenizer(base_model_dir)
    with pytest.raises(InvalidArgumentError, match="needs the model"):
        apply_chat_template(tokenizer, "gemma")  # its tokens are missing and no model given
    model, tokenizer = load_for_generation(str(base_model_dir), chat_template="gemma")
    before = _tokenizer(base_model_dir)
    assert len(tokenizer) == len(before) + 2
    assert model.get_input_embeddings().weight.shape[0] >= len(tokenizer)
    end = tokenizer.convert_tokens_to_ids("<end_of_turn>")
    assert tokenizer.eos_token == "<end_of_turn>" and end == len(before) + 1
    assert end in model.generation_config.eos_token_id
    assert before.eos_token_id in model.generation_config.eos_token_id  # still stops there too
    assert {"<start_of_turn>", "<end_of_turn>"} <= set(control_token_strings(tokenizer))
    chat = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    text = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert text.endswith("<start_of_turn>user\nu<end_of_turn>\n<start_of_turn>model\n")
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert ids.count(end) == 2  # one token each, not text


def test_chatml_on_a_tokenizer_that_has_its_tokens_adds_none(base_model_dir) -> None:
    from transformers import AutoModelForCausalLM

    tokenizer = _tokenizer(base_model_dir)
    model = AutoModelForCausalLM.from_pretrained(base_model_dir)
    rows = model.get_input_embeddings().weight.shape[0]
    assert apply_chat_template(tokenizer, "chatml", model) == []
    assert model.get_input_embeddings().weight.shape[0] == rows
    require_chat_template(tokenizer)  # it has one now
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_eval_with_a_chat_template_runs_and_records_it(base_model_dir, tmp_path) -> None:
    from llm_gym.cli import main

    report = tmp_path / "report.json"
    argv = ["eval", "GuessNumber-v0", "--policy", f"hf:{base_model_dir}", "--episodes", "2",
            "--chat-template", "chatml", "--max-new-tokens", "3", "--max-turns", "2",
            "--no-progress", "--output", str(report)]  # fmt: skip
    assert main(argv, io.StringIO()) == 0
    record = json.loads(report.read_text())
    assert record["policy"]["chat_template"] == "chatml"
    assert record["metrics"]["template_ratio"] == 0.0 and record["metrics"]["episodes"] == 2


def test_grpo_takes_the_option_and_loads_the_model_only_to_grow_it(base_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    from trainers import GRPOConfig
    from trainers.chat_template import with_chat_template

    with pytest.raises(InvalidArgumentError, match="Did you mean 'chatml'"):
        GRPOConfig(output_dir=str(tmp_path), max_turns=2, use_cpu=True, chat_template="chatlm")
    assert GRPOConfig(output_dir=str(tmp_path), max_turns=2, chat_template="gemma").chat_template
    path = str(base_model_dir)
    loaded: list[str] = []

    def load(where: str):
        loaded.append(where)
        return AutoModelForCausalLM.from_pretrained(where)

    model, tokenizer = with_chat_template(path, None, "chatml", load, _tokenizer)
    assert model == path and loaded == []  # its tokens are there: TRL loads the model
    assert "<|im_start|>" in tokenizer.chat_template
    model, tokenizer = with_chat_template(path, None, "gemma", load, _tokenizer)
    assert loaded == [path] and model.get_input_embeddings().weight.shape[0] == len(tokenizer)


def test_serve_gives_a_base_model_the_template_it_is_told(base_model_dir) -> None:
    pytest.importorskip("uvicorn")
    from llm_gym.cli import build_parser
    from llm_gym.serving import serve

    args = build_parser().parse_args(["serve", str(base_model_dir), "--chat-template", "gemma"])
    assert args.chat_template == "gemma"
    with pytest.raises(ChatTemplateError, match="--chat-template chatml"):
        serve(str(base_model_dir), port=0)
    with serve(str(base_model_dir), port=0, chat_template="chatml", model_name="m") as server:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        assert server.chat_completion(body)["choices"]
        assert "<|im_start|>" in server.tokenizer.chat_template
