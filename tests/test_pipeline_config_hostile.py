"""Hostile YAML for train.py's config reader (trainers.pipeline.config): documents nested
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

import time
from pathlib import Path

import pytest

from llm_gym.errors import InvalidArgumentError
from trainers.pipeline.config import MAX_YAML_DEPTH, load_config, yaml_load

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
    assert "trainers.pipeline.config.MAX_YAML_DEPTH" in text and len(text) < 400


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
    from trainers.pipeline.run import MAX_GRPO_TASKS, repeat_by_kind

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
    from trainers.pipeline.config import PipelineConfig
    from trainers.pipeline.run import check_pipeline

    taken = tmp_path / "a_file"
    taken.write_text("not a folder")
    config = PipelineConfig(env="NoSuchEnv-v0", output_dir=str(taken))  # the env comes later
    with pytest.raises(InvalidArgumentError, match="exists and is not a folder"):
        check_pipeline(config)


# --- train.py configs and task files --------------------------------------------------------------

LAUGHS = "".join(
    f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}" if i else "x"] * 10) + "]\n" for i in range(9)
)
YAML_CONFIGS = {
    "a list": ("- 1\n- 2", "a config is a mapping"),
    "a string": ("hello", "a config is a mapping"),
    "sft as a list": ("sft: [1]", "sft must be a mapping"),
    "evaluation as a number": ("evaluation: 3", "evaluation must be a mapping"),
    "grpo as a list": ("grpo: [1]", "grpo must be a mapping"),
    "seed as text": ("seed: abc", "seed must be an integer"),
    "a duplicate key": ("seed: 1\nseed: 2", "duplicate key 'seed'"),
    "a duplicate nested key": ("grpo: {a: 1, a: 2}", "duplicate key 'a'"),
    "billion laughs": (LAUGHS, "expands to more than 100,000 values"),
    "a value containing itself": ("grpo: &a {x: *a}", "contains itself"),
    "a python tag": ('grpo: !!python/object/apply:os.system ["echo pwned"]', "python/object"),
    "a tab": ("seed:\t1", "not valid YAML"),
    "a NUL": ("seed: 1\x00", "not valid YAML"),
}


@pytest.mark.parametrize("name", list(YAML_CONFIGS))
def test_hostile_configs_are_named_errors(name: str, tmp_path: Path) -> None:
    from trainers.pipeline.config import load_config

    text, message = YAML_CONFIGS[name]
    path = tmp_path / "config.yaml"
    path.write_text(text)
    start = time.perf_counter()
    with pytest.raises(InvalidArgumentError, match=message) as caught:
        load_config(path)
    assert str(path) in str(caught.value)
    assert time.perf_counter() - start < 0.5


def test_config_overrides_and_merge_keys(tmp_path: Path) -> None:
    from trainers.pipeline.config import load_config

    path = tmp_path / "config.yaml"
    path.write_text("env: ToolUseGame-v0\ngrpo: {<<: {a: 1, b: 1}, b: 2}\n")
    assert load_config(path).grpo == {"a": 1, "b": 2}  # a merge key, then an override
    with pytest.raises(InvalidArgumentError, match="env is 'ToolUseGame-v0', not a mapping"):
        load_config(path, {"env.x": 1})


CONFIG_VALUES = {
    "sft batch 0": ("sft: {batch_size: 0}", "sft.batch_size must be an integer >= 1"),
    "sft episodes text": ("sft: {episodes: many}", "sft.episodes must be an integer"),
    "sft learning rate NaN": ("sft: {learning_rate: .nan}", "sft.learning_rate must be a"),
    "sft scheduler typo": ("sft: {lr_scheduler_type: cosin}", "'cosine', 'linear' or"),
    "sft options a list": ("sft: {oracle_options: [1]}", "sft.oracle_options must be a"),
    "evaluation episodes true": ("evaluation: {episodes: true}", "evaluation.episodes"),
    "evaluation split a number": ("evaluation: {split: 3}", "evaluation.split must be a str"),
    "seed past numpy": ("seed: 1099511627776", r"seed must be an integer in \[0, 4294967295\]"),
}


@pytest.mark.parametrize("name", list(CONFIG_VALUES))
def test_config_values_are_checked_at_load(name: str, tmp_path: Path) -> None:
    from trainers.pipeline.config import load_config

    text, message = CONFIG_VALUES[name]
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(InvalidArgumentError, match=message) as caught:
        load_config(path)
    assert str(caught.value).startswith(f"{path}: ")
