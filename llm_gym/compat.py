"""Names that moved keep working where they were, with a ``DeprecationWarning`` naming the new home.

A package that lost names sets ``__getattr__ = moved_names(__name__, {...})`` (PEP 562), so
``from llm_gym.rollout import HFPolicy`` still imports, and says to import it from
``llm_gym.policies`` instead. The new home is imported only when an old name is asked for.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["moved_names"]


def moved_names(module: str, moved: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that finds each name of ``moved`` (name -> its new module).

    Example:
        >>> getattr_ = moved_names("old.place", {"Task": "llm_gym.core.task"})
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     getattr_("Task").__name__, str(caught[0].message)
        ('Task', 'old.place.Task moved to llm_gym.core.task.Task: import it from there.')
    """

    def __getattr__(name: str) -> Any:
        if name not in moved:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        home = moved[name]
        warnings.warn(
            f"{module}.{name} moved to {home}.{name}: import it from there.",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(home), name)

    return __getattr__
