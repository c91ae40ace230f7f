"""A chat template that raises, or a tokenizer that fails, inside an episode
(llm_gym.rollout.tokens, .loop): the episode ends as ``TEMPLATE`` / ``TOKENIZER`` with the error
kept, never as an environment's error; eval and training metrics count them apart; a collection
whose every episode fails so raises, and ``llm-gym eval`` exits non-zero with one line."""

from __future__ import annotations

import io
import math

import pytest

from llm_gym import Env, StepResult, Task, TruncationCause
from llm_gym.errors import ChatTemplateError, TokenizerError
from llm_gym.eval.metrics import summarize_episodes
from llm_gym.policies import Generation, Policy, PolicyRequest
from llm_gym.rollout import collect_groups

pytest.importorskip("transformers")

RAISES_ON_BOOM = (
    "{%- for m in messages %}{%- if 'boom' in m['content'] %}"
    "{{- raise_exception('no boom here') }}{%- endif %}"
    "{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


class OneStep(Env):
    """Ends after one action with reward 1 (success), so any failure is the template's."""

    def __init__(self) -> None:
        self._messages: list = []

    async def reset(self, task: Task) -> list:
        self._messages = [{"role": "user", "content": task.prompt}]
        return list(self._messages)

    async def step(self, message) -> StepResult:
        self._messages += [message]
        return StepResult(True, False, list(self._messages), 1.0)

    @property
    def tool_specs(self) -> list:
        return []

    @property
    def messages(self) -> list:
        return list(self._messages)


class Says(Policy):
    async def act(self, requests: list[PolicyRequest]) -> list[Generation]:
        return [Generation(text="fine") for _ in requests]


@pytest.fixture
def tokenizer(small_model_dir):
    from transformers import AutoTokenizer

    found = AutoTokenizer.from_pretrained(small_model_dir)
    found.chat_template = RAISES_ON_BOOM
    return found


def _run(tokenizer, prompts):
    tasks = [Task(prompt=p, id=str(i)) for i, p in enumerate(prompts)]
    groups = collect_groups(OneStep, tasks, Says(), max_turns=2, tokenizer=tokenizer)
    return [episode for group in groups for episode in group]


def test_a_template_that_raises_ends_its_episode_as_template_not_env(tokenizer) -> None:
    episodes = _run(tokenizer, ["boom", "calm", "calm", "boom"])
    causes = [e.truncation_cause for e in episodes]
    assert causes == [TruncationCause.TEMPLATE, None, None, TruncationCause.TEMPLATE]
    assert "no boom here" in episodes[0].error and episodes[0].num_turns == 0
    summary = summarize_episodes(episodes)
    assert summary["template_ratio"] == 0.5 and summary["env_ratio"] == 0.0
    assert summary["env_error_ratio"] == 0.0 and summary["success_rate"] == 0.5


def test_a_tokenizer_that_fails_ends_its_episode_as_tokenizer(tokenizer) -> None:
    encode = tokenizer.encode

    def fragile(text, *args, **kwargs):
        if "glitch" in text:
            raise RuntimeError("cannot encode this")
        return encode(text, *args, **kwargs)

    tokenizer.encode = fragile
    episodes = _run(tokenizer, ["glitch", "calm"])
    assert [e.truncation_cause for e in episodes] == [TruncationCause.TOKENIZER, None]
    assert "cannot encode this" in episodes[0].error
    assert summarize_episodes(episodes)["tokenizer_ratio"] == 0.5
    with pytest.raises(TokenizerError, match="tokenizer failed every one of the 1 episodes"):
        _run(tokenizer, ["glitch"])


def test_a_collection_the_template_fails_entirely_raises(tokenizer) -> None:
    with pytest.raises(ChatTemplateError, match="failed every one of the 2 episodes.*no boom"):
        _run(tokenizer, ["boom", "boom!"])


def test_training_metrics_name_template_and_tokenizer_endings(tokenizer) -> None:
    from trainers.grpo.metrics import rollout_metrics

    episodes = _run(tokenizer, ["boom", "calm"])
    part = (episodes, [0.0, 1.0], 2, 0, 0)  # 2 groups collected, none set aside or dropped
    logged = rollout_metrics([part], 1.0, math.nan)
    assert logged["episodes/template_ratio"] == 0.5
    assert logged["episodes/tokenizer_ratio"] == 0.0
    assert logged["episodes/env_truncated_ratio"] == 0.0


def test_eval_whose_every_episode_the_template_fails_exits_non_zero(
    small_model_dir, tmp_path, capsys
) -> None:
    from llm_gym.cli import main

    template = tmp_path / "raises.jinja"
    template.write_text("{{ raise_exception('this template renders nothing') }}")
    out = io.StringIO()
    argv = ["eval", "GuessNumber-v0", "--policy", f"hf:{small_model_dir}", "--episodes", "2",
            "--chat-template", str(template), "--no-progress"]  # fmt: skip
    assert main(argv, out) == 2
    said = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert len(said) == 1 and said[0].startswith("llm-gym eval: error: ")  # one line
    assert "chat template failed every one of the 2 episodes" in said[0]
    assert "this template renders nothing" in said[0] and out.getvalue() == ""
