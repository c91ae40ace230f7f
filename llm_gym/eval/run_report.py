"""The run report: one self-contained HTML page of what a training run did.

``llm-gym report RUN_DIR`` (and ``train.py`` at the end of every run) reads a run's output folder
and writes ``RUN_DIR/report.html``: the config, the step log's curves (reward, success on
validation, tool calls, lengths, truncation causes, entropy) with the health checks marked where
they fired (:mod:`trainers.grpo.health`), the evaluations before and after with their intervals, and
an episode browser (filter by evaluation, task kind, outcome, how the episode ended) that shows
each episode's turns, per-turn rewards, and the trained tokens and the context tokens told apart.
No server, no CDN: the data and the page's script are inline, so the file reads offline.

What it reads from ``RUN_DIR`` (each file optional, at least one needed):

- ``summary.json``: what ``train.py`` printed (the gains with their intervals, the health
  checks that fired, the validation point the model was kept at);
- ``config.json``: the run's config;
- ``step_log.jsonl``: the step log, one record a line (else the ``log_history`` of the newest
  ``trainer_state.json`` under ``RUN_DIR`` or ``RUN_DIR/grpo``);
- ``eval_<label>.json``: the evaluations (:class:`~llm_gym.eval.EvalReport` records);
- ``episodes_<label>.jsonl``: their episodes (:mod:`llm_gym.eval.episode_records`), the first
  :data:`MAX_REPORT_EPISODES` of each file.

The report opens with the filters in its address's fragment applied:
``report.html#eval=after_grpo&kind=lookup&outcome=failure&ended=max_turns``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import html
import json
import math
from pathlib import Path
from typing import Any, TextIO

from llm_gym.errors import InvalidArgumentError
from llm_gym.eval.files import write_atomic
from llm_gym.eval.run_report_page import PAGE

__all__ = [
    "DESCRIPTION",
    "HELP",
    "MAX_REPORT_EPISODES",
    "add_arguments",
    "load_run",
    "render_run_report",
    "run_cli",
    "write_run_report",
]

MAX_REPORT_EPISODES = 200
"""The most episodes of one ``episodes_<label>.jsonl`` file the page holds (the file's first)."""

REPORT_NAME = "report.html"
"""The report's file name in the run's folder."""

_SUMMARY_LEFT_OUT = ("task_success", "train_log", "validation_history", "health")
"""Summary keys the page leaves out: per-task tables and what the step log shows already."""


def _finite(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None (JSON has no NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _read_json(path: Path, notes: list[str]) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        notes.append(f"{path.name}: unreadable ({type(exc).__name__}), left out")
        return None


def _read_lines(path: Path, notes: list[str], limit: int | None = None) -> tuple[list[Any], int]:
    """The JSON objects of ``path``'s lines (the first ``limit``) and how many lines it has;
    unreadable lines are skipped and counted in ``notes``."""
    records: list[Any] = []
    total = bad = 0
    try:
        with path.open(encoding="utf-8", errors="replace") as lines:
            for line in lines:
                if not line.strip():
                    continue
                total += 1
                if limit is not None and len(records) >= limit:
                    continue
                try:
                    record = json.loads(line)
                except (ValueError, RecursionError):
                    bad += 1
                    continue
                if isinstance(record, dict):
                    records.append(record)
                else:
                    bad += 1
    except OSError as exc:
        notes.append(f"{path.name}: unreadable ({type(exc).__name__}), left out")
    if bad:
        notes.append(f"{path.name}: {bad} unreadable line(s) skipped")
    return records, total


def _step_log(run: Path, notes: list[str]) -> list[dict[str, Any]]:
    if (run / "step_log.jsonl").is_file():
        return _read_lines(run / "step_log.jsonl", notes)[0]
    states = [p for d in (run, run / "grpo") for p in d.glob("**/trainer_state.json")]
    if not states:
        return []
    newest = max(states, key=lambda p: p.stat().st_mtime)
    state = _read_json(newest, notes)
    history = state.get("log_history") if isinstance(state, dict) else None
    notes.append(f"step log read from {newest.relative_to(run)}")
    return [r for r in history if isinstance(r, dict)] if isinstance(history, list) else []


def _health(steps: list[dict[str, Any]], summary: Any) -> list[dict[str, Any]]:
    """The health checks that fired: the summary's records (with cause and remedy), else the
    ``health/<check>`` keys of the step log."""
    if isinstance(summary, dict) and isinstance(summary.get("health"), list):
        return [h for h in summary["health"] if isinstance(h, dict)]
    return [
        {"step": record.get("step"), "check": key.split("/", 1)[1], "value": value}
        for record in steps
        for key, value in record.items()
        if key.startswith("health/")
    ]


def load_run(run_dir: str | Path) -> dict[str, Any]:
    """Everything the page shows, read from ``run_dir`` (see the module's list).

    Raises:
        InvalidArgumentError: ``run_dir`` is not a folder, or holds none of the files.
    """
    run = Path(run_dir)
    if not run.is_dir():
        raise InvalidArgumentError(
            f"RUN_DIR must be a run's output folder (train.py's output_dir), got {str(run)!r}, "
            "which is not a folder."
        )
    notes: list[str] = []
    summary = _read_json(run / "summary.json", notes) if (run / "summary.json").is_file() else None
    config = _read_json(run / "config.json", notes) if (run / "config.json").is_file() else None
    steps = _step_log(run, notes)
    evaluations = {}
    for path in sorted(run.glob("eval_*.json")):
        record = _read_json(path, notes)
        if isinstance(record, dict):
            evaluations[path.stem.removeprefix("eval_")] = record
    episodes = {}
    for path in sorted(run.glob("episodes_*.jsonl")):
        shown, total = _read_lines(path, notes, MAX_REPORT_EPISODES)
        episodes[path.stem.removeprefix("episodes_")] = {"shown": shown, "total": total}
    if summary is None and config is None and not steps and not evaluations and not episodes:
        raise InvalidArgumentError(
            f"{str(run)!r} holds no run files: expected summary.json, config.json, "
            "step_log.jsonl (or a trainer_state.json), eval_*.json or episodes_*.jsonl; name "
            "the output_dir of a train.py run."
        )
    brief = (
        {k: v for k, v in summary.items() if k not in _SUMMARY_LEFT_OUT}
        if isinstance(summary, dict)
        else None
    )
    return _finite(
        {
            "title": run.resolve().name,
            "generated": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            "config": config,
            "summary": brief,
            "steps": steps,
            "health": _health(steps, summary),
            "evaluations": evaluations,
            "episodes": episodes,
            "notes": notes,
        }
    )


def render_run_report(run: dict[str, Any]) -> str:
    """The HTML page of :func:`load_run`'s ``run``: the data inline as JSON that no text in it
    can end early (every ``<`` escaped), the page's script and style inline."""
    data = json.dumps(run, ensure_ascii=True, allow_nan=False, default=str)
    data = data.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    title = html.escape(f"Run report: {run.get('title', '')}")
    head, rest = PAGE.split("__TITLE__")  # each marker once: no text of the run is searched
    middle, tail = rest.split("__DATA__")
    return head + title + middle + data + tail


def write_run_report(run_dir: str | Path, output: str | Path | None = None) -> Path:
    """Write the report of ``run_dir`` to ``output`` (default ``run_dir/report.html``); returns
    the path written."""
    page = render_run_report(load_run(run_dir))
    return write_atomic(Path(output) if output is not None else Path(run_dir) / REPORT_NAME, page)


HELP = "write a training run's report: one self-contained HTML page (RUN_DIR/report.html)"
"""``llm-gym report``'s line in ``llm-gym --help``."""

DESCRIPTION = (
    "Read a run's output folder (train.py's output_dir: summary.json, config.json, "
    "step_log.jsonl, eval_*.json, episodes_*.jsonl) and write one HTML page that reads offline: "
    "config, curves with the health checks that fired, the evaluations with their intervals, "
    "and an episode browser. Prints the page's path."
)
"""``llm-gym report --help``'s description."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``llm-gym report``'s arguments: ``RUN_DIR`` and ``--output``."""
    parser.add_argument("run_dir", help="the run's output folder")
    parser.add_argument("--output", default=None, help="the page to write (RUN_DIR/report.html)")


def run_cli(args: argparse.Namespace, out: TextIO) -> int:
    """``llm-gym report``: write the page, print its path (the last line: scripts read it)."""
    print(write_run_report(args.run_dir, args.output), file=out)
    return 0
