"""``EnvironmentSingleTurn``: document 002's single-turn environment base class.

One prompt, one reply, one reward. Subclass it and implement ``score_response`` (and
``build_prompt_messages`` when the default opening does not fit)::

    class Arithmetic(EnvironmentSingleTurn):
        def score_response(self, example, response_text):
            return RewardResult(score=float(str(example.output) in response_text), threshold=1.0)

It runs wherever an ``EnvironmentMultiTurn`` does (``collect_groups``, ``run_and_report``,
``TextEnv`` / ``gym.make`` and the trainer) through :func:`as_multi_turn`, an
``EnvironmentMultiTurn`` view whose episode is one turn: ``start_episode`` is
``build_prompt_messages``, the first reply ends the episode, and ``score_episode`` is
``score_response(example, episode.response_text)``. An instance or subclass works wherever an
env factory is accepted (registered with :func:`~llm_gym.core.factories.register_env_adapter`);
:func:`single_turn_env_factory` and :func:`register_single_turn_env` take the same options as
``MultiTurnEnvFactory`` and ``register_multi_turn_env``.

Credit: the episode has one assistant turn, and its results carry no ``per_turn_rewards``, so
``credit_assignment="per_turn"`` falls back to episode-level credit for every group: a single-turn
run is the same run under either credit mode, whatever shapes the reward (overlong penalty,
``reward_funcs``), as document 002 says.

Hooks may be plain methods or ``async def``; the environment object is shared by every
concurrent rollout, so keep per-episode state out of its attributes.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, ClassVar

from llm_gym.core.factories import register_env_adapter, resolve, trust_reference
from llm_gym.core.registry import EnvEntry
from llm_gym.environments.factory import MultiTurnEnvFactory
from llm_gym.environments.multi_turn import (
    EnvironmentMultiTurn,
    map_limited,
    opening_messages,
    sft_target_messages,
)
from llm_gym.environments.records import (
    ChatMessage,
    EnvironmentEpisode,
    EnvironmentStepResult,
    RewardResult,
    TaskExample,
)
from llm_gym.environments.registration import register_multi_turn_env
from llm_gym.errors import InvalidArgumentError

__all__ = [
    "EnvironmentSingleTurn",
    "SingleTurnAsMultiTurn",
    "as_multi_turn",
    "register_single_turn_env",
    "single_turn_env_factory",
]


class EnvironmentSingleTurn:
    """A single-turn environment in document 002's style: ``build_prompt_messages`` gives the
    prompt, the policy replies once, ``score_response`` rewards the reply.

    Like ``EnvironmentMultiTurn``, it may carry a ``dataset`` attribute (rows with
    ``input``/``output``, ``TaskExample`` s or ``Task`` s: the registered tasks by default),
    ``tool_specs`` and a ``version``.
    """

    max_score_concurrency: ClassVar[int] = 8
    """How many ``score_response`` calls the default ``score_responses`` runs at once."""

    def build_prompt_messages(self, example: TaskExample, prompt_text: str) -> list[ChatMessage]:
        """The prompt. Default: a system message with ``prompt_text`` (when it is not empty)
        and a user message with ``example.input``."""
        return opening_messages(example, prompt_text)

    def score_response(self, example: TaskExample, response_text: str) -> RewardResult:
        """Grade one reply (a ``RewardResult``; a bare number is taken as its score)."""
        raise NotImplementedError(
            f"{type(self).__qualname__} must implement score_response(example, response_text) "
            "-> RewardResult (or override score_responses)."
        )

    def score_responses(self, example: TaskExample, responses: list[str]) -> list[RewardResult]:
        """Grade the replies of one example (a GRPO group), results in order. Default:
        ``score_response`` for each, up to :attr:`max_score_concurrency` at a time. Override it
        to grade a group in one call (a batched judge, say)."""
        return map_limited(self.score_response, example, responses, self.max_score_concurrency)

    def sft_completion(self, example: TaskExample) -> list[ChatMessage]:
        """The SFT target messages of ``example``: by default from ``example.output``, as
        ``EnvironmentMultiTurn.sft_completion`` reads it (usually one assistant message)."""
        return sft_target_messages(example)


# --- the multi-turn view --------------------------------------------------------------------


def _overrides(environment: EnvironmentSingleTurn, name: str) -> bool:
    return getattr(type(environment), name) is not getattr(EnvironmentSingleTurn, name)


def _prompt(value: Any, where: str) -> list[ChatMessage]:
    if isinstance(value, list | tuple) and all(
        isinstance(m, Mapping) and isinstance(m.get("role"), str) for m in value
    ):
        return [dict(m) for m in value]
    raise InvalidArgumentError(
        f"{where} must return a list of message dicts with a string 'role', "
        f"actual value: {value!r:.200}."
    )


def _reward(value: Any, where: str) -> RewardResult:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return RewardResult(score=float(value))
    if not isinstance(value, RewardResult):
        raise InvalidArgumentError(
            f"{where} must return a RewardResult, actual value: {value!r:.200}."
        )
    if "per_turn_rewards" in value.metadata:
        warnings.warn(
            f"{where}: per_turn_rewards ignored; a single-turn episode has one turn, and its "
            "credit is the episode's under either credit_assignment.",
            stacklevel=2,
        )
        metadata = {k: v for k, v in value.metadata.items() if k != "per_turn_rewards"}
        value = RewardResult(score=value.score, threshold=value.threshold, metadata=metadata)
    return value


def _rewards(value: Any, where: str, count: int) -> list[RewardResult]:
    if not isinstance(value, Sequence) or isinstance(value, str) or len(value) != count:
        raise InvalidArgumentError(
            f"{where} must return a list of {count} RewardResults (one per response), "
            f"actual value: {value!r:.200}."
        )
    return [_reward(item, where) for item in value]


async def _checked(awaitable: Awaitable[Any], check: Callable[[Any], Any]) -> Any:
    return check(await awaitable)


def _call(hook: Callable[..., Any], check: Callable[[Any], Any], *args: Any) -> Any:
    """``check(hook(*args))``; for an ``async def`` hook, an awaitable of it."""
    result = hook(*args)
    if inspect.isawaitable(result):
        return _checked(result, check)
    return check(result)


class SingleTurnAsMultiTurn(EnvironmentMultiTurn):
    """An :class:`EnvironmentSingleTurn` as a one-turn :class:`EnvironmentMultiTurn` (build it
    with :func:`as_multi_turn`).

    ``start_episode`` is ``build_prompt_messages``; ``max_episode_turns`` is 1; ``step_episode``
    ends the episode with the reply as ``final_response_text``; ``score_episode`` is
    ``score_response(example, episode.response_text)``. An overridden ``score_responses`` is
    what ``score_episodes`` calls (one call per group); otherwise groups are scored with
    ``score_response`` per reply, as ``EnvironmentMultiTurn`` scores with ``score_episode``.
    ``dataset``, ``tool_specs``, ``version`` and ``max_score_concurrency`` are the wrapped
    environment's; return values are checked, naming the single-turn hook.
    """

    def __init__(self, environment: EnvironmentSingleTurn) -> None:
        if not isinstance(environment, EnvironmentSingleTurn):
            raise InvalidArgumentError(
                f"Expected an EnvironmentSingleTurn instance, actual value: {environment!r:.200}."
            )
        self.environment = environment
        """The single-turn environment."""
        self._name = type(environment).__qualname__
        if inspect.iscoroutinefunction(environment.score_response):
            # Callers that check (the default score_episodes) then await it.
            self.score_episode = self._score_episode_async  # type: ignore[method-assign]

    def __repr__(self) -> str:
        return f"as_multi_turn({self.environment!r})"

    @property
    def dataset(self) -> Any:
        """The wrapped environment's ``dataset`` (None when it has none)."""
        return getattr(self.environment, "dataset", None)

    @property
    def tool_specs(self) -> Any:
        """The wrapped environment's ``tool_specs`` (None when it has none)."""
        return getattr(self.environment, "tool_specs", None)

    @property
    def version(self) -> Any:
        """The wrapped environment's ``version`` (None when it has none)."""
        return getattr(self.environment, "version", None)

    @property  # type: ignore[override]
    def max_score_concurrency(self) -> int:  # type: ignore[override]
        """The wrapped environment's ``max_score_concurrency``."""
        return self.environment.max_score_concurrency

    def _hook(self, name: str, check: Callable[[Any, str], Any], *args: Any) -> Any:
        """The single-turn hook ``name`` called with ``args``, its value checked (an awaitable
        of the checked value for an ``async def`` hook)."""
        where = f"{self._name}.{name}"
        return _call(getattr(self.environment, name), lambda value: check(value, where), *args)

    def start_episode(self, example: TaskExample, prompt_text: str) -> Any:
        return self._hook("build_prompt_messages", _prompt, example, prompt_text)

    def max_episode_turns(self, example: TaskExample) -> int:
        return 1

    def step_episode(
        self, example: TaskExample, messages: list[ChatMessage], assistant_response: str
    ) -> EnvironmentStepResult:
        return EnvironmentStepResult(done=True, final_response_text=assistant_response)

    def score_episode(self, example: TaskExample, episode: EnvironmentEpisode) -> Any:
        return self._hook("score_response", _reward, example, episode.response_text)

    async def _score_episode_async(
        self, example: TaskExample, episode: EnvironmentEpisode
    ) -> RewardResult:
        return await SingleTurnAsMultiTurn.score_episode(self, example, episode)

    def sft_completion(self, example: TaskExample) -> list[ChatMessage]:
        return self.environment.sft_completion(example)


class _BatchScored(SingleTurnAsMultiTurn):
    """The view of an environment that overrides ``score_responses``: groups are scored by it."""

    def score_episodes(self, example: TaskExample, episodes: list[EnvironmentEpisode]) -> Any:
        check = functools.partial(_rewards, count=len(episodes))
        return self._hook("score_responses", check, example, [e.response_text for e in episodes])


def as_multi_turn(environment: EnvironmentSingleTurn) -> SingleTurnAsMultiTurn:
    """``environment`` as a one-turn :class:`EnvironmentMultiTurn` (see
    :class:`SingleTurnAsMultiTurn`), for code that takes one: ``MultiTurnEnvFactory``,
    ``sft_messages``, ``trainers.sft_dataset_from_multi_turn``."""
    if isinstance(environment, EnvironmentSingleTurn) and _overrides(
        environment, "score_responses"
    ):
        return _BatchScored(environment)
    return SingleTurnAsMultiTurn(environment)


# --- wherever an env factory is accepted ----------------------------------------------------


class SingleTurnLoader:
    """``(**kwargs) -> as_multi_turn(environment)``: what ``MultiTurnEnvFactory`` builds its
    shared environment with (lazily; picklable and comparable, so registrations compare).

    ``environment`` is an ``EnvironmentSingleTurn`` instance, a subclass, a function returning
    one, or a ``"module:attr"`` string naming any of these. The loader takes the keyword
    arguments its target takes (``inspect.signature`` follows ``__wrapped__``), so
    ``MultiTurnEnvFactory`` passes ``split=`` exactly when the class or function accepts it.
    """

    def __init__(self, environment: Any) -> None:
        if not (isinstance(environment, str | EnvironmentSingleTurn) or callable(environment)):
            raise InvalidArgumentError(
                "environment must be an EnvironmentSingleTurn, a subclass, a function returning "
                f"one, or a 'module:attr' string, actual value: {environment!r:.200}."
            )
        self.environment = environment
        if isinstance(environment, str):
            self.__qualname__ = environment.rsplit(":", 1)[-1]
        elif isinstance(environment, EnvironmentSingleTurn):
            self.__qualname__ = type(environment).__qualname__
        else:
            self.__qualname__ = getattr(environment, "__qualname__", type(environment).__name__)
        self.version = getattr(environment, "version", None)

    @property
    def __wrapped__(self) -> Any:
        return resolve(self.environment)

    def __call__(self, **kwargs: Any) -> SingleTurnAsMultiTurn:
        target = resolve(self.environment)
        if isinstance(target, EnvironmentSingleTurn):
            if kwargs:
                raise InvalidArgumentError(
                    f"environment_kwargs need a class or a function; {self.__qualname__} is an "
                    f"instance and is used as it is, actual kwargs: {sorted(kwargs)}."
                )
            return as_multi_turn(target)
        if not callable(target):
            raise InvalidArgumentError(
                f"{self.environment!r} is neither an EnvironmentSingleTurn nor callable."
            )
        built = target(**kwargs)
        if not isinstance(built, EnvironmentSingleTurn):
            raise InvalidArgumentError(
                f"{self.__qualname__}(...) must return an EnvironmentSingleTurn, actual value: "
                f"{built!r:.200}."
            )
        return as_multi_turn(built)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SingleTurnLoader):
            return NotImplemented
        return self.environment == other.environment

    def __hash__(self) -> int:
        return hash((type(self), repr(self.environment)))

    def __repr__(self) -> str:
        return f"SingleTurnLoader({self.environment!r})"


def _loader(environment: Any, environment_kwargs: Mapping[str, Any] | None) -> SingleTurnLoader:
    if isinstance(environment, EnvironmentSingleTurn) and environment_kwargs:
        raise InvalidArgumentError(
            "environment_kwargs need a class or a function; an instance is used as it is."
        )
    return SingleTurnLoader(environment)


def single_turn_env_factory(
    environment: Any,
    *,
    environment_kwargs: Mapping[str, Any] | None = None,
    **options: Any,
) -> MultiTurnEnvFactory:
    """An env factory ``task -> Env`` over a single-turn environment: a
    :class:`~llm_gym.environments.MultiTurnEnvFactory` over its :func:`as_multi_turn` view.

    Args:
        environment: An ``EnvironmentSingleTurn`` instance, a subclass, a ``load_environment``
            -style function returning one, or a ``"module:attr"`` string naming either.
            Classes and functions are called once, lazily, with ``environment_kwargs`` (plus
            ``split=`` when they accept it).
        environment_kwargs: Keyword arguments for the class or function.
        **options: ``MultiTurnEnvFactory``'s: ``prompt_text`` (passed to
            ``build_prompt_messages``), ``split``, ``offload_hooks`` (synchronous hooks in
            worker threads) and ``batch_scoring`` (the replies of a group scored together,
            by ``score_responses`` when it is overridden; False: one call per reply).

    Example:
        >>> class Echo(EnvironmentSingleTurn):
        ...     def score_response(self, example, response_text):
        ...         return RewardResult(score=float(response_text == example.input))
        >>> factory = single_turn_env_factory(Echo, prompt_text="Repeat after me.")
        >>> type(factory.environment_for()).__name__
        'SingleTurnAsMultiTurn'
    """
    loader = _loader(environment, environment_kwargs)
    return MultiTurnEnvFactory(loader, environment_kwargs=environment_kwargs, **options)


def register_single_turn_env(
    id: str,
    environment: Any,
    *,
    environment_kwargs: Mapping[str, Any] | None = None,
    max_turns: int = 1,
    **kwargs: Any,
) -> EnvEntry:
    """Register an :class:`EnvironmentSingleTurn` with gymnasium, as
    :func:`~llm_gym.environments.register_multi_turn_env` does a multi-turn one.

    ``gym.make(id)`` then gives a ``TextEnv`` whose first ``step(reply)`` ends the episode with
    ``reward = score``; ``id`` works in ``run_and_report``, ``llm-gym eval`` and the trainer.

    Args:
        id: The gymnasium id, ``Name-vN``.
        environment: ``"package.module:load_environment"`` (preferred: nothing is imported
            until first use), an ``EnvironmentSingleTurn`` subclass or instance, or a
            ``load_environment``-style function (called with ``split=`` when it accepts it).
        environment_kwargs: Extra keyword arguments for the class or function.
        max_turns: The loop's turn limit (the first reply ends the episode anyway).
        **kwargs: ``register_multi_turn_env``'s other arguments: ``tasks`` (default: the
            environment's ``dataset``, read per split), ``prompt_text``, ``description``,
            ``version``, ``offload_hooks``, ``batch_scoring`` and ``TextEnv`` keyword arguments.

    Example::

        register_single_turn_env("MyQA-v0", "my_package.environment:load_environment")
    """
    loader = _loader(environment, environment_kwargs)
    trust_reference(environment)  # registered from Python: resolves without trusting its module
    return register_multi_turn_env(
        id, loader, environment_kwargs=environment_kwargs, max_turns=max_turns, **kwargs
    )


# An EnvironmentSingleTurn (instance or subclass) works wherever an env factory is accepted.
register_env_adapter(EnvironmentSingleTurn, single_turn_env_factory)
