"""The leaderboard: merge, staleness, resume, pass@k and ranking on hand-made records, and short
real runs of the scripted policies (no model needed)."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from llm_gym.errors import InvalidArgumentError, UnknownNameError
from llm_gym.eval import leaderboard as lb
from llm_gym.eval import leaderboard_render as lbdraw
from llm_gym.eval import leaderboard_run as lbrun
from llm_gym.policies import policy_backend

CHEAP_ENVS = ["GuessNumber-v0", "Math-v0"]


def make_record(env: str = "Math-v0", policy: str = "random", **changes) -> lb.Record:
    """A hand-made record; ``success`` sets the rate and a plausible interval."""
    success = changes.pop("success", 0.5)
    fields = dict(
        env_id=env,
        policy=policy,
        split="val",
        k=1,
        episodes=10,
        seed=0,
        max_turns=6,
        sampling={},
        spec=policy,
        env_version="0",
        model_path=None,
        model_hash=None,
        command="python -m benchmarks.leaderboard",
        policy_description={"name": policy},
        tasks=10,
        success_rate=success,
        success_ci=[max(0.0, success - 0.2), min(1.0, success + 0.2)],
        reward_mean=success,
        pass_at_k=success,
        turns_mean=2.0,
        tool_error_rate=0.0,
        parse_failure_rate=0.0,
        tokens_per_episode=0.0,
        metrics={},
        settings={},
        date="2026-01-01T00:00:00+00:00",
        machine="test",
        wall_time_s=0.1,
    )
    fields.update(changes)
    return lb.Record(**fields)


def fake_runner(calls: list[lb.Job], fail_after: int | None = None):
    """A runner that records its jobs and returns a record per job; raises KeyboardInterrupt
    (an interrupted run) once ``fail_after`` jobs are done."""

    def run(job: lb.Job) -> lb.Record:
        if fail_after is not None and len(calls) >= fail_after:
            raise KeyboardInterrupt
        calls.append(job)
        record = make_record(success=1.0 if job.policy == "oracle" else 0.25)
        common = {f.name: getattr(job, f.name) for f in dataclasses.fields(lb.Job)}
        return dataclasses.replace(record, **common)

    return run


def quiet_args(tmp_path: Path, **changes) -> lbrun.Args:
    base = dict(
        envs=list(CHEAP_ENVS),
        policies=["random", "oracle"],
        episodes=6,
        out_dir=tmp_path,
        progress=False,
    )
    return lbrun.Args(**{**base, **changes})


# --- pure logic ---------------------------------------------------------------------------------


def test_merge_adds_new_keys_and_replaces_same_keys() -> None:
    old = [make_record("Math-v0", "random"), make_record("SQL-v0", "oracle", success=1.0)]
    new = [make_record("Math-v0", "random", success=0.9), make_record("Math-v0", "hf:m")]
    merged = lb.merge_records(old, new)
    assert len(merged) == 3
    by_key = {(r.env_id, r.policy): r for r in merged}
    assert by_key["Math-v0", "random"].success_rate == 0.9  # replaced
    assert by_key["SQL-v0", "oracle"].success_rate == 1.0  # kept, not rerun
    assert [r.key for r in merged] == sorted(r.key for r in merged)


def test_key_holds_what_changes_the_number() -> None:
    base = make_record()
    for change in (
        {"split": "test"},
        {"k": 2},
        {"episodes": 20},
        {"seed": 1},
        {"max_turns": 3},
        {"sampling": {"temperature": 0.7}},
    ):
        assert dataclasses.replace(base, **change).key != base.key, change
    for change in ({"date": "2027"}, {"env_version": "1"}, {"success_rate": 0.1}):
        assert dataclasses.replace(base, **change).key == base.key, change
    assert len(lb.merge_records([base], [dataclasses.replace(base, k=2)])) == 2


def test_staleness_from_env_version_and_model_weights() -> None:
    fresh = make_record(env_version="0")
    assert lb.stale_reasons(fresh, {"Math-v0": "0"}, {}) == []
    assert lb.stale_reasons(fresh, {"Math-v0": "1"}, {}) == ["env version 0 -> 1"]
    assert lb.stale_reasons(fresh, {}, {}) == []  # no longer registered: not judged
    model = make_record(policy="hf:m", model_path="m", model_hash="aaa")
    assert lb.stale_reasons(model, {"Math-v0": "0"}, {"m": "aaa"}) == []
    assert lb.stale_reasons(model, {"Math-v0": "0"}, {"m": "bbb"}) == ["model files aaa -> bbb"]
    assert lb.stale_reasons(model, {"Math-v0": "0"}, {"m": None}) == []  # folder gone


def test_needs_run() -> None:
    record = make_record()
    assert lb.needs_run(None, False, force=False, refresh_stale=False)
    assert not lb.needs_run(record, False, force=False, refresh_stale=False)
    assert not lb.needs_run(record, True, force=False, refresh_stale=False)  # stale: only marked
    assert lb.needs_run(record, True, force=False, refresh_stale=True)
    assert not lb.needs_run(record, False, force=False, refresh_stale=True)
    assert lb.needs_run(record, False, force=True, refresh_stale=False)


def test_pass_at_k_by_hand() -> None:
    def episodes(group: int, successes: int, n: int) -> list[SimpleNamespace]:
        return [
            SimpleNamespace(group=group, reward=float(i < successes), metrics={}) for i in range(n)
        ]

    # n=5, c=2, k=2: 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert lb.pass_at_k_from_episodes(episodes(0, 2, 5), k=2) == pytest.approx(0.7)
    # and a second task with n=5, c=0 halves the mean; k=1 is the success rate
    both = episodes(0, 2, 5) + episodes(1, 0, 5)
    assert lb.pass_at_k_from_episodes(both, k=2) == pytest.approx(0.35)
    assert lb.pass_at_k_from_episodes(both, k=1) == pytest.approx(0.2)
    # n=4, c=1, k=3: 1 - C(3,3)/C(4,3) = 1 - 1/4; the env's success flag wins over reward
    flagged = [SimpleNamespace(group=0, reward=0.0, metrics={"success": i == 0}) for i in range(4)]
    assert lb.pass_at_k_from_episodes(flagged, k=3) == pytest.approx(0.75)


def test_record_from_report_keeps_paths_portable_and_counts_pass_at_k() -> None:
    job = lb.Job(**{f.name: getattr(make_record(k=2), f.name) for f in dataclasses.fields(lb.Job)})
    job = dataclasses.replace(job, policy="tiny-sft", model_path="outputs/m", model_hash="abc")
    metrics = {
        "success_rate": 0.4,
        "success_ci_low": 0.1,
        "success_ci_high": 0.7,
        "reward_mean": 0.4,
        "pass_at_k": -1.0,
        "turns_mean": 2.0,
        "tool_error_rate": 0.0,
        "parse_failure_ratio": 0.0,
        "completion_tokens_mean": 12.0,
    }
    episodes = [SimpleNamespace(group=0, reward=float(i < 2), metrics={}) for i in range(5)]
    report = SimpleNamespace(
        metrics=metrics,
        policy={"name": "hf", "model": "/abs/outputs/m"},
        episodes=episodes,
        tasks=1,
        settings={},
        date="d",
        machine="m",
        wall_time_s=1.0,
    )
    record = lbrun.record_from_report(report, job)
    assert record.policy_description["model"] == "outputs/m" and record.model_hash == "abc"
    assert record.pass_at_k == pytest.approx(0.7)  # n=5, c=2, k=2
    assert record.key == job.key and record.tokens_per_episode == 12.0


def test_best_per_row() -> None:
    values = {"random": 0.1, "oracle": 1.0, "tiny-sft": 0.4, "tiny-grpo": 0.4}
    assert lb.best_per_row(values) == {"tiny-sft", "tiny-grpo"}  # ties; oracle not ranked
    assert lb.best_per_row(values, stale=["tiny-grpo"]) == {"tiny-sft"}
    assert lb.best_per_row(values, unranked=()) == {"oracle"}
    assert lb.best_per_row({"random": 0.0, "oracle": 1.0}) == set()  # a best of 0 marks nobody
    assert lb.best_per_row({}) == set()


def test_table_marks_best_and_stale_cells() -> None:
    records = [
        make_record("Math-v0", "random", success=0.1),
        make_record("Math-v0", "oracle", success=1.0),
        make_record("Math-v0", "hf:a", success=0.6, model_path="a", model_hash="old"),
        make_record("Math-v0", "hf:b", success=0.5),
        make_record("SQL-v0", "random", success=0.2, max_turns=8, env_version="0"),
    ]
    now = lb.Registry({"Math-v0": "0", "SQL-v0": "1"}, {"Math-v0": 6, "SQL-v0": 8}, {"a": "new"})
    view = lb.View("val", 1, 10, 0, None)
    policies = ["random", "oracle", "hf:a", "hf:b"]
    table = lb.build_table(records, ["Math-v0", "SQL-v0"], policies, view, now)
    math, sql = table["Math-v0"], table["SQL-v0"]
    assert math["hf:a"].stale == ["model files old -> new"] and not math["hf:a"].best
    assert math["hf:b"].best and not math["oracle"].best  # stale hf:a (0.6) is not ranked
    assert sql["random"].stale == ["env version 0 -> 1"] and "oracle" not in sql
    text = lbdraw.render_markdown(table, policies, view)
    assert (
        "| Math-v0 | 0.100 [0.000, 0.300] | 1.000 [0.800, 1.000] | 0.600 [0.400, 0.800] † |" in text
    )
    assert "**0.500 [0.300, 0.700]** ★" in text
    assert "| SQL-v0 | 0.200 [0.000, 0.400] † | – | – | – |" in text
    assert "SQL-v0 x random: env version 0 -> 1" in text and "--refresh-stale" in text
    assert "python -m benchmarks.leaderboard" in text  # the command that made it
    # another view (other episodes) shows nothing of these records
    other = lb.build_table(records, ["Math-v0"], policies, lb.View("val", 1, 99, 0, None), now)
    assert other["Math-v0"] == {}


def test_pass_at_k_cells_when_k_is_above_one() -> None:
    record = make_record(k=4, pass_at_k=0.625, success=0.25)
    assert lb.cell_value(record) == 0.625
    assert lbdraw.format_cell(lb.Cell(record, [], best=True)) == "**0.625** ★"
    assert lbdraw.format_cell(None) == "–"


def test_policy_labels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert lbrun.parse_policy("random") == ("random", None)
    assert lbrun.parse_policy("random:7") == ("random:7", None)
    assert lbrun.parse_policy("openai:m@http://x/v1") == ("openai:m@http://x/v1", None)
    assert lbrun.parse_policy(f"hf:{tmp_path}") == (f"hf:{tmp_path}", str(tmp_path))
    with pytest.raises(UnknownNameError, match="Did you mean 'oracle'"):
        lbrun.parse_policy("oracel")
    with pytest.raises(InvalidArgumentError, match="no model folder"):
        lbrun.parse_policy("hf:./no/such/model")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InvalidArgumentError, match="train.py --config configs/tool_use_game_tiny"):
        lbrun.parse_policy("tiny-grpo")
    args = lbrun.Args(k=1)
    assert lbrun.sampling_settings("random", args) == {}
    assert lbrun.sampling_settings("tiny-sft", args)["temperature"] == 0.0
    assert lbrun.sampling_settings("hf:x", lbrun.Args(k=4))["temperature"] == 1.0


def test_policy_labels_go_through_the_policy_registry() -> None:
    assert policy_backend("random").scripted and policy_backend("oracle").scripted
    assert not policy_backend("hf").scripted and not policy_backend("openai").scripted
    assert not any(map(lbrun.is_model_policy, ("random:3", "oracle", "nonsense")))
    assert all(map(lbrun.is_model_policy, ("tiny-sft", "hf:org/model", "openai:m@http://x/v1")))
    assert lbrun.parse_policy("hf:org/model") == ("hf:org/model", None)  # a hub id
    with pytest.raises(InvalidArgumentError, match="random:SEED"):
        lbrun.parse_policy("random:abc")  # scripted specs are built, which checks them
    with pytest.raises(UnknownNameError, match="Did you mean 'tiny-sft'"):
        lbrun.parse_policy("tiny-sf")
    with pytest.raises(UnknownNameError, match="Did you mean 'openai'.*tiny-sft, tiny-grpo"):
        lbrun.parse_policy("opnai:m@http://x/v1")


def test_model_files_hash_follows_the_weights(tmp_path: Path) -> None:
    assert lb.model_files_hash(tmp_path / "missing") is None
    (tmp_path / "config.json").write_text("{}")
    assert lb.model_files_hash(tmp_path) is None
    (tmp_path / "model.safetensors").write_bytes(b"abc")
    first = lb.model_files_hash(tmp_path)
    assert first is not None and len(first) == 12
    (tmp_path / "model.safetensors").write_bytes(b"abd")
    assert lb.model_files_hash(tmp_path) != first


def test_atomic_save_round_trips(tmp_path: Path) -> None:
    records = [make_record("SQL-v0"), make_record("Math-v0")]
    path = tmp_path / "leaderboard.json"
    lb.save_records(path, records)
    assert lb.load_records(path) == lb.merge_records(records, [])
    assert [p.name for p in tmp_path.iterdir()] == ["leaderboard.json"]  # no temp file left
    assert lb.load_records(tmp_path / "none.json") == []


# --- runs with fake runners: resume, incremental, stale --------------------------------------


def test_interrupted_run_resumes_with_only_the_rest(tmp_path: Path) -> None:
    args = quiet_args(tmp_path)
    calls: list[lb.Job] = []
    with pytest.raises(KeyboardInterrupt):
        lbrun.main(args, runner=fake_runner(calls, fail_after=1))
    saved = lb.load_records(tmp_path / "leaderboard.json")
    assert [r.key for r in saved] == [calls[0].key]  # the finished record was written at once
    assert (tmp_path / "leaderboard.md").exists()  # the table is drawn on the way out
    rest: list[lb.Job] = []
    outcome = lbrun.main(args, runner=fake_runner(rest))
    assert len(rest) == 3 and calls[0].key not in {job.key for job in rest}
    assert len(outcome.records) == 4 and len(outcome.kept) == 1
    again: list[lb.Job] = []
    assert lbrun.main(args, runner=fake_runner(again)).ran == [] and again == []


def test_new_policy_and_env_merge_without_rerunning(tmp_path: Path) -> None:
    lbrun.main(quiet_args(tmp_path, envs=["Math-v0"]), runner=fake_runner([]))
    calls: list[lb.Job] = []
    outcome = lbrun.main(
        quiet_args(tmp_path, policies=["random", "oracle", "random:7"]), runner=fake_runner(calls)
    )
    assert sorted((j.env_id, j.policy) for j in calls) == [
        ("GuessNumber-v0", "oracle"),
        ("GuessNumber-v0", "random"),
        ("GuessNumber-v0", "random:7"),
        ("Math-v0", "random:7"),
    ]
    assert len(outcome.records) == 6
    text = (tmp_path / "leaderboard.md").read_text()
    assert "| environment | random | oracle | random:7 |" in text


def test_stale_records_are_marked_and_rerun_only_when_asked(tmp_path: Path) -> None:
    args = quiet_args(tmp_path, envs=["Math-v0"], policies=["oracle"])
    lbrun.main(args, runner=fake_runner([]))
    path = tmp_path / "leaderboard.json"
    data = json.loads(path.read_text())
    data["records"][0]["env_version"] = "old"
    path.write_text(json.dumps(data))
    calls: list[lb.Job] = []
    lbrun.main(args, runner=fake_runner(calls))
    assert calls == []
    assert "1.000 [0.800, 1.000] †" in (tmp_path / "leaderboard.md").read_text()
    lbrun.main(dataclasses.replace(args, refresh_stale=True), runner=fake_runner(calls))
    assert len(calls) == 1
    assert lb.load_records(path)[0].env_version == "0"
    assert "†" not in (tmp_path / "leaderboard.md").read_text().split("**bold")[0]
    lbrun.main(dataclasses.replace(args, force=True), runner=fake_runner(calls))
    assert len(calls) == 2


def test_changed_model_weights_are_marked_and_rerun_only_when_asked(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"weights v1")
    args = quiet_args(tmp_path / "out", envs=["Math-v0"], policies=[f"hf:{model}"])
    calls: list[lb.Job] = []
    lbrun.main(args, runner=fake_runner(calls))
    assert (
        calls[0].model_hash == lb.model_files_hash(model) and calls[0].sampling["temperature"] == 0
    )
    (model / "model.safetensors").write_bytes(b"weights v2")
    lbrun.main(args, runner=fake_runner(calls))
    assert len(calls) == 1
    text = (tmp_path / "out" / "leaderboard.md").read_text()
    assert "0.250 [0.050, 0.450] †" in text and "model files" in text
    lbrun.main(dataclasses.replace(args, refresh_stale=True), runner=fake_runner(calls))
    assert len(calls) == 2 and calls[1].model_hash == lb.model_files_hash(model)


def test_a_failing_run_does_not_stop_the_others(tmp_path: Path) -> None:
    calls: list[lb.Job] = []
    inner = fake_runner(calls)

    def flaky(job: lb.Job) -> lb.Record:
        if job.env_id == "Math-v0":
            raise RuntimeError("env not importable yet")
        return inner(job)

    outcome = lbrun.main(quiet_args(tmp_path), runner=flaky)
    assert len(outcome.records) == 2 and len(outcome.errors) == 2
    assert "Math-v0 x random: RuntimeError: env not importable yet" in outcome.errors
    assert "| Math-v0 | – | – |" in (tmp_path / "leaderboard.md").read_text()
    assert len(lbrun.main(quiet_args(tmp_path), runner=inner).ran) == 2  # picked up once it works


def test_missing_tiny_model_is_skipped_with_the_command(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    args = quiet_args(tmp_path, envs=["Math-v0"], policies=["oracle", "tiny-sft"])
    outcome = lbrun.main(args, runner=fake_runner([]))
    assert len(outcome.records) == 1
    assert len(outcome.errors) == 1 and lbrun.MAIN_JOB_COMMAND in outcome.errors[0]


# --- real runs of the scripted policies -------------------------------------------------------


def numbers(record: lb.Record) -> dict:
    """Everything a record says about the policy, without when, where and how fast."""
    data = dataclasses.asdict(record)
    for name in ("date", "machine", "wall_time_s"):
        data.pop(name)
    data["metrics"].pop("episodes_per_second")
    data["metrics"].pop("tokens_per_second")
    return data


def test_smoke_run_writes_json_md_png(tmp_path: Path) -> None:
    outcome = lbrun.main(quiet_args(tmp_path))
    assert len(outcome.ran) == 4 and outcome.errors == []
    by = {(r.env_id, r.policy): r for r in outcome.records}
    assert by["Math-v0", "oracle"].success_rate == 1.0
    assert by["Math-v0", "oracle"].success_ci[0] > 0.5
    assert by["GuessNumber-v0", "random"].policy_description["seed"] == 0
    record = by["Math-v0", "random"]
    assert record.env_version == "0" and record.split == "val" and record.max_turns == 6
    assert record.tasks == 6 and record.machine and record.date
    text = (tmp_path / "leaderboard.md").read_text()
    assert "| GuessNumber-v0 |" in text and "| Math-v0 |" in text
    assert (tmp_path / "leaderboard.png").stat().st_size > 10_000


def test_scripted_numbers_reproduce_exactly(tmp_path: Path) -> None:
    first = lbrun.main(quiet_args(tmp_path / "a", episodes=8)).records
    second = lbrun.main(quiet_args(tmp_path / "b", episodes=8)).records
    assert len(first) == 4
    assert [numbers(r) for r in first] == [numbers(r) for r in second]
    forced = lbrun.main(quiet_args(tmp_path / "a", episodes=8, force=True))
    assert len(forced.ran) == 4
    assert [numbers(r) for r in forced.records] == [numbers(r) for r in first]


def test_cli_subcommand(tmp_path: Path) -> None:
    from llm_gym.cli import main

    out = io.StringIO()
    argv = [
        "leaderboard",
        "--envs",
        "Math-v0",
        "--policies",
        "oracle",
        "random:3",
        "--episodes",
        "4",
        "--out-dir",
        str(tmp_path),
        "--no-progress",
    ]
    assert main(argv, out=out) == 0
    assert "ran 2 run(s)" in out.getvalue()
    records = lb.load_records(tmp_path / "leaderboard.json")
    assert {r.policy for r in records} == {"oracle", "random:3"}
    assert records[0].command.startswith("python -m benchmarks.leaderboard --envs Math-v0")
    assert main(["leaderboard", "--policies", "oracel", "--out-dir", str(tmp_path)]) == 2


# --- hostile leaderboard.json on resume ------------------------------------------------------


def _with_record(**changes: object) -> str:
    record = dataclasses.asdict(make_record("GuessNumber-v0"))
    return json.dumps({"schema": lb.SCHEMA, "records": [{**record, **changes}]})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[]", 'a leaderboard is {"schema": 1, "records": [...]}'),  # AttributeError: 'get'
        ('{"records": 5}', 'a leaderboard is {"schema": 1'),  # TypeError: not iterable
        ('{"records": [1]}', "record 0: A leaderboard record is a JSON object"),  # TypeError
        ("[" * 100_000, "nested more than 100 levels deep"),  # RecursionError
        (_with_record(k="2"), "record 0: The leaderboard record's 'k' must be an integer"),
        (_with_record(success_ci=[0.5]), "'success_ci' must be [low, high]"),
        (_with_record(metrics={"x": "y"}), "'metrics' must be an object of numbers"),
        (_with_record(env_version=3), "'env_version' must be a string or null"),
        ("{", "not valid JSON (Expecting property name"),  # a raw JSONDecodeError
    ],
    ids=["list", "records 5", "record 1", "deep", "k text", "ci", "metrics", "version", "cut"],
)
def test_a_hostile_leaderboard_json_is_one_line_naming_the_file(
    tmp_path: Path, capsys, text: str, message: str
) -> None:
    from llm_gym.cli import main

    path = tmp_path / "leaderboard.json"
    path.write_text(text)
    argv = ["leaderboard", "--envs", "GuessNumber-v0", "--policies", "random", "--episodes", "2"]
    assert main([*argv, "--out-dir", str(tmp_path), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"llm-gym leaderboard: error: {path}: ") and message in err, err
    assert err.count("\n") == 1 and "move the file away" in err and len(err) < 600


def test_model_policies_sample_each_envs_budget_unless_one_is_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No ``--max-new-tokens``: a model policy's turns ask for each env's own budget, which its
    record keeps (the key does not hold it); a value the user sets goes to every env."""
    from llm_gym.policies import Generation, Policy

    class Recorder(Policy):
        budgets: list[int | None] = []

        async def act(self, requests):
            self.budgets += [r.max_new_tokens for r in requests]
            return [Generation("50") for _ in requests]

        def describe(self):
            return {"name": "openai", "model": "m", "base_url": "http://127.0.0.1:1/v1"}

    built: list[dict] = []

    def from_spec(spec: str, **options):
        built.append(options)
        return Recorder()

    monkeypatch.setattr(lbrun, "policy_from_spec", from_spec)
    label = "openai:m@http://127.0.0.1:1/v1"
    args = quiet_args(tmp_path, envs=["GuessNumber-v0", "Math-v0"], policies=[label], episodes=2)
    assert "--max-new-tokens" not in lbrun.format_command(args)
    records = {r.env_id: r for r in lbrun.main(args).records}
    assert "max_new_tokens" not in built[0] and set(Recorder.budgets) == {16, 96}
    assert records["GuessNumber-v0"].settings["max_new_tokens"] == 16
    assert records["Math-v0"].settings["max_new_tokens_source"] == "env"
    assert (
        "each environment's own token budget per turn" in (tmp_path / "leaderboard.md").read_text()
    )
    Recorder.budgets = []
    args = quiet_args(tmp_path / "set", envs=["GuessNumber-v0"], policies=[label], episodes=2)
    args.max_new_tokens = 5
    assert "--max-new-tokens 5" in lbrun.format_command(args)
    record = lbrun.main(args).records[0]
    assert built[-1]["max_new_tokens"] == 5 and set(Recorder.budgets) == {5}
    assert record.sampling["max_new_tokens"] == 5 and record.settings["max_new_tokens"] == 5
    with pytest.raises(InvalidArgumentError, match="max_new_tokens must be None"):
        lbrun.main(quiet_args(tmp_path, max_new_tokens=0))
