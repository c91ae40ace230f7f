"""A hostile OpenEnv server against :class:`~llm_gym.integrations.openenv.client.RemoteEnv`
and its ``SessionClient``, on loopback only: frames of the wrong type
or shape, numbers past a float's range, duplicate keys, frames never finished or past the size
limit, handshakes that never end or bounce, metrics that are not counts, a gzip bomb for a
task listing. Whatever the server does, ``RemoteEnv`` raises ``RemoteEnvError`` within its
deadline (an episode outcome), and nothing a server reports crashes a collection or a report.

The servers are ``FakeServer`` (:mod:`tests.test_openenv_hostile`: scripted WebSocket frames on
raw sockets) and :class:`RawServer` here (any bytes, from the first line of the handshake on).

=================================  =====================================  ======================
case                               without a fix                          what holds
=================================  =====================================  ======================
an answer of type ``state`` or     read as the observation (an episode    RemoteEnvError: the
``zzz``; no ``data``; ``data``     of a text server showing ``{}``)       answer's type follows
without an ``observation``                                                the request, its data
                                                                          an object with one
metrics ``tool_calls``             ``run_and_report`` crashed:            not counts, not read
``10**400``, ``"x"`` errors, a     OverflowError, ValueError, TypeError   (``_reported_count``)
list
``per_turn_rewards: [10**400]``    ``collect_groups`` crashed             ignored, named in the
                                   (OverflowError): every episode lost    episode's metrics
reward ``10**400``; ``done``       contained                              RemoteEnvError
given twice; invalid UTF-8 in a
text frame; a close mid-step
a frame never finished; one        contained                              call_timeout_s; 1009
fragmented past 16 MiB
handshake never answered, or       contained                              connect_timeout_s
endless headers; a 503 with 1 MB;                                         holds; RemoteEnvError
a redirect loop                                                           at once
``conclude`` never answered        contained                              call_timeout_s
listing: a gzip bomb, a redirect   contained                              64 MiB cap (of the
                                                                          decoded body); not
                                                                          followed
=================================  =====================================  ======================
"""

from __future__ import annotations

import asyncio
import gzip
import json
import re
import time
import zlib
from collections.abc import Callable
from typing import Any

import pytest

from tests.conftest import LoopbackServer

pytest.importorskip("openenv")

from llm_gym import Task
from llm_gym.errors import RemoteEnvError
from llm_gym.eval import run_and_report
from llm_gym.integrations.openenv import RemoteEnv, RemoteEnvFactory, RemoteTasks, registration
from llm_gym.rollout import collect_groups
from tests.test_openenv_hostile import (
    CLOSE,
    HANG,
    OPENING,
    FakeServer,
    Says,
    answer,
    frame,
    native,
    scripted,
)

CALL_S = 0.5
BIG = 10**400  # an int of 401 digits: JSON, under Python's 4,300-digit limit, past a float


@pytest.fixture
def fake():
    server = FakeServer()
    yield server
    server.stop()


def raw_answer(observation_json: str, reward: str = "null", done: str = "false") -> str:
    """An observation frame from JSON text (for numbers and keys ``json.dumps`` cannot write)."""
    data = f'{{"observation": {observation_json}, "reward": {reward}, "done": {done}}}'
    return '{"type": "observation", "data": ' + data + "}"


def with_metrics(metrics_json: str) -> str:
    """A final step's observation frame with ``metrics`` as the JSON text given."""
    observation = json.dumps(native(metrics={"m": 0})).replace('{"m": 0}', metrics_json)
    return raw_answer(observation, reward="1", done="true")


def fragment(payload: bytes, opcode: int = 0) -> bytes:
    """A server's WebSocket frame that is not its message's last (no FIN; opcode 0: a
    continuation)."""
    whole = frame(payload, opcode)
    return bytes([whole[0] & 0x7F]) + whole[1:]


async def refused(env: RemoteEnv, *, step: bool) -> str:
    """The RemoteEnvError's text of a reset (or, with ``step``, of the step after it)."""
    try:
        with pytest.raises(RemoteEnvError) as raised:
            await env.reset(Task("q", id="t0"))
            if step:
                await env.step({"role": "assistant", "content": "1"})
        return str(raised.value)
    finally:
        await env.close()


FRAME_SHAPES = {
    "a state frame for a reset": (
        json.dumps({"type": "state", "data": {"observation": OPENING, "done": False}}),
        None,
        "answer to 'reset' must be a frame of type 'observation' (or 'error'), actual: "
        "type 'state'",
    ),
    "an unknown type": (
        json.dumps({"type": "zzz", "data": {"observation": OPENING}}),
        None,
        "actual: type 'zzz'",
    ),
    "no type": (json.dumps({"data": {"observation": OPENING}}), None, "actual: type None"),
    "no data": ('{"type": "observation"}', None, "data must be a JSON object, actual: nothing"),
    "data without an observation": (
        '{"type": "observation", "data": {"reward": 1, "done": false}}',
        None,
        "data.observation must be a JSON object, actual: nothing",
    ),
    "a state frame for a step": (
        answer(OPENING),
        json.dumps({"type": "state", "data": {"observation": native()}}),
        "answer to 'step' must be a frame of type 'observation'",
    ),
    "a reward of 401 digits": (
        answer(OPENING),
        raw_answer(json.dumps(native()), reward=str(BIG), done="true"),
        "a reward must be a finite number",
    ),
    "done given twice": (
        answer(OPENING),
        answer(None, raw=f'{{"observation": {json.dumps(native())}, "done": true, "done": "x"}}'),
        "done='x'; done must be true or false",
    ),
    "invalid UTF-8 in a text frame": (
        frame(b'{"type": "observation", "data": {"observation": {"a": "\xff"}}}'),
        None,
        "1007 (invalid frame payload data)",
    ),
    "a close mid-episode": (answer(OPENING), CLOSE, "step failed: ConnectionClosedError"),
    "a frame never finished": (
        [fragment(b'{"type": "observatio', opcode=1), HANG],  # nothing follows
        None,
        f"did not answer within call_timeout_s={CALL_S}",
    ),
    "a frame fragmented past 16 MiB": (
        fragment(b'{"', opcode=1) + fragment(b"x" * 2**20) * 17,
        None,
        "1009 (message too big)",
    ),
}


@pytest.mark.parametrize("name", list(FRAME_SHAPES))
def test_a_frame_of_the_wrong_shape_is_a_remote_env_error_in_time(fake, name) -> None:
    reset_answer, step_answer, expected = FRAME_SHAPES[name]
    fake.script = scripted(reset_answer, step_answer)
    env = RemoteEnv(fake.url, call_timeout_s=CALL_S)
    started = time.monotonic()
    error = asyncio.run(refused(env, step=step_answer is not None))
    assert expected in error, error
    assert time.monotonic() - started < CALL_S + 2.0


class RawServer(LoopbackServer):
    """A loopback server that answers each connection's first request head with
    ``respond(head, server)``: bytes, None (never answer) or ``async fn(writer)``."""

    def __init__(self, respond: Callable[[bytes, RawServer], Any]) -> None:
        self.respond = respond
        super().__init__()

    async def _serve(self, reader, writer) -> None:
        try:
            reply = self.respond(await reader.readuntil(b"\r\n\r\n"), self)
            if reply is None:
                await asyncio.sleep(3600)
            elif callable(reply):
                await reply(writer)
            else:
                writer.write(reply)
                await writer.drain()
                await asyncio.sleep(0.5)  # the client reads the answer before the close
        except (ConnectionError, asyncio.CancelledError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


async def endless_head(writer) -> None:
    writer.write(b"HTTP/1.1 101 Switching Protocols\r\n")
    for _ in range(100_000):  # 100 MB of headers at most; the client stops reading first
        writer.write(b"X-A: " + b"a" * 1000 + b"\r\n")
        await writer.drain()


HANDSHAKES = {
    "never answered": (lambda head, server: None, "connect did not answer within"),
    # The client's header limit or its deadline, whichever comes first, refuses it.
    "endless headers": (
        lambda head, server: endless_head,
        ("connect did not answer within", "did not receive a valid HTTP response"),
    ),
    "a 503 with 1 MB": (
        lambda head, server: b"HTTP/1.1 503 X\r\nContent-Length: 1000000\r\n\r\n" + b"x" * 10**6,
        "rejected WebSocket connection: HTTP 503",
    ),
    "a redirect loop": (
        lambda head, server: (
            b"HTTP/1.1 302 Found\r\nLocation: ws://127.0.0.1:%d/ws\r\n"
            b"Content-Length: 0\r\n\r\n" % server.port
        ),
        "more than 10 redirects",
    ),
}


@pytest.mark.parametrize("name", list(HANDSHAKES))
def test_a_hostile_handshake_is_a_remote_env_error_within_connect_timeout(name) -> None:
    respond, expected = HANDSHAKES[name]
    server = RawServer(respond)
    try:
        env = RemoteEnv(server.url, call_timeout_s=CALL_S, connect_timeout_s=CALL_S)
        started = time.monotonic()
        error = asyncio.run(refused(env, step=False))
        assert any(e in error for e in ([expected] if isinstance(expected, str) else expected))
        assert len(error) < 2100 and time.monotonic() - started < CALL_S + 2.0
    finally:
        server.stop()


def test_a_conclude_never_answered_is_a_remote_env_error_in_time(fake) -> None:
    fake.script = scripted(answer({**OPENING, "concludes": True}), HANG)
    env = RemoteEnv(fake.url, call_timeout_s=CALL_S)

    async def run() -> None:
        await env.reset(Task("q", id="t0"))
        with pytest.raises(RemoteEnvError, match="conclude did not answer within"):
            await env.conclude("max_turns")
        await env.close()

    started = time.monotonic()
    asyncio.run(run())
    assert time.monotonic() - started < CALL_S + 2.0


REPORTED = {
    "tool_calls of 401 digits": f'{{"tool_calls": {BIG}}}',
    "tool_errors as text": '{"tool_calls": 3, "tool_errors": "x"}',
    "tool_errors a list": '{"tool_calls": 1e300, "tool_errors": [1]}',
    "a negative count": '{"tool_calls": -7, "tool_errors": -1}',
}


@pytest.mark.parametrize("name", list(REPORTED))
def test_metrics_that_are_not_counts_do_not_crash_a_report(fake, name) -> None:
    fake.script = scripted(answer(OPENING), with_metrics(REPORTED[name]))
    report = run_and_report(
        RemoteEnvFactory(fake.url, call_timeout_s=CALL_S), Says(), tasks=[Task("q", id="t0")],
        max_turns=2, progress=False, print_report=False,
    )  # fmt: skip
    wanted = {"tool_calls_mean": 3.0 if name == "tool_errors as text" else 0.0,
              "tool_errors_mean": 0.0, "tool_error_rate": 0.0, "reward_mean": 1.0}  # fmt: skip
    assert {key: report.metrics[key] for key in wanted} == wanted


def test_per_turn_rewards_past_a_float_do_not_crash_the_collection(fake) -> None:
    fake.script = scripted(answer(OPENING), with_metrics(f'{{"per_turn_rewards": [{BIG}]}}'))
    with pytest.warns(UserWarning, match="Ignoring per_turn_rewards"):
        [[episode]] = collect_groups(
            RemoteEnvFactory(fake.url, call_timeout_s=CALL_S), [Task("q", id="t0")], Says(),
            max_turns=2,
        )  # fmt: skip
    assert episode.reward == 1.0 and episode.error is None
    assert episode.metrics == {"per_turn_rewards_invalid": 1}


def listing_server(head: bytes, body: bytes, encoding: str = "") -> RawServer:
    extra = f"Content-Encoding: {encoding}\r\n" if encoding else ""
    reply = (f"{head.decode()}\r\nContent-Type: application/json\r\n{extra}"
             f"Content-Length: {len(body)}\r\n\r\n").encode() + body  # fmt: skip
    return RawServer(lambda request, server: reply)


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_a_compressed_bomb_of_a_listing_is_cut_at_the_cap(monkeypatch, encoding) -> None:
    monkeypatch.setattr(registration, "MAX_LISTING_BYTES", 2**20)
    inflated = b'{"tasks": [' + b" " * (32 * 2**20) + b"]}"  # 32 MiB of JSON, ~32 kB sent
    body = gzip.compress(inflated, 9) if encoding == "gzip" else zlib.compress(inflated, 9)
    server = listing_server(b"HTTP/1.1 200 OK", body, encoding)
    try:
        started = time.monotonic()
        with pytest.raises(RemoteEnvError, match=re.escape("over 1,048,576 bytes")):
            RemoteTasks(server.url, timeout_s=5)("train")
        assert time.monotonic() - started < 3.0
    finally:
        server.stop()


def test_a_listing_that_redirects_is_not_followed() -> None:
    server = listing_server(b"HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:9/elsewhere", b"")
    try:
        with pytest.raises(RemoteEnvError, match="answered 302"):
            RemoteTasks(server.url, timeout_s=2)("train")
    finally:
        server.stop()
