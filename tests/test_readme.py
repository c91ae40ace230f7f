"""The README's tour runs as written: its Python blocks in order in one namespace, and its
``llm-gym`` commands through the CLI. What cannot run here (a hub download, a served model, the
main job's outputs) names the test that runs the same code."""

from __future__ import annotations

import io
import re
import shlex
from pathlib import Path

import pytest

from llm_gym.cli import main
from llm_gym.gym import unregister_env

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)

COVERED_ELSEWHERE = {
    # a fragment of the block or line -> the test that runs the same thing here
    'model="Qwen/Qwen2.5-1.5B-Instruct"': (
        "tests/test_training_runs.py::test_the_seeds_example_runs_two_steps"
    ),
    "--policy hf:outputs/tool_use_game_tiny/final": (
        "tests/test_pipeline.py::test_pipeline_runs_end_to_end"
    ),
    'model="path/to/model"': (
        "tests/test_integration_trl.py::test_trl_trains_two_steps_on_tool_use_game"
    ),
    "rollout_func=rollout,": (
        "tests/test_integration_trl_rollout.py::test_trl_trains_two_steps_with_our_rollout"
    ),
    "llm-gym serve-env": "tests/test_integration_openenv.py::test_the_cli_serves_an_env",
    "llm-gym fetch-model smollm2-135m-instruct": (
        "tests/test_real_model.py::test_the_fetched_folder_is_an_ordinary_hf_folder"
    ),
    "--policy hf:smollm2-135m-instruct": (
        "tests/test_real_model.py::test_eval_on_every_registered_env_greedy_and_sampled"
    ),
    "--policy openai:MODEL@": (
        "tests/test_openai_policy.py::test_real_server_through_run_and_report"
    ),
}
"""What the README shows but a test elsewhere runs: the Qwen call downloads a model (the seeds'
test runs it on the tiny one), the hf line needs the main job's model, the openai line a server,
the TRL block a model path (its test trains two steps on the tiny one), the pretrained model the
package index (the slow real-model tests fetch it)."""


def blocks(language: str) -> list[str]:
    return [code for lang, code in BLOCK.findall(README) if lang == language]


def covering_test(text: str) -> str | None:
    return next((test for key, test in COVERED_ELSEWHERE.items() if key in text), None)


def llm_gym_commands() -> list[str]:
    lines = [line for code in blocks("bash") for line in code.splitlines()]
    return [line.split("#")[0].strip() for line in lines if line.startswith("llm-gym ")]


def test_every_covering_test_exists() -> None:
    for test in COVERED_ELSEWHERE.values():
        path, _, name = test.partition("::")
        assert f"def {name}(" in (ROOT / path).read_text(), test
    text = "\n".join(code for _, code in BLOCK.findall(README))
    assert all(key in text for key in COVERED_ELSEWHERE)  # each still describes the README


def test_the_python_blocks_run_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": "readme"}
    ran = 0
    try:
        for code in blocks("python"):
            if covering_test(code) is None:
                exec(compile(code, "README.md", "exec"), namespace)
                ran += 1
    finally:
        unregister_env("MyMath-v0")  # the tour registers them
        unregister_env("MyVf-v0")
    assert ran >= 5


@pytest.mark.parametrize("command", llm_gym_commands())
def test_the_commands_run(command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if covering_test(command) is not None:
        pytest.skip(f"{covering_test(command)} runs it")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.stdin", io.StringIO(":quit\n"))  # `llm-gym play` reads a turn
    argv = shlex.split(command)[1:]
    if argv[0] == "eval":
        argv.append("--no-progress")
    out = io.StringIO()
    assert main(argv, out=out) == 0, out.getvalue()
    printed = out.getvalue()
    if argv[0] == "eval" and "oracle" in argv:
        assert re.search(r"success rate\s+1\.000", printed), printed
    if argv[0] == "new-env":
        assert (tmp_path / "my_task" / "README.md").exists()
