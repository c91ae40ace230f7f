"""``POST /v1/responses`` bodies (``llm_gym.serving.responses_protocol``): the translation into
the chat request, and hostile bodies refused with a 400 naming the Responses field."""

from __future__ import annotations

import json
from typing import Any

import pytest

from llm_gym.serving.protocol import APIError, bad_request
from llm_gym.serving.responses_protocol import parse_responses_request, responses_error

CALL = {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": '{"key": "a"}'}
OUTPUT = {"type": "function_call_output", "call_id": "c1", "output": "42"}
TOOL = {
    "type": "function",
    "name": "lookup",
    "description": "Look a key up.",
    "parameters": {"type": "object", "properties": {"key": {"type": "string"}}},
    "strict": True,
}


def parse(**fields: Any) -> Any:
    return parse_responses_request({"model": "tiny", "input": "hi", **fields}, "tiny")


def refused(**fields: Any) -> APIError:
    with pytest.raises(APIError) as caught:
        parse(**fields)
    assert caught.value.status == 400, caught.value.message
    return caught.value


def test_a_string_input_and_instructions_are_the_conversation() -> None:
    request = parse(instructions="Be brief.", max_output_tokens=7, temperature=0, top_p=0.5)
    assert request.chat.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
    ]
    chat = request.chat
    assert (chat.max_tokens, chat.temperature, chat.top_p, chat.stream) == (7, 0.0, 0.5, False)
    assert request.settings["instructions"] == "Be brief." and request.settings["tools"] == []


def test_items_become_messages_tool_calls_and_tool_results() -> None:
    items = [
        {"role": "developer", "content": "Use tools."},  # the "easy" form: no type
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a?"}]},
        {
            "type": "message",
            "role": "assistant",
            "id": "msg_1",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Checking.", "annotations": []}],
        },
        CALL,
        {**CALL, "call_id": "c2", "arguments": "{}"},
        {"type": "reasoning", "id": "rs_1", "summary": []},  # skipped
        OUTPUT,
        {
            "type": "function_call_output",
            "call_id": "c2",
            "output": [{"type": "input_text", "text": "7"}],
        },
    ]
    request = parse(input=items, tools=[TOOL])
    assert request.chat.messages == [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "a?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "lookup", "arguments": {"key": "a"}},
                },
                {"id": "c2", "type": "function", "function": {"name": "lookup", "arguments": {}}},
            ],
        },
        {"role": "tool", "content": "42", "tool_call_id": "c1", "name": "lookup"},
        {"role": "tool", "content": "7", "tool_call_id": "c2", "name": "lookup"},
    ]
    assert request.chat.tools == [
        {
            "type": "function",
            "function": {k: v for k, v in TOOL.items() if k != "type"},
        }
    ]
    assert request.chat.parse_tool_calls
    assert request.settings["tools"] == [TOOL]
    assert request.settings["tool_choice"] == "auto" and request.settings["parallel_tool_calls"]


def test_text_format_and_tool_choice_reach_the_chat_path_in_its_own_form(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[dict[str, Any]] = []

    def fake(body: dict[str, Any], model_name: str, allowed: Any) -> str:
        seen.append(body)
        return "parsed"

    monkeypatch.setattr("llm_gym.serving.responses_protocol.parse_chat_request", fake)
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}}
    fmt = {"type": "json_schema", "name": "out", "schema": schema, "strict": True}
    request = parse(
        tools=[TOOL],
        tool_choice={"type": "function", "name": "lookup"},
        parallel_tool_calls=False,
        text={"format": fmt},
        seed=3,
        stream=True,
    )
    [body] = seen
    assert request.chat == "parsed" and request.stream
    assert body["tool_choice"] == {"type": "function", "function": {"name": "lookup"}}
    assert body["parallel_tool_calls"] is False
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "out", "schema": schema, "strict": True},
    }
    assert body["seed"] == 3 and body["stream_options"] == {"include_usage": True}
    assert request.settings["text"]["format"] == fmt
    assert request.settings["parallel_tool_calls"] is False
    for kind in ("json_object", "text"):
        seen.clear()
        parse(text={"format": {"type": kind}})
        assert seen[0]["response_format"] == {"type": kind}


def test_logprobs_come_through_include() -> None:
    request = parse(include=["message.output_text.logprobs"], top_logprobs=3)
    assert request.chat.logprobs and request.chat.top_logprobs == 3
    assert not parse(include=["reasoning.encrypted_content"], top_logprobs=3).chat.logprobs


def test_fields_that_change_nothing_are_accepted() -> None:
    request = parse(
        store=False,
        metadata={"run": "7"},
        user="u",
        safety_identifier="s",
        service_tier="auto",
        prompt_cache_key="k",
        prompt_cache_retention="24h",
        max_tool_calls=3,
        truncation="disabled",
        background=False,
        reasoning={"effort": None},
        text={"verbosity": "medium"},
        stream=True,
        stream_options={"include_obfuscation": False},
    )
    assert request.settings["metadata"] == {"run": "7"} and request.settings["store"] is False


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id", "keeps no responses"),
        ({"conversation": "conv_1"}, "conversation", "keeps no responses"),
        ({"prompt": {"id": "pmpt_1"}}, "prompt", "keeps no responses"),
        ({"reasoning": {"effort": "high"}}, "reasoning", "not a reasoning model"),
        ({"truncation": "auto"}, "truncation", "would be ignored"),
        ({"background": True}, "background", "would be ignored"),
        ({"text": {"verbosity": "low"}}, "text.verbosity", "medium"),
        ({"text": {"format": {"type": "xml"}}}, "text.format.type", "json_schema"),
        (
            {"text": {"format": {"type": "json_schema", "name": "x"}}},
            "text.format.schema",
            "schema",
        ),
        ({"max_output_tokens": 0}, "max_output_tokens", ">= 1"),
        ({"temperature": 3}, "temperature", "[0, 2]"),
        ({"top_p": 0}, "top_p", "(0, 1]"),
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata", "16"),
        ({"metadata": {"k": 1}}, "metadata.k", "strings"),
        ({"service_tier": "gold"}, "service_tier", "auto"),
        ({"stream_options": {"include_obfuscation": False}}, "stream_options", "stream=true"),
        ({"stream": True, "stream_options": {"include_usage": True}}, "stream_options", "obfusc"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type", "built-in"),
        ({"tools": [{"type": "function"}]}, "tools[0].name", "name"),
        ({"tools": [{**TOOL, "parameters": "{}"}]}, "tools[0].parameters", "dict"),
        ({"tools": [{**TOOL, "defer_loading": True}]}, "tools[0].defer_loading", "tool search"),
        ({"tool_choice": {"type": "file_search"}}, "tool_choice", "'required'"),
        ({"tool_choice": {"type": "function"}}, "tool_choice.name", "name"),
        ({"instructions": ["x"]}, "instructions", "string"),
        ({"input": 5}, "input", "string or a list"),
        ({"input": []}, "input", "message"),
        ({"input": [None]}, "input[0]", "object"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type", "keeps no"),
        ({"input": [{"type": "computer_call"}]}, "input[0].type", "function_call_output"),
        ({"input": [{"type": "message", "role": "tool", "content": "x"}]}, "input[0].role", "user"),
        ({"input": [{"role": "user", "content": 5}]}, "input[0].content", "string"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input[0].content[0].type",
            "text only",
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "input_text", "text": 5}]}]},
            "input[0].content[0].text",
            "string",
        ),
        ({"input": [{**CALL, "call_id": ""}, OUTPUT]}, "input[0].call_id", "required"),
        ({"input": [{**CALL, "name": None}, OUTPUT]}, "input[0].name", "required"),
        ({"input": [{**CALL, "arguments": {"key": "a"}}, OUTPUT]}, "input[0].arguments", "JSON"),
        ({"input": [CALL, CALL, OUTPUT]}, "input[1].call_id", "earlier function_call"),
        ({"input": [OUTPUT]}, "input[0].call_id", "no function_call earlier"),
        ({"input": [OUTPUT, CALL]}, "input[0].call_id", "no function_call earlier"),
        ({"input": [CALL, OUTPUT, OUTPUT]}, "input[2].call_id", "earlier function_call_output"),
        ({"input": [CALL]}, "input[0].call_id", "no function_call_output"),
        ({"input": [CALL, {**OUTPUT, "output": 42}]}, "input[1].output", "string"),
        ({"input": [CALL, {**OUTPUT, "call_id": None}]}, "input[1].call_id", "required"),
        ({"model": "gpt-4o", "input": [None]}, "model", "does not exist"),
        ({"model": None}, "model", "required"),
        ({"logit_bias": {"1": 5}}, "logit_bias", "would be ignored"),
        ({"top_k": 5}, "top_k", "would be ignored"),
    ],
)
def test_hostile_bodies_are_400s_naming_the_field(
    fields: dict[str, Any], param: str, words: str
) -> None:
    with pytest.raises(APIError) as caught:
        parse(**fields)
    error = caught.value
    assert error.status == (404 if "does not exist" in words else 400), error.message
    assert error.param == param, error.message
    assert words in error.message


def test_chat_path_refusals_name_the_responses_fields() -> None:
    assert refused(tools=[TOOL], tool_choice="bogus").param == "tool_choice"
    error = responses_error(
        bad_request("'response_format' must be text", "response_format.json_schema.schema")
    )
    assert error.param == "text.format.schema" and "'text.format'" in error.message
    assert (
        responses_error(bad_request("x", "tools[2].function.parameters")).param
        == "tools[2].parameters"
    )
    assert responses_error(bad_request("x", "messages[3].content")).param == "input"
    error = responses_error(
        bad_request("'max_completion_tokens' must be >= 1", "max_completion_tokens")
    )
    assert error.param == "max_output_tokens" and "'max_output_tokens'" in error.message


def test_a_huge_input_is_parsed_in_linear_time() -> None:
    import time

    items: list[dict[str, Any]] = []
    for i in range(20_000):
        items += [{**CALL, "call_id": f"c{i}"}, {**OUTPUT, "call_id": f"c{i}"}]
    start = time.monotonic()
    request = parse(input=items)
    assert len(request.chat.messages) == 40_000
    assert time.monotonic() - start < 5
    json.dumps(request.settings)  # the echoed settings are JSON


def test_an_empty_tools_list_is_no_tools() -> None:
    """The Responses API takes ``tools: []`` (the Agents SDK sends it for an agent without
    tools); the chat path, which refuses an empty list as OpenAI's chat endpoint does, gets none."""
    request = parse(tools=[])
    assert request.chat.tools is None and not request.chat.parse_tool_calls
    assert request.settings["tools"] == []
