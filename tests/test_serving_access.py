"""Who may use ``llm-gym serve``: the Host, Origin and Content-Type policy of
:mod:`llm_gym.serving.access`, its patterns, its command-line options, and the served app.

The hostile requests are what a web page can send to a server on loopback without asking: a
``POST`` of a Blob (no ``Content-Type``, no preflight), any request with its own ``Origin``,
and requests for a name of its own pointed at 127.0.0.1 (DNS rebinding). ``serve-env``'s side
is in ``tests/test_openenv_hostile.py``.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from llm_gym.cli import build_parser
from llm_gym.errors import InvalidArgumentError
from llm_gym.serving.access import LOOPBACK, AccessPolicy, policy_from_args

pytest.importorskip("starlette")
pytest.importorskip("httpx")

from starlette.testclient import TestClient

from llm_gym.serving.app import build_app

CHAT = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hi"}]})


# --- the policy --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "allowed"),
    [
        ("localhost", True),
        ("LOCALHOST:8000", True),
        ("127.0.0.1:8000", True),
        ("127.4.5.6", True),
        ("[::1]:8000", True),
        ("[::ffff:127.0.0.1]:80", True),
        ("evil.example", False),
        ("localhost.evil.example", False),
        ("127.0.0.1.evil.example", False),
        ("127.1", False),
        ("0.0.0.0", False),
        ("10.0.0.1", False),
        ("::1", False),  # an IPv6 host goes in brackets
        ("[::1", False),
        ("localhost:99999", False),
        ("localhost:", False),
        ("local host", False),
        ("", False),
    ],
)
def test_loopback_hosts_only_by_default(host: str, allowed: bool) -> None:
    assert AccessPolicy().host_allowed(host) is allowed


@pytest.mark.parametrize(
    ("origin", "allowed"),
    [
        ("http://localhost:3000", True),
        ("https://127.0.0.1", True),
        ("http://[::1]:5173", True),
        ("https://evil.example", False),
        ("http://localhost.evil.example", False),
        ("null", False),
        ("file://", False),
        ("garbage", False),
        ("http://localhost/path", False),
    ],
)
def test_loopback_origins_only_by_default(origin: str, allowed: bool) -> None:
    assert AccessPolicy().origin_allowed(origin) is allowed


def test_patterns_allow_names_subdomains_networks_and_whole_origins() -> None:
    policy = AccessPolicy.local(
        hosts=["api.example.com", "*.corp.example", "10.0.0.0/8"],
        origins=["https://app.example.com", "*.pages.example", "null"],
    )
    assert all(
        policy.host_allowed(h)
        for h in ("api.example.com:443", "a.b.corp.example", "10.9.8.7:80", "localhost")
    )
    assert not any(
        policy.host_allowed(h)
        for h in ("example.com", "corp.example", "11.0.0.1", "xapi.example.com")
    )
    assert all(
        policy.origin_allowed(o)
        for o in (
            "https://app.example.com",
            "https://APP.example.com:443",
            "http://x.pages.example:1",
        )
    )
    assert policy.origin_allowed("null") and policy.origin_allowed("http://localhost:1")
    # a whole origin is that scheme, host and port only
    assert not any(
        policy.origin_allowed(o)
        for o in ("http://app.example.com", "https://app.example.com:8443", "https://evil.example")
    )
    anything = AccessPolicy(["*"], ["*"])
    assert anything.host_allowed("evil.example") and anything.origin_allowed("null")


def test_a_server_bound_to_one_address_answers_that_address() -> None:
    assert AccessPolicy.local("192.168.1.5").host_allowed("192.168.1.5:8000")
    assert not AccessPolicy.local("0.0.0.0").host_allowed("192.168.1.5:8000")
    assert AccessPolicy.local().allowed_hosts == LOOPBACK


@pytest.mark.parametrize(
    ("hosts", "origins"),
    [
        (["localhost:8000"], []),
        (["evil*.example"], []),
        (["a/b"], []),
        (["10.0.0.0/33"], []),
        ([], ["https://"]),
        ([], ["https://*"]),
        ([], ["1http://x"]),
        ([], ["https://x:port"]),
        ("localhost", []),
    ],
)
def test_a_bad_pattern_is_refused_with_the_forms_allowed(hosts: Any, origins: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="allowed_(hosts|origins)"):
        AccessPolicy(hosts, origins)


@pytest.mark.parametrize(
    "argv",
    [
        ["serve", "model", "--allowed-hosts", "api.example.com, 10.0.0.0/8"],
        ["serve-env", "ToolUseGame-v0", "--allowed-hosts", "api.example.com,10.0.0.0/8"],
    ],
)
def test_both_server_commands_take_the_options(argv: list[str]) -> None:
    origins = ["--allowed-origins", "https://app.example.com,*"]
    policy = policy_from_args(build_parser().parse_args([*argv, *origins]))
    assert policy.host_allowed("api.example.com") and policy.host_allowed("10.1.2.3:9")
    assert policy.host_allowed("localhost") and not policy.host_allowed("evil.example")
    assert policy.origin_allowed("https://anything.example")
    default = policy_from_args(build_parser().parse_args(argv[:2]))
    assert default == AccessPolicy() and not default.origin_allowed("https://app.example.com")


# --- the served app ----------------------------------------------------------------------------


def app_client(access: AccessPolicy | None = None, host: str = "127.0.0.1:8000") -> TestClient:
    """The ``serve`` app over an engine that only names its model (a request that passes the
    guard is answered by the routes: 200 for reads, 400 for a chat body it cannot parse)."""
    engine = SimpleNamespace(model_name="tiny", created=0, chat_template_kwargs=frozenset())
    return TestClient(build_app(engine, access=access), base_url=f"http://{host}")


def test_a_foreign_host_is_refused_with_the_option_to_pass() -> None:
    for host in ("evil.example", "evil.example:8000", "127.0.0.1.nip.io"):
        answer = app_client(host=host).get("/health")
        assert answer.status_code == 400
        error = answer.json()["error"]
        assert error["param"] == "Host" and "--allowed-hosts" in error["message"]
    for host in ("localhost:8000", "127.0.0.1", "[::1]:9"):
        assert app_client(host=host).get("/health").json() == {"status": "ok"}
    allowed = AccessPolicy.local(hosts=["evil.example"])
    assert app_client(allowed, host="evil.example").get("/health").status_code == 200


def test_a_web_page_of_another_origin_is_refused_with_the_option_to_pass() -> None:
    client = app_client()
    for method, path in (("POST", "/v1/chat/completions"), ("GET", "/v1/models")):
        answer = client.request(
            method,
            path,
            content=CHAT if method == "POST" else None,
            headers={"Origin": "https://evil.example", "Content-Type": "application/json"},
        )
        assert answer.status_code == 403
        error = answer.json()["error"]
        assert error["param"] == "Origin" and "--allowed-origins" in error["message"]
    # no Origin (the openai SDK, curl) and a loopback page are answered
    assert client.get("/v1/models").status_code == 200
    assert client.get("/v1/models", headers={"Origin": "http://localhost:3000"}).status_code == 200
    opened = app_client(AccessPolicy.local(origins=["https://evil.example"]))
    assert opened.get("/v1/models", headers={"Origin": "https://evil.example"}).status_code == 200


@pytest.mark.parametrize(
    "content_type", [None, "text/plain", "application/x-www-form-urlencoded", "multipart/form-data"]
)
def test_a_body_that_is_not_declared_json_is_a_415(content_type: str | None) -> None:
    """A Blob body sends no Content-Type: read as JSON, it reached the model."""
    headers = {} if content_type is None else {"Content-Type": content_type}
    answer = app_client().post("/v1/chat/completions", content=CHAT, headers=headers)
    assert answer.status_code == 415
    error = answer.json()["error"]
    assert error["param"] == "Content-Type" and "application/json" in error["message"]


def test_a_json_body_passes_the_guard() -> None:
    answer = app_client().post(
        "/v1/completions", content="{}", headers={"Content-Type": "application/json"}
    )
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "model"
