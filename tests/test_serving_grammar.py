"""Forced and named tool calls, ``parallel_tool_calls: false`` and ``response_format`` on the
tiny model: through ``llm-gym serve`` (:mod:`llm_gym.serving.grammars`) and through the policy
(``PolicyRequest.tool_choice``, ``collect_groups`` with an environment that asks for it)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("uvicorn")
pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

from llm_gym import Task  # noqa: E402
from llm_gym.actions import get_action_format  # noqa: E402
from llm_gym.policies.base import PolicyRequest  # noqa: E402
from llm_gym.policies.hf import HFPolicy  # noqa: E402
from llm_gym.rollout import collect_groups  # noqa: E402
from llm_gym.serving.generation import TokenOut  # noqa: E402
from llm_gym.serving.openai_server import ChatCompletionServer, serve  # noqa: E402
from llm_gym.serving.protocol import APIError  # noqa: E402
from tests.test_tokens import Chatty  # noqa: E402

USER = [{"role": "user", "content": "Weather in Paris?"}]
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 8},
        "days": {"type": "integer", "minimum": 1, "maximum": 9},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "noop", "parameters": {"type": "object"}}},
]
NAMED = {"type": "function", "function": {"name": "weather"}}


@pytest.fixture(scope="module")
def served(small_model_dir) -> Iterator[ChatCompletionServer]:
    with serve(small_model_dir, model_name="tiny", device="cpu") as server:
        yield server


def ask(server: ChatCompletionServer, **fields: Any) -> dict[str, Any]:
    body = {"model": "tiny", "messages": USER, "temperature": 1.0, "max_tokens": 120, **fields}
    return server.chat_completion(body)["choices"][0]


def test_a_named_choice_always_calls_that_tool_with_valid_arguments(served) -> None:
    for seed in range(3):
        choice = ask(served, tools=TOOLS, tool_choice=NAMED, seed=seed)
        assert choice["finish_reason"] == "tool_calls"
        (call,) = choice["message"]["tool_calls"]
        assert call["function"]["name"] == "weather"
        jsonschema.validate(json.loads(call["function"]["arguments"]), WEATHER)


def test_required_calls_one_of_the_declared_tools(served) -> None:
    for seed in range(3):
        choice = ask(
            served, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, seed=seed
        )
        assert choice["finish_reason"] == "tool_calls", choice
        (call,) = choice["message"]["tool_calls"]
        assert call["function"]["name"] in {"weather", "noop"}


def test_a_json_schema_answer_always_validates(served) -> None:
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "n": {"enum": [1, 2, 3]}},
        "required": ["ok", "n"],
        "additionalProperties": False,
    }
    response_format = {
        "type": "json_schema",
        "json_schema": {"name": "answer", "schema": schema, "strict": True},
    }
    for seed in range(3):
        choice = ask(served, response_format=response_format, seed=seed)
        jsonschema.validate(json.loads(choice["message"]["content"]), schema)
    choice = ask(served, response_format={"type": "json_object"}, seed=0, max_tokens=400)
    if choice["finish_reason"] == "stop":
        assert isinstance(json.loads(choice["message"]["content"]), dict)


def test_parallel_tool_calls_false_keeps_the_first_call(served, monkeypatch) -> None:
    fmt = get_action_format("hermes")
    calls = [
        {
            "type": "function",
            "function": {"name": "weather", "arguments": {"city": "a", "days": 1}},
        },
        {"type": "function", "function": {"name": "noop", "arguments": {}}},
    ]
    text = fmt.render_tool_calls(calls, "Two calls.")
    tokenizer = served.tokenizer

    def fake(model, prompt_ids, sampling, *, eos_ids, pad_id, on_token) -> None:
        for token_id in [*tokenizer.encode(text, add_special_tokens=False), eos_ids[0]]:
            if on_token(TokenOut(token_id)):
                return

    monkeypatch.setattr("llm_gym.serving.engine.sample_tokens", fake)
    both = ask(served, tools=TOOLS)["message"]["tool_calls"]
    one = ask(served, tools=TOOLS, parallel_tool_calls=False)["message"]["tool_calls"]
    assert [c["function"]["name"] for c in both] == ["weather", "noop"]
    assert [c["function"]["name"] for c in one] == ["weather"]


def cut_reply(served: ChatCompletionServer, monkeypatch, text: str) -> list[int]:
    """Make the model write ``text`` and stop there, as a budget would: each token fed to the
    request's constraint on the step after it (as ``model.generate`` does). Returns its ids."""
    ids = served.tokenizer.encode(text, add_special_tokens=False)

    def fake(model, prompt_ids, sampling, *, eos_ids, pad_id, on_token) -> None:
        for i, token_id in enumerate(ids):
            if i and sampling.constraint is not None:
                sampling.constraint.advance(ids[i - 1])
            if on_token(TokenOut(token_id, -0.5 - i)):
                return

    monkeypatch.setattr("llm_gym.serving.engine.sample_tokens", fake)
    return ids


WHOLE = '<tool_call>\n{"name": "weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>'


@pytest.mark.parametrize("stream", [False, True])
def test_a_forced_reply_cut_by_its_budget_keeps_its_whole_calls(
    served, monkeypatch, stream
) -> None:
    whole = len(served.tokenizer.encode(WHOLE, add_special_tokens=False))
    ids = cut_reply(served, monkeypatch, WHOLE + '\n<tool_call>\n{"name": "noop", "argu')
    fields = {"tools": TOOLS, "tool_choice": "required", "logprobs": True, "max_tokens": len(ids)}
    if stream:
        openai = pytest.importorskip("openai")
        client = openai.OpenAI(base_url=served.url, api_key="unused", max_retries=0, timeout=60)
        stream = client.chat.completions.create(
            model="tiny",
            messages=USER,
            stream=True,
            stream_options={"include_usage": True},
            **fields,
        )
        chunks = [chunk.model_dump() for chunk in stream]
        deltas = [c["choices"][0] for c in chunks if c["choices"]]
        calls = [call for d in deltas for call in d["delta"].get("tool_calls") or []]
        content = "".join(d["delta"].get("content") or "" for d in deltas)
        entries = [e for d in deltas for e in (d.get("logprobs") or {}).get("content") or []]
        finish, used = deltas[-1]["finish_reason"], chunks[-1]["usage"]["completion_tokens"]
    else:
        reply = served.chat_completion({"model": "tiny", "messages": USER, **fields})
        choice = reply["choices"][0]
        calls, content = choice["message"]["tool_calls"], choice["message"]["content"] or ""
        entries, finish = choice["logprobs"]["content"], choice["finish_reason"]
        used = reply["usage"]["completion_tokens"]
    assert finish == "tool_calls"
    assert [c["function"]["name"] for c in calls] == ["weather"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris", "days": 2}
    assert content.strip() == ""
    assert [e["logprob"] for e in entries] == [-0.5 - i for i in range(whole)]
    assert used == whole


def test_a_forced_reply_cut_before_its_first_whole_call_ends_as_length(served, monkeypatch):
    ids = cut_reply(served, monkeypatch, '<tool_call>\n{"name": "weather", "arguments": {"ci')
    reply = served.chat_completion(
        {"model": "tiny", "messages": USER, "tools": TOOLS, "tool_choice": "required"}
    )
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "length"
    assert "tool_calls" not in choice["message"]
    assert reply["usage"]["completion_tokens"] == len(ids)


def test_an_unforced_reply_cut_by_its_budget_is_not_cut_back(served, monkeypatch) -> None:
    ids = cut_reply(served, monkeypatch, WHOLE + '\n<tool_call>\n{"name": "noop", "argu')
    reply = served.chat_completion({"model": "tiny", "messages": USER, "tools": TOOLS})
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "length"
    assert reply["usage"]["completion_tokens"] == len(ids)


def test_a_streamed_named_call_arrives_as_one_structured_call(served) -> None:
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=served.url, api_key="unused", max_retries=0, timeout=60)
    stream = client.chat.completions.create(
        model="tiny",
        messages=USER,
        tools=TOOLS,
        tool_choice=NAMED,
        stream=True,
        seed=1,
        max_tokens=120,
    )
    chunks = list(stream)
    calls = [c for chunk in chunks for c in (chunk.choices[0].delta.tool_calls or [])]
    assert [c.function.name for c in calls] == ["weather"]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tool_choice": "required"}, "tool_choice"),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "tool_choice",
        ),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
        ({"response_format": {"type": "yaml"}}, "response_format"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": [1]}}},
            "response_format.json_schema.schema",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"schema": {}, "strict": "yes"},
                }
            },
            "response_format.json_schema.strict",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"schema": {"type": "strin"}},
                }
            },
            "response_format.json_schema.schema",
        ),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {"name": "t", "parameters": {"enum": ["x" * 40_000]}},
                    }
                ],
                "tool_choice": "required",
            },
            "tools[0].function.parameters",
        ),
        (
            {
                "tools": [
                    TOOLS[0],
                    {
                        "type": "function",
                        "function": {
                            "name": "bad",
                            "parameters": {
                                "type": "object",
                                "properties": {"a": {"type": "strin"}},
                            },
                        },
                    },
                ],
                "tool_choice": "required",
            },
            "tools[1].function.parameters",
        ),
    ],
)
def test_what_cannot_be_enforced_is_a_400_naming_the_field(served, fields, param) -> None:
    start = time.perf_counter()
    with pytest.raises(APIError) as caught:
        served.chat_completion({"model": "tiny", "messages": USER, **fields})
    assert (caught.value.status, caught.value.param) == (400, param), caught.value.message
    assert time.perf_counter() - start < 10


def test_a_strict_tool_under_auto_can_only_be_called_with_valid_arguments(served) -> None:
    strict = [{"type": "function", "function": {**TOOLS[0]["function"], "strict": True}}]
    for seed in range(3):
        choice = ask(served, tools=strict, seed=seed, max_tokens=60)
        for call in choice["message"].get("tool_calls") or []:
            jsonschema.validate(json.loads(call["function"]["arguments"]), WEATHER)


def _request(tool_choice: Any) -> PolicyRequest:
    return PolicyRequest(
        messages=list(USER),
        tool_specs=TOOLS,
        task=Task("x"),
        action_format=get_action_format("hermes"),
        max_new_tokens=120,
        tool_choice=tool_choice,
    )


@pytest.mark.parametrize("batching", ["continuous", "waves"])
def test_the_policy_forces_a_named_call(small_model, batching, run_async) -> None:
    model, tokenizer = small_model
    policy = HFPolicy(
        model, tokenizer, temperature=1.0, max_new_tokens=120, seed=2, batching=batching
    )
    generations = run_async(policy.act([_request(NAMED), _request(NAMED), _request(None)]))
    for generation in generations[:2]:
        (call,) = get_action_format("hermes").parse(generation.text).tool_calls
        assert call["function"]["name"] == "weather"
        jsonschema.validate(json.loads(call["function"]["arguments"]), WEATHER)


class Forced(Chatty):
    """Chatty with a tool, asking for a named call at every turn."""

    tool_choice = NAMED

    @property
    def tool_specs(self) -> list:
        return TOOLS


def test_collect_groups_follows_the_environments_tool_choice(small_model) -> None:
    model, tokenizer = small_model
    policy = HFPolicy(model, tokenizer, temperature=1.0, max_new_tokens=120, seed=4)
    groups = collect_groups(
        Forced,
        [Task("a"), Task("b")],
        policy,
        episodes_per_task=2,
        max_turns=2,
        action_format="hermes",
    )
    for episode in (e for g in groups for e in g):
        for turn in episode.turns:
            parsed = get_action_format("hermes").parse(turn.text)
            assert [c["function"]["name"] for c in parsed.tool_calls] == ["weather"], turn.text
