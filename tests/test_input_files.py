"""Hostile input files (llm_gym.core.input_files, and every reader built on it: task files,
train.py configs, leaderboard records, cached build records).

=========================  ==========================================  ========================
input                      without the mechanism                       with it
=========================  ==========================================  ========================
``/dev/zero`` as a task    read until memory ran out                   refused: "a device"
file
a FIFO as a task file or   the open blocked until a writer came        refused at once:
a cached build record      (forever)                                   "a FIFO"
a file past its kind's     read whole                                  refused before reading,
limit                                                                  the limit named
a file whose size says 0   read whole                                  reading stops at the
and whose content is not                                               limit
JSON nested 100,000 deep   RecursionError (a build record), or         InvalidArgumentError:
                           "nested too deeply" only after the parser    "nested more than 100
                           recursed (a task file)                       levels deep"
=========================  ==========================================  ========================
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from llm_gym.core.input_files import (
    InputLimit,
    check_json_depth,
    input_lines,
    loads_json,
    read_input,
    read_input_text,
)
from llm_gym.errors import InvalidArgumentError

LIMIT = InputLimit("task file", 1 << 20, "tests.LIMIT", "a JSONL file")


def _within(seconds: float, call):
    """``call()``'s outcome, or a failure when it blocks past ``seconds`` (a FIFO's open)."""
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as exc:  # handed to the test
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"blocked for more than {seconds} s"
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome.get("value")


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "tasks.jsonl"
    os.mkfifo(path)
    return path


@pytest.mark.parametrize(
    ("name", "kind"),
    [("/dev/zero", "a device"), ("<fifo>", "a FIFO"), ("<dir>", "a directory")],
)
def test_what_is_not_a_regular_file_is_refused_without_blocking(
    name: str, kind: str, fifo: Path, tmp_path: Path
) -> None:
    path = {"<fifo>": fifo, "<dir>": tmp_path}.get(name, name)
    for read in (lambda: read_input(path, LIMIT), lambda: list(input_lines(path, LIMIT))):
        with pytest.raises(InvalidArgumentError, match=f"is {kind}, not a regular file") as info:
            _within(5, read)
        assert "give a JSONL file" in str(info.value) and str(path) in str(info.value)


def test_a_link_to_a_fifo_is_judged_by_what_it_opens(fifo: Path, tmp_path: Path) -> None:
    link = tmp_path / "link.jsonl"
    link.symlink_to(fifo)
    with pytest.raises(InvalidArgumentError, match="is a FIFO"):
        _within(5, lambda: read_input(link, LIMIT))


def test_missing_and_unopenable_paths_are_named(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="No such task file: '.*nope'"):
        read_input(tmp_path / "nope", LIMIT)
    (tmp_path / "file").write_text("x")
    with pytest.raises(InvalidArgumentError, match="Cannot open the task file .*Not a directory"):
        read_input(tmp_path / "file" / "under", LIMIT)


def test_a_file_past_its_limit_is_refused_naming_the_limit(tmp_path: Path) -> None:
    path = tmp_path / "big.jsonl"
    path.write_bytes(b"x" * 101)
    small = InputLimit("task file", 100, "trainers.grpo.train.MAX_TASK_FILE_BYTES")
    for read in (read_input, lambda p, limit: list(input_lines(p, limit))):
        with pytest.raises(InvalidArgumentError) as info:
            read(path, small)
        assert "larger than 100 bytes (the limit trainers.grpo.train.MAX_TASK_FILE_BYTES)" in str(
            info.value
        )
    path.write_bytes(b"x" * 100)
    assert read_input(path, small) == b"x" * 100


def test_reading_stops_at_the_limit_whatever_the_size_says(tmp_path: Path) -> None:
    maps = Path("/proc/self/maps")  # a regular file whose size is 0 and whose content is not
    if not maps.exists() or maps.stat().st_size != 0:
        pytest.skip("needs Linux's /proc")
    small = InputLimit("task file", 64, "tests.SMALL")
    with pytest.raises(InvalidArgumentError, match="larger than 64 bytes"):
        read_input(maps, small)
    with pytest.raises(InvalidArgumentError, match="larger than 64 bytes"):
        list(input_lines(maps, small))


def test_text_must_be_utf8(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"\xef\xbb\xbfmodel: caf\xe9\n")
    with pytest.raises(InvalidArgumentError, match=r"not UTF-8 text \(byte 13: b'\\xe9'\)"):
        read_input_text(path, LIMIT)
    path.write_bytes(b"\xef\xbb\xbfmodel: x\n")
    assert read_input_text(path, LIMIT) == "model: x\n"  # the byte-order mark dropped


def test_json_nested_100000_deep_is_refused_before_parsing() -> None:
    for text in ("[" * 100_000 + "]" * 100_000, '{"a": ' * 100_000, "[" * 100_000):
        with pytest.raises(InvalidArgumentError, match="nested more than 100 levels deep"):
            loads_json(text)  # RecursionError from the parser without the check
    assert loads_json("[" * 100 + "]" * 100) is not None
    check_json_depth('["' + "[" * 1000 + '", "\\"[[[["]')  # brackets in strings are text


def test_load_tasks_refuses_devices_fifos_and_deep_lines(fifo: Path, tmp_path: Path) -> None:
    from trainers.grpo.train import load_tasks

    with pytest.raises(InvalidArgumentError, match="is a device, not a regular file"):
        _within(5, lambda: load_tasks("/dev/zero"))  # read until MemoryError without the check
    with pytest.raises(InvalidArgumentError, match="is a FIFO, not a regular file"):
        _within(5, lambda: load_tasks(fifo))  # blocked in open without O_NONBLOCK
    deep = tmp_path / "deep.jsonl"
    deep.write_text('{"prompt": "x"}\n{"prompt": "y", "metadata": {"a": ' + "[" * 100_000 + "\n")
    with pytest.raises(InvalidArgumentError, match=f"{deep}:2: .*nested more than 100 levels"):
        load_tasks(deep)


def test_load_tasks_names_its_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import trainers.grpo.train

    path = tmp_path / "tasks.jsonl"
    path.write_text('{"prompt": "a"}\n' * 10)
    monkeypatch.setattr(trainers.grpo.train, "MAX_TASK_FILE_BYTES", 100)
    with pytest.raises(InvalidArgumentError, match=r"MAX_TASK_FILE_BYTES\); is it the right"):
        trainers.grpo.train.load_tasks(path)
    monkeypatch.setattr(trainers.grpo.train, "MAX_TASK_FILE_BYTES", 1000)
    assert len(trainers.grpo.train.load_tasks(path)) == 10


def test_a_cached_build_record_that_is_a_fifo_counts_as_missing(tmp_path: Path) -> None:
    from llm_gym.policies.gguf import read_build_info

    os.mkfifo(tmp_path / "build_info.json")
    assert _within(5, lambda: read_build_info(tmp_path)) is None  # a plain read blocks
    (tmp_path / "build_info.json").unlink()
    (tmp_path / "build_info.json").write_text("[" * 100_000)
    assert read_build_info(tmp_path) is None  # a parser's RecursionError is no ValueError


TASK_FILES = {
    "nested too deeply": (b'{"prompt": "x", "metadata": ' + b"[" * 100_000 + b"}", "deeply"),
    "not UTF-8": (b'{"prompt": "\xff"}', "codec can't decode"),
    "metadata as a list": (b'{"prompt": "x", "metadata": [1]}', "metadata must be a mapping"),
    "an id as a dict": (b'{"prompt": "x", "id": {"a": 1}}', "Task.id must be"),
    "5,000 digits": (b'{"prompt": "x", "target": ' + b"9" * 5000 + b"}", "digits"),
    "no prompt": (b'{"target": 1}', "needs a 'prompt'"),
}


@pytest.mark.parametrize("name", list(TASK_FILES))
def test_hostile_task_files_name_the_line(name: str, tmp_path: Path) -> None:
    from trainers.grpo.train import load_tasks

    row, message = TASK_FILES[name]
    path = tmp_path / "tasks.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"prompt": "fine"}\n\n' + row + b"\n")  # a BOM is fine
    with pytest.raises(InvalidArgumentError, match=message) as caught:
        load_tasks(path)
    assert f"{path}:3:" in str(caught.value)


def test_task_file_that_is_a_directory_is_named(tmp_path) -> None:
    from llm_gym import InvalidArgumentError
    from trainers.grpo.train import load_tasks

    with pytest.raises(InvalidArgumentError, match="is a directory"):
        load_tasks(tmp_path)
