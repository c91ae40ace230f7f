"""``POST /v1/responses`` over HTTP with the tiny model, read by the official ``openai`` client
(``client.responses.create``, its stream and its stream helper) and run by the OpenAI Agents
SDK with its default model (``OpenAIResponsesModel``)."""

from __future__ import annotations

import asyncio
import http.client
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

from llm_gym.serving.generation import TokenOut  # noqa: E402
from llm_gym.serving.openai_server import ChatCompletionServer, serve  # noqa: E402

TOOLS = [
    {
        "type": "function",
        "name": "lookup",
        "description": "Look a key up.",
        "parameters": {
            "type": "object",
            "properties": {"key": {"type": "string"}},
            "required": ["key"],
            "additionalProperties": False,
        },
        "strict": True,
    }
]
CALL_TEXT = (
    'Let me check.\n<tool_call>\n{"name": "lookup", "arguments": {"key": "a"}}\n</tool_call>'
)
TEXT_EVENTS = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
]


@pytest.fixture(scope="module")
def served(small_model_dir) -> Iterator[ChatCompletionServer]:
    with serve(small_model_dir, model_name="tiny", device="cpu") as server:
        yield server


@pytest.fixture
def client(served: ChatCompletionServer) -> Any:
    return openai.OpenAI(base_url=served.url, api_key="unused", max_retries=0, timeout=60)


def scripted(
    monkeypatch: pytest.MonkeyPatch, server: ChatCompletionServer, *texts: str
) -> list[str]:
    """Make the model "write" ``texts`` in turn (each then end of sequence; the last one
    again once they run out); returns the prompts it was given, decoded."""
    tokenizer = server.tokenizer
    prompts: list[str] = []

    def fake(model, prompt_ids, sampling, *, eos_ids, pad_id, on_token) -> None:
        prompts.append(tokenizer.decode(prompt_ids))
        text = texts[min(len(prompts), len(texts)) - 1]
        ids = [*tokenizer.encode(text, add_special_tokens=False), eos_ids[0]]
        for token_id in ids[: sampling.max_tokens]:
            logprob = -0.5 if sampling.logprobs is not None else None
            if on_token(TokenOut(token_id, logprob, ((token_id, -0.5),))):
                return

    monkeypatch.setattr("llm_gym.serving.engine.sample_tokens", fake)
    return prompts


def post(server: ChatCompletionServer, body: Any, headers: dict[str, str] | None = None) -> Any:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    connection = http.client.HTTPConnection(server.host, server.port, timeout=60)
    try:
        connection.request(
            "POST", "/v1/responses", data, headers or {"Content-Type": "application/json"}
        )
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def test_a_text_response_from_the_model(client: Any) -> None:
    kwargs = {"model": "tiny", "input": "What is 2+2?", "max_output_tokens": 6, "temperature": 0}
    answer = client.responses.create(instructions="Answer briefly.", **kwargs)
    assert answer.object == "response" and answer.id.startswith("resp_")
    assert answer.model == "tiny" and answer.instructions == "Answer briefly."
    [item] = answer.output
    assert item.type == "message" and item.role == "assistant" and item.status == answer.status
    assert item.content[0].type == "output_text" and answer.output_text == item.content[0].text
    usage = answer.usage
    assert usage.output_tokens <= 6 and usage.input_tokens > 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    if usage.output_tokens == 6:  # the budget ran out
        assert answer.status == "incomplete"
        assert answer.incomplete_details.reason == "max_output_tokens"
    else:
        assert answer.status == "completed"

    again = client.responses.create(instructions="Answer briefly.", **kwargs)
    assert again.output_text == answer.output_text  # greedy: the same text

    events = list(client.responses.create(instructions="Answer briefly.", stream=True, **kwargs))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    last = events[-1]
    assert last.type == f"response.{answer.status}"
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == answer.output_text == last.response.output_text
    assert last.response.usage.output_tokens == usage.output_tokens


def test_the_stream_is_the_documented_sequence(
    served: ChatCompletionServer, client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    scripted(monkeypatch, served, "Paris is the capital.")
    events = list(client.responses.create(model="tiny", input="Capital?", stream=True))
    kinds = [e.type for e in events]
    deltas = kinds.count("response.output_text.delta")
    assert deltas > 1
    assert kinds == TEXT_EVENTS[:4] + ["response.output_text.delta"] * deltas + TEXT_EVENTS[5:]
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    done = events[-1].response
    assert done.status == "completed" and done.output_text == "Paris is the capital."
    assert done.id == events[0].response.id
    item_ids = {e.item_id for e in events if hasattr(e, "item_id")}
    assert item_ids == {done.output[0].id}

    # the SDK's stream helper rebuilds the response from the events (and checks their order)
    with client.responses.stream(model="tiny", input="Capital?") as stream:
        texts = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(texts) == final.output_text == "Paris is the capital."


def test_a_reply_cut_by_max_output_tokens_is_incomplete(
    served: ChatCompletionServer, client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    scripted(monkeypatch, served, "Paris is the capital of France.")
    answer = client.responses.create(model="tiny", input="Capital?", max_output_tokens=2)
    assert answer.status == "incomplete" and answer.usage.output_tokens == 2
    assert answer.incomplete_details.reason == "max_output_tokens"
    assert answer.output[0].status == "incomplete" and answer.output_text
    events = list(
        client.responses.create(model="tiny", input="Capital?", max_output_tokens=2, stream=True)
    )
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.output_text == answer.output_text
    assert events[-2].type == "response.output_item.done" and events[-2].item.status == "incomplete"


def test_function_calls_and_their_outputs_round_trip(
    served: ChatCompletionServer, client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    prompts = scripted(monkeypatch, served, CALL_TEXT, "The value is 42.")
    question = [{"role": "user", "content": "What is a?"}]
    first = client.responses.create(model="tiny", input=question, tools=TOOLS)
    assert first.status == "completed" and first.tools[0].name == "lookup"
    message, call = first.output
    assert message.type == "message" and message.content[0].text == "Let me check."
    assert call.type == "function_call" and call.name == "lookup" and call.call_id
    assert json.loads(call.arguments) == {"key": "a"} and call.status == "completed"

    follow_up = [
        *question,
        *[item.model_dump(exclude_none=True) for item in first.output],
        {"type": "function_call_output", "call_id": call.call_id, "output": "forty-two"},
    ]
    second = client.responses.create(model="tiny", input=follow_up, tools=TOOLS)
    assert second.output_text == "The value is 42."
    assert "forty-two" in prompts[-1] and '"key": "a"' in prompts[-1]  # the call and its result

    scripted(monkeypatch, served, CALL_TEXT)
    events = list(client.responses.create(model="tiny", input=question, tools=TOOLS, stream=True))
    kinds = [e.type for e in events]
    assert kinds[-5:] == [
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert "response.output_text.done" in kinds[:-5]
    done = events[-1].response
    assert [item.type for item in done.output] == ["message", "function_call"]
    assert done.output[0].content[0].text.strip() == "Let me check."
    assert json.loads(done.output[1].arguments) == {"key": "a"}
    assert events[-3].arguments == done.output[1].arguments and events[-3].name == "lookup"

    # tool_choice "none": the call is the model's text
    plain = client.responses.create(model="tiny", input=question, tools=TOOLS, tool_choice="none")
    assert plain.output_text == CALL_TEXT and len(plain.output) == 1


def test_logprobs_on_the_output_text(
    served: ChatCompletionServer, client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    scripted(monkeypatch, served, "Paris.")
    answer = client.responses.create(
        model="tiny", input="Capital?", include=["message.output_text.logprobs"], top_logprobs=1
    )
    part = answer.output[0].content[0]
    assert "".join(entry.token for entry in part.logprobs) == "Paris."
    assert all(entry.logprob == -0.5 and len(entry.top_logprobs) == 1 for entry in part.logprobs)
    plain = client.responses.create(model="tiny", input="Capital?")
    assert plain.output[0].content[0].logprobs == []


def test_a_failure_mid_stream_is_an_error_event_then_failed(
    served: ChatCompletionServer, client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokenizer = served.tokenizer

    def broken(model, prompt_ids, sampling, *, eos_ids, pad_id, on_token) -> None:
        for token_id in tokenizer.encode("Par", add_special_tokens=False):
            on_token(TokenOut(token_id, None, ()))
        raise RuntimeError("the device fell over")

    monkeypatch.setattr("llm_gym.serving.engine.sample_tokens", broken)
    events = list(client.responses.create(model="tiny", input="Capital?", stream=True))
    assert [e.type for e in events[-2:]] == ["error", "response.failed"]
    assert "the device fell over" in events[-2].message
    assert events[-1].response.status == "failed"
    assert "the device fell over" in events[-1].response.error.message


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": [{"type": "message", "role": "user", "content": [{"type": "bogus"}]}]}, None),
        ({"input": [{"type": "web_search_call", "id": "ws_1"}]}, "input[0].type"),
        ({"input": [{"type": "function_call_output", "call_id": "c9", "output": "x"}]}, None),
        ({"input": "hi", "previous_response_id": "resp_123"}, "previous_response_id"),
        ({"input": "hi", "tool_choice": "required"}, "tool_choice"),  # no tools to call
        ({"input": "x" * 2_000_000}, "input"),  # longer than the context
        ({"input": "x" * 2_000_000, "stream": True}, "input"),  # a plain 400, before any event
        ({"input": [{"role": "user", "content": "x"}] * 50_000}, "input"),  # too many messages
    ],
)
def test_hostile_requests_are_400s_naming_the_field(
    served: ChatCompletionServer, body: dict[str, Any], param: str | None
) -> None:
    start = time.monotonic()
    status, answer = post(served, {"model": "tiny", **body})
    assert status == 400, answer
    error = answer["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    if param is not None:
        assert error["param"] == param, error
    else:
        assert error["param"].startswith("input[0]"), error
    assert time.monotonic() - start < 10


def test_the_access_guard_and_body_limits_hold(served: ChatCompletionServer) -> None:
    body = {"model": "tiny", "input": "hi"}
    status, answer = post(served, body, {"Content-Type": "text/plain"})
    assert status == 415 and answer["error"]["param"] == "Content-Type"
    headers = {"Content-Type": "application/json", "Origin": "https://evil.example"}
    assert post(served, body, headers)[0] == 403
    with ChatCompletionServer(
        served.model, served.tokenizer, model_name="tiny", max_body_bytes=1000
    ) as small:
        status, answer = post(small, {**body, "input": "x" * 5000})
        assert status == 413 and "1000 bytes" in answer["error"]["message"]


def test_the_agents_sdk_runs_with_its_default_model(
    served: ChatCompletionServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    agents = pytest.importorskip("agents")
    from agents.models.openai_provider import OpenAIProvider
    from agents.models.openai_responses import OpenAIResponsesModel

    prompts = scripted(monkeypatch, served, CALL_TEXT, "The value is 42.")
    looked_up: list[str] = []

    @agents.function_tool
    def lookup(key: str) -> str:
        """Look a key up."""
        looked_up.append(key)
        return "forty-two"

    client = openai.AsyncOpenAI(base_url=served.url, api_key="unused", max_retries=0)
    provider = OpenAIProvider(openai_client=client)
    assert isinstance(provider.get_model("tiny"), OpenAIResponsesModel)  # the SDK's default
    agent = agents.Agent(name="helper", instructions="Use lookup.", tools=[lookup], model="tiny")
    config = agents.RunConfig(model_provider=provider, tracing_disabled=True)

    async def both() -> tuple[Any, Any]:
        result = await agents.Runner.run(agent, "What is a?", run_config=config)
        prompts.clear()
        streamed = agents.Runner.run_streamed(agent, "What is a?", run_config=config)
        async for _ in streamed.stream_events():
            pass
        return result, streamed

    start = time.monotonic()
    result, streamed = asyncio.run(both())
    assert time.monotonic() - start < 10
    assert result.final_output == "The value is 42." == streamed.final_output
    assert looked_up == ["a", "a"] and len(prompts) == 2 and "forty-two" in prompts[1]
