"""The action format follows the chat template (llm_gym.policies.template_format): recognised
from the template's own rendering of a probe call, pinned formats kept with a warning (an error
under ``template_tools="require"``), the environment's format for a template that teaches none.

The family templates are the real ones TRL ships (``trl/chat_templates``, Apache-2.0: Qwen2.5,
Llama 3.1, Qwen3.5, which writes Qwen3-Coder's XML, and gpt-oss) and Mistral v0.3's rules as
tests/test_template_tools_families.py writes them; each gets the family's control tokens as
special tokens, as the family's own tokenizer has them."""

from __future__ import annotations

import copy
import logging
import warnings
from pathlib import Path

import pytest

from llm_gym.actions import ACTION_FORMATS, get_action_format
from llm_gym.envs.tool_use_game import ToolUseGameEnv, get_tasks, oracle_action
from llm_gym.errors import InvalidArgumentError, UnknownNameError
from llm_gym.policies import Generation, OraclePolicy, Policy
from llm_gym.policies.chat import render_chat
from llm_gym.policies.template_format import (
    episode_format,
    probe_reply,
    recognise_format,
    require_format_choice,
    template_format,
)
from llm_gym.policies.template_tools import TemplateToolsError
from llm_gym.rollout import collect_groups
from tests.test_template_tools import SMOLLM2_TEMPLATE
from tests.test_template_tools_families import MISTRAL_V03

pytest.importorskip("transformers")

_TRL = Path(__import__("importlib.util").util.find_spec("trl").origin).parent / "chat_templates"


def _trl_template(name: str) -> str | None:
    path = _TRL / f"{name}.jinja"
    return path.read_text(encoding="utf-8") if path.is_file() else None


FAMILIES = {
    # family: (template, its control tokens, its end-of-turn token, the format it teaches)
    "qwen2.5": (_trl_template("qwen2_5"), [], "<|im_end|>", "hermes"),
    "llama3.1": (
        _trl_template("llama3_1"),
        [
            "<|begin_of_text|>",
            "<|start_header_id|>",
            "<|end_header_id|>",
            "<|eot_id|>",
            "<|eom_id|>",
            "<|python_tag|>",
        ],
        "<|eot_id|>",
        "llama3_json",
    ),
    "mistral_v0.3": (
        MISTRAL_V03,
        [
            "[INST]",
            "[/INST]",
            "[TOOL_CALLS]",
            "[AVAILABLE_TOOLS]",
            "[/AVAILABLE_TOOLS]",
            "[TOOL_RESULTS]",
            "[/TOOL_RESULTS]",
        ],
        "<|im_end|>",
        "mistral",
    ),
    "qwen3_coder": (_trl_template("qwen3_5_nothink"), [], "<|im_end|>", "qwen3_coder"),
    "gpt-oss": (
        _trl_template("gptoss"),
        [
            "<|start|>",
            "<|end|>",
            "<|message|>",
            "<|channel|>",
            "<|constrain|>",
            "<|return|>",
            "<|call|>",
        ],
        "<|call|>",
        "harmony",
    ),
}
"""Every family whose template renders tools natively, and the format it teaches."""


def _needs(fmt: str) -> None:
    if fmt not in ACTION_FORMATS:
        pytest.skip(f"no {fmt!r} action format registered")


def family_tokenizer(base, family: str):
    template, control, end, _ = FAMILIES[family]
    if template is None:
        pytest.skip(f"this TRL ships no template for {family}")
    tokenizer = copy.deepcopy(base)
    tokenizer.chat_template = template
    if control:
        tokenizer.add_special_tokens({"additional_special_tokens": control})
    tokenizer.eos_token = end if end in control else tokenizer.eos_token
    return tokenizer


def family_tokenizers(base) -> dict:
    """Each family's tokenizer built on ``base`` (the families this TRL ships), and SmolLM2's."""
    out = {}
    for family in FAMILIES:
        try:
            out[family] = family_tokenizer(base, family)
        except pytest.skip.Exception:
            continue
    smollm2 = copy.deepcopy(base)
    smollm2.chat_template = SMOLLM2_TEMPLATE
    out["smollm2"] = smollm2
    return out


@pytest.fixture(scope="module")
def tokenizers(small_model) -> dict:
    return family_tokenizers(small_model[1])


def _tokenizer(tokenizers: dict, family: str):
    if family not in tokenizers:
        pytest.skip(f"this TRL ships no template for {family}")
    return tokenizers[family]


# --- recognising a format from text ------------------------------------------------------------


def test_the_format_that_reads_the_probe_call_back_is_recognised() -> None:
    hermes = (
        '<tool_call>\n{"name": "llm_gym_probe_tool", "arguments": {"key": "probe"}}\n</tool_call>'
    )
    assert recognise_format(hermes) == "hermes"
    assert recognise_format(hermes.replace('"probe"', '"other"')) is None  # not the probe call
    assert recognise_format("I would call llm_gym_probe_tool.") is None
    only_json = {"json": ACTION_FORMATS["json"]}
    assert recognise_format(hermes, only_json) is None


def test_a_format_that_raises_while_parsing_reads_nothing() -> None:
    class Broken(get_action_format("hermes").__class__):
        def parse(self, text, *, call_id_prefix=None):
            raise RuntimeError("broken")

    assert recognise_format("<tool_call>{}</tool_call>", {"broken": Broken}) is None


def test_auto_or_a_registered_name_is_a_choice_anything_else_is_refused() -> None:
    assert require_format_choice("auto") == "auto"
    assert require_format_choice("hermes") == "hermes"
    with pytest.raises(UnknownNameError, match="hermes"):
        require_format_choice("hermez")
    with pytest.raises(InvalidArgumentError, match="'auto'"):
        require_format_choice(3)


# --- each family -------------------------------------------------------------------------------


@pytest.mark.parametrize("family", list(FAMILIES))
def test_each_family_teaches_its_own_format(family, tokenizers) -> None:
    fmt = FAMILIES[family][3]
    _needs(fmt)
    tokenizer = _tokenizer(tokenizers, family)
    assert template_format(tokenizer) == fmt, probe_reply(tokenizer)
    assert episode_format("auto", tokenizer).name == fmt


def test_a_template_that_cannot_render_tools_keeps_the_envs_format(tokenizers) -> None:
    smollm2 = tokenizers["smollm2"]
    assert template_format(smollm2) is None
    assert episode_format("auto", smollm2).name == "hermes"
    assert episode_format("auto", smollm2, env_format="json").name == "json"
    assert episode_format("auto", None, env_format="json").name == "json"  # no tokenizer


def test_a_pinned_format_the_template_contradicts_warns_naming_both(tokenizers) -> None:
    qwen = copy.deepcopy(tokenizers["qwen2.5"])  # a template of its own: warned once per template
    qwen.chat_template += "{# pinned json #}"
    with pytest.warns(UserWarning, match=r"'json' is pinned.*teaches the 'hermes'"):
        assert episode_format("json", qwen).name == "json"
    with pytest.raises(TemplateToolsError, match=r"'json' is pinned.*'hermes'"):
        episode_format("json", qwen, template_tools="require")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the template's own format, pinned: no warning
        assert episode_format("hermes", qwen, template_tools="require").name == "hermes"
        assert episode_format("json", tokenizers["smollm2"]).name == "json"  # teaches none


def test_the_choice_is_logged_once_per_template(tokenizers, caplog) -> None:
    tokenizer = copy.deepcopy(tokenizers["qwen2.5"])
    tokenizer.chat_template += "{# logged once #}"
    with caplog.at_level(logging.INFO, logger="llm_gym.policies.template_format"):
        for _ in range(3):
            episode_format("auto", tokenizer)
    lines = [r.getMessage() for r in caplog.records if "action format" in r.getMessage()]
    assert len(lines) == 1 and "'hermes', the one its chat template teaches" in lines[0]


def test_a_native_template_no_format_reads_keeps_the_envs_format_with_a_warning(
    tokenizers,
) -> None:
    tokenizer = copy.deepcopy(tokenizers["qwen2.5"])  # a convention of its own: <<call NAME>>
    tokenizer.chat_template = tokenizer.chat_template.replace(
        '<tool_call>\\n{"name": "', "<<call "
    ).replace("</tool_call>", ">>")
    assert "<<call " in (probe_reply(tokenizer) or "")
    assert template_format(tokenizer) is None
    with pytest.warns(UserWarning, match="no registered action format reads"):
        assert episode_format("auto", tokenizer, env_format="json").name == "json"


# --- one format end to end ---------------------------------------------------------------------


class TokenOracle(Policy):
    """The oracle's messages written in the episode's format, as tokens ending with the
    end-of-turn token: what a model tuned on the template would sample."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    async def act(self, requests):
        out = []
        for request in requests:
            assert request.prompt_ids is not None
            message = oracle_action(request.task, list(request.messages))
            text = request.action_format.render_message(message)
            ids = [
                *self.tokenizer.encode(text, add_special_tokens=False),
                self.tokenizer.eos_token_id,
            ]
            out.append(Generation(text=text, token_ids=ids, logprobs=[-0.5] * len(ids)))
        return out


def _oracle_episodes(tokenizer, action_format="auto", kinds=("lookup", "lookup_arith")):
    tasks = [t for t in get_tasks("val") if t.metadata["type"] in kinds][:4]
    policy = OraclePolicy(oracle_action) if tokenizer is None else TokenOracle(tokenizer)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return [
            group[0]
            for group in collect_groups(
                ToolUseGameEnv,
                tasks,
                policy,
                max_turns=8,
                oracle=oracle_action,
                action_format=action_format,
            )
        ]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_an_oracle_episode_in_each_familys_format_scores_as_the_oracles(family, tokenizers):
    """The oracle's calls are written in the format the template teaches, parsed back by it,
    and the episode scores as the oracle's own (hermes, no template)."""
    fmt = FAMILIES[family][3]
    _needs(fmt)
    tokenizer = _tokenizer(tokenizers, family)
    reference = _oracle_episodes(None, "hermes")
    episodes = _oracle_episodes(tokenizer)
    for ours, theirs in zip(episodes, reference, strict=True):
        assert ours.action_format.name == fmt
        assert [t.parse_kind for t in ours.turns] == [t.parse_kind for t in theirs.turns]
        assert ours.reward == theirs.reward and ours.reward > 0
        assert ours.truncation_cause is None
        calls = [t.text for t in ours.turns[:-1]]
        fresh = get_action_format(fmt)
        assert all(fresh.parse(text).is_tool_calls for text in calls)
        # Token alignment: the trained tokens are the format's text, the sample the template's
        # rendering of the conversation (a template that rewrites history splits it).
        trained = [
            i for s in ours.samples for i, m in zip(s.completion_ids, s.env_mask, strict=True) if m
        ]
        texts = "".join(t.text + tokenizer.eos_token for t in ours.turns)
        kept = tokenizer.decode(
            trained, skip_special_tokens=False, clean_up_tokenization_spaces=False
        )
        assert kept == texts
        assert trained == [i for t in ours.turns for i in t.token_ids]  # the ids as sampled
        # Each sample's prompt is the template's rendering of the history before its first
        # turn (past turns as the template writes them: structured calls for gpt-oss, Mistral).
        history, before = list(ours.messages[: ours.num_opening_messages]), []
        for turn in ours.turns:
            before.append(list(history))
            history += [{"role": "assistant", "content": turn.text}, *turn.env_messages]
        for sample in ours.samples:
            first = next(t for t, m in zip(sample.turn_index, sample.env_mask, strict=True) if m)
            prompt = render_chat(
                tokenizer, before[first], ours.tool_specs, add_generation_prompt=True,
                action_format=ours.action_format,
            )  # fmt: skip
            assert tokenizer.decode(sample.prompt_ids, skip_special_tokens=False) == prompt
        if len(ours.samples) == 1:
            (sample,) = ours.samples
            raw = list(ours.messages[: ours.num_opening_messages])
            for turn in ours.turns:
                raw.append({"role": "assistant", "content": turn.text})
                raw.extend(turn.env_messages)
            rendered = render_chat(
                tokenizer, raw, ours.tool_specs, add_generation_prompt=False,
                action_format=ours.action_format,
            )  # fmt: skip
            decoded = tokenizer.decode(sample.prompt_ids + sample.completion_ids)
            assert rendered.startswith(decoded) and not rendered[len(decoded) :].strip()


def test_a_one_call_oracle_episode_in_mistrals_format_scores_as_the_oracles(tokenizers) -> None:
    _needs("mistral")
    tokenizer = tokenizers["mistral_v0.3"]
    reference = _oracle_episodes(None, "hermes", kinds=("lookup",))
    for ours, theirs in zip(_oracle_episodes(tokenizer, kinds=("lookup",)), reference, strict=True):
        assert ours.action_format.name == "mistral" and ours.turns[0].text.startswith(
            "[TOOL_CALLS]"
        )
        assert ours.reward == theirs.reward > 0 and ours.error is None
        assert ours.samples  # several: the template moves the tools to the last user turn


def test_sft_targets_are_written_in_the_format_the_template_teaches(tokenizers) -> None:
    """The oracle's SFT transcripts for a Llama 3.1 model hold Llama 3 JSON calls, for a model
    whose template teaches none the env's hermes."""
    pytest.importorskip("datasets")
    _needs("llama3_json")
    from trainers.sft.data import oracle_sft_dataset

    tasks = [t for t in get_tasks("train") if t.metadata["type"] == "lookup"][:2]

    def first_call(tokenizer) -> str:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rows = oracle_sft_dataset(
                "ToolUseGame-v0", tasks, tokenizer=_tokenizer(tokenizers, tokenizer)
            )
        return next(m["content"] for m in rows[0]["messages"] if m["role"] == "assistant")

    assert first_call("llama3.1").startswith('{"name": "lookup", "parameters": ')
    assert first_call("smollm2").startswith("<tool_call>")


def test_an_env_that_pins_its_format_keeps_it_and_warns(tokenizers) -> None:
    from llm_gym.gym import register_env, unregister_env

    common = dict(
        env="llm_gym.envs.tool_use_game:ToolUseGameEnv",
        tasks="llm_gym.envs.tool_use_game:get_tasks",
    )
    pinned = register_env("PinnedJson-v0", action_format="json", pin_action_format=True, **common)
    default = register_env("DefaultJson-v0", action_format="json", **common)
    try:
        assert pinned.requested_action_format == "json"
        assert default.requested_action_format == "auto"
        qwen = copy.deepcopy(tokenizers["qwen2.5"])
        qwen.chat_template += "{# warned once per template #}"
        with pytest.warns(UserWarning, match="'json' is pinned"):
            assert episode_format(pinned.requested_action_format, qwen).name == "json"
        assert episode_format(default.requested_action_format, qwen).name == "hermes"
        smollm2 = tokenizers["smollm2"]
        fallback = episode_format(default.requested_action_format, smollm2, env_format="json")
        assert fallback.name == "json"
    finally:
        unregister_env("PinnedJson-v0")
        unregister_env("DefaultJson-v0")
