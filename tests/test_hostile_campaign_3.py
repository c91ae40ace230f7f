"""The third hostile-input campaign: cases neither earlier campaign covered, one test per class.

Each case is bounded (well under a few seconds) and asserts containment: the same result in
bounded time, an episode outcome, or an error naming what was wrong, never a crash, a hang or a
change outside. What happened before the fix (2 shared cores) and what happens now:

=======================  =============================================  ========================
class                    before                                         now
=======================  =============================================  ========================
SQL-v0 printf ``%c``     ``printf('%.*c', 2147483647, 'x')``: 28 s in   the count is lowered to
repeat count             one instruction (no deadline check), for a     one past the length limit
                         NULL; 2**28: 3.5 s; a row of 32: ~15 min       first: same NULL, < 1 ms
serve: fields it cannot  ``logit_bias``, penalties, ``best_of``,        400 naming the field and
honour                   vLLM's                                         its neutral values (null,
                         ``top_k``/``min_p``/``guided_*``...: 200, the  ``{}``, 0, 1, ...)
                         answer generated as if they were absent
run_and_report counts    ``episodes=0``/``-5``: one task ran;           InvalidArgumentError
                         ``max_turns=0``: the registered limit ran;     naming the value, before
                         leaderboard ``--max-turns 0`` filed under 0    any episode
run_and_report output    a directory (or a path under a file):          refused before the first
                         IsADirectoryError after the whole evaluation;  episode (a device or FIFO
                         ``/dev/full``: ENOSPC after it                 too; a probe file proves
                                                                        the folder takes one)
train.py config          a directory: IsADirectoryError; ``/dev/zero``  one ``train.py: ...`` line
                         read to MemoryError; latin-1: UnicodeDecode-   naming the file, the byte
                         Error; all tracebacks                          or the 1 MiB limit
train.py ``--set`` and   ``--set seed=[``: a YAML traceback; an env,    one ``train.py: ...`` line
pre-model checks         task option or GRPO field the pipeline         (``check_pipeline`` runs
                         refuses: a traceback from ``run_pipeline``     inside the error handling)
task options message     "takes no option(s) ['foo', 'world_seed']; it  names only the refused
                         accepts: ['world_seed']"                       options
ToolUseGame world_seed   ``[1]``: ``unhashable type: 'list'``; a 1 MB   InvalidArgumentError of
                         string: a 1,000,085-character message; 10**    < 200 characters, before
                         5000: ValueError from the cache key            any cache
=======================  =============================================  ========================

Probed and already contained (kept out of this file): hostile model output to every registered
env (calculator ``1e999999``, ``9**9**9``, ``0x``, ``1_000``, Arabic-Indic digits, ``--5``,
``1<<99999999``, 200,000 unary minuses; tool names with spaces, case or full-width letters;
duplicate keys; arguments as arrays or strings; 5,000 calls in one turn; NUL, RTL and lone
surrogates), SQLite's other ``printf`` conversions with huge widths and precisions, the
``llm-gym`` CLI's other counts and env ids with path characters.
"""

from __future__ import annotations

import json
import os
import random
import re
import sqlite3
import time
from pathlib import Path

import pytest

from llm_gym.envs.sql import ReadOnlyDatabase, build_tables
from llm_gym.envs.sql.guard import apply_limits

# --- SQL-v0: printf's %c repeat count ------------------------------------------------------------


@pytest.fixture(scope="module")
def shop_db() -> ReadOnlyDatabase:
    database = ReadOnlyDatabase(build_tables("shop", 1), timeout_s=0.3)
    yield database
    database.close()


@pytest.mark.parametrize(
    "call",
    [
        "printf('%.*c', 268435456, 'x')",
        "format('%.*c', -268435456, 'x')",  # a negative count counts by its size
        "printf('%.268435456c', 'x')",  # a literal count
        "printf('%.4563402752c', 'x')",  # wraps to 268,435,456 in C's unsigned arithmetic
        "printf('%5.*c', '268435456', 'é')",  # read from text, a width in front
        "printf('%d%%%n%.*c', 1, 268435456.5, 'x')",  # after conversions that take 1 or 0 args
    ],
)
def test_sql_printf_repeat_count_is_bounded(shop_db: ReadOnlyDatabase, call: str) -> None:
    """``%c`` with a precision repeats the character, and SQLite kept looping past the length
    limit in one instruction (no deadline check): 2**28 took 3.5 s, 2**31 - 1 28 s, a row of 32
    such calls 15 minutes, for a NULL. The count is now lowered to one past the limit first."""
    start = time.perf_counter()
    _columns, rows, _cut = shop_db.execute(f"SELECT {call}, {call}")
    assert rows == [(None, None)]
    assert time.perf_counter() - start < 1.0


def test_sql_printf_gives_sqlites_results(shop_db: ReadOnlyDatabase) -> None:
    """Random formats (flags, widths, ``*``, precisions over and under the limit, ``%n``, ``%%``,
    unknown conversions) give what SQLite's own ``printf`` gives under the same limits: the
    bound reads the format as SQLite does, so no other argument is touched."""
    plain = sqlite3.connect(":memory:")
    apply_limits(plain)
    rng = random.Random(3)
    parts = [*"%-+#!0,*.", "l", "ll", "5", "25000", "12", *"cdsqnTyxfgé", " "]
    values = ["25000", "-25000", "3", "'x'", "'é'", "NULL", "2.5", "'25000'", "x'41'", "''"]
    for _ in range(400):
        fmt = "".join(rng.choice(parts) for _ in range(rng.randint(1, 12)))
        args = "".join(f", {rng.choice(values)}" for _ in range(rng.randint(0, 5)))
        sql = f"SELECT printf('{fmt}'{args}), format('{fmt}'{args})"
        assert shop_db.execute(sql)[1] == plain.execute(sql).fetchall(), sql
    plain.close()


# --- llm-gym serve: known fields it cannot honour ------------------------------------------------

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
COMPLETION = {"model": "m", "prompt": "hi"}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("logit_bias", {"50256": -100}),  # a banned token came back
        ("logit_bias", {str(i): 1 for i in range(10_000)}),
        ("logit_bias", []),
        ("presence_penalty", 0.5),
        ("frequency_penalty", float("nan")),
        ("best_of", 4),
        ("top_k", 40),
        ("top_k", True),
        ("min_p", 0.1),
        ("repetition_penalty", 1.3),
        ("min_tokens", 50),
        ("ignore_eos", True),
        ("skip_special_tokens", False),
        ("stop_token_ids", [2]),
        ("guided_json", {"type": "object"}),
        ("guided_choice", ["yes", "no"]),
    ],
)
def test_serve_refuses_sampling_fields_it_would_ignore(field: str, value: object) -> None:
    """Both endpoints took these and generated as if they were absent (200, a wrong answer for
    a client that relied on them); now a 400 names the field and the values that are fine."""
    from llm_gym.serving.chat_protocol import parse_chat_request
    from llm_gym.serving.protocol import APIError, parse_completion_request

    for parse, body in ((parse_chat_request, CHAT), (parse_completion_request, COMPLETION)):
        with pytest.raises(APIError) as info:
            parse({**body, field: value}, "m")
        assert info.value.status == 400 and info.value.param == field
        assert f"'{field}' is not supported by this server" in info.value.message
        assert len(info.value.message) < 300


def test_serve_accepts_the_neutral_values_of_those_fields() -> None:
    from llm_gym.serving.chat_protocol import parse_chat_request
    from llm_gym.serving.protocol import APIError, parse_completion_request

    neutral = {
        "logit_bias": {},
        "parallel_tool_calls": True,
        "presence_penalty": 0.0,
        "frequency_penalty": 0,
        "best_of": 1,
        "top_k": -1,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "ignore_eos": False,
        "guided_json": None,
    }
    parse_chat_request({**CHAT, **neutral}, "m")
    parse_completion_request({**COMPLETION, **neutral, "suffix": ""}, "m")
    parse_completion_request({**COMPLETION, "prompt_logprobs": 1}, "m")  # honoured there
    with pytest.raises(APIError, match="'prompt_logprobs' is not supported"):
        parse_chat_request({**CHAT, "prompt_logprobs": 1}, "m")  # not on chat


def test_serve_refuses_continuous_usage_stats_it_would_ignore() -> None:
    from llm_gym.serving.chat_protocol import parse_chat_request
    from llm_gym.serving.protocol import APIError

    stream = {**CHAT, "stream": True}
    with pytest.raises(APIError, match="continuous_usage_stats' is not supported") as info:
        parse_chat_request({**stream, "stream_options": {"continuous_usage_stats": True}}, "m")
    assert info.value.param == "stream_options.continuous_usage_stats"  # was accepted, ignored
    options = {"include_usage": True, "continuous_usage_stats": False}
    assert parse_chat_request({**stream, "stream_options": options}, "m").include_usage


# --- run_and_report / llm-gym eval / leaderboard: odd counts and output paths --------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"episodes": 0}, "episodes must be None (every task) or an int >= 1"),
        ({"episodes": -5}, "episodes must be None (every task) or an int >= 1"),
        ({"episodes": True}, "episodes must be None"),
        ({"max_turns": 0}, "max_turns must be an int >= 1"),
        ({"k": True}, "k must be an int >= 1"),
    ],
)
def test_run_and_report_refuses_counts_it_used_to_rewrite(
    options: dict[str, object], message: str
) -> None:
    """``episodes=0`` or ``-5`` ran one task, ``max_turns=0`` the registered limit: a report for
    settings nobody asked for. Now each is an error naming the value."""
    from llm_gym import InvalidArgumentError
    from llm_gym.eval import run_and_report

    with pytest.raises(InvalidArgumentError, match=re.escape(message)):
        run_and_report("Math-v0", "oracle", progress=False, print_report=False, **options)


def test_run_and_report_checks_its_output_before_the_first_episode(tmp_path, monkeypatch) -> None:
    """``output`` naming a directory (or a path under a file) raised IsADirectoryError /
    NotADirectoryError from ``save`` after the whole evaluation had run (hours with a model),
    and the CLI printed a traceback instead of the table. Now it is refused before any episode."""
    import llm_gym.eval.report as report_module
    from llm_gym import InvalidArgumentError
    from llm_gym.cli import main
    from llm_gym.eval import run_and_report

    def no_episodes(*args, **kwargs):
        raise AssertionError("an episode ran before the output was checked")

    monkeypatch.setattr(report_module, "collect_groups", no_episodes)
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    for output, message in [
        (tmp_path, "output must be a file path, got the directory"),
        (blocker / "sub" / "report.json", "is not a directory"),
    ]:
        with pytest.raises(InvalidArgumentError, match=message):
            run_and_report("Math-v0", "oracle", progress=False, print_report=False, output=output)
    assert main(["eval", "Math-v0", "--output", str(tmp_path), "--no-progress"]) == 2
    monkeypatch.undo()
    written = tmp_path / "new" / "deeper" / "report.json"  # missing folders are still made
    run_and_report(
        "Math-v0", "oracle", episodes=2, progress=False, print_report=False, output=written
    )
    assert written.is_file()


def test_an_output_that_is_no_regular_file_or_whose_folder_is_full_is_refused_up_front(
    tmp_path, monkeypatch
) -> None:
    """``--output /dev/full`` passed every permission check and failed with ENOSPC after the
    whole evaluation, as would any write into a full folder. A report is now a regular file
    written as a new file renamed over the old one: a device or FIFO is refused, and the folder
    must take a new file (a probe file), before the first episode runs."""
    import llm_gym.eval.report as report_module
    from llm_gym import InvalidArgumentError
    from llm_gym.eval import run_and_report

    monkeypatch.setattr(report_module, "collect_groups", lambda *a, **k: pytest.fail("ran"))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    link = tmp_path / "to_null"
    link.symlink_to(os.devnull)
    for output, kind in [(os.devnull, "a device"), (fifo, "a FIFO"), (link, "a device")]:
        with pytest.raises(InvalidArgumentError, match=f"regular file or a new path: .* is {kind}"):
            run_and_report("Math-v0", "oracle", print_report=False, output=output)
    if Path("/dev/full").exists():
        with pytest.raises(InvalidArgumentError, match="is a device"):
            run_and_report("Math-v0", "oracle", print_report=False, output="/dev/full")

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    real_mkstemp = report_module.tempfile.mkstemp
    monkeypatch.setattr(report_module.tempfile, "mkstemp", full_disk)
    with pytest.raises(InvalidArgumentError, match="takes no new file .No space left on device"):
        run_and_report("Math-v0", "oracle", print_report=False, output=tmp_path / "r.json")
    monkeypatch.setattr(report_module.tempfile, "mkstemp", real_mkstemp)
    monkeypatch.undo()
    # A link's target is replaced (the link stays), an old report is replaced whole, and no
    # probe or temporary file is left behind.
    fifo.unlink()
    link.unlink()
    target, link = tmp_path / "target.json", tmp_path / "link.json"
    target.write_text("old")
    link.symlink_to(target)
    run_and_report("Math-v0", "oracle", episodes=1, progress=False, print_report=False,
                   output=link)  # fmt: skip
    assert link.is_symlink() and json.loads(target.read_text())["env_id"] == "Math-v0"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.json", "target.json"]


def test_leaderboard_refuses_a_turn_limit_of_zero(tmp_path) -> None:
    """``--max-turns 0`` ran each env at its registered limit and filed the records under 0."""
    from llm_gym import InvalidArgumentError
    from llm_gym.eval import leaderboard_run

    args = leaderboard_run.Args(
        envs=["Math-v0"],
        policies=["oracle"],
        episodes=2,
        out_dir=tmp_path,
        progress=False,
        max_turns=0,
    )
    with pytest.raises(InvalidArgumentError, match="max_turns must be None"):
        leaderboard_run.main(args, runner=lambda *a, **k: pytest.fail("ran"))


# --- train.py: config files and --set values ----------------------------------------------------


def _train_script():
    import importlib.util

    from tests.conftest import ROOT

    spec = importlib.util.spec_from_file_location("train_script", ROOT / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("config", "sets", "message"),
    [
        # IsADirectoryError
        ("<dir>", [], "is a directory, not a regular file; give a YAML or TOML file"),
        ("/dev/zero", [], "is a device, not a regular file"),  # read until MemoryError
        ("<latin1>", [], "not UTF-8 text (byte 10: b'\\xe9')"),  # UnicodeDecodeError traceback
        ("<big>", [], "larger than 1,048,576 bytes"),
        ("<ok>", ["seed=["], "--set seed: not valid YAML"),  # a YAML traceback
        ("<ok>", ["grpo..num_steps=2"], "--set expects KEY=VALUE with KEY a dotted name"),
        ("<ok>", ["env=Nope-v0"], "No llm_gym environment 'Nope-v0'"),  # traceback from the run
        # the message named the accepted option among the refused ones
        ("<ok>", ["task_options.foo=1"], "takes no option(s) ['foo']; it accepts: ['world_seed']"),
    ],
)
def test_train_py_config_mistakes_are_one_line(tmp_path, capsys, config, sets, message) -> None:
    from tests.conftest import ROOT

    files = {
        "<dir>": tmp_path,
        "<latin1>": tmp_path / "latin1.yaml",
        "<big>": tmp_path / "big.yaml",
        "<ok>": ROOT / "configs" / "tool_use_game_tiny.yaml",
    }
    (tmp_path / "latin1.yaml").write_bytes("model: caf\xe9\n".encode("latin-1"))
    (tmp_path / "big.yaml").write_text("# padding\n" * 110_000)
    path = files.get(config, config)
    with pytest.raises(SystemExit) as info:
        _train_script().main(["--config", str(path), *[f"--set={s}" for s in sets]])
    text = capsys.readouterr().err
    assert info.value.code == 2
    assert text.startswith("train.py: error: ") and message in text, text
    assert len(text) < 1000 and text.count("\n") == 1


def test_task_file_that_is_a_directory_is_named(tmp_path) -> None:
    from llm_gym import InvalidArgumentError
    from trainers.train import load_tasks

    with pytest.raises(InvalidArgumentError, match="is a directory"):
        load_tasks(tmp_path)  # IsADirectoryError before


# --- task options: world_seed ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ([1], "[1]"),  # TypeError: unhashable type: 'list' (a traceback from llm-gym eval)
        ({"a": 1}, "{'a': 1}"),
        ("x" * 1_000_000, "'xxx"),  # the error message was 1,000,085 characters
        (10**5000, "an int of 16610 bits"),  # ValueError from the registry's cache key
        (2**64, "18446744073709551616"),
        (-1, "-1"),
    ],
    ids=["list", "dict", "1 MB text", "5,000 digits", "2**64", "negative"],
)
def test_world_seed_is_checked_before_any_cache(value: object, shown: str) -> None:
    from llm_gym import InvalidArgumentError
    from llm_gym.core.registry import env_entry

    with pytest.raises(InvalidArgumentError, match="world_seed must be an int in") as info:
        env_entry("ToolUseGame-v0").tasks("val", world_seed=value)
    assert shown in str(info.value) and len(str(info.value)) < 200
    assert len(env_entry("ToolUseGame-v0").tasks("val", world_seed=2**64 - 1)) == 200
