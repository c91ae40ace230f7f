"""Who may use a local server: the Host, Origin and Content-Type checks of ``llm-gym serve`` and
``llm-gym serve-env``.

A server on loopback is within reach of every web page the user's browser opens. A page can
send a ``POST`` whose body is a Blob (no ``Content-Type``, no CORS preflight), open a WebSocket
to any address (browsers ask nobody), or point a name of its own at 127.0.0.1 (DNS rebinding:
the browser then treats the server as the page's own site). :class:`AccessGuard`, an ASGI
middleware in front of both servers, refuses each before any route (or env session) sees it:

* a ``Host`` header that names no allowed host (:attr:`AccessPolicy.allowed_hosts`) is a 400;
* an ``Origin`` header (which browsers send, and the openai SDK, curl and OpenEnv's client do
  not) that names no allowed origin (:attr:`AccessPolicy.allowed_origins`) is a 403;
* a request with a body whose ``Content-Type`` is missing or not JSON (``application/json``
  or ``*/*+json``) is a 415.

The same holds for WebSocket handshakes (refused with the same status, before the handshake
completes). Both lists default to loopback (:data:`LOOPBACK`); a refusal names the command-line
option that allows more (:func:`add_arguments`: ``--allowed-hosts``, ``--allowed-origins``).
Starlette's ``TrustedHostMiddleware`` is not used: its patterns cannot say ``127.0.0.0/8`` and
its answer names no remedy.

Patterns, comma-separated on the command line:

* ``*``: anything;
* a host name (``localhost``, ``api.example.com``) or ``*.example.com`` (its subdomains);
* an address or a network (``::1``, ``[::1]``, ``10.0.0.5``, ``127.0.0.0/8``);
* for origins also a whole origin (``https://app.example.com``, ``http://localhost:3000``:
  that scheme, host and port only) and ``null`` (sandboxed frames, ``file:`` pages).

A host pattern matches any port (and, as an origin, any scheme).
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

from llm_gym.errors import InvalidArgumentError

__all__ = [
    "LOOPBACK",
    "AccessGuard",
    "AccessPolicy",
    "Refusal",
    "add_arguments",
    "detail_body",
    "is_json_media_type",
    "policy_from_args",
]

LOOPBACK: tuple[str, ...] = ("localhost", "127.0.0.0/8", "::1")
"""The hosts and origins a server allows unless told otherwise: this machine only."""
HOSTS_OPTION = "--allowed-hosts"
ORIGINS_OPTION = "--allowed-origins"

_NAME = re.compile(r"[a-z0-9_-]+(?:\.[a-z0-9_-]+)*")
_SCHEME = re.compile(r"[a-z][a-z0-9+.-]*")
_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}
_WILDCARD_BINDS = ("", "0.0.0.0", "::")


def is_json_media_type(value: str | None) -> bool:
    """Whether a ``Content-Type`` value is JSON (``application/json``, ``*/*+json``).

    Example:
        >>> [is_json_media_type(v) for v in ("application/json; charset=utf-8", None, "text/plain")]
        [True, False, False]
    """
    if value is None:
        return False
    media = value.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.endswith("+json") and "/" in media)


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """``host`` as an IP address (an IPv4-mapped IPv6 address as its IPv4 one), or None."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _split_port(value: str) -> tuple[str, int | None] | None:
    """``host[:port]`` split into the host (an IPv6 address without its brackets) and the port;
    None when the port part is malformed. The host itself is not checked."""
    if value.startswith("["):
        host, bracket, rest = value[1:].partition("]")
        if not bracket:
            return None
    else:
        host, colon, port = value.partition(":")
        rest = colon + port
    if not rest:
        return host, None
    if rest[0] != ":" or not rest[1:].isdigit() or len(rest) > 6 or int(rest[1:]) > 65535:
        return None
    return host, int(rest[1:])


def _host_and_port(value: str) -> tuple[str, int | None] | None:
    """The lower-cased host (an IPv6 address without its brackets) and the port of a
    ``host[:port]`` text, or None when it is malformed.

    Example:
        >>> _host_and_port("[::1]:8000"), _host_and_port("LocalHost"), _host_and_port("a b")
        (('::1', 8000), ('localhost', None), None)
    """
    split = _split_port(value.lower())
    if split is None:
        return None
    if value.startswith("["):
        try:
            ipaddress.IPv6Address(split[0])
        except ValueError:
            return None
    elif not _NAME.fullmatch(split[0]):
        return None
    return split


@dataclass(frozen=True)
class _HostPattern:
    """One host pattern (see the module docstring), compiled."""

    text: str
    network: ipaddress.IPv4Network | ipaddress.IPv6Network | None = None
    suffix: str | None = None

    @classmethod
    def compile(cls, pattern: str, what: str) -> _HostPattern:
        text = pattern.strip().lower()
        if text == "*":
            return cls(text)
        inner = text[1:-1] if text.startswith("[") and text.endswith("]") else text
        try:
            return cls(text, network=ipaddress.ip_network(inner, strict=False))
        except ValueError:
            pass
        name = text[2:] if text.startswith("*.") else text
        if not _NAME.fullmatch(name):
            raise InvalidArgumentError(
                f"{what} takes host patterns (*, a name, *.example.com, an address or a network "
                f"such as 127.0.0.0/8; no port: any port matches), actual: {pattern!r:.100}."
            )
        return cls(text, suffix=text[1:] if text.startswith("*.") else None)

    def matches(self, host: str) -> bool:
        if self.text == "*":
            return True
        if self.network is not None:
            address = _address(host)
            return address is not None and address in self.network
        if self.suffix is not None:
            return host.endswith(self.suffix)
        return host == self.text


@dataclass(frozen=True)
class _OriginPattern:
    """One origin pattern: a host pattern (any scheme and port), a whole origin, or ``null``."""

    host: _HostPattern | None
    scheme: str | None = None
    port: int | None = None

    @classmethod
    def compile(cls, pattern: str) -> _OriginPattern:
        text = pattern.strip().lower().rstrip("/")
        if text == "null":
            return cls(None)
        if "://" not in text:
            return cls(_HostPattern.compile(text, "allowed_origins"))
        scheme, _, rest = text.partition("://")
        split = _split_port(rest)
        if not _SCHEME.fullmatch(scheme) or split is None or split[0] == "*":
            raise InvalidArgumentError(
                "allowed_origins takes host patterns, whole origins (https://app.example.com, "
                f"http://localhost:3000) or null, actual: {pattern!r:.100}."
            )
        port = split[1] if split[1] is not None else _DEFAULT_PORTS.get(scheme)
        return cls(_HostPattern.compile(split[0], "allowed_origins"), scheme, port)

    def matches(self, origin: str) -> bool:
        if self.host is None:
            return origin == "null"
        if self.host.text == "*":  # any origin, "null" included
            return True
        scheme, sep, rest = origin.partition("://")
        parsed = _host_and_port(rest) if sep else None
        if parsed is None or not self.host.matches(parsed[0]):
            return False
        if self.scheme is None:
            return True
        port = parsed[1] if parsed[1] is not None else _DEFAULT_PORTS.get(scheme)
        return scheme == self.scheme and port == self.port


@dataclass(frozen=True)
class Refusal:
    """Why a request is refused: the answer's status, a message that names the remedy, and the
    header at fault."""

    status: int
    message: str
    header: str


@dataclass(frozen=True)
class AccessPolicy:
    """The hosts and origins a server answers (patterns: see the module docstring).

    Raises:
        InvalidArgumentError: for a pattern that is none of the accepted forms.
    """

    allowed_hosts: Sequence[str] = LOOPBACK
    """What the ``Host`` header may name."""
    allowed_origins: Sequence[str] = LOOPBACK
    """What the ``Origin`` header may name (a request without one is always allowed)."""
    _hosts: tuple[_HostPattern, ...] = field(init=False, repr=False, compare=False)
    _origins: tuple[_OriginPattern, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("allowed_hosts", "allowed_origins"):
            value = getattr(self, name)
            if isinstance(value, str) or not all(isinstance(p, str) for p in value):
                raise InvalidArgumentError(
                    f"{name} must be a sequence of pattern strings, actual: {value!r:.100}."
                )
            object.__setattr__(self, name, tuple(value))
        hosts = tuple(_HostPattern.compile(p, "allowed_hosts") for p in self.allowed_hosts)
        object.__setattr__(self, "_hosts", hosts)
        origins = tuple(_OriginPattern.compile(p) for p in self.allowed_origins)
        object.__setattr__(self, "_origins", origins)

    @classmethod
    def local(
        cls, bind_host: str | None = None, hosts: Iterable[str] = (), origins: Iterable[str] = ()
    ) -> AccessPolicy:
        """Loopback plus ``hosts`` and ``origins``; a server bound to one address (not a
        wildcard such as ``0.0.0.0``) also answers a ``Host`` that is that address."""
        bound: tuple[str, ...] = ()
        if bind_host is not None and bind_host not in _WILDCARD_BINDS:
            as_header = f"[{bind_host}]" if ":" in bind_host else bind_host
            if not cls(LOOPBACK, ()).host_allowed(as_header):
                bound = (bind_host,)
        return cls((*LOOPBACK, *bound, *hosts), (*LOOPBACK, *origins))

    def host_allowed(self, value: str) -> bool:
        """Whether a ``Host`` header value (``host[:port]``) names an allowed host."""
        parsed = _host_and_port(value)
        return parsed is not None and any(p.matches(parsed[0]) for p in self._hosts)

    def origin_allowed(self, value: str) -> bool:
        """Whether an ``Origin`` header value names an allowed origin."""
        origin = value.strip().lower()
        return any(p.matches(origin) for p in self._origins)

    def check(self, scope: Any) -> Refusal | None:
        """Why the request of an ASGI ``http`` or ``websocket`` scope is refused, or None."""
        headers: dict[str, list[str]] = {}
        for key, raw in scope.get("headers") or ():
            headers.setdefault(key.decode("latin-1").lower(), []).append(raw.decode("latin-1"))
        host = headers.get("host", [])
        if len(host) != 1 or not self.host_allowed(host[0]):
            parsed = _host_and_port(host[0]) if len(host) == 1 else None
            shown = f"{host[0]!r:.100}" if len(host) == 1 else f"{len(host)} Host headers"
            name = parsed[0] if parsed is not None else "HOST"
            return Refusal(
                HTTPStatus.BAD_REQUEST,
                f"This server answers requests for the hosts {', '.join(self.allowed_hosts)}; "
                f"actual Host: {shown} (a web page can point a name of its own at this address). "
                f"To serve clients that use another name, start the server with {HOSTS_OPTION} "
                f"{name:.100} (allowed_hosts= in Python).",
                "Host",
            )
        origin = headers.get("origin")
        if origin is not None and (len(origin) != 1 or not self.origin_allowed(origin[0])):
            shown = f"{origin[0]!r:.100}" if len(origin) == 1 else f"{len(origin)} Origin headers"
            return Refusal(
                HTTPStatus.FORBIDDEN,
                f"This server answers web pages from {', '.join(self.allowed_origins)} only "
                f"(requests without an Origin header, as from the openai SDK or curl, are "
                f"answered); actual Origin: {shown}. To allow that page, start the server with "
                f"{ORIGINS_OPTION} ORIGIN (allowed_origins= in Python).",
                "Origin",
            )
        length = headers.get("content-length", ["0"])
        has_body = "transfer-encoding" in headers or length != ["0"]
        content_type = headers.get("content-type")
        if scope["type"] == "http" and has_body and not (
            content_type is not None and len(content_type) == 1
            and is_json_media_type(content_type[0])
        ):  # fmt: skip
            shown = f"{content_type[0]!r:.100}" if content_type else "none"
            return Refusal(
                HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
                f"A request body must be JSON (Content-Type: application/json); actual "
                f"Content-Type: {shown}. Send the header Content-Type: application/json.",
                "Content-Type",
            )
        return None


def detail_body(refusal: Refusal) -> bytes:
    """``{"detail": message}``: FastAPI's error shape (what OpenEnv's clients read)."""
    return json.dumps({"detail": refusal.message}).encode()


class AccessGuard:
    """ASGI middleware that answers a request :meth:`AccessPolicy.check` refuses (HTTP and
    WebSocket handshakes alike) and passes every other one to ``app``.

    Args:
        app: The application behind the guard.
        policy: The hosts and origins allowed.
        body: The JSON body of a refusal (default ``{"detail": message}``).
    """

    def __init__(
        self,
        app: Any,
        policy: AccessPolicy | None = None,
        body: Callable[[Refusal], bytes] = detail_body,
    ) -> None:
        self.app = app
        self.policy = policy or AccessPolicy()
        self.body = body

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        refusal = None
        if scope["type"] in ("http", "websocket"):
            refusal = self.policy.check(scope)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        body = self.body(refusal)
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),  # a refused body is left unread
        ]
        extensions = scope.get("extensions") or {}
        if scope["type"] == "websocket" and "websocket.http.response" not in extensions:
            # a server without the denial-response extension answers this close with a 403
            await send({"type": "websocket.close", "code": 1008, "reason": refusal.header})
            return
        prefix = "websocket." if scope["type"] == "websocket" else ""
        start = {"type": f"{prefix}http.response.start", "status": refusal.status}
        await send({**start, "headers": headers})
        await send({"type": f"{prefix}http.response.body", "body": body})


def _patterns(text: str) -> list[str]:
    return [p.strip() for p in text.split(",") if p.strip()]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``--allowed-hosts`` and ``--allowed-origins`` options of a server command."""
    parser.add_argument(
        HOSTS_OPTION,
        default="",
        metavar="HOSTS",
        help="comma-separated Host header values to answer besides loopback (localhost, "
        "127.0.0.0/8, ::1; and the --host address): names, *.example.com, addresses, networks "
        "such as 10.0.0.0/8, or * for any (the server then trusts DNS; any port matches)",
    )
    parser.add_argument(
        ORIGINS_OPTION,
        default="",
        metavar="ORIGINS",
        help="comma-separated web origins whose pages may call the server besides loopback "
        "ones: https://app.example.com (that origin), a host pattern as for --allowed-hosts "
        "(any scheme and port), null, or * for any page (clients that send no Origin, such as "
        "the openai SDK and curl, are always answered)",
    )


def policy_from_args(args: argparse.Namespace) -> AccessPolicy:
    """The :class:`AccessPolicy` of a server command's ``--host`` and :func:`add_arguments`
    options."""
    return AccessPolicy.local(
        args.host, _patterns(args.allowed_hosts), _patterns(args.allowed_origins)
    )
