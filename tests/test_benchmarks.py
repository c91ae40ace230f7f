"""Every benchmark script runs with tiny arguments (smoke tests; no timing asserted)."""

from __future__ import annotations

import json

import pytest

from benchmarks import env_step


def test_env_step_smoke(tmp_path) -> None:
    args = env_step.parse_args(["--quick", "--episodes", "5", "--repeats", "2"])
    args.out_dir = tmp_path
    rows = env_step.main(args)
    kinds = {(env, kind) for env, kind, _, _ in rows}
    assert ("ToolUseGame-v0", "lookup") in kinds and ("ToolUseGame-v0", "final_answer") in kinds
    assert (tmp_path / "env_step.md").exists() and (tmp_path / "env_step.png").exists()
    data = json.loads((tmp_path / "env_step.json").read_text())
    assert data["conditions"]["quick"] and data["conditions"]["threads"]["torch_threads"] == 1
    assert len(data["median_us_per_repeat"]["GuessNumber-v0 (\\boxed{n}, bisection)"]) == 2


@pytest.mark.slow  # every contender, TRL's two back-ends included: about 1.5 min on 2 cores
def test_rollout_throughput_smoke(small_model_dir, tmp_path) -> None:
    """``--quick`` runs every contender through the harness and writes the markdown and the
    JSON (with its conditions and ``ratio_to_replay_limit``) where ``--out-dir`` says."""
    import json

    import pytest

    pytest.importorskip("trl")
    from benchmarks import rollout_throughput as rt

    args = rt.parse_args(["--quick", "--model", str(small_model_dir), "--out-dir", str(tmp_path)])
    assert (args.tasks, args.repeats, args.threads) == (2, 3, 1)
    summary = rt.main(args)
    contenders = summary["contenders"]
    assert set(contenders) == {
        "ours",
        "replay",
        "generate",
        "trl_generate",
        "trl_continuous_batching",
        "waves",
    }
    for backend in ("trl_generate", "trl_continuous_batching"):  # identical prompts, asserted
        assert all(r["identical_prompt_ids"] == 2 for r in contenders[backend]["runs"])
    assert summary["trl_best"] in ("trl_generate", "trl_continuous_batching")
    for entry in contenders.values():
        assert len(entry["runs"]) == 3
        assert all(run["episodes"] == 4 and run["wall_s"] > 0 for run in entry["runs"])
    replayed = contenders["replay"]["runs"]
    assert all(r["tokens"] == r["source_tokens"] for r in replayed)
    data = json.loads((tmp_path / "rollout_throughput.json").read_text())
    limit = data["ratio_to_replay_limit"]
    assert set(limit) == {"median", "ci"} and limit["ci"][0] <= limit["median"] <= limit["ci"][1]
    best = data["ratio_to_trl_best"]
    assert best == data[f"ratio_to_{data['trl_best']}"] and best["median"] > 0
    assert data["conditions"]["quick"] and data["conditions"]["threads"]["torch_threads"] == 1
    assert len(data["conditions"]["load_after"]) == 3
    assert data["statistics"]["repeats"] == 3 and len(data["statistics"]["order"]) == 3
    assert "replay limit" in (tmp_path / "rollout_throughput.md").read_text()
    check_roofline(data["roofline"], data["contenders"], bound=1.0, positive=True)
    assert "share of floor" in (tmp_path / "rollout_throughput.md").read_text()
    assert (tmp_path / "rollout_throughput.png").exists()


def check_roofline(
    roof: dict, contenders: dict, *, bound: float, key: str = "wall_s", positive: bool = False
) -> None:
    """The roofline a benchmark's JSON holds is sane: a positive fp32 peak and bandwidth, the CPU
    and its flags; every contender has a dtype, a floor (> 0 with ``positive``) no longer than
    its measured time allows, and a share of it in [0, ``bound``] (in (0, bound] with
    ``positive``)."""
    assert roof["peak_gflops"]["float32"] > 0 and roof["copy_gbps"] > 0
    assert roof["cpu"] and isinstance(roof["cpu_flags"], list)
    assert set(roof["matmul_gflops"]) == {"float32", "bfloat16"}
    for name, entry in contenders.items():
        share = entry["share_of_floor"]
        assert entry["dtype"] in ("float32", "bfloat16"), name
        assert entry["floor_s"] > 0 if positive else entry["floor_s"] >= 0, name
        assert 0 <= share["ci"][0] <= share["median"] <= share["ci"][1] <= bound, name
        assert share["median"] > 0 or not positive, name
        assert all(run[key] > 0 for run in entry["runs"]), name


def test_rollout_options_and_the_repeat_floor() -> None:
    """``--quick`` sets tiny sizes where none is given and writes only to ``--out-dir``; a full
    run needs at least 5 repeats (checked before any model loads)."""
    from benchmarks import rollout_throughput as rt

    args = rt.parse_args(["--quick", "--tasks", "5", "--repeats", "2"])
    assert (args.tasks, args.repeats, args.episodes_per_task, args.out_dir) == (5, 2, 2, None)
    full = rt.parse_args([])
    assert (full.tasks, full.repeats, full.quick) == (16, 7, False)
    import pytest

    with pytest.raises(ValueError, match="at least 5 repeats"):
        rt.main(rt.parse_args(["--repeats", "3"]))


def _teacher_forced(model, ids: list[int]) -> list[float]:
    """``logprobs[i]``: log p(ids[i] | ids[:i]) under ``model`` (0.0 for i = 0)."""
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    logps = torch.log_softmax(logits[:-1], dim=-1).gather(-1, torch.tensor(ids[1:])[:, None])
    return [0.0, *logps[:, 0].tolist()]


def test_the_replay_computes_what_a_plain_forward_pass_computes(small_model) -> None:
    """Made-up streams of uneven length (several turns, replies, a trailing reply, a second
    sample that shares only part of the prefix): every replayed logprob equals a teacher-forced
    forward pass over the same context, and the counts are the fewest the streams allow."""
    import random
    from types import SimpleNamespace

    import pytest

    from benchmarks.rollout_replay import Replay, episode_streams, replay_logprobs

    model, tokenizer = small_model
    vocab = model.config.vocab_size
    rng = random.Random(0)
    prefix = [rng.randrange(3, vocab) for _ in range(12)]

    def sample(prompt: list[int], turns: int, trailing: bool) -> SimpleNamespace:
        ids, mask = [], []
        for turn in range(turns):
            if turn:  # an environment reply between turns
                reply = [rng.randrange(3, vocab) for _ in range(rng.randrange(1, 5))]
                ids, mask = ids + reply, mask + [0] * len(reply)
            n = rng.randrange(1, 6)
            ids, mask = ids + [rng.randrange(3, vocab) for _ in range(n)], mask + [1] * n
        if trailing:  # a reply no turn read (a capped episode)
            ids, mask = [*ids, 5, 6], [*mask, 0, 0]
        forced = _teacher_forced(model, prompt + ids)[len(prompt) :]
        lps = [lp if m else 0.0 for lp, m in zip(forced, mask, strict=True)]
        return SimpleNamespace(prompt_ids=prompt, completion_ids=ids, env_mask=mask, logprobs=lps)

    episodes = []
    for i in range(5):
        question = [rng.randrange(3, vocab) for _ in range(rng.randrange(2, 7))]
        samples = [sample(prefix + question, turns=1 + i % 3, trailing=i == 2)]
        if i == 4:  # the template rewrote history: a second row, half the prefix shared
            samples.append(sample([*prefix[:6], 7, 8, 9], turns=2, trailing=False))
        episodes.append(SimpleNamespace(samples=samples))
    pad = tokenizer.pad_token_id
    for got, recorded in replay_logprobs(model, episodes, pad):
        assert got == pytest.approx(recorded, abs=1e-4)
    shared, streams = episode_streams(episodes)
    assert shared == prefix
    replay = Replay(model, shared, streams, pad)
    sampled = [sum(sum(s.env_mask) for s in e.samples) for e in episodes]
    assert replay.tokens == sum(sampled)
    assert replay.passes == 1 + max(sampled)  # the prefix, then one pass per sampled token
    assert replay.run() > 0


def test_the_replay_reproduces_the_engines_logprobs(small_model) -> None:
    """Real streams from ``collect_groups`` (multi-turn, sampled at temperature 1): the replay
    gives the logprobs the engine recorded, over the same tokens in no more passes."""
    import pytest

    from benchmarks.rollout_replay import Replay, episode_streams, replay_logprobs
    from llm_gym import Task
    from llm_gym.policies import HFPolicy
    from llm_gym.rollout import collect_groups
    from tests.test_tokens import Chatty

    model, tokenizer = small_model
    policy = HFPolicy(model, tokenizer, temperature=1.0, max_new_tokens=6, seed=1)
    groups = collect_groups(
        Chatty, [Task("hello"), Task("numbers 123")], policy, episodes_per_task=2, max_turns=3
    )
    episodes = [e for g in groups for e in g]
    assert all(e.num_turns == 3 for e in episodes)
    for got, recorded in replay_logprobs(model, episodes, tokenizer.pad_token_id):
        assert got == pytest.approx(recorded, abs=1e-4)
    replay = Replay(model, *episode_streams(episodes), tokenizer.pad_token_id)
    assert replay.tokens == sum(e.completion_tokens for e in episodes)
    assert replay.passes <= policy.forward_passes
    assert replay.prefill_tokens == policy.prefilled_tokens


def test_a_steps_least_work_is_its_trained_rows_token_tree() -> None:
    """Two rows after the same left-padded 3-token prompt and a silent third: row 0 samples
    [5, 6], gets a 2-token tool result and samples [7]; row 1 samples [5, 8]; row 2's advantage
    is zero. Tokens: every real one (3 + 5, 3 + 2, 2 + 1). Positions: the prompt once, row 0's
    5 and row 1's [8] (its [5] is row 0's): 9. Logits: after the prompt (shared), after
    [5] (shared: 6 and 8 score from it), and after the tool result: 3."""
    import torch

    from benchmarks.step_work import batch_work

    batch = {  # ours: per-token advantages; TRL's one a row is spread the same way
        "prompt_ids": torch.tensor([[1, 2, 3], [1, 2, 3], [0, 1, 2]]),
        "prompt_mask": torch.tensor([[1, 1, 1], [1, 1, 1], [0, 1, 1]]),
        "completion_ids": torch.tensor([[5, 6, 9, 9, 7], [5, 8, 0, 0, 0], [4, 0, 0, 0, 0]]),
        "completion_mask": torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0]]),
        "tool_mask": torch.tensor([[1, 1, 0, 0, 1], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0]]),
        "advantages": torch.tensor([[0.5] * 5, [-0.5] * 5, [0.0] * 5]),
    }
    assert batch_work([batch]) == {"tokens": 8 + 5 + 3, "positions": 9, "trained": 3}
    batch["advantages"] = torch.tensor([0.5, -0.5, 0.0])
    assert batch_work([batch])["positions"] == 9
    batch["advantages"] = torch.zeros(3)  # no signal: no pass
    assert batch_work([batch]) == {"tokens": 16, "positions": 0, "trained": 0}


@pytest.mark.slow  # 15-25 s: with the slow checks, which CI runs
def test_train_step_smoke(small_model_dir, tmp_path) -> None:
    """``--quick``: every contender (ours, three ablations, TRL) trains through the harness, each
    step split into generation, scoring and the rest; the held-out quality run evaluates ours and
    TRL; the JSON holds ``step_time_ratio_to_trl`` with its interval."""
    import json

    import pytest

    pytest.importorskip("trl")
    from benchmarks import train_step

    args = train_step.parse_args(
        ["--quick", "--model", str(small_model_dir), "--out-dir", str(tmp_path)]
    )
    summary = train_step.main(args)
    assert set(summary["contenders"]) == {
        "ours", "ours_no_token_tree", "ours_no_shared_prefix", "ours_waves", "trl"
    }  # fmt: skip
    for entry in summary["contenders"].values():
        assert len(entry["runs"]) == 2
        for run in entry["runs"]:
            assert len(run["steps"]) == 2
            for step in run["steps"]:
                assert step["generation_s"] > 0 and step["scoring_s"] > 0
                parts = step["generation_s"] + step["scoring_s"] + step["backward_s"]
                assert parts == pytest.approx(step["step_s"])
    for name in ("ours", "trl"):
        assert summary["held_out"][name]["sampled"]["episodes"] == 4  # 2 tasks x 2 samples
    data = json.loads((tmp_path / "train_step.json").read_text())
    ratio = data["step_time_ratio_to_trl"]
    assert ratio["ci"][0] <= ratio["median"] <= ratio["ci"][1]
    assert data["conditions"]["threads"]["torch_threads"] == 2
    assert "Step time, ours / TRL" in (tmp_path / "train_step.md").read_text()
    check_roofline(data["roofline"], data["contenders"], bound=1.0, key="step_s")
    for entry in data["contenders"].values():  # the forward and backward: a part of the step
        assert entry["share_of_floor"]["median"] <= entry["share_of_floor_train"]["median"] <= 1
        for step in (step for run in entry["runs"] for step in run["steps"]):
            assert 0 <= step["trained"] <= step["positions"] <= step["tokens"]
    assert all(entry["floor_s"] >= 0 for entry in data["contenders"].values())
    assert "share of floor" in (tmp_path / "train_step.md").read_text()


def test_train_step_contenders_are_chosen_with_ours_among_them(small_model_dir, capsys) -> None:
    """``--contenders ours``: ours alone is timed; no ratio, no held-out comparison with TRL."""
    from benchmarks import train_step

    with pytest.raises(SystemExit):
        train_step.parse_args(["--contenders", "trl"])
    assert "must include ours" in capsys.readouterr().err
    args = train_step.parse_args(["--quick", "--model", str(small_model_dir), "--contenders",
                                  "ours", "--repeats", "1", "--steps", "1"])  # fmt: skip
    assert args.contenders == ("ours",)
    summary = train_step.main(args)
    assert set(summary["contenders"]) == {"ours"} and summary["held_out"] == {}
    assert summary["step_time_ratio_to_trl"] is None
    assert "| llm_gym `MultiTurnGRPOTrainer` |" in capsys.readouterr().out


def test_decode_profile_smoke(small_model_dir, capsys) -> None:
    """``--quick`` profiles decode steps of the engine: a step time, the ops by self CPU time
    and the Python frames by own time, each with its share of a step, printed."""
    from benchmarks import decode_profile

    result = decode_profile.main(["--model", str(small_model_dir), "--quick", "--threads", "1"])
    assert result["rows"] == 2 and result["step_ms"] > 0 and result["threads"] == 1
    assert any(op.startswith("aten::") for op, _, _ in result["ops"])
    assert all(share >= 0 for _, share, _ in result["ops"] + result["frames"])
    assert "| op (self CPU) | share of step | calls |" in capsys.readouterr().out


def test_grpo_overfit_smoke(small_model_dir, capsys) -> None:
    import pytest

    pytest.importorskip("trl")
    from benchmarks.grpo_overfit import main

    main(["--model", str(small_model_dir), "--tasks", "4", "--steps", "1", "--samples", "2"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("before: sampled") and lines[-1].startswith("after:  sampled")


def test_before_after_smoke(tmp_path) -> None:
    import shutil

    import pytest

    from benchmarks import before_after

    if shutil.which("git") is None or not (before_after.ROOT / ".git").exists():
        pytest.skip("before_after compares two git revisions: it needs git and a checkout")
    rows = before_after.main(
        before_after.Args(
            base="HEAD", rounds=1, envs=["GuessNumber-v0"], episodes=2, out_dir=tmp_path
        )
    )
    assert [row["metric"] for row in rows] == ["env_step/GuessNumber-v0 (µs)"]
    assert rows[0]["before"] > 0 and rows[0]["after"] > 0
    assert {p.name for p in tmp_path.iterdir()} == {
        "before_after.md",
        "before_after.json",
        "before_after.png",
    }


@pytest.mark.slow  # 15-25 s: with the slow checks, which CI runs
def test_async_speedup_smoke(small_model_dir, tmp_path) -> None:
    """Every contender trains and is evaluated; the summary holds the keys the issue names and
    the files are written."""
    import json

    import pytest

    pytest.importorskip("trl")
    from benchmarks import async_speedup

    args = async_speedup.parse(["--quick", "--model", str(small_model_dir)])
    args.write, args.out_dir, args.steps, args.latencies = True, tmp_path, 4, (0.0, 0.02)
    summary = async_speedup.main(args)
    assert {"speedup_with_latency", "speedup_without_latency"} <= set(summary)
    entries = {(e["contender"], e["latency_s"]) for e in summary["entries"]}
    assert ("lockstep", 0.02) in entries and ("async-PIPELINE-off1", 0.0) in entries
    assert all(e["steps_per_hour"] > 0 for e in summary["entries"])
    assert json.loads((tmp_path / "async.json").read_text())["latency_with_s"] == 0.02
    assert (tmp_path / "async.md").exists() and (tmp_path / "async.png").exists()


def test_distill_smoke(small_model_dir, tmp_path) -> None:
    import pytest

    pytest.importorskip("trl")
    from benchmarks import distill

    args = distill.parse(["--quick", "--teacher", str(small_model_dir)])
    args.student, args.out_dir, args.write = str(small_model_dir), tmp_path, True
    summary = distill.main(args)
    assert len(summary["reverse_kl_per_step"]) == 2
    assert 0.0 <= summary["student_after"]["success"] <= 1.0
    assert (tmp_path / "distill.md").exists() and (tmp_path / "distill.png").exists()
    text = (tmp_path / "distill.md").read_text()
    assert "## Reading" in text and "load average" in text  # the common harness's conditions
    recorded = json.loads((tmp_path / "distill.json").read_text())["conditions"]
    assert recorded["quick"] is True and len(recorded["load_before"]) == 3


def test_serve_load_smoke(small_model_dir, tmp_path) -> None:
    import pytest

    pytest.importorskip("uvicorn")
    from benchmarks import serve_load

    args = serve_load.Args.quick(model=str(small_model_dir), duration_s=2.0, out_dir=tmp_path)
    args.write = True
    summary = serve_load.main(args)
    assert summary["ok"] >= 1 and summary["resets"] == 0 and summary["errors"] == 0
    assert summary["latency"]["p99_s"] >= summary["latency"]["p50_s"] > 0
    for suffix in ("md", "json", "png"):
        assert (tmp_path / f"serve_load.{suffix}").exists()


@pytest.mark.slow  # 15-25 s: with the slow checks, which CI runs
def test_remote_env_smoke(small_model_dir, tmp_path) -> None:
    import json

    import pytest

    pytest.importorskip("openenv")
    from benchmarks import remote_env

    summary = remote_env.main(
        ["--quick", "--model", str(small_model_dir), "--out-dir", str(tmp_path)]
    )
    load = summary["load"]
    assert load["failed_episodes"] == 0 and load["sessions_left_on_server"] == 0
    assert load["calls"] >= 3 * load["episodes"]  # a reset and at least two steps each
    runs = summary["collection"]["runs"]
    assert set(runs) == {"in_process@1", "remote@1", "in_process@2", "remote@2"}
    for threads in (1, 2):
        remote, local = runs[f"remote@{threads}"], runs[f"in_process@{threads}"]
        assert [r["episodes"] for r in remote] == [r["episodes"] for r in local]
        assert all(r["env_errors"] == 0 for r in remote)
    assert set(summary["collection"]["ratio_by_threads"]) == {"1", "2"}
    for suffix in ("md", "json", "png"):
        assert (tmp_path / f"remote_env.{suffix}").exists()
    saved = json.loads((tmp_path / "remote_env.json").read_text())
    assert set(saved["ratio_remote_to_in_process"]) == {"median", "ci"}


def test_main_job_smoke(small_model_dir, tmp_path) -> None:
    """``--quick``: the job once, then its GRPO phase with a second seed from the same SFT model;
    the JSON has the test split and the new world per seed."""
    import json

    import pytest

    pytest.importorskip("trl")
    from benchmarks import main_job

    args = ["--quick", "--model", str(small_model_dir), "--seeds", "0", "1"]
    result = main_job.main([*args, "--out-dir", str(tmp_path)])
    data = json.loads((tmp_path / "main_job.json").read_text())
    assert data["split"] == "test" and data["variants"] == {"new_world": {"world_seed": 1}}
    for section in ("test_split", "new_world"):
        seeds = [entry["grpo_seed"] for entry in data[section]["per_seed"]]
        assert seeds == [0, 1]
        for entry in data[section]["per_seed"]:
            assert entry["sampled"]["tasks"] == 2 and entry["greedy"]["tasks"] == 2
    assert set(result["train_log"]) == {0, 1}
    assert (tmp_path / "main_job_reward_curve.png").exists()
    assert "new_world" in (tmp_path / "main_job.md").read_text()


@pytest.mark.slow  # a GRPO step of an agent against the served tiny model
def test_agent_training_smoke(small_model_dir, tmp_path) -> None:
    """``--quick``: the agent plays one GRPO step from ``--model``; the JSON has the step's
    reward and the trend."""
    pytest.importorskip("openai")
    pytest.importorskip("uvicorn")
    from benchmarks import agent_training

    args = ["--quick", "--model", str(small_model_dir), "--out-dir", str(tmp_path)]
    result = agent_training.main(args)
    assert [s["step"] for s in result["steps"]] == [1] and "reward" in result["steps"][0]
    data = json.loads((tmp_path / "agent_training.json").read_text())
    assert data["conditions"]["quick"] and set(data["trend"]) == {
        "slope_per_step", "first_third", "last_third",
    }  # fmt: skip
    assert "| step | reward |" in (tmp_path / "agent_training.md").read_text()


def test_gpu_rollout_check_runs_on_cpu(small_model_dir) -> None:
    """The GPU rollout check, its code path on CPU: ours and the replay interleaved, the
    ratio with its interval and the roofline share."""
    from benchmarks.gpu_rollout import check_rollout_limit, copy_bandwidth_gbps

    lines: list[str] = []
    result = check_rollout_limit(
        str(small_model_dir), lines, "cpu", tasks=2, episodes_per_task=2, repeats=2
    )
    low, high = result["ratio_to_replay_limit"]["ci"]
    assert 0 < low <= result["ratio_to_replay_limit"]["median"] <= high
    assert result["sampled_tokens"] > 0 and result["roofline_share_of_replay"] > 0
    assert "replay limit" in lines[0] and copy_bandwidth_gbps("cpu", gib=0.01, repeats=1) > 0


@pytest.mark.slow  # a child process imports torch and loads the model: 15-25 s
def test_real_model_eval_smoke(small_model_dir, tmp_path) -> None:
    """``--quick``: ``llm-gym eval`` as a child process on the tiny model, then one env in
    process; the markdown, JSON and PNG go to ``--out-dir`` with the budget each run used."""
    from benchmarks import real_model_eval

    args = real_model_eval.parse_args(
        ["--quick", "--model", str(small_model_dir), "--out-dir", str(tmp_path)]
    )
    results = real_model_eval.main(args)
    headline = results["headline"]
    assert headline["episodes"] == 2 and headline["wall_s"] > headline["episodes_wall_s"] > 0
    assert (headline["max_new_tokens"], headline["max_new_tokens_source"]) == (16, "env")
    assert headline["sampled_tokens_per_episode"] <= 16 * headline["turns_per_episode"]
    assert results["per_env"]["GuessNumber-v0"]["max_new_tokens"] == 16
    data = json.loads((tmp_path / "real_model_eval.json").read_text())
    assert data["conditions"]["quick"] and data["conditions"]["threads"]["torch_threads"] == 2
    assert (tmp_path / "real_model_eval.md").exists() and (
        tmp_path / "real_model_eval.png"
    ).exists()


def test_constrained_decoding_smoke(tmp_path) -> None:
    import pytest

    pytest.importorskip("llguidance")
    from benchmarks import constrained_decoding

    summary = constrained_decoding.main(
        ["--quick", "--tokens", "4", "--out-dir", str(tmp_path), "--threads", "1"]
    )
    assert summary["libraries"]["tiny"]["llguidance"]["mask_us"] > 0
    assert summary["decoding"]["tiny"]["grammar_ms_per_token"] > 0
    for suffix in ("md", "json", "png"):
        assert (tmp_path / f"constrained_decoding.{suffix}").exists()


def test_difficulty_sampling_smoke(small_model_dir, tmp_path) -> None:
    """``--quick``: one seed, both arms from one warm start; the report has steps to each
    target and the zero-variance groups met per arm."""
    pytest.importorskip("trl")
    from benchmarks import difficulty_sampling

    args = ["--quick", "--model", str(small_model_dir), "--seeds", "0", "--steps", "2",
            "--batch-size", "2", "--group-size", "2", "--val-every", "1", "--val-tasks", "2",
            "--out-dir", str(tmp_path)]  # fmt: skip
    result = difficulty_sampling.main(args)
    assert [r["arm"] for r in result["runs"]] == ["uniform", "difficulty"]
    for r in result["runs"]:
        assert [v["step"] for v in r["validation"]] == [0, 1, 2]
        assert set(r["steps_to"]) == {"0.5", "0.6", "0.7"}
    assert result["runs"][1]["saved_estimate"] is not None
    assert result["runs"][0]["saved_estimate"] is None
    data = json.loads((tmp_path / "difficulty_sampling.json").read_text())
    assert data["settings"]["steps"] == 2
    assert (tmp_path / "difficulty_sampling.png").exists()
    assert "steps to 0.5" in (tmp_path / "difficulty_sampling.md").read_text()


def _real_model_run(before: dict, after: dict, start_hash: str = "w0") -> dict:
    return {
        "task_success": {"before_grpo": before, "after_grpo": after},
        "train_log": [{"step": 1, "reward": 0.1}, {"step": 2, "reward": 0.3}],
        "total_seconds": 600.0, "grpo_seconds": 480.0, "peak_rss_mb": 2048.0,
        "start_model": "smollm2-135m-instruct", "start_hash": start_hash,
    }  # fmt: skip


def test_real_model_report_pairs_grpo_and_rft_by_task(tmp_path, monkeypatch) -> None:
    """The table from hand-made records: start 0.25; GRPO 0.75 (+0.5), RFT 0.5 (+0.25), GRPO -
    RFT +0.25, each paired by task; a recorded run is skipped, and the report is rebuilt from
    the JSON alone."""
    from benchmarks import real_model, real_model_report

    before = {"a": 0.0, "b": 0.0, "c": 1.0, "d": 0.0}
    grpo = _real_model_run(before, {"a": 1.0, "b": 1.0, "c": 1.0, "d": 0.0})
    rft = _real_model_run(before, {"a": 1.0, "b": 0.0, "c": 1.0, "d": 0.0})
    runs = {}
    for arm, run in (("grpo", grpo), ("rft", rft)):
        settings = real_model.run_settings("chain_sum", arm, {}, tune=False)
        runs[real_model.settings_key(f"chain_sum.{arm}", settings)] = {**run, "settings": settings}
    text = real_model_report.render({"runs": runs})
    row = next(line for line in text.splitlines() if line.startswith("| greedy success"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1:4] == ["0.250", "0.750", cells[3]] and cells[3].startswith("+0.500 [")
    assert cells[4] == "0.500" and cells[5].startswith("+0.250 [")
    assert cells[6].startswith("+0.250 [")
    assert "Both arms started from the same weights." in text
    assert "| greedy mean reward |" not in text  # no run recorded rewards
    runs_with_rewards = {
        key: {**run, "task_reward": {"before_grpo": {"a": 0.1, "b": 0.3},
                                     "after_grpo": {"a": 0.5, "b": 0.5 if "grpo" in key else 0.3}}}
        for key, run in runs.items()
    }  # fmt: skip
    row = next(
        line for line in real_model_report.render({"runs": runs_with_rewards}).splitlines()
        if line.startswith("| greedy mean reward")
    )  # fmt: skip
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1:3] == ["0.200", "0.500"] and cells[3].startswith("+0.300 [")
    assert cells[4] == "0.400" and cells[6].startswith("+0.100 [")
    next(r for r in runs.values() if r["settings"]["arm"] == "rft")["start_hash"] = "w1"
    assert "started from different weights" in real_model_report.render({"runs": runs})

    # run by run: a recorded run is not run again; --render reads the JSON only
    (tmp_path / "real_model.json").write_text(json.dumps({"runs": runs}))

    def refuse(*args, **kwargs):
        raise AssertionError("a recorded run ran again")

    monkeypatch.setattr(real_model, "run_recipe", refuse)
    real_model.main(["--run", "chain_sum.grpo", "--out-dir", str(tmp_path)])
    real_model.main(["--render", "--out-dir", str(tmp_path)])
    assert "+0.500 [" in (tmp_path / "real_model.md").read_text()
    assert (tmp_path / "real_model.png").exists()
    with pytest.raises(SystemExit):
        real_model.main(["--out-dir", str(tmp_path)])  # nothing to do is an error naming runs


def test_rollout_throughput_refuses_a_model_that_calls_no_tools(monkeypatch, capsys) -> None:
    """Single-turn episodes are not the workload: a full run stops naming the remedy, a
    ``--quick`` one warns; a model that calls tools passes."""
    from types import SimpleNamespace as NS

    from benchmarks import rollout_throughput as rt

    calls = [0]

    def fake_run(model, tokenizer, tasks, args, record=None, **kwargs):
        record.extend(NS(tool_calls=calls[0]) for _ in range(len(tasks) * args.episodes_per_task))
        return {}

    monkeypatch.setattr(rt, "run_ours", fake_run)
    with pytest.raises(SystemExit, match="makes 0.00 tool calls an episode"):
        rt.check_multi_turn(None, None, "m", list(range(8)), rt.Args())
    rt.check_multi_turn(None, None, "m", list(range(8)), rt.Args(quick=True))
    assert "warning: The model at m makes 0.00" in capsys.readouterr().out
    calls[0] = 1
    rt.check_multi_turn(None, None, "m", list(range(8)), rt.Args())
