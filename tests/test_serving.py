"""``llm-gym serve`` over HTTP with the tiny model: limits, concurrency, and OpenAI conformance
checked with the official ``openai`` client (streaming, logprobs, parsed tool calls)."""

from __future__ import annotations

import asyncio
import http.client
import json
import logging
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

from llm_gym.actions import get_action_format  # noqa: E402
from llm_gym.serving.generation import TokenOut  # noqa: E402
from llm_gym.serving.openai_server import ChatCompletionServer, serve  # noqa: E402
from tests.conftest import free_port, subprocess_env  # noqa: E402

USER = [{"role": "user", "content": "What is the capital of France?"}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look a key up.",
            "parameters": {"type": "object", "properties": {"key": {"type": "string"}}},
        },
    }
]
CALL_TEXT = (
    'Let me check.\n<tool_call>\n{"name": "lookup", "arguments": {"key": "a"}}\n</tool_call>'
)


@pytest.fixture(scope="module")
def served(small_model_dir) -> Iterator[ChatCompletionServer]:
    with serve(small_model_dir, model_name="tiny", device="cpu") as server:
        yield server


@pytest.fixture
def client(served: ChatCompletionServer) -> Any:
    return openai.OpenAI(base_url=served.url, api_key="unused", max_retries=0, timeout=60)


def scripted(
    monkeypatch: pytest.MonkeyPatch, server: ChatCompletionServer, text: str, delay: float = 0
) -> dict[str, int]:
    """Make the model "write" ``text`` (then end of sequence); counts the tokens handed out."""
    tokenizer = server.tokenizer
    counts = {"emitted": 0}

    def fake(model, prompt_ids, sampling, *, eos_ids, pad_id, on_token) -> None:
        ids = [*tokenizer.encode(text, add_special_tokens=False), eos_ids[0]]
        for token_id in ids[: sampling.max_tokens]:
            time.sleep(delay)
            counts["emitted"] += 1
            logprob = -0.5 if sampling.logprobs is not None else None
            if on_token(TokenOut(token_id, logprob, ((token_id, -0.5),))):
                return

    monkeypatch.setattr("llm_gym.serving.engine.sample_tokens", fake)
    return counts


POST_HEAD = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
)
"""A request head for :func:`raw_exchange` up to its length headers."""


def raw_exchange(server: ChatCompletionServer, data: bytes, timeout: float = 10) -> bytes:
    """Send raw bytes; read until the server closes the connection (or the timeout)."""
    with socket.create_connection((server.host, server.port), timeout=timeout) as sock:
        sock.sendall(data)
        chunks = []
        while True:
            try:
                chunk = sock.recv(65536)
            except (TimeoutError, ConnectionResetError):  # reset: it did not read all we sent
                break
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks)


# --- the HTTP layer: malformed requests, limits, many connections ---------------------------


@pytest.mark.parametrize(
    "head",
    [
        POST_HEAD + b"Content-Length: -1\r\n\r\n",
        POST_HEAD + b"Content-Length: abc\r\n\r\n",
        POST_HEAD + b"Content-Length: 1\r\nContent-Length: 2\r\n\r\n",
        POST_HEAD + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"GARBAGE\r\n\r\n",
        POST_HEAD + b"Bad header line\r\n\r\n",
        POST_HEAD + b"X: " + b"a" * 1_000_000 + b"\r\n\r\n",
    ],
)
def test_malformed_http_is_a_quick_400_and_a_closed_connection(
    served: ChatCompletionServer, head: bytes
) -> None:
    start = time.monotonic()
    answer = raw_exchange(served, head)
    assert answer.startswith(b"HTTP/1.1 4"), answer[:200]
    assert time.monotonic() - start < 5  # closed by the server, not by our timeout


def test_a_stalled_body_blocks_nobody(served: ChatCompletionServer, client: Any) -> None:
    with socket.create_connection((served.host, served.port)) as stalled:
        stalled.sendall(POST_HEAD + b'Content-Length: 1000\r\n\r\n{"model"')
        start = time.monotonic()
        answer = client.chat.completions.create(model="tiny", messages=USER, max_tokens=2)
        assert answer.choices[0].message.role == "assistant"
        assert time.monotonic() - start < 30


def test_body_limits(served: ChatCompletionServer) -> None:
    with ChatCompletionServer(
        served.model, served.tokenizer, model_name="tiny", max_body_bytes=1000
    ) as small:
        big = json.dumps({"model": "tiny", "messages": USER, "pad": "x" * 5000}).encode()
        declared = raw_exchange(
            small,
            POST_HEAD + f"Content-Length: {len(big)}\r\n\r\n".encode(),  # the body is never sent
        )
        assert declared.startswith(b"HTTP/1.1 413") and b"1000 bytes" in declared
        chunked = raw_exchange(
            small,
            POST_HEAD
            + b"Transfer-Encoding: chunked\r\n\r\n"
            + b"".join(
                b"%x\r\n%s\r\n" % (len(big[i : i + 500]), big[i : i + 500])
                for i in range(0, len(big), 500)
            )
            + b"0\r\n\r\n",
        )
        assert chunked.startswith(b"HTTP/1.1 413")


def test_max_connections_are_served_and_one_more_is_a_503(served: ChatCompletionServer) -> None:
    with ChatCompletionServer(
        served.model, served.tokenizer, model_name="tiny", max_connections=2
    ) as capped:
        held = [http.client.HTTPConnection(capped.host, capped.port, timeout=10) for _ in range(2)]
        try:
            for connection in held:  # two kept-alive connections: both served
                connection.request("GET", "/health")
                assert connection.getresponse().read() == b'{"status":"ok"}'
            third = raw_exchange(capped, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 5)
            assert third.startswith(b"HTTP/1.1 503")
        finally:
            for connection in held:
                connection.close()


def test_slow_clients_are_cut_off(served: ChatCompletionServer) -> None:
    with ChatCompletionServer(
        served.model, served.tokenizer, model_name="tiny", request_timeout_s=1
    ) as strict:
        start = time.monotonic()
        assert raw_exchange(strict, b"") == b""  # never sends a request: closed
        assert raw_exchange(strict, b"POST /v1/chat/comp") == b""  # a head that trickles
        assert time.monotonic() - start < 6
        stalled = raw_exchange(
            strict,
            POST_HEAD + b"Content-Length: 100\r\n\r\n{",
        )
        assert stalled.startswith(b"HTTP/1.1 408") and b"did not arrive within 1 s" in stalled
        # a prompt client is answered, twice on one kept-alive connection
        connection = http.client.HTTPConnection(strict.host, strict.port, timeout=10)
        for _ in range(2):
            connection.request("GET", "/health")
            assert connection.getresponse().read() == b'{"status":"ok"}'
        connection.close()


def post(
    server: ChatCompletionServer, path: str, body: bytes, headers: dict[str, str]
) -> tuple[int, dict]:
    connection = http.client.HTTPConnection(server.host, server.port, timeout=60)
    try:
        connection.request("POST", path, body=body, headers=headers)
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


JSON = {"Content-Type": "application/json"}


@pytest.mark.parametrize(
    ("body", "headers", "status", "param"),
    [
        (json.dumps({"model": "tiny", "messages": USER, "seed": 2**70}), JSON, 400, "seed"),
        (
            '{"model": "tiny", "messages": [{"role": "user", "content": "\\ud800"}]}',
            JSON,
            400,
            "messages[0].content",
        ),
        ('{"model": "tiny", "messages": ' + "[" * 5000 + "]" * 5000 + "}", JSON, 400, None),
        ("[1, 2]", JSON, 400, None),
        ('{"model": "tiny", "messages": [], "temperature": NaN}', JSON, 400, None),
        (
            json.dumps({"model": "tiny", "messages": USER}),
            {"Content-Type": "text/plain"},
            415,
            "Content-Type",
        ),
        (
            json.dumps({"model": "tiny", "messages": USER}),
            {"Content-Type": "application/x-www-form-urlencoded"},
            415,
            "Content-Type",
        ),
        (json.dumps({"model": "gpt-4", "messages": USER}), JSON, 404, "model"),
        (
            json.dumps({"model": "tiny", "messages": USER, "chat_template": "{{ 1 }}"}),
            JSON,
            400,
            "chat_template",
        ),
        (
            json.dumps({"model": "tiny", "messages": USER, "tools": [{"function": {}}]}),
            JSON,
            400,
            "tools[0]",
        ),
        (
            json.dumps({"model": "tiny", "messages": [{"role": "user", "content": [1]}]}),
            JSON,
            400,
            "messages[0].content[0]",
        ),
    ],
)
def test_client_errors_are_4xx_never_500(
    served: ChatCompletionServer, body: str, headers: dict[str, str], status: int, param: str | None
) -> None:
    code, answer = post(served, "/v1/chat/completions", body.encode(), headers)
    assert code == status, answer
    assert answer["error"]["message"] and answer["error"]["type"] == "invalid_request_error"
    if param is not None:
        assert answer["error"]["param"] == param


def test_huge_max_tokens_is_clamped_and_template_options_pass(client: Any) -> None:
    answer = client.chat.completions.create(
        model="tiny",
        messages=USER,
        max_tokens=10**12,
        temperature=0,
        stop=["\n"],
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    assert answer.choices[0].finish_reason in ("stop", "length")


def test_many_concurrent_connections_get_answers(served: ChatCompletionServer) -> None:
    n = 80  # more than the stdlib server's backlog of 5 ever let through
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n
    body = json.dumps({"model": "tiny", "messages": USER, "max_tokens": 1}).encode()

    def one(i: int) -> None:
        try:
            barrier.wait()
            results[i] = post(served, "/v1/chat/completions", body, JSON)[0]
        except Exception as exc:  # a reset or a refusal is the failure under test
            results[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert results == [200] * n


# --- the official openai client --------------------------------------------------------------


def test_the_openai_client_reads_answers(client: Any) -> None:
    answer = client.chat.completions.create(model="tiny", messages=USER, max_tokens=5, seed=3)
    choice = answer.choices[0]
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.message.tool_calls is None and choice.finish_reason in ("stop", "length")
    assert answer.usage.total_tokens == answer.usage.prompt_tokens + answer.usage.completion_tokens
    assert [m.id for m in client.models.list()] == ["tiny"]
    assert client.models.retrieve("tiny").id == "tiny"
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.chat.completions.create(model="other", messages=USER)
    with pytest.raises(openai.BadRequestError, match="seed"):
        client.chat.completions.create(model="tiny", messages=USER, seed=2**70)


def test_a_seed_fixes_its_own_request_and_no_other(client: Any) -> None:
    """A seeded request samples from a generator of its own: the same seed gives the same answer
    (by chat and by completions), and torch's global generator, which another client's request
    would otherwise inherit, is left exactly as it was."""
    import torch

    def chat(**seed: int) -> str:
        answer = client.chat.completions.create(
            model="tiny", messages=USER, max_tokens=12, temperature=1.0, **seed
        )
        return answer.choices[0].message.content

    def complete(seed: int) -> str:
        answer = client.completions.create(
            model="tiny", prompt="The capital", max_tokens=12, temperature=1.0, seed=seed
        )
        return answer.choices[0].text

    before = torch.get_rng_state()
    first, completed = chat(seed=7), complete(7)
    chat()  # an unseeded request between them
    assert chat(seed=7) == first and complete(7) == completed
    assert len({chat(seed=s) for s in (1, 2, 3)}) > 1
    assert torch.equal(torch.get_rng_state(), before)


def test_logprobs_are_the_models_own(served: ChatCompletionServer, client: Any) -> None:
    import torch

    answer = client.chat.completions.create(
        model="tiny",
        messages=USER,
        max_tokens=6,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
        extra_body={"return_token_ids": True},
    )
    raw = answer.to_dict()
    prompt_ids, token_ids = raw["prompt_token_ids"], raw["choices"][0]["token_ids"]
    content = answer.choices[0].logprobs.content
    eos = set(served.engine.eos_ids)
    assert len(content) == len([t for t in token_ids if t not in eos]) >= 1
    with torch.inference_mode():
        logits = served.model(input_ids=torch.tensor([prompt_ids + token_ids])).logits[0]
    logps = torch.log_softmax(logits.float(), -1)
    for k, entry in enumerate(content):
        want = float(logps[len(prompt_ids) + k - 1, token_ids[k]])
        assert entry.logprob == pytest.approx(want, abs=1e-4)
        assert len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob, abs=1e-6)  # greedy
        assert bytes(entry.bytes).decode("utf-8", "replace") == entry.token


def test_streams_give_the_same_text(client: Any) -> None:
    settings = {"model": "tiny", "max_tokens": 12, "temperature": 0}
    whole = client.chat.completions.create(messages=USER, **settings)
    chunks = list(
        client.chat.completions.create(
            messages=USER, stream=True, stream_options={"include_usage": True}, **settings
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finishes == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.model_dump() == whole.usage.model_dump()

    stop = whole.choices[0].message.content[2:4]
    cut = client.chat.completions.create(messages=USER, stop=[stop], **settings)
    streamed = client.chat.completions.create(messages=USER, stop=[stop], stream=True, **settings)
    expected = whole.choices[0].message.content
    expected = expected[: expected.find(stop)]
    assert cut.choices[0].message.content == expected and cut.choices[0].finish_reason == "stop"
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == expected

    completion = client.completions.create(prompt="hello", **settings)
    streamed = client.completions.create(prompt="hello", stream=True, **settings)
    assert "".join(c.choices[0].text for c in streamed) == completion.choices[0].text


def test_tool_calls_come_back_parsed(
    served: ChatCompletionServer, client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    scripted(monkeypatch, served, CALL_TEXT)
    answer = client.chat.completions.create(model="tiny", messages=USER, tools=TOOLS, logprobs=True)
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check."
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "lookup" and call.id
    assert json.loads(call.function.arguments) == {"key": "a"}
    assert len(choice.logprobs.content) == answer.usage.completion_tokens - 1  # not the EOS

    chunks = list(
        client.chat.completions.create(model="tiny", messages=USER, tools=TOOLS, stream=True)
    )
    content = "".join(c.choices[0].delta.content or "" for c in chunks)
    calls = [t for c in chunks for t in (c.choices[0].delta.tool_calls or [])]
    assert content.strip() == "Let me check." and "<tool_call>" not in content
    assert [(t.index, t.function.name, json.loads(t.function.arguments)) for t in calls] == [
        (0, "lookup", {"key": "a"})
    ]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"

    # without tools, or with tool_choice "none", the text is the model's own
    for extra in ({}, {"tools": TOOLS, "tool_choice": "none"}):
        plain = client.chat.completions.create(model="tiny", messages=USER, **extra)
        assert plain.choices[0].message.content == CALL_TEXT
        assert plain.choices[0].message.tool_calls is None
        assert plain.choices[0].finish_reason == "stop"


def test_a_malformed_call_stays_text(
    served: ChatCompletionServer, client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = "<tool_call>\n{not json}\n</tool_call>"
    scripted(monkeypatch, served, text)
    answer = client.chat.completions.create(model="tiny", messages=USER, tools=TOOLS)
    assert answer.choices[0].message.content == text and answer.choices[0].finish_reason == "stop"
    chunks = list(
        client.chat.completions.create(model="tiny", messages=USER, tools=TOOLS, stream=True)
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == text


def test_a_call_to_an_undeclared_tool_stays_text(
    served: ChatCompletionServer, client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reply that calls a tool the request did not declare is the model's text, whole (also
    when it calls a declared one beside it): a structured call is one the client can run."""
    search = {"type": "function", "function": {"name": "search", "parameters": {}}}
    both = CALL_TEXT + '\n<tool_call>\n{"name": "search", "arguments": {}}\n</tool_call>'
    for text, tools in ((CALL_TEXT, [search]), (both, [search])):
        scripted(monkeypatch, served, text)
        answer = client.chat.completions.create(model="tiny", messages=USER, tools=tools)
        choice = answer.choices[0]
        assert (choice.message.content, choice.message.tool_calls) == (text, None)
        assert choice.finish_reason == "stop"
        chunks = list(
            client.chat.completions.create(model="tiny", messages=USER, tools=tools, stream=True)
        )
        assert "".join(c.choices[0].delta.content or "" for c in chunks) == text
        assert not [t for c in chunks for t in (c.choices[0].delta.tool_calls or [])]
        assert chunks[-1].choices[0].finish_reason == "stop"
    scripted(monkeypatch, served, both)  # both declared: both are calls
    answer = client.chat.completions.create(model="tiny", messages=USER, tools=[*TOOLS, search])
    names = [call.function.name for call in answer.choices[0].message.tool_calls]
    assert names == ["lookup", "search"]


def test_the_reason_of_a_refusal_is_logged_at_info(
    served: ChatCompletionServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="llm_gym.serving")
    body = json.dumps({"model": "tiny", "messages": USER, "tools": []}).encode()
    assert post(served, "/v1/chat/completions", body, JSON)[0] == 400
    [record] = [r for r in caplog.records if r.name == "llm_gym.serving"]
    assert record.levelno == logging.INFO
    message = record.getMessage()
    assert message.startswith("400 on POST /v1/chat/completions: Invalid 'tools': empty array")
    assert message.endswith("(param 'tools')")


def test_serve_writes_refusals_beside_the_request_line(small_model_dir, tmp_path) -> None:
    """``llm-gym serve``'s own log (not ``--quiet``): each 4xx's reason next to its access line."""
    port = free_port()
    command = [sys.executable, "-m", "llm_gym.cli", "serve", str(small_model_dir), "--port",
               str(port), "--model-name", "tiny", "--device", "cpu"]  # fmt: skip
    log_path = tmp_path / "serve.log"
    with log_path.open("w") as log:
        server = subprocess.Popen(command, env=subprocess_env(tmp_path), stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(log_path.read_text()[-2000:]) from None
                time.sleep(0.2)
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            json.dumps({"model": "tiny", "messages": USER, "n": 3}).encode(),
            JSON,
        )
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(request, timeout=30)
        assert info.value.code == 400
    finally:
        server.terminate()
        server.wait(30)
    text = log_path.read_text()
    assert "INFO:     400 on POST /v1/chat/completions: 'n' must be 1 on this server" in text
    assert '"POST /v1/chat/completions HTTP/1.1" 400' in text


def test_openai_policy_reads_parsed_tool_calls(
    served: ChatCompletionServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from llm_gym.envs.tool_use_game import get_tasks
    from llm_gym.policies.base import PolicyRequest
    from llm_gym.policies.openai import OpenAIPolicy

    scripted(monkeypatch, served, CALL_TEXT)
    policy = OpenAIPolicy(model="tiny", base_url=served.url, send_tools=True)
    request = PolicyRequest(
        messages=USER,
        tool_specs=TOOLS,
        task=get_tasks("val")[0],
        action_format=get_action_format("hermes"),
    )
    try:
        [generation] = asyncio.run(policy.act([request]))
    finally:
        policy.close()
    parsed = get_action_format("hermes").parse(generation.text)
    assert parsed.is_tool_calls and parsed.message["content"] == "Let me check."
    assert [
        (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed.tool_calls
    ] == [("lookup", {"key": "a"})]


def test_a_client_that_leaves_stops_the_generation(
    served: ChatCompletionServer, client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    counts = scripted(monkeypatch, served, "word " * 400, delay=0.005)
    stream = client.chat.completions.create(
        model="tiny", messages=USER, stream=True, max_tokens=400
    )
    next(iter(stream))
    stream.close()
    deadline = time.monotonic() + 10
    before = -1
    while counts["emitted"] != before and time.monotonic() < deadline:
        before = counts["emitted"]
        time.sleep(0.2)
    assert counts["emitted"] < 300
    # the next request is answered at once
    monkeypatch.undo()
    assert client.chat.completions.create(model="tiny", messages=USER, max_tokens=1).choices


def test_a_request_whose_client_left_is_not_generated(
    served: ChatCompletionServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    counts = scripted(monkeypatch, served, "word " * 400, delay=0.005)
    body = json.dumps({"model": "tiny", "messages": USER, "max_tokens": 400}).encode()
    head = POST_HEAD.decode()
    with socket.create_connection((served.host, served.port)) as sock:
        sock.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
        time.sleep(0.3)  # the client gives up (a timeout) before the answer
    deadline = time.monotonic() + 10
    before = -1
    while counts["emitted"] != before and time.monotonic() < deadline:
        before = counts["emitted"]
        time.sleep(0.3)
    assert counts["emitted"] < 300


def test_close_ends_streams_in_flight(
    served: ChatCompletionServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    scripted(monkeypatch, served, "word " * 400, delay=0.02)
    server = ChatCompletionServer(served.model, served.tokenizer, model_name="tiny")
    local = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=60)
    stream = local.chat.completions.create(model="tiny", messages=USER, stream=True, max_tokens=400)
    next(iter(stream))
    address = (server.host, server.port)
    start = time.monotonic()
    server.close()
    assert time.monotonic() - start < 10
    with pytest.raises(OSError):
        socket.create_connection(address, timeout=1).close()


def test_cli_serve_takes_the_template_allow_list(
    small_model_dir, monkeypatch: pytest.MonkeyPatch
) -> None:
    import io

    from llm_gym.cli import main

    codes = []

    def wait(self: ChatCompletionServer) -> None:  # instead of blocking until Ctrl-C
        for kwargs in ({"custom": 1}, {"enable_thinking": True}):
            body = {"model": "t", "messages": USER, "max_tokens": 1, "chat_template_kwargs": kwargs}
            codes.append(post(self, "/v1/chat/completions", json.dumps(body).encode(), JSON)[0])

    monkeypatch.setattr(ChatCompletionServer, "wait", wait)
    args = ["serve", str(small_model_dir), "--port", "0", "--model-name", "t", "--quiet"]
    assert (
        main([*args, "--template-kwargs", "custom", "--tool-parser", "json"], out=io.StringIO())
        == 0
    )
    assert codes == [200, 400]
