"""verifiers environments as llm_gym env factories and task sources: :func:`from_verifiers`
(a ``vf.Env``, a ``vf.Taskset`` or a ``vf.EnvConfig`` in, a :class:`VerifiersEnvFactory` with
its :class:`VerifiersTasks` out) and :func:`register_verifiers_env` (the same under an env id).
Importing this module registers the adapter with :func:`~llm_gym.core.factories.
register_env_adapter`, so every place that takes an environment takes a verifiers one as it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from llm_gym.aio import run_sync
from llm_gym.core.env import require_turn_limit
from llm_gym.core.factories import SPLITS, register_env_adapter
from llm_gym.core.registry import EnvEntry
from llm_gym.core.task import Task
from llm_gym.environments.factory import MultiTurnTaskSource
from llm_gym.errors import InvalidArgumentError
from llm_gym.gym.registration import register_env
from llm_gym.integrations.verifiers.env import VerifiersEnv
from llm_gym.integrations.verifiers.tools import SharedResources, ToolServer

try:
    import verifiers.v1 as vf
    from pydantic import ValidationError
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "llm_gym's verifiers integration needs verifiers>=0.4: pip install -e '.[interop]'"
    ) from exc

__all__ = [
    "VerifiersEnvFactory",
    "VerifiersTasks",
    "from_verifiers",
    "register_verifiers_env",
    "to_task",
]

DEFAULT_MAX_TURNS = 8
"""The registered turn limit when neither the call nor the seat's config gives one."""


def to_task(vf_task: Any) -> Task:
    """An llm_gym :class:`Task` for a verifiers task: the prompt's text, the task's own data
    fields (those beyond ``TaskData``'s, an ``answer`` say) as ``target``, the whole data under
    ``metadata["verifiers"]``, and the data's ``id`` (else its position) as ``id``."""
    data = vf_task.data
    dump = data.model_dump(mode="json")
    own = {k: v for k, v in dump.items() if k not in vf.TaskData.model_fields}
    ident = data.id if data.id is not None else data.idx
    return Task(
        prompt=data.prompt_text,
        target=own or None,
        metadata={"verifiers": {"type": type(vf_task).__name__, "key": vf_task.key, "data": dump}},
        id=None if ident is None else str(ident),
    )


class VerifiersEnvFactory:
    """``task -> VerifiersEnv`` over one verifiers environment, and its tasks.

    Args:
        environment: A ``vf.Env`` instance (its taskset and its ``run``), a ``vf.Taskset``
            instance (played as ``SingleAgentEnv``: one seat runs each task), or a
            ``vf.EnvConfig`` (loaded with ``vf.load_environment``).
        splits: ``{"train": view, "val": view, ...}``: taskset views per split
            (``taskset.take(100)``, ``taskset.skip(100)``); default: every split holds the
            whole (finite) taskset.
        max_turns: The seat's turn cap (verifiers' ``AgentConfig.max_turns``), overriding
            the env config's; None keeps it (a bare taskset: no cap of its own).
    """

    def __init__(
        self,
        environment: Any,
        *,
        splits: Mapping[str, Any] | None = None,
        max_turns: int | None = None,
    ) -> None:
        if isinstance(environment, vf.EnvConfig):
            environment = vf.load_environment(environment)
        if isinstance(environment, vf.Env):
            self.environment: Any = environment
            self.taskset = environment.taskset
        elif isinstance(environment, vf.Taskset):
            self.environment, self.taskset = None, environment
        else:
            kind = "class" if isinstance(environment, type) else "value"
            raise InvalidArgumentError(
                "Expected a verifiers Env or Taskset instance (or a vf.EnvConfig), actual "
                f"{kind}: {environment!r:.200}."
            )
        if max_turns is not None:
            require_turn_limit(max_turns)
        self.splits = dict(splits or {})
        for split, view in self.splits.items():
            if split not in SPLITS or not isinstance(view, vf.Taskset):
                raise InvalidArgumentError(
                    f"splits maps split names {SPLITS} to verifiers Taskset views, actual entry: "
                    f"{split!r}: {view!r:.100}."
                )
        self.max_turns_override = max_turns
        self._task_type: type | None = None
        self.agent_config = vf.AgentConfig(max_turns=max_turns)
        """The seat of a bare taskset (its ``max_turns`` is the cap)."""
        self.__qualname__ = type(self.environment or self.taskset).__name__
        self.version = None
        self._known: dict[str, Any] = {}
        self.resources = SharedResources(self.environment, self.taskset)
        """The env's ``start()``/``stop()`` and the taskset's shared tool servers, per loop."""

    @property
    def task_type(self) -> type:
        """The taskset's task class: declared (``Taskset[MyTask, ...]``), else the class of its
        first task."""
        if self._task_type is None:
            declared = type(self.taskset).task_type()
            if declared is vf.Task:
                declared = type(next(iter(self.taskset), None) or vf.Task(vf.TaskData()))
            self._task_type = declared
        return self._task_type

    @property
    def max_turns(self) -> int | None:
        """The seat's turn cap: the override, else the env config's first seat's."""
        if self.max_turns_override is not None or self.environment is None:
            return self.max_turns_override
        seats = [value for _, value in self.environment.config if isinstance(value, vf.AgentConfig)]
        return seats[0].max_turns if seats else None

    def __call__(self, task: Task) -> VerifiersEnv:
        return VerifiersEnv(self)

    def __repr__(self) -> str:
        return f"VerifiersEnvFactory({getattr(self, '__qualname__', '?')})"

    def __deepcopy__(self, memo: dict[int, Any]) -> VerifiersEnvFactory:
        return self  # one shared factory (gym.make copies its kwargs): verifiers objects stay

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_known"] = {}  # a cache (the started resources drop their own)
        return state

    # --- what VerifiersEnv reads -----------------------------------------------------------------
    def seat_config(self, config: Any) -> Any:
        """A seat's ``AgentConfig`` with the ``max_turns`` override applied."""
        if self.max_turns_override is None:
            return config
        return config.model_copy(update={"max_turns": self.max_turns_override})

    def verifiers_task(self, task: Task) -> Any:
        """The verifiers task of ``task``: the one :meth:`tasks` made it from, else rebuilt
        from ``metadata["verifiers"]["data"]``; a plain Task becomes ``{"prompt": ...,
        **target}`` (``target`` a dict of the task's data fields)."""
        info = task.metadata.get("verifiers") if isinstance(task.metadata, Mapping) else None
        if isinstance(info, Mapping) and info.get("key") in self._known:
            return self._known[info["key"]]
        if isinstance(info, Mapping) and isinstance(info.get("data"), Mapping):
            data: Any = dict(info["data"])
        else:
            target = task.target if isinstance(task.target, Mapping) else {}
            data = {"prompt": task.prompt, **target}
        data_type = self.task_type.data_type()
        try:
            return self.task_type(data_type.model_validate(data), self.taskset.config.task)
        except ValidationError as exc:
            raise InvalidArgumentError(
                f"Task {task.id!r} does not make a {data_type.__name__} for "
                f"{self.task_type.__name__}: {exc}"
            ) from None

    async def prepare(self) -> list[ToolServer]:
        """The taskset's shared tool servers, started with the env's ``start()`` once per event
        loop (and stopped when the loop shuts down; see :meth:`aclose`)."""
        return await self.resources.prepare()

    async def aclose(self) -> None:
        """Stop what :meth:`prepare` started for the running event loop (``vf.Env.stop()``,
        then the shared tool servers' teardown) and what closed loops left behind.

        ``collect_groups``, ``run_and_report`` and the trainer need none of this: each runs on
        an event loop that stops its own when it shuts down. Await it when you drive episodes
        on a loop of your own that lives on (``await collect_groups_async(...)`` in a server,
        say), once its episodes are over; the next episode starts them again.
        """
        await self.resources.aclose()

    def close(self) -> None:
        """:meth:`aclose` from synchronous code: stops what closed event loops left behind (a
        ``gym.make`` env's, say, once the env is closed); a loop still running keeps its own."""
        run_sync(self.aclose())

    # --- tasks -----------------------------------------------------------------------------------
    def tasks(self, split: str = "train") -> list[Task]:
        """The tasks of ``split`` (its view in ``splits``, else the whole taskset)."""
        if split not in SPLITS:
            raise InvalidArgumentError(f"split must be one of {SPLITS}, actual value: {split!r}.")
        view = self.splits.get(split, self.taskset)
        if not view.bounded:
            raise InvalidArgumentError(
                f"{type(self.taskset).__name__} is infinite: pass splits={{{split!r}: "
                "taskset.take(n), ...}} to bound it."
            )
        out = []
        for vf_task in view:
            self._known[vf_task.key] = vf_task
            out.append(to_task(vf_task))
        return out

    @property
    def task_source(self) -> VerifiersTasks:
        """:meth:`tasks` as a task source ``split -> tasks`` (cached per split)."""
        return VerifiersTasks(self)


class VerifiersTasks(MultiTurnTaskSource):
    """Task source ``split -> tasks`` over a :class:`VerifiersEnvFactory` (cached per split;
    document 002's task source, which only calls its factory's ``tasks(split)``)."""


def from_verifiers(
    environment: Any, *, splits: Mapping[str, Any] | None = None, max_turns: int | None = None
) -> VerifiersEnvFactory:
    """An env factory (with ``tasks(split)``) for a verifiers ``Env``, ``Taskset`` or
    ``EnvConfig``; see :class:`VerifiersEnvFactory`.

    Example:
        >>> from llm_gym.integrations.verifiers import load_environment
        >>> factory = from_verifiers(load_environment("ToolUseGame-v0", split="val", limit=2))
        >>> [task.id for task in factory.tasks("val")], factory.max_turns
        (['tool_use_game/val/0000', 'tool_use_game/val/0001'], 8)
    """
    if isinstance(environment, VerifiersEnvFactory):
        return environment
    return VerifiersEnvFactory(environment, splits=splits, max_turns=max_turns)


def register_verifiers_env(
    id: str,
    environment: Any,
    *,
    description: str = "",
    splits: Mapping[str, Any] | None = None,
    max_turns: int | None = None,
    action_format: str = "hermes",
    version: str = "0",
) -> EnvEntry:
    """Register a verifiers environment under ``id``: ``gym.make(id)``, ``run_and_report(id,
    ...)``, the CLI and the trainer's pipeline find it with its tasks. ``max_turns`` caps the
    seat (and is the registered turn limit; default: the seat's own cap, else 8)."""
    factory = from_verifiers(environment, splits=splits, max_turns=max_turns)
    return register_env(
        id,
        env=factory,
        tasks=factory.task_source,
        description=description or f"verifiers environment {factory.__qualname__}",
        action_format=action_format,
        max_turns=factory.max_turns or DEFAULT_MAX_TURNS,
        version=version,
    )


# A verifiers Env or Taskset (an instance) works wherever an env factory is accepted.
register_env_adapter(vf.Env, from_verifiers)
register_env_adapter(vf.Taskset, from_verifiers)
