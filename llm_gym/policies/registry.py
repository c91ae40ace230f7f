"""The policy registry: every generation backend by name, and ``policy_from_spec``.

A *spec* names a backend and, after a colon, its argument: ``oracle``, ``random:3``,
``hf:path/to/model``, ``openai:MODEL@URL``. The command line, the evaluator, the leaderboard and the
trainer create policies only through :func:`policy_from_spec`, so adding a backend is one call::

    register_policy("mine", "my_package.policy:MyPolicy", usage="mine:ARG")

The target is a ``"module:attr"`` string (nothing is imported until the backend is used) naming a
:class:`~llm_gym.policies.base.Policy` subclass; its classmethod ``from_spec(argument, **options)``
builds it (the default passes the options to the constructor and takes no argument).

Example:
    >>> policy_from_spec("random:3").seed
    3
    >>> try:
    ...     policy_from_spec("randm")
    ... except KeyError as error:
    ...     print(str(error).split(" Registered")[0])
    Unknown policy kind 'randm' in spec 'randm'. Did you mean 'random'?
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

from llm_gym.core.factories import resolve, trust_reference
from llm_gym.errors import InvalidArgumentError, UnknownNameError, did_you_mean
from llm_gym.policies.base import Policy

__all__ = [
    "PolicyBackend",
    "policy_backend",
    "policy_from_spec",
    "register_policy",
    "registered_policies",
    "unregister_policy",
]


@dataclass(frozen=True)
class PolicyBackend:
    """One registered generation backend."""

    kind: str
    """The name a spec starts with (``"hf"`` in ``"hf:PATH"``)."""
    target: str
    """``"module:attr"`` of the :class:`Policy` subclass (imported on first use)."""
    usage: str
    """How a spec for it is written, for help and error messages (``"hf:PATH"``)."""
    description: str = ""
    """One line: what it generates with."""
    scripted: bool = False
    """True: a scripted policy (no model, no sampling settings, cheap to build); False: it
    samples from a model."""

    def load(self) -> type[Policy]:
        """The policy class (imports its module)."""
        cls = resolve(self.target)
        if not (isinstance(cls, type) and issubclass(cls, Policy)):
            raise InvalidArgumentError(
                f"Policy backend {self.kind!r} points at {self.target!r}, which is not a Policy "
                f"subclass (actual value: {cls!r})."
            )
        return cls


_BACKENDS: dict[str, PolicyBackend] = {}


def register_policy(
    kind: str,
    target: str,
    *,
    usage: str | None = None,
    description: str = "",
    scripted: bool = False,
) -> PolicyBackend:
    """Register a backend under ``kind``. Registering the same kind twice with the same target is
    a no-op; with another target it raises.

    Args:
        kind: A short name: letters, digits, ``_`` and ``-`` (no colon).
        target: ``"module:attr"`` of a :class:`Policy` subclass.
        usage: How its spec is written (default: ``kind``).
        description: One line for help texts.
        scripted: True for a scripted policy that samples from no model.
    """
    if not isinstance(kind, str) or not kind.replace("_", "").replace("-", "").isalnum():
        raise InvalidArgumentError(
            f"Expected a policy kind of letters, digits, '_' or '-', actual value: {kind!r}."
        )
    if not isinstance(target, str) or ":" not in target:
        raise InvalidArgumentError(
            f"Expected the backend as a 'module:attr' string, actual value: {target!r}."
        )
    backend = PolicyBackend(kind, target, usage or kind, description, scripted)
    previous = _BACKENDS.get(kind)
    if previous == backend:
        return previous
    if previous is not None:
        raise InvalidArgumentError(
            f"Policy kind {kind!r} is already registered ({previous}); pick another kind, or "
            "unregister_policy it first."
        )
    trust_reference(target)  # Python code registered it: it resolves without trusting its module
    _BACKENDS[kind] = backend
    return backend


def unregister_policy(kind: str) -> None:
    """Forget the backend registered as ``kind`` (no error when there is none)."""
    _BACKENDS.pop(kind, None)


def registered_policies() -> list[PolicyBackend]:
    """Every registered backend, sorted by kind."""
    return [_BACKENDS[kind] for kind in sorted(_BACKENDS)]


def _known() -> str:
    return ", ".join(b.usage for b in registered_policies())


def policy_backend(kind: str) -> PolicyBackend:
    """The backend registered as ``kind``; an unknown kind suggests the closest one."""
    if kind in _BACKENDS:
        return _BACKENDS[kind]
    hint = did_you_mean(kind, _BACKENDS)
    raise UnknownNameError(f"Unknown policy kind {kind!r}.{hint} Registered: {_known()}.")


def _signature(cls: type[Policy]) -> inspect.Signature:
    """What a backend's spec takes: its ``from_spec``, or its constructor when it keeps the
    default ``from_spec`` (which passes the options on)."""
    if getattr(cls.from_spec, "__func__", None) is Policy.from_spec.__func__:
        constructor = inspect.signature(cls)
        argument = inspect.Parameter("argument", inspect.Parameter.POSITIONAL_ONLY, default="")
        return constructor.replace(parameters=[argument, *constructor.parameters.values()])
    return inspect.signature(cls.from_spec)


def policy_from_spec(spec: str | Policy, **options: Any) -> Policy:
    """Build a policy from a spec (a :class:`Policy` passes through unchanged).

    Args:
        spec: ``KIND`` or ``KIND:ARGUMENT`` (see :func:`registered_policies`).
        **options: Keyword arguments for the backend (``temperature``, ...); an option it does
            not take is refused by name. ``seed`` is offered to every backend and dropped for
            one that takes none (it is deterministic, or seeds itself).
    """
    if isinstance(spec, Policy):
        if options:
            raise InvalidArgumentError(
                f"Options {sorted(options)} apply to a spec, not to a policy object "
                f"({type(spec).__name__}): set them when you build it."
            )
        return spec
    if not isinstance(spec, str) or not spec:
        raise InvalidArgumentError(
            f"Expected a policy or a spec string such as 'random' or 'hf:PATH', actual value: "
            f"{spec!r}."
        )
    kind, _, argument = spec.partition(":")
    if kind not in _BACKENDS:
        hint = did_you_mean(kind, _BACKENDS)
        raise UnknownNameError(
            f"Unknown policy kind {kind!r} in spec {spec!r}.{hint} Registered: {_known()}."
        )
    cls = _BACKENDS[kind].load()
    signature = _signature(cls)
    takes_any = any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())
    if "seed" in options and "seed" not in signature.parameters and not takes_any:
        options = {k: v for k, v in options.items() if k != "seed"}
    try:
        signature.bind(argument, **options)
    except TypeError as exc:
        raise InvalidArgumentError(
            f"Policy {spec!r} ({cls.__name__}) does not take these options: {exc}. What it "
            f"takes: {signature}."
        ) from None
    return cls.from_spec(argument, **options)


# The built-in backends. Each line is the whole registration: a new backend adds one.
register_policy(
    "oracle",
    "llm_gym.policies.scripted:OraclePolicy",
    description="the environment's scripted expert",
    scripted=True,
)
register_policy(
    "random",
    "llm_gym.policies.scripted:RandomPolicy",
    usage="random[:SEED]",
    description="random well-formed tool calls or short replies (a floor)",
    scripted=True,
)
register_policy(
    "hf",
    "llm_gym.policies.hf:HFPolicy",
    usage="hf:PATH",
    description="a transformers model: a local folder or hub id, or a model object (trainer)",
)
register_policy(
    "openai",
    "llm_gym.policies.openai:OpenAIPolicy",
    usage="openai:MODEL@URL",
    description="any OpenAI-compatible chat-completions endpoint",
)
register_policy(
    "vllm",
    "llm_gym.policies.vllm:VLLMPolicy",
    description="TRL's vLLM generation (server or colocate mode), inside the trainer",
)
