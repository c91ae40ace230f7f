"""Which ``"module:attr"`` references resolve: the project's packages, the references a registry
holds and the modules the user trusts; never the modules that reach the interpreter, processes,
files or the network.

A reference in a config file or on a command line is data, yet resolving it imports a module and
hands back one of its attributes, which the caller then calls (``sft.oracle``, an env given as
``"module:attr"``, a task source). So :func:`resolve_reference` resolves a reference only when
its module is

* in ``llm_gym`` or ``trainers`` (:data:`PROJECT_MODULES`);
* under a prefix the user trusts: :func:`trust_modules` (``trust_modules("my_pkg")``), the
  environment variable :data:`TRUSTED_MODULES_ENV` (``LLM_GYM_TRUSTED_MODULES=my_pkg,other``,
  read on every resolution, so child processes inherit it) or ``train.py --trust-module my_pkg``;
* or the reference is one a registry holds (``register_env``, ``register_policy``,
  ``register_multi_turn_env``...): Python code put it there (:func:`trust_reference`).

A prefix covers the module of that name and its submodules (``my_pkg`` covers ``my_pkg.envs``,
not ``my_pkg_extra``); ``"*"`` (or ``""``) covers every module. Whatever is trusted, the modules of
:data:`REFUSED_MODULES` (``builtins``, ``os``, ``subprocess``, ``sys``, ``importlib``, ...), their
submodules and their ``_``-prefixed twins (``_pickle``) are refused. The attribute path after the
colon is walked one name at a time and refused at a dunder name (``__globals__``), at a step into
a module that is not itself trusted (``llm_gym.core.factories:importlib.import_module``) and at a
class or function defined in a refused module (``llm_gym.x:system`` after ``from os import
system``). Python callers that pass objects instead of strings never come here.
"""

from __future__ import annotations

import importlib
import inspect
import os
import threading
import types
from typing import Any

from llm_gym.errors import InvalidArgumentError

__all__ = [
    "PROJECT_MODULES",
    "REFUSED_MODULES",
    "TRUSTED_MODULES_ENV",
    "resolve_reference",
    "trust_modules",
    "trust_reference",
    "trusted_modules",
    "untrust_modules",
]

PROJECT_MODULES = ("llm_gym", "trainers")
"""The packages every reference may name."""
TRUSTED_MODULES_ENV = "LLM_GYM_TRUSTED_MODULES"
"""The environment variable of more trusted module prefixes, comma-separated."""
REFUSED_MODULES = frozenset({
    "builtins", "os", "posix", "nt", "sys", "subprocess", "posixsubprocess", "importlib", "imp",
    "pkgutil", "zipimport", "runpy", "code", "codeop", "pdb", "bdb", "trace", "timeit", "profile",
    "cProfile", "doctest", "site", "ensurepip", "pip", "venv", "setuptools", "distutils",
    "shutil", "pathlib", "io", "tempfile", "glob", "fileinput", "zipfile", "tarfile", "shelve",
    "dbm", "pickle", "marshal", "copyreg", "dill", "cloudpickle", "joblib", "yaml", "ctypes",
    "cffi", "gc", "inspect", "types", "signal", "pty", "fcntl", "resource", "mmap",
    "multiprocessing", "concurrent", "asyncio", "threading", "thread", "socket", "socketserver",
    "ssl", "select", "selectors", "http", "urllib", "ftplib", "smtplib", "telnetlib", "xmlrpc",
    "webbrowser",
})  # fmt: skip
"""Top-level modules no reference may name or reach, even under a trusted prefix: they run code,
processes or the loader, touch files or the network, or unpickle."""

_HOW = (
    f"trust its module with llm_gym.core.factories.trust_modules('my_pkg'), the environment "
    f"variable {TRUSTED_MODULES_ENV}=my_pkg,other or train.py --trust-module my_pkg"
)
_NEVER = "builtins, os, sys, subprocess, importlib, shutil, pickle, ctypes, socket and the like"
_LOCK = threading.Lock()
_TRUSTED: list[str] = []
_REGISTERED: set[str] = set()


def _refused(module: str) -> bool:
    top = module.split(".")[0]
    return top in REFUSED_MODULES or top.lstrip("_") in REFUSED_MODULES


def _check_prefix(prefix: Any, where: str) -> str:
    if not isinstance(prefix, str):
        raise InvalidArgumentError(
            f"{where}: expected a module prefix string ('my_pkg'), actual value: {prefix!r:.80}."
        )
    prefix = prefix.strip()
    if prefix in ("", "*"):
        return "*"
    if not all(part.isidentifier() for part in prefix.split(".")):
        raise InvalidArgumentError(
            f"{where}: expected a dotted module name ('my_pkg' or 'my_pkg.envs') or '*', actual "
            f"value: {prefix!r:.80}."
        )
    if _refused(prefix):
        raise InvalidArgumentError(
            f"{where}: {prefix!r} is never trusted ({_NEVER} and their submodules run code, "
            "processes or the loader, touch files or the network, or unpickle); trust the module "
            "of your own function instead."
        )
    return prefix


def trust_modules(*prefixes: str) -> None:
    """Let references name the modules under ``prefixes`` (in this process; see the module
    docstring for the environment variable that child processes inherit).

    Raises:
        InvalidArgumentError: a prefix is not a dotted module name or ``"*"``, or names a module
            of :data:`REFUSED_MODULES` (which stay refused under ``"*"``).

    Example:
        >>> trust_modules("my_pkg"); "my_pkg" in trusted_modules()
        True
        >>> untrust_modules("my_pkg")
    """
    checked = [_check_prefix(prefix, "trust_modules") for prefix in prefixes]
    with _LOCK:
        _TRUSTED.extend(p for p in checked if p not in _TRUSTED)


def untrust_modules(*prefixes: str) -> None:
    """Forget prefixes given to :func:`trust_modules` (no error for one never given)."""
    with _LOCK:
        _TRUSTED[:] = [p for p in _TRUSTED if p not in {(q.strip() or "*") for q in prefixes}]


def trusted_modules() -> tuple[str, ...]:
    """The trusted module prefixes: the project's, :func:`trust_modules`'s and the environment
    variable's (``"*"``: every module outside :data:`REFUSED_MODULES`)."""
    variable = os.environ.get(TRUSTED_MODULES_ENV, "")
    named = [_check_prefix(p, TRUSTED_MODULES_ENV) for p in variable.split(",") if p.strip()]
    with _LOCK:
        return (*PROJECT_MODULES, *_TRUSTED, *named)


def trust_reference(reference: str) -> None:
    """Let the exact ``reference`` resolve (and the walk step into its module's submodules): what
    a registry does for the references Python code registers. The other rules still hold."""
    if isinstance(reference, str):
        with _LOCK:
            _REGISTERED.add(reference)


def _covered(module: str, prefixes: tuple[str, ...]) -> bool:
    return not _refused(module) and any(
        p == "*" or module == p or module.startswith(p + ".") for p in prefixes
    )


def _refuse(reference: str, why: str) -> InvalidArgumentError:
    return InvalidArgumentError(
        f"Refused the reference {reference!r:.200}: {why}. A 'module:attr' reference may name "
        f"the modules of {' and '.join(PROJECT_MODULES)}, references registered from Python "
        f"(register_env, register_policy) and trusted modules: {_HOW}. Never trusted: {_NEVER}."
    )


def resolve_reference(reference: str) -> Any:
    """The object ``"package.module:attr.path"`` names, when the rules of this module allow it.

    Raises:
        InvalidArgumentError: the reference is malformed, its module is not trusted or refused,
            its path takes a dunder name, steps into an untrusted module or reaches a class or
            function of a refused module, or its module or an attribute is missing.

    Example:
        >>> resolve_reference("llm_gym.core.task:Task").__name__
        'Task'
        >>> try:
        ...     resolve_reference("os:system")
        ... except InvalidArgumentError as error:
        ...     print(str(error).split(". ")[0])
        Refused the reference 'os:system': module 'os' is never trusted
    """
    module_name, sep, path = reference.partition(":")
    names = path.split(".")
    if not sep or not all(p.isidentifier() for p in [*module_name.split("."), *names]):
        raise InvalidArgumentError(
            "Expected an object or a 'module:attribute' string (dotted names on both sides of "
            f"one colon), actual value: {reference!r:.200}."
        )
    if _refused(module_name):
        raise _refuse(reference, f"module {module_name!r} is never trusted")
    prefixes = trusted_modules()
    with _LOCK:
        registered = reference in _REGISTERED
    if registered:
        prefixes = (*prefixes, module_name)
    if not _covered(module_name, prefixes):
        raise _refuse(reference, f"module {module_name!r} is not trusted")
    dunder = next((n for n in names if n.startswith("__")), None)
    if dunder is not None:
        raise _refuse(reference, f"the attribute path takes the dunder name {dunder!r}")
    try:
        value: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not (module_name + ".").startswith(exc.name + "."):
            raise
        raise InvalidArgumentError(
            f"{reference!r:.200}: no module named {exc.name!r} (check the spelling, and that "
            "its package is installed or on PYTHONPATH)."
        ) from None
    for part in names:
        if not hasattr(value, part):
            raise InvalidArgumentError(
                f"{reference!r:.200}: {getattr(value, '__name__', value)!r} has no attribute "
                f"{part!r}."
            )
        value = getattr(value, part)
        _check_step(reference, value, prefixes)
    return value


def _check_step(reference: str, value: Any, prefixes: tuple[str, ...]) -> None:
    """Refuse a step into a module that is not trusted, or onto a class or function defined in
    (or bound to) a refused module."""
    if isinstance(value, types.ModuleType):
        if not _covered(value.__name__, prefixes):
            raise _refuse(reference, f"its path steps into the module {value.__name__!r}")
        return
    if inspect.isclass(value) or inspect.isroutine(value):
        owner = getattr(value, "__self__", None)  # a builtin function's module (posix.system)
        homes = [getattr(value, "__module__", None)]
        if isinstance(owner, types.ModuleType):
            homes.append(owner.__name__)
        for home in homes:
            if isinstance(home, str) and _refused(home):
                raise _refuse(reference, f"it reaches {value!r:.80}, defined in {home!r}")
