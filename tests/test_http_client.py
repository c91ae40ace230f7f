"""The HTTP client under OpenAIPolicy and EndpointTeacher (:mod:`llm_gym.policies.http`) against a
stub server: the response size cap, non-JSON and wrong-shaped answers (a table, and a seeded fuzz of
the parser), per-request failure isolation in a collection, fatal refusals, keep-alive,
cancellation, use from several event loops, and the request side (headers, proxies, text)."""

from __future__ import annotations

import asyncio
import copy
import gc
import json
import random
import select
import socket
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from llm_gym import TruncationCause
from llm_gym.actions import get_action_format
from llm_gym.envs.tool_use_game import ToolUseGameEnv, get_tasks
from llm_gym.errors import InvalidArgumentError
from llm_gym.policies import PolicyBatchError, PolicyError, PolicyRequest
from llm_gym.policies.http import (
    ERROR_BODY_BYTES,
    EndpointError,
    JsonClient,
    MalformedResponseError,
)
from llm_gym.policies.openai import OpenAIPolicy
from llm_gym.policies.openai_messages import reply_text
from llm_gym.policies.openai_reply import parse_chat_completion
from llm_gym.rollout import collect_groups

TASKS = list(get_tasks("val")[:3])
Answer = tuple[int, dict[str, str], bytes | Iterable[bytes]]
"""``(status, headers, body)``; an iterable body is sent chunked, chunk by chunk."""


def completion(content: Any = "42", **choice: Any) -> dict[str, Any]:
    message = {"role": "assistant", "content": content}
    return {
        "choices": [{"index": 0, "message": message, "finish_reason": "stop", **choice}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }


def json_answer(body: Any, status: int = 200, **headers: str) -> Answer:
    return status, {"Content-Type": "application/json", **headers}, json.dumps(body).encode()


class Stub:
    """A loopback HTTP/1.1 server: ``respond(request_body) -> Answer``; it records every request
    (body, headers, the client's port) and how many connections are open."""

    def __init__(self) -> None:
        self.respond: Callable[[Any], Answer] = lambda body: json_answer(completion())
        self.requests: list[dict[str, Any]] = []
        self.open = 0
        self.connection: socket.socket | None = None
        self.lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def setup(self) -> None:
                super().setup()
                with stub.lock:
                    stub.open += 1

            def finish(self) -> None:
                with stub.lock:
                    stub.open -= 1
                super().finish()

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers["Content-Length"]))
                with stub.lock:
                    port = self.client_address[1]
                    stub.requests.append(
                        {"body": json.loads(raw), "headers": dict(self.headers), "port": port}
                    )
                    stub.connection = self.connection
                status, headers, body = stub.respond(json.loads(raw))
                try:
                    self.send_response(status)
                    for key, value in headers.items():
                        self.send_header(key, value)
                    if isinstance(body, bytes):
                        self.send_header("Content-Length", str(len(body)))
                        self.end_headers()
                        self.wfile.write(body)
                        return
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    for chunk in body:
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    self.wfile.write(b"0\r\n\r\n")
                except OSError:  # the client stopped reading: that is the point of some tests
                    self.close_connection = True

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.handle_error = lambda *args: None  # type: ignore[method-assign]
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        ).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def wait_closed(self, timeout: float = 2.0) -> bool:
        """Whether every connection to the stub got closed within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while self.open and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.open == 0

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stub() -> Iterator[Stub]:
    server = Stub()
    yield server
    server.close()


def request(task_index: int = 0) -> PolicyRequest:
    task = TASKS[task_index]
    return PolicyRequest(
        messages=[{"role": "user", "content": task.prompt}],
        tool_specs=[],
        task=task,
        action_format=get_action_format("hermes"),
    )


def policy_for(stub: Stub, **kwargs: Any) -> OpenAIPolicy:
    kwargs.setdefault("backoff_base_s", 0.001)
    kwargs.setdefault("api_key_env", "LLM_GYM_TEST_HTTP_KEY")
    return OpenAIPolicy("m", stub.url, **kwargs)


def failure(policy: OpenAIPolicy, count: int = 1) -> BaseException:
    """The error of the first of ``count`` requests (``act`` raises a PolicyBatchError)."""
    with pytest.raises(PolicyBatchError) as info:
        asyncio.run(policy.act([request() for _ in range(count)]))
    return info.value.outcomes[0]  # type: ignore[return-value]


# --- the answer: size, encoding, JSON ---------------------------------------------------------


def test_an_answer_past_the_cap_is_refused(stub: Stub) -> None:
    big = json.dumps(completion("x" * 5000)).encode()
    policy = policy_for(stub, max_response_bytes=1000)
    stub.respond = lambda body: (200, {"Content-Type": "application/json"}, big)
    error = failure(policy)  # refused from its Content-Length, before reading
    assert isinstance(error, MalformedResponseError) and not error.fatal
    assert "max_response_bytes=1000" in str(error) and "Content-Length: " in str(error)
    stub.respond = lambda body: (200, {"Content-Type": "application/json"}, [big[:600], big[600:]])
    error = failure(policy)  # chunked: no length announced, stopped while reading
    assert "max_response_bytes=1000" in str(error) and "went past it" in str(error)
    assert len(stub.requests) == 2  # not retried


@pytest.mark.parametrize("length", ["9" * 5000, "\u00b2", "-1", "1e3"])
def test_an_odd_content_length_raises_only_typed_errors(stub: Stub, length: str) -> None:
    body = json.dumps(completion()).encode()
    stub.respond = lambda _: (200, {"Content-Type": "application/json"}, body)
    original = stub.server.RequestHandlerClass.send_header

    def send_header(self: Any, key: str, value: str) -> None:  # the length the test wants
        if key == "Content-Length":
            value = length
        original(self, key, value)

    stub.server.RequestHandlerClass.send_header = send_header  # type: ignore[method-assign]
    try:
        with pytest.raises(PolicyBatchError) as info:
            asyncio.run(policy_for(stub, max_retries=0).act([request()]))
    finally:
        stub.server.RequestHandlerClass.send_header = original  # type: ignore[method-assign]
    assert isinstance(info.value.outcomes[0], EndpointError), repr(info.value.outcomes[0])


def test_an_endless_answer_is_read_no_further_than_the_cap(stub: Stub) -> None:
    sent = [0]

    def endless() -> Iterator[bytes]:
        chunk = b"x" * 65536
        while sent[0] < 2**30:
            sent[0] += len(chunk)
            yield chunk

    stub.respond = lambda body: (200, {"Content-Type": "application/json"}, endless())
    start = time.perf_counter()
    error = failure(policy_for(stub, max_response_bytes=2**20))
    assert "max_response_bytes=1048576" in str(error)
    assert time.perf_counter() - start < 5
    assert stub.wait_closed()  # the connection was dropped, not drained
    assert sent[0] < 64 * 2**20  # the cap plus what the sockets buffered


def test_an_error_body_is_cut_not_refused(stub: Stub) -> None:
    message = "no such thing " + "y" * (4 * ERROR_BODY_BYTES)
    stub.respond = lambda body: json_answer({"error": {"message": message}}, status=400)
    error = failure(policy_for(stub))
    assert isinstance(error, EndpointError) and error.status == 400
    # Cut, the JSON does not parse: the message is the start of the text (at most 500 chars).
    assert "no such thing" in str(error.server_message) and len(str(error.server_message)) <= 500


@pytest.mark.parametrize(
    ("headers", "body", "words"),
    [
        (
            {"Content-Type": "text/html"},
            b"<html>login</html>",
            "Content-Type 'text/html', not JSON",
        ),
        ({"Content-Type": "application/json"}, b"{not json", "not JSON (Expecting property name"),
        ({"Content-Type": "application/json"}, b'{"a": "\xff"}', "not JSON"),
        ({}, b"[" * 100_000 + b"]" * 100_000, "not JSON (nested too deeply)"),
        ({}, b"[" * 990 + b"]" * 990, "not JSON (nested too deeply)"),
        ({"Content-Type": "application/json", "Content-Encoding": "gzip"}, b"\x1f\x8b", "gzip"),
        ({"Content-Type": "application/json"}, b"", "not JSON"),
    ],
)
def test_a_body_that_is_not_json_is_refused(
    stub: Stub, headers: dict[str, str], body: bytes, words: str
) -> None:
    stub.respond = lambda _: (200, headers, body)
    error = failure(policy_for(stub))
    assert isinstance(error, MalformedResponseError), error
    assert words in str(error) and stub.url in str(error) and error.status == 200


def test_json_with_a_vendor_content_type_and_escaped_surrogates_is_read(stub: Stub) -> None:
    body = b'{"choices": [{"message": {"content": "4\\ud8002"}, "finish_reason": "stop"}]}'
    stub.respond = lambda _: (200, {"Content-Type": "application/vnd.x+json; charset=utf-8"}, body)
    policy = policy_for(stub)
    [generation] = asyncio.run(policy.act([request()]))
    assert generation.text == "4\ufffd2"  # valid UTF-8: it can go back in the next request
    generation.text.encode("utf-8")


# --- wrong shapes ---------------------------------------------------------------------------


def with_choice(**changes: Any) -> dict[str, Any]:
    body = completion()
    body["choices"][0].update(changes)
    return body


def with_message(**changes: Any) -> dict[str, Any]:
    body = completion()
    body["choices"][0]["message"].update(changes)
    return body


def call(**function: Any) -> dict[str, Any]:
    return {
        "id": "c1",
        "type": "function",
        "function": {"name": "f", "arguments": "{}", **function},
    }


M = "choices[0].message"
WRONG_SHAPES = [
    ([], "the body"),
    ("text", "the body"),
    ({}, "choices"),
    ({"choices": {}}, "choices"),
    ({"choices": []}, "choices"),
    ({"choices": ["x"]}, "choices[0]"),
    ({"choices": [{}]}, M),
    ({"choices": [{"message": None}]}, M),
    ({"choices": [{"message": ["hi"]}]}, M),
    (with_message(content=42), f"{M}.content"),
    (with_message(content={"text": "hi"}), f"{M}.content"),
    (with_message(content=["hi"]), f"{M}.content[0]"),
    (with_message(content=[{"type": "text", "text": 7}]), f"{M}.content[0].text"),
    (with_message(tool_calls={"id": "c1"}), f"{M}.tool_calls"),
    (with_message(tool_calls="call"), f"{M}.tool_calls"),
    (with_message(tool_calls=[None]), f"{M}.tool_calls[0]"),
    (with_message(tool_calls=[{"id": "c1"}]), f"{M}.tool_calls[0].function"),
    (with_message(tool_calls=[{"function": "f()"}]), f"{M}.tool_calls[0].function"),
    (with_message(tool_calls=[call(name=None)]), f"{M}.tool_calls[0].function.name"),
    (with_message(tool_calls=[call(name=["f"])]), f"{M}.tool_calls[0].function.name"),
    (with_message(tool_calls=[call(arguments=1)]), f"{M}.tool_calls[0].function.arguments"),
    (with_message(tool_calls=[{**call(), "id": 5}]), f"{M}.tool_calls[0].id"),
    (with_message(reasoning_content={"a": 1}), f"{M}.reasoning_content"),
    (with_choice(finish_reason=1), "choices[0].finish_reason"),
    ({**completion(), "usage": []}, "usage"),
    ({**completion(), "usage": {"prompt_tokens": "3"}}, "usage.prompt_tokens"),
    ({**completion(), "usage": {"completion_tokens": -1}}, "usage.completion_tokens"),
    ({**completion(), "usage": {"total_tokens": True}}, "usage.total_tokens"),
    (with_choice(logprobs="x"), "choices[0].logprobs"),
    (with_choice(logprobs={"content": {}}), "choices[0].logprobs.content"),
    (with_choice(logprobs={"content": [3]}), "choices[0].logprobs.content[0]"),
    (with_choice(logprobs={"content": [{"logprob": -1}]}), "choices[0].logprobs.content[0].token"),
    (with_choice(logprobs={"content": [{"token": "a"}]}), "choices[0].logprobs.content[0].logprob"),
    (
        with_choice(logprobs={"content": [{"token": "a", "logprob": "-1"}]}),
        "choices[0].logprobs.content[0].logprob",
    ),
    (
        with_choice(logprobs={"content": [{"token": "a", "logprob": 0.5}]}),
        "choices[0].logprobs.content[0].logprob",
    ),
    (
        with_choice(logprobs={"content": [{"token": "a", "logprob": -1, "top_logprobs": 1}]}),
        "choices[0].logprobs.content[0].top_logprobs",
    ),
]


@pytest.mark.parametrize(("body", "field"), WRONG_SHAPES)
def test_a_wrong_shape_names_its_field(stub: Stub, body: Any, field: str) -> None:
    stub.respond = lambda _: json_answer(body)
    error = failure(policy_for(stub))
    assert isinstance(error, MalformedResponseError), repr(error)
    assert error.field == field and not error.fatal
    assert f"malformed chat completion: {field} must be " in str(error)
    assert "actual value: " in str(error) and stub.url in str(error)


def test_an_error_object_with_status_200_is_an_endpoint_error(stub: Stub) -> None:
    stub.respond = lambda _: json_answer({"error": {"message": "upstream overloaded"}})
    error = failure(policy_for(stub))
    assert type(error) is EndpointError and error.server_message == "upstream overloaded"


def test_odd_but_valid_shapes_are_read(stub: Stub) -> None:
    logprobs = {"content": [{"token": "4", "logprob": -0.5, "top_logprobs": []}]}
    bodies = [
        {"choices": [{"message": {"content": None}}]},  # no finish_reason, no usage
        with_message(content=[{"type": "image_url"}, {"type": "text", "text": "ok"}]),
        with_message(tool_calls=[call(arguments={"x": 1}), {"function": {"name": "g"}}]),
        with_message(content=None, tool_calls=[call(arguments=None)]),  # the action format's call
        {**with_choice(logprobs=logprobs), "usage": {"prompt_tokens": 1, "extra": {"a": 1}}},
    ]
    answers = iter(bodies)
    stub.respond = lambda _: json_answer(next(answers))
    policy = policy_for(stub, max_concurrency=1)
    empty, parts, calls, null, scored = asyncio.run(policy.act([request() for _ in bodies]))
    assert empty.text == "" and parts.text == "ok"
    assert calls.text.startswith("42\n<tool_call>") and calls.text.count("<tool_call>") == 2
    assert "must be a JSON object, got null" in null.metadata["tool_call_error"]
    assert scored.metadata["logprobs"] == [-0.5]


def mutations(value: Any, rng: random.Random) -> Any:
    """``value`` with one random node replaced by a random JSON value."""
    junk = [None, 0, -1, 1.5, True, "", "x", [], [None], {}, {"a": None}, [{}], {"text": 1}]
    if isinstance(value, dict) and value and rng.random() < 0.8:
        key = rng.choice(list(value))
        return {**value, key: mutations(value[key], rng)}
    if isinstance(value, list) and value and rng.random() < 0.8:
        index = rng.randrange(len(value))
        return [*value[:index], mutations(value[index], rng), *value[index + 1 :]]
    return copy.deepcopy(rng.choice(junk))


def test_fuzzed_shapes_never_raise_anything_but_endpoint_errors() -> None:
    """Seeded fuzz of the parser (and the rendering after it) on mutated valid answers."""
    rng = random.Random(15)
    hermes = get_action_format("hermes")
    full = with_message(
        tool_calls=[call()],
        reasoning_content="r",
    )
    full["choices"][0]["logprobs"] = {"content": [{"token": "4", "logprob": -1.0}]}
    outcomes = {"ok": 0, "refused": 0}
    for _ in range(3000):
        body = mutations(full, rng)
        try:
            reply = parse_chat_completion(body, "http://x/v1/chat/completions")
        except EndpointError:
            outcomes["refused"] += 1
            continue
        text, _ = reply_text({"content": reply.content, "tool_calls": reply.tool_calls}, hermes)
        assert isinstance(text, str)
        outcomes["ok"] += 1
    assert outcomes["ok"] > 100 and outcomes["refused"] > 100, outcomes


# --- failures in a collection ---------------------------------------------------------------


def test_a_failing_request_ends_only_its_own_episode(stub: Stub) -> None:
    def respond(body: Any) -> Answer:
        if TASKS[1].prompt in json.dumps(body):
            return json_answer({"error": {"message": "kernel panic"}}, status=500)
        return json_answer(completion("12"))

    stub.respond = respond
    policy = policy_for(stub, max_retries=2)
    groups = collect_groups(ToolUseGameEnv, TASKS, policy, episodes_per_task=2, max_turns=2)
    for group, task in zip(groups, TASKS, strict=True):
        for episode in group:
            if task is TASKS[1]:
                assert episode.truncation_cause is TruncationCause.POLICY_ERROR
                assert "failed after 3 attempts" in episode.error
                assert "kernel panic" in episode.error
            else:
                assert episode.error is None and episode.terminated and len(episode.turns) == 1
    sent = [json.dumps(r["body"]) for r in stub.requests]
    for task in TASKS:  # nothing was sent twice: 2 episodes, each 1 turn or 3 attempts
        expected = 2 * 3 if task is TASKS[1] else 2
        assert sum(task.prompt in body for body in sent) == expected


@pytest.mark.parametrize("status", [401, 403, 404])
def test_auth_and_addressing_refusals_are_fatal(stub: Stub, status: int) -> None:
    stub.respond = lambda _: json_answer({"error": {"message": "invalid api key"}}, status=status)
    with pytest.raises(PolicyBatchError) as info:
        asyncio.run(policy_for(stub).act([request(), request(1)]))
    assert info.value.fatal and all(e.status == status for e in info.value.outcomes)  # type: ignore[union-attr]
    stub.requests.clear()
    with pytest.raises(PolicyError, match="invalid api key") as caught:
        collect_groups(ToolUseGameEnv, TASKS, policy_for(stub), episodes_per_task=2, max_turns=2)
    assert caught.value.fatal and len(stub.requests) == 6  # one wave, no second try


def test_a_rate_limit_date_is_honoured_up_to_the_cap(stub: Stub) -> None:
    answers = iter(
        [json_answer({"error": "slow"}, 429, **{"Retry-After": formatdate(time.time() + 60)})]
    )
    stub.respond = lambda _: next(answers, json_answer(completion()))
    start = time.perf_counter()
    [generation] = asyncio.run(policy_for(stub, backoff_max_s=0.3).act([request()]))
    assert 0.25 <= time.perf_counter() - start < 5 and generation.metadata["retries"] == 1


def test_a_redirect_is_not_followed(stub: Stub) -> None:
    stub.respond = lambda _: (307, {"Location": "http://127.0.0.1:1/v1/chat/completions"}, b"")
    error = failure(policy_for(stub))
    assert isinstance(error, EndpointError) and error.status == 307 and len(stub.requests) == 1


# --- the request side -----------------------------------------------------------------------


def test_a_key_that_cannot_be_a_header_is_fatal(
    stub: Stub, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in ("sk-\nInjected: yes", "sk-ключ"):
        monkeypatch.setenv("LLM_GYM_TEST_HTTP_KEY", key)
        error = failure(policy_for(stub))
        assert isinstance(error, EndpointError) and error.fatal, repr(error)
        assert "Authorization" in str(error) and "printable ASCII" in str(error)
        assert "sk-" not in str(error)  # the secret is not repeated
    assert stub.requests == []


def test_text_that_is_not_utf8_is_a_typed_error(stub: Stub) -> None:
    bad = request()
    bad.messages = [{"role": "user", "content": "lone \ud800"}]
    with pytest.raises(PolicyBatchError) as info:
        asyncio.run(policy_for(stub).act([bad, request()]))
    error, generation = info.value.outcomes
    assert isinstance(error, EndpointError) and "valid UTF-8" in str(error)
    assert generation.text == "42" and len(stub.requests) == 1  # type: ignore[union-attr]


def test_proxy_variables_are_not_used(stub: Stub, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY"):
        monkeypatch.setenv(name, "http://127.0.0.1:1")
    [generation] = asyncio.run(policy_for(stub).act([request()]))
    assert generation.text == "42"


# --- connections and event loops -------------------------------------------------------------


def test_connections_are_kept_alive_and_closed_with_the_loop(stub: Stub) -> None:
    policy = policy_for(stub, max_concurrency=1)

    async def turns() -> None:
        for _ in range(3):
            await policy.act([request()])

    asyncio.run(turns())
    assert len({r["port"] for r in stub.requests}) == 1  # one connection for three turns
    assert stub.wait_closed()  # asyncio.run closed it when its loop ended


def test_close_and_aclose(stub: Stub) -> None:
    policy = policy_for(stub)

    async def run() -> None:
        await policy.act([request()])
        policy.close()  # from inside the loop: closes in the background
        await asyncio.sleep(0.05)
        assert stub.wait_closed(0.5)
        await policy.act([request()])  # a new client
        await policy.aclose()
        assert stub.wait_closed(0.5)

    asyncio.run(run())
    assert len(stub.requests) == 2


def test_a_cancelled_act_leaves_no_request_behind(stub: Stub) -> None:
    arrived = threading.Event()
    gone: list[float] = []

    def slow(body: Any) -> Answer:
        arrived.set()
        start = time.monotonic()
        select.select([stub.connection], [], [], 5)  # readable when the client closes
        gone.append(time.monotonic() - start)
        return json_answer(completion())

    stub.respond = slow
    policy = policy_for(stub)
    threads = set(threading.enumerate())

    async def run() -> None:
        task = asyncio.create_task(policy.act([request()]))
        await asyncio.get_running_loop().run_in_executor(None, arrived.wait, 5)
        start = time.perf_counter()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert time.perf_counter() - start < 0.5
        assert asyncio.all_tasks() == {asyncio.current_task()}  # no request left running

    asyncio.run(run())
    assert stub.wait_closed() and gone and gone[0] < 1.0  # the connection was closed at once
    assert len(stub.requests) == 1
    new = [t for t in set(threading.enumerate()) - threads if "process_request" not in t.name]
    assert new == []  # no client thread (the stub's own handler threads aside)


def test_one_policy_on_several_event_loops(stub: Stub) -> None:
    def slow(body: Any) -> Answer:
        time.sleep(0.2)
        return json_answer(completion())

    stub.respond = slow
    policy = policy_for(stub, max_concurrency=1, seed=0)  # per loop: several loops at once
    results: list[Any] = []

    def worker() -> None:
        results.append(asyncio.run(policy.act([request(), request()])))

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for thread in threads:
        thread.start()
    asyncio.run(policy.act([request()]))  # and the main thread's own loop meanwhile
    for thread in threads:
        thread.join(10)
    assert [len(r) for r in results] == [2, 2] and len(stub.requests) == 5
    assert sorted(r["body"]["seed"] for r in stub.requests) == [0, 1, 2, 3, 4]  # none twice
    assert stub.wait_closed()
    # A loop run by hand and shut down the standard way closes its connections too.
    loop = asyncio.new_event_loop()
    loop.run_until_complete(policy.act([request()]))
    loop.run_until_complete(loop.shutdown_asyncgens())
    loop.close()
    assert stub.wait_closed()


def test_a_loop_closed_without_shutdown_raises_nothing(stub: Stub) -> None:
    """Its client cannot be closed any more (its sockets go with the garbage collector), but
    nothing raises, then or when the policy is used on the next loop."""
    unraisable: list[Any] = []
    hook, sys.unraisablehook = sys.unraisablehook, unraisable.append
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            policy = policy_for(stub)
            loop = asyncio.new_event_loop()
            loop.run_until_complete(policy.act([request()]))
            loop.close()
            asyncio.run(policy.act([request()]))  # the next loop gets its own client
            del loop, policy
            gc.collect()
    finally:
        sys.unraisablehook = hook
    errors = [u.exc_value for u in unraisable if not isinstance(u.exc_value, ResourceWarning)]
    assert errors == [] and len(stub.requests) == 2


def test_json_client_keeps_its_public_api(stub: Stub) -> None:
    client = JsonClient(stub.url + "/completions", label="for teacher", max_retries=0, seed=1)
    stub.respond = lambda body: json_answer({"echo": body})
    reply = asyncio.run(client.post({"prompt": [1, 2]}))
    assert reply.body == {"echo": {"prompt": [1, 2]}} and reply.retries == 0 and reply.latency_s > 0
    client.close()
    with pytest.raises(InvalidArgumentError, match="max_response_bytes"):
        JsonClient(stub.url, max_response_bytes=0)
    with pytest.raises(InvalidArgumentError, match="max_concurrency"):
        JsonClient(stub.url, max_concurrency=0)
