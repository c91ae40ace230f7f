"""Resolution (``llm_gym.core.factories``) and the catalogue (``llm_gym.core.registry``)."""

from __future__ import annotations

import pickle

import pytest

from llm_gym import Task
from llm_gym.core.factories import (
    NoArgFactory,
    SameEnv,
    as_env_factory,
    as_task,
    as_task_source,
    register_env_adapter,
    resolve,
    unregister_env_adapter,
)
from llm_gym.core.registry import EnvEntry, as_env_entry, env_entry
from llm_gym.envs.tool_use_game import ToolUseGameEnv, get_tasks, oracle_action
from llm_gym.errors import InvalidArgumentError, UnknownNameError
from llm_gym.gym import register_env, unregister_env


def test_every_way_to_name_an_environment_gives_a_factory() -> None:
    task = Task("q")
    instance = ToolUseGameEnv()
    assert isinstance(as_env_factory(ToolUseGameEnv), NoArgFactory)
    assert as_env_factory(instance)(task) is instance and isinstance(
        as_env_factory(instance), SameEnv
    )
    assert type(as_env_factory("llm_gym.envs.tool_use_game:ToolUseGameEnv")(task)).__name__ == (
        "ToolUseGameEnv"
    )
    assert type(as_env_factory(lambda: ToolUseGameEnv())(task)) is ToolUseGameEnv
    assert as_env_factory(lambda t: instance)(task) is instance
    pickle.loads(pickle.dumps(as_env_factory(ToolUseGameEnv)))  # travels to workers
    with pytest.raises(InvalidArgumentError, match="Env subclass"):
        as_env_factory(dict)
    with pytest.raises(InvalidArgumentError, match="module:attr"):
        as_env_factory(42)
    with pytest.raises(InvalidArgumentError, match="module:attribute"):
        resolve("no_colon_here")


def test_tasks_and_task_sources() -> None:
    assert as_task("hi") == Task("hi")
    assert as_task({"input": "x", "output": 2}) == Task("x", 2)

    class Row:
        def to_task(self) -> Task:
            return Task("from a row")

    assert as_task(Row()).prompt == "from a row"
    with pytest.raises(InvalidArgumentError, match="options\\['task'\\] must be a Task"):
        as_task(3.5, "options['task']")
    tasks = [Task("a"), Task("b")]
    assert as_task_source(tasks)("test") == tasks
    assert as_task_source({"val": tasks})("val") == tasks
    with pytest.raises(InvalidArgumentError, match="available splits"):
        as_task_source({"val": tasks})("train")
    assert as_task_source("llm_gym.envs.tool_use_game:get_tasks")("val") == get_tasks("val")


def test_an_entry_resolves_its_pieces_once() -> None:
    entry = env_entry("ToolUseGame-v0")
    assert entry.env_factory() is entry.env_factory()
    assert entry.task_source() is entry.task_source()
    assert entry.oracle() is oracle_action
    assert entry.tasks("val") == list(get_tasks("val")) and entry.tasks("val") is not entry.tasks(
        "val"
    )  # a fresh list each time, built once
    assert (entry.max_turns, entry.action_format) == (8, "hermes")
    copy = pickle.loads(pickle.dumps(entry))
    assert copy == entry and copy.tasks("test") == list(get_tasks("test"))
    with pytest.raises(InvalidArgumentError, match="split must be one of"):
        entry.tasks("dev")


def test_entries_for_ids_entries_and_unregistered_environments() -> None:
    entry = env_entry("ToolUseGame-v0")
    assert as_env_entry("ToolUseGame-v0") is entry and as_env_entry(entry) is entry
    loose = as_env_entry(ToolUseGameEnv)
    assert loose.id == "ToolUseGameEnv" and loose.oracle() is None and loose.max_turns == 8
    with pytest.raises(InvalidArgumentError, match="pass tasks="):
        loose.tasks("val")
    with pytest.raises(UnknownNameError, match="Did you mean 'ToolUseGame-v0'"):
        env_entry("ToolUseGam-v0")


def test_registering_twice_and_unregistering() -> None:
    spec = dict(env="llm_gym.envs.tool_use_game:ToolUseGameEnv", tasks=[Task("q")])
    try:
        first = register_env("Throwaway-v0", **spec)
        assert register_env("Throwaway-v0", **spec) is first  # same settings: a no-op
        with pytest.raises(InvalidArgumentError, match="Throwaway-v1"):
            register_env("Throwaway-v0", **spec, max_turns=3)
        assert isinstance(env_entry("Throwaway-v0"), EnvEntry)
    finally:
        unregister_env("Throwaway-v0")
    with pytest.raises(UnknownNameError):
        env_entry("Throwaway-v0")


class OtherStyle:
    """An environment of another style, made usable everywhere by an adapter."""


def test_another_style_plugs_in_with_an_adapter() -> None:
    with pytest.raises(InvalidArgumentError):
        as_env_factory(OtherStyle())
    register_env_adapter(OtherStyle, lambda obj: NoArgFactory(ToolUseGameEnv))
    try:
        assert type(as_env_factory(OtherStyle())(Task("q"))) is ToolUseGameEnv
        assert type(as_env_factory(OtherStyle)(Task("q"))) is ToolUseGameEnv  # the class too
    finally:
        unregister_env_adapter(OtherStyle)
