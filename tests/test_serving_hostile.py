"""``llm-gym serve`` (:mod:`llm_gym.serving`) against hostile clients and prompts: a prompt far
past the context is refused after reading a prefix of it, more messages than the context has
tokens are refused before the chat template renders them, streaming clients that leave stop
their generation at the next token (queued or mid-answer), and a client that never reads its
stream blocks nobody.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

from llm_gym.serving.generation import TokenOut  # noqa: E402
from llm_gym.serving.openai_server import ChatCompletionServer, serve  # noqa: E402

USER = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def served(small_model_dir) -> Iterator[ChatCompletionServer]:
    with serve(small_model_dir, model_name="tiny", device="cpu") as server:
        yield server


# --- llm-gym serve: a prompt far past the context is refused after reading a prefix ---------------


class _CountingTokenizer:
    """A tokenizer that counts the characters it is asked to encode."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer, self.read = tokenizer, 0

    def get_vocab(self) -> dict[str, int]:
        return self.tokenizer.get_vocab()

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        self.read += len(text)
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)


def test_a_prompt_far_past_the_context_is_refused_from_a_prefix(small_model: Any) -> None:
    from llm_gym.policies.chat import longest_token
    from llm_gym.serving.completions import encode_within
    from llm_gym.serving.protocol import APIError

    tokenizer = small_model[1]
    counting = _CountingTokenizer(tokenizer)
    text = "The area of Vantis is 79. " * 100_000  # 2.6 M characters
    with pytest.raises(APIError) as refused:
        encode_within(counting, text, 4096, "messages")
    assert refused.value.status == 400 and refused.value.param == "messages"
    assert "context of 4096 tokens" in refused.value.message
    assert counting.read == 2 * longest_token(tokenizer) * 4097 < len(text) / 10
    short = "The area of Vantis is 79."
    expected = tokenizer.encode(short, add_special_tokens=False)
    assert encode_within(counting, short, 4096, "messages") == expected
    part = text[:20_000]  # no context known: read whole
    assert encode_within(tokenizer, part, None, "prompt") == tokenizer.encode(part)


def test_a_tokenizer_that_shrinks_text_still_gets_its_long_prompt_read_whole() -> None:
    from llm_gym.serving.completions import encode_within

    class Shrinking:  # 100 characters a token: the prefix fits, so the whole text is read
        def get_vocab(self) -> dict[str, int]:
            return {"a": 0}

        def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
            return [0] * (len(text) // 100 + 1)

    assert len(encode_within(Shrinking(), "a" * 10_000, 20, "messages")) == 101


# --- more messages than the context has tokens ----------------------------------------------------


def test_more_messages_than_the_context_has_tokens_are_refused_unrendered(
    served, monkeypatch
) -> None:
    import httpx

    context = served.engine.context
    rendered = []
    render = served.engine.tokenizer.apply_chat_template
    monkeypatch.setattr(
        served.engine.tokenizer,
        "apply_chat_template",
        lambda messages, **kw: rendered.append(len(messages)) or render(messages, **kw),
    )
    body = {"model": "tiny", "messages": [{"role": "user", "content": "a"}] * 200_000}
    answer = httpx.post(served.url + "/chat/completions", json=body, timeout=60)
    assert answer.status_code == 400, answer.text[:300]
    error = answer.json()["error"]
    assert error["param"] == "messages" and f"context of {context} tokens" in error["message"]
    assert rendered == []  # refused from the count alone
    body.update(messages=body["messages"][:3], max_tokens=1)
    assert httpx.post(served.url + "/chat/completions", json=body, timeout=60).is_success
    assert rendered == [3]


# --- many streaming clients: those that leave, and one that never reads ---------------------------


def _scripted(
    monkeypatch, server: ChatCompletionServer, delay: float, words: int = 400
) -> dict[str, Any]:
    """The model "writes" ``words`` words, ``delay`` seconds a token; counts the tokens."""
    ids = server.tokenizer.encode("word " * words, add_special_tokens=False)
    counts: dict[str, Any] = {"emitted": 0, "started": 0}

    def fake(model, prompt_ids, sampling, *, eos_ids, pad_id, on_token) -> None:
        counts["started"] += 1
        for token_id in [*ids, eos_ids[0]][: sampling.max_tokens]:
            time.sleep(delay)
            counts["emitted"] += 1
            if on_token(TokenOut(token_id, None, ())):
                return

    monkeypatch.setattr("llm_gym.serving.engine.sample_tokens", fake)
    return counts


def _settled(counts: dict[str, Any]) -> int:
    before, deadline = -1, time.monotonic() + 15
    while counts["emitted"] != before and time.monotonic() < deadline:
        before = counts["emitted"]
        time.sleep(0.3)
    return counts["emitted"]


def _raw_request(
    server: ChatCompletionServer, body: dict[str, Any], receive_buffer: int | None = None
) -> socket.socket:
    data = json.dumps(body)
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        "Content-Type: application/json\r\n"
    )
    sock = socket.socket()
    if receive_buffer is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.connect((server.host, server.port))
    sock.sendall(f"{head}Content-Length: {len(data)}\r\n\r\n{data}".encode())
    return sock


def test_many_streams_whose_clients_leave_cost_a_few_tokens_each(served, monkeypatch) -> None:
    """Eight streaming clients at once that leave after their first event, and four whose
    request waits its turn (the engine answers one at a time) and who give up before it comes:
    each generation stops at its next token, so the next client is served at once."""
    counts = _scripted(monkeypatch, served, delay=0.005)
    client = openai.OpenAI(base_url=served.url, api_key="unused", max_retries=0, timeout=60)
    left: list[int] = []

    def leave_after_the_first_event() -> None:
        stream = client.chat.completions.create(
            model="tiny", messages=USER, stream=True, max_tokens=400
        )
        next(iter(stream))
        stream.close()
        left.append(1)

    threads = [threading.Thread(target=leave_after_the_first_event) for _ in range(8)]
    for thread in threads:
        thread.start()
    body = {"model": "tiny", "messages": USER, "stream": True, "max_tokens": 400}
    for _ in range(4):
        _raw_request(served, body).close()
    for thread in threads:
        thread.join(60)
    assert len(left) == 8
    start = time.monotonic()
    survivor = client.chat.completions.create(model="tiny", messages=USER, max_tokens=40)
    assert survivor.choices[0].finish_reason == "length"
    assert time.monotonic() - start < 10
    assert _settled(counts) < 40 + 12 * 60  # each that left: its generation stopped at once
    assert counts["started"] <= 13  # the queued ones reached the engine or were skipped


def test_a_client_that_never_reads_its_stream_blocks_nobody(served, monkeypatch) -> None:
    """A stream whose client reads nothing: ~0.5 MB of events for a 1 KB receive buffer (the
    server's sends wait on it): the server keeps its events for it and answers others."""
    counts = _scripted(monkeypatch, served, delay=0.0, words=3000)
    body = {"model": "tiny", "messages": USER, "stream": True, "max_tokens": 3000}
    with _raw_request(served, body, receive_buffer=1024) as sleeper:
        deadline = time.monotonic() + 15
        while counts["emitted"] <= 2000 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert counts["emitted"] > 2000  # generated: the sends wait, not the model
        client = openai.OpenAI(base_url=served.url, api_key="unused", max_retries=0, timeout=30)
        start = time.monotonic()
        for _ in range(3):
            answer = client.chat.completions.create(model="tiny", messages=USER, max_tokens=20)
            assert answer.choices[0].message.content
        assert time.monotonic() - start < 10
        sleeper.settimeout(5)
        assert sleeper.recv(64).startswith(b"HTTP/1.1 200")  # its answer waited for it
