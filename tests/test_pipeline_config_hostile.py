"""Hostile YAML for train.py's config reader (trainers.pipeline_config): documents nested
100,000 deep, in a config file or a ``--set`` value, are one clear error, never RecursionError
(PyYAML composes nested nodes by recursion); YAML's own errors are one line.

=========================  ==========================================  =========================
case                       without a fix                               what holds
=========================  ==========================================  =========================
``task_repeats`` of        ``check_pipeline`` built a list of 10**12   refused before the list
10**12                     task references (memory exhausted)          is made, naming
                                                                       MAX_GRPO_TASKS
``output_dir`` naming a    every check passed, then ``mkdir`` raised   refused first, naming
file                       FileExistsError as an unexpected error      the path
=========================  ==========================================  =========================
"""

from __future__ import annotations

from pathlib import Path

import pytest

from llm_gym.errors import InvalidArgumentError
from trainers.pipeline_config import MAX_YAML_DEPTH, load_config, yaml_load

DEEP = {
    "flow list": "seed: " + "[" * 100_000 + "]" * 100_000,
    "flow mapping": "seed: " + "{a: " * 100_000 + "1" + "}" * 100_000,
    "block mapping": "".join(" " * i + "k:\n" for i in range(1_400)),  # 1 MB of indentation
}


@pytest.mark.parametrize("name", list(DEEP))
def test_a_deep_config_is_refused_naming_the_limit(name: str, tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(DEEP[name])
    with pytest.raises(InvalidArgumentError) as info:
        load_config(path)  # RecursionError without the limit
    text = str(info.value)
    assert str(path) in text and f"nests more than {MAX_YAML_DEPTH} levels deep" in text
    assert "trainers.pipeline_config.MAX_YAML_DEPTH" in text and len(text) < 400


def test_the_depth_limit_leaves_room_for_any_config() -> None:
    value = yaml_load("[" * MAX_YAML_DEPTH + "1" + "]" * MAX_YAML_DEPTH)
    for _ in range(MAX_YAML_DEPTH):
        (value,) = value
    assert value == 1
    with pytest.raises(InvalidArgumentError, match="nests more than"):
        yaml_load("a: " + "[" * MAX_YAML_DEPTH + "]" * MAX_YAML_DEPTH)  # the mapping is one


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[", "while parsing a flow node: expected the node content, but found '<stream end>' "
         "(line 1, column 2)"),
        ("a: 1\na: 2", "duplicate key 'a' (line 2, column 1)"),
    ],
)  # fmt: skip
def test_yaml_errors_are_one_line_with_the_place(text: str, message: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        yaml_load(text)
    assert str(info.value) == f"not valid YAML: {message}."  # not four lines with a caret


def test_task_repeats_past_the_limit_are_refused_before_the_list_is_made() -> None:
    import resource
    import time

    from llm_gym import Task
    from trainers.pipeline import MAX_GRPO_TASKS, repeat_by_kind

    tasks = [Task(prompt=str(i), metadata={"type": "lookup"}) for i in range(3)] + [Task("x")]
    limit = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, limit[1]))  # a list of 10**12 would die
    try:
        start = time.perf_counter()
        with pytest.raises(InvalidArgumentError, match="MAX_GRPO_TASKS"):
            repeat_by_kind(tasks, {"lookup": 10**12})
        assert time.perf_counter() - start < 5
    finally:
        resource.setrlimit(resource.RLIMIT_AS, limit)
    assert len(repeat_by_kind(tasks, {"lookup": MAX_GRPO_TASKS // 3 - 1})) < MAX_GRPO_TASKS


def test_an_output_dir_that_is_a_file_is_refused_before_any_other_check(tmp_path: Path) -> None:
    from trainers.pipeline import check_pipeline
    from trainers.pipeline_config import PipelineConfig

    taken = tmp_path / "a_file"
    taken.write_text("not a folder")
    config = PipelineConfig(env="NoSuchEnv-v0", output_dir=str(taken))  # the env comes later
    with pytest.raises(InvalidArgumentError, match="exists and is not a folder"):
        check_pipeline(config)
