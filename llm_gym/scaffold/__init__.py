"""``llm-gym new-env NAME``: scaffold a runnable starter environment package with its tests.

Document 002's ``env setup --multi-turn``: the starter is a "guess the secret number"
:class:`~llm_gym.environments.EnvironmentMultiTurn` with ``start_episode``, ``step_episode``,
``max_episode_turns`` and ``score_episode`` wired end to end, a ``load_environment(split=...)``,
a small dataset, a README on turning it into your own task, and pytest tests that run it through
llm_gym's adapter, ``register_multi_turn_env`` and ``run_and_report``. The generated tests pass
untouched.

The templates live in ``llm_gym/scaffold/templates`` (shipped in the wheel): files ending in
``.tmpl`` are rendered (``{{package}}``, ``{{class_name}}``, ``{{env_id}}`` replaced, in names
too) and lose the suffix; other files are copied as they are.
"""

from __future__ import annotations

import keyword
import re
import sys
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from llm_gym.errors import InvalidArgumentError

__all__ = ["Scaffold", "new_env", "scaffold_names"]

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


def scaffold_names(name: str) -> Scaffold:
    """Check ``name`` and derive the package, class and id names.

    ``name`` must be a lowercase Python package name: a letter, then up to 63 letters, digits or
    underscores, not a Python keyword nor the name of a standard-library module.

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
            f"imports; pick another name, e.g. {name + '_env'!r}."
        )
    words = [w for w in name.split("_") if w]
    camel = "".join(w[0].upper() + w[1:] for w in words)
    base = camel[:-3] if camel.endswith("Env") and len(camel) > 3 else camel
    return Scaffold(package=name, class_name=f"{base}Env", env_id=f"{base}-v0")


def _templates() -> Traversable:
    return resources.files(__name__) / "templates"


def _walk(folder: Traversable, prefix: tuple[str, ...] = ()):
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name == "__pycache__":
            continue
        if entry.is_dir():
            yield from _walk(entry, (*prefix, entry.name))
        else:
            yield (*prefix, entry.name), entry


def new_env(name: str, directory: str | Path = ".") -> Path:
    """Write the starter environment package ``directory/name`` and return its path.

    Args:
        name: The package name (see :func:`scaffold_names`).
        directory: Where the package folder goes (created when missing).

    Raises:
        InvalidArgumentError: ``name`` is not allowed, or ``directory/name`` exists and is not
            an empty folder (nothing is overwritten).
    """
    names = scaffold_names(name)
    target = Path(directory).expanduser() / names.package
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise InvalidArgumentError(
            f"{target} already exists and is not an empty folder; nothing was written. Pick "
            "another NAME or --dir, or remove it."
        )
    files = []
    for parts, entry in _walk(_templates()):
        relative = Path(*(names.render(p) for p in parts))
        if relative.name.endswith(TEMPLATE_SUFFIX):
            relative = relative.with_name(relative.name[: -len(TEMPLATE_SUFFIX)])
            files.append((relative, names.render(entry.read_text(encoding="utf-8")).encode()))
        else:
            files.append((relative, entry.read_bytes()))
    target.mkdir(parents=True, exist_ok=True)
    for relative, data in files:
        path = target / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return target
