"""The fourth hostile-input campaign: what the third did not reach, and a new output path.

``llm-gym serve`` under many streaming clients at once that leave mid-answer, and a client that
never reads its stream; model loading given a dtype name that is not a dtype; result files
written through another user's link. (Eval reports to ``/dev/full``, a FIFO or a full folder
are in the third campaign's file, beside the other output paths.)

=========================  ==========================================  ========================
class                      before                                      now
=========================  ==========================================  ========================
many streams, most leave   (contained, now tested) each stream that    its generation stops at
                           loses its client, mid-answer or while it    the next token
                           waits its turn
a client that never reads  (contained, now tested) a stream's events   another client is served
its stream                 queue for it alone                          at once
``serve --dtype`` and      any torch attribute: ``manual_seed`` got    refused before any file
``hf:PATH?dtype=``         as far as transformers; ``hf:`` had no      is read, naming the three
                           check at all                                dtypes (argparse choices)
result files through a     an eval report followed another user's      refused (a rename skips
link in a shared folder    link as a write would not                   the kernel's link rule);
                           (``protected_symlinks``), and came out      a rewrite keeps the old
                           0644 whatever the file's mode or umask      file's mode, a new file
                                                                       the umask's
=========================  ==========================================  ========================
"""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

from llm_gym import InvalidArgumentError  # noqa: E402
from llm_gym.serving.generation import TokenOut  # noqa: E402
from llm_gym.serving.openai_server import ChatCompletionServer, serve  # noqa: E402

USER = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def served(small_model_dir):
    with serve(small_model_dir, model_name="tiny", device="cpu") as server:
        yield server


def _scripted(
    monkeypatch, server: ChatCompletionServer, delay: float, words: int = 400
) -> dict[str, Any]:
    """The model "writes" ``words`` words, ``delay`` seconds a token; counts the tokens."""
    ids = server.tokenizer.encode("word " * words, add_special_tokens=False)
    counts: dict[str, Any] = {"emitted": 0, "started": 0}

    def fake(model, prompt_ids, sampling, *, eos_ids, pad_id, on_token) -> None:
        counts["started"] += 1
        for token_id in [*ids, eos_ids[0]][: sampling.max_tokens]:
            time.sleep(delay)
            counts["emitted"] += 1
            if on_token(TokenOut(token_id, None, ())):
                return

    monkeypatch.setattr("llm_gym.serving.engine.sample_tokens", fake)
    return counts


def _settled(counts: dict[str, Any]) -> int:
    before, deadline = -1, time.monotonic() + 15
    while counts["emitted"] != before and time.monotonic() < deadline:
        before = counts["emitted"]
        time.sleep(0.3)
    return counts["emitted"]


def _raw_request(
    server: ChatCompletionServer, body: dict[str, Any], receive_buffer: int | None = None
) -> socket.socket:
    data = json.dumps(body)
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        "Content-Type: application/json\r\n"
    )
    sock = socket.socket()
    if receive_buffer is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.connect((server.host, server.port))
    sock.sendall(f"{head}Content-Length: {len(data)}\r\n\r\n{data}".encode())
    return sock


def test_many_streams_whose_clients_leave_cost_a_few_tokens_each(served, monkeypatch) -> None:
    """Eight streaming clients at once that leave after their first event, and four whose
    request waits its turn (the engine answers one at a time) and who give up before it comes:
    at 400 tokens of 5 ms each, generated for nobody they would hold the next client ~24 s."""
    counts = _scripted(monkeypatch, served, delay=0.005)
    client = openai.OpenAI(base_url=served.url, api_key="unused", max_retries=0, timeout=60)
    left: list[int] = []

    def leave_after_the_first_event() -> None:
        stream = client.chat.completions.create(
            model="tiny", messages=USER, stream=True, max_tokens=400
        )
        next(iter(stream))
        stream.close()
        left.append(1)

    threads = [threading.Thread(target=leave_after_the_first_event) for _ in range(8)]
    for thread in threads:
        thread.start()
    body = {"model": "tiny", "messages": USER, "stream": True, "max_tokens": 400}
    for _ in range(4):
        _raw_request(served, body).close()
    for thread in threads:
        thread.join(60)
    assert len(left) == 8
    start = time.monotonic()
    survivor = client.chat.completions.create(model="tiny", messages=USER, max_tokens=40)
    assert survivor.choices[0].finish_reason == "length"
    assert time.monotonic() - start < 10
    assert _settled(counts) < 40 + 12 * 60  # each that left: its generation stopped at once
    assert counts["started"] <= 13  # the queued ones reached the engine or were skipped


def test_a_client_that_never_reads_its_stream_blocks_nobody(served, monkeypatch) -> None:
    """A stream whose client reads nothing: ~0.5 MB of events for a 1 KB receive buffer (the
    server's sends wait on it): the server keeps its events for it and answers others."""
    counts = _scripted(monkeypatch, served, delay=0.0, words=3000)
    body = {"model": "tiny", "messages": USER, "stream": True, "max_tokens": 3000}
    with _raw_request(served, body, receive_buffer=1024) as sleeper:
        deadline = time.monotonic() + 15
        while counts["emitted"] <= 2000 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert counts["emitted"] > 2000  # generated: the sends wait, not the model
        client = openai.OpenAI(base_url=served.url, api_key="unused", max_retries=0, timeout=30)
        start = time.monotonic()
        for _ in range(3):
            answer = client.chat.completions.create(model="tiny", messages=USER, max_tokens=20)
            assert answer.choices[0].message.content
        assert time.monotonic() - start < 10
        sleeper.settimeout(5)
        assert sleeper.recv(64).startswith(b"HTTP/1.1 200")  # its answer waited for it


@pytest.mark.parametrize("dtype", ["manual_seed", "Tensor", "float64", "", 16, None])
def test_a_dtype_that_is_not_a_model_dtype_is_refused_before_loading(dtype, monkeypatch) -> None:
    import transformers

    from llm_gym.policies.hf import HFPolicy
    from llm_gym.policies.loading import load_for_generation

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", pytest.fail)
    for load in (load_for_generation, HFPolicy.from_pretrained):
        with pytest.raises(InvalidArgumentError, match=r"dtype must be one of \['float32'"):
            load("/nonexistent-model", dtype=dtype)
    with pytest.raises(InvalidArgumentError, match="dtype must be one of"):
        serve("/nonexistent-model", dtype=dtype)


def test_cli_serve_lists_the_dtypes(capsys) -> None:
    from llm_gym.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "/nonexistent-model", "--dtype", "manual_seed"])
    assert exit_info.value.code == 2
    assert "choose from 'float32', 'bfloat16', 'float16'" in capsys.readouterr().err


def test_result_files_keep_their_mode_and_never_follow_another_users_link(tmp_path) -> None:
    import os

    from llm_gym.eval import run_and_report
    from llm_gym.eval.files import write_atomic

    private = tmp_path / "private.json"
    private.write_text("old")
    private.chmod(0o600)
    run_and_report("Math-v0", "oracle", episodes=1, progress=False, print_report=False,
                   output=private)  # fmt: skip
    assert private.stat().st_mode & 0o777 == 0o600 and json.loads(private.read_text())
    old_umask = os.umask(0o077)
    try:
        assert write_atomic(tmp_path / "new.md", "x").stat().st_mode & 0o777 == 0o600
    finally:
        os.umask(old_umask)
    if os.geteuid() != 0:
        pytest.skip("making a link another user owns needs root")
    victim = tmp_path / "victim"
    victim.write_text("keep")
    link = tmp_path / "planted.json"
    link.symlink_to(victim)
    os.lchown(link, 12345, -1)
    with pytest.raises(InvalidArgumentError, match="symbolic link that another user owns"):
        run_and_report("Math-v0", "oracle", print_report=False, output=link)
    with pytest.raises(PermissionError, match="another user owns"):
        write_atomic(link, "overwritten")
    assert victim.read_text() == "keep"
