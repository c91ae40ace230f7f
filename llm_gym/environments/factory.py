"""``MultiTurnEnvFactory``: document-002 environments wherever llm_gym takes an env factory.

:class:`MultiTurnEnvFactory` builds :class:`~llm_gym.environments.adapter.MultiTurnEnvAdapter` s
that share one environment object (document 002's environments are stateless and shared by
concurrent rollouts); the rollout loop scores each GRPO group with one ``score_episodes`` call
once all its episodes have ended. :class:`MultiTurnTaskSource` reads the tasks from
the environment's ``dataset``. Importing this module registers the factory with
:func:`~llm_gym.core.factories.register_env_adapter`, so an ``EnvironmentMultiTurn`` instance or
subclass works wherever an env factory is accepted.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable, Mapping
from typing import Any

from llm_gym.core.factories import as_task, register_env_adapter, resolve
from llm_gym.core.task import Task
from llm_gym.environments.adapter import MultiTurnEnvAdapter
from llm_gym.environments.multi_turn import EnvironmentMultiTurn
from llm_gym.errors import InvalidArgumentError

__all__ = ["MultiTurnEnvFactory", "MultiTurnTaskSource"]


def _accepts(fn: Callable[..., Any], name: str) -> bool:
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def _describe(environment: Any) -> str:
    if isinstance(environment, str):
        return environment.rsplit(":", 1)[-1]
    if isinstance(environment, EnvironmentMultiTurn):
        return type(environment).__qualname__
    return getattr(environment, "__qualname__", None) or type(environment).__name__


class MultiTurnEnvFactory:
    """``task -> MultiTurnEnvAdapter`` over one shared :class:`EnvironmentMultiTurn`.

    Args:
        environment: An ``EnvironmentMultiTurn`` instance, a subclass, a ``load_environment``-style
            function returning one, or a ``"module:attr"`` string naming either. Classes and
            functions are called once, lazily, with ``environment_kwargs`` (plus ``split=`` when
            they accept it).
        prompt_text: Passed to ``start_episode``.
        split: The split the environment is built for.
        environment_kwargs: Keyword arguments for the class or function.
        offload_hooks: Run synchronous hooks in worker threads (see :class:`MultiTurnEnvAdapter`).
        batch_scoring: Score each GRPO group, once all its episodes have ended, with one
            ``score_episodes`` call (document 002's group scoring); False: one call per episode.

    Picklable and comparable (registration compares entries), so it can be a ``gym.make`` kwarg.
    """

    def __init__(
        self,
        environment: Any,
        *,
        prompt_text: str = "",
        split: str = "train",
        environment_kwargs: Mapping[str, Any] | None = None,
        offload_hooks: bool = False,
        batch_scoring: bool = True,
    ) -> None:
        if not (isinstance(environment, str | EnvironmentMultiTurn) or callable(environment)):
            raise InvalidArgumentError(
                "environment must be an EnvironmentMultiTurn, a subclass, a function returning "
                f"one, or a 'module:attr' string, actual value: {environment!r:.200}."
            )
        if isinstance(environment, EnvironmentMultiTurn) and environment_kwargs:
            raise InvalidArgumentError(
                "environment_kwargs need a class or a function; an instance is used as it is."
            )
        self.environment = environment
        self.prompt_text = prompt_text
        self.split = split
        self.environment_kwargs = dict(environment_kwargs or {})
        self.offload_hooks = bool(offload_hooks)
        self.batch_scoring = bool(batch_scoring)
        self.__qualname__ = _describe(environment)
        self.version = getattr(environment, "version", None)
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._lock = threading.Lock()
        self._instances: dict[str, EnvironmentMultiTurn] = {}

    def _key(self) -> tuple[Any, ...]:
        kwargs = tuple(sorted(self.environment_kwargs.items(), key=lambda kv: kv[0]))
        return (self.environment, self.prompt_text, self.split, kwargs, self.offload_hooks,
                self.batch_scoring)  # fmt: skip

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MultiTurnEnvFactory):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash((type(self), repr(self.environment), self.prompt_text, self.split))

    def __repr__(self) -> str:
        return f"MultiTurnEnvFactory({self.environment!r}, prompt_text={self.prompt_text!r})"

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for key in ("_lock", "_instances"):
            state.pop(key, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_runtime()

    def environment_for(self, split: str | None = None) -> EnvironmentMultiTurn:
        """The shared environment object built for ``split`` (default: :attr:`split`)."""
        split = self.split if split is None else split
        with self._lock:
            if split not in self._instances:
                self._instances[split] = self._build(split)
            return self._instances[split]

    def _build(self, split: str) -> EnvironmentMultiTurn:
        target = resolve(self.environment)
        if isinstance(target, EnvironmentMultiTurn):
            return target
        if not callable(target):
            raise InvalidArgumentError(
                f"{self.environment!r} is neither an EnvironmentMultiTurn nor callable."
            )
        kwargs = dict(self.environment_kwargs)
        if _accepts(target, "split"):
            kwargs.setdefault("split", split)
        built = target(**kwargs)
        if not isinstance(built, EnvironmentMultiTurn):
            raise InvalidArgumentError(
                f"{_describe(target)}(...) must return an EnvironmentMultiTurn, actual value: "
                f"{built!r:.200}."
            )
        return built

    def __call__(self, task: Task) -> MultiTurnEnvAdapter:
        return MultiTurnEnvAdapter(
            self.environment_for(),
            self.prompt_text,
            offload_hooks=self.offload_hooks,
            group_scoring=self.batch_scoring,
        )

    def tasks(self, split: str | None = None) -> list[Task]:
        """The environment's own dataset (its ``dataset`` attribute) for ``split``, as Tasks."""
        environment = self.environment_for(split)
        dataset = getattr(environment, "dataset", None)
        if dataset is None:
            raise InvalidArgumentError(
                f"{type(environment).__qualname__} has no 'dataset' attribute; pass tasks=... ."
            )
        return [as_task(row) for row in dataset]


class MultiTurnTaskSource:
    """``split -> tasks`` read from a document-002 environment's ``dataset`` (cached per split)."""

    def __init__(self, factory: MultiTurnEnvFactory) -> None:
        self.factory = factory
        self._cache: dict[str, list[Task]] = {}

    def __call__(self, split: str) -> list[Task]:
        if split not in self._cache:
            self._cache[split] = self.factory.tasks(split)
        return self._cache[split]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MultiTurnTaskSource):
            return NotImplemented
        return self.factory == other.factory

    def __hash__(self) -> int:
        return hash((type(self), self.factory))

    def __getstate__(self) -> dict[str, Any]:
        return {"factory": self.factory, "_cache": {}}


# An EnvironmentMultiTurn (instance or subclass) works wherever an env factory is accepted.
register_env_adapter(EnvironmentMultiTurn, MultiTurnEnvFactory)
