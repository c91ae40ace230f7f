"""TextEnv's gymnasium behaviour: make without import, vector envs, options, truncation causes."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from unittest import mock

import gymnasium as gym
import pytest

from llm_gym import (
    Env,
    InvalidArgumentError,
    StepResult,
    SyncEnv,
    Task,
    TruncationCause,
    UnknownNameError,
)
from llm_gym.gym import TextEnv, UnicodeText


def test_make_in_a_fresh_interpreter_without_importing_llm_gym() -> None:
    code = (
        "import sys\n"
        "assert 'llm_gym' not in sys.modules\n"
        "import gymnasium as gym\n"
        "env = gym.make('ToolUseGame-v0')\n"
        "obs, info = env.reset(seed=0)\n"
        "obs, r, term, trunc, info = env.step(env.unwrapped.oracle_action())\n"
        "print(type(env.unwrapped).__name__, len(info['messages']))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "import llm_gym" not in code and "from llm_gym" not in code
    assert out.stdout.split()[0] == "TextEnv" and int(out.stdout.split()[1]) >= 4


def test_entry_point_is_declared() -> None:
    from importlib.metadata import entry_points

    names = {ep.value for ep in entry_points(group="gymnasium.envs")}
    assert "llm_gym.envs.builtin:register_builtin_envs" in names


def test_make_vec() -> None:
    envs = gym.make_vec("ToolUseGame-v0", num_envs=4)
    observations, infos = envs.reset(seed=7)
    assert len(observations) == 4 and all(isinstance(o, str) for o in observations)
    observations, rewards, terminated, _truncated, _infos = envs.step(("42",) * 4)
    assert terminated.all() and rewards.shape == (4,)
    envs.close()


def test_reset_options_pick_split_and_index() -> None:
    env = gym.make("ToolUseGame-v0")
    _, info = env.reset(options={"split": "val", "index": 3})
    assert info["task"].id == "tool_use_game/val/0003" and info["split"] == "val"
    _, info = env.reset(
        options={
            "task": {
                "prompt": "What is the population of Tarsk?",
                "target": 1,
                "metadata": {"keys": ["Tarsk.population"], "type": "lookup"},
            }
        }
    )
    assert info["task"].prompt == "What is the population of Tarsk?"
    with pytest.raises(InvalidArgumentError, match="allowed: 'task', 'split', 'index'"):
        env.reset(options={"splitt": "val"})
    with pytest.raises(InvalidArgumentError, match="must be an int in"):
        env.reset(options={"index": 10_000})


def test_parse_failure_truncates_with_the_named_penalty() -> None:
    env = gym.make("ToolUseGame-v0")
    env.reset(seed=0)
    _, reward, terminated, truncated, info = env.step('<tool_call>{"name": "lookup"')
    assert (reward, terminated, truncated) == (-0.1, False, True)
    assert info["truncation_cause"] is TruncationCause.PARSE_FAILURE
    assert "unclosed" in info["parse_error"]
    with pytest.raises(gym.error.ResetNeeded):
        env.step("again")


def test_max_turns_truncates() -> None:
    env = gym.make("ToolUseGame-v0", max_turns=2)
    env.reset(seed=0)
    call = '<tool_call>{"name": "list_fact_keys", "arguments": {}}</tool_call>'
    assert env.step(call)[2:4] == (False, False)
    _, reward, terminated, truncated, info = env.step(call)
    assert (reward, terminated, truncated) == (0.0, False, True)
    assert info["truncation_cause"] == "max_turns"


class _Exploding(Env):
    def __init__(self) -> None:
        self._messages: list = []

    async def reset(self, task: Task) -> list:
        self._messages = [{"role": "user", "content": task.prompt}]
        return list(self._messages)

    async def step(self, message) -> StepResult:
        raise RuntimeError("boom")

    @property
    def tool_specs(self) -> list:
        return []

    @property
    def messages(self) -> list:
        return list(self._messages)


def test_env_exception_becomes_env_truncation() -> None:
    env = TextEnv(_Exploding, [Task("hi")])
    env.reset(seed=0)
    _, reward, terminated, truncated, info = env.step("hello")
    assert (reward, terminated, truncated) == (0.0, False, True)
    assert info["truncation_cause"] is TruncationCause.ENV and "boom" in info["env_error"]


def test_render_ansi_prints_the_transcript() -> None:
    env = gym.make("ToolUseGame-v0", render_mode="ansi")
    env.reset(seed=1)
    env.step(env.unwrapped.oracle_action())
    text = env.render()
    assert "[system]" in text and "[user]" in text and "[tool lookup]" in text


def test_bad_constructor_arguments_are_named() -> None:
    with pytest.raises(InvalidArgumentError, match="render_mode"):
        gym.make("ToolUseGame-v0", render_mode="human")
    with pytest.raises(InvalidArgumentError, match="max_turns"):
        TextEnv(_Exploding, [Task("x")], max_turns=0)
    with pytest.raises(InvalidArgumentError, match="split must be one of"):
        TextEnv(_Exploding, [Task("x")], split="dev")
    with pytest.raises(UnknownNameError, match="action format 'xml'"):
        TextEnv(_Exploding, [Task("x")], action_format="xml")
    env = TextEnv(_Exploding, [Task("x")])
    env.reset()
    with pytest.raises(InvalidArgumentError, match="Expected the action as a str"):
        env.step(42)  # type: ignore[arg-type]


def test_unknown_id_suggests_the_closest() -> None:
    from llm_gym.gym import env_entry

    with pytest.raises(KeyError, match="Did you mean 'ToolUseGame-v0'"):
        env_entry("ToolUseGam-v0")


def test_unicode_text_space() -> None:
    space = UnicodeText(5)
    assert "" in space and "日本語😀" in space and "toolong" not in space and 3 not in space
    space.seed(0)
    assert all(s in space for s in (space.sample() for _ in range(50)))


def test_json_action_format_variant() -> None:
    env = gym.make("ToolUseGame-v0", action_format="json")
    observation, _ = env.reset(seed=0)
    assert "JSON" in observation or "json" in observation
    action = env.unwrapped.oracle_action()
    assert action.lstrip().startswith(("{", "["))
    _, _, _terminated, _truncated, info = env.step(action)
    assert info["messages"][-1]["role"] == "tool"


def test_info_messages_are_read_only_fresh_lists_of_plain_data() -> None:
    import copy
    import json
    import pickle

    env = gym.make("ToolUseGame-v0")
    _, info0 = env.reset(seed=0, options={"split": "val", "index": 0})
    _, _, _, _, info1 = env.step(
        '<tool_call>{"name": "lookup", "arguments": {"key": "x"}}</tool_call>'
    )
    first, later = info0["messages"], info1["messages"]
    assert first is not later and len(later) == len(first) + 2
    assert all(isinstance(m, dict) for m in later)
    with pytest.raises(TypeError, match="read-only"):
        later[-1]["content"] = "edited"
    with pytest.raises(TypeError, match="read-only"):
        later[-2]["tool_calls"][0].update(id="x")  # nested dicts are frozen too
    editable = dict(later[-1])
    editable["content"] = "edited"  # a plain copy is editable and changes nothing in the env
    assert env.unwrapped.messages[-1]["content"] != "edited"
    assert type(copy.deepcopy(later[-2])) is dict and type(copy.copy(later[-1])) is dict
    assert type(pickle.loads(pickle.dumps(later))[-1]) is dict
    assert json.loads(json.dumps(later))[-2]["tool_calls"][0]["function"]["name"] == "lookup"


def test_info_tool_specs_are_shared_read_only_entries_in_fresh_lists() -> None:
    import copy
    import json
    import pickle

    from gymnasium.utils.env_checker import check_env

    env = gym.make("ToolUseGame-v0")
    _, info0 = env.reset(seed=0, options={"split": "val", "index": 0})
    _, _, _, _, info1 = env.step(
        '<tool_call>{"name": "lookup", "arguments": {"key": "x"}}</tool_call>'
    )
    specs = env.unwrapped._driver.tool_specs
    assert info0["tool_specs"] == info1["tool_specs"] == specs  # equal to plain dicts and lists
    assert info0["tool_specs"] is not info1["tool_specs"] and type(info1["tool_specs"]) is list
    required = info1["tool_specs"][0]["function"]["parameters"]
    for edit in (lambda: info1["tool_specs"][0].update(type="x"), lambda: required.clear()):
        with pytest.raises(TypeError, match="read-only"):
            edit()
    assert json.loads(json.dumps(info1["tool_specs"])) == specs
    assert type(copy.deepcopy(info1["tool_specs"])[0]) is dict
    revived = pickle.loads(pickle.dumps(env.unwrapped))  # frozen again after unpickling
    with pytest.raises(TypeError, match="read-only"):
        revived._info()["tool_specs"][0]["function"].clear()
    check_env(gym.make("ToolUseGame-v0").unwrapped, skip_render_check=True)  # no shared infos


def test_info_messages_follow_an_env_that_rewrites_history() -> None:
    class Rewriter(Env):
        synchronous = True

        async def reset(self, task):
            self._m = [{"role": "user", "content": task.prompt}]
            return list(self._m)

        async def step(self, message):
            # Rewrites the opening message every turn (as a think-stripping template would).
            self._m = [{"role": "user", "content": f"turn {len(self._m)}"}, *self._m[1:], message]
            return StepResult(False, False, list(self._m))

        @property
        def tool_specs(self):
            return []

        @property
        def messages(self):
            return list(self._m)

    env = TextEnv(Rewriter, [Task("start")], max_turns=5)
    env.reset(seed=0)
    _, _, _, _, info = env.step("a")
    assert [m["content"] for m in info["messages"]] == ["turn 1", "a"]
    _, _, _, _, info = env.step("b")
    assert [m["content"] for m in info["messages"]] == ["turn 2", "a", "b"]


class _Counter(SyncEnv):
    """Counts assistant turns; ends after two. Plain methods only (SyncEnv)."""

    raw_text_actions = True

    def reset_sync(self, task: Task) -> list:
        self._m = [{"role": "user", "content": task.prompt}]
        self.closed = 0
        return list(self._m)

    def step_sync(self, message) -> StepResult:
        self._m += [message, {"role": "user", "content": f"seen {len(self._m) // 2 + 1}"}]
        done = len(self._m) >= 5
        return StepResult(done, False, list(self._m), 1.0 if done else 0.0)

    def close_sync(self) -> None:
        self.closed += 1

    @property
    def tool_specs(self) -> list:
        return []

    @property
    def messages(self) -> list:
        return list(self._m)


def test_sync_env_runs_without_coroutines_in_text_env_and_as_an_async_env() -> None:
    env = TextEnv(
        _Counter,
        [Task("go")],
        max_turns=5,
    )
    env.reset(seed=0)
    inner = env.unwrapped.inner_env
    with mock.patch.object(_Counter, "step", side_effect=AssertionError("coroutine used")):
        observation, reward, terminated, _, _ = env.step("a")
        assert (observation, reward, terminated) == ("seen 1", 0.0, False)
        observation, reward, terminated, _, info = env.step("b")
    assert (observation, reward, terminated) == ("seen 2", 1.0, True)
    assert [m["content"] for m in info["messages"]] == ["go", "a", "seen 1", "b", "seen 2"]
    assert inner.closed == 1 and inner.synchronous
    # The async methods the rollout loop awaits wrap the plain ones.
    other = _Counter()
    assert asyncio.run(other.reset(Task("x"))) == [{"role": "user", "content": "x"}]
    result = asyncio.run(other.step({"role": "assistant", "content": "y"}))
    assert result.messages[-1]["content"] == "seen 1" and not result.terminated
    asyncio.run(other.close())
    assert other.closed == 1


# --- gym.make arguments ---------------------------------------------------------------------------


def test_gym_make_names_an_unknown_argument_and_what_is_taken() -> None:
    with pytest.raises(InvalidArgumentError, match="Did you mean 'max_turns'") as caught:
        gym.make("ToolUseGame-v0", max_turn=3)
    assert "env_kwargs" in str(caught.value) and "'split'" in str(caught.value)
    with pytest.raises(InvalidArgumentError, match=r"'dataset'.*'max_turns'"):
        gym.make("RG-ChainSum-v0", zzz=1)  # a subclass: its keywords and TextEnv's


def test_tasks_that_are_not_tasks_are_named_when_the_env_is_made() -> None:
    with pytest.raises(InvalidArgumentError, match=r"tasks\[1\] must be a Task"):
        gym.make("ToolUseGame-v0", tasks=[Task("a"), 5])
    with pytest.raises(InvalidArgumentError, match=r"tasks\['train'\] must be a sequence"):
        gym.make("ToolUseGame-v0", tasks={"train": 5})
    env = gym.make("ToolUseGame-v0", tasks=lambda split: [5])  # a source is code too
    with pytest.raises(InvalidArgumentError, match="task 0 of the 'train' split"):
        env.reset(seed=0)
    assert gym.make("ToolUseGame-v0", tasks=["What is 2 + 2?"]).reset(seed=0)[0]
