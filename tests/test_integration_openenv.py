"""OpenEnv both ways: our envs served by openenv-core's server, OpenEnv servers played as envs."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time

import gymnasium as gym
import httpx
import pytest

pytest.importorskip("openenv")

from openenv.core import GenericEnvClient
from openenv.core.env_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from websockets.exceptions import WebSocketException

from llm_gym import Task, register_env
from llm_gym.core import Env, StepResult
from llm_gym.core.env import TruncationCause
from llm_gym.core.registry import env_entry
from llm_gym.envs.tool_use_game import ToolUseGameEnv, get_tasks, oracle_action
from llm_gym.errors import InvalidArgumentError, RemoteEnvError
from llm_gym.eval import run_and_report
from llm_gym.integrations.openenv import (
    EnvServer,
    RemoteEnv,
    RemoteEnvFactory,
    RemoteTasks,
    build_env_app,
    register_remote_env,
    serve_env,
)
from llm_gym.policies import Generation, OraclePolicy, Policy
from llm_gym.rollout import collect_groups
from llm_gym.rollout.driver import DEFAULT_FAILED_PARSE_REWARD

from .conftest import ROOT


@pytest.fixture(scope="module")
def server():
    with serve_env("ToolUseGame-v0", port=0, max_sessions=64) as running:
        yield running


@pytest.fixture(scope="module")
def remote_id(server) -> str:
    register_remote_env("RemoteToolUse-v0", server.url)
    return "RemoteToolUse-v0"


def sessions(server) -> dict[str, int]:
    return httpx.get(f"{server.url}/llm_gym/sessions").json()


def wait_for_sessions(server, active: int = 0, within_s: float = 5.0) -> int:
    deadline = time.monotonic() + within_s
    while (now := sessions(server)["active"]) != active and time.monotonic() < deadline:
        time.sleep(0.02)
    return now


class Texts(Policy):
    """Replies with texts[turn] (the same script in every episode)."""

    def __init__(self, texts):
        self.texts = list(texts)

    async def act(self, requests):
        turns = [sum(m["role"] == "assistant" for m in r.messages) for r in requests]
        return [Generation(text=self.texts[min(t, len(self.texts) - 1)]) for t in turns]


# --- serving: any OpenEnv client plays our env ---------------------------------------------------


def test_openenvs_own_client_plays_a_served_task_to_its_reward(server) -> None:
    task = get_tasks("val")[0]
    key = task.metadata["keys"][0]
    with GenericEnvClient(base_url=server.url).sync() as client:
        first = client.reset(task_id=task.id, split="val")
        assert first.done is False
        opening = first.observation
        assert opening["messages"][-1]["content"] == task.prompt
        assert {s["function"]["name"] for s in opening["tool_specs"]} == {
            "list_fact_keys", "lookup", "calculator",
        }  # fmt: skip
        call = {"id": "c1", "type": "function",
                "function": {"name": "lookup", "arguments": json.dumps({"key": key})}}  # fmt: skip
        looked = client.step({"message": {"content": "", "tool_calls": [call]}})
        assert looked.done is False and looked.reward is None
        tail = looked.observation["messages"]
        assert looked.observation["start"] == len(opening["messages"])
        assert tail[0]["tool_calls"][0]["function"]["name"] == "lookup"  # the action, as recorded
        assert tail[1]["role"] == "tool"
        answer = oracle_action(task, opening["messages"] + tail)  # the oracle knows the rest
        while answer.get("tool_calls"):
            step = client.step({"message": answer})
            tail = tail + step.observation["messages"]
            answer = oracle_action(task, opening["messages"] + tail)
        last = client.step({"message": {"role": "assistant", "content": answer["content"]}})
        assert last.done is True and last.reward == 1.0
        assert last.observation["metrics"] and last.observation["truncated"] is False


def test_a_reset_without_arguments_draws_a_train_task_as_gymnasium_does(server) -> None:
    train = {task.id for task in get_tasks("train")}

    def draws(client, seed: int | None) -> list[str]:
        first = [] if seed is None else [client.reset(seed=seed).observation["task_id"]]
        return first + [client.reset().observation["task_id"] for _ in range(4)]

    with (
        GenericEnvClient(base_url=server.url).sync() as one,
        GenericEnvClient(base_url=server.url).sync() as two,
    ):
        seeded = draws(one, 7)
        assert seeded == draws(two, 7)  # the same seed: the same tasks, in every session
        assert seeded[0] == get_tasks("train")[7].id  # a seed alone picks task seed mod n
        assert len(set(seeded[1:])) > 1 and set(seeded) <= train
        unseeded = draws(one, None) + draws(two, None)
        assert set(unseeded) <= train and len(set(unseeded)) > 1
        assert client_val_draw(one) <= {task.id for task in get_tasks("val")}


def client_val_draw(client) -> set[str]:
    return {client.reset(split="val").observation["task_id"] for _ in range(3)}


def test_a_text_action_is_parsed_with_the_envs_action_format(server) -> None:
    task = get_tasks("val")[0]
    key = task.metadata["keys"][0]
    text = f'<tool_call>{{"name": "lookup", "arguments": {{"key": "{key}"}}}}</tool_call>'
    with GenericEnvClient(base_url=server.url).sync() as client:
        for action in ({"message": {"content": text}}, {"message": text}):
            opening = client.reset(task_id=task.id, split="val").observation
            looked = client.step(action)
            assert looked.done is False
            echo, reply = looked.observation["messages"][:2]
            call = echo["tool_calls"][0]["function"]
            assert (call["name"], json.loads(call["arguments"])) == ("lookup", {"key": key})
            assert reply["role"] == "tool" and not reply["content"].startswith("tool_error")
        # the rest, as the oracle plays it: a final answer in plain text is still one
        tail = looked.observation["messages"]
        answer = oracle_action(task, opening["messages"] + tail)
        while answer.get("tool_calls"):
            tail = tail + client.step({"message": answer}).observation["messages"]
            answer = oracle_action(task, opening["messages"] + tail)
        last = client.step({"message": answer["content"]})
        assert last.done is True and last.reward == 1.0
        # text that fails to parse ends the episode as TextEnv ends it
        client.reset(task_id=task.id, split="val")
        failed = client.step({"message": '<tool_call>{"name": "lookup", "argu'})
        assert failed.done is True and failed.observation["truncated"] is True
        assert failed.reward == DEFAULT_FAILED_PARSE_REWARD
        assert failed.observation["metrics"]["truncation_cause"] == "parse_failure"
        assert failed.observation["metrics"]["parse_error"]
        with pytest.raises(RuntimeError, match="reset first"):
            client.step({"message": "1"})


def test_gym_make_without_base_url_says_what_to_pass() -> None:
    with pytest.raises(InvalidArgumentError, match=r"needs base_url.*base_url='http://127"):
        gym.make("OpenEnv-v0")


def test_the_server_lists_tasks_without_their_answers(server) -> None:
    listing = httpx.get(f"{server.url}/llm_gym/tasks", params={"split": "test"}).json()
    tasks = get_tasks("test")
    assert [t["id"] for t in listing["tasks"]] == [t.id for t in tasks]
    assert listing["max_turns"] == 8 and listing["action_format"] == "hermes"
    assert set(listing["tasks"][0]) == {"id", "prompt"}  # no target, no metadata
    bad = httpx.get(f"{server.url}/llm_gym/tasks", params={"split": "dev"})
    assert bad.status_code == 422 and "split must be one of" in bad.text
    assert httpx.get(f"{server.url}/metadata").json()["name"] == "ToolUseGame-v0"
    assert "message" in httpx.get(f"{server.url}/schema").json()["action"]["properties"]


@pytest.mark.parametrize(
    "action, expected",
    [
        ({"message": {"role": "user", "content": "x"}}, "Invalid message"),
        ({"message": {"content": "x" * 1_000_001}}, "Invalid message"),
        ({"message": {"tool_calls": [{"function": {"name": 3}}]}}, "Invalid message"),
        ({"message": {"tool_calls": [{"function": {"name": "f"}}] * 65}}, "Invalid message"),
        ({"text": "no message field"}, "Invalid message"),
    ],
)
def test_a_hostile_action_is_refused_and_the_session_lives_on(server, action, expected) -> None:
    with GenericEnvClient(base_url=server.url).sync() as client:
        client.reset(seed=3)
        with pytest.raises(RuntimeError, match=expected):
            client.step(action)
        after = client.step({"message": {"role": "assistant", "content": "-1"}})
        assert after.done is True and after.reward == 0.0


def test_bad_resets_and_steps_get_clear_errors(server) -> None:
    with GenericEnvClient(base_url=server.url).sync() as client:
        with pytest.raises(RuntimeError, match="reset first"):
            client.step({"message": {"content": "1"}})
        with pytest.raises(RuntimeError, match="names no task of ToolUseGame-v0"):
            client.reset(task_id="nope")
        with pytest.raises(RuntimeError, match="split must be one of"):
            client.reset(task_id="nope", split="dev")
        with pytest.raises(RuntimeError, match="integer seed"):
            client.reset(seed="3")
        with pytest.raises(RuntimeError, match=r"Unknown reset argument\(s\) \['target'\]"):
            client.reset(seed=1, target="42")  # a client cannot rewrite the task
        done = client.reset(seed=1)
        assert done.done is False  # still a working session


def test_build_env_app_checks_its_arguments() -> None:
    with pytest.raises(InvalidArgumentError, match="max_sessions"):
        build_env_app("ToolUseGame-v0", max_sessions=0)
    with pytest.raises(InvalidArgumentError, match="step_timeout_s"):
        build_env_app("ToolUseGame-v0", step_timeout_s=0)
    with pytest.raises(Exception, match="world_sed"):
        build_env_app("ToolUseGame-v0", task_options={"world_sed": 1})


def test_sessions_past_the_limit_are_refused_and_freed_ones_reused() -> None:
    with serve_env("ToolUseGame-v0", port=0, max_sessions=2) as small:
        clients = [GenericEnvClient(base_url=small.url).sync() for _ in range(3)]
        clients[0].reset(seed=0), clients[1].reset(seed=1)
        # OpenEnv refuses at connect time: its error, or (when the refusal and close overtake
        # the client's reset) a closed connection.
        with pytest.raises((RuntimeError, WebSocketException), match="CAPACITY_REACHED|1000"):
            clients[2].reset(seed=2)
        clients[0].close()
        assert wait_for_sessions(small, 1) == 1
        fresh = GenericEnvClient(base_url=small.url).sync()
        assert fresh.reset(seed=2).done is False
        fresh.close(), clients[1].close(), clients[2].close()
        assert wait_for_sessions(small, 0) == 0


def test_the_cli_serves_an_env(tmp_path) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "llm_gym.cli", "serve-env", "ToolUseGame-v0", "--port", "0",
         "--max-sessions", "4", "--task-option", "world_seed=1"],
        stdout=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip
    try:
        line = process.stdout.readline()
        assert line.startswith("serving ToolUseGame-v0 over OpenEnv at http://127.0.0.1:")
        url = line.split(" at ")[1].split()[0]
        listing = httpx.get(f"{url}/llm_gym/tasks", params={"split": "val"}).json()
        assert listing["tasks"][0]["id"].startswith("tool_use_game@1/")  # the task option
        assert httpx.get(f"{url}/llm_gym/sessions").json() == {"active": 0, "max": 4}
    finally:
        process.terminate()
        process.wait(10)


# --- consuming: RemoteEnv in our loop, evaluator, gym.make and trainer -------------------------


def test_a_remote_episode_is_the_local_episode(server, remote_id) -> None:
    tasks = get_tasks("val")[:30]
    local = run_and_report("ToolUseGame-v0", "oracle", tasks=tasks, progress=False,
                           print_report=False)  # fmt: skip
    remote = run_and_report(remote_id, "oracle", tasks=tasks, oracle=oracle_action,
                            progress=False, print_report=False)  # fmt: skip
    assert remote.metrics["success_rate"] == local.metrics["success_rate"] == 1.0
    assert remote.metrics["turns_mean"] == local.metrics["turns_mean"]
    assert remote.metrics["tool_calls_mean"] == local.metrics["tool_calls_mean"]
    # Episode by episode: the same transcripts (tool call ids aside) and the same rewards.
    here = collect_groups(ToolUseGameEnv, tasks, OraclePolicy(oracle_action), max_turns=8)
    there = collect_groups(RemoteEnvFactory(server.url), tasks, OraclePolicy(oracle_action),
                           max_turns=8)  # fmt: skip
    for a, b in zip(here, there, strict=True):
        assert (a[0].reward, a[0].num_turns) == (b[0].reward, b[0].num_turns)
        assert _without_ids(a[0].messages) == _without_ids(b[0].messages)
    groups = collect_groups(RemoteEnvFactory(server.url), tasks[:3], Texts(["7"]), max_turns=4)
    assert [g[0].reward for g in groups] == [0.0, 0.0, 0.0]
    assert all(g[0].terminated for g in groups)
    assert wait_for_sessions(server) == 0  # every session closed


def test_sessions_leave_the_process_environment_alone(server, monkeypatch) -> None:
    """openenv's own connect sets and restores NO_PROXY around each connection, which
    overlapping connections leave changed; ours tells each connection to skip the proxy on
    loopback, so episodes play past a configured (here dead) proxy and nothing is changed."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    tasks = get_tasks("val")[:4]
    assert [t.id for t in RemoteTasks(server.url)("val")[:4]] == [t.id for t in tasks]
    groups = collect_groups(RemoteEnvFactory(server.url), tasks, OraclePolicy(oracle_action),
                            episodes_per_task=4, max_turns=8)  # fmt: skip
    assert [e.reward for g in groups for e in g] == [1.0] * 16
    assert "NO_PROXY" not in os.environ and "no_proxy" not in os.environ
    monkeypatch.undo()
    assert wait_for_sessions(server) == 0


def _without_ids(messages):
    """Messages with tool-call ids blanked (each parse draws fresh ones)."""
    out = []
    for message in messages:
        message = {k: v for k, v in message.items() if k != "tool_call_id"}
        if message.get("tool_calls"):
            message["tool_calls"] = [{**c, "id": ""} for c in message["tool_calls"]]
        out.append(message)
    return out


class NearMiss(Policy):
    """Answers the target with a tail: chain_sum's scorer gives partial credit, never 1."""

    async def act(self, requests):
        return [Generation(text=f"<answer>{r.task.target}0x</answer>") for r in requests]


def test_an_episode_cut_by_our_loop_is_scored_by_the_served_env_as_by_the_local_one() -> None:
    """ReasoningGym with 3 attempts scores what it has when the run's turn limit (2) cuts it
    (Env.conclude): the served env does the same, through a 'conclude' action."""
    env_id = "RG-ChainSum-v0"
    tasks = env_entry(env_id).tasks("val", max_attempts=3)[:4]
    entry = env_entry(env_id)
    with serve_env(env_id, port=0, task_options={"max_attempts": 3}) as served:
        wrong = NearMiss()  # partial credit each time, never the answer
        here = collect_groups(entry.env_factory(), tasks, wrong, max_turns=2)
        there = collect_groups(RemoteEnvFactory(served.url), tasks, wrong, max_turns=2)
        assert wait_for_sessions(served, 0) == 0
    for a, b in zip(here, there, strict=True):
        assert a[0].truncation_cause == b[0].truncation_cause == "max_turns"
        assert a[0].reward == b[0].reward > 0  # the last answer's partial credit
        assert a[0].metrics == b[0].metrics and a[0].metrics  # conclude's metrics crossed too


class Rewriter(Env):
    """Rewrites its own history each step (drops its earlier replies), as a summarising env
    or a template that strips old turns would."""

    async def reset(self, task):
        self._messages = [{"role": "user", "content": "say anything"}]
        return list(self._messages)

    async def step(self, message):
        done = len(self._messages) >= 5
        kept = [m for m in self._messages if m["role"] != "tool"]
        reply = {"role": "user", "content": f"heard {len(kept)}"}
        self._messages = [*kept, message, reply]
        return StepResult(done, False, list(self._messages), reward=1.0 if done else 0.0)

    @property
    def tool_specs(self):
        return []

    @property
    def messages(self):
        return list(self._messages)


def test_a_served_env_that_rewrites_its_history_is_followed_by_the_client() -> None:
    register_env("Rewriter-v0", env=Rewriter, tasks=[Task("t", id="t0")])
    with serve_env("Rewriter-v0", port=0) as served:
        here = collect_groups(Rewriter, [Task("t", id="t0")], Texts(["a", "b", "c"]), max_turns=5)
        there = collect_groups(RemoteEnvFactory(served.url), RemoteTasks(served.url)("train"),
                               Texts(["a", "b", "c"]), max_turns=5)  # fmt: skip
    assert here[0][0].messages == there[0][0].messages
    assert here[0][0].reward == there[0][0].reward


def test_remote_tasks_come_from_the_server(server, remote_id) -> None:
    from llm_gym.core.registry import env_entry

    tasks = env_entry(remote_id).tasks("val")
    assert [t.id for t in tasks] == [t.id for t in get_tasks("val")]
    assert [t.prompt for t in tasks] == [t.prompt for t in get_tasks("val")]
    assert tasks[0].target is None and tasks[0].metadata == {"split": "val"}
    report = run_and_report(remote_id, "random", split="val", episodes=10, progress=False,
                            print_report=False)  # fmt: skip
    assert report.metrics["episodes"] == 10 and report.metrics["env_error_ratio"] == 0.0


def test_gym_make_plays_a_served_env(server) -> None:
    env = gym.make("OpenEnv-v0", base_url=server.url, split="val")
    observation, info = env.reset(seed=0)
    task = info["task"]
    assert observation.endswith(task.prompt) or task.prompt in observation
    assert len(info["tool_specs"]) == 3
    reward, done = 0.0, False
    while not done:
        message = oracle_action(get_tasks("val")[[t.id for t in get_tasks("val")].index(task.id)],
                                info["messages"])  # fmt: skip
        action = env.unwrapped.action_format.render_message(message)
        observation, reward, terminated, truncated, info = env.step(action)
        done = terminated or truncated
    assert reward == 1.0
    env.close()


class Sleepy(Env):
    """Answers after sleeping as long as the reply says (a hung env when it is long)."""

    closed = 0

    async def reset(self, task):
        self._messages = [{"role": "user", "content": "how long?"}]
        return list(self._messages)

    async def step(self, message):
        await asyncio.sleep(float(message.get("content") or 0))
        self._messages += [message]
        return StepResult(True, False, list(self._messages), reward=1.0)

    @property
    def tool_specs(self):
        return []

    @property
    def messages(self):
        return list(self._messages)

    async def close(self):
        Sleepy.closed += 1


def test_a_hung_or_dead_server_ends_only_its_episodes() -> None:
    register_env("SleepyRemote-v0", env=Sleepy, tasks=[Task("t", id=f"t{i}") for i in range(4)])
    with serve_env("SleepyRemote-v0", port=0, step_timeout_s=30) as slow:
        factory = RemoteEnvFactory(slow.url, call_timeout_s=0.5)
        tasks = RemoteTasks(slow.url)("train")
        # Two episodes answer at once, two hang past the client's deadline.
        groups = collect_groups(factory, tasks[:2], Texts(["0"]), max_turns=2)
        hung = collect_groups(factory, tasks[2:], Texts(["5"]), max_turns=2)
        assert [g[0].reward for g in groups] == [1.0, 1.0]
        for group in hung:
            episode = group[0]
            assert episode.truncation_cause == TruncationCause.ENV and episode.reward == 0.0
            assert "call_timeout_s=0.5" in episode.error
        assert wait_for_sessions(slow, 0, within_s=10) == 0  # the server let them go
        url = slow.url
    # The server is gone: a new episode ends at once with the error recorded.
    [[dead]] = collect_groups(RemoteEnvFactory(url, call_timeout_s=0.5), tasks[:1], Texts(["0"]),
                              max_turns=2)  # fmt: skip
    assert dead.truncation_cause == TruncationCause.ENV and "connect failed" in dead.error


class SlowClose(Sleepy):
    """Takes a while to close (an env with a process or a sandbox to stop)."""

    async def close(self):
        await asyncio.sleep(0.3)
        SlowClose.closed += 1


def test_stopping_the_server_finishes_closing_the_envs_of_open_sessions() -> None:
    register_env("SlowClose-v0", env=SlowClose, tasks=[Task("t", id=f"t{i}") for i in range(3)])
    SlowClose.closed = 0
    server = serve_env("SlowClose-v0", port=0)
    clients = [GenericEnvClient(base_url=server.url).sync() for _ in range(3)]
    try:
        for i, client in enumerate(clients):
            client.connect()
            client.reset(task_id=f"t{i}")
        assert SlowClose.closed == 0
    finally:
        server.close()  # the three sessions are still open
    assert SlowClose.closed == 3
    for client in clients:
        with contextlib.suppress(Exception):
            client.close()


def test_the_server_closes_an_env_whose_step_outlasts_its_timeout() -> None:
    register_env("SleepyServer-v0", env=Sleepy, tasks=[Task("t", id="t0")])
    Sleepy.closed = 0
    with (
        serve_env("SleepyServer-v0", port=0, step_timeout_s=0.3) as slow,
        GenericEnvClient(base_url=slow.url).sync() as client,
    ):
        client.reset(seed=0)
        with pytest.raises(RuntimeError, match="did not return within 0.3 s"):
            client.step({"message": {"content": "3"}})
        assert Sleepy.closed == 1
        with pytest.raises(RuntimeError, match="reset first"):
            client.step({"message": {"content": "0"}})


def test_remote_env_checks_its_arguments() -> None:
    with pytest.raises(InvalidArgumentError, match="base_url"):
        RemoteEnv("localhost:8000")
    with pytest.raises(InvalidArgumentError, match="call_timeout_s"):
        RemoteEnv("http://x", call_timeout_s=0)
    with pytest.raises(InvalidArgumentError, match="reward must be one of"):
        RemoteEnv("http://x", reward="mean")
    with pytest.raises(RemoteEnvError, match="step without a session"):
        asyncio.run(RemoteEnv("http://x").step({"role": "assistant", "content": "1"}))


# --- any OpenEnv environment, played as text ------------------------------------------------------


class CountAction(Action):
    message: str


class CountObservation(Observation):
    prompt: str = ""


class CountTo(Environment):
    """An OpenEnv env written the OpenEnv way: say the numbers 1..target, one per step."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self._state = State()
        self.target = self.next = 0

    def reset(self, seed=None, episode_id=None, **kwargs):
        self.target, self.next = 2 + (seed or 0) % 3, 1
        return CountObservation(prompt=f"Count from 1 to {self.target}, one number per reply.")

    def step(self, action, timeout_s=None, **kwargs):
        right = action.message.strip() == str(self.next)
        self.next += 1
        done = not right or self.next > self.target
        return CountObservation(prompt="next" if right else "wrong", done=done,
                                reward=1.0 if right else 0.0)  # fmt: skip

    @property
    def state(self):
        return self._state


class Counter(Policy):
    async def act(self, requests):
        return [Generation(text=str(sum(m["role"] == "assistant" for m in r.messages) + 1))
                for r in requests]  # fmt: skip


def test_any_openenv_text_env_runs_in_our_loop() -> None:
    app = create_app(CountTo, CountAction, CountObservation, max_concurrent_envs=8)
    with EnvServer(app, "127.0.0.1", 0, log=False) as other:
        register_remote_env("CountTo-v0", other.url, max_turns=6, n_seed_tasks=6, reward="sum")
        report = run_and_report("CountTo-v0", Counter(), split="val", progress=False,
                                print_report=False)  # fmt: skip
        assert report.metrics["episodes"] == 6 and report.metrics["env_error_ratio"] == 0.0
        tasks = RemoteTasks(other.url, n_seed_tasks=6)("val")
        assert tasks[0].metadata == {"reset": {"seed": 1_000_000}}
        targets = [2 + (1_000_000 + i) % 3 for i in range(6)]
        groups = collect_groups(RemoteEnvFactory(other.url, reward="sum"), tasks, Counter(),
                                max_turns=6)  # fmt: skip
        assert [g[0].reward for g in groups] == [float(t) for t in targets]
        assert [g[0].num_turns for g in groups] == targets
        opening = groups[0][0].messages[0]["content"]  # an observation's only text field
        assert opening == "Count from 1 to 3, one number per reply."
        wrong = collect_groups(RemoteEnvFactory(other.url), tasks[:1], Texts(["1", "9"]),
                               max_turns=6)  # fmt: skip
        assert wrong[0][0].reward == 0.0 and wrong[0][0].terminated  # last step's reward
        named = RemoteEnvFactory(other.url, observation_field="prompt")
        [[episode]] = collect_groups(named, tasks[:1], Counter(), max_turns=6)
        assert episode.messages[0]["content"] == "Count from 1 to 3, one number per reply."


def test_the_trainer_trains_on_a_served_env(server, small_model_dir, tmp_path, monkeypatch) -> None:
    pytest.importorskip("trl")
    from trainers import GRPOConfig, train_multi_turn

    from .conftest import StopAfter

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    tasks = RemoteTasks(server.url)("train")[:2]
    config = GRPOConfig(
        model=str(small_model_dir),
        batch_size=2,
        episodes_per_task=4,
        num_steps=1,
        max_turns=3,
        max_model_length=1024,
        max_tokens_per_turn=24,
        validation_interval=None,
        report_to="none",
    )
    trainer = train_multi_turn(
        config, tasks=tasks, env_factory=RemoteEnvFactory(server.url), callbacks=[StopAfter(1)]
    )
    assert trainer.state.global_step == 1
    logged = [r for r in trainer.state.log_history if "terminated_ratio" in r]
    assert logged and logged[0].get("episodes/env_ratio", 0.0) == 0.0  # no remote failures
    assert wait_for_sessions(server) == 0


def test_trls_environment_factory_plays_a_served_env(server, remote_id) -> None:
    """TRL's OpenEnv pattern (an environment_factory class around a client), on our server."""
    pytest.importorskip("trl")
    from llm_gym.integrations.trl import env_reward, environment_factory, trl_dataset

    cls = environment_factory(remote_id, split="val")
    row = trl_dataset(remote_id, "val", limit=1)[0]
    task = get_tasks("val")[0]
    assert row["task_id"] == task.id
    episode = cls()
    episode.reset(**row)
    values = [episode.lookup(key=key) for key in task.metadata["keys"]]
    assert all(not v.startswith("tool_error") for v in values)
    assert env_reward([[{"role": "assistant", "content": "-1"}]], [episode]) == [0.0]
    assert wait_for_sessions(server) == 0  # the finished episode's session is closed


def test_a_raw_text_env_with_its_own_turn_cap_plays_remotely_as_it_does_locally() -> None:
    """GuessNumber reads raw text and caps its own turns: both switches cross the wire."""
    from llm_gym.envs.guess_number import GuessNumberEnv
    from llm_gym.envs.guess_number import get_tasks as guess_tasks

    tasks = guess_tasks("val")[:3]
    garbled = "<tool_call>{oops</tool_call> 50"  # a parse failure for a parsed env, not this one
    with serve_env("GuessNumber-v0", port=0) as guess:
        env = RemoteEnv(guess.url)

        async def opened() -> tuple[bool, int | None]:
            await env.reset(tasks[0])
            await env.close()
            return env.raw_text_actions, env.max_turns

        here = GuessNumberEnv()
        asyncio.run(here.reset(tasks[0]))  # the env sets its cap per task
        assert asyncio.run(opened()) == (True, here.max_turns) and here.max_turns > 1
        local = collect_groups(GuessNumberEnv, tasks, Texts([garbled]), max_turns=40)
        remote = collect_groups(RemoteEnvFactory(guess.url), tasks, Texts([garbled]),
                                max_turns=40)  # fmt: skip
    for here, there in zip(local, remote, strict=True):
        assert here[0].truncation_cause == there[0].truncation_cause != "parse_failure"
        assert here[0].num_turns == there[0].num_turns
        assert here[0].reward == there[0].reward


def test_trl_rows_of_a_served_env_close_their_sessions() -> None:
    pytest.importorskip("datasets")
    from llm_gym.integrations.trl import trl_dataset

    with serve_env("ToolUseGame-v0", port=0, max_sessions=3) as small:
        register_remote_env("SmallRemote-v0", small.url)
        rows = trl_dataset("SmallRemote-v0", "val", limit=5)  # more rows than sessions
        assert len(rows) == 5 and wait_for_sessions(small, 0) == 0


def test_tasks_without_ids_are_named_by_their_place() -> None:
    tasks = [Task("first"), Task("second")]
    register_env("NoIds-v0", env=Sleepy, tasks=tasks)
    with serve_env("NoIds-v0", port=0) as plain:
        listed = RemoteTasks(plain.url)("train")
        assert [t.id for t in listed] == ["task-0", "task-1"]
        assert [t.prompt for t in listed] == ["first", "second"]
        [[episode]] = collect_groups(RemoteEnvFactory(plain.url), listed[1:], Texts(["0"]),
                                     max_turns=2)  # fmt: skip
        assert episode.reward == 1.0 and episode.task.id == "task-1"


def test_a_tool_name_that_would_replace_the_episodes_internals_is_refused() -> None:
    from llm_gym import ToolEnv, tool
    from llm_gym.integrations.trl import environment_factory

    for name in ("_call", "reset", "_finish"):

        @tool(name=name)
        def hostile(x: str) -> str:
            """A tool named after an internal."""
            return x

        class Hostile(ToolEnv):
            tools = [hostile]

        register_env(f"Hostile{name.strip('_').title()}-v0", env=Hostile, tasks=[Task("q")])
        with pytest.raises(InvalidArgumentError, match="clash with the episode's own"):
            environment_factory(f"Hostile{name.strip('_').title()}-v0")
