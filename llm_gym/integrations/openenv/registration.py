"""An OpenEnv server as a registered llm_gym environment: its task source (:class:`RemoteTasks`),
the env factory (:class:`RemoteEnvFactory`), :func:`register_remote_env` and the
``OpenEnv-v0`` entry point (:func:`make_text_env`).

Tasks come from the server (:class:`RemoteTasks`: ``GET /llm_gym/tasks`` on ours; seeds on any
other, ``train`` 0..n-1, ``val`` from 1,000,000, ``test`` from 2,000,000: each server decides
what a seed means). :func:`register_remote_env` registers a server under an id, so
``gym.make``, ``collect_groups``, ``run_and_report`` and the trainer take it like a local env;
``gym.make("OpenEnv-v0", base_url=...)`` does the same without an id.
"""

from __future__ import annotations

import time
from typing import Any

import httpx

from llm_gym.core.task import Task
from llm_gym.errors import InvalidArgumentError, RemoteEnvError
from llm_gym.gym.registration import register_env
from llm_gym.gym.text_env import TextEnv
from llm_gym.integrations.openenv.client import RemoteEnv, is_loopback
from llm_gym.integrations.openenv.protocol import check_listing, read_frame

__all__ = ["RemoteEnvFactory", "RemoteTasks", "make_text_env", "register_remote_env"]

SEED_OFFSETS = {"train": 0, "val": 1_000_000, "test": 2_000_000}
"""Where each split's seeds start on a server that lists no tasks."""
DEFAULT_SEED_TASKS = 64
MAX_LISTING_BYTES = 64 * 1024 * 1024
"""The largest task listing read (``GET /llm_gym/tasks``)."""
MAX_LISTING_VALUES = 1_000_000
"""The most JSON values in a task listing (counted before it is parsed)."""


class RemoteEnvFactory:
    """``task -> RemoteEnv`` for one server (picklable; what an id registers)."""

    def __init__(self, base_url: str, **options: Any) -> None:
        RemoteEnv(base_url, **options)  # check the options now
        self.base_url, self.options = base_url, options

    def __call__(self, task: Task) -> RemoteEnv:
        return RemoteEnv(self.base_url, **self.options)


class RemoteTasks:
    """A server's task source ``split -> tasks``: its listing (an llm_gym server), else
    ``n_seed_tasks`` seeds per split (see the module docstring)."""

    def __init__(
        self, base_url: str, *, n_seed_tasks: int = DEFAULT_SEED_TASKS, timeout_s: float = 30.0
    ) -> None:
        self.base_url, self.n_seed_tasks, self.timeout_s = (
            base_url.rstrip("/"),
            n_seed_tasks,
            timeout_s,
        )
        self._cache: dict[str, list[Task]] = {}
        self.listing: dict[str, Any] | None = None

    def fetch(self, split: str) -> dict[str, Any] | None:
        """The server's listing of ``split`` (None when it has no ``/llm_gym/tasks``), read
        within ``timeout_s`` (all of it) and :data:`MAX_LISTING_BYTES`, and checked
        (:func:`~llm_gym.integrations.openenv.protocol.check_listing`)."""
        url = self.base_url.replace("ws://", "http://", 1).replace("wss://", "https://", 1)
        where = f"{self.base_url}: GET /llm_gym/tasks?split={split}"
        deadline, body = time.monotonic() + self.timeout_s, bytearray()
        try:
            with httpx.stream("GET", f"{url}/llm_gym/tasks", params={"split": split},
                              timeout=self.timeout_s,
                              trust_env=not is_loopback(url)) as answer:  # fmt: skip
                if answer.status_code == 404:
                    return None
                for chunk in answer.iter_bytes():
                    body += chunk
                    if len(body) > MAX_LISTING_BYTES:
                        raise RemoteEnvError(f"{where}: over {MAX_LISTING_BYTES:,} bytes.")
                    if time.monotonic() > deadline:
                        raise RemoteEnvError(f"{where}: not read within {self.timeout_s} s.")
        except httpx.HTTPError as exc:
            raise RemoteEnvError(f"{where} failed: {type(exc).__name__}: {exc}") from exc
        if answer.status_code != 200:
            text = body[:300].decode("utf-8", "replace")
            raise RemoteEnvError(f"{where} answered {answer.status_code}: {text}")
        try:
            listing = read_frame(bytes(body), "task listing", MAX_LISTING_VALUES)[0]
            return check_listing(listing)
        except InvalidArgumentError as exc:
            raise RemoteEnvError(f"{where}: {exc}") from None

    def __call__(self, split: str) -> list[Task]:
        if split not in SEED_OFFSETS:
            raise InvalidArgumentError(f"split must be one of {tuple(SEED_OFFSETS)}: {split!r}.")
        if split not in self._cache:
            listing = self.fetch(split)
            if listing is None:
                offset = SEED_OFFSETS[split]
                self._cache[split] = [
                    Task("", id=f"openenv/{split}/{i}", metadata={"reset": {"seed": offset + i}})
                    for i in range(self.n_seed_tasks)
                ]
            else:
                self.listing = {k: v for k, v in listing.items() if k != "tasks"}
                self._cache[split] = [
                    Task(t["prompt"], id=t["id"], metadata={"split": split})
                    for t in listing["tasks"]
                ]
        return list(self._cache[split])


def _served_settings(tasks: RemoteTasks) -> dict[str, Any]:
    """The turn limit and action format an llm_gym server announces (else the defaults)."""
    listing = tasks.fetch("train")
    if listing is None:
        return {}
    return {k: listing[k] for k in ("max_turns", "action_format") if listing[k] is not None}


def register_remote_env(
    env_id: str,
    base_url: str,
    *,
    description: str = "",
    n_seed_tasks: int = DEFAULT_SEED_TASKS,
    **options: Any,
) -> Any:
    """Register the OpenEnv server at ``base_url`` as ``env_id``; returns its ``EnvEntry``.

    The turn limit and action format are the server's (an llm_gym server announces them);
    pass ``max_turns=`` or ``action_format=`` to override. Other ``options`` go to
    :class:`RemoteEnv` (``call_timeout_s``, ``action_field``, ...).
    """
    tasks = RemoteTasks(base_url, n_seed_tasks=n_seed_tasks)
    settings = _served_settings(tasks)
    for key in ("max_turns", "action_format"):
        if key in options:
            settings[key] = options.pop(key)
    return register_env(
        env_id,
        env=RemoteEnvFactory(base_url, **options),
        tasks=tasks,
        description=description or f"The OpenEnv server at {base_url}.",
        **settings,
    )


def make_text_env(
    base_url: str | None = None, *, n_seed_tasks: int = DEFAULT_SEED_TASKS, **kwargs: Any
) -> Any:
    """``gym.make("OpenEnv-v0", base_url=...)``: a :class:`~llm_gym.gym.TextEnv` over the server.

    ``kwargs`` go to :class:`RemoteEnv` when they are its options (``call_timeout_s``,
    ``action_field``, ...), else to ``TextEnv`` (``split``, ``max_turns``, ``render_mode``, ...).

    Raises:
        InvalidArgumentError: no ``base_url`` (the error says what to pass).
    """
    if base_url is None:
        raise InvalidArgumentError(
            "gym.make('OpenEnv-v0') needs base_url, the URL of an OpenEnv server: "
            "gym.make('OpenEnv-v0', base_url='http://127.0.0.1:8001') (serve one with "
            "`llm-gym serve-env ToolUseGame-v0`)."
        )
    remote = {
        k: kwargs.pop(k)
        for k in (
            "call_timeout_s",
            "connect_timeout_s",
            "action_field",
            "observation_field",
            "reward",
        )
        if k in kwargs
    }
    tasks = RemoteTasks(base_url, n_seed_tasks=n_seed_tasks)
    settings = {**_served_settings(tasks), **kwargs}
    return TextEnv(RemoteEnvFactory(base_url, **remote), tasks, **settings)
