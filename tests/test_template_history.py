"""Past assistant turns as structured tool calls (llm_gym.policies.template_history): which
templates get them (the probe), what they get, and what stays exactly as it is.

The family templates are test_template_format's (TRL's real Qwen2.5, Llama 3.1, Qwen3.5 and
gpt-oss templates, Mistral v0.3's rules as tests/test_template_tools_families.py writes them),
each with its family's control tokens as special tokens."""

from __future__ import annotations

import copy
import json
import warnings

import pytest

from llm_gym.actions import get_action_format
from llm_gym.actions.codec import short_call_id
from llm_gym.aio import run_sync
from llm_gym.envs.tool_use_game import ToolUseGameEnv, get_tasks
from llm_gym.policies.chat import plain_message, render_chat
from llm_gym.policies.template_history import (
    MAX_ARGUMENT_DEPTH,
    nesting_over,
    structured_history,
)
from llm_gym.policies.template_render import apply_template
from llm_gym.policies.template_tools import short_call_ids, template_support, text_layout
from tests.test_template_format import FAMILIES, family_tokenizers
from tests.test_template_format import _tokenizer as pick

pytest.importorskip("transformers")

STRUCTURED = {"mistral_v0.3", "gpt-oss"}
"""The families whose templates render a tool-using history only with structured calls."""


@pytest.fixture(scope="module")
def tokenizers(small_model) -> dict:
    return family_tokenizers(small_model[1])


def _call(fmt, name: str, arguments: dict) -> str:
    """The text a model tuned on ``fmt`` writes for one call."""
    call = {
        "id": "x",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }
    return fmt.render_message({"role": "assistant", "content": "", "tool_calls": [call]})


def _conversation(fmt, *, then_user: bool = False, arguments: dict | None = None) -> tuple:
    """ToolUseGame's opening, two calls in a row (each answered by its result, with the ids the
    rollout gives them) and a final answer; with ``then_user`` a user message after the second
    result."""
    env = ToolUseGameEnv()
    task = next(t for t in get_tasks("val") if t.metadata["type"] == "lookup_arith")
    opening = run_sync(env.reset(task))
    first = {"key": "Velmora.population"} if arguments is None else arguments
    conversation = [
        *opening,
        {"role": "assistant", "content": _call(fmt, "lookup", first)},
        {"role": "tool", "name": "lookup", "tool_call_id": "call_t1_0", "content": "RESULT-ONE"},
        {"role": "assistant", "content": _call(fmt, "lookup", {"key": "Tarn.area"})},
        {"role": "tool", "name": "lookup", "tool_call_id": "call_t2_0", "content": "RESULT-TWO"},
    ]
    if then_user:
        conversation.append({"role": "user", "content": "Go on."})
    final = fmt.render_message({"role": "assistant", "content": "42"})
    conversation.append({"role": "assistant", "content": final})
    return conversation, env.tool_specs


def _render(tokenizer, conversation, specs, fmt) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return render_chat(
            tokenizer, conversation, specs, add_generation_prompt=True, action_format=fmt
        )


# --- the probe -----------------------------------------------------------------------------------


@pytest.mark.parametrize("family", [*FAMILIES, "smollm2"])
def test_the_probe_gives_structured_history_to_the_templates_that_need_it(
    family, tokenizers
) -> None:
    support = template_support(pick(tokenizers, family))
    assert support.structured_history == (family in STRUCTURED)
    assert support.text_before_user == (family == "mistral_v0.3")  # its alternation rule


# --- templates that need it ----------------------------------------------------------------------


@pytest.mark.parametrize("family", sorted(STRUCTURED))
def test_two_calls_in_a_row_render_as_the_template_writes_calls(family, tokenizers) -> None:
    """Two calls in a row and a final answer render (as text they raise: gpt-oss at the first
    tool result, Mistral v0.3 at the second assistant turn in a row), each call as the
    template writes it, paired with its result."""
    tokenizer = pick(tokenizers, family)
    fmt = get_action_format(FAMILIES[family][3])
    conversation, specs = _conversation(fmt)
    with pytest.raises(Exception, match="tool call|alternate"):  # as text: refused
        tokenizer.apply_chat_template(
            [plain_message(m) for m in conversation], tools=specs, tokenize=False
        )
    text = _render(tokenizer, conversation, specs, fmt)
    assert "RESULT-ONE" in text and "RESULT-TWO" in text
    if family == "gpt-oss":
        call = "<|start|>assistant to=functions.lookup<|channel|>commentary json<|message|>"
        assert text.count(call) == 2 and '{"key": "Tarn.area"}<|call|>' in text
        assert "<|channel|>final<|message|>42<|end|>" in text  # the answer, not its header
    else:
        ids = [m["tool_calls"][0]["id"] for m in structured_history(conversation, fmt)[0][-5:-1:2]]
        assert ids == ["call_t1_0", "call_t2_0"]  # each call has its result's id
        for call_id in ("call_t1_0", "call_t2_0"):
            short = short_call_id(call_id)
            assert f'"id": "{short}"}}]' in text and f'"call_id": "{short}"' in text


def test_a_mistral_call_a_user_message_follows_stays_text(tokenizers) -> None:
    """Mistral v0.3 counts text turns only in its alternation: a call whose result a user
    message follows stays text (structured, the template refuses two user turns in a row)."""
    tokenizer = pick(tokenizers, "mistral_v0.3")
    fmt = get_action_format("mistral")
    conversation, specs = _conversation(fmt, then_user=True)
    chat, _ = structured_history(conversation, fmt, text_before_user=True)
    assistants = [m for m in chat if m["role"] == "assistant"]
    assert "tool_calls" in assistants[0] and "tool_calls" not in assistants[1]
    assert assistants[1]["content"].startswith("[TOOL_CALLS]")
    text = _render(tokenizer, conversation, specs, fmt)
    assert "RESULT-TWO" in text and "Go on." in text


def test_a_mistral_call_a_user_message_follows_renders_byte_for_byte_as_text(tokenizers) -> None:
    """One call, its result and a user message render exactly as the text turns do."""
    tokenizer = pick(tokenizers, "mistral_v0.3")
    fmt = get_action_format("mistral")
    conversation, specs = _conversation(fmt, then_user=True)
    head = [*conversation[:-4], conversation[-2]]  # opening, one call, its result, "Go on."
    assert [m["role"] for m in head[-3:]] == ["assistant", "tool", "user"]
    as_text = tokenizer.apply_chat_template(
        short_call_ids([plain_message(m) for m in head]),
        tools=specs,
        tokenize=False,
        add_generation_prompt=True,
    )
    assert _render(tokenizer, head, specs, fmt) == as_text


# --- templates that do not: the text turns as they are --------------------------------------------


@pytest.mark.parametrize("family", ["qwen2.5", "llama3.1", "qwen3_coder", "smollm2"])
def test_templates_that_render_text_history_render_it_byte_for_byte(family, tokenizers) -> None:
    """ChatML (SmolLM2: the text layout), Qwen2.5's hermes, Llama 3.1 and Qwen3-Coder get the
    assistant's turns as text: the rendering is the template's own of the text turns."""
    tokenizer = pick(tokenizers, family)
    fmt = get_action_format(FAMILIES[family][3] if family in FAMILIES else "hermes")
    conversation, specs = _conversation(fmt, then_user=True)
    support = template_support(tokenizer)
    if support.native:
        chat, tools = [plain_message(m) for m in conversation], specs
    else:
        chat, tools = text_layout(conversation, specs, fmt, support), None
    expected = apply_template(tokenizer, chat, tools=tools, add_generation_prompt=True)
    assert _render(tokenizer, conversation, specs, fmt) == expected
    assert "RESULT-TWO" in expected


# --- hostile history -----------------------------------------------------------------------------


def test_nesting_is_measured_without_recursion() -> None:
    deep: object = 1
    for _ in range(100_000):
        deep = [deep]
    assert nesting_over(deep, MAX_ARGUMENT_DEPTH)
    assert not nesting_over({"a": [1, {"b": "c"}]}, 3) and nesting_over({"a": [{}]}, 2)


@pytest.mark.parametrize("family", sorted(STRUCTURED))
def test_a_past_call_with_deep_arguments_renders_them_as_text_with_a_warning(
    family, tokenizers
) -> None:
    """A reply whose arguments nest 800 levels deep parses as a call; as an object a template's
    ``tojson`` would recurse past Python's stack inside the render. The template gets them as
    their JSON text, and a warning says why."""
    tokenizer = copy.deepcopy(pick(tokenizers, family))
    fmt = get_action_format(FAMILIES[family][3])
    deep: object = "leaf"
    for _ in range(800):
        deep = {"k": deep}
    conversation, specs = _conversation(fmt, arguments={"key": deep})
    assert fmt.parse(conversation[-5]["content"]).is_tool_calls
    with pytest.warns(UserWarning, match="nested more than 64 levels deep.*JSON text"):
        text = render_chat(
            tokenizer, conversation, specs, add_generation_prompt=True, action_format=fmt
        )
    assert "RESULT-ONE" in text and "RESULT-TWO" in text and "leaf" in text


@pytest.mark.parametrize("family", sorted(STRUCTURED))
def test_a_past_call_with_huge_odd_arguments_renders(family, tokenizers) -> None:
    """Arguments of a megabyte, quotes, backslashes, newlines, other scripts and a
    look-alike of the family's tokens render as the template prints objects."""
    tokenizer = pick(tokenizers, family)
    fmt = get_action_format(FAMILIES[family][3])
    odd = {
        "key": "x" * 1_000_000,
        'quo"te': 'a\\"b\nc',
        "script": "Ωμέγα 漢字 🙂",
        "looks": "[INST] [/INST] <| end |>",
        "nested": [[{"n": None, "t": True, "f": 1.5e300}]],
    }
    conversation, specs = _conversation(fmt, arguments=odd)
    assert fmt.parse(conversation[-5]["content"]).is_tool_calls
    text = _render(tokenizer, conversation, specs, fmt)
    assert "RESULT-TWO" in text and "x" * 1_000_000 in text and "漢字" in text


def test_a_reply_that_does_not_parse_keeps_its_text() -> None:
    fmt = get_action_format("mistral")
    broken = '[TOOL_CALLS] [{"name": "lookup", "arguments": {"key": '
    chat, reasons = structured_history([{"role": "assistant", "content": broken}], fmt)
    assert chat == [{"role": "assistant", "content": broken}] and reasons == []


def test_structured_calls_keep_their_ids_and_get_object_arguments() -> None:
    call = {
        "id": "abcDEF123",
        "type": "function",
        "function": {"name": "lookup", "arguments": '{"key": "a"}'},
    }
    messages = [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "abcDEF123", "content": "1"},
    ]
    chat, _ = structured_history(messages, "hermes")
    (out,) = chat[0]["tool_calls"]
    assert out["function"]["arguments"] == {"key": "a"}
    assert out["id"] == "abcDEF123"
    assert messages[0]["tool_calls"][0]["function"]["arguments"] == '{"key": "a"}'  # unchanged
