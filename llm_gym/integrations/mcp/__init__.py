"""MCP both ways (the ``interop`` extra's ``mcp`` SDK): MCP servers' tools in any llm_gym
environment, and an environment's tools served to any MCP client.

* Using servers' tools: :class:`MCPServerParams` says how to reach a server (:mod:`.params`);
  :class:`MCPToolEnv` and :func:`with_mcp_tools` add their tools to an environment
  (:mod:`.env`), over :class:`MCPConnection` (:mod:`.client`, stdio through :mod:`.stdio`, or
  streamable HTTP).
* Serving an environment's tools (``llm-gym serve-mcp``, :mod:`.cli`): :func:`serve_mcp_stdio`,
  :func:`serve_mcp_http` and :func:`build_mcp_server` (:mod:`.server`).

Importing this package imports no MCP code; each name below loads its module on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llm_gym.lazy import lazy_names

if TYPE_CHECKING:
    from llm_gym.integrations.mcp.client import MCPConnection, MCPTool
    from llm_gym.integrations.mcp.env import (
        MCPToolEnv,
        MCPToolsWrapper,
        open_mcp_tools,
        with_mcp_tools,
    )
    from llm_gym.integrations.mcp.params import MCPServerParams, as_server_list
    from llm_gym.integrations.mcp.server import (
        MCPHttpServer,
        ServedTools,
        build_mcp_server,
        serve_mcp_http,
        serve_mcp_stdio,
    )

__all__ = [
    # servers' tools in an environment
    "MCPConnection",
    "MCPServerParams",
    "MCPTool",
    "MCPToolEnv",
    "MCPToolsWrapper",
    "as_server_list",
    "open_mcp_tools",
    "with_mcp_tools",
    # an environment's tools as a server
    "MCPHttpServer",
    "ServedTools",
    "build_mcp_server",
    "serve_mcp_http",
    "serve_mcp_stdio",
]

_MODULES = {
    "MCPConnection": "client",
    "MCPTool": "client",
    "MCPServerParams": "params",
    "as_server_list": "params",
    "MCPToolEnv": "env",
    "MCPToolsWrapper": "env",
    "open_mcp_tools": "env",
    "with_mcp_tools": "env",
    "MCPHttpServer": "server",
    "ServedTools": "server",
    "build_mcp_server": "server",
    "serve_mcp_http": "server",
    "serve_mcp_stdio": "server",
}
"""The module of this package each name of ``__all__`` lives in."""


__getattr__, __dir__ = lazy_names(__name__, _MODULES, __all__)
