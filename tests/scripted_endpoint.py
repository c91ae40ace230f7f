"""A loopback HTTP endpoint for tests: every POST is answered by a function of its JSON body.

``ScriptedEndpoint().respond = lambda body: (status, payload)`` (a JSON-able payload, or raw
``bytes`` sent as they are); :attr:`~ScriptedEndpoint.requests` records each request's path,
headers and body, :attr:`~ScriptedEndpoint.max_active` the most requests answered at once. A
client that gives up (a timeout test) costs nothing but its own connection.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Respond = Callable[[dict[str, Any]], tuple[int, Any]]


class ScriptedEndpoint:
    """Serves on ``127.0.0.1`` (a free port) until :meth:`close`; :attr:`url` ends in ``/v1``."""

    def __init__(self, respond: Respond | None = None) -> None:
        self.respond: Respond = respond or (lambda body: (200, {}))
        self.requests: list[dict[str, Any]] = []
        self.active = self.max_active = 0
        self.lock = threading.Lock()
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with endpoint.lock:
                    endpoint.requests.append(
                        {"path": self.path, "headers": dict(self.headers), "body": body}
                    )
                    endpoint.active += 1
                    endpoint.max_active = max(endpoint.max_active, endpoint.active)
                try:
                    status, payload = endpoint.respond(body)
                finally:
                    with endpoint.lock:
                        endpoint.active -= 1
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                with contextlib.suppress(OSError):  # the client gave up (a timeout test)
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@contextlib.contextmanager
def scripted_endpoint(respond: Respond | None = None) -> Iterator[ScriptedEndpoint]:
    """A :class:`ScriptedEndpoint` closed on exit (for fixtures)."""
    endpoint = ScriptedEndpoint(respond)
    try:
        yield endpoint
    finally:
        endpoint.close()
