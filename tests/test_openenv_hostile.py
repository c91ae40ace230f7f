"""The OpenEnv integration (:mod:`llm_gym.integrations`) under hostile input, both ways, on
loopback only.

A hostile client against ``serve-env`` (:mod:`llm_gym.integrations.openenv.server`): raw
WebSocket frames (not JSON, not an object, binary, nested 100,000 deep, a 9 MB bomb of empty
lists, 5,000-digit numbers, lone surrogates, MCP), wrong reset arguments, hostile actions,
frames over the size limit, 1,000 rapid resets, connections opened and never used, sessions
abandoned mid-episode and mid-step, the HTTP ``/reset``, ``/step``, ``/mcp`` and
``/llm_gym/tasks`` routes, web pages (a foreign ``Origin``, a rebound ``Host``, a body with no
``Content-Type``; :mod:`llm_gym.serving.access`), and a hostile environment behind the server
(NaN rewards, messages that are not dicts, raising steps). The server must answer each with a
clear error, keep the session (and every other session) going, and free every session and env it
made.

A hostile server against :class:`~llm_gym.integrations.openenv.client.RemoteEnv`: a fake
OpenEnv server written here on raw sockets (so it can break the protocol anywhere) that answers
garbage, wrong shapes, ``start`` out of range or negative, huge message lists, NaN or string
rewards, lists for metrics, never answers, closes mid-frame or ignores the close handshake; and
a hostile task listing. ``RemoteEnv`` must raise ``RemoteEnvError`` (or return a clean
``StepResult``) within its deadline, and nothing non-finite or malformed may reach the loop.

What holds (the protocol module's ``read_frame``/``check_*``, the guard's ``FrameGuard``, the
server's ``ServedEnv``, the client's ``RemoteEnv``/``RemoteTasks``; the measured cost of each attack
without its check is in ``benchmarks/results/README.md``):

==================================  ========================================
attack                              what holds
==================================  ========================================
frame a list/null/string, binary,   ``FrameGuard`` reads
nested 30,000 deep, 5,000 digits    each frame first: an
                                    error, session lives
16 MB of ``[],`` (WS frame)         values counted in the
``/reset`` body of 9 MB of ``[],``  text first
NaN anywhere (``/reset`` body)      refused, named
lone surrogate in an action         replaced (U+FFFD)
``type: mcp``, ``POST /mcp``        refused (404, 1008)
idle connection                     closed at
                                    ``idle_timeout_s``
``task_id: [1]``, ``episode_id``    checked before the
``[1]``                             episode is touched
env: NaN or text reward, bad        ``check_step``; the
messages, a raising step            episode closed
HTTP ``/reset`` bad args, ``/step``  422 with the reason
RemoteEnv: a list frame, deep       every failure of an
JSON, a huge int                    exchange: remote
RemoteEnv: NaN/text reward, done    ``check_observation``
``"yes"``, metrics a list, start    (models), before the
-1, bad messages or tool specs      conversation changes
RemoteEnv: 17 MB frame              16 MiB, both sides
RemoteEnv: close ignored            bounded, then cut
listing: not JSON, bad tasks,       ``read_frame`` +
drip-fed, oversized                 ``check_listing``;
                                    deadline, 64 MiB cap
==================================  ========================================
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import math
import re
import socket
import time
from typing import Any

import httpx
import pytest

from tests.conftest import LoopbackServer

pytest.importorskip("openenv")

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from llm_gym import Task, register_env
from llm_gym.core import Env, StepResult
from llm_gym.core.env import TruncationCause
from llm_gym.envs.tool_use_game import get_tasks
from llm_gym.errors import RemoteEnvError
from llm_gym.integrations.openenv import (
    RemoteEnv,
    RemoteEnvFactory,
    RemoteTasks,
    registration,
    serve_env,
)
from llm_gym.integrations.openenv.protocol import MAX_FRAME_BYTES
from llm_gym.policies import Generation, Policy
from llm_gym.rollout import collect_groups
from llm_gym.serving.access import AccessPolicy

# --- a hostile client against the server ---------------------------------------------------------


class Probe(Env):
    """An env that counts the instances made and closed, and misbehaves when the reply says so:
    a hostile environment behind the server."""

    made = closed = 0
    epoch = 0
    """Counts belong to one test: an env of an earlier test closing late does not count."""

    def __init__(self) -> None:
        self.epoch = Probe.epoch
        Probe.made += 1
        self._messages: list[dict[str, Any]] = []

    @classmethod
    def recount(cls) -> None:
        """Start this test's counts (``made`` and ``closed`` of envs made from now on)."""
        cls.epoch += 1
        cls.made = cls.closed = 0

    async def reset(self, task):
        self._messages = [{"role": "user", "content": task.prompt}]
        return list(self._messages)

    async def step(self, message):
        text = message.get("content") or ""
        self._messages = messages = [*self._messages, message]
        if text.startswith("sleep:"):
            await asyncio.sleep(float(text[6:]))
        if text == "raise":
            raise RuntimeError("the env broke")
        if text == "nan":
            return StepResult(True, False, messages, reward=math.nan)
        if text == "text reward":
            return StepResult(True, False, messages, reward="1.0")
        if text == "bad messages":
            return StepResult(False, False, [*messages, 5])
        if text == "odd metrics":
            return StepResult(True, False, messages, reward=1, metrics={"a": math.inf, "b": {2}})
        if text == "surrogate":
            return StepResult(False, False, [*messages, {"role": "user", "content": "\ud800!"}])
        if text == "done":
            return StepResult(True, False, messages, reward=1.0)
        self._messages = [*messages, {"role": "user", "content": "again"}]
        return StepResult(False, False, list(self._messages))

    @property
    def tool_specs(self):
        return []

    @property
    def messages(self):
        return list(self._messages)

    async def close(self):
        if self.epoch == Probe.epoch:
            Probe.closed += 1


register_env("OpenEnvProbe-v0", env=Probe, tasks=[Task(f"p{i}", id=f"p{i}") for i in range(5)])


@pytest.fixture(scope="module")
def tool_server():
    with serve_env("ToolUseGame-v0", port=0, max_sessions=16) as running:
        yield running


@pytest.fixture(scope="module")
def probe_server():
    with serve_env("OpenEnvProbe-v0", port=0, max_sessions=4, idle_timeout_s=1.0,
                   step_timeout_s=2.0) as running:  # fmt: skip
        yield running


def active(server) -> int:
    return httpx.get(f"{server.url}/llm_gym/sessions", timeout=5).json()["active"]


def settled(server, within_s: float = 5.0) -> int:
    """The active sessions once they are back to 0 (or the count when ``within_s`` ran out)."""
    deadline = time.monotonic() + within_s
    while (now := active(server)) and time.monotonic() < deadline:
        time.sleep(0.02)
    return now


def ws_url(server) -> str:
    return server.url.replace("http://", "ws://") + "/ws"


async def ask(ws, frame: str | bytes, timeout: float = 5.0) -> dict[str, Any]:
    await ws.send(frame)
    return json.loads(await asyncio.wait_for(ws.recv(), timeout))


def reset(**data: Any) -> str:
    return json.dumps({"type": "reset", "data": data})


def step(message: dict[str, Any]) -> str:
    return json.dumps({"type": "step", "data": {"message": message}})


def play(server, *frames: str | bytes) -> list[dict[str, Any]]:
    """The answers to ``frames`` in one session, then to a ``state`` (which proves the session
    outlived them); the session is closed after."""

    async def run() -> list[dict[str, Any]]:
        async with connect(ws_url(server), max_size=None, close_timeout=2) as ws:
            answers = [await ask(ws, frame) for frame in frames]
            answers.append(await ask(ws, json.dumps({"type": "state"})))
            await ws.send(json.dumps({"type": "close"}))
            return answers

    return asyncio.run(run())


def error(answer: dict[str, Any]) -> str:
    assert answer["type"] == "error", answer
    return answer["data"]["message"]


HOSTILE_FRAMES = {
    "not JSON": ("{nope", "Invalid JSON"),
    "a list": ("[1, 2]", "must be a JSON object"),
    "null": ("null", "must be a JSON object"),
    "a string": ('"reset"', "must be a JSON object"),
    "an MCP call": (
        json.dumps({"type": "mcp", "data": {"jsonrpc": "2.0", "method": "tools/list", "id": 1}}),
        "message type 'mcp'",
    ),
    "binary, not UTF-8": (b"\xff\xfe{", "UTF-8"),
    "nested 30,000 deep": ('{"type":"reset","data":{"seed":' + "[" * 30_000, "nested too deep"),
    "nested 100 deep": ('{"type":"reset","data":{"seed":' + "[" * 100 + "]" * 100 + "}}", "deeper"),
    "a bomb of empty lists": (
        '{"type":"reset","data":{"seed":[' + "[]," * 3_000_000 + "[]]}}",
        "too many values",
    ),
    "5,000 digits": ('{"type":"reset","data":{"seed":1' + "0" * 5000 + "}}", "Invalid JSON"),
    "a NaN seed": ('{"type":"reset","data":{"seed":NaN}}', "not a finite number"),
    "an infinite seed": ('{"type":"reset","data":{"seed":1e999}}', "not a finite number"),
    "step before reset": (step({"content": "1"}), "reset first"),
}


@pytest.mark.parametrize("name", list(HOSTILE_FRAMES))
def test_hostile_frames_are_named_errors_and_the_session_lives_on(tool_server, name) -> None:
    frame, expected = HOSTILE_FRAMES[name]
    started = time.monotonic()
    refused, opened, state = play(tool_server, frame, reset(seed=0))
    assert expected in error(refused)
    assert len(error(refused)) < 600  # the hostile input is not echoed back
    assert opened["type"] == "observation" and state["type"] == "state"
    assert time.monotonic() - started < 5.0
    assert settled(tool_server) == 0


def test_a_binary_frame_of_json_is_read_as_text(tool_server) -> None:
    opened, _ = play(tool_server, reset(seed=0).encode())
    assert opened["data"]["observation"]["task_id"] == get_tasks("train")[0].id


def test_a_frame_over_the_size_limit_closes_only_its_connection(tool_server) -> None:
    async def run() -> int | None:
        async with connect(ws_url(tool_server), max_size=None) as ws:
            await ws.send('{"type":"reset","data":{"task_id":"' + "x" * MAX_FRAME_BYTES + '"}}')
            with pytest.raises(ConnectionClosed):
                await asyncio.wait_for(ws.recv(), 10)
            return ws.close_code

    assert asyncio.run(run()) == 1009  # message too big
    opened, _ = play(tool_server, reset(seed=1))  # the server serves on
    assert opened["type"] == "observation"
    assert settled(tool_server) == 0


TASKS = get_tasks("train")
HOSTILE_RESETS = {
    "seed 1.5": ({"seed": 1.5}, "integer seed"),
    "seed text": ({"seed": "1"}, "integer seed"),
    "seed True": ({"seed": True}, "integer seed"),
    "task_id of 1 MB": ({"task_id": "x" * 1_000_000}, "names no task"),
    "task_id a list": ({"task_id": [1]}, "task_id must be a string"),
    "task_id a dict": ({"task_id": {"a": 1}}, "task_id must be a string"),
    "task_id a number": ({"task_id": 5}, "task_id must be a string"),
    "split a list": ({"task_id": "x", "split": ["val"]}, "split must be one of"),
    "episode_id a list": ({"seed": 0, "episode_id": [1]}, "episode_id must be"),
    "episode_id of 10 kB": ({"seed": 0, "episode_id": "e" * 10_000}, "episode_id must be"),
    "a target": ({"seed": 0, "target": "42"}, "Unknown reset argument"),
}


@pytest.mark.parametrize("name", list(HOSTILE_RESETS))
def test_a_hostile_reset_is_refused_and_the_running_episode_goes_on(tool_server, name) -> None:
    data, expected = HOSTILE_RESETS[name]
    opened, refused, last, _ = play(
        tool_server, reset(seed=3), reset(**data), step({"content": "-1"})
    )
    assert opened["type"] == "observation"
    assert expected in error(refused) and len(error(refused)) < 600
    assert last["data"]["done"] is True and last["data"]["reward"] == 0.0  # the seed-3 episode


@pytest.mark.parametrize("seed", [-1, 10**100, 2**64 + 7])
def test_any_integer_seed_picks_a_task(tool_server, seed) -> None:
    opened, _ = play(tool_server, reset(seed=seed))
    assert opened["data"]["observation"]["task_id"] == TASKS[seed % len(TASKS)].id


def call(name: str, arguments: Any) -> dict[str, Any]:
    return {"id": "c", "type": "function", "function": {"name": name, "arguments": arguments}}


def test_hostile_actions_are_refused_or_played(tool_server) -> None:
    lookup = "lookup"
    opened, *answers, state = play(
        tool_server,
        reset(seed=0),
        '{"type":"step","data":{"message":{"content":"1","\\udc80":1}}}',  # a surrogate key
        step({"tool_calls": [call("\udfff", "{}")]}),  # a lone surrogate for a name
        step({"tool_calls": [call(lookup, "{not json")]}),
        '{"type":"step","data":{"message":{"tool_calls":[{"function":{"name":"lookup",'
        '"arguments":{"key":NaN}}}]}}}',
        step({"tool_calls": [call(lookup, [1])]}),
        '{"type":"step","data":{"message":{"content":1e999}}}',
        step({"tool_calls": [call(lookup, "{]")] * 64}),
        '{"type":"step","data":{"message":{"content":"\\ud800 is 5"}}}',  # ends the episode
    )
    key, name, not_json, nan, listed, infinite, many, surrogate = answers
    assert "Invalid message" in error(key)
    tool = name["data"]["observation"]["messages"][1]
    assert tool["role"] == "tool" and "\ufffd" in tool["content"]  # an unknown tool, cleaned
    assert not_json["data"]["observation"]["messages"][1]["content"].startswith("tool_error")
    assert "not a finite number" in error(nan) and "not a finite number" in error(infinite)
    assert "Invalid message" in error(listed)
    assert len(many["data"]["observation"]["messages"]) == 65  # the call, 64 tool errors
    assert surrogate["data"]["observation"]["messages"][0]["content"] == "\ufffd is 5"
    assert surrogate["data"]["done"] is True
    assert state["type"] == "state" and settled(tool_server) == 0


PROBE_STEPS = {
    "nan": "reward=nan",
    "text reward": "reward='1.0'",
    "bad messages": "messages[2]=5",
    "raise": "the env broke",
}


@pytest.mark.parametrize("reply", list(PROBE_STEPS))
def test_a_hostile_env_behind_the_server_ends_its_episode_with_a_named_error(
    probe_server, reply
) -> None:
    Probe.recount()
    _, broken, after, _ = play(probe_server, reset(seed=0), step({"content": reply}),
                               step({"content": "done"}))  # fmt: skip
    assert PROBE_STEPS[reply] in error(broken) and "the episode is closed" in error(broken)
    assert "reset first" in error(after)
    assert settled(probe_server) == 0 and Probe.made == Probe.closed == 1


def test_what_the_env_says_leaves_as_json(probe_server) -> None:
    _, surrogate, odd, _ = play(probe_server, reset(seed=0), step({"content": "surrogate"}),
                                step({"content": "odd metrics"}))  # fmt: skip
    assert surrogate["data"]["observation"]["messages"][-1]["content"] == "\ufffd!"
    assert odd["data"]["reward"] == 1.0 and odd["data"]["observation"]["metrics"] == {
        "a": "inf", "b": "{2}",
    }  # fmt: skip


def test_rapid_resets_and_abandoned_sessions_leak_nothing(probe_server) -> None:
    Probe.recount()

    async def resets() -> int:
        async with connect(ws_url(probe_server)) as ws:
            for seed in range(1000):
                assert (await ask(ws, reset(seed=seed)))["type"] == "observation"
            return active(probe_server)

    async def abandon(reply: str) -> None:
        ws = await connect(ws_url(probe_server))
        await ask(ws, reset(seed=1))
        await ws.send(step({"content": reply}))
        if reply == "again":
            await ws.recv()
        ws.transport.abort()  # no close frame, mid-episode (or mid-step)

    assert asyncio.run(resets()) == 1
    asyncio.run(abandon("again"))
    asyncio.run(abandon("sleep:0.3"))
    assert settled(probe_server) == 0
    deadline = time.monotonic() + 10  # closes run after the answers: wait for them
    while Probe.closed < Probe.made and time.monotonic() < deadline:
        time.sleep(0.02)
    assert Probe.made == Probe.closed == 1002  # every env the server made, closed


def test_idle_connections_are_closed_and_their_slots_freed(probe_server) -> None:
    async def last_words(ws) -> str:
        """What the server said before it closed ``ws`` (within 5 s)."""
        said = ""
        with pytest.raises(ConnectionClosed):
            while True:
                said = json.loads(await asyncio.wait_for(ws.recv(), 5))["data"]["message"]
        return said

    async def run() -> tuple[str, list[str], list[int | None], float]:
        idle = [await connect(ws_url(probe_server)) for _ in range(4)]  # never used
        refused = await last_words(await connect(ws_url(probe_server)))
        started = time.monotonic()
        said = [await last_words(ws) for ws in idle]  # idle_timeout_s=1.0: closed by the server
        return refused, said, [ws.close_code for ws in idle], time.monotonic() - started

    refused, said, codes, waited = asyncio.run(run())
    assert "capacity" in refused.lower()
    assert said == ["The session was idle for 1.0 s and is closed."] * 4
    assert codes == [1000] * 4 and waited < 4.0
    assert settled(probe_server) == 0
    opened, _ = play(probe_server, reset(seed=2))
    assert opened["type"] == "observation"


JSON = {"content-type": "application/json"}


def test_the_http_routes_answer_clear_errors_and_leak_no_session(probe_server) -> None:
    Probe.recount()
    url = probe_server.url
    assert httpx.post(f"{url}/reset", json={"seed": 1}).json()["observation"]["task_id"] == "p1"
    for body, expected in [({"task_id": [1]}, "task_id must be a string"),
                           ({"seed": 0, "target": 1}, "Unknown reset argument")]:  # fmt: skip
        answer = httpx.post(f"{url}/reset", json=body)
        assert answer.status_code == 422 and expected in answer.text
    stepped = httpx.post(f"{url}/step", json={"action": {"message": {"content": "1"}}})
    assert stepped.status_code == 422 and "WebSocket" in stepped.text
    bodies = [(b"{nope", "Invalid JSON"), (b'{"seed": NaN}', "not a finite number"),
              (b'{"seed": [' + b"[]," * 3_000_000 + b"[]]}", "too many values"),
              (b'{"seed": ' + b"[" * 100 + b"]" * 100 + b"}", "deeper than 64")]  # fmt: skip
    for body, expected in bodies:
        started = time.monotonic()
        answer = httpx.post(f"{url}/reset", content=body, headers=JSON, timeout=10)
        assert answer.status_code == 422 and expected in answer.json()["detail"]
        assert len(answer.text) < 400 and time.monotonic() - started < 3.0  # nothing echoed
    huge = httpx.post(f"{url}/reset", content=b" " * (MAX_FRAME_BYTES + 1), headers=JSON)
    assert huge.status_code == 413
    mcp = {"jsonrpc": "2.0", "method": "openenv/session/create", "params": {}, "id": 1}
    assert httpx.post(f"{url}/mcp", json=mcp).status_code == 404

    async def mcp_socket() -> None:
        async with connect(url.replace("http://", "ws://") + "/mcp"):
            pass

    with pytest.raises(InvalidStatus):
        asyncio.run(mcp_socket())
    for split in ["x" * 5000, "\udc80".encode("utf-8", "surrogatepass").decode("latin-1")]:
        answer = httpx.get(f"{url}/llm_gym/tasks", params={"split": split})
        assert answer.status_code == 422 and len(answer.text) < 400
    listing = httpx.get(f"{url}/llm_gym/tasks?split=val&split=test").json()
    assert listing["split"] == "test"  # the last value, one split
    assert settled(probe_server) == 0
    deadline = time.monotonic() + 10  # closes run after the answers: wait for them
    while Probe.closed < Probe.made and time.monotonic() < deadline:
        time.sleep(0.02)
    assert Probe.made == Probe.closed


def handshake(server, **headers: str) -> bytes:
    """The server's answer to a WebSocket handshake on ``/ws`` (``Host`` is the server's unless
    ``headers`` name another), read until it closes the connection or goes quiet."""
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    fields = {"Host": f"{host}:{port}", "Upgrade": "websocket", "Connection": "Upgrade",
              "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Version": "13",
              **headers}  # fmt: skip
    head = "GET /ws HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in fields.items())
    chunks = []
    with socket.create_connection((host, int(port)), timeout=2) as sock:
        sock.sendall(head.encode() + b"\r\n")
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
                if b"".join(chunks).startswith(b"HTTP/1.1 101 ") and b"\r\n\r\n" in chunk:
                    break  # switched: the session's frames would follow
        except TimeoutError:
            pass
    return b"".join(chunks)


WEB_PAGES = [
    ({"Origin": "https://evil.example"}, 403, "--allowed-origins"),
    ({"Origin": "null"}, 403, "--allowed-origins"),
    ({"Origin": "http://localhost.evil.example"}, 403, "--allowed-origins"),
    ({"Host": "evil.example"}, 400, "--allowed-hosts"),  # DNS rebinding: the page's own name
    ({"Host": "rebind.example:8001", "Origin": "http://rebind.example:8001"}, 400, "hosts"),
]


@pytest.mark.parametrize(("headers", "status", "option"), WEB_PAGES)
def test_web_pages_and_foreign_hosts_are_refused_before_any_session(
    probe_server, headers, status, option
) -> None:
    Probe.recount()
    answer = handshake(probe_server, **headers)
    assert answer.startswith(f"HTTP/1.1 {status} ".encode()), answer[:200]
    assert option.encode() in answer
    url = probe_server.url
    for method, path in [("POST", "/reset"), ("GET", "/llm_gym/tasks"), ("GET", "/health")]:
        refused = httpx.request(method, f"{url}{path}", json={"seed": 1}, headers=headers)
        assert refused.status_code == status and option in refused.json()["detail"]
    assert Probe.made == 0 and active(probe_server) == 0


def test_loopback_pages_and_clients_without_an_origin_are_served(probe_server) -> None:
    for headers in [{}, {"Origin": "http://localhost:5173"}, {"Origin": "http://127.0.0.1"},
                    {"Host": "localhost"}]:  # fmt: skip
        assert handshake(probe_server, **headers).startswith(b"HTTP/1.1 101 "), headers
        answer = httpx.post(f"{probe_server.url}/reset", json={"seed": 1}, headers=headers)
        assert answer.json()["observation"]["task_id"] == "p1"
    assert settled(probe_server) == 0


def test_an_access_policy_from_python_answers_the_hosts_and_origins_it_names() -> None:
    """``serve_env(..., access=AccessPolicy.local(hosts=..., origins=...))``, as
    docs/guides/serving.md shows it: the named host and origin are answered on top of loopback,
    and others are still refused."""
    access = AccessPolicy.local(hosts=["gpu-box.lan"], origins=["https://chat.example.com"])
    with serve_env("OpenEnvProbe-v0", port=0, access=access) as server:
        for headers in [{"Host": "gpu-box.lan"}, {"Origin": "https://chat.example.com"}, {}]:
            answer = httpx.get(f"{server.url}/health", headers=headers)
            assert answer.status_code == 200, headers
            assert handshake(server, **headers).startswith(b"HTTP/1.1 101 "), headers
        assert (
            httpx.get(f"{server.url}/health", headers={"Host": "evil.example"}).status_code == 400
        )
        refused = httpx.get(f"{server.url}/health", headers={"Origin": "https://evil.example"})
        assert refused.status_code == 403


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded"])
def test_a_body_not_declared_json_is_a_415_and_no_episode(probe_server, content_type) -> None:
    """What ``fetch`` sends with a Blob body (no Content-Type) or a form, without a preflight."""
    Probe.recount()
    headers = {} if content_type is None else {"Content-Type": content_type}
    answer = httpx.post(f"{probe_server.url}/reset", content=b'{"seed": 1}', headers=headers)
    assert answer.status_code == 415 and "application/json" in answer.json()["detail"]
    assert Probe.made == 0


# --- a hostile server against RemoteEnv ----------------------------------------------------------

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
HANG, CLOSE = "hang", "close"
"""Script actions: never answer; close the connection (no close frame)."""


def frame(payload: bytes, opcode: int = 1) -> bytes:
    """A server's WebSocket frame (unmasked)."""
    size = len(payload)
    if size < 126:
        head = bytes([0x80 | opcode, size])
    elif size < 1 << 16:
        head = bytes([0x80 | opcode, 126]) + size.to_bytes(2, "big")
    else:
        head = bytes([0x80 | opcode, 127]) + size.to_bytes(8, "big")
    return head + payload


async def read_client_frame(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    first, second = await reader.readexactly(2)
    size = second & 0x7F
    if size >= 126:
        size = int.from_bytes(await reader.readexactly(2 if size == 126 else 8), "big")
    mask = await reader.readexactly(4)
    data = await reader.readexactly(size)
    return first & 0x0F, bytes(b ^ mask[i % 4] for i, b in enumerate(data))


class FakeServer(LoopbackServer):
    """A hostile OpenEnv server on loopback, on raw sockets: each client frame is answered with
    what ``script(message, session)`` returns (text frames, raw bytes, HANG or CLOSE;
    ``session``: a dict per connection); ``GET /llm_gym/tasks`` with ``listing`` (status,
    body), dripped ``drip_s`` apart per byte when set.
    ``polite``: close the socket when the client closes the session (else ignore it)."""

    def __init__(self) -> None:
        self.script: Any = scripted(answer(OPENING))
        self.listing: tuple[int, bytes] = (404, b"{}")
        self.drip_s = 0.0
        self.polite = True
        super().__init__()

    async def _serve(self, reader, writer) -> None:
        try:
            request = await reader.readuntil(b"\r\n\r\n")
            if not request.startswith(b"GET /ws"):
                return await self._listing(writer)
            key = re.search(rb"(?i)sec-websocket-key: *(\S+)", request).group(1)
            accept = base64.b64encode(hashlib.sha1(key + GUID).digest())
            writer.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: "
                         b"Upgrade\r\nSec-WebSocket-Accept: " + accept + b"\r\n\r\n")  # fmt: skip
            session: dict[str, Any] = {}  # the script's notes on this connection
            while True:
                opcode, data = await read_client_frame(reader)
                if opcode == 8:  # the client's close
                    if self.polite:
                        writer.write(frame(data[:2], 8))
                        return
                    continue
                message = json.loads(data)
                if message["type"] == "close" and self.polite:  # as OpenEnv's server does
                    writer.write(frame(b"\x03\xe8", 8))
                    return
                for action in self.script(message, session):
                    if action == HANG:
                        await asyncio.sleep(3600)
                    if action == CLOSE:
                        return
                    writer.write(action if isinstance(action, bytes) else frame(action.encode()))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def _listing(self, writer) -> None:
        status, body = self.listing
        writer.write(f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\n\r\n".encode())  # fmt: skip
        for index in range(len(body)) if self.drip_s else ():
            writer.write(body[index : index + 1])
            await writer.drain()
            await asyncio.sleep(self.drip_s)
        writer.write(b"" if self.drip_s else body)
        await writer.drain()


@pytest.fixture
def fake():
    server = FakeServer()
    yield server
    server.stop()


def answer(observation: Any, reward: Any = None, done: Any = False, raw: str = "") -> str:
    """An observation frame (NaN and infinities as Python's json writes them; ``raw``: the
    data's JSON text as it is)."""
    data = raw or json.dumps({"observation": observation, "reward": reward, "done": done})
    return '{"type": "observation", "data": ' + data + "}"


OPENING = {
    "messages": [{"role": "user", "content": "hi"}],
    "start": 0,
    "tool_specs": [],
    "truncated": False,
    "task_id": "t0",
    "metrics": {},
}


def native(**changes: Any) -> dict[str, Any]:
    """A step's observation of an llm_gym server (the assistant's message and a reply)."""
    messages = [{"role": "assistant", "content": "1"}, {"role": "user", "content": "again"}]
    return {**OPENING, "messages": messages, "start": 1, **changes}


def scripted(reset_answer: Any, step_answer: Any = None):
    def script(message: dict[str, Any], session: dict[str, Any]) -> list[Any]:
        if message["type"] == "close":
            return []  # the server ends the session when the client closes the socket
        found = step_answer if message["type"] == "step" else reset_answer
        return found if isinstance(found, list) else [found]

    return script


DEEP = "[" * 100_000 + "]" * 100_000
RESET_ANSWERS = {
    "not JSON": ("not json{", "reset failed: InvalidArgumentError: Invalid JSON"),
    "binary garbage": (frame(b"\xff\xfe", 2), "binary frame must be UTF-8"),
    "a JSON list": ("[1, 2]", "must be a JSON object"),
    "nested 100,000 deep": (DEEP, "too many values"),
    "a 5,000-digit number": (answer(None, raw='{"reward": 1' + "0" * 5000 + "}"), "4300 digits"),
    "data a list": ('{"type": "observation", "data": [1]}', "data must be a JSON object"),
    "observation a list": (answer([1]), "observation must be a JSON object"),
    "a server error of 1 MB": (
        json.dumps({"type": "error", "data": {"message": "x" * 10**6}}),
        "Server error: xxx",
    ),
    "messages not dicts": (answer({**OPENING, "messages": ["x", 1]}), "messages[0]='x'"),
    "a hacker's role": (
        answer({**OPENING, "messages": [{"role": "root", "content": "x"}]}),
        "messages[0].role='root'",
    ),
    "content a list": (
        answer({**OPENING, "messages": [{"role": "user", "content": [1]}]}),
        "messages[0].content=[1]",
    ),
    "an unknown message key": (
        answer({**OPENING, "messages": [{"role": "user", "content": "", "x": DEEP[:40]}]}),
        "messages[0].x",
    ),
    "tool_specs a string": (answer({**OPENING, "tool_specs": "abc"}), "tool_specs='abc'"),
    "a tool spec without a name": (
        answer({**OPENING, "tool_specs": [{"type": "function", "function": {}}]}),
        "tool_specs[0].function.name",
    ),
    "5,000 messages": (
        answer({**OPENING, "messages": [{"role": "user", "content": ""}] * 5000}),
        "at most 4096",
    ),
    "a bomb of 100,000 messages": (
        answer({**OPENING, "messages": [{"role": "user"}] * 100_000}),
        "too many values",
    ),
    "over the frame limit": (
        answer({**OPENING, "messages": [{"role": "user", "content": "x" * MAX_FRAME_BYTES}]}),
        "1009 (message too big)",
    ),
    "never answers": (HANG, "did not answer within call_timeout_s=0.5"),
    "closes mid-frame": ([frame(b"x" * 1000)[:60], CLOSE], "ConnectionClosedError"),
    "closes at once": (CLOSE, "ConnectionClosedError"),
}


def deadline_kept(started: float, limit: float = 0.5 + 2.0) -> bool:
    return time.monotonic() - started < limit


@pytest.mark.parametrize("name", list(RESET_ANSWERS))
def test_a_hostile_reset_answer_is_a_remote_env_error_in_time(fake, name) -> None:
    reply, expected = RESET_ANSWERS[name]
    fake.script = scripted(reply)
    env = RemoteEnv(fake.url, call_timeout_s=0.5)

    async def run() -> None:
        with pytest.raises(RemoteEnvError, match=re.escape(expected)) as raised:
            await env.reset(Task("q", id="t0"))
        assert len(str(raised.value)) < 2600
        await env.close()

    started = time.monotonic()
    asyncio.run(run())
    assert deadline_kept(started)


STEP_ANSWERS = {
    "a NaN reward": (answer(native(), reward=math.nan, done=True), "data.reward is not a finite"),
    "an infinite reward": (answer(native(), reward=-math.inf, done=True), "data.reward is not a"),
    "a NaN metric": (
        answer(native(metrics={"a": math.nan}), reward=1, done=True),
        "data.observation.metrics.a is not a finite number",
    ),
    "reward as text": (answer(native(), reward="1.0", done=True), "reward='1.0'"),
    "done as text": (answer(native(), done="yes"), "done='yes'"),
    "truncated as text": (answer(native(truncated="no"), done=True, reward=1), "truncated='no'"),
    "metrics a list": (answer(native(metrics=[1, 2]), done=True, reward=1), "metrics=[1, 2]"),
    "start past the end": (answer(native(start=2)), "start=2"),
    "a negative start": (answer(native(start=-1)), "start=-1"),
    "start as a bool": (answer(native(start=True)), "start=True"),
    "start as a float": (answer(native(start=1.0)), "start=1.0"),
    "messages null": (answer(native(messages=None)), "messages=None"),
    "a tail of non-dicts": (answer(native(messages=[[1], "x"])), "messages[0]=[1]"),
    "tool calls with bad arguments": (
        answer(
            native(
                messages=[
                    {
                        "role": "assistant",
                        "content": "",
                        "tool_calls": [{"function": {"name": "f", "arguments": [1]}}],
                    }
                ]
            )
        ),
        "tool_calls[0].function.arguments=[1]",
    ),
    "never answers": (HANG, "did not answer within call_timeout_s=0.5"),
    "an error": (
        json.dumps({"type": "error", "data": {"message": "no", "code": "X"}}),
        "Server error: no (code: X)",
    ),
}


@pytest.mark.parametrize("name", list(STEP_ANSWERS))
def test_a_hostile_step_answer_is_a_remote_env_error_in_time(fake, name) -> None:
    reply, expected = STEP_ANSWERS[name]
    fake.script = scripted(answer(OPENING), reply)
    env = RemoteEnv(fake.url, call_timeout_s=0.5)

    async def run() -> None:
        opening = await env.reset(Task("q", id="t0"))
        assert opening == [{"role": "user", "content": "hi"}]
        with pytest.raises(RemoteEnvError, match=re.escape(expected)):
            await env.step({"role": "assistant", "content": "1"})
        assert env.messages == opening  # nothing of the hostile answer got in
        with pytest.raises(RemoteEnvError, match="step without a session"):
            await env.step({"role": "assistant", "content": "1"})  # the session was dropped

    started = time.monotonic()
    asyncio.run(run())
    assert deadline_kept(started)


def test_a_clean_answer_still_passes(fake) -> None:
    done = native(metrics={"a": 1, "b": [None, "x"]}, truncated=True)
    fake.script = scripted(answer(OPENING), answer(done, reward=1, done=True))
    env = RemoteEnv(fake.url, call_timeout_s=0.5)

    async def run() -> StepResult:
        await env.reset(Task("q", id="t0"))
        result = await env.step({"role": "assistant", "content": "1"})
        await env.close()
        return result

    result = asyncio.run(run())
    assert result.truncated is True and result.terminated is False and result.reward == 1.0
    assert result.metrics == {"a": 1, "b": [None, "x"]}
    assert result.messages[-1] == {"role": "user", "content": "again"}


TEXT_ANSWERS = {
    "a NaN reward": (
        '{"observation": {"prompt": "x"}, "reward": NaN, "done": false}',
        "data.reward is not a finite number",
    ),
    "reward as text": ('{"observation": {"prompt": "x"}, "reward": "1", "done": true}', "reward"),
    "done as text": ('{"observation": {"prompt": "x"}, "reward": 1, "done": "no"}', "done='no'"),
    "observation a string": ('{"observation": "x", "reward": 1, "done": true}', "observation"),
}


@pytest.mark.parametrize("name", list(TEXT_ANSWERS))
def test_a_hostile_text_server_is_refused_too(fake, name) -> None:
    raw, expected = TEXT_ANSWERS[name]
    fake.script = scripted(answer({"prompt": "count"}), answer(None, raw=raw))
    env = RemoteEnv(fake.url, call_timeout_s=0.5, reward="sum")

    async def run() -> None:
        await env.reset(Task("q", id="t0"))
        with pytest.raises(RemoteEnvError, match=re.escape(expected)):
            await env.step({"role": "assistant", "content": "1"})

    asyncio.run(run())


def test_a_remote_env_closes_at_once_and_frees_its_session(probe_server) -> None:
    env = RemoteEnv(probe_server.url, call_timeout_s=5)

    async def run() -> float:
        await env.reset(Task("p1", id="p1", metadata={"split": "train"}))
        assert (await env.step({"role": "assistant", "content": "done"})).reward == 1.0
        started = time.monotonic()
        await env.close()  # the server closes the socket: no wait for a timeout
        return time.monotonic() - started

    assert asyncio.run(run()) < 1.0
    assert settled(probe_server) == 0


def test_close_is_bounded_when_the_server_ignores_the_close_handshake(fake) -> None:
    fake.polite = False
    fake.script = scripted(answer(OPENING), HANG)
    env = RemoteEnv(fake.url, call_timeout_s=0.5)

    async def run() -> tuple[float, float]:
        await env.reset(Task("q", id="t0"))
        started = time.monotonic()
        await env.close()  # a graceful close the server never answers
        closed = time.monotonic() - started
        await env.reset(Task("q", id="t0"))
        started = time.monotonic()
        with pytest.raises(RemoteEnvError, match="did not answer"):
            await env.step({"role": "assistant", "content": "1"})  # then the drop
        return closed, time.monotonic() - started

    closed, dropped = asyncio.run(run())
    assert closed < 1.6 and dropped < 1.6


class Says(Policy):
    async def act(self, requests):
        return [Generation(text="1") for _ in requests]


def test_in_the_loop_hostile_answers_end_only_their_episodes(fake) -> None:
    hostile = {
        "nan": STEP_ANSWERS["a NaN reward"][0],
        "text": STEP_ANSWERS["reward as text"][0],
        "hang": HANG,
        "start": STEP_ANSWERS["a negative start"][0],
        "fine": answer(native(), reward=1.0, done=True),
    }

    def script(message: dict[str, Any], session: dict[str, Any]) -> list[Any]:
        if message["type"] == "reset":
            session["task"] = message["data"]["task_id"]
            return [answer(OPENING)]
        return [] if message["type"] == "close" else [hostile[session["task"]]]

    fake.script = script
    tasks = [Task("q", id=name) for name in hostile]
    started = time.monotonic()
    groups = collect_groups(RemoteEnvFactory(fake.url, call_timeout_s=0.5), tasks, Says(),
                            max_turns=2)  # fmt: skip
    assert time.monotonic() - started < 8.0
    episodes = {task.id: group[0] for task, group in zip(tasks, groups, strict=True)}
    assert episodes["fine"].reward == 1.0 and episodes["fine"].terminated
    for name in ("nan", "text", "hang", "start"):
        assert episodes[name].truncation_cause == TruncationCause.ENV, name
        assert episodes[name].reward == 0.0 and "RemoteEnvError" in episodes[name].error
    assert all(math.isfinite(e.reward) for e in episodes.values())


LISTINGS = {
    "not JSON": ((200, b"nope"), "Invalid JSON"),
    "a list": ((200, b"[]"), "must be a JSON object"),
    "a NaN": ((200, b'{"tasks": [], "max_turns": NaN}'), "max_turns is not a finite number"),
    "tasks not dicts": ((200, b'{"tasks": [1]}'), "tasks[0]"),
    "an id missing": ((200, b'{"tasks": [{"prompt": "p"}]}'), "tasks[0].id"),
    "an id a list": ((200, b'{"tasks": [{"id": [1], "prompt": "p"}]}'), "tasks[0].id"),
    "a prompt a number": ((200, b'{"tasks": [{"id": "a", "prompt": 5}]}'), "tasks[0].prompt"),
    "duplicate ids": (
        (200, b'{"tasks": [{"id": "a", "prompt": ""}, {"id": "a", "prompt": ""}]}'),
        "duplicate task id 'a'",
    ),
    "max_turns a bool": ((200, b'{"tasks": [], "max_turns": true}'), "max_turns"),
    "max_turns negative": ((200, b'{"tasks": [], "max_turns": -1}'), "max_turns"),
    "action_format a list": ((200, b'{"tasks": [], "action_format": []}'), "action_format"),
    "an error": ((500, b"x" * 100_000), "answered 500"),
    "over the size cap": ((200, b'{"tasks": [' + b'{"id": "a", "prompt": ""},' * 5000), "bytes"),
}


@pytest.mark.parametrize("name", list(LISTINGS))
def test_a_hostile_task_listing_is_a_remote_env_error(fake, monkeypatch, name) -> None:
    monkeypatch.setattr(registration, "MAX_LISTING_BYTES", 100_000)
    fake.listing, expected = LISTINGS[name]
    with pytest.raises(RemoteEnvError, match=re.escape(expected)) as raised:
        RemoteTasks(fake.url, timeout_s=2)("train")
        registration.register_remote_env("HostileListing-v0", fake.url)
    assert len(str(raised.value)) < 1000


def test_a_drip_fed_listing_is_cut_at_its_deadline(fake) -> None:
    fake.listing, fake.drip_s = (200, b'{"tasks": []}' + b" " * 200), 0.05
    started = time.monotonic()
    with pytest.raises(RemoteEnvError, match="within 0.5 s"):
        RemoteTasks(fake.url, timeout_s=0.5)("val")
    assert time.monotonic() - started < 1.5
