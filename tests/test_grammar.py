"""The grammars of :mod:`llm_gym.actions.grammar`, compiled by :mod:`llm_gym.policies.constraint`
for the tiny model's tokenizer: every action format's forced call, strict arguments, JSON
answers, and what is refused (bad choices, huge, deep or invalid schemas, names a format cannot
write)."""

from __future__ import annotations

import json
import random
import time

import pytest

from llm_gym.actions import ACTION_FORMATS, get_action_format
from llm_gym.actions.grammar import (
    MAX_SCHEMA_CHARS,
    GrammarUnsupportedError,
    Lark,
    ToolChoice,
    check_schema,
    guard_markup,
    parse_tool_choice,
)
from llm_gym.errors import InvalidArgumentError

pytest.importorskip("torch")
pytest.importorskip("llguidance")

from llm_gym.policies.constraint import (
    GrammarCompiler,
    LogitsConstraint,
    compiler_for,
    reply_constraint,
)

CLOSED = {  # every value from a finite set: a random walk through the grammar ends
    "type": "object",
    "properties": {
        "unit": {"enum": ["c", "f"]},
        "ok": {"type": "boolean"},
        "n": {"type": "integer", "minimum": 0, "maximum": 9},
    },
    "required": ["unit", "ok", "n"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "convert", "parameters": CLOSED}},
    {"type": "function", "function": {"name": "other", "parameters": CLOSED}},
]


def valid(arguments: dict, schema: dict) -> bool:
    jsonschema = pytest.importorskip("jsonschema")
    try:
        jsonschema.validate(arguments, schema)
    except jsonschema.ValidationError:
        return False
    return True


@pytest.fixture(scope="module")
def compiler(small_model) -> GrammarCompiler:
    model, tokenizer = small_model
    width = model.get_output_embeddings().weight.shape[0]
    return compiler_for(tokenizer, width, [tokenizer.eos_token_id])


def walk(compiler: GrammarCompiler, grammar: str, tokenizer, seed: int, steps: int = 400) -> str:
    """Random allowed tokens until only the end of sequence is left (or ``steps``)."""
    rng = random.Random(seed)
    constraint = compiler.constraint(grammar)
    assert isinstance(constraint, LogitsConstraint)
    ids = []
    for _ in range(steps):
        allowed = constraint.allowed().nonzero().flatten().tolist()
        eos = [i for i in allowed if i in constraint.eos_ids]
        if eos:
            break
        token = rng.choice(allowed)
        constraint.advance(token)
        ids.append(token)
    assert constraint.complete
    return tokenizer.decode(ids, skip_special_tokens=False)


@pytest.mark.parametrize("name", sorted(ACTION_FORMATS))
def test_every_format_accepts_its_own_rendering_of_a_call(name, compiler, small_model):
    fmt = get_action_format(name)
    tokenizer = small_model[1]
    grammar = reply_constraint(compiler, fmt, TOOLS, ToolChoice("required", "convert"))
    arguments = {"unit": "c", "ok": True, "n": 3}
    call = {"type": "function", "function": {"name": "convert", "arguments": arguments}}
    constraint = compiler.constraint(grammar)
    for token in tokenizer.encode(fmt.render_tool_calls([call]), add_special_tokens=False):
        assert constraint.allowed()[token], name
        constraint.advance(token)
    assert constraint.complete


@pytest.mark.parametrize("name", sorted(ACTION_FORMATS))
@pytest.mark.parametrize("choice", ["required", "convert"])
def test_any_walk_through_a_forced_grammar_parses_as_a_valid_call(
    name, choice, compiler, small_model
):
    fmt = get_action_format(name)
    forced = ToolChoice("required", None if choice == "required" else choice)
    grammar = reply_constraint(compiler, fmt, TOOLS, forced, parallel=False)
    for seed in range(4):
        text = walk(compiler, grammar, small_model[1], seed)
        parsed = fmt.parse(text)
        assert parsed.is_tool_calls, (name, text)
        (call,) = parsed.tool_calls
        assert call["function"]["name"] in (
            ["convert", "other"] if forced.name is None else [choice]
        )
        assert valid(json.loads(call["function"]["arguments"]), CLOSED), text


def test_a_json_schema_answer_always_validates(compiler, small_model):
    schema = {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"]}
    grammar = reply_constraint(
        compiler, get_action_format("hermes"), [], ToolChoice(), answer=schema
    )
    for seed in range(5):
        assert valid(json.loads(walk(compiler, grammar, small_model[1], seed)), schema)


def test_strict_tools_under_auto_leave_text_free_and_constrain_the_calls(compiler, small_model):
    fmt = get_action_format("hermes")
    strict = [{"type": "function", "function": {**TOOLS[0]["function"], "strict": True}}]
    assert reply_constraint(compiler, fmt, TOOLS, ToolChoice()) is None  # nothing strict
    grammar = reply_constraint(compiler, fmt, strict, ToolChoice())
    tokenizer = small_model[1]
    for text, ok in [
        ("Plain words.", True),
        ('<tool_call>\n{"name": "convert", "arguments": {"unit": "k"', False),
        ('<tool_call>\n{"name": "nope"', False),
    ]:
        constraint = compiler.constraint(grammar)
        accepted = True
        for token in tokenizer.encode(text, add_special_tokens=False):
            accepted = accepted and bool(constraint.allowed()[token])
            constraint.advance(token)
        assert accepted is ok, text


def test_harmony_leaves_strict_tools_under_auto_unconstrained(compiler):
    strict = [{"type": "function", "function": {**TOOLS[0]["function"], "strict": True}}]
    assert reply_constraint(compiler, get_action_format("harmony"), strict, ToolChoice()) is None


def test_tool_choice_is_checked():
    assert parse_tool_choice("any", ["a"]) == ToolChoice("required")
    assert parse_tool_choice(None, []) == ToolChoice()
    with pytest.raises(InvalidArgumentError, match="not declared"):
        parse_tool_choice({"type": "function", "function": {"name": "b"}}, ["a"])
    with pytest.raises(InvalidArgumentError, match="no tools are declared"):
        parse_tool_choice("required", [])
    with pytest.raises(InvalidArgumentError, match="tool_choice must be"):
        parse_tool_choice("always", ["a"])


def test_huge_and_deep_schemas_are_refused_before_any_compiler():
    with pytest.raises(InvalidArgumentError, match="characters of JSON"):
        check_schema({"enum": ["x" * MAX_SCHEMA_CHARS]}, "tools[0].function.parameters")
    deep: dict = {"type": "string"}
    for _ in range(40):
        deep = {"type": "object", "properties": {"a": deep}}
    with pytest.raises(InvalidArgumentError, match="nests deeper"):
        check_schema(deep, "w")
    with pytest.raises(InvalidArgumentError, match="JSON schema object"):
        check_schema([1], "w")


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "strin"},
        {"type": "object", "required": ["y"], "additionalProperties": False},
        {"allOf": [{"type": "string"}, {"type": "integer"}]},
    ],
)
def test_schemas_that_cannot_be_enforced_are_refused_quickly(schema, compiler):
    tools = [{"type": "function", "function": {"name": "t", "parameters": schema}}]
    start = time.perf_counter()
    with pytest.raises(InvalidArgumentError, match="cannot be used"):
        reply_constraint(compiler, get_action_format("hermes"), tools, ToolChoice("required"))
    assert time.perf_counter() - start < 5


@pytest.mark.parametrize(
    "schema",
    [
        {"$ref": "#"},
        {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
        {
            "$defs": {"n": {"type": "object", "properties": {"c": {"$ref": "#/$defs/n"}}}},
            "$ref": "#/$defs/n",
        },
    ],
)
def test_recursive_schemas_compile_or_are_refused_in_bounded_time(schema, compiler):
    tools = [{"type": "function", "function": {"name": "t", "parameters": schema}}]
    start = time.perf_counter()
    try:
        reply_constraint(compiler, get_action_format("hermes"), tools, ToolChoice("required"))
    except InvalidArgumentError as exc:
        assert "cannot be used" in str(exc)
    assert time.perf_counter() - start < 5


def test_a_tool_name_with_control_tokens_stays_inside_its_call(compiler, small_model):
    name = '<|im_end|></tool_call>"'
    tools = [{"type": "function", "function": {"name": name, "parameters": CLOSED}}]
    fmt = get_action_format("hermes")
    grammar = reply_constraint(compiler, fmt, tools, ToolChoice("required", name))
    text = walk(compiler, grammar, small_model[1], 0)
    assert "<|im_end|>" not in text
    assert fmt.parse(text).tool_calls[0]["function"]["name"] == name
    for other in ("qwen3_coder", "harmony"):  # names these formats cannot write
        with pytest.raises(InvalidArgumentError, match="name"):
            reply_constraint(compiler, get_action_format(other), tools, ToolChoice("required"))


def test_argument_strings_cannot_close_a_tagged_call():
    guarded = guard_markup({"type": "object", "properties": {"q": {"type": "string"}}})
    assert guarded["properties"]["q"]["pattern"] == "^[^<]*$"
    assert guard_markup({"enum": [{"type": "string"}]}) == {"enum": [{"type": "string"}]}


def test_special_markers_are_matched_as_their_tokens():
    lark = Lark({"[TOOL_CALLS]": (5, True), "<tool_call>": (3, False)})
    assert lark.text("[TOOL_CALLS] [") == '<[5]> " ["'
    assert lark.text("a<tool_call>") == '"a" (<[3]> | "<tool_call>")'


def test_a_format_without_a_call_grammar_says_so(compiler):
    from llm_gym.actions.base import ActionFormat

    class Plain(ActionFormat):
        name = "plain_test"

        def parse(self, text, *, call_id_prefix=None):
            raise NotImplementedError

        def render_tool_calls(self, tool_calls, content=""):
            return ""

        def render_tool_specs(self, tool_specs):
            return ""

    with pytest.raises(GrammarUnsupportedError, match="writes no grammar of a tool call"):
        reply_constraint(compiler, Plain(), TOOLS, ToolChoice("required"))


def test_a_missing_library_names_the_extra(monkeypatch, small_model):
    import builtins

    real = builtins.__import__

    def fake(name, *args, **kwargs):
        if name.startswith("llguidance"):
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake)
    with pytest.raises(ImportError, match=r"llm-gym\[grammar\]"):
        GrammarCompiler(small_model[1], 512, [0])


def test_closed_objects_by_hand() -> None:
    from llm_gym.actions.grammar import closed_objects

    schema = {
        "type": "object",
        "properties": {
            "properties": {"type": "object", "properties": {"a": {"type": "string"}}},
            "open": {"type": "object", "properties": {}, "additionalProperties": True},
            "choice": {"enum": [{"properties": {}}]},
        },
        "$defs": {"d": {"type": "object", "properties": {"x": {"type": "integer"}}}},
    }
    closed = closed_objects(schema)
    assert closed["additionalProperties"] is False
    assert set(closed["properties"]) == {"properties", "open", "choice"}  # no key invented
    assert closed["properties"]["properties"]["additionalProperties"] is False
    assert closed["properties"]["open"]["additionalProperties"] is True  # as the schema says
    assert closed["properties"]["choice"] == {"enum": [{"properties": {}}]}  # a literal
    assert closed["$defs"]["d"]["additionalProperties"] is False
    assert "additionalProperties" not in schema  # the input is left as it is
