"""Maze-v0: the maze generator, look and move, the turn budget, the reward, hostile calls."""

from __future__ import annotations

import asyncio
import json
import pickle
import random
from typing import Any

import gymnasium as gym
import pytest

from llm_gym import InvalidArgumentError, Task
from llm_gym.envs.maze import (
    DIRECTION_ALIASES,
    DIRECTIONS,
    MAX_CALLS_PER_TURN,
    SPLIT_SIZES,
    TURN_BUDGET,
    VERSION,
    MazeEnv,
    generate_maze,
    generate_tasks,
    get_tasks,
    oracle_action,
    render_maze,
    shortest_path,
)
from llm_gym.envs.maze.tasks import SIZES
from tests.conftest import play_text_episode

# A hand-made maze: the way from S to G is right, right, down, down, left, left.
GRID = [
    "#####",
    "#...#",
    "###.#",
    "#...#",
    "#####",
]
TASK = Task(
    prompt="Maze test: 5 rows x 5 columns. Reach the goal.",
    target=[3, 1],
    metadata={"grid": GRID, "start": [1, 1], "goal": [3, 1], "shortest_path_length": 6},
)


def _calls(*calls: tuple[str, dict[str, Any] | str]) -> dict[str, Any]:
    """An assistant message with these (name, arguments) tool calls."""
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": f"c{i}",
                "type": "function",
                "function": {
                    "name": name,
                    "arguments": args if isinstance(args, str) else json.dumps(args),
                },
            }
            for i, (name, args) in enumerate(calls)
        ],
    }


def _moves(*directions: str) -> dict[str, Any]:
    return _calls(*(("move", {"direction": d}) for d in directions))


def _play(task: Task, messages: list[dict[str, Any]]) -> tuple[MazeEnv, list[Any]]:
    """Step a fresh env through ``messages`` (stopping when it ends); return it and the results."""

    async def run() -> tuple[MazeEnv, list[Any]]:
        env = MazeEnv()
        await env.reset(task)
        results = []
        for message in messages:
            results.append(await env.step(message))
            if results[-1].terminated or results[-1].truncated:
                break
        return env, results

    return asyncio.run(run())


def _tool_contents(result: Any, last: int) -> list[str]:
    return [m["content"] for m in result.messages[-last:]]


# --- tasks ---------------------------------------------------------------------------------------


def test_splits_are_disjoint() -> None:
    prompts = {split: [t.prompt for t in get_tasks(split)] for split in SPLIT_SIZES}
    assert all(len(set(p)) == len(p) == SPLIT_SIZES[s] for s, p in prompts.items())
    assert not set(prompts["train"]) & set(prompts["val"])
    assert not set(prompts["train"]) & set(prompts["test"])
    assert not set(prompts["val"]) & set(prompts["test"])
    # stricter: no maze layout appears twice, within a split or across splits
    layouts = {tuple(t.metadata["grid"]) for split in SPLIT_SIZES for t in get_tasks(split)}
    assert len(layouts) == sum(SPLIT_SIZES.values())
    with pytest.raises(
        InvalidArgumentError, match=r"split must be one of \['test', 'train', 'val'\]"
    ):
        get_tasks("dev")


def test_generator_is_a_pure_function_of_its_seed() -> None:
    assert generate_tasks(3, 30) == generate_tasks(3, 30)
    assert generate_tasks(3, 30) != generate_tasks(4, 30)
    assert generate_maze(random.Random(1), 9, 7) == generate_maze(random.Random(1), 9, 7)
    with pytest.raises(InvalidArgumentError, match="odd and >= 5"):
        generate_maze(random.Random(1), 6, 7)


def test_every_maze_is_solvable_and_the_stored_path_length_is_shortest() -> None:
    sizes = set()
    for task in (t for split in SPLIT_SIZES for t in get_tasks(split)):
        grid, start, goal = task.metadata["grid"], task.metadata["start"], task.metadata["goal"]
        sizes.add((len(grid), len(grid[0])))
        path = shortest_path(grid, start, goal)
        assert 2 <= len(path) == task.metadata["shortest_path_length"] <= 30
        assert task.target == goal and start != goal
        assert f"row {start[0]}, column {start[1]}" in task.prompt
        assert f"row {goal[0]}, column {goal[1]}" in task.prompt
        r, c = start
        for direction in path:  # the path only crosses open cells and ends on the goal
            r, c = r + DIRECTIONS[direction][0], c + DIRECTIONS[direction][1]
            assert grid[r][c] == "."
        assert [r, c] == goal
    assert sizes == {(h, w) for h in SIZES for w in SIZES}


def test_generated_mazes_connect_every_open_cell() -> None:
    rng = random.Random(0)
    for height, width in [(5, 5), (7, 9), (9, 9)]:
        for extra in (0, 2):
            grid = generate_maze(rng, height, width, extra_openings=extra)
            open_cells = [(r, c) for r in range(height) for c in range(width) if grid[r][c] == "."]
            rooms, rows, columns = (height // 2) * (width // 2), height // 2, width // 2
            walls_between_rooms = rows * (columns - 1) + (rows - 1) * columns
            opened = min(extra, walls_between_rooms - (rooms - 1))
            assert len(open_cells) == 2 * rooms - 1 + opened
            for cell in open_cells:
                shortest_path(grid, (1, 1), cell)  # raises when unreachable
            assert set(grid[0]) == set(grid[-1]) == {"#"}
    assert render_maze(GRID, [1, 1], [3, 1]).splitlines()[1:4] == ["#S..#", "###.#", "#G..#"]


# --- look, move and the reward -------------------------------------------------------------------


def test_look_shows_the_neighbourhood_position_and_open_directions() -> None:
    env, (result,) = _play(TASK, [_calls(("look", {}))])
    assert not result.terminated
    assert result.messages[-1]["content"] == (
        "You are at row 1, column 1. The goal is at row 3, column 1.\n"
        "###\n#@.\n###\n"
        f"Open directions: right. This is message 1 of {TURN_BUDGET}."
    )
    env, results = _play(TASK, [_moves("right", "right", "down"), _calls(("look", ""))])
    assert results[-1].messages[-1]["content"].splitlines()[1:4] == ["..#", "#@#", "..#"]
    env, results = _play(
        TASK, [_moves("right", "right", "down", "down"), _moves("left"), _calls(("look", ""))]
    )
    assert results[-1].messages[-1]["content"].splitlines()[1:5] == [
        "##.",
        "G@.",
        "###",
        f"Open directions: left, right. This is message 3 of {TURN_BUDGET}.",
    ]


def test_reaching_the_goal_ends_the_episode_with_reward_one() -> None:
    env, results = _play(TASK, [_moves("right", "right", "down", "down"), _moves("left", "left")])
    assert [r.terminated for r in results] == [False, True]
    assert results[-1].reward == 1.0 and not results[-1].truncated
    assert _tool_contents(results[-1], 2) == [
        "Moved left. You are now at row 3, column 2.",
        "Moved left. You are now at row 3, column 1: the goal!",
    ]
    metrics = dict(results[-1].metrics)
    assert metrics["reached_goal"] and metrics["moves"] == 6 and metrics["extra_moves"] == 0
    assert not metrics["out_of_turns"] and metrics["tool_errors"] == 0


def test_bumping_into_a_wall_is_a_tool_result_not_an_error() -> None:
    env, results = _play(TASK, [_moves("up", "left", "down", "right"), _moves("right", "down")])
    assert _tool_contents(results[0], 4) == [
        "Blocked: there is a wall above. You are still at row 1, column 1.",
        "Blocked: there is a wall to the left. You are still at row 1, column 1.",
        "Blocked: there is a wall below. You are still at row 1, column 1.",
        "Moved right. You are now at row 1, column 2.",
    ]
    env, results = _play(TASK, [_moves("right", "right", "right", "down")])
    assert results[0].messages[-2]["content"].startswith("Blocked: there is a wall to the right.")
    assert results[0].messages[-1]["content"].endswith("now at row 2, column 3.")

    async def finish() -> Any:
        return await env.step({"role": "assistant", "content": "done"})

    final = asyncio.run(finish())
    assert final.reward == 0.0 and final.metrics["bumps"] == 1 and final.metrics["moves"] == 3
    assert final.metrics["tool_errors"] == 0


def test_a_reply_without_tool_calls_ends_the_episode_with_zero() -> None:
    env, (result,) = _play(TASK, [{"role": "assistant", "content": "I am at the goal."}])
    assert result.terminated and result.reward == 0.0
    assert result.metrics["stopped_without_tool_call"] and not result.metrics["reached_goal"]


def test_running_out_of_turns_ends_the_episode_with_zero() -> None:
    env, results = _play(TASK, [_moves("right", "left")] * (TURN_BUDGET + 5))
    assert len(results) == TURN_BUDGET
    assert [r.terminated for r in results] == [False] * (TURN_BUDGET - 1) + [True]
    assert results[-1].reward == 0.0 and results[-1].metrics["out_of_turns"]
    assert results[-1].metrics["moves"] == 2 * TURN_BUDGET


def test_the_goal_reached_mid_message_skips_the_rest_and_calls_are_capped() -> None:
    env, results = _play(
        TASK, [_moves("right", "right", "down", "down"), _moves("left", "left", "right")]
    )
    assert results[-1].reward == 1.0
    assert results[-1].messages[-1]["content"] == "Skipped: the goal is already reached."
    too_many = _moves(*["right"] * (MAX_CALLS_PER_TURN + 2))
    env, (result,) = _play(TASK, [too_many])
    contents = _tool_contents(result, MAX_CALLS_PER_TURN + 2)
    assert contents[1].endswith("now at row 1, column 3.") and contents[2].startswith("Blocked")
    assert all(
        c.startswith(f"tool_error: at most {MAX_CALLS_PER_TURN} tool calls run per message")
        for c in contents[MAX_CALLS_PER_TURN:]
    )
    env, (result,) = _play(TASK, [_moves("right")])  # the cap is per message
    assert result.messages[-1]["content"].startswith("Moved right")


def test_every_direction_alias_is_accepted_and_others_are_named_errors() -> None:
    assert set(DIRECTION_ALIASES.values()) == set(DIRECTIONS)
    for alias, direction in DIRECTION_ALIASES.items():
        for spelling in (alias, f" {alias.upper()} "):
            env, (result,) = _play(TASK, [_moves(spelling)])
            expected = "Moved right" if direction == "right" else "Blocked"
            assert result.messages[-1]["content"].startswith(expected), (spelling, result)
    env, (result,) = _play(TASK, [_moves("diagonal", "upleft", "", "RIGHT!")])
    for content in _tool_contents(result, 4):
        assert content.startswith("tool_error: direction must be one of up, down, left, right")


HOSTILE_CALLS: list[tuple[str, dict[str, Any] | str]] = [
    ("move", {"direction": "x" * 100_000}),
    ("move", {"direction": 3}),
    ("move", {"direction": None}),
    ("move", {"direction": ["up"]}),
]
HOSTILE_CALLS_2: list[tuple[str, dict[str, Any] | str]] = [
    ("move", {}),
    ("move", {"direction": "up", "steps": 10}),
    ("move", "not json"),
    ("move", "[1, 2, 3]"),
]
HOSTILE_CALLS_3: list[tuple[str, dict[str, Any] | str]] = [
    ("move", {"direction": "up; import os; os.system('rm -rf /')"}),
    ("look", {"radius": 100}),
    ("teleport", {"row": 3, "column": 1}),
    ("move", '{"direction": "' + "[" * 10_000 + '"}'),
]


@pytest.mark.parametrize("calls", [HOSTILE_CALLS, HOSTILE_CALLS_2, HOSTILE_CALLS_3])
def test_hostile_tool_calls_are_tool_errors(calls: list[tuple[str, Any]]) -> None:
    env, results = _play(TASK, [_calls(*calls), _calls(("look", {}))])
    contents = _tool_contents(results[0], len(calls))
    assert not results[0].terminated and not results[1].terminated
    assert all(c.startswith("tool_error: ") and len(c) < 500 for c in contents), contents
    # nothing moved: the agent is where it started
    assert results[1].messages[-1]["content"].startswith("You are at row 1, column 1.")


def test_unknown_tool_suggests_the_closest() -> None:
    env, (result,) = _play(TASK, [_calls(("mvoe", {"direction": "up"}))])
    assert "Did you mean 'move'?" in result.messages[-1]["content"]


@pytest.mark.parametrize(
    ("metadata", "match"),
    [
        ({}, "needs metadata 'grid', 'start' and 'goal'"),
        ({"grid": ["###", "#.#"], "start": [1, 1], "goal": [1, 1]}, "at least 3 equally long"),
        ({"grid": ["#####", "#.x.#", "#####"], "start": [1, 1], "goal": [1, 3]}, "'#' and '.'"),
        ({"grid": ["#####", "#...#", "##.##"], "start": [1, 1], "goal": [1, 3]}, "border"),
        ({"grid": GRID, "start": [0, 0], "goal": [3, 1]}, "'start' \\[0, 0\\] must be an open"),
        ({"grid": GRID, "start": [1, 1], "goal": "3,1"}, "'goal' must be \\[row, column\\]"),
        ({"grid": ["#####", "#.#.#", "#####"], "start": [1, 1], "goal": [1, 3]}, "cannot be"),
        ({"grid": GRID, "start": [1, 1], "goal": [1, 1]}, "must differ"),
    ],
)
def test_a_malformed_task_is_a_clear_error(metadata: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        asyncio.run(MazeEnv().reset(Task(prompt="maze", metadata=metadata)))


# --- the oracle --------------------------------------------------------------------------------


def test_oracle_looks_then_walks_from_the_reported_position() -> None:
    first = oracle_action(TASK, [{"role": "user", "content": TASK.prompt}])
    assert [c["function"]["name"] for c in first["tool_calls"]] == ["look"]
    # the position comes from the latest tool result, not from the task's start
    messages = [
        {"role": "user", "content": TASK.prompt},
        {"role": "tool", "name": "move", "content": "Moved down. You are now at row 2, column 3."},
        {
            "role": "tool",
            "name": "move",
            "content": "Blocked: ... You are still at row 3, column 3.",
        },
    ]
    moves = [
        json.loads(c["function"]["arguments"]) for c in oracle_action(TASK, messages)["tool_calls"]
    ]
    assert moves == [{"direction": "left"}, {"direction": "left"}]


# --- through gymnasium ---------------------------------------------------------------------------


def test_version_and_synchrony() -> None:
    env = gym.make("Maze-v0")
    assert env.unwrapped.version == VERSION
    env.reset(seed=0)
    assert env.unwrapped.inner_env.synchronous


def test_pickling_after_two_moves_keeps_the_position() -> None:
    env = gym.make("Maze-v0")
    env.reset(options={"split": "val", "index": 7})
    env.step(env.unwrapped.oracle_action())
    env.step(env.unwrapped.oracle_action())
    clone = pickle.loads(pickle.dumps(env))
    action = '<tool_call>{"name": "look", "arguments": {}}</tool_call>'
    assert env.step(action)[:4] == clone.step(action)[:4]


def test_oracle_solves_val_well_inside_the_budget() -> None:
    env = gym.make("Maze-v0")
    for index in range(0, 200, 5):
        options = {"split": "val", "index": index}
        reward, info = play_text_episode(
            env, lambda e, o, i: e.unwrapped.oracle_action(), options=options
        )
        assert reward == 1.0 and info["turn"] <= 9 and info["metrics"]["extra_moves"] == 0
