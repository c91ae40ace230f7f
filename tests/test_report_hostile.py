"""Hostile counts for ``run_and_report`` (:mod:`llm_gym.eval.report`) and ``llm-gym eval``.

==========================  =========================================  =========================
case                        without a fix                              what holds
==========================  =========================================  =========================
``k`` of 10**12             every episode of the collection was        refused before the policy
                            scheduled at once: MemoryError after a     is built or any episode
                            minute (or the OOM killer)                 made, naming
                                                                       MAX_EVAL_EPISODES
``llm-gym eval --k`` past   the same, as a traceback                   one line, exit code 2
the limit
``episodes`` of 10**12      (contained, now tested) every task of the  the same
with k = 1                  split once, as documented
==========================  =========================================  =========================
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest

from llm_gym.errors import InvalidArgumentError
from llm_gym.eval import run_and_report
from llm_gym.eval.report import MAX_EVAL_EPISODES


def test_a_huge_k_is_refused_before_the_policy_or_any_episode() -> None:
    start = time.perf_counter()
    with pytest.raises(InvalidArgumentError, match="MAX_EVAL_EPISODES") as caught:
        # a model spec that would fail to load: the count is judged first
        run_and_report("GuessNumber-v0", "hf:/no/such/model", k=10**12, print_report=False)
    assert time.perf_counter() - start < 10
    assert f"{10**12:,}" in str(caught.value)


def test_the_limit_counts_tasks_times_k() -> None:
    k = MAX_EVAL_EPISODES // 2 + 1  # two tasks of k episodes pass the limit, one does not
    with pytest.raises(InvalidArgumentError, match="lower k or episodes"):
        run_and_report("GuessNumber-v0", "random", episodes=2 * k, k=k, print_report=False)


def test_cli_eval_with_a_huge_k_is_one_line(capsys) -> None:
    from llm_gym.cli import main

    assert main(["eval", "GuessNumber-v0", "--policy", "random", "--k", str(10**12)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("llm-gym eval: error: ") and "MAX_EVAL_EPISODES" in err
    assert err.count("\n") == 1


def test_more_episodes_than_tasks_plays_every_task_once() -> None:
    report = run_and_report(
        "GuessNumber-v0", "random", episodes=10**12, progress=False, print_report=False
    )
    assert report.tasks == len(report.episodes) > 0


# --- run_and_report / llm-gym eval / leaderboard: odd counts and output paths ---------------------


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
def test_run_and_report_refuses_counts_it_cannot_honour(
    options: dict[str, object], message: str
) -> None:
    """A count that is no count (``episodes=0`` or ``-5``, ``max_turns=0``, ``k=True``) is an error
    naming the value, never a report for settings nobody asked for."""
    from llm_gym import InvalidArgumentError
    from llm_gym.eval import run_and_report

    with pytest.raises(InvalidArgumentError, match=re.escape(message)):
        run_and_report("Math-v0", "oracle", progress=False, print_report=False, **options)


def test_run_and_report_checks_its_output_before_the_first_episode(tmp_path, monkeypatch) -> None:
    """``output`` naming a directory (or a path under a file) is refused before any episode, so
    no evaluation (hours with a model) runs for a report it cannot write; the CLI says so in one
    line (exit code 2)."""
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
    """A report is a regular file written as a new file renamed over the old one: a device (such
    as ``/dev/full``, which passes every permission check) or a FIFO is refused, and the folder
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
