"""Distillation's endpoint teacher (:mod:`trainers.distillation.endpoint`) against a hostile
OpenAI-compatible server, on loopback only: logprobs past a float's range or past float32's,
token ids that are not ints, a body nested 100,000 deep, a million entries, invalid UTF-8,
duplicate keys, top logprobs of tokens outside the vocabulary, an endless, silent, drip-fed or
short body. Every answer either gives the prompt's logprobs, each in ``[LOGPROB_FLOOR, 0]``, or
raises an :class:`~llm_gym.errors.EndpointError` naming what is wrong, within the deadline.

=================================  =====================================  ======================
case                               without a fix                          what holds
=================================  =====================================  ======================
a logprob of 401 digits (vLLM's    OverflowError out of ``logprobs``      MalformedResponseError
form or the echo form)             (not an EndpointError)                 naming the entry
a logprob of ``-1e300``            read; ``-inf`` in the trainer's        refused below
                                   float32 tensor: infinite advantages    ``LOGPROB_FLOOR``
token ids 1.5, ``True``, ``"4"``   sent as 1 (or a TypeError), then the   InvalidArgumentError
                                   answer "had no entry" for ``1.5``      before any request
``base_url`` not a string          AttributeError                         InvalidArgumentError
nested 100,000 deep; a million     contained                              MalformedResponseError
entries; invalid UTF-8; ``null``
duplicate keys; ``usage`` of 401   contained                              the last key read;
digits; top logprobs of ids                                               only the prompt's
outside the vocabulary                                                    tokens read
an endless body; no answer; a      contained                              the byte cap; the
body dripped or shorter than its                                          deadline (two tries)
``Content-Length``
=================================  =====================================  ======================
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from llm_gym.errors import InvalidArgumentError
from llm_gym.policies.http import EndpointError, MalformedResponseError
from tests.conftest import LoopbackServer
from trainers.distillation.endpoint import LOGPROB_FLOOR, EndpointTeacher

PROMPT = [3, 4, 1]
BIG = 10**400  # an int of 401 digits: JSON, under Python's 4,300-digit limit, past a float


class RawTeacher(LoopbackServer):
    """An OpenAI-compatible server on raw sockets: each ``POST`` is answered with
    ``respond(request_json)``: the reply's bytes, or ``async fn(writer)`` that writes it."""

    path = "/v1"

    def __init__(self) -> None:
        self.respond: Callable[[dict[str, Any]], Any] = lambda body: ok("{}")
        self.requests = 0
        super().__init__()

    async def _serve(self, reader, writer) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length"))  # fmt: skip
                self.requests += 1
                reply = self.respond(json.loads(await reader.readexactly(length)))
                if callable(reply):
                    await reply(writer)
                else:
                    writer.write(reply)
                    await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            writer.close()


@pytest.fixture
def teacher_server():
    server = RawTeacher()
    yield server
    server.stop()


def ok(text: str | bytes) -> bytes:
    body = text.encode() if isinstance(text, str) else text
    return (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
            % len(body) + body)  # fmt: skip


def vllm(ids: list[int], value: str = "-0.5") -> str:
    """vLLM's ``prompt_logprobs`` answer with ``value`` (JSON text) for every prompt token."""
    entries = ["null"] + [f'{{"{t}": {{"logprob": {value}}}}}' for t in ids[1:]]
    return '{"choices": [{"prompt_logprobs": [' + ", ".join(entries) + "]}]}"


def scored(server: RawTeacher, timeout_s: float = 3.0) -> list[list[float]]:
    return EndpointTeacher(server.url, "m", timeout_s=timeout_s).logprobs([(PROMPT, 1)])


MALFORMED = {
    "a logprob of 401 digits": (
        lambda body: ok(vllm(body["prompt"], str(-BIG))),
        "prompt_logprobs[1]['4'] is -1000",
    ),
    "an echo logprob of 401 digits": (
        lambda body: ok(
            f'{{"choices": [{{"logprobs": {{"token_logprobs": [null, {BIG}, -1]}}}}]}}'
        ),
        "token_logprobs[1] is 1000",
    ),
    "a logprob of -1e300": (
        lambda body: ok(vllm(body["prompt"], "-1e300")),
        "is -1e+300, not a finite logprob <= 0 (>= -1e+06)",
    ),
    "nested 100,000 deep": (
        lambda body: ok("[" * 100_000 + "]" * 100_000),
        "not JSON (nested too deeply)",
    ),
    "a million entries": (
        lambda body: ok('{"choices": [{"prompt_logprobs": [' + ",".join(["null"] * 10**6) + "]}]}"),
        "has 1000000 entries; the prompt has 3 tokens",
    ),
    "invalid UTF-8": (lambda body: ok(b'{"choices": "\xff"}'), "not JSON ('utf-8' codec"),
    "null": (lambda body: ok("null"), "no choices[0] object"),
    "duplicate keys, the last positive": (
        lambda body: ok(
            '{"choices": [{"prompt_logprobs": [null, {"4": -0.5, "4": 0.5}, {"1": -1}]}]}'
        ),
        "['4'] is 0.5, not a finite logprob",
    ),
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_a_malformed_answer_is_a_malformed_response_error(teacher_server, name) -> None:
    teacher_server.respond, expected = MALFORMED[name]
    with pytest.raises(MalformedResponseError) as raised:
        scored(teacher_server)
    assert expected in str(raised.value) and len(str(raised.value)) < 1500


READ = {
    "usage of 401 digits": lambda body: ok(
        f'{{"usage": {{"prompt_tokens": {BIG}}}, ' + vllm(body["prompt"])[1:]
    ),
    "top logprobs of ids outside the vocabulary": lambda body: ok(
        '{"choices": [{"prompt_logprobs": [null, {"4": -0.5, "99999999999": -0.1, "-3": -2}, '
        '{"1": -0.5, "abc": -1}]}]}'
    ),
    "a logprob at the floor": lambda body: ok(vllm(body["prompt"], str(LOGPROB_FLOOR))),
}


@pytest.mark.parametrize("name", list(READ))
def test_what_is_not_the_prompts_logprobs_is_not_read(teacher_server, name) -> None:
    teacher_server.respond = READ[name]
    value = LOGPROB_FLOOR if name == "a logprob at the floor" else -0.5
    assert scored(teacher_server) == [[value, value]]


@pytest.mark.parametrize("token", [1.5, True, "4", None])
def test_token_ids_that_are_not_ints_are_refused_before_any_request(teacher_server, token) -> None:
    teacher = EndpointTeacher(teacher_server.url, "m")
    with pytest.raises(InvalidArgumentError, match=r"sequences\[0\] has token id .* token ids are"):
        teacher.logprobs([([3, token, 1], 1)])
    assert teacher_server.requests == 0


@pytest.mark.parametrize("base_url", [None, 8000, b"http://127.0.0.1:1/v1"])
def test_a_base_url_that_is_not_text_is_refused(base_url) -> None:
    with pytest.raises(InvalidArgumentError, match="base_url must be an http"):
        EndpointTeacher(base_url, "m")


async def endless(writer) -> None:
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                 b"Transfer-Encoding: chunked\r\n\r\n")  # fmt: skip
    for _ in range(1000):  # 1 GB at most; the client stops reading at its cap
        writer.write(b"100000\r\n" + b" " * 0x100000 + b"\r\n")
        await writer.drain()


async def silent(writer) -> None:
    await asyncio.sleep(3600)


async def dripped(writer) -> None:
    body = vllm(PROMPT).encode()
    writer.write(ok(body)[: -len(body)])
    for byte in body:
        writer.write(bytes([byte]))
        await writer.drain()
        await asyncio.sleep(0.1)


async def short(writer) -> None:
    writer.write(ok(b" " * 1000)[:-990])  # a Content-Length of 1,000; 10 bytes come
    await writer.drain()
    await asyncio.sleep(3600)


@pytest.mark.parametrize(
    ("reply", "expected", "most_s"),
    [
        (endless, "more than max_response_bytes=16777216 bytes", 3.0),
        (silent, "did not answer within request_timeout_s=0.5 s (2 attempts", 3.0),
        (dripped, "did not answer within request_timeout_s=0.5 s (2 attempts", 3.0),
        (short, "did not answer within request_timeout_s=0.5 s (2 attempts", 3.0),
    ],
    ids=["endless", "silent", "dripped", "short of its Content-Length"],
)
def test_a_body_that_never_ends_or_never_comes_is_cut_in_time(
    teacher_server, reply, expected, most_s
) -> None:
    teacher_server.respond = lambda body: reply
    started = time.monotonic()
    with pytest.raises(EndpointError) as raised:
        scored(teacher_server, timeout_s=0.5)
    assert expected in str(raised.value)
    assert time.monotonic() - started < most_s
