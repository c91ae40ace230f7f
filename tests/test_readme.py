"""The README and the guides in docs/guides/ run as written: each page's Python blocks in order in
one namespace of its own, and its ``llm-gym`` commands through the CLI. What cannot run here (a
hub download, a served model, the main job's outputs) names the test that runs the same code.
Every relative link of these pages names a file of the repository."""

from __future__ import annotations

import io
import re
import shlex
from pathlib import Path

import pytest

from llm_gym.cli import main
from llm_gym.gym import unregister_env

ROOT = Path(__file__).resolve().parents[1]
PAGES = [
    "README.md",
    *sorted(p.relative_to(ROOT).as_posix() for p in ROOT.glob("docs/guides/*.md")),
]
"""The README, then each guide, by its path from the repository root."""
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)
LINK = re.compile(r"\]\(([^)\s]+)\)")
THROWAWAY_IDS = ("MyMath-v0", "MyVf-v0")
"""The ids the pages' blocks register."""

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
    "llm-gym serve-mcp": "tests/test_mcp_server.py::test_the_cli_serves_over_stdio",
    "llm-gym report outputs/": (
        "tests/test_run_report.py::test_llm_gym_report_writes_the_page_and_prints_its_path"
    ),
    "llm-gym fetch-model smollm2-135m-instruct": (
        "tests/test_real_model.py::test_the_fetched_folder_is_an_ordinary_hf_folder"
    ),
    "--policy hf:smollm2-135m-instruct": (
        "tests/test_real_model.py::test_eval_on_every_registered_env_greedy_and_sampled"
    ),
    "--policy openai:MODEL@": (
        "tests/test_openai_policy.py::test_real_server_through_run_and_report"
    ),
    "llm-gym serve smollm2-135m-instruct": (
        "tests/test_real_model.py::test_serve_with_the_openai_client"
    ),
    "llm-gym leaderboard --policies smollm2-135m-instruct": (
        "tests/test_real_model.py::test_a_leaderboard_row_for_the_packaged_model"
    ),
    "llm-gym fetch-model gemma3-270m": (
        "tests/test_gemma3.py::test_eval_is_refused_without_a_template_and_runs_with_one"
    ),
    "--policy hf:gemma3-270m": (
        "tests/test_gemma3.py::test_eval_is_refused_without_a_template_and_runs_with_one"
    ),
    "llm-gym serve MODEL --allowed-origins": (
        "tests/test_serving_access.py::test_both_server_commands_take_the_options"
    ),
    'base_url = "http://127.0.0.1:8000/v1"': (
        "tests/test_frameworks.py::test_the_serving_guides_snippet_runs"
    ),
    "OpenAIProvider(openai_client=client)": (
        "tests/test_responses_api.py::test_the_agents_sdk_runs_with_its_default_model"
    ),
    "llm-gym sft --from-episodes": (
        "tests/test_episode_files.py::test_rejection_sampling_fine_tuning_closes_the_loop"
    ),
    'sft_warm_start("smollm2-135m-instruct"': (
        "tests/test_episode_files.py::test_rejection_sampling_fine_tuning_closes_the_loop"
    ),
    "reward = JudgeReward(settings)": (
        "tests/test_judge.py::test_server_errors_are_retried_then_fall_back_and_are_counted"
    ),
    'GRPOConfig(model="MODEL"': (
        "tests/test_mixture.py::"
        "test_a_mixture_of_five_envs_trains_logs_per_env_and_resumes_the_same_draw"
    ),
    'weight_sync_type="WEIGHT_SYNC_TYPE_BACKGROUND_PUBLISH"': (
        "tests/test_async.py::test_an_agent_trains_async_on_its_served_replica"
    ),
    "env_factory=ToolUseGameEnv, agent=my_agent": (
        "tests/test_agent_training.py::"
        "test_an_agent_trains_and_its_samples_are_what_the_engine_sampled"
    ),
    'keep_best="val/success_rate"': (
        "tests/test_best_point.py::test_the_run_ends_bitwise_at_its_best_validation_point"
    ),
    'access = AccessPolicy.local(hosts=["gpu-box.lan"]': (
        "tests/test_openenv_hostile.py::"
        "test_an_access_policy_from_python_answers_the_hosts_and_origins_it_names"
    ),
}
"""What the pages show but a test elsewhere runs: the Qwen calls download a model (the seeds'
test runs it on the tiny one), the hf line needs the main job's model, the openai line a server,
the TRL blocks and the mixture guide's call a model path (their tests train two steps on the
tiny one), the pretrained models
the package index (the slow real-model tests fetch them), the serving guide's servers a
network address and a model (their tests serve on loopback), `llm-gym sft` and its Python
twin an episodes file (its test collects one first), the judge a judge endpoint (its tests
script one on loopback), and the keep-best call a task list and validation tasks (its test
scripts the validation values)."""


def read(page: str) -> str:
    return (ROOT / page).read_text(encoding="utf-8")


def blocks(page: str, language: str) -> list[str]:
    return [code for lang, code in BLOCK.findall(read(page)) if lang == language]


def covering_test(text: str) -> str | None:
    return next((test for key, test in COVERED_ELSEWHERE.items() if key in text), None)


def runnable_python(page: str) -> list[str]:
    return [code for code in blocks(page, "python") if covering_test(code) is None]


def llm_gym_commands() -> list[tuple[str, str]]:
    """Every ``llm-gym`` line of every page's bash blocks, as (page, command)."""
    commands = []
    for page in PAGES:
        lines = [line for code in blocks(page, "bash") for line in code.splitlines()]
        commands += [(page, ln.split("#")[0].strip()) for ln in lines if ln.startswith("llm-gym ")]
    return commands


def test_the_pages_are_the_readme_and_the_tour() -> None:
    tour = {"environments.md", "rollouts.md", "training.md", "integrations.md", "benchmarks.md"}
    assert tour <= {Path(page).name for page in PAGES}
    assert sum(len(runnable_python(page)) for page in PAGES) >= 10  # the tour's blocks run here


def test_every_covering_test_exists() -> None:
    for test in COVERED_ELSEWHERE.values():
        path, _, name = test.partition("::")
        assert f"def {name}(" in (ROOT / path).read_text(), test
    text = "\n".join(code for page in PAGES for _, code in BLOCK.findall(read(page)))
    missing = [key for key in COVERED_ELSEWHERE if key not in text]
    assert not missing, f"no page shows {missing}: drop them from COVERED_ELSEWHERE"


@pytest.mark.parametrize("page", [page for page in PAGES if runnable_python(page)])
def test_the_python_blocks_run_in_order(
    page: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": "readme"}
    try:
        for code in runnable_python(page):
            exec(compile(code, page, "exec"), namespace)
    finally:
        for env_id in THROWAWAY_IDS:
            unregister_env(env_id)


@pytest.mark.parametrize(("page", "command"), llm_gym_commands())
def test_the_commands_run(
    page: str, command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
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


@pytest.mark.parametrize("page", PAGES)
def test_the_relative_links_name_files(page: str) -> None:
    targets = [t for t in LINK.findall(read(page)) if not re.match(r"[a-z]+:|#", t)]
    folder = (ROOT / page).parent
    missing = [t for t in targets if not (folder / t.split("#")[0]).exists()]
    assert not missing, f"{page} links to {missing}: a link is relative to the page's folder"
