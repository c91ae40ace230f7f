"""OpenAIPolicy against a scripted stdlib server, and against real servers with the tiny model."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from llm_gym.actions import get_action_format
from llm_gym.core.types import Message, ToolSpec
from llm_gym.envs.tool_use_game import ToolUseGameEnv, get_tasks
from llm_gym.errors import InvalidArgumentError, LlmGymError
from llm_gym.policies import (
    Generation,
    PolicyBatchError,
    PolicyError,
    PolicyRequest,
    policy_from_spec,
)
from llm_gym.policies.openai import (
    DEFAULT_MAX_CONCURRENCY,
    DEFAULT_REQUEST_TIMEOUT_S,
    EndpointError,
    EndpointTimeoutError,
    OpenAIPolicy,
    build_messages,
)
from llm_gym.rollout import collect_groups
from tests.conftest import free_port, subprocess_env

HERMES = get_action_format("hermes")
TOOLS: list[ToolSpec] = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Read a fact.",
            "parameters": {"type": "object", "properties": {"key": {"type": "string"}}},
        },
    }
]
CALL = {
    "id": "call_t1_0",
    "type": "function",
    "function": {"name": "lookup", "arguments": '{"key": "Velmora.population"}'},
}
CONVERSATION: list[Message] = [
    {"role": "system", "content": "You answer questions."},
    {"role": "user", "content": "How many people live in Velmora?"},
    {"role": "assistant", "content": "", "tool_calls": [CALL]},
    {"role": "tool", "content": "1200", "tool_call_id": "call_t1_0", "name": "lookup"},
    {"role": "tool", "content": "7", "tool_call_id": "call_t1_1", "name": "lookup"},
]


def request(
    messages: list[Message] | None = None, max_new_tokens: int | None = None
) -> PolicyRequest:
    return PolicyRequest(
        messages=list(messages if messages is not None else CONVERSATION[:2]),
        tool_specs=TOOLS,
        task=get_tasks("val")[0],
        action_format=HERMES,
        max_new_tokens=max_new_tokens,
    )


def completion(content: str | None = "42", **message: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "model": "fake",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content, **message},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 11, "completion_tokens": 1, "total_tokens": 12},
    }


# --- a scripted OpenAI-compatible server -----------------------------------------------------


class FakeEndpoint:
    """Answers POST /v1/chat/completions from a script; records every request.

    Script items (one per request, in arrival order; the default when it runs out):
    ``("ok", body)``, ``("status", code, body, headers)``, ``("sleep", seconds)`` (then ok).
    """

    def __init__(self, default_delay: float = 0.0) -> None:
        self.script: list[tuple[Any, ...]] = []
        self.default_delay = default_delay
        self.requests: list[dict[str, Any]] = []
        self.active = 0
        self.max_active = 0
        self.lock = threading.Lock()
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with endpoint.lock:
                    endpoint.requests.append(
                        {
                            "path": self.path,
                            "headers": dict(self.headers),
                            "body": body,
                            "time": time.perf_counter(),
                        }
                    )
                    endpoint.active += 1
                    endpoint.max_active = max(endpoint.max_active, endpoint.active)
                    action = endpoint.script.pop(0) if endpoint.script else ("sleep", None)
                try:
                    self._perform(action)
                finally:
                    with endpoint.lock:
                        endpoint.active -= 1

            def _perform(self, action: tuple[Any, ...]) -> None:
                status, payload, headers = 200, completion(), {}
                if action[0] == "ok":
                    payload = action[1]
                elif action[0] == "status":
                    _, status, payload, headers = action
                elif action[0] == "sleep":
                    time.sleep(endpoint.default_delay if action[1] is None else action[1])
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    for key, value in headers.items():
                        self.send_header(key, value)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:  # the client gave up on us (timeout tests)
                    self.close_connection = True

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass

        self.server = Server(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def endpoint() -> Iterator[FakeEndpoint]:
    server = FakeEndpoint()
    yield server
    server.close()


def policy_for(endpoint: FakeEndpoint, **kwargs: Any) -> OpenAIPolicy:
    kwargs.setdefault("backoff_base_s", 0.01)
    kwargs.setdefault("api_key_env", "LLM_GYM_TEST_OPENAI_KEY")
    return OpenAIPolicy(model="fake-model", base_url=endpoint.url, seed=0, **kwargs)


def act(policy: OpenAIPolicy, *requests: PolicyRequest) -> list[Generation]:
    return asyncio.run(policy.act(list(requests) or [request()]))


def failure(policy: OpenAIPolicy, *requests: PolicyRequest) -> BaseException:
    """The one request's error: a failed request makes ``act`` raise a ``PolicyBatchError``."""
    with pytest.raises(PolicyBatchError) as info:
        act(policy, *requests)
    [error] = [o for o in info.value.outcomes if isinstance(o, BaseException)]
    assert info.value.__cause__ is error and str(error) in str(info.value)
    return error


# --- the happy path and the request body ------------------------------------------------------


def test_a_completion_becomes_a_generation(endpoint: FakeEndpoint) -> None:
    policy = policy_for(endpoint, temperature=0.7, top_p=0.9, extra_body={"top_k": 20})
    [generation] = act(policy)
    assert generation.text == "42"
    assert generation.finish_reason == "stop"
    assert generation.token_ids is None
    assert generation.metadata["retries"] == 0
    assert generation.metadata["usage"]["completion_tokens"] == 1
    assert generation.metadata["latency_s"] > 0
    [sent] = endpoint.requests
    assert sent["path"] == "/v1/chat/completions"
    body = sent["body"]
    assert body["model"] == "fake-model"
    assert (body["temperature"], body["top_p"], body["top_k"]) == (0.7, 0.9, 20)
    assert "max_tokens" not in body  # neither the request nor the policy set one
    assert "tools" not in body


def test_max_tokens_and_seeds(endpoint: FakeEndpoint) -> None:
    policy = policy_for(endpoint, max_new_tokens=64)
    act(policy, request(), request(max_new_tokens=8))
    act(policy, request())
    bodies = sorted((r["body"] for r in endpoint.requests), key=lambda b: b["seed"])
    assert [b["max_tokens"] for b in bodies] == [64, 8, 64]  # the request's budget wins
    assert [b["seed"] for b in bodies] == [0, 1, 2]  # seed + n: a group's episodes differ
    act(OpenAIPolicy(model="m", base_url=endpoint.url), request())
    assert "seed" not in endpoint.requests[-1]["body"]


def test_tools_are_text_in_the_system_prompt_by_default(endpoint: FakeEndpoint) -> None:
    act(policy_for(endpoint), request(CONVERSATION))
    body = endpoint.requests[0]["body"]
    assert "tools" not in body
    messages = body["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[0]["content"] == "You answer questions.\n\n" + HERMES.render_tool_specs(TOOLS)
    assert '"name": "lookup"' in messages[0]["content"]
    assert messages[2]["content"] == HERMES.render_message(CONVERSATION[2])  # the written text
    assert HERMES.parse(messages[2]["content"]).tool_calls[0]["function"]["name"] == "lookup"
    assert messages[3]["content"] == (
        "<tool_response>\n1200\n</tool_response>\n<tool_response>\n7\n</tool_response>"
    )
    # Without a system message, one holding only the tools comes first.
    built = build_messages(CONVERSATION[1:2], TOOLS, HERMES)
    assert built[0] == {"role": "system", "content": HERMES.render_tool_specs(TOOLS)}
    assert build_messages(CONVERSATION[:2], [], HERMES) == [
        {"role": "system", "content": "You answer questions."},
        {"role": "user", "content": "How many people live in Velmora?"},
    ]


def test_the_episodes_tool_choice_is_sent_with_native_tools(endpoint: FakeEndpoint) -> None:
    named = {"type": "function", "function": {"name": "lookup"}}
    policy = policy_for(endpoint, send_tools=True)
    for choice in (None, "auto", "required", named):
        forced = dataclasses.replace(request(), tool_choice=choice)
        body = policy.build_payload(forced)
        assert body.get("tool_choice") == choice
    text_tools = policy_for(endpoint)
    assert "tool_choice" not in text_tools.build_payload(request())
    with pytest.raises(InvalidArgumentError, match="send_tools=True"):
        text_tools.build_payload(dataclasses.replace(request(), tool_choice="required"))


def test_native_tools_and_tool_call_responses(endpoint: FakeEndpoint) -> None:
    endpoint.script = [("ok", completion(None, tool_calls=[CALL]))]
    [generation] = act(policy_for(endpoint, send_tools=True), request(CONVERSATION))
    body = endpoint.requests[0]["body"]
    assert body["tools"] == TOOLS
    messages = body["messages"]
    assert messages[0] == {"role": "system", "content": "You answer questions."}
    assert messages[2] == {"role": "assistant", "content": "", "tool_calls": [CALL]}
    assert messages[3] == {"role": "tool", "content": "1200", "tool_call_id": "call_t1_0"}
    assert messages[4]["tool_call_id"] == "call_t1_1"
    # A native tool call comes back as text in the episode's action format.
    parsed = HERMES.parse(generation.text)
    assert parsed.is_tool_calls
    assert parsed.tool_calls[0]["function"]["name"] == "lookup"
    assert json.loads(parsed.tool_calls[0]["function"]["arguments"]) == {
        "key": "Velmora.population"
    }


def test_odd_but_valid_answers(endpoint: FakeEndpoint) -> None:
    long = completion("abc")
    long["choices"][0]["finish_reason"] = "length"
    parts = completion([{"type": "text", "text": "4"}, {"type": "text", "text": "2"}])
    bad_call = {**CALL, "function": {"name": "lookup", "arguments": "{not json"}}
    endpoint.script = [("ok", long), ("ok", parts), ("ok", completion("", tool_calls=[bad_call]))]
    policy = policy_for(endpoint, max_concurrency=1)
    first, second, third = act(policy, request(), request(), request())
    assert (first.text, first.finish_reason, first.metadata["finish_reason"]) == (
        "abc",
        "length",
        "length",
    )
    assert second.text == "42"
    assert "{not json" in third.text and "not valid JSON" in third.metadata["tool_call_error"]
    endpoint.script = [("ok", {"object": "chat.completion"})]
    error = failure(policy)
    assert isinstance(error, EndpointError)
    assert "choices must be a non-empty array, actual value: missing" in str(error)
    policy.close()


def test_authorization_header_only_with_the_key(
    endpoint: FakeEndpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LLM_GYM_TEST_OPENAI_KEY", raising=False)
    policy = policy_for(endpoint)
    act(policy)
    assert "Authorization" not in endpoint.requests[-1]["headers"]
    monkeypatch.setenv("LLM_GYM_TEST_OPENAI_KEY", "sk-test-123")
    act(policy)
    assert endpoint.requests[-1]["headers"]["Authorization"] == "Bearer sk-test-123"
    assert "sk-test-123" not in json.dumps(policy.describe())


def test_describe() -> None:
    policy = OpenAIPolicy(model="m", base_url="http://127.0.0.1:1/v1/", max_new_tokens=32)
    description = policy.describe()
    assert description["name"] == "openai"
    assert description["base_url"] == "http://127.0.0.1:1/v1"
    assert {k: description[k] for k in ("model", "temperature", "top_p", "send_tools")} == {
        "model": "m",
        "temperature": 1.0,
        "top_p": 1.0,
        "send_tools": False,
    }
    assert description["max_new_tokens"] == 32
    assert policy.max_concurrency == DEFAULT_MAX_CONCURRENCY
    assert policy.request_timeout_s == DEFAULT_REQUEST_TIMEOUT_S


@pytest.mark.parametrize(
    "kwargs",
    [
        {"base_url": "127.0.0.1:8000/v1"},
        {"base_url": "ftp://x/v1"},
        {"model": ""},
        {"temperature": -1},
        {"top_p": 0},
        {"max_new_tokens": 0},
        {"max_concurrency": 0},
        {"max_retries": -1},
        {"request_timeout_s": 0},
    ],
)
def test_bad_arguments_are_rejected(kwargs: dict[str, Any]) -> None:
    arguments = {"model": "m", "base_url": "http://127.0.0.1:8000/v1", **kwargs}
    with pytest.raises(InvalidArgumentError):
        OpenAIPolicy(**arguments)


def test_policy_from_spec_builds_it() -> None:
    policy = policy_from_spec("openai:my-model@http://127.0.0.1:9/v1", seed=3, temperature=0.0)
    assert isinstance(policy, OpenAIPolicy)
    assert (policy.model, policy.base_url, policy.seed, policy.temperature) == (
        "my-model",
        "http://127.0.0.1:9/v1",
        3,
        0.0,
    )


# --- failures ------------------------------------------------------------------------------


def error(message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error"}}


def test_server_errors_are_retried(endpoint: FakeEndpoint) -> None:
    endpoint.script = [("status", 500, error("boom"), {}), ("status", 503, error("busy"), {})]
    [generation] = act(policy_for(endpoint))
    assert generation.text == "42"
    assert len(endpoint.requests) == 3
    assert generation.metadata["retries"] == 2


def test_rate_limits_back_off(endpoint: FakeEndpoint) -> None:
    endpoint.script = [("status", 429, error("slow down"), {})]
    [generation] = act(policy_for(endpoint, backoff_base_s=0.2))
    first, second = (r["time"] for r in endpoint.requests)
    assert second - first >= 0.1  # 0.2 s times a jitter factor in [0.5, 1.5)
    assert generation.metadata["retries"] == 1
    # Retry-After is honoured (up to backoff_max_s).
    endpoint.script = [("status", 429, error("slow down"), {"Retry-After": "0.3"})]
    act(policy_for(endpoint, backoff_base_s=0.001))
    first, second = (r["time"] for r in endpoint.requests[-2:])
    assert second - first >= 0.3


def test_retries_run_out(endpoint: FakeEndpoint) -> None:
    endpoint.script = [("status", 502, error("bad gateway"), {})] * 5
    failed = failure(policy_for(endpoint, max_retries=2))
    assert isinstance(failed, EndpointError) and not failed.fatal
    assert len(endpoint.requests) == 3
    assert failed.status == 502
    assert "3 attempts" in str(failed) and "bad gateway" in str(failed)


def test_a_client_error_is_not_retried(endpoint: FakeEndpoint) -> None:
    endpoint.script = [("status", 400, error("temperature must be <= 2"), {})]
    failed = failure(policy_for(endpoint))
    assert isinstance(failed, EndpointError) and not failed.fatal
    assert len(endpoint.requests) == 1
    assert isinstance(failed, LlmGymError)
    assert failed.status == 400
    assert failed.server_message == "temperature must be <= 2"
    assert "HTTP 400" in str(failed) and "temperature must be <= 2" in str(failed)


def test_a_timeout_is_retried_once_then_raises(endpoint: FakeEndpoint) -> None:
    endpoint.script = [("sleep", 1.0), ("sleep", 1.0), ("sleep", 1.0)]
    policy = policy_for(endpoint, request_timeout_s=0.3)
    start = time.perf_counter()
    failed = failure(policy)
    assert time.perf_counter() - start < 0.9  # aborted at the deadline, not at the answer
    assert isinstance(failed, EndpointTimeoutError)
    assert len(endpoint.requests) == 2
    assert isinstance(failed, TimeoutError) and isinstance(failed, LlmGymError)
    assert "request_timeout_s=0.3" in str(failed)
    # One timeout, then an answer: the timed-out output is discarded, the retry is used.
    endpoint.script = [("sleep", 1.0), ("ok", completion("fresh"))]
    [generation] = act(policy)
    assert generation.text == "fresh"
    assert generation.metadata["retries"] == 1


def test_connection_errors_are_retried_then_raise() -> None:
    port = free_port()
    policy = OpenAIPolicy(
        model="m", base_url=f"http://127.0.0.1:{port}/v1", max_retries=1, backoff_base_s=0.01
    )
    failed = failure(policy)
    assert isinstance(failed, EndpointError) and "connection error" in str(failed)


def test_the_concurrency_limit_holds(endpoint: FakeEndpoint) -> None:
    endpoint.default_delay = 0.1
    generations = act(policy_for(endpoint, max_concurrency=2), *[request() for _ in range(6)])
    assert len(generations) == 6
    # never more than the limit (exactly 2 on an idle machine; a loaded one may overlap less)
    assert 1 <= endpoint.max_active <= 2


def test_a_failure_fails_the_collection(endpoint: FakeEndpoint) -> None:
    endpoint.script = [("status", 401, error("invalid api key"), {})] * 4
    with pytest.raises(PolicyError, match="invalid api key"):
        collect_groups(ToolUseGameEnv, get_tasks("val")[:2], policy_for(endpoint), max_turns=2)


# --- real servers with the tiny model ------------------------------------------------------


@pytest.fixture(scope="module")
def served(small_model_dir) -> Iterator[Any]:
    from llm_gym.serving.openai_server import serve

    with serve(small_model_dir, model_name="tiny") as server:
        yield server


class RecordingPolicy(OpenAIPolicy):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.generations: list[Generation] = []

    async def act(self, requests):  # type: ignore[override]
        generations = await super().act(requests)
        self.generations.extend(generations)
        return generations


def test_real_server_through_collect_groups(served: Any) -> None:
    policy = RecordingPolicy(model="tiny", base_url=served.url, seed=0, max_new_tokens=12)
    groups = collect_groups(
        ToolUseGameEnv, get_tasks("val")[:2], policy, episodes_per_task=2, max_turns=3
    )
    episodes = [episode for group in groups for episode in group]
    assert len(episodes) == 4
    for episode in episodes:
        assert episode.error is None
        assert episode.turns and all(isinstance(turn.text, str) for turn in episode.turns)
    assert policy.generations
    for generation in policy.generations:
        usage = generation.metadata["usage"]
        assert usage["prompt_tokens"] > 0
        assert 1 <= usage["completion_tokens"] <= 12
        assert generation.finish_reason in ("stop", "length")


def test_real_server_through_run_and_report(served: Any) -> None:
    from llm_gym.eval import run_and_report

    policy = OpenAIPolicy(model="tiny", base_url=served.url, seed=1, send_tools=True)
    report = run_and_report(
        "ToolUseGame-v0",
        policy,
        episodes=4,
        max_new_tokens=8,
        max_turns=2,
        progress=False,
        print_report=False,
    )
    assert report.metrics["episodes"] == 4
    assert report.policy["name"] == "openai" and report.policy["send_tools"] is True
    assert all(episode.error is None for episode in report.episodes)


def test_served_model_eval_samples_the_envs_budget(served: Any) -> None:
    """A policy with no budget of its own against ``llm-gym serve``: each request asks for
    GuessNumber's 16 tokens per turn (the report says whose), never the server's default."""
    from llm_gym.eval import run_and_report

    policy = RecordingPolicy(model="tiny", base_url=served.url, seed=2)
    assert policy.max_new_tokens is None
    report = run_and_report(
        "GuessNumber-v0", policy, episodes=2, max_turns=2, progress=False, print_report=False
    )
    assert report.settings["max_new_tokens"] == 16
    assert policy.generations
    assert all(1 <= g.metadata["usage"]["completion_tokens"] <= 16 for g in policy.generations)


def post(url: str, body: Any, method: str = "POST") -> tuple[int, dict[str, Any]]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(
        url,
        data=data if method == "POST" else None,
        method=method,
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_serve_answers_like_openai(served: Any) -> None:
    url = served.url + "/chat/completions"
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
    status, answer = post(url, {**body, "temperature": 0})
    assert status == 200
    assert answer["object"] == "chat.completion" and answer["model"] == "tiny"
    choice = answer["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert isinstance(choice["message"]["content"], str)
    assert choice["finish_reason"] in ("stop", "length")
    usage = answer["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert usage["completion_tokens"] <= 5
    # Greedy is deterministic, and so is sampling with a seed.
    assert post(url, {**body, "temperature": 0})[1]["choices"] == answer["choices"]
    seeded = [post(url, {**body, "seed": 7})[1]["choices"] for _ in range(2)]
    assert seeded[0] == seeded[1]
    status, models = post(served.url + "/models", None, method="GET")
    assert status == 200 and [m["id"] for m in models["data"]] == ["tiny"]


@pytest.mark.parametrize(
    ("path", "body", "method", "status", "param"),
    [
        ("/chat/completions", b"{not json", "POST", 400, None),
        ("/chat/completions", {"model": "tiny"}, "POST", 400, "messages"),
        ("/chat/completions", {"model": "tiny", "messages": [{"role": "x"}]}, "POST", 400, None),
        ("/chat/completions", {"messages": [{"role": "user"}]}, "POST", 400, "model"),
        ("/chat/completions", {"model": "other", "messages": []}, "POST", 404, "model"),
        (
            "/chat/completions",
            {"model": "tiny", "messages": [{"role": "user"}], "temperature": "hot"},
            "POST",
            400,
            "temperature",
        ),
        (
            "/chat/completions",
            {"model": "tiny", "messages": [{"role": "user"}], "max_tokens": 0},
            "POST",
            400,
            "max_tokens",
        ),
        (
            "/chat/completions",
            {"model": "tiny", "messages": [{"role": "user"}], "stream": "yes"},
            "POST",
            400,
            "stream",
        ),
        ("/chat/completions", None, "GET", 405, None),
        ("/embeddings", {}, "POST", 404, None),
    ],
)
def test_serve_errors(
    served: Any, path: str, body: Any, method: str, status: int, param: str | None
) -> None:
    code, answer = post(served.url + path, body, method=method)
    assert code == status
    assert answer["error"]["message"]
    if param is not None:
        assert answer["error"]["param"] == param


def test_the_policy_names_a_wrong_model(served: Any) -> None:
    failed = failure(OpenAIPolicy(model="nope", base_url=served.url))
    assert isinstance(failed, EndpointError) and "does not exist" in str(failed)
    assert failed.status == 404 and failed.fatal


def test_cli_serve(small_model_dir, monkeypatch: pytest.MonkeyPatch) -> None:
    from llm_gym.cli import main
    from llm_gym.serving.openai_server import ChatCompletionServer

    answers = []

    def wait(self: ChatCompletionServer) -> None:  # instead of blocking until Ctrl-C
        body = {"model": "cli-tiny", "messages": [{"role": "user", "content": "hi"}]}
        answers.append(post(self.url + "/chat/completions", {**body, "max_tokens": 3}))

    monkeypatch.setattr(ChatCompletionServer, "wait", wait)
    out = io.StringIO()
    args = ["serve", str(small_model_dir), "--port", "0", "--model-name", "cli-tiny", "--quiet"]
    assert main(args, out=out) == 0
    assert "serving 'cli-tiny' at http://127.0.0.1:" in out.getvalue()
    [(status, answer)] = answers
    assert status == 200 and answer["usage"]["completion_tokens"] <= 3


def test_transformers_serve(small_model_dir, tmp_path) -> None:
    """``transformers serve`` (needs ``transformers[serving]``: fastapi, uvicorn, openai), run as
    its CLI in a process of its own (its Python entry point changed: 5.25 dropped
    ``Serve(non_blocking=True)`` and blocks in the constructor)."""
    from transformers.utils.import_utils import is_serve_available

    if not is_serve_available():
        pytest.skip("transformers serve needs transformers[serving] (fastapi, uvicorn, openai)")
    port = free_port()
    command = [sys.executable, "-m", "transformers.cli.transformers", "serve", str(small_model_dir),
               "--host", "127.0.0.1", "--port", str(port), "--device", "cpu"]  # fmt: skip
    log = (tmp_path / "serve.log").open("w")
    server = subprocess.Popen(command, env=subprocess_env(tmp_path), stdout=log, stderr=log)
    try:
        base_url = f"http://127.0.0.1:{port}/v1"
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(base_url + "/models", timeout=2).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError((tmp_path / "serve.log").read_text()[-2000:]) from None
                time.sleep(0.2)
        policy = RecordingPolicy(model=str(small_model_dir), base_url=base_url, max_new_tokens=8)
        groups = collect_groups(ToolUseGameEnv, get_tasks("val")[:2], policy, max_turns=2)
        assert all(episode.error is None for group in groups for episode in group)
        assert all(isinstance(g.text, str) for g in policy.generations)
        assert all(g.metadata["usage"]["completion_tokens"] >= 1 for g in policy.generations)
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()
