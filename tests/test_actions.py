"""Tests for llm_gym.actions: parsing, rendering, round trips, fuzzing and the registry."""

from __future__ import annotations

import json
import math
import re
import time
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llm_gym.actions import (
    ACTION_FORMATS,
    MAX_TOOL_CALLS,
    ActionFormat,
    HermesFormat,
    JsonFormat,
    ParsedAction,
    ParseKind,
    get_action_format,
    register_action_format,
)
from llm_gym.core.types import Message, ToolCall, ToolSpec
from llm_gym.errors import InvalidArgumentError, UnknownNameError

HERMES = HermesFormat()
JSON = JsonFormat()
FORMATS = [HERMES, JSON]
MB = 1_000_000
FAST_S = 2.0  # generous bound for "linear time" checks on ~1 MB inputs
RANDOM_ID = re.compile(r"call_[0-9a-f]{12}_\d+")


def block(obj: Any) -> str:
    """A hermes tool-call block around ``obj`` (a JSON string is used as it is)."""
    body = obj if isinstance(obj, str) else json.dumps(obj)
    return f"<tool_call>\n{body}\n</tool_call>"


def make_call(name: str, arguments: dict[str, Any], call_id: str = "c") -> ToolCall:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


def names_and_args(parsed: ParsedAction) -> list[tuple[str, dict[str, Any]]]:
    return [
        (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed.tool_calls
    ]


def check_invariants(parsed: ParsedAction) -> None:
    """What every parse result must satisfy, whatever the input."""
    assert isinstance(parsed, ParsedAction)
    message = parsed.message
    assert message["role"] == "assistant"
    assert isinstance(message["content"], str)
    if parsed.kind is ParseKind.TOOL_CALLS:
        calls = message["tool_calls"]
        assert 1 <= len(calls) <= MAX_TOOL_CALLS
        assert len({c["id"] for c in calls}) == len(calls)
        for call in calls:
            assert call["type"] == "function"
            assert isinstance(call["function"]["name"], str) and call["function"]["name"].strip()
            assert isinstance(json.loads(call["function"]["arguments"]), dict)
            call["function"]["arguments"].encode("utf-8")
        assert parsed.error is None
    else:
        assert "tool_calls" not in message
        assert parsed.tool_calls == []
    if parsed.kind is ParseKind.PARSE_FAILURE:
        assert isinstance(parsed.error, str) and parsed.error
    else:
        assert parsed.error is None


def timed_parse(fmt: ActionFormat, text: str) -> ParsedAction:
    start = time.perf_counter()
    parsed = fmt.parse(text)
    assert time.perf_counter() - start < FAST_S
    check_invariants(parsed)
    return parsed


# ---------------------------------------------------------------------------------------------
# hermes: parsing
# ---------------------------------------------------------------------------------------------


def test_hermes_plain_text_is_final_answer_unchanged() -> None:
    text = "  The answer is 42.\n"
    parsed = HERMES.parse(text)
    assert parsed.kind is ParseKind.FINAL_ANSWER and parsed.is_final
    assert parsed.message == {"role": "assistant", "content": text}
    assert parsed.tool_calls == [] and parsed.error is None


def test_hermes_single_call() -> None:
    parsed = HERMES.parse(block({"name": "search", "arguments": {"q": "Paris"}}))
    check_invariants(parsed)
    assert parsed.is_tool_calls and not parsed.is_final and not parsed.is_failure
    assert parsed.message["content"] == ""
    assert names_and_args(parsed) == [("search", {"q": "Paris"})]
    (call,) = parsed.tool_calls
    assert call["type"] == "function" and RANDOM_ID.fullmatch(call["id"])


def test_hermes_several_calls_with_prefix_ids() -> None:
    text = "\n".join(block({"name": f"f{i}", "arguments": {"i": i}}) for i in range(3))
    parsed = HERMES.parse(text, call_id_prefix="call_t3")
    check_invariants(parsed)
    assert [c["id"] for c in parsed.tool_calls] == ["call_t3_0", "call_t3_1", "call_t3_2"]
    assert names_and_args(parsed) == [("f0", {"i": 0}), ("f1", {"i": 1}), ("f2", {"i": 2})]


def test_hermes_content_around_calls_is_kept_stripped() -> None:
    text = (
        "Let me check.\n"
        + block({"name": "a", "arguments": {}})
        + "\nand\n"
        + block({"name": "b", "arguments": {}})
        + "\nDone.  "
    )
    parsed = HERMES.parse(text)
    assert parsed.is_tool_calls
    assert parsed.message["content"] == "Let me check.\n\nand\n\nDone."


def test_hermes_tight_tags_and_whitespace() -> None:
    parsed = HERMES.parse('<tool_call>  {"name":"f","arguments":{"x":1}}\t\n\n</tool_call>')
    assert names_and_args(parsed) == [("f", {"x": 1})]


def test_hermes_arguments_as_json_string() -> None:
    parsed = HERMES.parse(block({"name": "f", "arguments": json.dumps({"a": [1, 2]})}))
    assert names_and_args(parsed) == [("f", {"a": [1, 2]})]


def test_hermes_missing_arguments_means_empty_object() -> None:
    parsed = HERMES.parse(block({"name": "now"}))
    assert parsed.tool_calls[0]["function"]["arguments"] == "{}"


def test_hermes_extra_keys_are_ignored() -> None:
    parsed = HERMES.parse(block({"name": "f", "arguments": {}, "id": "x", "type": "function"}))
    assert names_and_args(parsed) == [("f", {})]


def test_hermes_raw_newline_inside_json_string_is_tolerated() -> None:
    parsed = HERMES.parse('<tool_call>{"name": "write", "arguments": {"s": "a\nb"}}</tool_call>')
    assert names_and_args(parsed) == [("write", {"s": "a\nb"})]


def test_hermes_nan_arguments_round_trip_through_json() -> None:
    parsed = HERMES.parse('<tool_call>{"name": "f", "arguments": {"x": NaN}}</tool_call>')
    assert parsed.is_tool_calls
    assert math.isnan(json.loads(parsed.tool_calls[0]["function"]["arguments"])["x"])


def test_hermes_exactly_max_tool_calls_is_fine() -> None:
    text = "".join(block({"name": "f"}) for _ in range(MAX_TOOL_CALLS))
    assert len(HERMES.parse(text).tool_calls) == MAX_TOOL_CALLS


GOOD = {"name": "f", "arguments": {}}

HERMES_FAILURES = [
    ("<tool_call>" + json.dumps(GOOD), "unclosed <tool_call> tag"),
    (block(GOOD) + "\n<tool_call>\n{", "unclosed <tool_call> tag (tool call 2)"),
    ("all done </tool_call>", "stray </tool_call>"),
    ("</tool_call>" + block(GOOD), "stray </tool_call>"),
    (block(GOOD) + "</tool_call>", "stray </tool_call>"),
    ("<tool_call>\n<tool_call>" + json.dumps(GOOD) + "</tool_call>", "nested <tool_call>"),
    (
        block(GOOD) + block('{"name": "f" "arguments": {}}'),
        "invalid JSON in tool call 2: Expecting ',' delimiter at char 13",
    ),
    (block("not json"), "invalid JSON in tool call 1: Expecting value at char 0"),
    (block(GOOD)[:-1], "unclosed <tool_call> tag"),
    (block(""), "tool call 1 is empty"),
    (block("[1, 2]"), "tool call 1 must be a JSON object, got array"),
    (block('"f"'), "tool call 1 must be a JSON object, got string"),
    (block({"arguments": {}}), "tool call 1 has no string 'name'"),
    (block({"name": 3}), "tool call 1 has no string 'name'"),
    (block({"name": None}), "tool call 1 has no string 'name'"),
    (block({"name": ""}), "'name' of tool call 1 is empty"),
    (block({"name": " \n"}), "'name' of tool call 1 is empty"),
    (block({"name": "f", "arguments": [1]}), "'arguments' of tool call 1 must be a JSON object"),
    (block({"name": "f", "arguments": None}), "must be a JSON object, got null"),
    (block({"name": "f", "arguments": 3}), "must be a JSON object, got number"),
    (block({"name": "f", "arguments": "[1]"}), "got a string holding array"),
    (block({"name": "f", "arguments": "{oops"}), "is a string that is not valid JSON"),
    ("".join(block(GOOD) for _ in range(MAX_TOOL_CALLS + 1)), "too many tool calls"),
    (block('{"name": "f", "arguments": {"n": ' + "1" * 5000 + "}}"), "invalid JSON"),
]


@pytest.mark.parametrize(("text", "reason"), HERMES_FAILURES)
def test_hermes_failures(text: str, reason: str) -> None:
    parsed = HERMES.parse(text)
    check_invariants(parsed)
    assert parsed.kind is ParseKind.PARSE_FAILURE and parsed.is_failure
    assert parsed.message == {"role": "assistant", "content": text}
    assert reason in parsed.error


def test_hermes_one_megabyte_plain_text_is_final() -> None:
    text = "lorem ipsum < tool_call > " * (MB // 26)
    parsed = timed_parse(HERMES, text)
    assert parsed.is_final and parsed.message["content"] == text


@pytest.mark.parametrize(
    "text",
    [
        "<tool_call>" + "x" * MB + "</tool_call>",
        '<tool_call>{"name": "' + "a" * MB + "</tool_call>",
        '<tool_call>{"name": "f", "arguments": {"s": "' + "\\n" * (MB // 2) + "}}</tool_call>",
        "<tool_call>" * (MB // 11),
        "</tool_call>" * (MB // 12),
        block(GOOD) * (MB // 40),
        "<tool_call" * (MB // 10) + "</tool_call>",
        "<tool_call>" + "[" * 100_000 + "</tool_call>",
        '<tool_call>{"name": "f", "arguments": ' + "[" * 100_000 + "</tool_call>",
        '<tool_call>{"name": "f", "arguments": "' + "[" * 100_000 + '"}</tool_call>',
    ],
    ids=[
        "garbage",
        "open-string",
        "escapes",
        "opens",
        "closes",
        "many-calls",
        "partial-tags",
        "deep-block",
        "deep-args",
        "deep-args-string",
    ],
)
def test_hermes_huge_or_deep_tool_call_fails_fast(text: str) -> None:
    parsed = timed_parse(HERMES, text)
    assert parsed.is_failure


def test_hermes_deep_nesting_reason() -> None:
    parsed = HERMES.parse("<tool_call>" + "[" * 100_000 + "</tool_call>")
    assert parsed.error == "invalid JSON in tool call 1: nested too deeply"


def test_hermes_lone_surrogates() -> None:
    text = "\ud800 plain \udfff"
    assert HERMES.parse(text).message["content"] == text
    raw = '<tool_call>{"name": "f\ud800", "arguments": {"s": "\udfff", "e": "\\ud800"}}</tool_call>'
    parsed = HERMES.parse("x\udc00 " + raw)
    check_invariants(parsed)
    assert parsed.message["content"] == "x\udc00"
    # Decoded names and arguments are valid text: surrogates become U+FFFD.
    assert names_and_args(parsed) == [("f\ufffd", {"s": "\ufffd", "e": "\ufffd"})]
    rendered = HERMES.render_message(parsed.message)
    assert rendered.startswith("x\udc00\n<tool_call>")  # content is written as it is
    rendered.removeprefix("x\udc00").encode("utf-8")  # surrogates inside the JSON are escaped
    assert names_and_args(HERMES.parse(rendered)) == names_and_args(parsed)
    assert HERMES.parse("<tool_call>\ud800</tool_call>").is_failure


def test_random_ids_are_unique_across_parses() -> None:
    text = block(GOOD) + block(GOOD)
    ids = [c["id"] for _ in range(1000) for c in HERMES.parse(text).tool_calls]
    assert len(set(ids)) == 2000
    assert all(RANDOM_ID.fullmatch(i) for i in ids)


def test_parse_rejects_non_str() -> None:
    for fmt in FORMATS:
        with pytest.raises(InvalidArgumentError):
            fmt.parse(b"bytes")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# hermes: rendering
# ---------------------------------------------------------------------------------------------


def test_hermes_render_tool_calls() -> None:
    calls = [make_call("search", {"q": "Paris"}), make_call("now", {})]
    assert HERMES.render_tool_calls(calls) == (
        '<tool_call>\n{"name": "search", "arguments": {"q": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>'
    )
    with_content = HERMES.render_tool_calls(calls[:1], "Let me look.")
    assert with_content.startswith("Let me look.\n<tool_call>\n")
    assert HERMES.parse(with_content).message["content"] == "Let me look."


def test_hermes_render_escapes_markup() -> None:
    args = {"html": "</tool_call><tool_call>&amp;", "ünï": "日本"}
    rendered = HERMES.render_tool_calls([make_call("a<b>", args)])
    body = rendered.split("\n")[1]
    assert "<" not in body and ">" not in body and "&" not in body
    assert "\\u003c/tool_call\\u003e" in body and "日本" in body  # non-ASCII stays readable
    assert names_and_args(HERMES.parse(rendered)) == [("a<b>", args)]


def test_render_tool_calls_accepts_empty_or_mapping_arguments() -> None:
    call: Any = {"id": "x", "type": "function", "function": {"name": "f", "arguments": ""}}
    assert '"arguments": {}' in HERMES.render_tool_calls([call])
    call["function"]["arguments"] = {"a": 1}
    assert '"arguments": {"a": 1}' in JSON.render_tool_calls([call])


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
@pytest.mark.parametrize(
    "call",
    [
        {"id": "x", "type": "function", "function": {"name": "f", "arguments": "{bad"}},
        {"id": "x", "type": "function", "function": {"name": "f", "arguments": "[1]"}},
        {"id": "x", "type": "function", "function": {"name": "", "arguments": "{}"}},
        {"id": "x", "type": "function"},
        "not a call",
    ],
)
def test_render_tool_calls_rejects_malformed_calls(fmt: ActionFormat, call: Any) -> None:
    with pytest.raises(InvalidArgumentError):
        fmt.render_tool_calls([call])


SPECS: list[ToolSpec] = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the web.",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        },
    },
    {"type": "function", "function": {"name": "now", "description": "Current time."}},
]


def test_hermes_render_tool_specs() -> None:
    assert HERMES.render_tool_specs([]) == ""
    text = HERMES.render_tool_specs(SPECS)
    expected_tools = "<tools>\n" + "\n".join(json.dumps(s) for s in SPECS) + "\n</tools>"
    assert text.startswith(
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    )
    assert expected_tools in text
    assert (
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    ) in text
    assert "final answer" in text


def test_hermes_render_tool_result_and_message() -> None:
    tool_msg: Message = {"role": "tool", "tool_call_id": "c0", "name": "f", "content": "42"}
    assert HERMES.render_tool_result(tool_msg) == "<tool_response>\n42\n</tool_response>"
    assistant: Message = {"role": "assistant", "content": "hi"}
    assert HERMES.render_message(assistant) == "hi"
    assistant_calls: Message = {
        "role": "assistant",
        "content": "ok",
        "tool_calls": [make_call("f", {"a": 1})],
    }
    assert HERMES.render_message(assistant_calls) == HERMES.render_tool_calls(
        assistant_calls["tool_calls"], "ok"
    )
    for fmt in FORMATS:
        with pytest.raises(InvalidArgumentError):
            fmt.render_tool_result(assistant)
        with pytest.raises(InvalidArgumentError):
            fmt.render_message(tool_msg)


# ---------------------------------------------------------------------------------------------
# json format
# ---------------------------------------------------------------------------------------------


def test_json_plain_text_is_final_answer_unchanged() -> None:
    for text in ["  Paris.\n", "", "The set {1, 2}", "```python\nprint(1)\n```", "```"]:
        parsed = JSON.parse(text)
        assert parsed.is_final and parsed.message == {"role": "assistant", "content": text}


def test_json_single_call() -> None:
    parsed = JSON.parse('  {"name": "search", "arguments": {"q": "Paris"}}\n')
    check_invariants(parsed)
    assert parsed.is_tool_calls and parsed.message["content"] == ""
    assert names_and_args(parsed) == [("search", {"q": "Paris"})]


def test_json_list_of_calls_with_prefix_ids() -> None:
    text = json.dumps([{"name": "a", "arguments": {"x": 1}}, {"name": "b"}])
    parsed = JSON.parse(text, call_id_prefix="call_t0")
    assert [c["id"] for c in parsed.tool_calls] == ["call_t0_0", "call_t0_1"]
    assert names_and_args(parsed) == [("a", {"x": 1}), ("b", {})]


@pytest.mark.parametrize("fence", ["```json\n{}\n```", "```\n{}\n```", "```JSON \n{}\n```  "])
def test_json_code_fences_are_removed(fence: str) -> None:
    text = fence.replace("{}", json.dumps({"name": "f", "arguments": '{"a": 2}'}))
    assert names_and_args(JSON.parse(text)) == [("f", {"a": 2})]


@pytest.mark.parametrize(
    ("text", "content"),
    [
        ('{"answer": "Paris"}', "Paris"),
        ('{"final_answer": 42}', "42"),
        ('```json\n{"answer": {"a": "日"}}\n```', '{"a": "日"}'),
    ],
)
def test_json_answer_object_is_final(text: str, content: str) -> None:
    parsed = JSON.parse(text)
    assert parsed.is_final and parsed.message["content"] == content


JSON_FAILURES = [
    ("{oops", "invalid JSON: Expecting property name enclosed in double quotes at char 1"),
    ('{"name": "f"} trailing', "invalid JSON: Extra data"),
    ("[]", "empty list of tool calls"),
    ("[1]", "tool call 1 must be a JSON object, got number"),
    ('[{"name": "f"}, "g"]', "tool call 2 must be a JSON object, got string"),
    ('{"answer": 1, "more": 2}', "tool call 1 has no string 'name'"),
    ('{"arguments": {}}', "tool call 1 has no string 'name'"),
    ('{"name": ""}', "'name' of tool call 1 is empty"),
    ('{"name": "f", "arguments": [1]}', "'arguments' of tool call 1 must be a JSON object"),
    ('{"name": "f", "arguments": "1"}', "got a string holding number"),
    (json.dumps([GOOD] * (MAX_TOOL_CALLS + 1)), "too many tool calls"),
    ("[" * 100_000, "invalid JSON: nested too deeply"),
    ('```json\n{"name": \n```', "invalid JSON"),
]


@pytest.mark.parametrize(("text", "reason"), JSON_FAILURES)
def test_json_failures(text: str, reason: str) -> None:
    parsed = JSON.parse(text)
    check_invariants(parsed)
    assert parsed.is_failure and parsed.message["content"] == text
    assert reason in parsed.error


def test_json_huge_inputs_are_fast() -> None:
    plain = "word " * (MB // 5)
    assert timed_parse(JSON, plain).message["content"] == plain
    assert timed_parse(JSON, '{"name": "' + "a" * MB).is_failure
    assert timed_parse(JSON, "[" * MB).is_failure
    assert timed_parse(JSON, json.dumps([GOOD] * 100_000)).is_failure  # too many calls


def test_json_lone_surrogates() -> None:
    assert JSON.parse("\ud800").message["content"] == "\ud800"
    parsed = JSON.parse('{"name": "f\udfff", "arguments": {"s": "\ud800", "e": "\\udc00"}}')
    check_invariants(parsed)
    assert names_and_args(parsed) == [("f\ufffd", {"s": "\ufffd", "e": "\ufffd"})]
    rendered = JSON.render_message(parsed.message)
    rendered.encode("utf-8")
    assert names_and_args(JSON.parse(rendered)) == names_and_args(parsed)
    assert JSON.parse("{\ud800").is_failure


def test_json_render_tool_calls() -> None:
    one = JSON.render_tool_calls([make_call("f", {"a": "日"})], content="dropped")
    assert one == '{"name": "f", "arguments": {"a": "日"}}'
    two = JSON.render_tool_calls([make_call("f", {}), make_call("g", {"b": None})])
    assert json.loads(two) == [
        {"name": "f", "arguments": {}},
        {"name": "g", "arguments": {"b": None}},
    ]
    with pytest.raises(InvalidArgumentError):
        JSON.render_tool_calls([])


def test_json_render_tool_specs_and_result() -> None:
    assert JSON.render_tool_specs([]) == ""
    text = JSON.render_tool_specs(SPECS)
    for spec in SPECS:
        assert json.dumps(spec) in text
    assert '{"name": <function-name>, "arguments": <args-json-object>}' in text
    result = JSON.render_tool_result(
        {"role": "tool", "tool_call_id": "c0", "name": "f", "content": "4\ud8002"}
    )
    result.encode("utf-8")
    assert json.loads(result) == {"tool_call_id": "c0", "name": "f", "content": "4\ud8002"}
    assert json.loads(JSON.render_tool_result({"role": "tool", "content": "x"})) == {"content": "x"}


# ---------------------------------------------------------------------------------------------
# ParsedAction
# ---------------------------------------------------------------------------------------------


def test_parsed_action_invariants_are_enforced() -> None:
    ok: Message = {"role": "assistant", "content": ""}
    with pytest.raises(InvalidArgumentError):
        ParsedAction(ParseKind.TOOL_CALLS, ok)
    with pytest.raises(InvalidArgumentError):
        ParsedAction(ParseKind.PARSE_FAILURE, ok)
    with pytest.raises(InvalidArgumentError):
        ParsedAction(ParseKind.FINAL_ANSWER, ok, error="x")
    with pytest.raises(InvalidArgumentError):
        ParsedAction(ParseKind.FINAL_ANSWER, {"role": "user", "content": ""})
    assert ParsedAction(ParseKind.FINAL_ANSWER, ok).is_final
    assert ParseKind("tool_calls") is ParseKind.TOOL_CALLS and ParseKind.TOOL_CALLS == "tool_calls"


# ---------------------------------------------------------------------------------------------
# registry
# ---------------------------------------------------------------------------------------------


def test_get_action_format_by_name_and_instance() -> None:
    assert isinstance(get_action_format("hermes"), HermesFormat)
    assert isinstance(get_action_format("json"), JsonFormat)
    assert get_action_format(HERMES) is HERMES
    assert ACTION_FORMATS["hermes"] is HermesFormat and ACTION_FORMATS["json"] is JsonFormat


@pytest.mark.parametrize(
    ("name", "suggestion"),
    [("hermse", "hermes"), ("Hermes", "hermes"), ("jsonn", "json"), ("qwen-xml-zzz", None)],
)
def test_get_action_format_unknown_name(name: str, suggestion: str | None) -> None:
    with pytest.raises(UnknownNameError) as info:
        get_action_format(name)
    message = str(info.value)
    assert repr(name) in message and "'hermes'" in message and "'json'" in message
    if suggestion is None:
        assert "Did you mean" not in message
    else:
        assert f"Did you mean {suggestion!r}?" in message
    assert isinstance(info.value, KeyError)


def test_get_action_format_wrong_type() -> None:
    with pytest.raises(InvalidArgumentError):
        get_action_format(3)  # type: ignore[arg-type]


def test_register_action_format() -> None:
    class EchoFormat(HermesFormat):
        name: ClassVar[str] = "test-echo"

    try:
        assert register_action_format(EchoFormat) is EchoFormat
        assert register_action_format(EchoFormat) is EchoFormat  # idempotent
        assert isinstance(get_action_format("test-echo"), EchoFormat)

        class Other(HermesFormat):
            name: ClassVar[str] = "test-echo"

        with pytest.raises(InvalidArgumentError, match="already taken"):
            register_action_format(Other)
        with pytest.raises(InvalidArgumentError, match="already taken"):
            register_action_format(type("Hermes2", (HermesFormat,), {"name": "hermes"}))
    finally:
        ACTION_FORMATS.pop("test-echo", None)

    class NoName(HermesFormat):
        pass

    with pytest.raises(InvalidArgumentError):
        register_action_format(NoName)
    with pytest.raises(InvalidArgumentError):
        register_action_format(dict)  # type: ignore[type-var]
    assert ACTION_FORMATS["hermes"] is HermesFormat


# ---------------------------------------------------------------------------------------------
# fuzzing
# ---------------------------------------------------------------------------------------------

ALL_CHARS = st.characters(exclude_categories=())  # includes lone surrogates
FRAGMENTS = [
    "<tool_call>",
    "</tool_call>",
    "<tool_call>\n",
    "\n</tool_call>",
    "<tool_call",
    "{",
    "}",
    "[",
    "]",
    '"name"',
    '"arguments"',
    '"answer"',
    ":",
    ", ",
    '"f"',
    '"',
    "\\",
    "\\u",
    "\\ud800",
    "\ud800",
    "\n",
    " ",
    "```",
    "```json\n",
    "NaN",
    "-Infinity",
    "1e999",
    "null",
    "true",
    "0",
    '{"name": "f", "arguments": ',
    block(GOOD),
    json.dumps(GOOD),
]
JSON_FRAGMENTS = [
    json.dumps(GOOD),
    '{"name": ',
    '"arguments": ',
    '{"answer": ',
    '"f"',
    '"{}"',
    '"\\ud800"',
    "{}",
    "[]",
    "[",
    "]",
    "}",
    ", ",
    "null",
    "1",
    "\n```",
]
ANY_VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.text(alphabet=ALL_CHARS, max_size=4),
    st.sampled_from(["f", "{}", '{"a": 1}', "[1]", " ", "{"]),
    st.sampled_from([{}, [1], {"a": "\ud800"}, {"a": {"b": []}}]),
)
CALL_LIKE = st.fixed_dictionaries(
    {"name": st.just("f") | ANY_VALUE},
    optional={"arguments": st.just({"a": 1}) | ANY_VALUE, "answer": ANY_VALUE, "id": ANY_VALUE},
) | st.dictionaries(st.sampled_from(["arguments", "answer", "final_answer"]), ANY_VALUE, max_size=2)
WRAPPERS = [
    "{}",
    " {} ",
    "```json\n{}\n```",
    "<tool_call>\n{}\n</tool_call>",
    "x<tool_call>{}</tool_call>",
]
FUZZ_TEXT = st.one_of(
    st.text(alphabet=ALL_CHARS),
    st.lists(
        st.one_of(st.sampled_from(FRAGMENTS), st.text(alphabet=ALL_CHARS, max_size=4)),
        max_size=30,
    ).map("".join),
    # Mostly well-formed JSON replies, so the json format's tool-call paths get exercised too.
    st.tuples(
        st.sampled_from(["", "[", "```json\n", " ", "[" + json.dumps(GOOD) + ", "]),
        st.lists(
            st.one_of(st.sampled_from(JSON_FRAGMENTS), st.text(alphabet=ALL_CHARS, max_size=2)),
            max_size=8,
        ),
    ).map(lambda t: t[0] + "".join(t[1])),
    # Valid JSON with call-like keys and values of every type, in the formats' wrappings.
    st.tuples(CALL_LIKE | st.lists(CALL_LIKE, max_size=3), st.sampled_from(WRAPPERS)).map(
        lambda t: t[1].format(json.dumps(t[0], ensure_ascii=False))
    ),
)
FUZZ = settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(text=FUZZ_TEXT)
def test_fuzz_parse_never_raises(text: str) -> None:
    # One generated text serves every format: generation dominates the cost.
    for fmt in FORMATS:
        parsed = fmt.parse(text, call_id_prefix="p")
        check_invariants(parsed)
        assert parsed == fmt.parse(text, call_id_prefix="p"), fmt.name  # deterministic ids
        if parsed.is_tool_calls:
            rendered = fmt.render_message(parsed.message)
            assert names_and_args(fmt.parse(rendered)) == names_and_args(parsed), fmt.name


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=6,
)
ARGUMENTS = st.dictionaries(st.text(max_size=8), JSON_VALUES, max_size=3)
# Any unicode, '<', '>', quotes and newlines included; but the formats reject blank names.
NAMES = st.text(min_size=1, max_size=16).filter(lambda s: s.strip() != "")
CALLS = st.lists(st.tuples(NAMES, ARGUMENTS), min_size=1, max_size=4)
CONTENT = st.text().filter(lambda s: "<tool_call>" not in s and "</tool_call>" not in s)


@FUZZ
@given(calls=CALLS, content=CONTENT)
def test_fuzz_round_trip(calls: list[tuple[str, dict[str, Any]]], content: str) -> None:
    tool_calls = [make_call(name, args, f"id{i}") for i, (name, args) in enumerate(calls)]
    for fmt in FORMATS:  # one generated example serves every format
        text = fmt.render_tool_calls(tool_calls, content)
        parsed = fmt.parse(text, call_id_prefix="rt")
        check_invariants(parsed)
        assert parsed.kind is ParseKind.TOOL_CALLS, (fmt.name, parsed.error)
        assert names_and_args(parsed) == calls, fmt.name
        assert [c["id"] for c in parsed.tool_calls] == [f"rt_{i}" for i in range(len(calls))]
        expected_content = content.strip() if isinstance(fmt, HermesFormat) else ""
        assert parsed.message["content"] == expected_content, fmt.name
