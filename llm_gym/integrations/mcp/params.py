"""How to reach an MCP server: :class:`MCPServerParams` and :func:`as_server_list`.

Params are plain frozen records (picklable: they travel as ``gym.make`` kwargs and to worker
processes) and read the ``mcpServers`` config shape agents and IDEs use::

    {"weather": {"command": "python", "args": ["weather.py"]},
     "search": {"url": "http://127.0.0.1:8000/mcp", "headers": {"Authorization": "Bearer x"}}}
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from llm_gym.errors import InvalidArgumentError, did_you_mean

__all__ = ["DEFAULT_MAX_MESSAGE_BYTES", "MCPServerParams", "as_server_list"]

DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024
"""The largest message (one JSON-RPC line) a stdio server may send: 4 MiB, far above any tool
result a model may read (results are cut to
:data:`~llm_gym.core.tool_env.MAX_TOOL_RESULT_CHARS`)."""


def _seconds(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise InvalidArgumentError(f"{name} must be a number of seconds > 0, actual: {value!r}.")
    return float(value)


@dataclass(frozen=True)
class MCPServerParams:
    """How to reach one MCP server: ``command`` (stdio) or ``url`` (streamable HTTP).

    Example:
        >>> MCPServerParams(command="python", args=("weather.py",), name="weather").transport
        'stdio'
    """

    command: str | None = None
    """stdio: the executable that runs the server (``sys.executable`` for a Python script)."""
    args: tuple[str, ...] = ()
    """stdio: its arguments."""
    env: Mapping[str, str] | None = field(default=None, hash=False)
    """stdio: environment variables, merged over a safe default (``PATH``, ``HOME``, ...)."""
    cwd: str | None = None
    """stdio: its working directory (None: this process's)."""
    url: str | None = None
    """streamable HTTP: the endpoint (``http://127.0.0.1:8000/mcp``)."""
    headers: Mapping[str, str] | None = field(default=None, hash=False)
    """streamable HTTP: headers sent with every request (an ``Authorization``, say)."""
    name: str = ""
    """A prefix for the tool names: tool ``get`` of a server named ``weather`` is advertised as
    ``weather_get`` (empty: the server's own names)."""
    call_timeout_s: float = 30.0
    """Seconds one tool call may take; past it the model gets a ``tool_error``."""
    connect_timeout_s: float = 30.0
    """Seconds starting the server, the handshake and the tool listing may take together."""
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    """stdio: the largest message the server may send; a longer reply is dropped."""

    def __post_init__(self) -> None:
        if (self.command is None) == (self.url is None):
            raise InvalidArgumentError(
                "An MCP server needs exactly one of command (stdio: the program that runs it) "
                f"and url (streamable HTTP), actual: command={self.command!r}, url={self.url!r}."
            )
        if self.command is not None and (not isinstance(self.command, str) or not self.command):
            raise InvalidArgumentError(
                f"command must be a non-empty str, actual: {self.command!r}."
            )
        if self.url is not None and (
            not isinstance(self.url, str) or not self.url.startswith(("http://", "https://"))
        ):
            raise InvalidArgumentError(
                f"url must start with http:// or https://, actual: {self.url!r:.200}."
            )
        if isinstance(self.args, str) or not all(isinstance(a, str) for a in self.args):
            raise InvalidArgumentError(f"args must be a list of str, actual: {self.args!r:.200}.")
        object.__setattr__(self, "args", tuple(self.args))
        for name in ("env", "headers"):
            value = getattr(self, name)
            if value is not None and not (
                isinstance(value, Mapping)
                and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())
            ):
                raise InvalidArgumentError(f"{name} must map str to str, actual: {value!r:.200}.")
        if not isinstance(self.name, str) or not re.fullmatch(r"[A-Za-z0-9_-]{0,32}", self.name):
            raise InvalidArgumentError(
                f"name must be up to 32 letters, digits, '_' or '-' (a tool-name prefix), "
                f"actual: {self.name!r:.80}."
            )
        _seconds(self.call_timeout_s, "call_timeout_s")
        _seconds(self.connect_timeout_s, "connect_timeout_s")
        size = self.max_message_bytes
        if isinstance(size, bool) or not isinstance(size, int) or size < 1024:
            raise InvalidArgumentError(
                f"max_message_bytes must be an int >= 1024, actual: {size!r}."
            )

    @property
    def transport(self) -> str:
        """``"stdio"`` or ``"streamable-http"``."""
        return "stdio" if self.command is not None else "streamable-http"

    @property
    def label(self) -> str:
        """How errors name this server."""
        return self.name or (self.url if self.url is not None else f"{self.command} (stdio)")

    @classmethod
    def from_config(cls, entry: Mapping[str, Any], name: str = "") -> MCPServerParams:
        """Params from a config entry: the ``mcpServers`` shape (``command``, ``args``, ``env``,
        ``cwd``; or ``url``, ``headers``) plus this class's other fields; an unknown key is
        refused with the closest known one."""
        if not isinstance(entry, Mapping):
            raise InvalidArgumentError(
                f"An MCP server entry must be a mapping (command/args or url), actual: "
                f"{entry!r:.200}."
            )
        known = [f.name for f in fields(cls)]
        for key in entry:
            if key not in known:
                raise InvalidArgumentError(
                    f"Unknown MCP server key {key!r}.{did_you_mean(key, known)} Known: {known}."
                )
        values = dict(entry)
        if name and not values.get("name"):
            values["name"] = name
        if isinstance(values.get("args"), list):
            values["args"] = tuple(values["args"])
        return cls(**values)


def as_server_list(servers: Any) -> list[MCPServerParams]:
    """``servers`` as a list of params: one :class:`MCPServerParams` or config entry, a
    sequence of them, or a mapping ``name -> entry`` (``{"mcpServers": {...}}``'s value; the
    names become the tool-name prefixes).

    Example:
        >>> [s.name for s in as_server_list({"calc": {"url": "http://127.0.0.1:9/mcp"}})]
        ['calc']
    """
    if isinstance(servers, MCPServerParams):
        return [servers]
    if isinstance(servers, Mapping):
        if "command" in servers or "url" in servers:
            return [MCPServerParams.from_config(servers)]
        return [MCPServerParams.from_config(entry, str(name)) for name, entry in servers.items()]
    if isinstance(servers, Sequence) and not isinstance(servers, str | bytes):
        return [
            s if isinstance(s, MCPServerParams) else MCPServerParams.from_config(s) for s in servers
        ]
    raise InvalidArgumentError(
        f"Expected MCP servers as MCPServerParams, a config mapping or a list of them, actual: "
        f"{servers!r:.200}."
    )
