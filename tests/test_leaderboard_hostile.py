"""Hostile input to the leaderboard (:mod:`llm_gym.eval.leaderboard`, ``leaderboard_checks``,
``leaderboard_render``): records whose numbers no run makes, text that is markup, weight files
that are no files, and a file of 10,000 records.

================================  =====================================  ======================
case                              without a fix                          what holds
================================  =====================================  ======================
a record with a NaN, an infinite  loaded; ranked and printed as a        refused on load, one
or out-of-range rate, a negative  result ("nan", a success rate of       line naming the field
count, k = 0, an interval with    7.000, best-per-row on NaN)            and its range
low > high
a policy label, env id, command   a ``|`` split the cell, a line break   escaped: each stays
or machine holding ``|``, line    added rows and headings, HTML went     text in its cell or
breaks, backticks or HTML         into the page as HTML                  line
a FIFO named                      the hash opened it and blocked the     refused unread (opened
``model.safetensors``, a link to  run forever; ``/dev/zero`` was hashed  without blocking), one
``/dev/zero``, a folder           for ever                               line naming the file
a chat template, tokenizer or     the record kept as fresh: only the     stale: the hash covers
config changed, weights not       weights were hashed                    weights, config,
                                                                         tokenizer and template
10,000 records of as many         over five minutes: each cell scanned   a few seconds: cells
policies                          every record, each record resolved     found through an
                                  its type hints, matplotlib drew a      index, hints resolved
                                  10,000-column PNG                      once, no PNG past
                                                                         MAX_PLOT_CELLS cells
two processes adding records to   each wrote its own copy over the       each adds under a lock
one leaderboard.json              other's: the last writer's records     to what the file holds
                                  alone were kept                        then: every record kept
================================  =====================================  ======================
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
from pathlib import Path

import pytest

from llm_gym.errors import InvalidArgumentError
from llm_gym.eval import leaderboard as lb
from llm_gym.eval import leaderboard_render as lbdraw
from llm_gym.eval import leaderboard_run as lbrun
from tests.test_leaderboard import make_record


def _file_with(tmp_path: Path, **changes: object) -> Path:
    record = {**dataclasses.asdict(make_record("GuessNumber-v0")), **changes}
    path = tmp_path / "leaderboard.json"
    path.write_text(json.dumps({"schema": lb.SCHEMA, "records": [record]}))
    return path


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"success_rate": float("nan")}, "'success_rate' must be in [0, 1]"),
        ({"success_rate": 7.0}, "'success_rate' must be in [0, 1]"),
        ({"pass_at_k": float("inf")}, "'pass_at_k' must be in [0, 1]"),
        ({"tasks": -3}, "'tasks' must be an integer >= 0"),
        ({"k": 0, "episodes": -1}, "'k' must be an integer >= 1; 'episodes' must be"),
        ({"success_ci": [0.9, 0.1]}, "'success_ci' must be [low, high] with 0 <= low <= high"),
        ({"wall_time_s": float("-inf")}, "'wall_time_s' must be a finite number >= 0"),
        ({"reward_mean": float("nan")}, "'reward_mean' must be a finite number"),
    ],
    ids=["nan", "seven", "inf", "tasks", "k", "ci", "wall", "reward"],
)
def test_a_record_with_numbers_no_run_makes_is_refused(
    tmp_path: Path, changes: dict[str, object], message: str
) -> None:
    path = _file_with(tmp_path, **changes)
    with pytest.raises(InvalidArgumentError) as caught:
        lb.load_records(path)
    text = str(caught.value)
    assert message in text and str(path) in text and "\n" not in text, text


def test_a_record_in_range_still_loads(tmp_path: Path) -> None:
    path = _file_with(tmp_path, reward_mean=-0.5, success_rate=0, success_ci=[0, 0.3], tasks=0)
    assert lb.load_records(path)[0].reward_mean == -0.5


HOSTILE = {
    "policy": "evil|x\n# Pwned <script>alert(1)</script>`",
    "env_id": "Env|v0\n\n| injected | row |",
    "command": "python -m x\n# injected heading",
    "machine": "box\n\n# heading <b>",
}


def test_text_from_records_stays_text_in_the_markdown() -> None:
    record = make_record(
        HOSTILE["env_id"],
        policy=HOSTILE["policy"],
        command=HOSTILE["command"],
        machine=HOSTILE["machine"],
    )
    view = lb.View("val", 1, 10, 0, 6)
    table = lb.build_table([record], [record.env_id], [record.policy], view, lb.Registry({}, {}))
    text = lbdraw.render_markdown(table, [record.policy], view)
    lines = text.splitlines()
    headings = [line for line in lines if line.startswith("#")]
    assert headings == ["# Leaderboard: every policy on every environment", "## Details"]
    assert not [line for line in lines if "injected" in line and not line.startswith(("|", " "))]
    assert "<b>" not in text and "&lt;script>" in text  # as text, outside code spans
    assert all("<script>" not in line for line in lines if not line.startswith("- "))
    header = next(line for line in lines if line.startswith("| environment | evil"))
    assert header.replace("\\|", "").count("|") == 3  # two cells: the pipe is escaped
    row = next(line for line in lines if line.startswith("| Env"))
    assert row.replace("\\|", "").count("|") == 3
    assert "    python -m x\\n# injected heading" in lines  # the command block keeps one line
    policy_line = next(line for line in lines if line.startswith("- "))
    assert policy_line.startswith("- `` evil|x\\n# Pwned <script>alert(1)</script>` ``")


def test_md_text_and_code_keep_plain_labels_as_they_are() -> None:
    assert lbdraw.md_text("GuessNumber-v0") == "GuessNumber-v0"
    assert lbdraw.md_code("random:3") == "`random:3`"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_named_like_weights_is_refused_unread(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    os.mkfifo(folder / "model.safetensors")
    (folder / "pytorch_model.bin").write_bytes(b"weights")
    result: list[BaseException] = []

    def hash_it() -> None:
        try:
            lb.model_files_hash(folder)
        except InvalidArgumentError as exc:
            result.append(exc)

    worker = threading.Thread(target=hash_it, daemon=True)
    worker.start()
    worker.join(10)
    if worker.is_alive():  # unblock the reader so the test process can end
        with open(folder / "model.safetensors", "wb"):
            pass
        pytest.fail("model_files_hash blocked on a FIFO")
    assert len(result) == 1 and "is a FIFO, not a regular file" in str(result[0])


def test_a_folder_named_like_weights_is_refused(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").mkdir()
    with pytest.raises(InvalidArgumentError, match="is a directory, not a regular file"):
        lb.model_files_hash(tmp_path)  # IsADirectoryError without the check


@pytest.mark.parametrize("name", ["model.safetensors", "tokenizer.json", "chat_template.jinja"])
def test_a_model_file_linked_to_a_device_is_refused_in_one_line(tmp_path, name) -> None:
    """``/dev/zero`` under a hashed name: one line naming the file, at once (a read of it
    never ends)."""
    (tmp_path / "model.safetensors").write_bytes(b"weights")
    (tmp_path / name).unlink(missing_ok=True)
    (tmp_path / name).symlink_to("/dev/zero")
    started = time.perf_counter()
    with pytest.raises(InvalidArgumentError) as caught:
        lb.model_files_hash(tmp_path)
    assert time.perf_counter() - started < 5
    message = str(caught.value)
    assert "\n" not in message and name in message and "is a device" in message


def test_staleness_follows_template_tokenizer_and_config(tmp_path: Path) -> None:
    """A record is stale when the model's chat template, tokenizer or config changed, its
    weights unchanged: each changes the prompts the model sees or how it reads them."""
    (tmp_path / "model.safetensors").write_bytes(b"weights")
    seen = {lb.model_files_hash(tmp_path)}
    for name, text in [
        ("chat_template.jinja", "{{ messages }}"),
        ("chat_template.jinja", "{{ messages }}!"),
        ("tokenizer_config.json", '{"chat_template": "x"}'),
        ("tokenizer.json", "{}"),
        ("config.json", '{"rope_theta": 1}'),
        ("generation_config.json", "{}"),
        ("special_tokens_map.json", "{}"),
    ]:
        (tmp_path / name).write_text(text)
        seen.add(lb.model_files_hash(tmp_path))
    assert len(seen) == 8 and None not in seen
    (tmp_path / "README.md").write_text("notes")  # not a model file: no new hash
    assert lb.model_files_hash(tmp_path) in seen
    record = make_record(policy="hf:m", model_path=str(tmp_path), model_hash="aaaaaaaaaaaa")
    now = lb.model_files_hash(tmp_path)
    assert lb.stale_reasons(record, {}, {str(tmp_path): now}) == [
        f"model files aaaaaaaaaaaa -> {now}"
    ]


def test_ten_thousand_records_load_and_render_in_seconds(tmp_path: Path) -> None:
    records = [make_record("GuessNumber-v0", policy=f"random:{i}") for i in range(10_000)]
    lb.save_records(tmp_path / "leaderboard.json", records)
    args = lbrun.Args(
        envs=["GuessNumber-v0"],
        policies=["random"],
        episodes=10,
        max_turns=6,
        out_dir=tmp_path,
        progress=False,
        render_only=True,
    )
    start = time.perf_counter()
    outcome = lbrun.main(args)
    assert time.perf_counter() - start < 60  # over five minutes without the fixes
    assert len(outcome.records) == 10_000
    text = (tmp_path / "leaderboard.md").read_text()
    assert "random:9999" in text and not (tmp_path / "leaderboard.png").exists()


def _add_many(path: str, prefix: str, count: int) -> None:
    for i in range(count):
        lb.add_records(Path(path), [make_record("GuessNumber-v0", policy=f"{prefix}:{i}")])


def test_two_processes_adding_to_one_leaderboard_keep_every_record(tmp_path: Path) -> None:
    import multiprocessing

    path = tmp_path / "leaderboard.json"
    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=_add_many, args=(str(path), prefix, 25)) for prefix in "ab"]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
        assert worker.exitcode == 0
    policies = {r.policy for r in lb.load_records(path)}
    assert policies == {f"{p}:{i}" for p in "ab" for i in range(25)}  # none lost to a race


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
