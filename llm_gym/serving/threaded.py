"""uvicorn serving from a daemon thread: the one way ``llm-gym serve`` and ``llm-gym serve-env``
start, wait on and stop their servers, the deadline both keep on a request's head, and the cap
on connections a WebSocket handshake meets."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

__all__ = [
    "STARTUP_TIMEOUT_S",
    "ThreadedServer",
    "connection_limit",
    "head_timeout_protocol",
    "http_url",
]

STARTUP_TIMEOUT_S = 30.0
"""Seconds a server thread may take to start listening."""


def http_url(host: str, port: int, path: str = "") -> str:
    """``http://HOST:PORT`` + ``path`` (an IPv6 host in brackets).

    Example:
        >>> http_url("::1", 8000, "/v1"), http_url("127.0.0.1", 80)
        ('http://[::1]:8000/v1', 'http://127.0.0.1:80')
    """
    return f"http://{'[' + host + ']' if ':' in host else host}:{port}{path}"


def connection_limit(max_connections: int) -> int:
    """uvicorn's ``limit_concurrency`` that serves ``max_connections`` connections at once:
    uvicorn answers 503 to a request once that many connections are open, its own included.

    Example:
        >>> connection_limit(64)
        65
    """
    return max_connections + 1


def head_timeout_protocol(timeout_s: float, max_connections: int | None = None) -> type:
    """uvicorn's h11 protocol, closing a connection whose request head has not arrived within
    ``timeout_s`` of its opening or of the previous answer (uvicorn itself only times out idle
    keep-alive connections, and a few bytes reset that: a client that trickles or never sends a
    request would hold a connection, and its file descriptor, for good). A connection upgraded
    to a WebSocket is the WebSocket protocol's from then on (the deadline ends there).

    With ``max_connections``, a WebSocket handshake that arrives while that many connections
    are open (HTTP and WebSocket, its own not counted) is answered 503, with the reason, and
    closed before the app sees it: no session is made for it. uvicorn's ``limit_concurrency``
    (:func:`connection_limit`) refuses HTTP requests past the same count, but lets upgrades
    pass."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class Protocol(H11Protocol):
        _head_timer: asyncio.TimerHandle | None = None

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _arm(self) -> None:
            self._disarm()
            self._head_timer = self.loop.call_later(timeout_s, self._head_timeout)

        def _head_timeout(self) -> None:
            if self.cycle is None or self.cycle.response_complete:  # no request head since
                self.transport.close()

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()

        def handle_websocket_upgrade(self, event: Any) -> None:
            self._disarm()
            if max_connections is not None and len(self.connections) > max_connections:
                self._refuse_upgrade(
                    f"The server holds at most {max_connections} connections at once and all "
                    "are open; try again when a session ends."
                )
                return
            super().handle_websocket_upgrade(event)

        def _refuse_upgrade(self, reason: str) -> None:
            body = reason.encode()
            headers = [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ]
            response = h11.Response(status_code=503, headers=headers, reason=b"Service Unavailable")
            for part in (response, h11.Data(data=body), h11.EndOfMessage()):
                self.transport.write(self.conn.send(part))
            self.transport.close()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return Protocol


class ThreadedServer:
    """A ``uvicorn.Server`` running ``config`` in a daemon thread named ``name``, started and
    listening when the constructor returns (on ``sockets`` when given, else on the config's
    host and port)."""

    def __init__(self, config: Any, name: str, sockets: list[Any] | None = None) -> None:
        import uvicorn

        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run,
            kwargs={"sockets": sockets} if sockets is not None else {},
            name=name,
            daemon=True,
        )
        self.thread.start()
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                self.server.should_exit = True
                raise RuntimeError(f"the {name} thread did not start listening (see the log)")
            time.sleep(0.01)

    def wait(self) -> None:
        """Block until :meth:`stop` (from another thread) or Ctrl-C."""
        while self.thread.is_alive():
            self.thread.join(0.5)

    def stop(self, join_s: float = 15.0) -> None:
        """Ask the server to exit and wait for its thread (connections in flight get uvicorn's
        graceful-shutdown time)."""
        self.server.should_exit = True
        self.thread.join(join_s)
