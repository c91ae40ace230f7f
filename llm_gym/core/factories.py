"""Resolution: "an id, a class, a factory or an instance" into an env factory and a task source.

Every place that accepts an environment (``gym.make`` kwargs, ``collect_groups``,
``run_and_report``, the trainer) accepts the same things and resolves them here, once:

* :func:`as_env_factory`: an :class:`~llm_gym.core.Env` instance, an ``Env`` subclass, a factory
  ``task -> Env`` (or a no-argument one), or a ``"module:attr"`` string naming any of these.
  Other environment styles plug in with :func:`register_env_adapter` (document 002's
  ``EnvironmentMultiTurn`` does, from :mod:`llm_gym.environments`), so this module imports none.
* :func:`as_task_source`: a sequence of tasks, a mapping ``split -> tasks``, a callable
  ``split -> tasks`` or a ``"module:attr"`` string.
* :func:`resolve`: a ``"module:attr"`` string into its object, for the modules the rules of
  :mod:`llm_gym.core.references` allow (:func:`trust_modules` extends them).
* :func:`as_task`: a :class:`Task`, a prompt string, a dict (``prompt``/``target`` or
  document 002's ``input``/``output``) or anything with a ``to_task()`` method.

Everything returned is picklable when its inputs are, so it can travel as a ``gym.make`` kwarg or
to a worker process.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeAlias, TypeVar

from llm_gym.core.env import Env
from llm_gym.core.references import (
    resolve_reference,
    trust_modules,
    trust_reference,
    trusted_modules,
    untrust_modules,
)
from llm_gym.core.task import Task
from llm_gym.core.types import Message
from llm_gym.errors import InvalidArgumentError

__all__ = [
    "EnvFactory",
    "Oracle",
    "SPLITS",
    "TaskSource",
    "as_env_factory",
    "as_task",
    "as_task_source",
    "with_task_options",
    "register_env_adapter",
    "resolve",
    "trust_modules",
    "trust_reference",
    "trusted_modules",
    "unregister_env_adapter",
    "untrust_modules",
]

T = TypeVar("T")

EnvFactory: TypeAlias = Callable[[Task], Env]
"""Builds a fresh environment for one episode (the seeds' ``env_factory``)."""
TaskSource: TypeAlias = Callable[[str], Sequence[Task]]
"""Returns the tasks of a split (``"train"``, ``"val"`` or ``"test"``)."""
Oracle: TypeAlias = Callable[[Task, list[Message]], Message]
"""An environment's scripted expert: ``(task, messages so far) -> next assistant message``."""

SPLITS = ("train", "val", "test")
"""The task splits every registered environment has."""


def resolve(obj: T | str) -> T:
    """Resolve ``"package.module:attribute"`` to the attribute; pass anything else through.

    A string resolves only under the rules of :mod:`llm_gym.core.references`: its module is in
    ``llm_gym`` or ``trainers``, trusted (:func:`trust_modules`, ``LLM_GYM_TRUSTED_MODULES``,
    ``train.py --trust-module``) or the reference is registered; ``os``, ``subprocess``,
    ``builtins`` and their kin never are.

    Raises:
        InvalidArgumentError: the string is refused (the message names the remedy), malformed,
            or names a module or attribute that is missing.

    Example:
        >>> resolve("llm_gym.core.task:Task").__name__
        'Task'
    """
    if not isinstance(obj, str):
        return obj
    return resolve_reference(obj)


# --- environments ------------------------------------------------------------------------------

_ADAPTERS: list[tuple[type, Callable[[Any], EnvFactory]]] = []


def register_env_adapter(base: type, to_factory: Callable[[Any], EnvFactory]) -> None:
    """Let :func:`as_env_factory` accept instances and subclasses of ``base``, another style of
    environment, through ``to_factory(obj) -> EnvFactory``. Registering ``base`` again replaces
    its adapter."""
    unregister_env_adapter(base)
    _ADAPTERS.append((base, to_factory))


def unregister_env_adapter(base: type) -> None:
    """Forget the adapter of ``base`` (no error when there is none)."""
    _ADAPTERS[:] = [(b, f) for b, f in _ADAPTERS if b is not base]


class SameEnv:
    """Factory that returns one environment instance for every task (picklable)."""

    def __init__(self, env: Env) -> None:
        self.env = env

    def __call__(self, task: Task) -> Env:
        return self.env


class NoArgFactory:
    """Factory that calls a class or function without the task (picklable)."""

    def __init__(self, factory: Callable[[], Env]) -> None:
        self.factory = factory

    def __call__(self, task: Task) -> Env:
        return self.factory()


def as_env_factory(env: Env | type[Env] | EnvFactory | str | Any) -> EnvFactory:
    """An env factory ``task -> Env`` from anything that names an environment (see the module
    docstring).

    Example:
        >>> from llm_gym.envs.tool_use_game import ToolUseGameEnv
        >>> type(as_env_factory(ToolUseGameEnv)(Task("q"))).__name__
        'ToolUseGameEnv'
    """
    env = resolve(env)
    for base, to_factory in _ADAPTERS:
        if isinstance(env, base) or (isinstance(env, type) and issubclass(env, base)):
            return to_factory(env)
    if isinstance(env, Env):
        return SameEnv(env)
    if isinstance(env, type):
        if not issubclass(env, Env):
            raise InvalidArgumentError(
                f"Expected an llm_gym Env subclass, actual class: {env.__qualname__}."
            )
        return NoArgFactory(env)
    if callable(env):
        try:
            takes_task = bool(inspect.signature(env).parameters)
        except (TypeError, ValueError):
            takes_task = True
        return env if takes_task else NoArgFactory(env)
    raise InvalidArgumentError(
        f"Expected an Env, an Env class, a factory task -> Env or a 'module:attr' string, "
        f"actual value: {env!r}."
    )


# --- tasks -------------------------------------------------------------------------------------


def _task_list(items: Any, where: str) -> list[Task]:
    """``items`` as a list of tasks (each through :func:`as_task`); ``where`` names them."""
    if isinstance(items, str) or not isinstance(items, Sequence):
        raise InvalidArgumentError(
            f"{where} must be a sequence of tasks, actual value: {items!r:.200}."
        )
    return [as_task(item, f"{where}[{i}]") for i, item in enumerate(items)]


class StaticTasks:
    """Task source over fixed lists (picklable)."""

    def __init__(self, by_split: Mapping[str, Sequence[Task]] | None, tasks: Sequence[Task]):
        self.by_split = (
            None
            if by_split is None
            else {k: _task_list(v, f"tasks[{k!r}]") for k, v in by_split.items()}
        )
        self.tasks = _task_list(tasks, "tasks")

    def __call__(self, split: str) -> Sequence[Task]:
        if self.by_split is None:
            return self.tasks
        if split not in self.by_split:
            raise InvalidArgumentError(
                f"No tasks for split {split!r}; available splits: {sorted(self.by_split)}."
            )
        return self.by_split[split]


def as_task_source(tasks: Any) -> TaskSource:
    """A task source ``split -> tasks`` from a sequence (the same tasks for every split), a
    mapping ``split -> tasks``, a callable or a ``"module:attr"`` string.

    Example:
        >>> as_task_source({"val": [Task("What is 2 + 2?")]})("val")[0].prompt
        'What is 2 + 2?'
    """
    tasks = resolve(tasks)
    if callable(tasks):
        return tasks
    if isinstance(tasks, Mapping):
        return StaticTasks(tasks, [])
    if isinstance(tasks, Sequence) and not isinstance(tasks, str):
        return StaticTasks(None, tasks)
    raise InvalidArgumentError(
        "Expected tasks as a sequence of Task, a mapping split -> tasks, a callable split -> "
        f"tasks or a 'module:attr' string, actual value: {tasks!r}."
    )


def with_task_options(source: TaskSource, options: Mapping[str, Any], where: str) -> TaskSource:
    """``source`` with keyword ``options`` bound (``split -> source(split, **options)``);
    a clear error when it does not take them. ``where`` names the source in the error.

    Example:
        >>> def tasks(split, world=0):
        ...     return [Task(f"{split} in world {world}")]
        >>> with_task_options(tasks, {"world": 3}, "demo")("val")[0].prompt
        'val in world 3'
    """
    if not options:
        return source
    try:
        inspect.signature(source).bind("train", **options)
    except (TypeError, ValueError):
        try:
            accepted = [p for p in inspect.signature(source).parameters][1:]
        except (TypeError, ValueError):
            accepted = []
        refused = sorted(set(options) - set(accepted)) or sorted(options)  # name only those
        raise InvalidArgumentError(
            f"The task source of {where} takes no option(s) {refused}; it accepts: "
            f"{accepted or 'none'}."
        ) from None
    return functools.partial(source, **options)


def as_task(value: Any, where: str = "task") -> Task:
    """A :class:`Task` from a Task, a prompt string, a dict or an object with ``to_task()``
    (document 002's ``TaskExample``); ``where`` names the value in the error.

    Example:
        >>> as_task({"input": "Hi", "output": 1}).target
        1
    """
    if isinstance(value, Task):
        return value
    if isinstance(value, str):
        return Task(prompt=value)
    if isinstance(value, Mapping):
        return Task.from_dict(value)
    to_task = getattr(value, "to_task", None)
    if callable(to_task):
        task = to_task()
        if isinstance(task, Task):
            return task
    raise InvalidArgumentError(
        f"{where} must be a Task, a dict with 'prompt' (or 'input'), a prompt string or an "
        f"object with to_task(), actual value: {value!r:.200}."
    )
