"""The model families' action formats (llama3_json, mistral, qwen3_coder, harmony): parsing,
rendering, round trips, hostile inputs, template signatures and the registry."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llm_gym.actions import (
    ACTION_FORMATS,
    MAX_TOOL_CALLS,
    ActionFormat,
    HarmonyFormat,
    Llama3JsonFormat,
    MistralFormat,
    ParsedAction,
    ParseKind,
    Qwen3CoderFormat,
    get_action_format,
)
from llm_gym.actions.codec import short_call_id
from llm_gym.actions.qwen3_coder import parameter_value
from llm_gym.core.types import ToolCall, ToolSpec
from llm_gym.errors import InvalidArgumentError

LLAMA = Llama3JsonFormat()
MISTRAL = MistralFormat()
QWEN = Qwen3CoderFormat()
HARMONY = HarmonyFormat()
FAMILIES: list[ActionFormat] = [LLAMA, MISTRAL, QWEN, HARMONY]
MB = 1_000_000
FAST_S = 2.0  # generous bound for "linear time" checks on ~1 MB inputs


def call(name: str, arguments: dict[str, Any], call_id: str = "c") -> ToolCall:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


def names_and_args(parsed: ParsedAction) -> list[tuple[str, dict[str, Any]]]:
    return [
        (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed.tool_calls
    ]


def check(parsed: ParsedAction) -> ParsedAction:
    """What every parse result must satisfy, whatever the input."""
    assert isinstance(parsed, ParsedAction)
    assert parsed.message["role"] == "assistant" and isinstance(parsed.message["content"], str)
    if parsed.is_tool_calls:
        calls = parsed.message["tool_calls"]
        assert 1 <= len(calls) <= MAX_TOOL_CALLS
        assert len({c["id"] for c in calls}) == len(calls)
        for c in calls:
            assert c["function"]["name"].strip()
            assert isinstance(json.loads(c["function"]["arguments"]), dict)
    assert (parsed.error is not None) == parsed.is_failure
    return parsed


def timed(fmt: ActionFormat, text: str) -> ParsedAction:
    start = time.perf_counter()
    parsed = fmt.parse(text)
    assert time.perf_counter() - start < FAST_S, fmt.name
    return check(parsed)


# ---------------------------------------------------------------------------------------------
# the registry and the shared interface
# ---------------------------------------------------------------------------------------------


def test_the_registry_lists_all_six_formats() -> None:
    expected = {"hermes", "json", "llama3_json", "mistral", "qwen3_coder", "harmony"}
    assert expected <= set(ACTION_FORMATS)
    for fmt in FAMILIES:
        assert type(get_action_format(fmt.name)) is type(fmt)


def test_formats_that_parse_without_tools_ignore_them() -> None:
    specs: list[ToolSpec] = [{"type": "function", "function": {"name": "f"}}]
    for name in ("hermes", "json", "llama3_json", "mistral", "harmony"):
        fmt = get_action_format(name)
        assert fmt.with_tool_specs(specs) is fmt
    bound = QWEN.with_tool_specs(specs)
    assert isinstance(bound, Qwen3CoderFormat) and bound is not QWEN and bound.name == QWEN.name


def test_parse_rejects_non_str() -> None:
    for fmt in FAMILIES:
        with pytest.raises(InvalidArgumentError):
            fmt.parse(b"bytes")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# hand-written replies in each family's own shape
# ---------------------------------------------------------------------------------------------

QWEN_TWO = (
    "Let me check.\n<tool_call>\n<function=search>\n<parameter=query>\nParis\n</parameter>\n"
    "</function>\n</tool_call>\n<tool_call>\n<function=now>\n</function>\n</tool_call>"
)
NATIVE = [
    (LLAMA, '{"name": "search", "parameters": {"query": "Paris"}}', "", 1),
    (LLAMA, '<|python_tag|>{"name": "search", "parameters": {"query": "Paris"}}', "", 1),
    (LLAMA, '{"name": "search", "arguments": {"query": "Paris"}}', "", 1),
    (
        LLAMA,
        '{"name": "search", "parameters": {"query": "Paris"}}; {"name": "now", "parameters": {}}',
        "",
        2,
    ),
    (
        LLAMA,
        '{"name": "search", "parameters": {"query": "Paris"}}\n{"name": "now", "parameters": {}}',
        "",
        2,
    ),
    (
        LLAMA,
        'Let me check.<|python_tag|>{"name": "search", "parameters": {"query": "Paris"}}',
        "Let me check.",
        1,
    ),
    (MISTRAL, '[TOOL_CALLS] [{"name": "search", "arguments": {"query": "Paris"}}]', "", 1),
    (
        MISTRAL,
        'Let me check.[TOOL_CALLS] [{"name": "search", "arguments": {"query": "Paris"}, '
        '"id": "abcDEF123"}, {"name": "now", "arguments": "{}"}]',
        "Let me check.",
        2,
    ),
    (MISTRAL, '[TOOL_CALLS]search{"query": "Paris"}[TOOL_CALLS]now{}', "", 2),
    (MISTRAL, '[TOOL_CALLS]search[ARGS]{"query": "Paris"}', "", 1),
    (MISTRAL, '[TOOL_CALLS]search[CALL_ID]a1b2c3d4e[ARGS]{"query": "Paris"}', "", 1),
    (QWEN, QWEN_TWO, "Let me check.", 2),
    (QWEN, "<function=search>\n<parameter=query>\nParis\n</parameter>\n</function>", "", 1),
    (
        HARMONY,
        "<|channel|>analysis<|message|>Need to search.<|end|><|start|>assistant<|channel|>"
        'commentary to=functions.search <|constrain|>json<|message|>{"query": "Paris"}<|call|>',
        "",
        1,
    ),
    (
        HARMONY,
        '<|start|>assistant to=functions.search<|channel|>commentary json<|message|>{"query": '
        '"Paris"}',
        "",
        1,
    ),
    (
        HARMONY,
        "<|channel|>commentary<|message|>Let me check.<|end|><|start|>assistant<|channel|>"
        'commentary to=functions.search <|constrain|>json<|message|>{"query": "Paris"}<|call|>'
        "<|start|>assistant<|channel|>commentary to=functions.now <|constrain|>json<|message|>{}",
        "Let me check.",
        2,
    ),
]


@pytest.mark.parametrize(("fmt", "text", "content", "count"), NATIVE)
def test_native_replies_parse_to_their_calls(
    fmt: ActionFormat, text: str, content: str, count: int
) -> None:
    parsed = check(fmt.parse(text, call_id_prefix="t1"))
    assert parsed.kind is ParseKind.TOOL_CALLS, parsed.error
    assert parsed.message["content"] == content
    expected = [("search", {"query": "Paris"}), ("now", {})][:count]
    assert names_and_args(parsed) == expected
    assert [c["id"] for c in parsed.tool_calls] == [f"t1_{i}" for i in range(count)]


@pytest.mark.parametrize("fmt", FAMILIES, ids=lambda f: f.name)
@pytest.mark.parametrize(
    "text", ["The answer is 42.", "", "  spaced  \n", "Use {braces} and [brackets]; fine."]
)
def test_plain_text_is_a_final_answer_unchanged(fmt: ActionFormat, text: str) -> None:
    parsed = check(fmt.parse(text))
    assert parsed.kind is ParseKind.FINAL_ANSWER and parsed.message["content"] == text


def test_harmony_answers_come_from_the_final_channel_and_analysis_is_not_one() -> None:
    text = (
        "<|channel|>analysis<|message|>2 + 2 is 4.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>4<|return|>"
    )
    assert HARMONY.parse(text).message == {"role": "assistant", "content": "4"}
    only_thinking = check(HARMONY.parse("<|channel|>analysis<|message|>The answer is 4"))
    assert only_thinking.is_failure and "no final answer" in only_thinking.error


CALLS = {
    "one": [call("search", {"query": "Paris"})],
    "several": [
        call("search", {"query": "say \"hi\" \\ 'there'", "n": 3}),
        call("now", {}),
        call("add", {"xs": [1, 2.5], "opts": {"deep": {"k": None}}, "ok": True}),
    ],
}
SCHEMA_TYPES = {"query": "string", "n": "integer", "xs": "array", "opts": "object", "ok": "boolean"}
SPECS: list[ToolSpec] = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"The {name} tool.",
            "parameters": {
                "type": "object",
                "properties": {k: {"type": t} for k, t in SCHEMA_TYPES.items()},
            },
        },
    }
    for name in ("search", "now", "add")
]


def bound(fmt: ActionFormat) -> ActionFormat:
    return fmt.with_tool_specs(SPECS)


@pytest.mark.parametrize("fmt", FAMILIES, ids=lambda f: f.name)
@pytest.mark.parametrize("case", sorted(CALLS))
@pytest.mark.parametrize("content", ["", "I will look it up."])
def test_rendered_calls_parse_back(fmt: ActionFormat, case: str, content: str) -> None:
    fmt = bound(fmt)
    calls = CALLS[case]
    text = fmt.render_tool_calls(calls, content)
    parsed = check(fmt.parse(text, call_id_prefix="rt"))
    assert parsed.kind is ParseKind.TOOL_CALLS, (text, parsed.error)
    assert names_and_args(parsed) == [
        (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls
    ]
    assert parsed.message["content"] == content
    assert fmt.render_message(parsed.message) == fmt.render_tool_calls(parsed.tool_calls, content)


@pytest.mark.parametrize("fmt", FAMILIES, ids=lambda f: f.name)
def test_a_rendered_final_answer_parses_back(fmt: ActionFormat) -> None:
    message = {"role": "assistant", "content": "Paris is the capital."}
    parsed = check(fmt.parse(fmt.render_message(message)))
    assert parsed.kind is ParseKind.FINAL_ANSWER and parsed.message == message


def test_renderers_write_each_family_s_shape() -> None:
    one = CALLS["one"]
    assert LLAMA.render_tool_calls(one) == '{"name": "search", "parameters": {"query": "Paris"}}'
    assert MISTRAL.render_tool_calls(one) == (
        f'[TOOL_CALLS] [{{"name": "search", "arguments": {{"query": "Paris"}}, '
        f'"id": "{short_call_id("c")}"}}]'
    )
    assert QWEN.render_tool_calls(one) == (
        "<tool_call>\n<function=search>\n<parameter=query>\nParis\n</parameter>\n</function>\n"
        "</tool_call>"
    )
    assert HARMONY.render_tool_calls(one) == (
        '<|channel|>commentary to=functions.search <|constrain|>json<|message|>{"query": "Paris"}'
    )


def test_mistral_history_uses_nine_alphanumeric_ids_that_pair() -> None:
    text = MISTRAL.render_tool_calls([call("search", {}, "call_t1_0")])
    result = MISTRAL.render_tool_result(
        {"role": "tool", "tool_call_id": "call_t1_0", "content": "42"}
    )
    short = short_call_id("call_t1_0")
    assert len(short) == 9 and short.isalnum()
    assert f'"id": "{short}"' in text
    assert result == f'[TOOL_RESULTS] {{"content": "42", "call_id": "{short}"}}[/TOOL_RESULTS]'


@pytest.mark.parametrize("fmt", FAMILIES, ids=lambda f: f.name)
def test_tool_specs_and_results_render(fmt: ActionFormat) -> None:
    assert fmt.render_tool_specs([]) == ""
    specs = fmt.render_tool_specs(SPECS)
    assert "search" in specs and "The search tool." in specs
    result = fmt.render_tool_result({"role": "tool", "name": "search", "content": "sunny"})
    assert "sunny" in result
    with pytest.raises(InvalidArgumentError):
        fmt.render_tool_result({"role": "user", "content": "x"})


def test_harmony_tool_specs_are_a_typescript_namespace() -> None:
    text = HARMONY.render_tool_specs(
        [
            {
                "type": "function",
                "function": {
                    "name": "weather",
                    "description": "Gets the weather.",
                    "parameters": {
                        "type": "object",
                        "properties": {
                            "city": {"type": "string", "description": "The city"},
                            "unit": {"type": "string", "enum": ["c", "f"], "default": "c"},
                            "days": {"type": "array", "items": {"type": "integer"}},
                        },
                        "required": ["city"],
                    },
                },
            },
            {"type": "function", "function": {"name": "now"}},
        ]
    )
    assert (
        "namespace functions {\n\n// Gets the weather.\ntype weather = (_: {\n// The city\n"
        'city: string,\nunit?: "c" | "f", // default: "c"\ndays?: number[],\n}) => any;\n\n'
        "type now = () => any;\n\n} // namespace functions"
    ) in text


@pytest.mark.parametrize(
    ("fmt", "tool_calls"),
    [
        (QWEN, [call("f", {"s": "a</parameter>b"})]),
        (QWEN, [call("f>g", {})]),
        (QWEN, [call("f", {"bad\nkey": 1})]),
        (HARMONY, [call("two words", {})]),
        (HARMONY, [call("f<|call|>", {})]),
    ],
)
def test_what_a_format_cannot_write_is_refused(fmt: ActionFormat, tool_calls: list) -> None:
    with pytest.raises(InvalidArgumentError, match="use another action format"):
        fmt.render_tool_calls(tool_calls)


# ---------------------------------------------------------------------------------------------
# qwen3_coder: values typed by the tool's JSON schema
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "schema", "value"),
    [
        ("42", {"type": "string"}, "42"),
        ("42", {"type": "integer"}, 42),
        ("-7", {"type": "int64"}, -7),
        ("4.5", {"type": "integer"}, "4.5"),
        ("1" * 5000, {"type": "integer"}, "1" * 5000),  # over int()'s digit limit: text
        ("2.0", {"type": "number"}, 2),
        ("2.5", {"type": "number"}, 2.5),
        ("1e400", {"type": "number"}, "1e400"),
        ("nan", {"type": "number"}, "nan"),
        ("True", {"type": "boolean"}, True),
        ("false", {"type": "boolean"}, False),
        ("yes", {"type": "boolean"}, "yes"),
        ('{"a": [1]}', {"type": "object"}, {"a": [1]}),
        ("[1, 2]", {"type": ["array", "null"]}, [1, 2]),
        ("{'a': 1}", {"type": "object"}, "{'a': 1}"),  # Python literals are never evaluated
        ("NULL", {"type": "string"}, None),
        ("[" * 100_000, {"type": "array"}, "[" * 100_000),
        ("3", None, 3),
        ("True", {}, True),
        ('"quoted"', None, '"quoted"'),
        ("plain words", None, "plain words"),
    ],
)
def test_qwen3_coder_parameter_values(text: str, schema: Any, value: Any) -> None:
    assert parameter_value(text, schema) == value


def test_qwen3_coder_types_values_only_when_bound_to_the_tools() -> None:
    text = (
        "<tool_call>\n<function=search>\n<parameter=query>\n1984\n</parameter>\n"
        "<parameter=n>\n3\n</parameter>\n<parameter=extra>\n[1]\n</parameter>\n</function>\n"
        "</tool_call>"
    )
    assert names_and_args(bound(QWEN).parse(text)) == [
        ("search", {"query": "1984", "n": 3, "extra": [1]})
    ]
    assert names_and_args(QWEN.parse(text)) == [("search", {"query": 1984, "n": 3, "extra": [1]})]


def test_qwen3_coder_values_keep_inner_newlines_and_lose_one_at_each_end() -> None:
    text = "<function=f>\n<parameter=code>\n\ndef f():\n    return 1\n\n</parameter>\n</function>"
    assert names_and_args(QWEN.parse(text)) == [("f", {"code": "\ndef f():\n    return 1\n"})]


# ---------------------------------------------------------------------------------------------
# hostile inputs: each gives its documented kind, never raises
# ---------------------------------------------------------------------------------------------

LLAMA_CALL = '{"name": "f", "parameters": {"s": "x"}}'
MISTRAL_CALL = '[TOOL_CALLS] [{"name": "f", "arguments": {"s": "x"}}]'
QWEN_CALL = "<tool_call>\n<function=f>\n<parameter=s>\nx\n</parameter>\n</function>\n</tool_call>"
HARMONY_CALL = '<|channel|>commentary to=functions.f <|constrain|>json<|message|>{"s": "x"}'
HOSTILE = [
    # unbalanced tags and brackets
    (LLAMA, '{"name": "f", "parameters": {"s": "x"}', "invalid JSON in tool call 1"),
    (LLAMA, "<|python_tag|>", "no tool call after <|python_tag|>"),
    (LLAMA, "<|python_tag|>search(query='x')", "expected a JSON tool call"),
    (MISTRAL, '[TOOL_CALLS] [{"name": "f", "arguments": {}}', "invalid JSON in tool call 1"),
    (MISTRAL, "[TOOL_CALLS]", "no tool call after [TOOL_CALLS]"),
    (MISTRAL, "[TOOL_CALLS] []", "empty list of tool calls"),
    (QWEN, QWEN_CALL.removesuffix("</tool_call>"), "unclosed <tool_call> tag (tool call 1)"),
    (QWEN, "<tool_call>\n<function=f>\n<parameter=s>\nx\n", "unclosed <parameter=s>"),
    (QWEN, "<function=f\n<parameter=s>", "unclosed <function= tag"),
    (QWEN, "done </tool_call>", "stray </tool_call>"),
    (QWEN, "<tool_call>\n" + LLAMA_CALL + "\n</tool_call>", "expected <function=NAME>"),
    (HARMONY, "<|channel|>commentary to=functions.f", "header without <|message|>"),
    (HARMONY, "<|channel|>final<|message|>a<|message|>b", "unexpected <|message|>"),
    (HARMONY, "<|start|>user<|message|>hi", "a message from 'user'"),
    (HARMONY, "<|channel|>secret<|message|>hi", "unknown channel"),
    (HARMONY, "<|message|>hi", "a message without a channel"),
    # nested and escaped quotes that break the JSON
    (LLAMA, '{"name": "f", "parameters": {"s": "say "hi""}}', "invalid JSON in tool call 1"),
    (MISTRAL, '[TOOL_CALLS] [{"name": "f", "arguments": {"s": "\\"}}]', "invalid JSON"),
    (HARMONY, HARMONY_CALL.replace('"x"', '"x\\"'), "invalid JSON in tool call 1"),
    # wrong shapes
    (LLAMA, '{"answer": 42}', "tool call 1 has no string 'name'"),
    (LLAMA, '{"name": "f", "parameters": [1]}', "must be a JSON object, got array"),
    (MISTRAL, '[TOOL_CALLS] [{"name": ""}]', "'name' of tool call 1 is empty"),
    (HARMONY, HARMONY_CALL.replace('{"s": "x"}', "[1]"), "must be a JSON object, got array"),
    # huge arguments over the JSON decoder's limits
    (LLAMA, '{"name": "f", "parameters": {"n": ' + "1" * 5000 + "}}", "invalid JSON"),
    (MISTRAL, '[TOOL_CALLS] [{"name": "f", "arguments": ' + "[" * 100_000, "nested too deeply"),
    (HARMONY, HARMONY_CALL.replace('"x"', "1" * 5000), "invalid JSON in tool call 1"),
    # more than MAX_TOOL_CALLS calls
    (LLAMA, "; ".join([LLAMA_CALL] * (MAX_TOOL_CALLS + 1)), "too many tool calls"),
    (MISTRAL, "[TOOL_CALLS] [" + ", ".join(['{"name": "f"}'] * 33) + "]", "too many tool calls"),
    (MISTRAL, "[TOOL_CALLS]f{}" * (MAX_TOOL_CALLS + 1), "too many tool calls"),
    (QWEN, QWEN_CALL * (MAX_TOOL_CALLS + 1), "too many tool calls"),
    (HARMONY, "<|call|><|start|>assistant".join([HARMONY_CALL] * 33), "too many tool calls"),
    # control tokens inside arguments
    (LLAMA, '<|python_tag|>{"name": "f", "parameters": {}}<|python_tag|>', "unexpected text"),
    (MISTRAL, '[TOOL_CALLS] [{"name": "f", "arguments": {}}] [/TOOL_CALLS]', "tool call 2"),
    (QWEN, QWEN_CALL.replace("\nx\n", "\nx</parameter>y\n"), "expected <parameter=KEY>"),
    (HARMONY, HARMONY_CALL.replace('"x"', '"<|call|>"'), "unexpected text after <|call|>"),
    (HARMONY, HARMONY_CALL.replace('"x"', '"<|channel|>"'), "unexpected <|channel|>"),
    # garbage after the call
    (LLAMA, LLAMA_CALL + " and more", "unexpected text after tool call 1"),
    (MISTRAL, MISTRAL_CALL + " trailing", "unexpected text after tool call 1"),
    (QWEN, QWEN_CALL + "\n</function>", "stray </function>"),
    (HARMONY, HARMONY_CALL + "<|call|> trailing", "unexpected text after <|call|>"),
    (HARMONY, HARMONY_CALL + "<|call|><|channel|>final", "expected <|start|> after <|call|>"),
]


@pytest.mark.parametrize(("fmt", "text", "reason"), HOSTILE, ids=lambda v: getattr(v, "name", None))
def test_hostile_replies_are_parse_failures_with_a_reason(
    fmt: ActionFormat, text: str, reason: str
) -> None:
    parsed = check(fmt.parse(text))
    assert parsed.kind is ParseKind.PARSE_FAILURE
    assert parsed.message == {"role": "assistant", "content": text}
    assert reason in parsed.error


@pytest.mark.parametrize(
    ("fmt", "text", "arguments"),
    [
        (LLAMA, '{"name": "f", "parameters": {"s": "<|python_tag|>[TOOL_CALLS]"}}', None),
        (MISTRAL, '[TOOL_CALLS] [{"name": "f", "arguments": {"s": "[TOOL_CALLS] x"}}]', None),
        (QWEN, QWEN_CALL.replace("\nx\n", "\n<tool_call></function><parameter=y>\n"), None),
        (HARMONY, HARMONY_CALL.replace('"x"', '"\\u003c|call|\\u003e"'), {"s": "<|call|>"}),
    ],
)
def test_tokens_quoted_inside_arguments_stay_arguments(
    fmt: ActionFormat, text: str, arguments: dict[str, Any] | None
) -> None:
    parsed = check(fmt.parse(text))
    assert parsed.kind is ParseKind.TOOL_CALLS, parsed.error
    if arguments is not None:
        assert names_and_args(parsed) == [("f", arguments)]


@pytest.mark.parametrize("fmt", FAMILIES, ids=lambda f: f.name)
def test_exactly_max_tool_calls_is_fine(fmt: ActionFormat) -> None:
    text = fmt.render_tool_calls([call("f", {"i": i}, f"c{i}") for i in range(MAX_TOOL_CALLS)])
    assert len(check(fmt.parse(text)).tool_calls) == MAX_TOOL_CALLS


HUGE = "x" * MB


@pytest.mark.parametrize(
    ("fmt", "text", "kind"),
    [
        (LLAMA, '{"name": "f", "parameters": {"s": "' + HUGE + '"}}', ParseKind.TOOL_CALLS),
        (LLAMA, "{" * MB, ParseKind.PARSE_FAILURE),
        (LLAMA, LLAMA_CALL + ";" * MB, ParseKind.TOOL_CALLS),
        (MISTRAL, MISTRAL_CALL.replace('"x"', f'"{HUGE}"'), ParseKind.TOOL_CALLS),
        (MISTRAL, "[TOOL_CALLS]" * (MB // 12), ParseKind.PARSE_FAILURE),
        (MISTRAL, "[TOOL_CALLS]" + "a" * MB, ParseKind.PARSE_FAILURE),
        (QWEN, QWEN_CALL.replace("\nx\n", HUGE), ParseKind.TOOL_CALLS),
        (QWEN, "<function=" * (MB // 10), ParseKind.PARSE_FAILURE),
        (QWEN, "<tool_call>" + "<parameter=" * (MB // 11), ParseKind.PARSE_FAILURE),
        (QWEN, "<function=f>" + "<parameter=k>" * (MB // 13), ParseKind.PARSE_FAILURE),
        (HARMONY, HARMONY_CALL.replace('"x"', f'"{HUGE}"'), ParseKind.TOOL_CALLS),
        (HARMONY, "<|end|>" * (MB // 7), ParseKind.FINAL_ANSWER),  # no header token: text
        (
            HARMONY,
            "<|channel|>analysis<|message|>x<|end|><|start|>assistant" * (MB // 50),
            ParseKind.PARSE_FAILURE,
        ),
        (HARMONY, "<|channel|>final<|message|>" + HUGE, ParseKind.FINAL_ANSWER),
    ],
    ids=lambda v: getattr(v, "name", None),
)
def test_huge_replies_parse_in_linear_time(fmt: ActionFormat, text: str, kind: ParseKind) -> None:
    assert timed(fmt, text).kind is kind


# ---------------------------------------------------------------------------------------------
# signatures: recognising the format a template teaches from its rendered output
# ---------------------------------------------------------------------------------------------

RENDERED = {
    "hermes": '<|im_start|>assistant\n<tool_call>\n{"name": "probe", "arguments": {"x": 1}}\n'
    "</tool_call><|im_end|>",
    "llama3_json": "<|start_header_id|>assistant<|end_header_id|>\n\n"
    '{"name": "probe", "parameters": {"x": 1}}<|eot_id|><|start_header_id|>ipython'
    "<|end_header_id|>\n\n7<|eot_id|>",
    "mistral": '[AVAILABLE_TOOLS] [{"type": "function", "function": {"name": "probe", '
    '"description": "A probe.", "parameters": {}}}][/AVAILABLE_TOOLS][INST] Go [/INST]'
    '[TOOL_CALLS] [{"name": "probe", "arguments": {"x": 1}, "id": "abcdef123"}]</s>',
    "qwen3_coder": "<|im_start|>assistant\n<tool_call>\n<function=probe>\n<parameter=x>\n1\n"
    "</parameter>\n</function>\n</tool_call><|im_end|>",
    "harmony": "<|start|>assistant to=functions.probe<|channel|>commentary json<|message|>"
    '{"x": 1}<|call|>',
}


@pytest.mark.parametrize("family", sorted(RENDERED))
def test_each_family_s_rendered_output_matches_its_format_only(family: str) -> None:
    matching = [name for name, cls in ACTION_FORMATS.items() if cls.signature(RENDERED[family])]
    assert matching == [family]


def test_plain_chat_and_tool_specs_match_no_format() -> None:
    spec = '{"type": "function", "function": {"name": "probe", "description": "A probe.", '
    spec += '"parameters": {"type": "object", "properties": {}}}}'
    for text in ("<|im_start|>user\nhi<|im_end|>", spec, ""):
        assert [n for n, cls in ACTION_FORMATS.items() if cls.signature(text)] == []


# ---------------------------------------------------------------------------------------------
# fuzzing
# ---------------------------------------------------------------------------------------------

FRAGMENTS = [
    "<|python_tag|>",
    "[TOOL_CALLS]",
    "[ARGS]",
    "<tool_call>",
    "</tool_call>",
    "<function=f>",
    "</function>",
    "<parameter=k>",
    "</parameter>",
    "<|start|>assistant",
    "<|channel|>",
    "commentary",
    "final",
    "analysis",
    " to=functions.f ",
    "<|constrain|>json",
    "<|message|>",
    "<|end|>",
    "<|call|>",
    "<|return|>",
    LLAMA_CALL,
    '{"name": "f", "arguments": {}}',
    "[",
    "]",
    "{",
    "}",
    '"',
    "\\",
    ";",
    "\n",
    " ",
    "1",
    "null",
    "\ud800",
]
FUZZ_TEXT = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=3)), max_size=25).map(
    "".join
)
FUZZ = settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(text=FUZZ_TEXT)
def test_fuzz_parse_never_raises_and_calls_render_back(text: str) -> None:
    for fmt in FAMILIES:
        parsed = check(fmt.parse(text, call_id_prefix="p"))
        assert parsed == fmt.parse(text, call_id_prefix="p"), fmt.name
        if parsed.is_tool_calls:
            try:
                rendered = fmt.render_message(parsed.message)
            except InvalidArgumentError:  # a name or value this format cannot write
                continue
            again = check(fmt.parse(rendered))
            assert names_and_args(again) == names_and_args(parsed), (fmt.name, rendered)


LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12).filter(lambda s: s.lower() != "null" and "</parameter>" not in s),
)
VALUES = st.recursive(
    LEAVES,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=6,
)
IDENTIFIERS = st.from_regex(r"[A-Za-z_][A-Za-z0-9_.-]{0,15}", fullmatch=True)
ARGUMENTS = st.dictionaries(IDENTIFIERS, VALUES, max_size=3)
CONTENT = st.text(alphabet=st.characters(blacklist_characters="<>[]{|"), max_size=20)


def _schema_type(value: Any) -> str:
    kinds = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array"}
    return "object" if isinstance(value, dict) else kinds.get(type(value), "null")


@FUZZ
@given(
    calls=st.lists(
        st.tuples(IDENTIFIERS, ARGUMENTS), min_size=1, max_size=4, unique_by=lambda c: c[0]
    ),
    content=CONTENT,
)
def test_fuzz_round_trip(calls: list[tuple[str, dict[str, Any]]], content: str) -> None:
    tool_calls = [call(name, args, f"id{i}") for i, (name, args) in enumerate(calls)]
    specs: list[ToolSpec] = []
    for name, args in calls:  # each parameter typed as its value, so qwen3_coder reads it back
        properties = {key: {"type": _schema_type(value)} for key, value in args.items()}
        parameters = {"type": "object", "properties": properties}
        specs.insert(0, {"type": "function", "function": {"name": name, "parameters": parameters}})
    for fmt in FAMILIES:
        fmt = fmt.with_tool_specs(specs)
        text = fmt.render_tool_calls(tool_calls, content)
        parsed = check(fmt.parse(text, call_id_prefix="rt"))
        assert parsed.kind is ParseKind.TOOL_CALLS, (fmt.name, text, parsed.error)
        assert names_and_args(parsed) == calls, (fmt.name, text)
        assert parsed.message["content"] == content.strip(), fmt.name
