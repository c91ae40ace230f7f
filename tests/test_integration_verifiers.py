"""verifiers 0.4 environments in our loop, evaluator and trainer, and ours in verifiers
(llm_gym.integrations.verifiers). Every verifiers environment is defined here; nothing is
downloaded."""

from __future__ import annotations

import asyncio
import doctest
import importlib
import json
import sys
import types
import warnings
from typing import Any

import pytest

vf = pytest.importorskip("verifiers.v1")

import gymnasium as gym  # noqa: E402
from gymnasium.utils.env_checker import check_env  # noqa: E402

from llm_gym import InvalidArgumentError, Task  # noqa: E402
from llm_gym.core.env import TruncationCause  # noqa: E402
from llm_gym.envs.tool_use_game import ToolUseGameEnv, oracle_action  # noqa: E402
from llm_gym.eval import run_and_report  # noqa: E402
from llm_gym.gym import register_env, unregister_env  # noqa: E402
from llm_gym.integrations.verifiers import (  # noqa: E402
    from_verifiers,
    llm_gym_taskset,
    load_environment,
    register_verifiers_env,
    trace_from_messages,
)
from llm_gym.policies.scripted import OraclePolicy  # noqa: E402
from llm_gym.rollout import collect_groups, collect_groups_async  # noqa: E402
from tests.conftest import play_text_episode  # noqa: E402

# --- a single-turn environment: exact answers from a datasets.Dataset --------------------------


class QAData(vf.TaskData):
    answer: str


class QATask(vf.Task[QAData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def exact(self, task: QAData, trace: vf.Trace) -> float:
        return float(trace.last_reply == task.answer)

    @vf.reward(weight=0.5)
    async def digits_only(self, trace: vf.Trace) -> float:
        return float(trace.last_reply.isdigit())

    @vf.metric
    async def reply_chars(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply))


class QATaskset(vf.Taskset[QATask, vf.TasksetConfig]):
    def load(self):
        datasets = pytest.importorskip("datasets")
        rows = datasets.Dataset.from_dict(
            {
                "question": ["What is 2 + 2?", "What is 3 * 3?", "Name 7 in words."],
                "answer": ["4", "9", "seven"],
            }
        )
        for row in rows:
            yield QATask(
                QAData(
                    prompt=row["question"],
                    answer=row["answer"],
                    system_prompt="Answer with the answer only.",
                )
            )


REPLIES = {"What is 2 + 2?": "4", "What is 3 * 3?": "10", "Name 7 in words.": "7"}


def qa_oracle(task: Task, messages: list[dict[str, Any]]) -> dict[str, Any]:
    return {"role": "assistant", "content": REPLIES[task.prompt]}


def test_a_single_turn_taskset_scores_its_weighted_rewards() -> None:
    taskset = QATaskset(vf.TasksetConfig())
    tasks = from_verifiers(taskset).tasks("train")
    assert [t.prompt for t in tasks] == list(REPLIES)
    assert tasks[0].target == {"answer": "4"} and tasks[0].id == "0"
    groups = collect_groups(taskset, tasks, OraclePolicy(qa_oracle), max_turns=3)
    episodes = [group[0] for group in groups]
    # exact (weight 1) + digits_only (weight 0.5): "4" right, "10" wrong digits, "7" neither
    assert [e.reward for e in episodes] == [1.5, 0.5, 0.5]
    assert [e.metrics["exact"] for e in episodes] == [1.0, 0.0, 0.0]
    assert [e.metrics["reply_chars"] for e in episodes] == [1.0, 2.0, 1.0]
    assert all(e.terminated and e.metrics["stop_condition"] == "agent_completed" for e in episodes)
    assert episodes[0].messages[:2] == [
        {"role": "system", "content": "Answer with the answer only."},
        {"role": "user", "content": "What is 2 + 2?"},
    ]
    assert episodes[0].metrics["num_turns"] == 1 and episodes[0].tool_specs == []

    class Loose(vf.Taskset):  # no declared task type: learned from its first task
        load = QATaskset.load

    loose = Loose(vf.TasksetConfig())  # each call below resolves a new factory: tasks rebuild
    groups = collect_groups(
        loose, from_verifiers(loose).tasks("val"), OraclePolicy(qa_oracle), max_turns=3
    )
    assert [group[0].reward for group in groups] == [1.5, 0.5, 0.5]


# --- a multi-turn environment: its run() answers each guess ------------------------------------


class GuessData(vf.TaskData):
    secret: int


class GuessTask(vf.Task[GuessData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def solved(self, trace: vf.Trace) -> float:
        return float(trace.info.get("solved", False))

    @vf.reward(weight=0.5)
    async def quick(self, trace: vf.Trace) -> float:
        return 1.0 / max(1, trace.num_turns)


class GuessTaskset(vf.Taskset[GuessTask, vf.TasksetConfig]):
    def load(self):
        for secret in (7, 3):
            yield GuessTask(GuessData(prompt="Guess my number from 1 to 10.", secret=secret))


class GuessEnv(vf.Env[vf.SingleAgentEnvConfig]):
    """The env's response to each reply: "higher", "lower", or the end of the game."""

    async def run(self, task, agents) -> None:
        async with agents.agent.interaction(task) as game:
            segment = await game.turn()
            while not segment.terminated:
                reply = segment.last_reply
                guess = int(reply) if reply.isdigit() else -1
                if guess == task.data.secret:
                    game.trace.info["solved"] = True
                    return
                segment = await game.turn("higher" if guess < task.data.secret else "lower")

    async def finalize(self, task, episode) -> None:
        for trace in episode.traces:
            trace.record_metric("episode_traces", float(len(episode.traces)))


@pytest.fixture
def plugin(monkeypatch):
    """Make a module of verifiers classes importable by id, as an installed env package is."""

    def install(name: str, *objects: type) -> str:
        module = types.ModuleType(name)
        for obj in objects:
            setattr(module, obj.__name__, obj)
        module.__all__ = [obj.__name__ for obj in objects]
        monkeypatch.setitem(sys.modules, name, module)
        return name

    return install


def guess_env(plugin, max_turns: int | None = None) -> Any:
    module = plugin("llm_gym_test_guess", GuessTaskset, GuessEnv)
    config = vf.resolve_env_config({"taskset": {"id": module}, "agent": {"max_turns": max_turns}})
    return vf.load_environment(config)


def bisect(task: Task, messages: list[dict[str, Any]]) -> dict[str, Any]:
    low, high = 1, 10
    guesses = [m["content"] for m in messages if m["role"] == "assistant"]
    answers = [m["content"] for m in messages if m["role"] == "user"][1:]
    for guess, answer in zip(guesses, answers, strict=False):
        low, high = (int(guess) + 1, high) if answer == "higher" else (low, int(guess) - 1)
    return {"role": "assistant", "content": str((low + high) // 2)}


def test_a_multi_turn_env_answers_each_reply(plugin) -> None:
    env = guess_env(plugin)
    assert type(env) is GuessEnv  # verifiers' own loader found the env in the package
    tasks = from_verifiers(env).tasks("val")
    groups = collect_groups(env, tasks, OraclePolicy(bisect), max_turns=8)
    seven, three = groups[0][0], groups[1][0]
    # 7: guesses 5 (higher), 8 (lower), 6 (higher), 7; 3: guesses 5 (lower), 2 (higher), 3
    assert [m["content"] for m in seven.messages if m["role"] == "assistant"] == list("5867")
    assert [m["content"] for m in seven.messages if m["role"] == "user"][1:] == [
        "higher",
        "lower",
        "higher",
    ]
    assert seven.reward == pytest.approx(1.0 + 0.5 / 4)
    assert three.reward == pytest.approx(1.0 + 0.5 / 3)
    assert seven.terminated and seven.metrics["stop_condition"] == "user_closed"
    assert seven.metrics["episode_traces"] == 1.0  # the env's finalize ran on the episode


def test_an_episode_cut_by_a_turn_limit_is_scored_as_verifiers_max_turns(plugin) -> None:
    env = guess_env(plugin)
    [[episode]] = collect_groups(
        env, from_verifiers(env).tasks("val")[:1], OraclePolicy(bisect), max_turns=2
    )
    assert episode.truncation_cause is TruncationCause.MAX_TURNS
    assert episode.metrics["stop_condition"] == "max_turns"
    assert episode.reward == pytest.approx(0.0 + 0.5 / 2)  # unsolved, two turns
    # The seat's own cap: verifiers' runtime (the env) truncates its trace itself, so ENV (no
    # overlong penalty), scored the same way.
    capped = guess_env(plugin, max_turns=3)
    [[episode]] = collect_groups(
        capped, from_verifiers(capped).tasks("val")[:1], OraclePolicy(bisect), max_turns=8
    )
    assert episode.truncation_cause is TruncationCause.ENV
    assert episode.metrics["stop_condition"] == "max_turns"
    assert episode.reward == pytest.approx(0.5 / 3) and episode.metrics["num_turns"] == 3


# --- a tool environment: python function tools -------------------------------------------------


class CountState(vf.State):
    calls: int = 0


class Arithmetic(vf.Toolset[vf.ToolsetConfig, CountState]):
    @vf.tool
    def multiply(self, a: int, b: int) -> int:
        """Multiply two integers."""
        self.state.calls += 1
        return a * b


class ProductData(vf.TaskData):
    a: int
    b: int


class ProductTask(vf.Task[ProductData, CountState, vf.TaskConfig]):
    @classmethod
    def toolsets(cls, config):
        return [Arithmetic(vf.ToolsetConfig())]

    @vf.reward
    async def correct(self, task: ProductData, trace: vf.Trace) -> float:
        return float(trace.last_reply == str(task.a * task.b))

    @vf.metric
    async def tool_calls(self, trace: vf.Trace) -> float:
        return float(trace.state.calls)

    @vf.stop
    async def gave_up(self, response: vf.Response) -> bool:
        return "give up" in (response.message.content or "")


class ProductTaskset(vf.Taskset[ProductTask, vf.TasksetConfig]):
    def load(self):
        for a, b in [(12, 34), (7, 8), (21, 3), (5, 5)]:
            yield ProductTask(ProductData(prompt=f"Compute {a} * {b} with the tool.", a=a, b=b))


def call(name: str, **arguments: Any) -> dict[str, Any]:
    function = {"name": name, "arguments": json.dumps(arguments)}
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "call_0", "type": "function", "function": function}],
    }


def multiplier(task: Task, messages: list[dict[str, Any]]) -> dict[str, Any]:
    results = [m["content"] for m in messages if m["role"] == "tool"]
    if not results:
        return call("arithmetic_multiply", a=task.target["a"], b=task.target["b"])
    return {"role": "assistant", "content": results[-1]}


def test_a_tool_env_offers_its_tools_and_scores_the_answer() -> None:
    taskset = ProductTaskset(vf.TasksetConfig())
    tasks = from_verifiers(taskset).tasks("train")[:2]
    groups = collect_groups(taskset, tasks, OraclePolicy(multiplier), max_turns=4)
    [spec] = groups[0][0].tool_specs
    assert spec["function"]["name"] == "arithmetic_multiply"
    assert spec["function"]["description"] == "Multiply two integers."
    assert spec["function"]["parameters"]["required"] == ["a", "b"]
    for group, product in zip(groups, ["408", "56"], strict=True):
        episode = group[0]
        tool = [m for m in episode.messages if m["role"] == "tool"]
        assert [m["content"] for m in tool] == [product]
        assert episode.reward == 1.0 and episode.metrics["num_turns"] == 2
        assert episode.metrics["tool_calls"] == 1.0  # the tool's state write reached the trace


def test_hostile_replies_are_outcomes_not_crashes() -> None:
    taskset = ProductTaskset(vf.TasksetConfig())
    task = from_verifiers(taskset).tasks("train")[0]
    scripts = {
        "bad arguments": [call("arithmetic_multiply", a="twelve"), "408"],
        "unknown tool": [call("rm_rf", path="/"), "408"],
        "huge reply": ["9" * 200_000],
        "garbled call": ["<tool_call>{not json at all</tool_call>"],
        "stop hook": ["I give up."],
    }
    for name, script in scripts.items():

        def scripted(task, messages, script=script):
            step = script[sum(m["role"] == "assistant" for m in messages)]
            return step if isinstance(step, dict) else {"role": "assistant", "content": step}

        [[episode]] = collect_groups(taskset, [task], OraclePolicy(scripted), max_turns=4)
        tool = [m["content"] for m in episode.messages if m["role"] == "tool"]
        if name == "bad arguments":
            assert tool[0].startswith("Error executing tool multiply") and episode.reward == 1.0
        elif name == "unknown tool":
            assert tool == ["error: unknown tool 'rm_rf'"] and episode.reward == 1.0
        elif name == "huge reply":
            assert episode.reward == 0.0 and episode.terminated
        elif name == "garbled call":
            assert episode.truncation_cause is TruncationCause.PARSE_FAILURE
        else:
            assert episode.metrics["stop_condition"] == "gave_up" and episode.reward == 0.0
        assert episode.error is None, name


class RedactedTask(ProductTask):
    @vf.intercept
    async def redact(self, request: vf.Request) -> vf.Request | None:
        last = request.messages[-1]
        if not isinstance(last, vf.ToolMessage):
            return None
        hidden = last.model_copy(update={"content": "[redacted]"})
        return request.model_copy(update={"messages": [*request.messages[:-1], hidden]})


class RedactedSet(vf.Taskset[RedactedTask, vf.TasksetConfig]):
    def load(self):
        yield RedactedTask(ProductData(prompt="Compute 6 * 7 with the tool.", a=6, b=7))


def test_request_interceptors_rewrite_what_the_model_sees() -> None:
    [[episode]] = collect_groups(
        RedactedSet(vf.TasksetConfig()),
        from_verifiers(RedactedSet(vf.TasksetConfig())).tasks("train"),
        OraclePolicy(multiplier),
        max_turns=3,
    )
    assert [m["content"] for m in episode.messages if m["role"] == "tool"] == ["[redacted]"]
    assert episode.messages[-1]["content"] == "[redacted]" and episode.reward == 0.0


class ChattyTask(ProductTask):
    @vf.intercept
    async def chatty(self, request: vf.Request) -> vf.Request | None:
        extra = vf.UserMessage(content="psst")
        return request.model_copy(update={"messages": [*request.messages, extra]})


class ChattySet(vf.Taskset[ChattyTask, vf.TasksetConfig]):
    def load(self):
        yield ChattyTask(ProductData(prompt="Compute 6 * 7 with the tool.", a=6, b=7))


def test_a_request_interceptor_that_adds_a_message_fails_its_rollout_by_name(
    monkeypatch,
) -> None:
    def play() -> Any:
        [[episode]] = collect_groups(
            ChattySet(vf.TasksetConfig()),
            [Task("Compute 6 * 7 with the tool.", {"a": 6, "b": 7})],
            OraclePolicy(multiplier),
            max_turns=3,
        )
        assert episode.truncation_cause is TruncationCause.ENV and episode.reward == 0.0
        return episode

    # verifiers 0.4 itself refuses the change (its RolloutSession checks every interceptor)
    assert "request interceptors cannot add or remove messages" in play().error

    # a session that let it through: the adapter names the interceptor and the rule
    from verifiers.v1.session import RolloutSession

    async def unchecked(self, request, *, run_stops=True):
        if not run_stops:  # the opening's users, before the first model call: unchanged
            return request, [], None
        extra = vf.UserMessage(content="psst")
        return request.model_copy(update={"messages": [*request.messages, extra]}), [], None

    monkeypatch.setattr(RolloutSession, "rewrite_request", unchecked)
    error = play().error
    assert "InvalidArgumentError: A request interceptor (@vf.intercept: chatty) added 1" in error
    assert (
        "(1 messages sent, 2 returned)" in error and "rewrite new user and tool messages" in error
    )


def test_the_env_api_directly_conclude_and_close(plugin, run_async) -> None:
    factory = from_verifiers(guess_env(plugin))
    task = factory.tasks("val")[0]

    async def play(cause: str | None):
        env = factory(task)
        opening = await env.reset(task)
        assert [m["role"] for m in opening] == ["user"] and env.max_turns is None
        result = await env.step({"role": "assistant", "content": "5"})
        assert not result.terminated and result.messages[-1] == {
            "role": "user",
            "content": "higher",
        }
        if cause is None:
            await env.close()  # mid-episode: the program is cancelled, nothing is scored
            return env, None
        concluded = await env.conclude(cause)
        await env.close()
        return env, concluded

    env, result = run_async(play("context_overflow"))
    assert result.truncated and result.reward == pytest.approx(0.5)  # one turn, unsolved
    assert env.trace.stop_condition == "max_input_tokens" and env.traces == [env.trace]
    env, result = run_async(play("deadline"))
    assert result is None and env.trace.ok is False and env.trace.rewards == {}
    env, result = run_async(play(None))
    assert env.rollout.closed and env.trace.rewards == {}


class ClosedTask(QATask):
    @vf.stop
    async def closed(self, trace: vf.Trace) -> bool:
        return True  # refuses the first model call: the episode ends before the model speaks


class ClosedSet(vf.Taskset[ClosedTask, vf.TasksetConfig]):
    def load(self):
        yield ClosedTask(QAData(prompt="What is 2 + 2?", answer="4"))


def test_an_episode_stopped_before_the_first_reply_ends_at_the_first_step(run_async) -> None:
    factory = from_verifiers(ClosedSet(vf.TasksetConfig()))
    [[episode]] = collect_groups(
        factory, factory.tasks("train"), OraclePolicy(qa_oracle), max_turns=3
    )
    assert episode.terminated and episode.reward == 0.0
    assert episode.metrics["stop_condition"] == "closed" and episode.metrics["num_turns"] == 0

    async def twice():
        env = factory(factory.tasks("train")[0])
        await env.reset(factory.tasks("train")[0])
        first = await env.step({"role": "assistant", "content": "4"})
        with pytest.raises(InvalidArgumentError, match="The episode has ended"):
            await env.step({"role": "assistant", "content": "4"})
        return first

    assert run_async(twice()).terminated


# --- the evaluator, gym.make and registration -----------------------------------------------------


@pytest.fixture
def registered():
    ids: list[str] = []

    def register(id: str, *args: Any, **kwargs: Any):
        ids.append(id)
        return register_verifiers_env(id, *args, **kwargs)

    yield register
    for id in ids:
        unregister_env(id)


def test_run_and_report_and_gym_make_find_a_registered_verifiers_env(registered) -> None:
    taskset = ProductTaskset(vf.TasksetConfig())
    entry = registered(
        "VfProduct-v0",
        taskset,
        splits={"train": taskset.take(2), "val": taskset.skip(2)},
        max_turns=3,
    )
    assert entry.max_turns == 3
    report = run_and_report(
        "VfProduct-v0", OraclePolicy(multiplier), split="val", progress=False, print_report=False
    )
    assert report.tasks == 2 and report.metrics["reward_mean"] == 1.0
    assert [e.task.prompt for e in report.episodes] == [
        "Compute 21 * 3 with the tool.",
        "Compute 5 * 5 with the tool.",
    ]
    env = gym.make("VfProduct-v0")
    task = env.unwrapped.tasks("train")[1]

    def act(env, observation, info):
        return env.unwrapped.action_format.render_message(multiplier(task, info["messages"]))

    reward, info = play_text_episode(env, act, options={"task": task})
    assert reward == 1.0
    with warnings.catch_warnings(record=True) as caught:  # random text as actions, too
        warnings.simplefilter("always")
        check_env(env.unwrapped)
    assert [str(w.message) for w in caught] == []
    env.close()


def test_bad_input_gets_a_clear_error(plugin) -> None:
    with pytest.raises(InvalidArgumentError, match="Expected a verifiers Env or Taskset"):
        from_verifiers(42)
    with pytest.raises(InvalidArgumentError, match="actual class"):
        collect_groups(QATaskset, [Task("q")], OraclePolicy(qa_oracle), max_turns=1)
    with pytest.raises(InvalidArgumentError, match="splits maps split names"):
        from_verifiers(QATaskset(vf.TasksetConfig()), splits={"dev": None})

    class Endless(vf.Taskset[QATask, vf.TasksetConfig]):
        INFINITE = True

        def load(self):
            while True:
                yield QATask(QAData(prompt="?", answer="!"))

    with pytest.raises(InvalidArgumentError, match="is infinite"):
        from_verifiers(Endless(vf.TasksetConfig())).tasks("train")
    assert (
        len(
            from_verifiers(
                Endless(vf.TasksetConfig()), splits={"val": Endless(vf.TasksetConfig()).take(3)}
            ).tasks("val")
        )
        == 3
    )


def test_a_failing_environment_ends_only_its_episode(plugin) -> None:
    class TwoSeats(GuessEnv):
        async def run(self, task, agents) -> None:
            await agents.agent.run(task)
            await agents.agent.run(task)  # llm_gym plays one rollout per episode

    class SyncReward(QATask):
        @vf.reward
        def exact(self, task, trace) -> float:  # verifiers needs async scoring functions
            return 1.0

    class SyncSet(vf.Taskset[SyncReward, vf.TasksetConfig]):
        def load(self):
            yield SyncReward(QAData(prompt="What is 2 + 2?", answer="4"))

    module = plugin("llm_gym_test_two", GuessTaskset, TwoSeats)
    two = vf.load_environment(vf.resolve_env_config({"taskset": {"id": module}}))
    [[episode]] = collect_groups(
        two, from_verifiers(two).tasks("val")[:1], OraclePolicy(bisect), max_turns=4
    )
    assert episode.truncation_cause is TruncationCause.ENV
    assert "one agent rollout per episode" in episode.error
    [[episode]] = collect_groups(
        SyncSet(vf.TasksetConfig()),
        [Task("What is 2 + 2?", {"answer": "4"})],
        OraclePolicy(qa_oracle),
        max_turns=2,
    )
    assert episode.truncation_cause is TruncationCause.ENV and "await" in episode.error


# --- lifetimes: what the adapter starts, it stops ----------------------------------------------

LIFECYCLE: list[str] = []
"""What the spies below did, in order."""


class Pinger(vf.Toolset[vf.ToolsetConfig]):
    """A shared tool server that logs its setup and its teardown (its exit stack)."""

    async def setup(self) -> None:
        LIFECYCLE.append("server up")
        self._exit_stack.push_async_callback(self.down)

    async def down(self) -> None:
        LIFECYCLE.append("server down")

    @vf.tool
    def ping(self) -> str:
        """Answer pong."""
        return "pong"


class PingedSet(vf.Taskset[QATask, vf.TasksetConfig]):
    load = QATaskset.load

    @classmethod
    def toolsets(cls, config):
        return [Pinger(vf.ToolsetConfig())]


class SpyEnv(vf.Env[vf.SingleAgentEnvConfig]):
    """SingleAgentEnv with its start() and stop() logged; start() fails while FAIL is set."""

    FAIL = False

    async def run(self, task, agents) -> None:
        await agents.agent.run(task)

    async def start(self) -> None:
        LIFECYCLE.append("env start")
        if SpyEnv.FAIL:
            raise RuntimeError("no judge today")

    async def stop(self) -> None:
        LIFECYCLE.append("env stop")


UP, DOWN = ["server up", "env start"], ["env stop", "server down"]
"""verifiers' order (``Env.serving()``): the shared servers, then start(); stop(), then them."""


@pytest.fixture
def spied(plugin, monkeypatch):
    LIFECYCLE.clear()
    monkeypatch.setattr(SpyEnv, "FAIL", False)
    module = plugin("llm_gym_test_spied", PingedSet, SpyEnv)
    factory = from_verifiers(
        vf.load_environment(vf.resolve_env_config({"taskset": {"id": module}}))
    )
    yield factory
    LIFECYCLE.clear()


def test_each_collect_groups_call_stops_what_it_started(spied) -> None:
    tasks = spied.tasks("train")
    for _ in range(3):  # one event loop per call, as each trainer step makes
        groups = collect_groups(spied, tasks, OraclePolicy(qa_oracle), max_turns=2)
        assert [group[0].reward for group in groups] == [1.5, 0.5, 0.5]
        assert [s["function"]["name"] for s in groups[0][0].tool_specs] == ["pinger_ping"]
        assert spied.resources.live == 0
    assert LIFECYCLE == (UP + DOWN) * 3


def test_a_long_lived_loop_keeps_one_set_until_aclose(spied) -> None:
    tasks = spied.tasks("train")

    async def serve() -> None:
        for _ in range(2):
            await collect_groups_async(spied, tasks, OraclePolicy(qa_oracle), max_turns=2)
        assert LIFECYCLE == UP and spied.resources.live == 1  # started once for the loop
        await spied.aclose()
        assert LIFECYCLE == UP + DOWN and spied.resources.live == 0
        await collect_groups_async(spied, tasks[:1], OraclePolicy(qa_oracle), max_turns=2)
        assert LIFECYCLE == UP + DOWN + UP  # the next episode starts them again

    asyncio.run(serve())  # the loop's shutdown stops the second set, and nothing twice
    assert LIFECYCLE == (UP + DOWN) * 2 and spied.resources.live == 0


def test_a_closed_gym_env_leaves_nothing_running(spied, registered) -> None:
    registered("VfSpied-v0", spied, max_turns=2)
    for release in ("next loop", "close()"):
        LIFECYCLE.clear()
        env = gym.make("VfSpied-v0")
        task = env.unwrapped.tasks("val")[0]
        reward, _ = play_text_episode(env, lambda *_: "4", options={"task": task})
        assert reward == 1.5
        env.close()  # its loop may close without shutting down its generators: at most a set
        assert spied.resources.live <= 1 and len(LIFECYCLE) == 4 - 2 * spied.resources.live
        if release == "next loop":  # the next loop's first episode stops it, there
            collect_groups(spied, [task], OraclePolicy(qa_oracle), max_turns=2)
            assert LIFECYCLE == (UP + DOWN) * 2
        else:
            spied.close()
            assert LIFECYCLE == UP + DOWN
        assert spied.resources.live == 0


def test_a_failed_start_is_stopped_and_retried(spied, monkeypatch) -> None:
    monkeypatch.setattr(SpyEnv, "FAIL", True)
    tasks = spied.tasks("train")[:1]
    [[episode]] = collect_groups(spied, tasks, OraclePolicy(qa_oracle), max_turns=2)
    assert episode.truncation_cause is TruncationCause.ENV and "no judge today" in episode.error
    assert LIFECYCLE == UP + DOWN and spied.resources.live == 0  # stop() runs after a failure
    monkeypatch.setattr(SpyEnv, "FAIL", False)
    [[episode]] = collect_groups(spied, tasks, OraclePolicy(qa_oracle), max_turns=2)
    assert episode.reward == 1.5 and LIFECYCLE == (UP + DOWN) * 2


# --- the trainer ---------------------------------------------------------------------------------


def test_the_trainer_runs_two_steps_on_a_verifiers_env(small_model_dir, tmp_path) -> None:
    pytest.importorskip("trl")
    from trainers import GRPOConfig, train_multi_turn

    taskset = QATaskset(vf.TasksetConfig())
    factory = from_verifiers(taskset)
    config = GRPOConfig(
        output_dir=str(tmp_path),
        model=str(small_model_dir),
        batch_size=2,
        episodes_per_task=2,
        num_steps=2,
        max_turns=1,
        max_model_length=256,
        max_tokens_per_turn=4,
        learning_rate=1e-2,
        use_cpu=True,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        logging_steps=1,
        seed=0,
    )
    trainer = train_multi_turn(config, tasks=factory.tasks("train"), env_factory=factory)
    assert trainer.state.global_step == 2
    logged = [row for row in trainer.state.log_history if "terminated_ratio" in row]
    assert logged and all(row["terminated_ratio"] == 1.0 for row in logged)


# --- the other direction: our environments in verifiers ----------------------------------------


def unwrap(task: Task) -> Task:
    return Task.from_dict(task.metadata["verifiers"]["data"]["task"])


def test_our_env_is_a_verifiers_environment_scored_by_verifiers(run_async) -> None:
    env = load_environment("ToolUseGame-v0", split="val", limit=3)
    assert isinstance(env, vf.Env) and type(env.taskset).__name__ == "LlmGymTaskset"
    loaded = vf.load_taskset(
        vf.resolve_env_config(
            {"taskset": {"id": "llm_gym_verifiers", "env_id": "ToolUseGame-v0"}}
        ).taskset
    )
    assert type(loaded) is type(env.taskset)
    task = next(iter(env.taskset))
    ours = Task.from_dict(task.data.task)
    native = ToolUseGameEnv()
    opening = run_async(native.reset(ours))
    assert task.data.system_prompt == opening[0]["content"] and task.data.prompt == ours.prompt
    transcript = list(opening)
    while True:  # the oracle's own episode in our env, then scored on verifiers' side
        action = oracle_action(ours, transcript)
        result = run_async(native.step(action))
        transcript = result.messages
        if result.terminated or result.truncated:
            break
    trace = trace_from_messages(task, transcript, native.tool_specs)
    run_async(task.score(trace))
    assert trace.rewards["env_reward"].score == 1.0 and trace.reward == 1.0
    wrong = trace_from_messages(task, [*opening, {"role": "assistant", "content": "-1"}])
    run_async(task.score(wrong))
    assert wrong.reward == 0.0


def test_our_env_round_trips_through_verifiers_into_our_loop() -> None:
    env = load_environment("ToolUseGame-v0", split="val", limit=4)
    tasks = from_verifiers(env).tasks("val")
    assert tasks[0].prompt == unwrap(tasks[0]).prompt and len(tasks) == 4
    groups = collect_groups(
        env, tasks, OraclePolicy(lambda t, m: oracle_action(unwrap(t), m)), max_turns=8
    )
    native = sorted(s["function"]["name"] for s in ToolUseGameEnv().tool_specs)
    for group in groups:
        episode = group[0]
        assert sorted(s["function"]["name"] for s in episode.tool_specs) == native
        assert episode.reward == 1.0 and episode.metrics["env_reward"] == 1.0
    assert llm_gym_taskset("ToolUseGame-v0", split="val", limit=2).config.limit == 2


class ClosingGame(ToolUseGameEnv):
    """ToolUseGame that keeps every instance made and counts its close() calls."""

    made: list[ClosingGame] = []

    def __init__(self) -> None:
        super().__init__()
        self.closes = 0
        ClosingGame.made.append(self)

    async def close(self) -> None:
        self.closes += 1
        await super().close()


def test_every_env_our_taskset_makes_is_closed(monkeypatch) -> None:
    monkeypatch.setattr(ClosingGame, "made", [])
    register_env("VfClosingGame-v0", env=ClosingGame, tasks="llm_gym.envs.tool_use_game:get_tasks")
    try:
        env = load_environment("VfClosingGame-v0", split="val", limit=2)
        tasks = from_verifiers(env).tasks("val")
        opened = len(ClosingGame.made)  # one per task, for its opening messages
        groups = collect_groups(
            env, tasks, OraclePolicy(lambda t, m: oracle_action(unwrap(t), m)), max_turns=8
        )
    finally:
        unregister_env("VfClosingGame-v0")
    assert [group[0].reward for group in groups] == [1.0, 1.0]
    # per rollout: the toolset's env (stepped by the tool calls) and the reward's replay
    assert opened == 2 and len(ClosingGame.made) == opened + 2 * 2
    assert [e.closes for e in ClosingGame.made] == [1] * 6


def test_the_docstring_example_runs() -> None:
    result = doctest.testmod(importlib.import_module("llm_gym.integrations.verifiers.factory"))
    assert result.failed == 0 and result.attempted > 0


GUIDE_SNIPPET = """
import verifiers.v1 as vf

from llm_gym.eval import run_and_report
from llm_gym.integrations.verifiers import load_environment, register_verifiers_env

class QA(vf.TaskData):
    answer: str

class QATask(vf.Task[QA, vf.State, vf.TaskConfig]):
    @vf.reward
    async def exact(self, task: QA, trace: vf.Trace) -> float:
        return float(trace.last_reply == task.answer)

class QASet(vf.Taskset[QATask, vf.TasksetConfig]):
    def load(self):
        yield QATask(QA(prompt="What is 2 + 2? Reply with the number.", answer="4"))

register_verifiers_env("MyVf-v0", QASet(vf.TasksetConfig()), max_turns=1)
report = run_and_report("MyVf-v0", "random", split="val", progress=False)
vf_env = load_environment("ToolUseGame-v0", split="val")  # ours, as a verifiers Env
"""
"""The "Use with verifiers" block of docs/guides/integrations.md, as it stands there."""


def test_the_guide_snippet_runs() -> None:
    namespace: dict[str, Any] = {"__name__": "guide_verifiers"}
    try:
        exec(compile(GUIDE_SNIPPET, "docs/guides/integrations.md", "exec"), namespace)
    finally:
        unregister_env("MyVf-v0")
    report = namespace["report"]
    assert report.tasks == 1 and len(report.episodes) == 1
    assert report.episodes[0].reward in (0.0, 1.0)
    assert isinstance(namespace["vf_env"], vf.Env)
