"""W&B on by default, as in the cookbook, checked before any model loads.

A run logs to W&B when ``wandb_project`` names a project (default :data:`DEFAULT_PROJECT`) and
``report_to`` leaves it on (its default, ``"all"``, or a list naming ``wandb``). ``wandb_project=
None``, an explicit ``report_to`` without ``wandb`` (``"none"``, say) or ``WANDB_MODE=disabled``
turn it off. A run with W&B on must have a W&B set-up, or it stops before anything loads
(:func:`check_wandb_setup`; the cookbook's run fails only after it provisions the model): an API
key (``WANDB_API_KEY``, or ``wandb login``'s entry in ``~/.netrc``) or ``WANDB_MODE=offline``.
"""

from __future__ import annotations

import netrc
import os
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlparse

from llm_gym.errors import InvalidArgumentError

__all__ = [
    "DEFAULT_PROJECT",
    "REMEDIES",
    "check_wandb_setup",
    "report_to_with_wandb",
    "wandb_off",
    "wandb_setup_problem",
]

DEFAULT_PROJECT = "llm-gym"
"""The W&B project a run logs to unless told otherwise."""

REMEDIES = (
    "export WANDB_API_KEY (or run `wandb login`), set WANDB_MODE=offline to log locally, "
    "or pass wandb_project=None to turn logging off"
)
"""What the error tells a user with W&B on and no set-up (the cookbook's three remedies)."""

OFFLINE_MODES = {"offline", "dryrun"}


def wandb_off(environ: Mapping[str, str]) -> bool:
    """Whether the environment turns W&B off (``WANDB_MODE=disabled``, ``WANDB_DISABLED=true``).

    Example:
        >>> wandb_off({"WANDB_MODE": "disabled"}), wandb_off({"WANDB_MODE": "offline"})
        (True, False)
    """
    mode = environ.get("WANDB_MODE", "").strip().lower()
    return mode == "disabled" or environ.get("WANDB_DISABLED", "").strip().lower() in (
        "true",
        "1",
        "yes",
    )


def report_to_with_wandb(
    report_to: str | list[str] | None, project: str | None, environ: Mapping[str, str]
) -> tuple[str | list[str] | None, bool]:
    """``report_to`` as the run uses it, and whether that logs to W&B.

    W&B joins a ``report_to`` left at its default (None or ``"all"``) when ``project`` is set;
    an explicit ``report_to`` is kept as given. ``WANDB_MODE=disabled`` takes W&B out.

    Example:
        >>> report_to_with_wandb(None, "p", {}), report_to_with_wandb("none", "p", {})
        ((['wandb'], True), ('none', False))
        >>> report_to_with_wandb(None, None, {})
        ('none', False)
    """
    default = report_to in (None, "all") or report_to == ["all"]
    if default:
        report_to = ["wandb"] if project is not None else "none"
    names = [report_to] if isinstance(report_to, str) else list(report_to or [])
    if "wandb" in names and wandb_off(environ):
        names = [n for n in names if n != "wandb"]
        report_to = names or "none"
    return report_to, "wandb" in names


def _netrc_has_key(environ: Mapping[str, str], path: Path | None) -> bool:
    host = urlparse(environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname or ""
    path = path or Path(environ.get("NETRC") or Path.home() / ".netrc")
    try:
        entry = netrc.netrc(str(path)).authenticators(host)
    except (OSError, netrc.NetrcParseError):
        return False
    return bool(entry and entry[2])


def wandb_setup_problem(environ: Mapping[str, str], netrc_path: Path | None = None) -> str | None:
    """Why a run with W&B on could not log (None when it can): no API key, no offline mode.

    Example:
        >>> wandb_setup_problem({"WANDB_MODE": "offline"}) is None
        True
        >>> wandb_setup_problem({"WANDB_API_KEY": "k"}) is None
        True
    """
    mode = environ.get("WANDB_MODE", "").strip().lower()
    if mode in OFFLINE_MODES or wandb_off(environ) or environ.get("WANDB_API_KEY", "").strip():
        return None
    if _netrc_has_key(environ, netrc_path):
        return None
    if mode and mode != "online":
        return f"WANDB_MODE={mode!r} is not a W&B mode (online, offline, disabled)"
    return "no W&B API key is set (WANDB_API_KEY, or `wandb login`) and WANDB_MODE is not offline"


def check_wandb_setup(project: str, environ: Mapping[str, str] | None = None) -> None:
    """Refuse a run that logs to W&B project ``project`` without a W&B set-up.

    Raises:
        InvalidArgumentError: naming what is missing and the three remedies.
    """
    problem = wandb_setup_problem(os.environ if environ is None else environ)
    if problem is not None:
        default = " (the default)" if project == DEFAULT_PROJECT else ""
        raise InvalidArgumentError(
            f"This run logs to W&B (wandb_project={project!r}{default}) but {problem}: "
            f"{REMEDIES}. Checked before any model loads."
        )
