"""The catalogue of registered environments: one :class:`EnvEntry` per id.

:func:`llm_gym.gym.register_env` fills it (and registers the id with gymnasium); everything that
takes an env id (the evaluator, the trainer's pipeline, the tiny model's corpus, the leaderboard,
``llm-gym list``) reads the entry here and asks it for the resolved pieces. An entry resolves its
``"module:attr"`` strings once, on first use, and keeps the result, so a run resolves an id once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from llm_gym.core.env import DEFAULT_MAX_TOKENS_PER_TURN, declared_token_budget
from llm_gym.core.factories import (
    SPLITS,
    EnvFactory,
    Oracle,
    TaskSource,
    as_env_factory,
    as_task_source,
    resolve,
    trust_reference,
    with_task_options,
)
from llm_gym.core.task import Task
from llm_gym.errors import InvalidArgumentError, UnknownNameError, did_you_mean

__all__ = [
    "EnvEntry",
    "add_env_entry",
    "as_env_entry",
    "entry_of_factory",
    "env_entry",
    "registered_envs",
    "remove_env_entry",
]


@dataclass(frozen=True)
class EnvEntry:
    """One registered environment: what ``llm-gym list`` shows and what a run resolves."""

    id: str
    """The gymnasium id, ``Name-vN``."""
    description: str
    """One line: what the agent has to do."""
    env_spec: Any
    """The environment as registered: an Env class, a factory, or ``"module:attr"``."""
    tasks_spec: Any
    """The task source as registered (``"module:attr"`` of ``split -> tasks``, or the tasks)."""
    version: str | None
    """The environment's version; every record written about it carries it."""
    oracle_spec: str | Callable[..., Any] | None
    """The scripted expert as registered, if any."""
    make_kwargs: dict[str, Any]
    """The keyword arguments ``gym.make`` passes to ``TextEnv``."""
    max_tokens_per_turn: int | None = None
    """Tokens one assistant turn may sample, as registered; None: what the env declares
    (:attr:`~llm_gym.core.Env.max_tokens_per_turn`). See :meth:`token_budget`."""
    action_format_pinned: bool = False
    """The registered :attr:`action_format` is the only one the env reads (a model policy's
    episodes use it whatever its chat template teaches); False: it is the env's default, for
    a policy whose template teaches none. See :attr:`requested_action_format`."""

    def __post_init__(self) -> None:
        budget = self.max_tokens_per_turn
        if budget is not None and (
            isinstance(budget, bool) or not isinstance(budget, int) or budget < 1
        ):
            raise InvalidArgumentError(
                f"{self.id}: max_tokens_per_turn must be None (the env's own budget) or an int "
                f">= 1 (tokens one assistant turn may sample), actual value: {budget!r}."
            )
        # What the entry resolved, kept beside its fields (not one: equality, asdict and repr
        # see only what was registered).
        object.__setattr__(self, "_resolved", {})
        object.__setattr__(self, "_lock", threading.RLock())

    @property
    def max_turns(self) -> int:
        """The registered turn limit of an episode."""
        return int(self.make_kwargs["max_turns"])

    @property
    def action_format(self) -> str:
        """The registered action format's name."""
        return str(self.make_kwargs["action_format"])

    @property
    def requested_action_format(self) -> str:
        """What a run asks for when its user names no format: :attr:`action_format` when the
        env pins it, else ``"auto"`` (the format the policy's chat template teaches, else
        :attr:`action_format`: :func:`~llm_gym.policies.template_format.episode_format`).

        Example:
            >>> env_entry("ToolUseGame-v0").requested_action_format
            'auto'
        """
        return self.action_format if self.action_format_pinned else "auto"

    def token_budget(self) -> tuple[int, str]:
        """The per-turn token budget of an evaluation that sets none, and where it comes from:
        ``"registration"`` (:attr:`max_tokens_per_turn`), ``"env"`` (the env class, or factory,
        declares ``max_tokens_per_turn``) or ``"default"``
        (:data:`~llm_gym.core.env.DEFAULT_MAX_TOKENS_PER_TURN`). Resolved once.

        Example:
            >>> env_entry("GuessNumber-v0").token_budget()
            (16, 'env')

        Raises:
            InvalidArgumentError: the registered or declared budget is not an int >= 1.
        """
        if self.max_tokens_per_turn is not None:
            return self.max_tokens_per_turn, "registration"
        declared = self._once("budget", lambda: declared_token_budget(resolve(self.env_spec)))
        return (DEFAULT_MAX_TOKENS_PER_TURN, "default") if declared is None else (declared, "env")

    def _once(self, key: str, make: Callable[[], Any]) -> Any:
        with self._lock:
            if key not in self._resolved:
                self._resolved[key] = make()
            return self._resolved[key]

    def env_factory(self) -> EnvFactory:
        """The environment as a factory ``task -> Env`` (resolved once)."""
        return self._once("env", lambda: as_env_factory(self.env_spec))

    def task_source(self) -> TaskSource:
        """The task source ``split -> tasks`` (resolved once)."""
        return self._once("tasks", lambda: as_task_source(self.tasks_spec))

    def oracle(self) -> Oracle | None:
        """The scripted expert ``(task, messages) -> Message``, or None (resolved once)."""
        spec = self.oracle_spec
        return None if spec is None else self._once("oracle", lambda: resolve(spec))

    def tasks(self, split: str, **options: Any) -> list[Task]:
        """The tasks of ``split`` (``"train"``, ``"val"`` or ``"test"``), built once per split
        and options; ``options`` go to a callable task source as keywords (ToolUseGame's
        ``world_seed``, for example)."""
        if split not in SPLITS:
            raise InvalidArgumentError(f"split must be one of {SPLITS}, actual value: {split!r}.")
        if self.tasks_spec is None:
            raise InvalidArgumentError(
                f"{self.id} has no registered tasks: pass tasks=..., or pass a registered env id "
                "(e.g. 'ToolUseGame-v0') to use its tasks."
            )
        if not options:
            return list(self._once(f"tasks/{split}", lambda: tuple(self.task_source()(split))))
        source = with_task_options(self.task_source(), options, where=self.id)
        try:
            key = f"tasks/{split}/{sorted(options.items())!r}"
        except ValueError:  # a value that cannot be written (an int of 5,000 digits): not cached
            return list(source(split))
        return list(self._once(key, lambda: tuple(source(split))))

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("_resolved", "_lock")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.__post_init__()


_CATALOGUE: dict[str, EnvEntry] = {}


def add_env_entry(entry: EnvEntry) -> EnvEntry:
    """Add ``entry`` to the catalogue. The same id again with equal settings returns the entry
    already there; with other settings it raises (pick a new version). Its ``"module:attr"``
    strings become registered references (:func:`~llm_gym.core.factories.trust_reference`):
    Python code named them, so they resolve without their module being trusted."""
    previous = _CATALOGUE.get(entry.id)
    if previous is not None:
        if previous == entry:
            return previous
        name, _, version = entry.id.rpartition("-v")
        suggestion = f"{name}-v{int(version) + 1}" if version.isdigit() else f"{entry.id}2"
        raise InvalidArgumentError(
            f"{entry.id!r} is already registered with other settings; pick a new version, e.g. "
            f"{suggestion}."
        )
    for spec in (entry.env_spec, entry.tasks_spec, entry.oracle_spec):
        trust_reference(spec)
    _CATALOGUE[entry.id] = entry
    return entry


def remove_env_entry(env_id: str) -> EnvEntry | None:
    """Take ``env_id`` out of the catalogue (tests, notebooks); the entry, or None."""
    return _CATALOGUE.pop(env_id, None)


def registered_envs() -> list[EnvEntry]:
    """Every registered environment, sorted by id."""
    return [_CATALOGUE[k] for k in sorted(_CATALOGUE)]


def as_env_entry(env: Any) -> EnvEntry:
    """The entry of a registered id, an entry itself, or, for an environment that is not
    registered (an Env class, a factory, ``"module:attr"``), an unregistered entry around it:
    no tasks, no oracle, the default turn limit (8) and action format (hermes).

    Example:
        >>> as_env_entry("ToolUseGame-v0") is env_entry("ToolUseGame-v0")
        True
    """
    if isinstance(env, EnvEntry):
        return env
    if isinstance(env, str) and ":" not in env:
        return env_entry(env)
    name = env if isinstance(env, str) else getattr(env, "__qualname__", None)
    return EnvEntry(
        id=name or type(env).__name__,
        description="",
        env_spec=env,
        tasks_spec=None,
        version=getattr(env, "version", None),
        oracle_spec=None,
        make_kwargs={"max_turns": 8, "action_format": "hermes"},
    )


def env_entry(env_id: str) -> EnvEntry:
    """The catalogue entry of ``env_id``; an unknown id suggests the closest registered one.

    Example:
        >>> env_entry("ToolUseGame-v0").max_turns
        8
    """
    if env_id in _CATALOGUE:
        return _CATALOGUE[env_id]
    raise UnknownNameError(
        f"No llm_gym environment {env_id!r}.{did_you_mean(env_id, _CATALOGUE)} "
        f"Registered: {sorted(_CATALOGUE)}."
    )


def entry_of_factory(factory: Any) -> EnvEntry | None:
    """The registered entry whose :meth:`EnvEntry.env_factory` returned ``factory`` (the factory
    ``train.py`` trains with, say), or None; entries whose factory was never built are skipped,
    so nothing is resolved here.

    Example:
        >>> entry_of_factory(env_entry("GuessNumber-v0").env_factory()).id
        'GuessNumber-v0'
    """
    for entry in _CATALOGUE.values():
        with entry._lock:
            if entry._resolved.get("env") is factory:
                return entry
    return None
