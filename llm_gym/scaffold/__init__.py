"""``llm-gym new-env NAME``: scaffold a runnable starter environment package with its tests.

Two styles, one folder of templates each (:data:`SCAFFOLD_STYLES`):

- ``tool`` (the default): a native environment, the way llm_gym's own are written. A
  :class:`~llm_gym.ToolEnv` subclass with an ``@tool`` function (unit conversion with a
  ``convert`` tool), a seeded task generator with disjoint splits, ``get_tasks(split)``, an oracle
  that never reads the target, ``register()``, a ``python -m NAME play|eval|show-task`` entry, a
  README, and tests: ``check_env``, same-seed determinism, pickling, the oracle's ceiling and the
  random floor through ``run_and_report``, hostile actions.
- ``multi-turn`` (``--multi-turn``, document 002's ``env setup --multi-turn``): a "guess the
  secret number" :class:`~llm_gym.environments.EnvironmentMultiTurn` with ``start_episode``,
  ``step_episode``, ``max_episode_turns`` and ``score_episode`` wired end to end, a
  ``load_environment(split=...)``, a small dataset, a README, and tests that run it through
  llm_gym's adapter, ``register_multi_turn_env`` and ``run_and_report``.

The generated tests pass untouched. The templates live in ``llm_gym/scaffold/templates/<style>``
(shipped in the wheel): files ending in ``.tmpl`` are rendered (``{{package}}``,
``{{class_name}}``, ``{{env_id}}`` replaced, in names too) and lose the suffix; other files are
copied as they are.
"""

from __future__ import annotations

import contextlib
import importlib.util
import keyword
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from llm_gym.errors import InvalidArgumentError, UnknownNameError, did_you_mean

__all__ = [
    "DEFAULT_STYLE",
    "SCAFFOLD_STYLES",
    "Scaffold",
    "ScaffoldStyle",
    "new_env",
    "scaffold_names",
    "scaffold_style",
]

_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")
_RESERVED = frozenset({"llm_gym", "trainers", "gymnasium", "gym", "pytest", "tests", "test"})
TEMPLATE_SUFFIX = ".tmpl"


@dataclass(frozen=True)
class Scaffold:
    """The names a scaffold derives from ``NAME``."""

    package: str
    """The Python package (the folder's name), e.g. ``guess_game``."""
    class_name: str
    """The environment class, e.g. ``GuessGameEnv``."""
    env_id: str
    """The gymnasium id :func:`register` uses, e.g. ``GuessGame-v0``."""

    def render(self, text: str) -> str:
        """``text`` with the placeholders replaced."""
        for key in ("package", "class_name", "env_id"):
            text = text.replace("{{" + key + "}}", getattr(self, key))
        return text


def _suggest(name: str) -> str:
    snake = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name.strip())
    snake = re.sub(r"[^a-z0-9_]+", "_", snake.lower()).strip("_")
    snake = re.sub(r"^[0-9_]+", "", snake)
    return snake or "my_env"


def _importable(name: str) -> bool:
    """Whether ``import name`` finds something (a broken finder counts as found)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return True


def _free_name(name: str) -> str:
    """``name_env`` (or ``name_env2``, ...): a suggestion that shadows nothing."""
    for suffix in ("_env", *(f"_env{i}" for i in range(2, 100))):
        candidate = name[: 64 - len(suffix)] + suffix
        if not _importable(candidate):
            return candidate
    return "my_env"


def scaffold_names(name: str) -> Scaffold:
    """Check ``name`` and derive the package, class and id names.

    ``name`` must be a lowercase Python package name: a letter, then up to 63 letters, digits or
    underscores, not a Python keyword, nor the name of a standard-library module or of anything
    ``importlib.util.find_spec`` finds (an installed package such as ``numpy``); and the env id
    it gives must be free: neither an llm_gym environment (``guess_number`` and ``math_env``
    give ``GuessNumber-v0`` and ``Math-v0``) nor another gymnasium id (``cart_pole`` gives
    ``CartPole-v0``), whose registration the package's ``register()`` would clash with or
    replace.

    Example:
        >>> scaffold_names("guess_game")
        Scaffold(package='guess_game', class_name='GuessGameEnv', env_id='GuessGame-v0')
    """
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidArgumentError(
            "NAME must be a lowercase Python package name: a letter, then letters, digits or "
            f"underscores (64 characters at most), e.g. {_suggest(str(name))!r}; actual value: "
            f"{name!r}."
        )
    if keyword.iskeyword(name) or name in sys.stdlib_module_names or name in _RESERVED:
        raise InvalidArgumentError(
            f"NAME {name!r} would shadow a Python keyword or a module Python or llm_gym "
            f"imports; pick another name, e.g. {_free_name(name)!r}."
        )
    if _importable(name):
        raise InvalidArgumentError(
            f"NAME {name!r} would shadow a module Python can import here (an installed package "
            f"or a module on sys.path); pick another name, e.g. {_free_name(name)!r}."
        )
    scaffold = _derived(name)
    taken = _taken_env_ids()
    if scaffold.env_id in taken:
        candidates = (f"my_{name}", f"{name}_v2", f"{name}_custom")
        free = next(
            (c for c in candidates if _derived(c).env_id not in taken and not _importable(c)),
            "my_env",
        )
        raise InvalidArgumentError(
            f"NAME {name!r} gives the env id {scaffold.env_id!r}, which is already registered "
            f"(llm_gym's or gymnasium's): the package's register() would clash with it. Pick "
            f"another name, e.g. {free!r}."
        )
    return scaffold


def _derived(name: str) -> Scaffold:
    """The names of the (checked) package name ``name``."""
    words = [w for w in name.split("_") if w]
    camel = "".join(w[0].upper() + w[1:] for w in words)
    base = camel[:-3] if camel.endswith("Env") and len(camel) > 3 else camel
    return Scaffold(package=name, class_name=f"{base}Env", env_id=f"{base}-v0")


def _taken_env_ids() -> set[str]:
    """The ids registered now: llm_gym's catalogue and gymnasium's registry."""
    import gymnasium

    from llm_gym.core.registry import registered_envs

    return {entry.id for entry in registered_envs()} | set(gymnasium.registry)


@dataclass(frozen=True)
class ScaffoldStyle:
    """One kind of starter ``new_env`` can write."""

    name: str
    """What ``--style`` takes, e.g. ``"tool"``."""
    templates: str
    """Its folder under ``llm_gym/scaffold/templates``."""
    description: str
    """One line for ``llm-gym new-env --help``."""


SCAFFOLD_STYLES: Mapping[str, ScaffoldStyle] = {
    style.name: style
    for style in (
        ScaffoldStyle(
            "tool",
            "tool",
            "a native ToolEnv with an @tool function and a seeded task generator",
        ),
        ScaffoldStyle(
            "multi-turn",
            "multi_turn",
            "document 002's EnvironmentMultiTurn with a JSONL dataset (env setup --multi-turn)",
        ),
    )
}
"""The styles, by name; a new style is one row here and one folder of templates."""
DEFAULT_STYLE = "tool"
"""The style ``llm-gym new-env NAME`` writes without ``--style``."""


def scaffold_style(name: str) -> ScaffoldStyle:
    """The style called ``name``, or a clear error naming the styles there are.

    Example:
        >>> scaffold_style("multi-turn").templates
        'multi_turn'
    """
    if name in SCAFFOLD_STYLES:
        return SCAFFOLD_STYLES[name]
    raise UnknownNameError(
        f"Expected a scaffold style, one of {sorted(SCAFFOLD_STYLES)}, actual value: "
        f"{name!r}.{did_you_mean(name, SCAFFOLD_STYLES)}"
    )


def _templates(style: ScaffoldStyle) -> Traversable:
    return resources.files(__name__) / "templates" / style.templates


def _walk(folder: Traversable, prefix: tuple[str, ...] = ()):
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name == "__pycache__":
            continue
        if entry.is_dir():
            yield from _walk(entry, (*prefix, entry.name))
        else:
            yield (*prefix, entry.name), entry


def new_env(name: str, directory: str | Path = ".", style: str = DEFAULT_STYLE) -> Path:
    """Write the starter environment package ``directory/name`` and return its path.

    The package folder is created here, and everything is written inside the folder created:
    an existing path (a folder, even empty, a file, a symbolic link, a dangling one) is refused,
    no link is followed, and no existing file is opened.

    Args:
        name: The package name (see :func:`scaffold_names`).
        directory: Where the package folder goes (created when missing).
        style: A key of :data:`SCAFFOLD_STYLES`: ``"tool"`` (a native ``ToolEnv``, the
            default) or ``"multi-turn"`` (document 002's ``EnvironmentMultiTurn``).

    Raises:
        InvalidArgumentError: ``name`` is not allowed, ``directory/name`` exists (nothing is
            overwritten), or the folder or a file cannot be created.
        UnknownNameError: ``style`` is not a known style.
    """
    names = scaffold_names(name)
    templates = _templates(scaffold_style(style))
    target = Path(directory).expanduser() / names.package
    if os.path.lexists(target):
        raise InvalidArgumentError(
            f"{target} already exists (a scaffold writes only into a folder it creates); "
            "nothing was written. Pick another NAME or --dir, or remove it."
        )
    files = []
    for parts, entry in _walk(templates):
        relative = Path(*(names.render(p) for p in parts))
        if relative.name.endswith(TEMPLATE_SUFFIX):
            relative = relative.with_name(relative.name[: -len(TEMPLATE_SUFFIX)])
            files.append((relative, names.render(entry.read_text(encoding="utf-8")).encode()))
        else:
            files.append((relative, entry.read_bytes()))
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidArgumentError(
            f"Could not create the folder {target.parent} for the scaffold: "
            f"{exc.strerror or exc}. Pick a --dir that is a folder you can write to."
        ) from None
    try:
        os.mkdir(target)  # the last component is never followed: a link there is an error
    except FileExistsError:
        raise InvalidArgumentError(
            f"{target} already exists (a scaffold writes only into a folder it creates); "
            "nothing was written. Pick another NAME or --dir, or remove it."
        ) from None
    except OSError as exc:  # a read-only folder, /proc or /sys, a name too long
        raise InvalidArgumentError(
            f"Could not create the folder {target} for the scaffold: {exc.strerror or exc}; "
            "nothing was written. Pick a --dir that is a folder you can write to."
        ) from None
    try:
        _write_inside(target, files)
    except OSError as exc:
        raise InvalidArgumentError(
            f"Could not write the scaffold at {target}: {exc.strerror or exc}. Pick a --dir you "
            "can write to."
        ) from None
    return target


_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
_FOLDER = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0)
_DIR_FD = {os.open, os.mkdir} <= os.supports_dir_fd


def _write_inside(target: Path, files: list[tuple[Path, bytes]]) -> None:
    """Write ``files`` under the folder ``target`` just created: through a descriptor of that
    folder where the platform has them (a link swapped in for it is not followed), creating each
    file exclusively."""
    if not _DIR_FD:
        for relative, data in files:  # no descriptors here: exclusive creation still holds
            for parent in reversed(relative.parents[:-1]):
                if not (target / parent).is_dir():
                    os.mkdir(target / parent)
            with os.fdopen(os.open(target / relative, _NEW_FILE, 0o644), "wb") as f:
                f.write(data)
        return
    root = os.open(target, _FOLDER)
    try:
        for relative, data in files:
            folder = os.dup(root)
            try:
                for part in relative.parts[:-1]:
                    with contextlib.suppress(FileExistsError):  # made for an earlier file
                        os.mkdir(part, dir_fd=folder)  # (opening it below refuses a link)
                    inner = os.open(part, _FOLDER, dir_fd=folder)
                    os.close(folder)
                    folder = inner
                fd = os.open(relative.name, _NEW_FILE, 0o644, dir_fd=folder)
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
            finally:
                os.close(folder)
    finally:
        os.close(root)
