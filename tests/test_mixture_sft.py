"""The SFT warm start of a mixture (trainers.mixture.sft): each environment's share of the
demonstrations by hand, the rows' interleaving, the data of two real environments, the
refusals; configs/suite_tiny.yaml's checks and its tokenizer on every environment's text."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from llm_gym.core.registry import env_entry
from llm_gym.errors import InvalidArgumentError
from trainers.mixture.sft import check_mixture_sft, interleaved_rows, sft_episode_counts
from trainers.sft.settings import SFTSettings

ROOT = Path(__file__).resolve().parents[1]

# --- the shares --------------------------------------------------------------------------------


def test_each_env_gets_its_share_of_the_demonstrations_by_hand() -> None:
    # shares 1/2, 1/4, 1/4 of 8: exactly 4, 2, 2
    assert sft_episode_counts([2, 1, 1], 8) == [4, 2, 2]
    # shares .4 .2 .2 .1 .1 of 7 (the stratified slots 0 1 0 2 3 0 1): 2.8 1.4 1.4 .7 .7 ->
    # 3 2 1 1 0, each within one of its share; the last env's first slot is the 10th
    assert sft_episode_counts([4, 2, 2, 1, 1], 7) == [3, 2, 1, 1, 0]
    assert sft_episode_counts([4, 2, 2, 1, 1], 10) == [4, 2, 2, 1, 1]
    # the suite's weights (configs/suite_tiny.yaml): 4000 split exactly as 3:2:1:1:1
    assert sft_episode_counts([3, 2, 1, 1, 1], 4000) == [1500, 1000, 500, 500, 500]


def test_the_shares_sum_to_the_episodes_each_within_one() -> None:
    rng = random.Random(0)
    for _ in range(100):
        weights = [rng.choice([rng.random() + 0.01, rng.randint(1, 9)]) for _ in range(4)]
        episodes = rng.randint(0, 60)
        counts = sft_episode_counts(weights, episodes)
        assert sum(counts) == episodes
        total = sum(weights)
        assert all(abs(episodes * w / total - c) < 1 for w, c in zip(weights, counts, strict=True))


def test_rows_are_laid_out_in_slot_order() -> None:
    # slots 0 1 0 2 0 1 0 2; env 0's rows are 0-3, env 1's 4-5, env 2's 6-7
    assert interleaved_rows([2, 1, 1], [4, 2, 2]) == [0, 4, 1, 6, 2, 5, 3, 7]
    # env 0 made 1 row of its 2 (a failed demonstration dropped): its later slots are skipped
    assert interleaved_rows([1, 1], [1, 3]) == [0, 1, 2, 3]
    # an env with no row at all
    assert interleaved_rows([1, 1, 1], [2, 0, 1]) == [0, 2, 1]


# --- the data of real environments --------------------------------------------------------------


def test_the_warm_start_data_mixes_two_envs_by_weight() -> None:
    pytest.importorskip("datasets")
    from trainers.mixture.config import mixture_entries, mixture_envs
    from trainers.mixture.sft import mixture_sft_dataset

    entries = mixture_entries([{"id": "Math-v0", "weight": 2}, {"id": "GuessNumber-v0"}])
    envs = mixture_envs(entries, val_tasks=0)
    sft = SFTSettings(episodes=6)
    dataset, made = mixture_sft_dataset(envs, entries, sft, seed=0, default_format=None,
                                        tokenizer=None)  # fmt: skip
    assert made == {"Math-v0": 4, "GuessNumber-v0": 2}  # 6 by 2:1, every oracle succeeds
    # shares 2/3, 1/3: slot 0 deadlines 3/2, 3 -> 0; slot 1 deadlines 3, 3 (tie, first) -> 0;
    # slot 2: env 0 has its 2 of 2 -> 1; and again. Math's tool specs name its calculator
    kinds = ["Math" if "calculator" in row["tools"] else "Guess" for row in dataset]
    assert kinds == ["Math", "Math", "Guess", "Math", "Math", "Guess"]
    guesses = [row for row in dataset if "calculator" not in row["tools"]]
    assert all("I am thinking of an integer" in str(row["messages"]) for row in guesses)


def test_sft_tasks_fill_from_the_train_split_when_the_splits_hold_every_prompt() -> None:
    from trainers.pipeline.sft import sft_tasks

    # GuessNumber's prompts name the range, not the secret: every prompt is in its splits
    entry = env_entry("GuessNumber-v0")
    train = entry.tasks("train")
    assert sft_tasks(entry, 3, seed=0) == train[:3]
    # an env whose generator reaches outside the splits keeps to fresh tasks
    math = env_entry("Math-v0")
    held = {t.prompt for s in ("train", "val", "test") for t in math.tasks(s)}
    assert not any(t.prompt in held for t in sft_tasks(math, 20, seed=0))


# --- refusals ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"source": "episodes", "from_episodes": "x.jsonl"}, "sft.source 'episodes' with envs"),
        ({"oracle": "llm_gym.envs.tool_use_game:HastyOracle"}, "sft.oracle names one"),
        ({"task_options": {"worlds_per_question": 8}}, "sft.task_options names one"),
    ],
)
def test_a_mixture_refuses_one_envs_sft_settings(settings, named) -> None:
    with pytest.raises(InvalidArgumentError, match=named):
        check_mixture_sft(SFTSettings(**settings))
    check_mixture_sft(SFTSettings(episodes=10, short_context_steps=2))  # the oracles: accepted


# --- configs/suite_tiny.yaml ---------------------------------------------------------------------


def test_the_suite_config_passes_the_checks_with_its_warm_start() -> None:
    pytest.importorskip("trl")
    from trainers.pipeline.run import check_pipeline, load_config

    config = load_config(ROOT / "configs" / "suite_tiny.yaml")
    _, envs, _ = check_pipeline(config)
    assert len(envs) >= 5 and config.sft is not None and config.model == "tiny"
    assert config.evaluation is not None and config.evaluation.split == "test"


def test_the_suite_models_tokenizer_reads_every_envs_text(monkeypatch, tmp_path) -> None:
    pytest.importorskip("trl")
    import llm_gym.models
    from trainers.pipeline.mixture import run_mixture_pipeline
    from trainers.pipeline.run import load_config

    asked = {}

    class Built(Exception):
        pass

    def build(**kwargs):
        asked.update(kwargs)
        raise Built

    monkeypatch.setattr(llm_gym.models, "build_tiny_model", build)
    config = load_config(ROOT / "configs" / "suite_tiny.yaml", {"output_dir": str(tmp_path)})
    with pytest.raises(Built):
        run_mixture_pipeline(config)
    assert asked["envs"] == sorted(entry.id for entry in config.mixture)


def test_a_corpus_of_several_envs_holds_each_envs_transcripts() -> None:
    from llm_gym.models.corpus import default_corpus

    corpus = default_corpus(max_tasks_per_env=2, envs=["Math-v0", "GuessNumber-v0"])
    # the generic text 4 times, then 2 oracle transcripts of each env (registry order)
    assert len(corpus) == 4 + 2 + 2
    transcripts = corpus[4:]
    guess = [t for t in transcripts if "I am thinking of an integer" in t]
    calculator = [t for t in transcripts if json.dumps("calculator") in t]
    assert len(guess) == 2 and len(calculator) == 2
    assert all("<|im_start|>assistant\n" in t for t in transcripts)
