"""A chat template that loops (llm_gym.policies.template_render): a model file's template is
untrusted code. Its render is stopped at the deadline with an error that names the template, at
a server's start-up (the probes) and per request, and other requests are served meanwhile."""

from __future__ import annotations

import copy
import http.client
import json
import threading
import time
from types import SimpleNamespace

import pytest

from llm_gym.policies.chat import render_chat
from llm_gym.policies.template_render import (
    DEFAULT_RENDER_DEADLINE_S,
    TemplateTimeoutError,
    apply_template,
    render_deadline,
)
from tests.test_template_tools import SMOLLM2_TEMPLATE

pytest.importorskip("transformers")

LOOP = "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"
"""10^10 iterations with no call in the loop body: no sandbox hook ever runs."""
TRIGGERED = (
    "{% for m in messages %}{% if 'TRIGGER' in m['content'] %}" + LOOP + "{% endif %}{% endfor %}"
) + SMOLLM2_TEMPLATE
"""SmolLM2's template with a loop behind a trigger word."""
USER = [{"role": "user", "content": "Hi."}]


@pytest.fixture
def tokenizer(small_model):
    tokenizer = copy.deepcopy(small_model[1])
    tokenizer.chat_template = TRIGGERED
    tokenizer.name_or_path = "hostile/looping-model"
    return tokenizer


def test_a_looping_render_is_stopped_at_its_deadline_naming_the_template(tokenizer) -> None:
    trigger = [{"role": "user", "content": "TRIGGER"}]
    start = time.monotonic()
    with pytest.raises(TemplateTimeoutError, match=r"hostile/looping-model.*within 0\.3 s"):
        apply_template(tokenizer, trigger, add_generation_prompt=True, deadline_s=0.3)
    assert time.monotonic() - start < 2.0
    with render_deadline(0.3), pytest.raises(TemplateTimeoutError):
        render_chat(tokenizer, trigger, None, add_generation_prompt=True)  # a rollout's render
    assert "Hi." in apply_template(tokenizer, USER, add_generation_prompt=True, deadline_s=0.3)


def test_a_render_that_ends_at_its_deadline_leaves_no_stray_stop(tokenizer) -> None:
    """Deadlines as short as a render: each ends in time or raises, and no stop fires later
    in the thread."""
    stopped = 0
    for index in range(3000):
        try:
            apply_template(
                tokenizer, USER, add_generation_prompt=True, deadline_s=2e-5 * (index % 5)
            )
        except TemplateTimeoutError:
            stopped += 1
        total = sum(range(200))  # Python bytecode: where a stray stop would land
    assert total == 19900 and 0 < stopped < 3000


def test_a_server_does_not_start_on_a_template_that_always_loops(small_model) -> None:
    from llm_gym.serving.engine import Engine

    tokenizer = copy.deepcopy(small_model[1])
    tokenizer.chat_template = LOOP + SMOLLM2_TEMPLATE
    start = time.monotonic()
    with pytest.raises(TemplateTimeoutError, match="did not finish within 0.3 s"):
        Engine(small_model[0], tokenizer, render_deadline_s=0.3)
    assert time.monotonic() - start < 3.0


def _post(port: int, content: str, out: dict, key: str) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": content}], "max_tokens": 2}
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request(
            "POST",
            "/v1/chat/completions",
            json.dumps(body),
            {"Host": "127.0.0.1", "Content-Type": "application/json"},
        )
        response = connection.getresponse()
        out[key] = (response.status, json.loads(response.read()), time.monotonic())
    finally:
        connection.close()


@pytest.mark.filterwarnings("ignore:the chat template of hostile")
def test_a_request_that_makes_the_template_loop_gets_a_400_and_others_are_served(
    small_model, tokenizer
) -> None:
    pytest.importorskip("uvicorn")
    from llm_gym.serving.openai_server import ChatCompletionServer

    with ChatCompletionServer(
        small_model[0], tokenizer, model_name="m", render_deadline_s=6.0
    ) as server:
        out: dict = {}
        hostile = threading.Thread(target=_post, args=(server.port, "TRIGGER", out, "hostile"))
        hostile.start()
        time.sleep(0.3)  # the hostile render is running
        for index in range(2):
            _post(server.port, f"Hello {index}.", out, f"plain{index}")
        hostile.join(30)
    status, body, hostile_end = out["hostile"]
    assert status == 400
    assert "hostile/looping-model" in body["error"]["message"]
    assert "did not finish within 6 s" in body["error"]["message"]
    for index in range(2):
        plain_status, _, plain_end = out[f"plain{index}"]
        assert plain_status == 200 and plain_end < hostile_end  # served meanwhile


def test_the_sft_alignment_probe_is_stopped_at_the_deadline(tokenizer) -> None:
    """trainers.chat_template's probe renders the model's own template: a template that loops
    on every render stops there with the timeout, never taken as "not aligned"."""
    pytest.importorskip("trl")
    from trainers.chat_template import rl_aligned_chat_template

    tokenizer.chat_template = LOOP + SMOLLM2_TEMPLATE
    start = time.monotonic()
    with render_deadline(0.3), pytest.raises(TemplateTimeoutError, match="hostile/looping"):
        rl_aligned_chat_template(tokenizer)
    assert time.monotonic() - start < 3.0


def test_the_serve_command_takes_the_render_deadline(monkeypatch) -> None:
    import io

    import llm_gym.serving
    from llm_gym.cli import build_parser
    from llm_gym.serving import cli as serve_cli

    seen: dict[str, object] = {}

    def fake_serve(model_path, **options):  # type: ignore[no-untyped-def]
        seen.update(options)
        return SimpleNamespace(model_name=model_path, url="http://127.0.0.1:0")

    monkeypatch.setattr(llm_gym.serving, "serve", fake_serve)
    for extra, expected in (([], DEFAULT_RENDER_DEADLINE_S), (["--render-deadline-s", "0.5"], 0.5)):
        args = build_parser().parse_args(["serve", "some-model", *extra])
        assert serve_cli.run(args, io.StringIO(), lambda *_: 0) == 0
        assert seen["render_deadline_s"] == expected


def test_a_stop_that_fires_while_the_watch_registers_is_a_timeout(tokenizer, monkeypatch) -> None:
    """The watchdog may fire before ``watch()`` returns (a deadline shorter than the
    registration): the stop is raised inside the region that turns it into the timeout, and
    nothing is left pending for the thread's next call."""
    from llm_gym.policies import template_render

    class FiresAtOnce:
        def watch(self, watch, seconds):  # type: ignore[no-untyped-def]
            watch.fire()  # pending in this thread: raised at its next bytecode boundary
            sum(range(100))  # a few bytecodes: the stop lands here, inside watch()

    monkeypatch.setattr(template_render, "_WATCHDOG", FiresAtOnce())
    with pytest.raises(TemplateTimeoutError):
        apply_template(tokenizer, USER, add_generation_prompt=True, deadline_s=1.0)
    monkeypatch.undo()
    for _ in range(50):  # nothing pending: the next renders run to their end
        assert "Hi." in apply_template(tokenizer, USER, add_generation_prompt=True, deadline_s=5)
