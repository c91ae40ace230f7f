"""Tools shown to every template family (llm_gym.policies.template_tools): SmolLM2's and Qwen2.5's
real templates, and test templates written to each family's rule: Gemma 2 raises on a system
role and on turns that do not alternate, Mistral v0.1 and Llama 2 demand strict user/assistant
alternation (``raise_exception``), Mistral v0.3 renders tools natively and refuses tool-call
ids other than 9 characters, Phi-3 drops a system message silently.

For every registered environment, on every template: the prompt renders (no exception), each
tool spec is in it exactly once more than in the same conversation without specs, and the
tool result is in it; a template that renders tools natively gets the conversation exactly as
the template renders it itself."""

from __future__ import annotations

import copy
import warnings

import gymnasium as gym
import pytest

from llm_gym.gym import registered_envs
from llm_gym.policies.chat import render_chat
from llm_gym.policies.template_tools import (
    PROBE_CALL_ID,
    TemplateSupport,
    short_call_ids,
    template_support,
)
from tests.test_template_tools import SMOLLM2_TEMPLATE

pytest.importorskip("transformers")

GEMMA2 = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not "
    "supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != "
    "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/"
    "assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == 'assistant') %}"
    "{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}"
    "{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}"
)
"""Gemma 2's rule: no system role, strict alternation (its template's text)."""

MISTRAL_V01 = (
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != "
    "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/"
    "assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}"
    "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ message['content'] + eos_token + ' ' }}{% else %}{{ raise_exception('Only user and "
    "assistant roles are supported!') }}{% endif %}{% endfor %}"
)
"""Mistral v0.1's rule: user and assistant only, strictly alternating."""

LLAMA2 = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}"
    "{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"
    "{% for message in loop_messages %}{% if (message['role'] == 'user') != "
    "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/"
    "assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message "
    "!= false %}{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + "
    "message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token }}{{ '[INST] ' + content.strip() + "
    "' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' ' + content.strip() + ' ' + "
    "eos_token }}{% endif %}{% endfor %}"
)
"""Llama 2's rule: an optional leading system message, then strict alternation."""

PHI3 = (
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') %}"
    "{{'<|user|>' + '\n' + message['content'] + '<|end|>' + '\n' + '<|assistant|>' + '\n'}}"
    "{% elif (message['role'] == 'assistant') %}{{message['content'] + '<|end|>' + '\n'}}"
    "{% endif %}{% endfor %}"
)
"""Phi-3's rule: system (and tool) messages dropped without a word."""

MISTRAL_V03 = """
{%- if messages[0]["role"] == "system" %}
    {%- set system_message = messages[0]["content"] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- if not tools is defined %}{%- set tools = none %}{%- endif %}
{%- set user_messages = loop_messages | selectattr("role", "equalto", "user") | list %}
{%- set ns = namespace() %}
{%- set ns.index = 0 %}
{%- for message in loop_messages %}
    {%- if not (message.role == "tool" or (message.tool_calls is defined and
        message.tool_calls is not none)) %}
        {%- if (message["role"] == "user") != (ns.index % 2 == 0) %}
            {{- raise_exception("After the optional system message, conversation roles must
                alternate user/assistant/user/assistant/...") }}
        {%- endif %}
        {%- set ns.index = ns.index + 1 %}
    {%- endif %}
{%- endfor %}
{{- bos_token }}
{%- for message in loop_messages %}
    {%- if message["role"] == "user" %}
        {%- if tools is not none and (message == user_messages[-1]) %}
            {{- "[AVAILABLE_TOOLS] [" }}
            {%- for tool in tools %}
                {%- set tool = tool.function %}
                {{- '{"type": "function", "function": {' }}
                {%- for key, val in tool.items() if key != "return" %}
                    {%- if val is string %}{{- '"' + key + '": "' + val + '"' }}
                    {%- else %}{{- '"' + key + '": ' + val|tojson }}{%- endif %}
                    {%- if not loop.last %}{{- ", " }}{%- endif %}
                {%- endfor %}
                {{- "}}" }}
                {%- if not loop.last %}{{- ", " }}{%- else %}{{- "]" }}{%- endif %}
            {%- endfor %}
            {{- "[/AVAILABLE_TOOLS]" }}
        {%- endif %}
        {%- if loop.last and system_message is defined %}
            {{- "[INST] " + system_message + "\\n\\n" + message["content"] + "[/INST]" }}
        {%- else %}
            {{- "[INST] " + message["content"] + "[/INST]" }}
        {%- endif %}
    {%- elif message.tool_calls is defined and message.tool_calls is not none %}
        {{- "[TOOL_CALLS] [" }}
        {%- for tool_call in message.tool_calls %}
            {%- set out = tool_call.function|tojson %}
            {{- out[:-1] }}
            {%- if not tool_call.id is defined or tool_call.id|length != 9 %}
                {{- raise_exception("Tool call IDs should be alphanumeric strings with
                    length 9!") }}
            {%- endif %}
            {{- ', "id": "' + tool_call.id + '"}' }}
            {%- if not loop.last %}{{- ", " }}{%- else %}{{- "]" + eos_token }}{%- endif %}
        {%- endfor %}
    {%- elif message["role"] == "assistant" %}
        {{- " " + message["content"]|trim + eos_token}}
    {%- elif message["role"] == "tool" %}
        {{- '[TOOL_RESULTS] {"content": ' + message.content|string + ", " }}
        {%- if not message.tool_call_id is defined or message.tool_call_id|length != 9 %}
            {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
        {%- endif %}
        {{- '"call_id": "' + message.tool_call_id + '"}[/TOOL_RESULTS]' }}
    {%- else %}
        {{- raise_exception("Only user and assistant roles are supported, with the exception
            of an initial optional system message!") }}
    {%- endif %}
{%- endfor %}
"""
"""Mistral v0.3's tool template (its structure and rules): tools natively, before the last user
message; tool-call ids of exactly 9 characters; alternation checked past tool messages."""

TEMPLATES = {
    "smollm2": SMOLLM2_TEMPLATE,
    "qwen2.5": None,  # the tiny model's own: Qwen2.5's template
    "gemma2": GEMMA2,
    "mistral_v01": MISTRAL_V01,
    "llama2": LLAMA2,
    "phi3": PHI3,
    "mistral_v03": MISTRAL_V03,
}
SUPPORT = {
    "smollm2": TemplateSupport(tools=False, tool_role=True),
    "qwen2.5": TemplateSupport(tools=True, tool_role=True),
    "gemma2": TemplateSupport(tools=False, tool_role=False, system=False, alternates=True),
    "mistral_v01": TemplateSupport(tools=False, tool_role=False, system=False, alternates=True),
    "llama2": TemplateSupport(tools=False, tool_role=False, alternates=True),
    "phi3": TemplateSupport(tools=False, tool_role=False, system=False),
    "mistral_v03": TemplateSupport(
        tools=True,
        tool_role=True,
        alternates=True,
        short_call_ids=True,
        structured_history=True,
        text_before_user=True,
    ),
}
NATIVE = ("qwen2.5", "mistral_v03")
RESULT = "tool-result-7461"
CALL_ID = "call_8f3a_0"
"""An id as the hermes format writes them: not 9 alphanumerics."""


@pytest.fixture(scope="module")
def tokenizers(small_model) -> dict:
    out = {}
    for name, template in TEMPLATES.items():
        tokenizer = copy.deepcopy(small_model[1])
        if template is not None:
            tokenizer.chat_template = template
        out[name] = tokenizer
    return out


def _opening(env_id: str) -> tuple[list, list]:
    env = gym.make(env_id)
    try:
        _, info = env.reset(seed=0)
        return list(info["messages"]), list(info["tool_specs"])
    finally:
        env.close()


def _openings() -> list[tuple[str, list, list]]:
    from llm_gym.envs.builtin import BUILTIN_ENVS

    builtin = {env.id for env in BUILTIN_ENVS}
    out = []
    for entry in (e for e in registered_envs() if e.id in builtin):
        try:
            out.append((entry.id, *_opening(entry.id)))
        except ImportError:  # an interop env whose package is not installed
            continue
    return out


def _conversation(messages: list, specs: list) -> list:
    """The opening, one tool call (as the model writes it) and an environment reply of a tool
    result and a user message: ``[tool, user]``."""
    name = specs[0]["function"]["name"] if specs else "none"
    call = f'<tool_call>\n{{"name": "{name}", "arguments": {{}}}}\n</tool_call>'
    return [
        *messages,
        {"role": "assistant", "content": call},
        {"role": "tool", "name": name, "tool_call_id": CALL_ID, "content": RESULT},
        {"role": "user", "content": "Go on."},
    ]


def _render(tokenizer, conversation, specs) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return render_chat(tokenizer, conversation, specs, add_generation_prompt=True)


@pytest.mark.parametrize("family", list(TEMPLATES))
def test_the_probe_finds_each_familys_rule(family, tokenizers) -> None:
    assert template_support(tokenizers[family]) == SUPPORT[family]


@pytest.mark.parametrize("family", list(TEMPLATES))
def test_every_registered_envs_tools_appear_once_and_results_appear(family, tokenizers) -> None:
    tokenizer = tokenizers[family]
    openings = _openings()
    assert sum(bool(specs) for _, _, specs in openings) >= 5
    for env_id, messages, specs in openings:
        conversation = _conversation(messages, specs)
        text = _render(tokenizer, conversation, specs)  # the template does not raise
        bare = _render(tokenizer, conversation, [])
        assert RESULT in text, (family, env_id)
        for spec in specs:
            name = f'"{spec["function"]["name"]}"'
            assert text.count(name) - bare.count(name) == 1, (family, env_id, name)
        system = messages[0]["content"] if messages and messages[0]["role"] == "system" else ""
        if system and family != "mistral_v03":  # v0.3 shows it only before a last user turn
            assert system.strip()[:40] in text, (family, env_id)


@pytest.mark.parametrize("family", NATIVE)
def test_a_template_that_renders_tools_natively_is_left_as_it_is(family, tokenizers) -> None:
    tokenizer = tokenizers[family]
    messages, specs = _opening("ToolUseGame-v0")
    conversation = _conversation(messages, specs)
    theirs = tokenizer.apply_chat_template(
        short_call_ids(conversation) if family == "mistral_v03" else conversation,
        tools=specs,
        tokenize=False,
        add_generation_prompt=True,
    )
    assert _render(tokenizer, conversation, specs) == theirs
    if family == "mistral_v03":  # the ids the hermes format writes: refused by the template
        with pytest.raises(Exception, match="length 9"):
            tokenizer.apply_chat_template(conversation, tools=specs, tokenize=False)


@pytest.mark.parametrize("family", ["gemma2", "mistral_v01", "phi3"])
def test_without_a_system_role_the_tools_head_the_first_user_message(family, tokenizers) -> None:
    messages, specs = _opening("ToolUseGame-v0")
    text = _render(tokenizers[family], _conversation(messages, specs), specs)
    first_user = {"gemma2": "<start_of_turn>user\n", "mistral_v01": "[INST] ", "phi3": "<|user|>\n"}
    head = text.split(first_user[family], 1)[1]
    assert head.startswith(messages[0]["content"].strip()[:40])  # the system text, then tools
    assert head.index("<tools>") < head.index(messages[1]["content"][:30])


@pytest.mark.parametrize("family", ["gemma2", "mistral_v01", "llama2"])
def test_an_env_reply_of_a_tool_result_and_a_user_message_is_one_user_turn(
    family, tokenizers
) -> None:
    messages, specs = _opening("ToolUseGame-v0")
    text = _render(tokenizers[family], _conversation(messages, specs), specs)
    result = f"<tool_response>\n{RESULT}\n</tool_response>\n\nGo on."
    assert result in text


def test_a_template_without_alternation_keeps_turns_apart(tokenizers) -> None:
    """SmolLM2's template takes turns of one role in a row: nothing is merged."""
    messages, specs = _opening("ToolUseGame-v0")
    text = _render(tokenizers["smollm2"], _conversation(messages, specs), specs)
    assert f"{RESULT}\n</tool_response><|im_end|>\n<|im_start|>user\nGo on." in text


def test_a_conversation_without_tools_is_fitted_to_a_template_without_a_system_role(
    tokenizers,
) -> None:
    conversation = [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Hi."},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "A"},
        {"role": "user", "content": "B"},
    ]
    text = _render(tokenizers["gemma2"], conversation, None)
    assert "<start_of_turn>user\nAnswer briefly.\n\nHi.<end_of_turn>" in text
    assert "<start_of_turn>user\nA\n\nB<end_of_turn>" in text
    plain = conversation[1:3]  # nothing to fit: as the template renders it
    assert _render(tokenizers["gemma2"], plain, None) == tokenizers["gemma2"].apply_chat_template(
        plain, tokenize=False, add_generation_prompt=True
    )


def test_a_probe_fails_only_on_the_templates_own_errors(tokenizers) -> None:
    """``raise_exception`` (Jinja's TemplateError) tells the probe "not supported"; any other
    error is raised, so a template is never classed by an accident."""
    tokenizer = copy.deepcopy(tokenizers["smollm2"])
    tokenizer.chat_template = "{% for m in messages %}{{ m.content + 1 }}{% endfor %}"
    with pytest.raises(TypeError):
        template_support(tokenizer)
    tokenizer.chat_template = "{{ raise_exception('no') }}"
    assert template_support(tokenizer) == TemplateSupport(
        tools=False, tool_role=False, system=False, alternates=True
    )


def test_probe_ids_are_nine_alphanumerics() -> None:
    assert len(PROBE_CALL_ID) == 9 and PROBE_CALL_ID.isalnum()
    calls = [{"id": CALL_ID, "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    short = short_call_ids(
        [
            {"role": "assistant", "content": "", "tool_calls": calls},
            {"role": "tool", "tool_call_id": CALL_ID, "content": "1"},
            {"role": "tool", "tool_call_id": PROBE_CALL_ID, "content": "2"},
        ]
    )
    assert short[0]["tool_calls"][0]["id"] == short[1]["tool_call_id"]  # still paired
    assert len(short[1]["tool_call_id"]) == 9 and short[1]["tool_call_id"].isalnum()
    assert short[2]["tool_call_id"] == PROBE_CALL_ID and calls[0]["id"] == CALL_ID
