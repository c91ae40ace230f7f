"""The measured numbers of the README and the benchmarks guide, written from the result files.

Every figure a benchmark measured that a page of :data:`PAGES` quotes sits
between two markers, ``<!-- numbers:NAME -->`` and ``<!-- /numbers:NAME -->``, and is rendered
by :data:`REGIONS` ``[NAME]`` from the JSON files in ``benchmarks/results/`` as committed: a table
(the README's main result, its environments' oracle and random columns, the guide's headlines)
or a phrase inside a sentence. The prose around them is the pages' own.

    python -m benchmarks.readme_numbers           # rewrite the marked regions
    python -m benchmarks.readme_numbers --check   # exit 1, naming each region that differs

``tests/test_readme_numbers.py`` runs the check, so a page and its JSON cannot disagree.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks import real_model_report
from benchmarks.rollout_report import verdict as rollout_verdict
from llm_gym.errors import InvalidArgumentError

__all__ = ["PAGES", "REGIONS", "Results", "check", "main", "render_page"]

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PAGES = ("README.md", "docs/guides/benchmarks.md", "docs/guides/pretrained.md")
"""The pages with marked regions, from the repository root."""
MARKED = re.compile(
    r"<!-- numbers:(?P<name>[\w-]+) -->(?P<body>.*?)<!-- /numbers:(?P=name) -->", re.S
)


class Results:
    """The result files of one folder, each read once: ``results["main_job"]`` is
    ``main_job.json``."""

    def __init__(self, folder: Path = RESULTS) -> None:
        self.folder = folder
        self.read: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        if name not in self.read:
            self.read[name] = json.loads((self.folder / f"{name}.json").read_text())
        return self.read[name]


Render = Callable[[Results, str], str]
"""A region's renderer: the results and the region's text on the page -> its new text."""


# --- formats -----------------------------------------------------------------------------------


def ratio(value: Mapping[str, Any], unit: str = "x") -> str:
    """A median and its interval: ``2.08x [1.91, 2.23]``.

    Example:
        >>> ratio({"median": 2.0774, "ci": [1.905, 2.231]})
        '2.08x [1.91, 2.23]'
    """
    low, high = value["ci"]
    return f"{value['median']:.2f}{unit} [{low:.2f}, {high:.2f}]"


def percent(value: Mapping[str, Any]) -> str:
    """``83% [79%, 87%]``.

    Example:
        >>> percent({"median": 0.826, "ci": [0.791, 0.867]})
        '83% [79%, 87%]'
    """
    low, high = value["ci"]
    return f"{value['median']:.0%} [{low:.0%}, {high:.0%}]"


def gain(result: Mapping[str, Any]) -> str:
    """A paired gain and its interval: ``+0.435 [+0.378, +0.492]``.

    Example:
        >>> gain({"gain": 0.435, "gain_ci": [0.3778, 0.4922]})
        '+0.435 [+0.378, +0.492]'
    """
    low, high = result["gain_ci"]
    return f"{result['gain']:+.3f} [{low:+.3f}, {high:+.3f}]"


def cpu(conditions: Mapping[str, Any]) -> str:
    """The machine of a result's conditions, as a sentence names it.

    Example:
        >>> cpu({"machine": "Intel(R) Xeon(R) Processor, 2 cores, Python 3.11.7"})
        '2-core Intel Xeon'
    """
    name, cores, *_ = conditions["machine"].split(", ")
    name = name.replace("(R)", "").replace("(TM)", "").replace(" Processor", "").strip()
    return f"{cores.split()[0]}-core {name}"


def keep_breaks(phrase: str, text: str) -> str:
    r"""``phrase`` with its spaces broken into lines where the page's ``text`` breaks them (so a
    phrase inside a wrapped paragraph keeps the page's wrapping while its words stay the same).

    Example:
        >>> keep_breaks("about 11 min on a 2-core Xeon", "about 12 min on a\n2-core Xeon")
        'about 11 min on a\n2-core Xeon'
    """
    words, breaks = phrase.split(" "), text.split()
    seps = [m.group() for m in re.finditer(r"\s+", text.strip())]
    if len(breaks) != len(words):
        return phrase
    return "".join(w + (seps[i] if i < len(seps) else "") for i, w in enumerate(words))


# --- the README --------------------------------------------------------------------------------

MAIN_ROWS = (("test_split", "test split"), ("new_world", "new world"))


def main_result_table(results: Results, _: str) -> str:
    job = results["main_job"]
    seeds = job["seeds"]
    lines = [
        "| held-out success | after SFT | after GRPO, seed "
        f"{seeds[0]} | gain [95% CI] | gain, seeds {seeds[0]}-{seeds[-1]} |",
        "| --- | ---: | ---: | --- | --- |",
    ]
    for mode in ("sampled", "greedy"):
        for key, label in MAIN_ROWS:
            first = job[key]["per_seed"][0][mode]
            over = job[key]["over_seeds"][mode]
            lines.append(
                f"| {label}, {mode} | {first['success_before']:.3f} | {first['success_after']:.3f} "
                f"| **{gain(first).replace(' [', '** [', 1)} | {over['gain_min']:+.3f} to "
                f"{over['gain_max']:+.3f} |"
            )
    return "\n" + "\n".join(lines) + "\n"


def main_result_seeds(results: Results, text: str) -> str:
    job = results["main_job"]
    above = [
        job[key]["over_seeds"][mode]["seeds_with_interval_above_zero"]
        for key, _ in MAIN_ROWS
        for mode in ("sampled", "greedy")
    ]
    if all(n == len(job["seeds"]) for n in above):
        said = "every interval is above zero with each seed"
    else:
        said = (
            f"intervals are above zero in {min(above)} to {max(above)} of {len(job['seeds'])} seeds"
        )
    return keep_breaks(said, text)


def main_job_time(results: Results, text: str) -> str:
    job = results["main_job"]
    return keep_breaks(
        f"about {job['job']['total_minutes']:.0f} min on a {cpu(job['conditions'])}", text
    )


def leaderboard_success(results: Results) -> dict[tuple[str, str], Mapping[str, Any]]:
    """``(env id, policy) -> record`` of the committed leaderboard."""
    return {(r["env_id"], r["policy"]): r for r in results["leaderboard"]["records"]}


def environment_table(results: Results, text: str) -> str:
    """The environments table with each row's last two cells (oracle, random success) from the
    leaderboard; the rest of each row is the page's."""
    records = leaderboard_success(results)
    rows = []
    for line in text.split("\n"):
        found = re.match(r"\| \[`(?P<id>[\w-]+)`\]", line)
        if found:
            cells = line.split(" | ")
            scores = [records[(found["id"], p)]["success_rate"] for p in ("oracle", "random")]
            line = " | ".join([*cells[:-2], f"{scores[0]:.3f}", f"{scores[1]:.3f} |"])
        rows.append(line)
    return "\n".join(rows)


def family_scores(results: Results, text: str) -> str:
    """The reasoning-gym families' oracle and random success (one value each, or a range)."""
    records = leaderboard_success(results)
    family = [r for (env, _), r in records.items() if env.startswith("RG-")]
    parts = []
    for policy in ("oracle", "random"):
        values = sorted({r["success_rate"] for r in family if r["policy"] == policy})
        shown = f"{values[0]:.3f}" + (f" to {values[-1]:.3f}" if len(values) > 1 else "")
        parts.append(f"{policy} {shown}")
    episodes = sorted({r["episodes"] for r in family})
    split = family[0]["split"]
    said = f"{parts[0]} and {parts[1]} each on {'/'.join(map(str, episodes))} {split} episodes"
    return keep_breaks(said, text)


# --- the benchmarks guide ----------------------------------------------------------------------


def env_step_us(results: Results, env: str = "ToolUseGame-v0", action: str = "lookup") -> float:
    (row,) = [r for r in results["env_step"]["rows"] if (r["env"], r["action"]) == (env, action)]
    return float(row["median_us"])


def env_step_vs_gem(results: Results) -> str:
    (value,) = results["env_step"]["ratios"].values()
    return ratio(value)


def distill_gap(results: Results) -> str:
    d = results["distill"]
    before, after, teacher = (
        d[k]["success"] for k in ("student_before", "student_after", "teacher")
    )
    share = (after - before) / (teacher - before)
    return (
        f"student's sampled success {before:.3f} to {after:.3f} against the teacher's "
        f"{teacher:.3f} ({share:.0%} of the gap)"
    )


def real_model_time(results: Results) -> str:
    runs = results["real_model_eval"]["headline"]["wall_s_runs"]
    median = sorted(runs)[len(runs) // 2]
    return f"{median:.1f} s (median of {len(runs)}, {min(runs):.1f} to {max(runs):.1f} s)"


def chaos_runs(results: Results) -> str:
    chaos = results["chaos"]
    episodes = sum(n for counts in chaos["runs"][0]["table"].values() for n in counts.values())
    ok = sum(run["ok"] for run in chaos["runs"])
    return (
        f"{episodes} episodes under injected faults, every outcome as expected in {ok} of "
        f"{len(chaos['runs'])} runs"
    )


COUNTS = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight"}
"""Small counts as a sentence writes them."""


def suite_headline(results: Results) -> str:
    summary = results["suite_tiny"]["summary"]
    evaluation = summary["evaluation"]
    envs = [key.split("/")[0] for key in evaluation if key.endswith("/after-sft")]
    before = [evaluation[f"{env}/after-sft"]["success_rate"] for env in envs]
    after = [evaluation[f"{env}/after-grpo"]["success_rate"] for env in envs]
    kept = summary.get("best_point")
    if kept is not None and kept["step"] == 0:
        grpo = "GRPO (lr chosen on val) never beats the SFT point on val, which the run keeps"
    elif all(a <= b for a, b in zip(after, before, strict=True)):
        grpo = "GRPO lowers them"
    else:
        grpo = "GRPO moves them"
    names = ", ".join(env.removesuffix("-v0") for env in envs)
    count = COUNTS.get(len(envs), str(len(envs)))
    return (
        f"the tiny agent on {count} environments: greedy test success after SFT "
        f"{', '.join(f'{v:.3f}' for v in before)} ({names}); {grpo}; "
        f"{summary['total_seconds'] / 60:.1f} min"
    )


def main_job_headline(results: Results) -> str:
    first = results["main_job"]["test_split"]["per_seed"][0]
    minutes = results["main_job"]["job"]["total_minutes"]
    return (
        f"sampled test-split success {gain(first['sampled'])}, greedy {gain(first['greedy'])}; "
        f"{minutes:.1f} min (quiet day)"
    )


def train_step_headline(results: Results) -> str:
    data = results["train_step"]
    ours, trl = (data["held_out"][k]["sampled"] for k in ("ours", "trl"))
    return (
        f"step time {ratio(data['step_time_ratio_to_trl'])} TRL's `environment_factory`; "
        f"held-out gain {ours['gain']:+.3f} against TRL's {gain(trl)}"
    )


def rollout_headline(results: Results) -> str:
    data = results["rollout_throughput"]
    return (
        f"ours at {percent(data['ratio_to_replay_limit'])} of the replay limit's tokens/s; "
        f"{ratio(data['ratio_to_trl_best'])} TRL's episodes/s"
    )


def constrained_headline(results: Results) -> str:
    data = results["constrained_decoding"]
    mask = data["libraries"]["SmolLM2-135M"]["llguidance"]["mask_us"]
    step = data["decoding"]["SmolLM2-135M"]["free_ms_per_token"]
    vocab = data["libraries"]["SmolLM2-135M"]["vocab"]
    return (
        f"a JSON-schema grammar's mask (llguidance): {mask:.1f} µs a token on SmolLM2's "
        f"{vocab // 1000}k vocabulary, within the noise of a {step:.1f} ms decode step"
    )


HEADLINES: tuple[tuple[str, Callable[[Results], str], str, str | Callable[[Results], str]], ...] = (
    ("rollout_throughput", rollout_headline, "80%; 1.5x", rollout_verdict),
    ("train_step", train_step_headline, "0.67x; not below TRL's interval", "met; not met"),
    ("suite_tiny", suite_headline, "under 45 min on 2 cores", "time met; GRPO's gain not met"),
    ("main_job", main_job_headline, "+0.15, greedy above zero; 15 min",
     "gains met; time met on a quiet day, not on the busiest"),
    ("remote_env", lambda r: f"{ratio(r['remote_env']['ratio_remote_to_in_process'], '')} of "
     "in-process episodes/s (model on 1 thread)", "0.8", "met by the median"),
    ("async", lambda r: f"{ratio(r['async']['speedup_with_latency'])} lockstep's steps/hour at "
     f"{r['async']['latency_with_s']:g} s a tool call; "
     f"{ratio(r['async']['speedup_without_latency'])} without latency", "1.5x; 1.2x",
     "met; not met on 2 cores"),
    ("env_step", lambda r: f"a ToolUseGame lookup step {env_step_us(r):.0f} µs; GuessNumber "
     f"{env_step_vs_gem(r)} GEM's step time", "50 µs; 2x", "missed"),
    ("distill", distill_gap, "", ""),
    ("real_model_eval", lambda r: "a newcomer's `" + r["real_model_eval"]["headline"]["command"]
     .removesuffix(" --seed 0 --no-progress") + f"`: {real_model_time(r)}", "2 min on 2 cores",
     "met"),
    ("real_model", real_model_report.headline_row, "GRPO's gain above zero in one recipe; "
     "GRPO - RFT in both", "met in one recipe (sums); both reported: RFT ahead in both"),
    ("constrained_decoding", constrained_headline, "", ""),
    ("chaos", chaos_runs, "", ""),
)  # fmt: skip
"""The guide's headline table: each benchmark's result file, its headline, target and verdict."""


def headline_table(results: Results, _: str) -> str:
    lines = ["| benchmark | headline | target | |", "| --- | --- | --- | --- |"]
    for name, headline, target, verdict in HEADLINES:
        shown = verdict(results) if callable(verdict) else verdict
        cells = [f"`{name}`", headline(results), target, shown]
        lines.append("|" + "|".join(f" {cell} " if cell else " " for cell in cells) + "|")
    return "\n" + "\n".join(lines) + "\n"


def phrase(render: Callable[[Results], str]) -> Render:
    """A renderer of a phrase that does not read the page's text."""
    return lambda results, _: render(results)


REGIONS: dict[str, Render] = {
    # README.md
    "main_result": main_result_table,
    "main_result_seeds": main_result_seeds,
    "main_job_time": main_job_time,
    "environments": environment_table,
    "reasoning_gym_scores": family_scores,
    # docs/guides/benchmarks.md
    "headlines": headline_table,
    "env_step_lookup": phrase(lambda r: f"{env_step_us(r):.0f} µs"),
    "env_step_vs_gem": phrase(env_step_vs_gem),
    "rollout_vs_replay": phrase(
        lambda r: percent(r["rollout_throughput"]["ratio_to_replay_limit"])
    ),
    "rollout_vs_trl": phrase(lambda r: ratio(r["rollout_throughput"]["ratio_to_trl_best"])),
    "remote_env_ratio": phrase(lambda r: ratio(r["remote_env"]["ratio_remote_to_in_process"], "")),
    "train_step_vs_trl": phrase(lambda r: ratio(r["train_step"]["step_time_ratio_to_trl"])),
    "async_with_latency": phrase(lambda r: ratio(r["async"]["speedup_with_latency"])),
    "async_without_latency": phrase(lambda r: ratio(r["async"]["speedup_without_latency"])),
    "real_model_time": phrase(real_model_time),
    # README.md and docs/guides/pretrained.md
    **real_model_report.regions(),
}
"""Each marked region's renderer, by the name in its markers."""


def render_page(text: str, results: Results, where: str = "page") -> str:
    """``text`` with every marked region rendered again.

    Raises:
        InvalidArgumentError: a region names no renderer of :data:`REGIONS`.
    """

    def rendered(found: re.Match[str]) -> str:
        name = found["name"]
        if name not in REGIONS:
            raise InvalidArgumentError(
                f"{where}: the marked region {name!r} has no renderer; expected one of "
                f"{sorted(REGIONS)} (benchmarks/readme_numbers.py REGIONS), or remove its markers."
            )
        body = REGIONS[name](results, found["body"])
        return f"<!-- numbers:{name} -->{body}<!-- /numbers:{name} -->"

    return MARKED.sub(rendered, text)


def first_difference(old: str, new: str) -> tuple[str, str]:
    r"""The first line where two texts differ, in each (the whole texts when one ends early).

    Example:
        >>> first_difference("a\nb 0.1\nc", "a\nb 0.2\nc")
        ('b 0.1', 'b 0.2')
    """
    for said, rendered in zip(old.split("\n"), new.split("\n"), strict=False):
        if said != rendered:
            return said, rendered
    return old, new


def check(root: Path = ROOT, results: Results | None = None) -> list[str]:
    """What differs between the pages and their result files: each region whose text is not
    what the JSON renders, and each renderer whose region no page holds."""
    results = results or Results(root / "benchmarks" / "results")
    problems, seen = [], set()
    for page in PAGES:
        text = (root / page).read_text(encoding="utf-8")
        fresh = render_page(text, results, page)
        old, new = MARKED.finditer(text), MARKED.finditer(fresh)
        for before, after in zip(old, new, strict=True):
            seen.add(before["name"])
            if before["body"] != after["body"]:
                said, rendered = first_difference(before["body"], after["body"])
                problems.append(
                    f"{page}: region {before['name']!r} says {said!r:.300}, the results render "
                    f"{rendered!r:.300}; run python -m benchmarks.readme_numbers to rewrite it"
                )
    problems += [f"no page has the region {name!r}" for name in REGIONS if name not in seen]
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say what differs (exit 1)")
    args = parser.parse_args(argv)
    if args.check:
        problems = check()
        for problem in problems:
            print(problem)
        return 1 if problems else 0
    results = Results()
    for page in PAGES:
        path = ROOT / page
        text = path.read_text(encoding="utf-8")
        fresh = render_page(text, results, page)
        if fresh != text:
            path.write_text(fresh, encoding="utf-8")
            print(f"rewrote {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
