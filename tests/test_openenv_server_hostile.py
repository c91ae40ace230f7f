"""``llm-gym serve-env`` (:mod:`llm_gym.integrations.openenv`: ``server``, ``session``,
``guard``) against hostile clients and a hostile environment, on loopback only:
slowloris connections, a ``Content-Length`` that lies, an env that ignores its cancellation,
an env whose observation breaks the protocol's limits, pipelined and late frames, tool calls of
hostile shapes, a fragmented frame never finished. The server answers each with a clear error
or a closed connection within its timeouts, and keeps serving.

=================================  =====================================  ======================
case                               without a fix                          what holds
=================================  =====================================  ======================
a request head never finished, no  the connection held for good (a file   closed after
request at all, a WebSocket        descriptor each: enough of them and    ``request_timeout_s``
handshake never finished           the server accepts no one)             (``head_timeout_
                                                                          protocol``)
a body shorter than its            held for good                          408, then closed
``Content-Length``
a WebSocket session longer than    (guards the hand-over: the head        the session plays on
``request_timeout_s``              deadline ends at the upgrade)
an env whose step (or close)       the server waited for it (6 s past a   error at
catches ``CancelledError`` and     1 s ``step_timeout_s``), then sent     ``step_timeout_s``,
goes on                            the late answer as a success           episode closed
                                                                          (``aio.within``)
an env's step: 1,000,000 or 5,000  sent: the client got 1009 (a dead      refused before it is
messages, a 20 MB message,         session) or refused the frame, while   sent, naming the rule
metrics nested 100 deep or of      the server's episode went on; 1M       (``sendable``); the
200,000 values, role ``root``,     messages took 4.8 s                    episode is closed
content a list; an opening of
5,000 messages
frames pipelined without waiting;  contained                              answered in order;
a step after ``close``; tool                                              connection closed;
calls of 9 hostile shapes; a                                              named errors, session
fragmented frame never finished                                           lives; idle timeout
one connection past                WebSocket handshakes had no cap (uvi-  a 503 with the reason,
``max_connections`` (a WebSocket   corn's ``limit_concurrency`` lets up-  before any session or
handshake, an HTTP ``/reset``)     grades pass, and ``serve-env`` did     env; the open sessions
                                   not set it): HTTP ``/reset`` made an   play on
                                   env per request, without bound
=================================  =====================================  ======================
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from typing import Any

import httpx
import pytest

pytest.importorskip("openenv")

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from llm_gym import Task, register_env
from llm_gym.cli import build_parser
from llm_gym.core import Env, StepResult
from llm_gym.integrations.openenv import server as openenv_server
from llm_gym.integrations.openenv.server import DEFAULT_MAX_CONNECTIONS, serve_env
from tests.test_openenv_hostile import active, ask, error, reset, settled, step, ws_url

REQUEST_S = 1.0
STEP_S = 1.0


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


class Hostile(Env):
    """An env that misbehaves as the assistant's message says (``stubborn``: a step that
    ignores its cancellation; ``stubborn close``: a close that does)."""

    made = closed = epoch = 0
    stubborn_close = False

    def __init__(self) -> None:
        self.epoch = Hostile.epoch
        Hostile.made += 1
        self._messages: list[dict[str, Any]] = []

    @classmethod
    def recount(cls) -> None:
        """Start this test's counts (of the envs made from now on)."""
        cls.epoch += 1
        cls.made = cls.closed = 0

    async def reset(self, task):
        count = 5000 if task.prompt == "crowd" else 1
        self._messages = [{"role": "user", "content": task.prompt}] * count
        return list(self._messages)

    async def step(self, message):
        text = message.get("content") or ""
        messages = [*self._messages, message]
        tail: list[Any] = []
        if text == "stubborn":
            await ignoring_cancellation(6.0)
        elif text == "million":
            tail = [{"role": "user", "content": ""}] * 1_000_000
        elif text == "5000":
            tail = [{"role": "user", "content": ""}] * 5000
        elif text == "20 MB":
            tail = [{"role": "user", "content": "x" * 20_000_000}]
        elif text == "root":
            tail = [{"role": "root", "content": "x"}]
        elif text == "content list":
            tail = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
        elif text == "deep metrics":
            return StepResult(True, False, messages, reward=1, metrics={"a": nested(100)})
        elif text == "wide metrics":
            metrics = {f"k{i}": i for i in range(200_000)}
            return StepResult(True, False, messages, reward=1, metrics=metrics)
        elif text == "done":
            return StepResult(True, False, messages, reward=1.0)
        self._messages = [*messages, *tail, {"role": "user", "content": f"again {text}"}]
        return StepResult(False, False, list(self._messages))

    @property
    def tool_specs(self):
        return [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]

    @property
    def messages(self):
        return list(self._messages)

    async def close(self):
        if Hostile.stubborn_close:
            await ignoring_cancellation(6.0)
        if self.epoch == Hostile.epoch:
            Hostile.closed += 1


async def ignoring_cancellation(seconds: float) -> None:
    """Sleep ``seconds``, whatever cancels it (what a broad ``except`` in an env does)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(end - time.monotonic())


register_env(
    "OpenEnvHostile-v0",
    env=Hostile,
    tasks=[Task("p0", id="p0"), Task("crowd", id="crowd")],
)


@pytest.fixture(scope="module")
def server():
    with serve_env("OpenEnvHostile-v0", port=0, max_sessions=4, idle_timeout_s=2.0,
                   step_timeout_s=STEP_S, request_timeout_s=REQUEST_S) as running:  # fmt: skip
        yield running


def address(server) -> tuple[str, int]:
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


def held_for(server, sent: bytes, wait_s: float = 8.0) -> tuple[float, bytes]:
    """Seconds until the server answered or closed a connection that sent ``sent``, and what
    it said (``wait_s`` when it did neither)."""
    with socket.create_connection(address(server), timeout=wait_s) as sock:
        sock.sendall(sent)
        started, said = time.monotonic(), b""
        try:
            while chunk := sock.recv(65536):
                said += chunk
        except (TimeoutError, ConnectionResetError):
            pass
        return time.monotonic() - started, said


SLOWLORIS = {
    "a request head never finished": b"POST /reset HTTP/1.1\r\nHost: 127.0.0.1\r\n",
    "no request at all": b"",
    "a handshake never finished": b"GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n",
}


@pytest.mark.parametrize("name", list(SLOWLORIS))
def test_a_connection_without_a_request_head_is_closed_at_request_timeout(server, name) -> None:
    waited, said = held_for(server, SLOWLORIS[name])
    assert REQUEST_S - 0.2 < waited < REQUEST_S + 2.0 and said == b""


def test_a_body_shorter_than_its_content_length_is_a_408(server) -> None:
    head = (b"POST /reset HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n")  # fmt: skip
    waited, said = held_for(server, head + b'{"seed":')
    assert waited < REQUEST_S + 2.0
    assert said.startswith(b"HTTP/1.1 408 ") and b"did not arrive within 1.0 s" in said
    assert b"connection: close" in said.lower()


def play(server, *frames: str, pause_s: float = 0.0) -> list[dict[str, Any]]:
    """The answers to ``frames`` in one session (``pause_s`` between them)."""

    async def run() -> list[dict[str, Any]]:
        async with connect(ws_url(server), max_size=None, close_timeout=2) as ws:
            answers = []
            for frame in frames:
                answers.append(await ask(ws, frame, timeout=15))
                await asyncio.sleep(pause_s)
            return answers

    return asyncio.run(run())


def test_a_websocket_session_outlives_the_request_timeout(server) -> None:
    answers = play(server, reset(seed=0), step({"content": "a"}), step({"content": "b"}),
                   pause_s=REQUEST_S * 0.8)  # fmt: skip
    assert [a["type"] for a in answers] == ["observation"] * 3


def test_an_env_that_ignores_its_cancellation_is_cut_at_step_timeout(server) -> None:
    Hostile.recount()
    started = time.monotonic()
    _, late, after = play(server, reset(seed=0), step({"content": "stubborn"}),
                          step({"content": "done"}))  # fmt: skip
    assert time.monotonic() - started < STEP_S + 3.0
    assert "OpenEnvHostile-v0.step did not return within 1.0 s" in error(late)
    assert "reset first" in error(after)  # the episode is closed
    assert settled(server) == 0 and Hostile.made == Hostile.closed == 1


def test_a_close_that_ignores_its_cancellation_is_cut_at_step_timeout(server) -> None:
    Hostile.stubborn_close = True
    try:
        started = time.monotonic()
        opened, again = play(server, reset(seed=0), reset(seed=0))  # the second closes the first
        assert again["type"] == "observation"
        assert time.monotonic() - started < STEP_S + 3.0
    finally:
        Hostile.stubborn_close = False
    assert settled(server, within_s=10) == 0


OVERSIZED = {
    "million": "returned 1,000,002 new messages; an observation carries at most 4,096",
    "5000": "returned 5,002 new messages",
    "20 MB": "returned an observation of 20,000,",
    "deep metrics": "no client reads: The observation is nested deeper than 64 levels",
    "wide metrics": "no client reads: The observation holds too many values",
    "root": "messages[1].role='root'",
    "content list": "messages[1].content=[{'type': 'text'",
}


@pytest.mark.parametrize("reply", list(OVERSIZED))
def test_an_observation_past_the_protocol_is_refused_before_it_is_sent(server, reply) -> None:
    Hostile.recount()
    started = time.monotonic()
    _, broken, after = play(server, reset(seed=0), step({"content": reply}),
                            step({"content": "done"}))  # fmt: skip
    assert OVERSIZED[reply] in error(broken) and "the episode is closed" in error(broken)
    assert len(error(broken)) < 1200
    assert "reset first" in error(after)
    assert time.monotonic() - started < 6.0
    assert settled(server) == 0 and Hostile.made == Hostile.closed == 1


def test_an_opening_past_the_protocol_is_refused(server) -> None:
    [refused] = play(server, reset(task_id="crowd"))
    assert "OpenEnvHostile-v0.reset" in error(refused) and "5,000 new messages" in error(refused)
    assert settled(server) == 0


def test_pipelined_frames_are_answered_in_order(server) -> None:
    frames = [reset(seed=0), step({"content": "a"}), reset(seed=0), step({"content": "b"}),
              step({"content": "done"}), step({"content": "c"})]  # fmt: skip

    async def run() -> list[dict[str, Any]]:
        async with connect(ws_url(server)) as ws:
            for frame in frames:  # all of them before the first answer
                await ws.send(frame)
            return [json.loads(await asyncio.wait_for(ws.recv(), 5)) for _ in frames]

    answers = asyncio.run(run())
    last = [m["content"] for a in answers[:5] for m in a["data"]["observation"]["messages"][-1:]]
    assert last == ["p0", "again a", "p0", "again b", "done"]
    assert answers[4]["data"]["done"] is True and "reset first" in error(answers[5])
    assert settled(server) == 0


def test_a_step_after_close_finds_the_connection_closed(server) -> None:
    Hostile.recount()

    async def run() -> int | None:
        async with connect(ws_url(server)) as ws:
            await ask(ws, reset(seed=0))
            await ws.send(json.dumps({"type": "close"}))
            await ws.send(step({"content": "a"}))
            with pytest.raises(ConnectionClosed):
                await asyncio.wait_for(ws.recv(), 5)
            return ws.close_code

    assert asyncio.run(run()) == 1000
    assert settled(server) == 0
    deadline = time.monotonic() + 5
    while Hostile.closed < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert Hostile.made == Hostile.closed == 1


def calls(tool_calls: Any) -> str:
    return json.dumps(
        {"type": "step", "data": {"message": {"content": "", "tool_calls": tool_calls}}}
    )


TOOL_CALLS = {
    "an object": {"a": 1},
    "text": "lookup",
    "a null call": [None],
    "type code": [{"type": "code", "function": {"name": "lookup"}}],
    "a name of 257 characters": [{"function": {"name": "f" * 257}}],
    "an empty name": [{"function": {"name": ""}}],
    "a null id": [{"id": None, "function": {"name": "lookup"}}],
    "arguments a number": [{"function": {"name": "lookup", "arguments": 5}}],
    "no function": [{"id": "c"}],
}


@pytest.mark.parametrize("name", list(TOOL_CALLS))
def test_tool_calls_of_a_hostile_shape_are_refused_and_the_episode_goes_on(server, name) -> None:
    _, refused, last = play(server, reset(seed=0), calls(TOOL_CALLS[name]),
                            step({"content": "done"}))  # fmt: skip
    assert error(refused).startswith("Invalid message") and len(error(refused)) < 3000
    assert last["data"]["done"] is True and last["data"]["reward"] == 1.0


def test_a_fragmented_frame_never_finished_is_closed_at_idle_timeout(server) -> None:
    async def run() -> tuple[float, int | None]:
        async with connect(ws_url(server)) as ws:

            async def dribble():
                yield '{"type": "reset", "data": {"seed": 0, "x": "'
                for _ in range(100):  # 30 s at most; the server closes after 2 s
                    await asyncio.sleep(0.3)
                    yield "x" * 10

            started = time.monotonic()
            with pytest.raises(ConnectionClosed):
                await ws.send(dribble())
            return time.monotonic() - started, ws.close_code

    waited, code = asyncio.run(run())
    assert waited < 5.0 and code == 1000
    assert active(server) == 0


CAP = 3
"""max_connections of the capped server below."""


def test_one_connection_past_max_connections_is_refused_and_the_open_ones_play_on() -> None:
    Hostile.recount()
    with serve_env("OpenEnvHostile-v0", port=0, max_sessions=8, max_connections=CAP,
                   request_timeout_s=5.0) as capped:  # fmt: skip

        async def run() -> None:
            sessions = [await connect(ws_url(capped), close_timeout=2) for _ in range(CAP)]
            for ws in sessions:
                assert (await ask(ws, reset(task_id="p0")))["type"] == "observation"
            with pytest.raises(InvalidStatus) as refused:
                await connect(ws_url(capped), open_timeout=5)
            answer = refused.value.response
            assert answer.status_code == 503
            assert b"at most 3 connections at once" in answer.body
            http = await asyncio.to_thread(
                httpx.post, f"{capped.url}/reset", json={"seed": 0}, timeout=5
            )
            assert http.status_code == 503
            for ws in sessions:  # the first ones are still served
                assert (await ask(ws, step({"content": "a"})))["type"] == "observation"
            assert Hostile.made == CAP  # no env for the refused handshake or /reset
            await sessions[0].close()
            await asyncio.sleep(0.2)
            assert await asyncio.to_thread(active, capped) == CAP - 1  # no session was made
            for ws in sessions[1:]:
                await ws.close()

        asyncio.run(asyncio.wait_for(run(), 30))
        assert settled(capped) == 0


def test_serve_env_checks_max_connections_and_the_cli_passes_it(monkeypatch) -> None:
    with pytest.raises(Exception, match="max_connections must be an int >= 1"):
        serve_env("OpenEnvHostile-v0", port=0, max_connections=0)
    given: dict[str, Any] = {}

    def fake_serve_env(env_id: str, **options: Any) -> Any:
        given.update(options)
        raise KeyboardInterrupt

    monkeypatch.setattr(openenv_server, "serve_env", fake_serve_env)
    for argv, expected in ((["--max-connections", "7"], 7), ([], DEFAULT_MAX_CONNECTIONS)):
        args = build_parser().parse_args(["serve-env", "OpenEnvHostile-v0", *argv])
        given.clear()
        with pytest.raises(KeyboardInterrupt):
            args.func(args, None)
        assert given.get("max_connections", DEFAULT_MAX_CONNECTIONS) == expected


# --- serve-env: refused input is not echoed -------------------------------------------------------


@pytest.fixture(scope="module")
def env_server() -> Any:
    pytest.importorskip("openenv")
    from llm_gym.integrations.openenv.server import serve_env

    with serve_env("ToolUseGame-v0", port=0, max_sessions=2) as running:
        yield running


def test_serve_env_validation_errors_do_not_echo_the_input(env_server: Any) -> None:
    import httpx
    from websockets.asyncio.client import connect

    huge = "x" * 2_000_000
    step = {"type": "step", "data": {"message": {"content": huge}}}

    async def over_ws(url: str) -> list[str]:
        async with connect(url.replace("http://", "ws://") + "/ws", max_size=None) as ws:
            answers = []
            for frame in ({"type": "reset", "data": {"seed": 0}}, step):
                await ws.send(json.dumps(frame))
                answers.append(await asyncio.wait_for(ws.recv(), 10))
            return answers

    _, refused = asyncio.run(over_ws(env_server.url))
    assert len(refused) < 600 and "string_too_long" in refused
    for path, body in (("/step", {"action": {"message": {"content": huge}}}),
                       ("/reset", {"episode_id": "e" * 100_000})):  # fmt: skip
        answer = httpx.post(env_server.url + path, json=body, timeout=10)
        assert answer.status_code == 422 and len(answer.text) < 600, answer.text[:200]
        assert answer.json()["detail"][0]["type"] == "string_too_long"


@pytest.mark.parametrize("seed", [True, "12", 1.0])
def test_serve_env_takes_only_a_json_integer_seed(env_server: Any, seed: Any) -> None:
    import httpx
    from websockets.asyncio.client import connect

    answer = httpx.post(env_server.url + "/reset", json={"seed": seed}, timeout=10)
    assert answer.status_code == 422 and "integer seed" in answer.text  # pydantic's lax mode
    assert json.dumps(seed) in answer.json()["detail"]  # no lax coercion of true or "12"

    async def over_ws(url: str) -> list[Any]:
        async with connect(url.replace("http://", "ws://") + "/ws") as ws:
            answers = []
            for data in ({"seed": seed}, {"seed": 3}):
                await ws.send(json.dumps({"type": "reset", "data": data}))
                answers.append(json.loads(await asyncio.wait_for(ws.recv(), 10)))
            return answers

    refused, opened = asyncio.run(over_ws(env_server.url))
    assert refused["type"] == "error" and "integer seed" in refused["data"]["message"]
    assert opened["type"] == "observation"  # the session goes on
    assert httpx.post(env_server.url + "/reset", json={"seed": 3}, timeout=10).is_success
