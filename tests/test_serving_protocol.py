"""The server's request checks, without a model: every bad field is a 4xx that names it.

One test per class of bad input:
out-of-range numbers, wrong types, client templates and template options, tools of a bad shape,
bodies that are not UTF-8 / not JSON / too deep / hold lone surrogates / are not objects.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from llm_gym.errors import InvalidArgumentError
from llm_gym.serving.body import MAX_JSON_DEPTH, decode_json_body
from llm_gym.serving.chat_protocol import check_template_kwargs_allowlist, parse_chat_request
from llm_gym.serving.generation import TextAssembler, TokenOut
from llm_gym.serving.protocol import (
    CHAT_UNHONOURED_FIELDS,
    UNHONOURED_FIELDS,
    APIError,
    parse_completion_request,
)

ROOT = Path(__file__).resolve().parents[1]
BASE = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def chat_error(**fields: Any) -> APIError:
    with pytest.raises(APIError) as info:
        parse_chat_request({**BASE, **fields}, "m")
    assert 400 <= info.value.status < 500
    assert info.value.message
    return info.value


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        # numbers out of range or of the wrong type
        ({"seed": 2**70}, "seed"),
        ({"seed": -(2**64)}, "seed"),
        ({"seed": 1.5}, "seed"),
        ({"seed": True}, "seed"),
        ({"n": 2}, "n"),
        ({"n": "1"}, "n"),
        ({"n": True}, "n"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": -1}, "max_tokens"),
        ({"max_tokens": "5"}, "max_tokens"),
        ({"max_completion_tokens": 1.0}, "max_completion_tokens"),
        ({"temperature": float("inf")}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": 10**400}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_p": float("nan")}, "top_p"),
        ({"logprobs": "yes"}, "logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"presence_penalty": 1.0}, "presence_penalty"),
        ({"frequency_penalty": float("inf")}, "frequency_penalty"),
        # streaming options
        ({"stream": "yes"}, "stream"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"stream": True, "stream_options": ["include_usage"]}, "stream_options"),
        (
            {"stream": True, "stream_options": {"include_usage": "yes"}},
            "stream_options.include_usage",
        ),
        (
            {"stream": True, "stream_options": {"include_obfuscation": "no"}},
            "stream_options.include_obfuscation",
        ),
        ({"stream": True, "stream_options": {"obfuscate": False}}, "stream_options"),
        ({"stream": True, "return_token_ids": True}, "return_token_ids"),
        # the model
        ({"model": None}, "model"),
        ({"model": 5}, "model"),
        # stops
        ({"stop": 5}, "stop"),
        ({"stop": ["a", 1]}, "stop"),
        ({"stop": ["x"] * 17}, "stop"),
        ({"stop": "x" * 1025}, "stop"),
        # templates: the model's own only, allow-listed options of scalar values
        ({"chat_template": "{% for i in range(99999) %}{% endfor %}"}, "chat_template"),
        ({"chat_template": None}, "chat_template"),
        ({"chat_template_kwargs": {"chat_template": "x"}}, "chat_template_kwargs.chat_template"),
        ({"chat_template_kwargs": {"tokenize": True}}, "chat_template_kwargs.tokenize"),
        ({"chat_template_kwargs": {"tools": []}}, "chat_template_kwargs.tools"),
        (
            {"chat_template_kwargs": {"enable_thinking": {"a": 1}}},
            "chat_template_kwargs.enable_thinking",
        ),
        (
            {"chat_template_kwargs": {"enable_thinking": [True]}},
            "chat_template_kwargs.enable_thinking",
        ),
        (
            {"chat_template_kwargs": {"reasoning_effort": "x" * 2000}},
            "chat_template_kwargs.reasoning_effort",
        ),
        ({"chat_template_kwargs": "enable_thinking"}, "chat_template_kwargs"),
        # tools and tool choice
        ({"tools": {"type": "function"}}, "tools"),
        ({"tools": ["search"]}, "tools[0]"),
        ({"tools": [{"type": "function"}]}, "tools[0]"),
        ({"tools": [{"type": "function", "function": {"name": 5}}]}, "tools[0]"),
        ({"tools": [{"type": "function", "function": {"name": ""}}]}, "tools[0]"),
        ({"tools": [{"type": "retrieval", "function": {"name": "f"}}]}, "tools[0]"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": "{}"}}]},
            "tools[0].function.parameters",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "description": 1}}]},
            "tools[0].function.description",
        ),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice"),
        ({"response_format": {"type": "yaml"}}, "response_format"),
        # OpenAI's fields for what this server does not do
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
        ({"web_search_options": {}}, "web_search_options"),
        ({"reasoning_effort": "low"}, "reasoning_effort"),
        ({"verbosity": "low"}, "verbosity"),
        ({"functions": [{"name": "f", "parameters": {}}]}, "functions"),
        ({"function_call": {"name": "f"}}, "function_call"),
        ({"moderation": {"model": "omni-moderation-latest"}}, "moderation"),
        # messages
        ({"messages": []}, "messages"),
        ({"messages": "hi"}, "messages"),
        ({"messages": ["hi"]}, "messages[0]"),
        ({"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
        ({"messages": [{"role": ["user"], "content": "hi"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": {"text": "hi"}}]}, "messages[0].content"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            "messages[0].content[0]",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
            "messages[0].content[0].text",
        ),
        (
            {"messages": [{"role": "assistant", "content": "", "tool_calls": {"a": 1}}]},
            "messages[0].tool_calls",
        ),
        (
            {"messages": [{"role": "assistant", "content": "", "tool_calls": [{"function": 1}]}]},
            "messages[0].tool_calls[0]",
        ),
    ],
)
def test_a_bad_chat_field_is_a_400_naming_it(fields: dict[str, Any], param: str) -> None:
    error = chat_error(**fields)
    assert error.status == 400
    assert error.param == param
    assert error.param.split(".")[0].split("[")[0] in error.message


def test_another_model_is_a_404() -> None:
    with pytest.raises(APIError) as info:
        parse_chat_request({**BASE, "model": "gpt-9"}, "m")
    assert info.value.status == 404 and info.value.code == "model_not_found"
    assert "'gpt-9'" in info.value.message and "'m'" in info.value.message


@pytest.mark.parametrize("obfuscation", [True, False, None])
def test_stream_options_take_openais_fields(obfuscation: bool | None) -> None:
    """``include_obfuscation`` (the openai SDK's and the Agents SDK's) is accepted either way,
    beside ``include_usage``, on both endpoints."""
    options = {"include_usage": True, "include_obfuscation": obfuscation}
    chat = parse_chat_request({**BASE, "stream": True, "stream_options": options}, "m")
    assert chat.stream and chat.include_usage
    completion = parse_completion_request(
        {"model": "m", "prompt": "hi", "stream": True, "stream_options": options}, "m"
    )
    assert completion.stream and completion.include_usage


def test_an_empty_tools_list_is_refused_as_openai_refuses_it() -> None:
    error = chat_error(tools=[])
    assert (error.status, error.param, error.code) == (400, "tools", "empty_array")
    assert "empty array" in error.message and "Omit 'tools'" in error.message
    assert parse_chat_request({**BASE, "tools": None}, "m").tools is None  # null: no tools


def test_what_is_accepted() -> None:
    request = parse_chat_request(
        {
            **BASE,
            "seed": 2**64 - 1,
            "max_tokens": 10**30,  # clamped to the context by the engine
            "logprobs": True,
            "top_logprobs": 20,
            "stream": True,
            "stream_options": {"include_usage": True},
            "stop": ["\n\n", ""],
            "chat_template_kwargs": {"enable_thinking": False, "reasoning_effort": "low"},
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
            "tool_choice": "auto",
            "response_format": {"type": "text"},
            "presence_penalty": 0,
            "modalities": ["text"],  # the neutral values of what the server does not do
            "verbosity": "medium",
            "functions": [],
            "function_call": "auto",
            "user": "someone",  # unknown fields are ignored
        },
        "m",
    )
    assert request.seed == 2**64 - 1 and request.max_tokens == 10**30
    assert request.logprobs and request.top_logprobs == 20
    assert request.stream and request.include_usage
    assert request.stops == ["\n\n"] and request.parse_tool_calls
    assert request.chat_template_kwargs == {"enable_thinking": False, "reasoning_effort": "low"}
    assert not parse_chat_request(
        {**BASE, "tools": request.tools, "tool_choice": "none"}, "m"
    ).parse_tool_calls
    # the server may allow other template options, never a template
    allowed = parse_chat_request({**BASE, "chat_template_kwargs": {"custom": 1}}, "m", {"custom"})
    assert allowed.chat_template_kwargs == {"custom": 1}


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"prompt": []}, "prompt"),
        ({"prompt": [1, -2]}, "prompt"),
        ({"prompt": [1, True]}, "prompt"),
        ({"prompt": ["a", "b"]}, "prompt"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"logprobs": 6}, "logprobs"),
        ({"prompt_logprobs": -1}, "prompt_logprobs"),
        ({"seed": 2**70}, "seed"),
        ({"stop": "\n"}, "stop"),
        ({"echo": "yes"}, "echo"),
        ({"stream": True, "logprobs": 1}, "stream"),
        ({"n": 3}, "n"),
    ],
)
def test_a_bad_completion_field_is_a_400_naming_it(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(APIError) as info:
        parse_completion_request({"model": "m", "prompt": "hi", **fields}, "m")
    assert info.value.status == 400 and info.value.param == param


# --- bodies ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "says", "param"),
    [
        (b'{"model": "\xff"}', "not valid UTF-8", None),
        (b"{not json", "not valid JSON", None),
        (b"", "not valid JSON", None),
        (b'{"temperature": NaN}', "NaN is not a JSON number", None),
        (b'{"temperature": Infinity}', "Infinity is not a JSON number", None),
        (b'{"temperature": -Infinity}', "Infinity is not a JSON number", None),
        (b'{"seed": ' + b"9" * 5000 + b"}", "not valid JSON", None),
        (b"[" * 100_000 + b"]" * 100_000, "deeper than", None),
        (
            b'{"a": ' + b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1) + b"}",
            "deeper than",
            None,
        ),
        (
            b'{"messages": [{"role": "user", "content": "a\\ud800b"}]}',
            "lone UTF-16 surrogate",
            "messages[0].content",
        ),
        (b'{"messages": [{"\\udfff": 1}]}', "lone UTF-16 surrogate", None),
        (b'"\\ud800"', "must be a JSON object", None),
        (b"[]", "must be a JSON object, got a JSON array", None),
        (b"null", "got a JSON null", None),
        (b"5", "got a JSON number", None),
    ],
)
def test_a_bad_body_is_a_400_that_says_why(raw: bytes, says: str, param: str | None) -> None:
    with pytest.raises(APIError) as info:
        decode_json_body(raw)
    assert info.value.status == 400 and says in info.value.message
    if param is not None:
        assert info.value.param == param


def test_a_body_just_within_the_limits_is_accepted() -> None:
    nested: Any = "x"
    for _ in range(MAX_JSON_DEPTH - 1):
        nested = [nested]
    emoji = '"\\ud83d\\ude00"'  # a surrogate pair is one character, not a lone surrogate
    body = decode_json_body(f'{{"a": {json.dumps(nested)}, "b": {emoji}}}'.encode())
    assert body["b"] == "\U0001f600"


# --- the text of a generation ---------------------------------------------------------------------


class CharTokenizer:
    """One token per character; id 0 is the end of sequence."""

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int], **kwargs: Any) -> str:
        return "".join(chr(i) for i in ids if i)


def pieces(text: str, stops: list[str], eos: bool = True) -> tuple[list[str], TextAssembler]:
    assembler = TextAssembler(CharTokenizer(), [0], stops)
    out = []
    for token in [*CharTokenizer().encode(text), *([0] if eos else [])]:
        piece = assembler.feed(TokenOut(token))
        if piece is not None and piece.text:
            out.append(piece.text)
        if assembler.finish:
            break
    out.append(assembler.flush().text)
    return [p for p in out if p], assembler


def test_stop_strings_are_held_back_and_cut() -> None:
    out, assembler = pieces("hello world. bye", ["o w", "bye"])
    assert "".join(out) == "hell" and assembler.finish == "stop"
    assert all("o w" not in p for p in out)
    out, assembler = pieces("abc", [], eos=False)
    assert "".join(out) == "abc" and assembler.finish is None
    out, assembler = pieces("abc", ["zz"])
    assert "".join(out) == "abc" and assembler.finish == "stop"  # the end-of-sequence token
    assert len(assembler.generated) == 4 and assembler.ids == [97, 98, 99]


def test_masked_alternatives_are_finite_logprobs() -> None:
    from llm_gym.serving.generation import TokenText
    from llm_gym.serving.responses import MIN_LOGPROB, dumps, logprobs_content

    token = TokenOut(104, -0.1, ((104, -0.1), (105, float("-inf"))))
    [entry] = logprobs_content([token], 2, TokenText(CharTokenizer()))
    assert entry["token"] == "h" and entry["bytes"] == [104]
    assert [t["logprob"] for t in entry["top_logprobs"]] == [-0.1, MIN_LOGPROB]
    dumps(entry)  # valid JSON: no -Infinity


def test_serving_imports_no_web_stack_and_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess
    import sys

    probe = (
        "import sys, llm_gym.serving; print(sorted({'starlette', 'uvicorn'} & set(sys.modules)))"
    )
    assert (
        subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, check=True
        ).stdout.strip()
        == "[]"
    )
    from llm_gym.serving import serve

    monkeypatch.setitem(sys.modules, "uvicorn", None)  # as if the extra were not installed
    with pytest.raises(ImportError, match=r"pip install 'llm-gym\[serve\]'"):
        serve("no/such/model")


@pytest.mark.parametrize(
    "name", ["chat_template", "tool_chat_template", "Chat_Template", "tokenize", "tools"]
)
def test_a_template_key_is_never_allow_listed(name: str) -> None:
    with pytest.raises(InvalidArgumentError, match=f"may not allow clients to set '{name}'"):
        check_template_kwargs_allowlist(["enable_thinking", name])
    with pytest.raises(APIError) as info:  # refused per request too, whatever the list
        parse_chat_request({**BASE, "chat_template_kwargs": {name: "x"}}, "m", {name})
    assert info.value.param == f"chat_template_kwargs.{name}"
    assert check_template_kwargs_allowlist(["custom"]) == {"custom"}


def test_serve_refuses_a_template_key_before_the_model_loads(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from llm_gym.cli import main

    args = ["serve", "/nonexistent/model", "--template-kwargs", "enable_thinking,chat_template"]
    assert main(args) == 2
    error = capsys.readouterr().err
    assert "may not allow clients to set 'chat_template'" in error
    assert "--template-kwargs" in error


def test_the_serving_guide_lists_every_openai_chat_field() -> None:
    """``docs/guides/serving.md`` names every field of the installed openai client's
    chat-completions request, and every field the server refuses unless neutral."""
    params = pytest.importorskip("openai.types.chat.completion_create_params")
    guide = (ROOT / "docs/guides/serving.md").read_text(encoding="utf-8")
    section = guide.split("## Chat completions:", 1)[1].split("\n## ", 1)[0]
    first_cells = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    listed = {name for cell in first_cells for name in re.findall(r"`([\w\[\].]+)`", cell)}
    openai_fields = set(params.CompletionCreateParamsStreaming.__annotations__)
    assert openai_fields - listed == set()
    assert (set(UNHONOURED_FIELDS) | set(CHAT_UNHONOURED_FIELDS)) - listed == set()


# --- serving: bodies and the JSON inside them -----------------------------------------------------


def test_a_body_of_a_million_empty_lists_is_refused_before_decoding() -> None:
    from llm_gym.serving.body import MAX_JSON_VALUES, decode_json_body
    from llm_gym.serving.protocol import APIError

    raw = b'{"model": "m", "messages": [' + b"[]," * 1_100_000 + b"[]]}"
    start = time.perf_counter()
    with pytest.raises(APIError, match="too many JSON values") as caught:
        decode_json_body(raw)
    assert caught.value.status == 400 and time.perf_counter() - start < 0.5
    ids = b'{"model": "m", "prompt": [' + b"1," * 200_000 + b"1]}"  # a long prompt of ids
    assert len(decode_json_body(ids)["prompt"]) == 200_001 < MAX_JSON_VALUES


@pytest.mark.parametrize(
    "arguments",
    ['{"x": "\\ud800"}', '{"x": NaN}', '{"x": ' + "[" * 900 + "]" * 900 + "}", "not json"],
)
def test_tool_call_arguments_that_break_the_body_rules_stay_text(arguments: str) -> None:
    from llm_gym.serving.chat_protocol import parse_chat_request

    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": arguments}}
    message = {"role": "assistant", "content": "", "tool_calls": [call]}
    request = parse_chat_request({"model": "m", "messages": [message]}, "m")
    assert request.messages[0]["tool_calls"][0]["function"]["arguments"] == arguments
    ok = {**call, "function": {"name": "f", "arguments": '{"x": [1]}'}}
    request = parse_chat_request({"model": "m", "messages": [{**message, "tool_calls": [ok]}]}, "m")
    assert request.messages[0]["tool_calls"][0]["function"]["arguments"] == {"x": [1]}


# --- llm-gym serve: known fields it cannot honour -------------------------------------------------

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
COMPLETION = {"model": "m", "prompt": "hi"}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("logit_bias", {"50256": -100}),  # a banned token came back
        ("logit_bias", {str(i): 1 for i in range(10_000)}),
        ("logit_bias", []),
        ("presence_penalty", 0.5),
        ("frequency_penalty", float("nan")),
        ("best_of", 4),
        ("top_k", 40),
        ("top_k", True),
        ("min_p", 0.1),
        ("repetition_penalty", 1.3),
        ("min_tokens", 50),
        ("ignore_eos", True),
        ("skip_special_tokens", False),
        ("stop_token_ids", [2]),
        ("guided_json", {"type": "object"}),
        ("guided_choice", ["yes", "no"]),
    ],
)
def test_serve_refuses_sampling_fields_it_would_ignore(field: str, value: object) -> None:
    """Both endpoints refuse a field they cannot honour (an answer generated as if it were absent
    would be wrong for a client that relies on it): a 400 names the field and the values that
    are fine."""
    from llm_gym.serving.chat_protocol import parse_chat_request
    from llm_gym.serving.protocol import APIError, parse_completion_request

    for parse, body in ((parse_chat_request, CHAT), (parse_completion_request, COMPLETION)):
        with pytest.raises(APIError) as info:
            parse({**body, field: value}, "m")
        assert info.value.status == 400 and info.value.param == field
        assert f"'{field}' is not supported by this server" in info.value.message
        assert len(info.value.message) < 300


def test_serve_accepts_the_neutral_values_of_those_fields() -> None:
    from llm_gym.serving.chat_protocol import parse_chat_request
    from llm_gym.serving.protocol import APIError, parse_completion_request

    neutral = {
        "logit_bias": {},
        "parallel_tool_calls": True,
        "presence_penalty": 0.0,
        "frequency_penalty": 0,
        "best_of": 1,
        "top_k": -1,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "ignore_eos": False,
        "guided_json": None,
    }
    parse_chat_request({**CHAT, **neutral}, "m")
    parse_completion_request({**COMPLETION, **neutral, "suffix": ""}, "m")
    parse_completion_request({**COMPLETION, "prompt_logprobs": 1}, "m")  # honoured there
    with pytest.raises(APIError, match="'prompt_logprobs' is not supported"):
        parse_chat_request({**CHAT, "prompt_logprobs": 1}, "m")  # not on chat


def test_serve_refuses_continuous_usage_stats_it_would_ignore() -> None:
    from llm_gym.serving.chat_protocol import parse_chat_request
    from llm_gym.serving.protocol import APIError

    stream = {**CHAT, "stream": True}
    with pytest.raises(APIError, match="continuous_usage_stats' is not supported") as info:
        parse_chat_request({**stream, "stream_options": {"continuous_usage_stats": True}}, "m")
    assert info.value.param == "stream_options.continuous_usage_stats"
    options = {"include_usage": True, "continuous_usage_stats": False}
    assert parse_chat_request({**stream, "stream_options": options}, "m").include_usage
